"""How a run is going, or how it ended, as a small file in its run directory (status.json):
`hpcrl inspect` says it, so a run that failed says so after the job is gone.

Rank 0 writes 'running' once start-up is through, and at the end 'done', 'preempted' or
'output_failed' (a full disk: that write may fail too). A rank that fails writes 'failed' with
its rank, what it was doing and the error, just before it aborts the job: the first failure
stays, later ones (ranks the abort takes down) do not replace it. A run killed without a word
(kill -9, the OOM killer, a lost node) is left 'running'. The file is data like the rest of the
directory: read bounded, as JSON only, never through a symbolic link, and written by
temp-and-rename.
"""
from __future__ import annotations

import json
import os
import time

from hpcrl.io.rundir import replace_text

STATUS_FILE = "status.json"
MAX_BYTES = 1 << 16
STATES = ("running", "done", "preempted", "output_failed", "failed", "waiting")  # waiting: a packed member between turns


def write(run_dir: str, state: str, **details) -> None:
    """Record `state` (one of STATES) with `details` (plain JSON values) and the time now; a
    failure is not replaced by a later one."""
    if state == "failed" and (read(run_dir) or {}).get("state") == "failed":
        return
    record = {"state": state, "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"), **details}
    replace_text(os.path.join(run_dir, STATUS_FILE), json.dumps(record) + "\n")


def read(run_dir: str) -> dict | None:
    """The recorded status, or None: no file (a run from before it was written), a link, too big,
    or not a JSON object with a known state."""
    try:
        fd = os.open(os.path.join(run_dir, STATUS_FILE), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        raw = fh.read(MAX_BYTES + 1)
    try:
        record = json.loads(raw) if len(raw) <= MAX_BYTES else None
    except ValueError:
        return None
    ok = isinstance(record, dict) and record.get("state") in STATES
    return {k: v for k, v in record.items() if isinstance(v, (str, int, float))} if ok else None


def describe(record: dict) -> str:
    """One line: 'failed at 2026-11-29 00:50:12 UTC: rank 3 (env: stepping envs), RuntimeError: ...'."""
    state, when = record["state"], record.get("time", "?")
    if state == "failed":
        return (f"FAILED at {when}: rank {record.get('rank', '?')} ({record.get('doing', '?')}), "
                f"{record.get('error', '?')}")
    if state == "running":
        return (f"running since {when}, or stopped without a word (kill -9, the OOM killer, a lost node: "
                f"then run the same command again to resume)")
    return {"done": f"ended at {when}: done", "preempted": f"ended at {when}: preempted, with a checkpoint",
            "output_failed": f"ended at {when}: an output could not be written",
            "waiting": f"a packed population's member, waiting for its next turn since {when} (or its job stopped "
                       f"without a word: then run the population's command again to resume)"}[state]
