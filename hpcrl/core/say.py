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


def duration(seconds: float) -> str:
    """'42s', '3m05s', '1h02m', '2d03h': two units at most, as every hpcrl line and report
    gives a duration."""
    s = int(round(seconds))
    for big, small, unit_big, unit_small in ((86400, 3600, "d", "h"), (3600, 60, "h", "m"), (60, 1, "m", "s")):
        if s >= big:
            return f"{s // big}{unit_big}{(s % big) // small:02d}{unit_small}"
    return f"{s}s"
