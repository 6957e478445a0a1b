"""Fault injection for the hard-stop tests: pause inside a write so a test can SIGKILL it there.

`HPCRL_PAUSE_INSIDE=NAME:K` makes the K-th pass through `pause_point(NAME)` (1-based) create the
file named by `HPCRL_PAUSE_MARKER` and then sleep until the process is killed. The writers call
`pause_point` halfway through what they write (metrics: after the first half of a row's series;
checkpoint: after the model, before the rest), so the kill lands with the file half-written.
With `HPCRL_PAUSE_RANK=R` only world rank R pauses (as its launcher numbers it: Open MPI's
OMPI_COMM_WORLD_RANK, or PMIX_RANK), so a test can stop one learner inside an update while the
others wait for it in the gradient average.
Unset (always, outside tests), a pause point costs one comparison.
"""
from __future__ import annotations

import os
import time

_SPEC = os.environ.get("HPCRL_PAUSE_INSIDE", "")
_NAME, _, _AT = _SPEC.partition(":")
_RANK = os.environ.get("HPCRL_PAUSE_RANK")
if _RANK is not None and _RANK != os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMIX_RANK")):
    _NAME = ""  # another rank pauses
_passes: dict[str, int] = {}


def pause_point(name: str) -> None:
    if name != _NAME:
        return
    _passes[name] = _passes.get(name, 0) + 1
    if _passes[name] != int(_AT or 1):
        return
    marker = os.environ.get("HPCRL_PAUSE_MARKER")
    if marker:
        with open(marker, "w", encoding="utf-8") as fh:
            fh.write(str(os.getpid()))
    while True:  # until the test kills this process
        time.sleep(1.0)
