#!/usr/bin/env bash
# make test's second pass: the tests that wait more than they compute (about a quarter of the cores),
# in two pytest sessions side by side and beside no other test: the SLURM ones (one SLURM at a time:
# scripts/slurm.sh's node, then the emulated cluster's) and the others (faults, bounds in seconds,
# ratios of waits; marker `alone`). The SLURM session's report follows the other's.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
log=$(mktemp)
"$PY" -m pytest -m slurm tests >"$log" 2>&1 &
slurm=$!
trap 'kill -INT "$slurm" 2>/dev/null; wait "$slurm"; cat "$log"; rm -f "$log"; exit 130' INT TERM
"$PY" -m pytest -m "alone and not slurm" tests
others=$?
wait "$slurm"
status=$?
cat "$log"
rm -f "$log"
exit $(( others != 0 || status != 0 ))
