"""What a resume changed in a run's config, said in one line, and the configs a run had before, kept
in its directory (config_history.yaml): changing hyperparameters on a resume is legitimate, but
the run directory's config.yaml only holds the newest.

config_history.yaml is append-only YAML, one document per replaced config, oldest first, each
headed by a comment that says until when it held and what the resume changed. Only text is copied:
nothing of a run directory is parsed here, and a config.yaml that is a symbolic link (or too big to
be one hpcrl wrote) is not copied.
"""
from __future__ import annotations

import os
import time

HISTORY_FILE = "config_history.yaml"
MAX_CONFIG_BYTES = 1 << 20  # hpcrl writes configs of a few KiB
SHOWN_CHANGES = 8  # the most changed keys the resume's line names (then a count)


def leaves(tree: dict, prefix: str = "") -> dict[str, object]:
    """{'algo.lr': 0.001, ...}: every value of a config's plain data by its dotted key (a mapping
    is walked into, anything else, lists included, is one value)."""
    out: dict[str, object] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(leaves(value, f"{dotted}."))
        else:
            out[dotted] = value
    return out


def changes(old: dict, new: dict) -> list[str]:
    """'algo.lr 0.1 (was 0.001)' for each key whose value differs, in the new config's order."""
    before, after = leaves(old), leaves(new)
    return [f"{key} {_shown(value)} (was {_shown(before.get(key))})"
            for key, value in after.items() if before.get(key) != value]


def describe(changed: list[str]) -> str:
    """The changes in one line (the first SHOWN_CHANGES, then a count)."""
    text = "; ".join(changed[:SHOWN_CHANGES])
    return text + (f"; and {len(changed) - SHOWN_CHANGES} more keys" if len(changed) > SHOWN_CHANGES else "")


def keep(run_dir: str, new_text: str, until: str, changed: list[str]) -> bool:
    """Append the run directory's config.yaml to config_history.yaml when `new_text` replaces it
    with something else; `until`: what the old config ran to (e.g. 'policy version 20, 20,480
    frames'). False when there was nothing to keep."""
    path = os.path.join(run_dir, "config.yaml")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:  # none yet, or a link: nothing hpcrl wrote
        return False
    with os.fdopen(fd, "rb") as fh:
        old = fh.read(MAX_CONFIG_BYTES + 1)
    if len(old) > MAX_CONFIG_BYTES or old.decode("utf-8", "replace") == new_text:
        return False
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    note = f"; resumed at {stamp} with {describe(changed)}" if changed else f"; replaced at {stamp}"
    text = old.decode("utf-8", "replace").rstrip("\n")
    history = os.path.join(run_dir, HISTORY_FILE)
    fd = os.open(history, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.write(f"--- # the config up to {until}{note}\n{text}\n")
    return True


def _shown(value: object) -> str:
    if isinstance(value, float):
        return repr(value)
    return "null" if value is None else str(value)
