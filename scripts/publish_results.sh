#!/usr/bin/env bash
# Copy a finished run's summary into jobs/results/NAME/: its config, metrics.h5 (the HDF5 summary:
# one row per update), the learning curves (hpcrl plot) and an evaluation of its final checkpoint
# (hpcrl eval, 10 episodes). Several run directories of one job (seeds) make one band.
#   bash scripts/publish_results.sh NAME RUN_DIR [RUN_DIR ...]
set -euo pipefail
name=$1; shift
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$repo/.venv/bin/python}
out=$repo/jobs/results/$name
mkdir -p "$out"
for run in "$@"; do
  sub=$out/$(basename "$run")
  mkdir -p "$sub"
  cp "$run/config.yaml" "$run/metrics.h5" "$sub/"
  "$py" -m hpcrl eval "$run" --episodes 10 --json --trust-code > "$sub/eval.json"  # (our own runs)
done
"$py" -m hpcrl plot "$@" -o "$out/curves.png"
"$py" -m hpcrl inspect "$1" > "$out/inspect.txt"
echo "wrote $out"
