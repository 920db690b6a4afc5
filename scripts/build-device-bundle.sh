#!/usr/bin/env bash
# Builds the GPU test binaries here (no CUDA needed: cudarc loads CUDA at run time, kernels are embedded
# and compiled by NVRTC on the device) and puts them in device-bundle/ (git-ignored), to be carried to a
# machine with an NVIDIA GPU and run by scripts/device-check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --release -p kvgate-cuda --no-run 2>&1 | tee /tmp/kvgate-device-build.log
mkdir -p device-bundle
for t in gpu nvrtc; do
  bin=$(grep -o "target/release/deps/${t}-[0-9a-f]*" /tmp/kvgate-device-build.log | head -1)
  cp "$bin" "device-bundle/${t}-tests"
  strip "device-bundle/${t}-tests" 2>/dev/null || true
done
ls -la device-bundle
