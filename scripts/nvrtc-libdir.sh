#!/usr/bin/env bash
# Prints the directory holding libnvrtc.so.13 from the test venv (.ci/venv, made by setup-test-deps.sh).
cd "$(dirname "$0")/.."
ls -d "$PWD"/.ci/venv/lib/python3*/site-packages/nvidia/cu13/lib 2>/dev/null | head -1
