"""Env ranks' states at a policy version's start, for an exact resume of a sync run of several
ranks (run.deterministic; workers/env_rank.py writes them, the trainer's checkpoints wait for them).

Each env rank writes its own file, env-state/env-IIIII-vVVVVVVV.h5 in the run directory, as data
(hpcrl/envs/state.py: JSON text and arrays, never pickle), written whole like a checkpoint. So no
state funnels through one rank. A file holds the rank's envs one by one under their global
indices (format PER_ENV, workers/env_deal.py), so a resume on another number of env ranks reads
the few files its own envs are in; or, where they cannot be split, the rank's state whole (WHOLE),
which only the same rank of the same layout reads.

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

import h5py
import numpy as np

from hpcrl.io.checkpoint import CheckpointError, load_arrays, save_arrays
from hpcrl.io.h5safe import unlink_if_link

FOLDER = "env-state"
KEPT = 2  # files per env rank: the newest, and the one before it (what checkpoint.h5 may still name)
WHOLE, PER_ENV = "rank", "envs"  # a file's format: the rank's state whole, or env by env


def wanted(cfg, serial: bool, member: str) -> bool:
    """Whether env ranks write their state where checkpoints fall: a sync run of several ranks
    with run.deterministic (a serial checkpoint holds its actor; population members: not yet)."""
    return cfg.algo.mode == "sync" and cfg.run.deterministic and not serial and not member


def state_path(run_dir: str, index: int, version: int) -> str:
    """Env rank number `index`'s state at the start of policy version `version`."""
    return os.path.join(run_dir, FOLDER, f"env-{index:05d}-v{version:08d}.h5")


def keep(run_dir: str, index: int, version: int, snapshot: dict, env_ranks: int) -> None:
    """Write `snapshot`, the rank's state whole (EnvRank.snapshot's {"tree", "arrays"}), which a
    resume on this layout reads back; then remove this rank's older files but the one before it.
    `env_ranks`: the layout's count, which a resume must have too."""
    _write(run_dir, index, version, {"tree": snapshot["tree"], **snapshot["arrays"]},
           {"format": WHOLE, "policy_version": version, "env_rank_index": index, "env_ranks": env_ranks})


def keep_envs(run_dir: str, index: int, version: int, snapshot: dict, first_env: int, env_ranks: int,
              fragments_sent: int) -> None:
    """Write `snapshot`, the rank's state env by env (workers/env_deal.py's {"envs", "rows", "steps"}),
    of the run's envs [first_env, first_env + its envs): a resume on any number of env ranks takes
    each env from here by its global index. Then remove this rank's older files but the one before."""
    envs = snapshot["envs"]
    arrays = {f"rows.{name}": array for name, array in snapshot["rows"].items()}
    row_count = len(next(iter(arrays.values())))
    for j, env in enumerate(envs):
        prefix = _env_prefix(first_env + j)
        arrays[prefix + "tree"] = env["tree"]
        arrays.update({prefix + key: array for key, array in env["arrays"].items()})
    _write(run_dir, index, version, arrays,
           {"format": PER_ENV, "policy_version": version, "env_rank_index": index, "env_ranks": env_ranks,
            "first_env": first_env, "envs": len(envs), "rows_per_env": row_count // max(len(envs), 1),
            "steps": int(snapshot["steps"]), "fragments_sent": fragments_sent})


def _env_prefix(env: int) -> str:
    return f"env.{env:09d}."


def _write(run_dir: str, index: int, version: int, arrays: dict, attrs: dict) -> None:
    folder = os.path.join(run_dir, FOLDER)
    unlink_if_link(folder)  # a run directory is data: a link there must not lead the writes elsewhere
    os.makedirs(folder, exist_ok=True)
    save_arrays(state_path(run_dir, index, version), arrays, attrs)
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


def kept_env_by_env(run_dir: str, version: int, ranks: list[int]) -> bool:
    """Whether the files of env ranks `ranks` (kept_at's) at version `version`'s start all hold
    their state env by env, so a resume on another number of env ranks can continue it (hpcrl
    inspect; only attributes read)."""
    try:
        for index in ranks:
            with h5py.File(state_path(run_dir, index, version), "r") as f:
                if str(f.attrs.get("format", WHOLE)) != PER_ENV:
                    return False
    except OSError:
        return False
    return bool(ranks)


def remove_temporaries(run_dir: str) -> None:
    """At a resume: the half-written files of env ranks killed inside a write (their complete
    files stay; the resumed ranks write new ones as checkpoints fall)."""
    folder = os.path.join(run_dir, FOLDER)
    if os.path.islink(folder):
        return  # never anything outside the run directory (keep() replaces the link)
    for tmp in glob.glob(os.path.join(glob.escape(folder), "env-*.h5.tmp.*")):
        os.unlink(tmp)  # (a link: only the link goes)


