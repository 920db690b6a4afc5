#!/usr/bin/env bash
# Builds the GPU test binaries and `serve` here (no CUDA needed: cudarc loads CUDA at run time, kernels
# are embedded and compiled by NVRTC on the device) and puts them in device-bundle/ (git-ignored), to be
# carried to a machine with an NVIDIA GPU and run by scripts/device-check.sh.
#
# Models: the device machine reaches no network and one call carries at most 64 MiB, so no benchmark
# GGUF travels whole (SmolLM2 Q4_1 is 94 MiB). With DEVICE_MODEL=path the file is split into
# device-models/part-NN pieces of 30 MiB (with its sha256 and part count); carry device-bundle and
# part-00 in one call, the other parts in the calls right after (the machine stays warm 30 s):
# scripts/device-check.sh keeps each carried part under /tmp/kvgate-parts and reassembles the model once
# all are there. Without it, the serve smoke test is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --release -p kvgate-cuda --no-run 2>&1 | tee /tmp/kvgate-device-build.log
cargo build --release -p kvgate --bin serve
mkdir -p device-bundle
for t in gpu nvrtc backend_parity gpu_bench; do
  bin=$(grep -o "target/release/deps/${t}-[0-9a-f]*" /tmp/kvgate-device-build.log | head -1)
  cp "$bin" "device-bundle/${t}-tests"
  strip "device-bundle/${t}-tests" 2>/dev/null || true
done
# the kernels compiled here (NVRTC 13.0 from the test venv), so the device loads them instead of
# spending tens of seconds per process compiling (keyed by source, arch and NVRTC version: a device
# with another NVRTC compiles its own)
rm -rf device-bundle/cubin
KVGATE_CUBIN_CACHE=device-bundle/cubin LD_LIBRARY_PATH="$(scripts/nvrtc-libdir.sh)" \
  device-bundle/nvrtc-tests every_source_compiles_into_the_cache --nocapture
cp target/release/serve device-bundle/serve
strip device-bundle/serve 2>/dev/null || true
rm -rf device-models device-bundle/parts device-bundle/sha256
if [ -n "${DEVICE_MODEL:-}" ]; then
  mkdir -p device-models
  split -b 30M -d "$DEVICE_MODEL" device-models/part-
  sha256sum "$DEVICE_MODEL" | cut -d' ' -f1 > device-models/sha256
  ls device-models/part-* | wc -l > device-models/parts
  cp device-models/sha256 device-models/parts device-bundle/ 2>/dev/null || true
  ls -la device-models
fi
ls -la device-bundle
du -sh device-bundle
