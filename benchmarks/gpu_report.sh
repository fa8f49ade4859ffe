#!/usr/bin/env bash
# The GPU report in one call (run on the H100 through the device tool, results under $OUT):
# the conformance matrix of every GPU backend (full profile), oracle bench on the GPU, and the
# compute-sanitizer lane over the CUDA and Triton kernels. Commit what lands in $OUT under reports/.
set -uo pipefail
OUT=${OUT:-reports/gpu}
mkdir -p "$OUT/san"
python3 -m pip install -q --no-build-isolation --no-deps -e . >/dev/null 2>&1
export TARGET="${TARGET:-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)}"
{
  echo "== oracle list"; oracle list
  echo "== oracle run (full, torch on CUDA + triton + cuda)"
  time timeout 330 oracle run --backend torch,triton,cuda --kernel "${KERNELS:-}" --profile full -n 8 \
      --target "$TARGET" --report "$OUT/h100.json" --markdown "$OUT/h100.md" -- -q -p no:warnings \
      | tail -80
  echo "== oracle bench (GPU kernels vs torch on CUDA vs the copy ceiling)"
  time timeout 200 oracle bench --backend triton,cuda --sizes 1,16,64,256,4096,16384,65536 \
      --json "$OUT/bench.json" --plot "$OUT/bench.png"
  echo "== sanitizer lane (quick profile, cuda + triton, one process under memcheck)"
  time timeout 300 oracle run --sanitize "$OUT/san" --backend cuda,triton | tail -30
} > "$OUT/gpu_report.log" 2>&1
tail -150 "$OUT/gpu_report.log"
