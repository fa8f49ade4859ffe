#!/usr/bin/env bash
# The GPU report (run on the H100 through the device tool, results under $OUT), in stages so each
# call fits the tool's 10-minute limit:
#
#   benchmarks/gpu_report.sh tests graphs          # about 4 minutes
#   benchmarks/gpu_report.sh bench blockbench      # about 3 minutes
#   benchmarks/gpu_report.sh conformance           # 7 minutes or more on one H100 (Triton compiles cold)
#   benchmarks/gpu_report.sh sanitize              # about 6 minutes
#
# On a host with several GPUs, stages can run side by side, one GPU each (CUDA_VISIBLE_DEVICES, a
# separate OUT each, ORACLE_INSTALLED=1 after one install), except a timing stage: another stage's
# host work (Triton compiling) disturbs eager timings, so bench runs alone. The conformance stage takes DEVICES
# (e.g. 0,1: every case dealt out over both, see oracle run --devices), WORKERS (default 8) and
# NAME (the report's file name, default h100), LIMIT (seconds; at the limit the run gets SIGTERM and
# still writes its report, marked interrupted, naming the cases in flight) and CASE_TIMEOUT (oracle
# run --timeout).
#
# - tests: the GPU tests (Triton launch plans, deferred slot and scale errors, CUDA and Triton kernels, the
#   block-scaled writers compiled against the reference and their hardware fp8 conversion, the
#   index checked once per step, the CUDA MLA writer's in-grid check) and
#   benchmarks/host_cost.py (where a Triton call's host time goes);
# - conformance: the conformance matrix of every GPU backend (full profile);
# - graphs: the CUDA-graph replay lane of the Triton and the CUDA kernels, each registered variant;
# - bench: oracle bench on the GPU (eager and graph, beside index_put_, the seed's writer and the
#   peers' files in .peers/) and its goals;
# - blockbench: the block-scaled paged writer (MXFP8, NVFP4; N = 1 to 16384) and its goals;
# - sanitize: the compute-sanitizer lane over the CUDA and Triton kernels.
#
# With no stage, all of them (longer than one call allows). Each stage writes its files to $OUT
# (eight files come back per call at most) and its log to $OUT/<stage>.log; commit the reports
# under reports/ (reports/README.md names each).
set -uo pipefail
OUT=${OUT:-reports/gpu}
mkdir -p "$OUT"
[ -n "${ORACLE_INSTALLED:-}" ] || python3 -m pip install -q --no-build-isolation --no-deps -e . >/dev/null 2>&1
export TARGET="${TARGET:-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)}"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(tests conformance graphs bench blockbench sanitize)

stage_tests() {
  time timeout 420 python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_triton_plans.py \
      tests/test_deferred_errors.py tests/test_cuda_kernels.py tests/test_cuda_backend.py tests/test_triton_kernels.py \
      tests/test_triton_block_kernels.py tests/test_triton_block_plans.py tests/test_checked_index_gpu.py \
      tests/test_cuda_in_grid_check.py tests/test_check_reuse.py tests/test_scale_checks.py | tail -30
  python3 benchmarks/host_cost.py --calls 2000 --json "$OUT/host-cost.json"
}

stage_conformance() {
  local name=${NAME:-h100}
  time timeout -k 60 "${LIMIT:-480}" oracle run --backend torch,triton,cuda --kernel "${KERNELS:-}" --profile full \
      -n "${WORKERS:-8}" ${DEVICES:+--devices "$DEVICES"} ${CASE_TIMEOUT:+--timeout "$CASE_TIMEOUT"} --target "$TARGET" --report "$OUT/$name.json" \
      --markdown "$OUT/$name.md" -- -q -p no:warnings | tail -80
}

stage_graphs() {
  # one file for every run: the device tool brings back at most eight files
  local graphs
  graphs=$(mktemp -d)
  for backend in triton cuda; do
    for variant in default unchecked plain; do
      python3 -m oracle.lanes.graphs --out "$graphs/$backend-$variant" --backend "$backend" \
          --variant "$variant" | tail -1
    done
  done
  python3 - "$graphs" "$OUT/graphs.json" <<'EOF'
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
runs = {p.parent.name: json.loads(p.read_text()) for p in sorted(root.glob("*/gpu_check.json"))}
json.dump(runs, open(sys.argv[2], "w"), indent=1)
EOF
}

stage_bench() {
  # eager and graph-replayed, inputs rotated past the L2; peers' Triton writers where .peers/ holds
  # their files (never committed: copy them from the sglang and vLLM projects)
  local peers=()
  for f in .peers/*.py; do [ -f "$f" ] && peers+=(--peer-file "$f"); done
  time timeout 520 oracle bench --backend triton,cuda --op set_mla_kv_buffer,store_cache,reshape_and_cache_flash \
      --sizes 1,16,64,4096,16384 --repeats 15 --quiet --mode both --l2 cold "${peers[@]}" \
      --json "$OUT/bench.json" --plot "$OUT/bench.png"
  oracle report bench-goals "$OUT/bench.json"
}

stage_blockbench() {
  time timeout 300 oracle bench --backend triton --op reshape_and_cache_block --sizes 1,256,4096,16384 \
      --repeats 15 --quiet --mode both --l2 cold --json "$OUT/block-bench.json"
  oracle report bench-goals "$OUT/block-bench.json"
}

stage_sanitize() {
  local san
  san=$(mktemp -d)  # the lane's own conformance report stays behind
  time timeout "${SANITIZE_LIMIT:-480}" oracle run --sanitize "$san" --backend cuda,triton | tail -30
  cp "$san/summary.json" "$OUT/sanitize.json"
  tail -200 "$san/sanitizer.log" > "$OUT/sanitizer-tail.log"
}

for stage in "${stages[@]}"; do
  if ! declare -F "stage_$stage" >/dev/null; then
    echo "unknown stage '$stage' (tests, conformance, graphs, bench, blockbench, sanitize)" >&2
    exit 2
  fi
  echo "== $stage"
  "stage_$stage" > "$OUT/$stage.log" 2>&1
  tail -40 "$OUT/$stage.log"
done
