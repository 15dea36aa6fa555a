#!/usr/bin/env bash
# One device call that re-measures what the CPU tests and notes use (run from the repo root on the GPU machine):
#   bash scripts/device_round.sh OUTDIR [measure] [prove] [gputests] [quick]
# measure: audit --measure of the captured programs (tests/fixtures/programs), saved per program;
# prove: scripts/prove_advice.py; gputests: pytest -m gpu; quick: the quick preset sweep.
set -u
out=$1; shift
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p "$out/measure"
for part in "$@"; do
  case $part in
    measure)
      for p in gpt2_train odd_linear llama_prefill llama_decode mixtral_moe fp8_linear; do
        echo "== audit --measure $p"
        python3 -m cublaslt_probe audit tests/fixtures/programs/$p --measure --top-measure 6 \
          --save "$out/measure/$p.json" --html "$out/measure/$p.html" 2>&1 | tail -25
      done ;;
    prove) python3 scripts/prove_advice.py --out "$out/prove.json" 2>&1 ;;
    gputests) python3 -m pytest -m gpu -q -p no:cacheprovider tests/ 2>&1 | tail -30 ;;
    quick) python3 -m cublaslt_probe sweep --preset quick -o "$out/quick_after.parquet" --no-progress 2>&1 | tail -3 ;;
  esac
done
