"""Env ranks' states at a policy version's start, for an exact resume of a sync run of several
ranks (run.deterministic; workers/env_rank.py writes them, the trainer's checkpoints wait for them).

Each env rank writes its own file, env-state/env-IIIII-vVVVVVVV.h5 in the run directory, as data
(hpcrl/envs/state.py: JSON text and arrays, never pickle), written whole like a checkpoint. So no
state funnels through one rank, and a resume's env rank reads only its own.

Order makes them consistent with checkpoint.h5: the learner root announces a checkpoint with the
weights of version v - 1; each env rank writes its state at version v's start before it sends the
last record of version v - 1; the root writes the checkpoint of version v after the update that
trains on those records, so every env rank's file of version v is on disk before checkpoint.h5
names v. A rank keeps its two newest files: the checkpoint's, and one newer that a checkpoint
may yet name.
"""
from __future__ import annotations

import glob
import os
import re

import numpy as np

from hpcrl.io.checkpoint import CheckpointError, load_arrays, save_arrays
from hpcrl.io.h5safe import unlink_if_link

FOLDER = "env-state"
KEPT = 2  # files per env rank: the newest, and the one before it (what checkpoint.h5 may still name)


def wanted(cfg, serial: bool, member: str) -> bool:
    """Whether env ranks write their state where checkpoints fall: a sync run of several ranks
    with run.deterministic (a serial checkpoint holds its actor; population members: not yet)."""
    return cfg.algo.mode == "sync" and cfg.run.deterministic and not serial and not member


def state_path(run_dir: str, index: int, version: int) -> str:
    """Env rank number `index`'s state at the start of policy version `version`."""
    return os.path.join(run_dir, FOLDER, f"env-{index:05d}-v{version:08d}.h5")


def keep(run_dir: str, index: int, version: int, snapshot: dict, env_ranks: int) -> None:
    """Write `snapshot` (EnvRank.snapshot's {"tree", "arrays"}), then remove this rank's older files
    but the one before it. `env_ranks`: the layout's count, which a resume must have too."""
    folder = os.path.join(run_dir, FOLDER)
    unlink_if_link(folder)  # a run directory is data: a link there must not lead the writes elsewhere
    os.makedirs(folder, exist_ok=True)
    save_arrays(state_path(run_dir, index, version), {"tree": snapshot["tree"], **snapshot["arrays"]},
                {"policy_version": version, "env_rank_index": index, "env_ranks": env_ranks})
    pattern = re.compile(rf"env-{index:05d}-v(\d{{8}})\.h5$")
    versions = sorted(int(m.group(1)) for name in os.listdir(folder)
                      if (m := pattern.match(name)))
    for old in versions[:-KEPT]:
        os.unlink(state_path(run_dir, index, old))


def kept_at(run_dir: str, version: int) -> list[int] | None:
    """The env ranks (by index) whose state at version `version`'s start is on disk; None when the
    run keeps none (hpcrl inspect). Only the names are read."""
    folder = os.path.join(run_dir, FOLDER)
    if not os.path.isdir(folder):
        return None
    pattern = re.compile(rf"env-(\d{{5}})-v{version:08d}\.h5$")
    return sorted(int(m.group(1)) for name in os.listdir(folder) if (m := pattern.match(name)))


def remove_temporaries(run_dir: str) -> None:
    """At a resume: the half-written files of env ranks killed inside a write (their complete
    files stay; the resumed ranks write new ones as checkpoints fall)."""
    folder = os.path.join(run_dir, FOLDER)
    if os.path.islink(folder):
        return  # never anything outside the run directory (keep() replaces the link)
    for tmp in glob.glob(os.path.join(glob.escape(folder), "env-*.h5.tmp.*")):
        os.unlink(tmp)  # (a link: only the link goes)


def load(run_dir: str, index: int, version: int, env_ranks: int) -> tuple[dict | None, str]:
    """(the snapshot env rank number `index` wrote at version `version`'s start, "") or (None, why
    there is none that fits this layout)."""
    path = state_path(run_dir, index, version)
    if not os.path.exists(path):
        return None, f"{path} does not exist (the checkpoint was written without it)"
    try:
        arrays, attrs = load_arrays(path)
    except CheckpointError as exc:
        return None, str(exc)
    saved = int(attrs.get("env_ranks", -1))
    if saved != env_ranks:
        return None, (f"{path} was written by a layout of {saved} env ranks, this run has {env_ranks}: a resume "
                      f"on another env-rank count starts new episodes")
    if int(attrs.get("policy_version", -1)) != version:  # (a file renamed by hand)
        return None, f"{path} holds the state at policy version {attrs.get('policy_version')}, not {version}"
    tree = arrays.pop("tree", None)
    if tree is None:
        return None, f"{path} holds no state tree"
    return {"tree": np.asarray(tree, dtype=np.uint8), "arrays": arrays}, ""
