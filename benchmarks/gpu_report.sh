#!/usr/bin/env bash
# The GPU report in one call (run on the H100 through the device tool, results under $OUT):
# the conformance matrix of every GPU backend (full profile), the CUDA-graph replay check of the
# Triton kernels (each registered variant), oracle bench on the GPU (eager and graph, beside index_put_,
# the seed's writer and the peers' files in .peers/), and the compute-sanitizer lane
# over the CUDA and Triton kernels. Eight files land in $OUT; commit them under reports/.
set -uo pipefail
OUT=${OUT:-reports/gpu}
mkdir -p "$OUT"
san=$(mktemp -d)  # the lane's own conformance report stays behind: eight files come back at most
python3 -m pip install -q --no-build-isolation --no-deps -e . >/dev/null 2>&1
export TARGET="${TARGET:-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)}"
{
  echo "== oracle list"; oracle list
  echo "== oracle run (full, torch on CUDA + triton + cuda)"
  time timeout 330 oracle run --backend torch,triton,cuda --kernel "${KERNELS:-}" --profile full -n 8 \
      --target "$TARGET" --report "$OUT/h100.json" --markdown "$OUT/h100.md" -- -q -p no:warnings \
      | tail -80
  echo "== CUDA-graph replay of the Triton kernels, as triton.<op>, .unchecked and .pdl"
  # one file for the three runs: the device tool brings back at most eight files
  graphs=$(mktemp -d)
  for variant in default unchecked pdl; do
    python3 -m oracle.lanes.graphs --out "$graphs/$variant" --variant "$variant" | tail -1
  done
  python3 -c 'import json, sys; json.dump({v: json.load(open(f"{sys.argv[1]}/{v}/gpu_check.json"))
                for v in ("default", "unchecked", "pdl")}, open(sys.argv[2], "w"), indent=1)' "$graphs" "$OUT/graphs.json"
  echo "== oracle bench (GPU kernels vs torch on CUDA vs the copy ceiling)"
  # eager and graph-replayed, inputs rotated past the L2; peers' Triton writers where .peers/ holds
  # their files (never committed: copy them from the sglang and vLLM wheels)
  peers=(); for f in .peers/*.py; do [ -f "$f" ] && peers+=(--peer-file "$f"); done
  time timeout 340 oracle bench --backend triton,cuda --op set_mla_kv_buffer,store_cache,reshape_and_cache_flash \
      --sizes 1,16,64,4096,16384 --repeats 7 --mode both --l2 cold "${peers[@]}" \
      --json "$OUT/bench.json" --plot "$OUT/bench.png"
  oracle report bench-goals "$OUT/bench.json"
  echo "== sanitizer lane (quick profile, cuda + triton, one process under memcheck)"
  time timeout 300 oracle run --sanitize "$san" --backend cuda,triton | tail -30
  cp "$san/summary.json" "$OUT/sanitize.json"
  cp "$san/sanitizer.log" "$OUT/sanitizer.log"
} > "$OUT/gpu_report.log" 2>&1
tail -150 "$OUT/gpu_report.log"