def load(run_dir: str, version: int, index: int, first_env: int, num_envs: int, env_ranks: int,
         saved_layout: tuple[int, int]) -> tuple[str, dict | None, str]:
    """This env rank's state at version `version`'s start, for a rank of index `index` holding the
    run's envs [first_env, first_env + num_envs) on a layout of `env_ranks` env ranks, from files a
    layout of `saved_layout` = (env ranks, envs in all) wrote: (WHOLE, {"tree", "arrays"}, "") from
    its own file, written whole on this same layout; (PER_ENV, {"envs", "rows", "steps",
    "fragments_sent"}, "") gathered from the files that hold its envs; or ("", None, why there is none)."""
    saved_ranks, saved_envs = saved_layout
    if saved_envs != env_ranks * num_envs or saved_ranks < 1 or saved_envs % saved_ranks:
        return "", None, (f"the checkpoint's run had {saved_envs} envs on {saved_ranks} env ranks, this one has "
                          f"{env_ranks * num_envs}: only the same envs in all continue exactly")
    per_rank = saved_envs // saved_ranks
    wanted = range(first_env // per_rank, (first_env + num_envs - 1) // per_rank + 1)
    pieces = []
    for k in wanted:
        path = state_path(run_dir, k, version)
        if not os.path.exists(path):
            return "", None, f"{path} does not exist (the checkpoint was written without it)"
        try:
            arrays, attrs = load_arrays(path)
        except CheckpointError as exc:
            return "", None, str(exc)
        if int(attrs.get("policy_version", -1)) != version:  # (a file renamed by hand)
            return "", None, f"{path} holds the state at policy version {attrs.get('policy_version')}, not {version}"
        if str(attrs.get("format", WHOLE)) != PER_ENV:
            return _whole(path, arrays, attrs, env_ranks, saved_ranks == env_ranks and k == index)
        if int(attrs.get("first_env", -1)) != k * per_rank or int(attrs.get("envs", -1)) != per_rank:
            return "", None, (f"{path} holds envs from {attrs.get('first_env')} ({attrs.get('envs')} of them), not the "
                              f"{per_rank} from {k * per_rank} the checkpoint's layout puts there")
        pieces.append((k * per_rank, arrays, attrs))
    try:
        return PER_ENV, _dealt(pieces, first_env, num_envs), ""
    except (KeyError, ValueError) as exc:  # (a file written by hand: its checksum holds, its layout does not)
        return "", None, f"the env-state files of version {version} are not laid out as hpcrl writes them ({exc})"


def _whole(path: str, arrays: dict, attrs: dict, env_ranks: int, same_layout: bool) -> tuple[str, dict | None, str]:
    """A rank's state written whole: only its own rank on the same layout can continue from it."""
    saved = int(attrs.get("env_ranks", -1))
    if not same_layout or saved != env_ranks:
        return "", None, (f"{path} holds an env rank's state whole (its envs could not be saved one by one), "
                          f"written by a layout of {saved} env ranks: only a resume on that layout continues it")
    tree = arrays.pop("tree", None)
    if tree is None:
        return "", None, f"{path} holds no state tree"
    return WHOLE, {"tree": np.asarray(tree, dtype=np.uint8), "arrays": arrays}, ""


def _dealt(pieces: list, first_env: int, num_envs: int) -> dict:
    """The envs [first_env, first_env + num_envs) and their rows from files of consecutive envs
    (first env, arrays, attrs) that hold them."""
    envs, rows = [], {}
    for start, arrays, attrs in pieces:
        per_row = int(attrs["rows_per_env"])
        low, high = max(first_env, start), min(first_env + num_envs, start + int(attrs["envs"]))
        by_env: dict[int, dict] = {}
        for key, array in arrays.items():
            if key.startswith("rows."):
                rows.setdefault(key[len("rows."):], []).append(array[(low - start) * per_row:(high - start) * per_row])
            elif key.startswith("env."):
                _, env, name = key.split(".", 2)
                by_env.setdefault(int(env), {})[name] = array
        for env in range(low, high):
            saved = by_env.get(env, {})
            envs.append({"tree": saved.pop("tree", None), "arrays": saved})
    first = pieces[0][2]
    return {"envs": envs, "rows": {name: np.concatenate(parts) for name, parts in rows.items()},
            "steps": int(first["steps"]), "fragments_sent": int(first["fragments_sent"])}
