#!/bin/bash
# Runs testbed.py configurations in parallel, one torch thread each: `bash research/sweep.sh OUTDIR < configs`,
# one line of testbed.py flags per run (the run's name first).
out=$1; mkdir -p "$out"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
here=$(cd "$(dirname "$0")/.." && pwd)
while read -r name flags; do
  [ -z "$name" ] && continue
  python3 "$here/research/testbed.py" $flags --out "$out/$name.json" > "$out/$name.log" 2>&1 &
done
wait
