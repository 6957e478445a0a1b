"""hpcrl's lines to the user: "[hpcrl] message", or "[hpcrl m03] message" for a population member
(`label`). Each goes out whole in one write, so under mpirun the lines of several ranks never
interleave mid-line."""
from __future__ import annotations

import sys


def say(message: str, label: str = "", stream=None) -> None:
    """One line, "[hpcrl{label}] {message}", to `stream` (default: standard output), flushed."""
    stream = stream or sys.stdout
    stream.write(f"[hpcrl{label}] {message}\n")
    stream.flush()
