#!/usr/bin/env bash
# make test's second pass, beside no test of the first: the tests that mostly wait (a quarter of the
# cores) in two pytest sessions side by side, the SLURM ones (one SLURM at a time: scripts/slurm.sh's
# node, then the emulated cluster's) and the others (marker `waits`: faults, peer timeouts, bounds in
# seconds); then, with nothing beside them, the tests that assert a ratio of measured waits (`alone`).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
log=$(mktemp)
"$PY" -m pytest -m slurm tests >"$log" 2>&1 &
slurm=$!
trap 'kill -INT "$slurm" 2>/dev/null; wait "$slurm"; cat "$log"; rm -f "$log"; exit 130' INT TERM
"$PY" -m pytest -m "waits and not slurm" tests
waits=$?
wait "$slurm"
status=$?
trap - INT TERM
cat "$log"
rm -f "$log"
"$PY" -m pytest -m "alone and not slurm and not waits" tests
alone=$?
exit $(( waits != 0 || status != 0 || alone != 0 ))
