#!/usr/bin/env bash
# The GPU check, run on a machine with an NVIDIA GPU from the repo root with device-bundle/ present
# (scripts/build-device-bundle.sh builds it). Leaves every log in ${OUT:-device-out}; finishes in a
# few minutes. Exit status: 0 when every check passed.
#   1. environment: GPU, driver, where libnvrtc / libcuda come from;
#   2. the NVRTC compile of every kernel for sm_90;
#   3. with KVGATE_REQUIRE_GPU=1 (a missing GPU fails): CUDA codecs byte for byte against the CPU codecs,
#      CUDA paged attention against the CPU attention, and the bandwidth report (GB/s per kernel
#      against the measured device-to-device copy bandwidth), written to $OUT/gpu-report.md;
#   4. the CUDA backend against the CPU backend (tests/backend_parity.rs): every weight format, the
#      tiny model of every architecture (logits, 32 greedy tokens, decisions, batch invariance),
#      every KV dtype and method, calibration, block reads/writes/copies;
#   5. a benchmark on the benchmark models' shapes with random weights (tests/gpu_bench.rs): prefill
#      4k/12k, decode at 1/32/256 streams, a decision on a warm 12k state, bandwidth against copy;
#   6. when a model is there (MODEL=path, or device-models/part-* carried and reassembled; calls that
#      carry only further parts run just `mkdir -p /tmp/kvgate-parts && cp device-models/part-* /tmp/kvgate-parts/`):
#      `serve --device cuda:0` on it — a completion, a streamed chat, a decision and its follow-up.
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
{
  date -u
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader || echo "nvidia-smi failed"
  PYLIBS=$(python3 -c 'import glob,site,os;print(":".join(p for s in site.getsitepackages() for p in glob.glob(os.path.join(s,"nvidia","*","lib"))))' 2>/dev/null)
  echo "python nvidia lib dirs: ${PYLIBS:-none}"
} > "$OUT/env.log" 2>&1
PYLIBS=$(python3 -c 'import glob,site,os;print(":".join(p for s in site.getsitepackages() for p in glob.glob(os.path.join(s,"nvidia","*","lib"))))' 2>/dev/null || true)
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib${PYLIBS:+:$PYLIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for l in libcuda.so.1 libnvrtc.so.13 libnvrtc-builtins.so.13.0; do
  hit=$(for d in ${LD_LIBRARY_PATH//:/ }; do [ -e "$d/$l" ] && { echo "$d"; break; }; done)
  printf '%-28s %s\n' "$l" "${hit:-$(ldconfig -p 2>/dev/null | awk -v l="$l" '$1==l {print $NF; exit}')}" >> "$OUT/env.log"
done
cat "$OUT/env.log"
status=0
# CUBINs compiled by the bundle builder (used when this NVRTC's version matches; else compiled here)
export KVGATE_CUBIN_CACHE="$PWD/device-bundle/cubin"
echo "== nvrtc"
KVGATE_REQUIRE_NVRTC=1 timeout 60 device-bundle/nvrtc-tests --test-threads=1 --nocapture > "$OUT/nvrtc.log" 2>&1 || status=1
tail -5 "$OUT/nvrtc.log"
echo "== gpu"
KVGATE_REQUIRE_GPU=1 KVGATE_GPU_REPORT="$OUT/gpu-report.md" timeout 120 device-bundle/gpu-tests --test-threads=1 --nocapture \
  > "$OUT/gpu.log" 2>&1 || status=1
tail -40 "$OUT/gpu.log"
[ -f "$OUT/gpu-report.md" ] && cat "$OUT/gpu-report.md"
echo "== backend parity"
KVGATE_REQUIRE_GPU=1 timeout 120 device-bundle/backend_parity-tests --test-threads=1 --nocapture \
  > "$OUT/parity.log" 2>&1 || status=1
grep -E "^test |test result|panicked|within|match" "$OUT/parity.log" | tail -40
echo "== benchmark (Qwen2.5-0.5B and SmolLM2-135M shapes, random weights)"
KVGATE_REQUIRE_GPU=1 KVGATE_BENCH_REPORT="$OUT/bench-report.md" timeout 180 device-bundle/gpu_bench-tests \
  --test-threads=1 --nocapture > "$OUT/bench.log" 2>&1 || status=1
[ -f "$OUT/bench-report.md" ] && cat "$OUT/bench-report.md" || tail -20 "$OUT/bench.log"
MODEL=${MODEL:-}
# model parts carried by this call or earlier ones on this (warm) machine
mkdir -p /tmp/kvgate-parts
cp device-models/part-* /tmp/kvgate-parts/ 2>/dev/null || true
if [ -z "$MODEL" ] && [ -f device-bundle/parts ]; then
  have=$(ls /tmp/kvgate-parts/part-* 2>/dev/null | wc -l)
  if [ "$have" -eq "$(cat device-bundle/parts)" ]; then
    cat /tmp/kvgate-parts/part-* > /tmp/kvgate-model.gguf
    if [ "$(sha256sum /tmp/kvgate-model.gguf | cut -d' ' -f1)" = "$(cat device-bundle/sha256)" ]; then
      MODEL=/tmp/kvgate-model.gguf
    else
      echo "model parts do not reassemble to the checksum: serve smoke skipped"
    fi
  else
    echo "$have of $(cat device-bundle/parts) model parts here: serve smoke skipped (carry the rest)"
  fi
fi
if [ -n "$MODEL" ]; then
  echo "== serve --device cuda:0 on $MODEL"
  timeout 150 scripts/device-serve-smoke.sh "$MODEL" > "$OUT/serve.log" 2>&1 || status=1
  tail -30 "$OUT/serve.log"
else
  echo "== serve smoke skipped: no model on this machine (MODEL=path, or carry device-models/part-*)"
fi
echo "device-check status: $status"
exit $status
