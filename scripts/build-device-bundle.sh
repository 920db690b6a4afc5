#!/usr/bin/env bash
# Builds the GPU test binaries and `serve` here (no CUDA needed: cudarc loads CUDA at run time, kernels
# are embedded and compiled by NVRTC on the device) and puts them in device-bundle/ (git-ignored), to be
# carried to a machine with an NVIDIA GPU and run by scripts/device-check.sh.
#
# Models: the device machine reaches no network and a carried tree is at most 64 MiB, so no benchmark
# GGUF fits (SmolLM2 Q4_1 is 94 MiB). With DEVICE_MODEL=path the file is split into
# device-bundle/model.part-* pieces of 48 MiB; carry them over several calls to a warm machine (see
# device-check.sh: it reassembles them under /tmp). Without it, the serve smoke test is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --release -p kvgate-cuda --no-run 2>&1 | tee /tmp/kvgate-device-build.log
cargo build --release -p kvgate --bin serve
mkdir -p device-bundle
for t in gpu nvrtc backend_parity; do
  bin=$(grep -o "target/release/deps/${t}-[0-9a-f]*" /tmp/kvgate-device-build.log | head -1)
  cp "$bin" "device-bundle/${t}-tests"
  strip "device-bundle/${t}-tests" 2>/dev/null || true
done
cp target/release/serve device-bundle/serve
strip device-bundle/serve 2>/dev/null || true
rm -f device-bundle/model.part-*
if [ -n "${DEVICE_MODEL:-}" ]; then
  split -b 48M -d "$DEVICE_MODEL" device-bundle/model.part-
  sha256sum "$DEVICE_MODEL" | cut -d' ' -f1 > device-bundle/model.sha256
fi
ls -la device-bundle
du -sh device-bundle
