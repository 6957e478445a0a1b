"""HDF5 checkpoints: model, optimizer, counters, RNG states and config text in one file.

torch is imported only where tensors are made: rank 0 inspects checkpoints (`inspect_latest`)
before it knows its role, and env ranks never import torch.

A checkpoint is written to a temporary name in the same directory, flushed, and renamed over the
old one, so a crash mid-write never leaves a half checkpoint as the latest. A run killed inside a
write leaves that temporary file behind: `recover_temporaries` removes it when the run resumes,
or installs it when it is complete and newer than the latest (killed between fsync and rename).

Every file carries a sha256 of its content. It detects corruption (a write cut short, flipped
bits, a copy gone wrong), not tampering: it is unkeyed, so whoever edits a file can recompute it.
A run directory is data that may come from anyone, so reading a checkpoint never trusts it further
than its checksum: io/h5safe.py bounds the read in time and memory (regular files only, datasets
no larger than the file, no links out of it), counters must be whole numbers, and `check_fits`
refuses weights that do not fit the model a run builds or that are not finite. Checkpoints are
never written through a symbolic link: temporary files replace any link at their name, and the
rename replaces a link at the checkpoint's name with the file itself.
"""
from __future__ import annotations

import glob
import hashlib
import json
import math
import os
import random
import time
from typing import Any, Callable

import h5py
import numpy as np

from hpcrl.core.faults import pause_point
from hpcrl.io.h5safe import (DAMAGE_ERRORS, RefusedFileError, check_contents, open_for_reading, unlink_if_link,
                              writes_fail_as_os_errors)

FORMAT_VERSION = 1
# Counters a run converts with int(): a checkpoint holding anything else there is unusable.
WHOLE_NUMBER_COUNTERS = ("policy_version", "frames", "updates")
DIGEST_SLICE_BYTES = 1 << 24  # hashing reads a dataset in slices of about this size


def _tag_tuples(value: Any) -> Any:
    """JSON has no tuples; mark them so optimizer settings such as Adam's betas come back as tuples."""
    if isinstance(value, tuple):
        return {"__tuple__": [_tag_tuples(v) for v in value]}
    if isinstance(value, list):
        return [_tag_tuples(v) for v in value]
    if isinstance(value, dict):
        return {k: _tag_tuples(v) for k, v in value.items()}
    return value


def _to_json(value: Any) -> str:
    return json.dumps(_tag_tuples(value))


def _from_json(text: str) -> Any:
    return json.loads(text, object_hook=lambda d: tuple(d["__tuple__"]) if set(d) == {"__tuple__"} else d)


def _write_tree(group: h5py.Group, tree: Any) -> None:
    """dict -> groups, tensors/arrays -> datasets, everything else -> a JSON attribute."""
    import torch
    if isinstance(tree, dict):
        group.attrs["_keys"] = json.dumps([[type(k).__name__, str(k)] for k in tree])
        for i, (key, value) in enumerate(tree.items()):
            name = f"{i:04d}"
            if isinstance(value, torch.Tensor):
                group.create_dataset(name, data=value.detach().cpu().numpy())
            elif isinstance(value, np.ndarray):
                group.create_dataset(name, data=value)
            elif isinstance(value, dict):
                _write_tree(group.create_group(name), value)
            else:
                group.attrs[name] = _to_json(value)
    else:
        raise TypeError(f"checkpoint trees are dicts, got {type(tree)}")


def _read_tree(group: h5py.Group, as_torch: bool) -> dict:
    if as_torch:
        import torch
    out: dict = {}
    for i, (kind, key) in enumerate(json.loads(group.attrs["_keys"])):
        name = f"{i:04d}"
        k = int(key) if kind == "int" else key
        if name in group:
            item = group[name]
            if isinstance(item, h5py.Group):
                out[k] = _read_tree(item, as_torch)
            else:
                data = item[()]
                out[k] = torch.from_numpy(np.array(data)) if as_torch else np.array(data)
        else:
            out[k] = _from_json(group.attrs[name])
    return out


def rng_states(np_rng: np.random.Generator) -> dict:
    import torch
    return {"numpy": json.dumps(np_rng.bit_generator.state), "torch": torch.get_rng_state().numpy(),
            "python": json.dumps(random.getstate())}


def restore_rng_states(states: dict, np_rng: np.random.Generator) -> None:
    import torch
    np_rng.bit_generator.state = json.loads(states["numpy"])
    torch.set_rng_state(torch.from_numpy(np.asarray(states["torch"], dtype=np.uint8)))
    py = json.loads(states["python"])
    random.setstate((py[0], tuple(py[1]), py[2]))


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be used: unreadable, truncated, its checksum does not match,
    or its content does not fit (`check_fits`)."""


def _digest(f: h5py.File) -> str:
    """sha256 over every dataset and attribute (names, dtypes, shapes, bytes), in a fixed order;
    a dataset is read in slices, so memory stays bounded whatever its size. It detects corruption,
    not tampering (see the module's docstring)."""
    h = hashlib.sha256()

    def attrs(obj) -> None:
        for key in sorted(obj.attrs):
            if key != "sha256":
                h.update(f"@{obj.name}/{key}={obj.attrs[key]!r}".encode())

    attrs(f)
    names: list[str] = []
    f.visit(names.append)
    for name in sorted(names):
        item = f[name]
        attrs(item)
        if isinstance(item, h5py.Dataset):
            if not item.shape:  # a scalar: read whole, as its bytes were always hashed
                data = np.ascontiguousarray(item[()])
                h.update(f"{name}:{data.dtype.str}:{data.shape}".encode())
                h.update(data.tobytes())
                continue
            # the header and the bytes of the whole array in C order, as one read would give them
            rows = max(1, DIGEST_SLICE_BYTES // max(1, math.prod(item.shape[1:]) * item.dtype.itemsize))
            for start in range(0, max(item.shape[0], 1), rows):
                data = np.ascontiguousarray(item[start:start + rows])
                if start == 0:
                    h.update(f"{name}:{data.dtype.str}:{item.shape}".encode())
                h.update(data.tobytes())
    return h.hexdigest()


def previous_path(path: str) -> str:
    root, ext = os.path.splitext(path)
    return f"{root}.prev{ext}"


def save_checkpoint(path: str, model, optimizer,
                    counters: dict[str, int | float], np_rng: np.random.Generator, config_text: str,
                    parts: dict[str, Any] | None = None, policies: dict[str, dict] | None = None,
                    provenance: dict | None = None) -> None:
    """Write a checkpoint with a content checksum; the one it replaces becomes `*.prev.h5`.
    `parts`: the state of each part of the learner (workers/trainer.py: its step, statistics,
    population link...), each a group of its own under /parts/NAME.
    `policies` (runs of several, core/policies.py): the other policies, each a group of its own
    under /policies/NAME with its 'model', 'optimizer' and 'step' state; `model` and `optimizer`
    are the first policy's. `provenance`: the package versions and layout shape the run's bits
    depend on (core/reproducible.py), as JSON in an attribute."""
    _save_tree(path, {"model": dict(model.state_dict()), "optimizer": optimizer.state_dict(),
                      "counters": dict(counters), "rng": rng_states(np_rng), "parts": dict(parts or {}),
                      "policies": policies or {}, "config": config_text, "provenance": provenance or {}})


def _save_tree(path: str, checkpoint: dict) -> None:
    """A checkpoint as `load_checkpoint` reads it back, written whole (`_write_whole`)."""
    def fill(f: h5py.File) -> None:
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["config"] = checkpoint["config"]
        f.attrs["provenance"] = json.dumps(checkpoint["provenance"])
        _write_tree(f.create_group("model"), checkpoint["model"])
        pause_point("checkpoint")  # tests: a kill here leaves half a file
        for name in ("optimizer", "counters", "rng", "parts"):
            _write_tree(f.create_group(name), checkpoint[name])
        if checkpoint["policies"]:
            _write_tree(f.create_group("policies"), checkpoint["policies"])

    _write_whole(path, fill, install=_install)


def adopt_into(path: str, parent_path: str, hyperparameters: dict[str, float]) -> None:
    """Population-based training's copy, through the members' checkpoints (a population packed
    several members to a rank, whose parent is in no rank's memory): the checkpoint at `path`
    takes the weights, normalisers, Adam state and trainer-step state of the one at
    `parent_path`, and the `hyperparameters` explore gave it; it keeps its own counters, random
    streams, env state and config. Its fitness window starts again, and no round is left waiting
    (the copy ends it). As a copy in memory leaves a member (workers/trainer_member.py `adopt`)."""
    own, parent = load_latest(path)[0], load_latest(parent_path)[0]
    if own is None or parent is None:
        raise CheckpointError(f"no usable checkpoint at {path if own is None else parent_path} to copy "
                              f"{'into' if own is None else 'from'}")
    parts = dict(own["parts"])
    parts["step"] = parent["parts"].get("step", {})
    parts["hyperparameters"] = {**parts.get("hyperparameters", {}), **hyperparameters}
    parts["stats"] = {k: v for k, v in parts.get("stats", {}).items() if k not in ("return_window", "rating")}
    parts["population"] = {"waiting_round": 0}  # (its turn's mark of a round too: the round is judged)
    _save_tree(path, {**own, "model": parent["model"], "optimizer": parent["optimizer"], "parts": parts})


def save_arrays(path: str, arrays: dict[str, np.ndarray], attrs: dict[str, int | float | str]) -> None:
    """Named arrays and attributes (a replay shard) in one HDF5 file, written as checkpoints are:
    to a temporary name, with a checksum, synced to disk, then renamed over the old one."""
    def fill(f: h5py.File) -> None:
        for key, value in attrs.items():
            f.attrs[key] = value
        for name, array in arrays.items():
            f.create_dataset(name, data=array)

    _write_whole(path, fill, install=os.replace)


def load_arrays(path: str) -> tuple[dict[str, np.ndarray], dict]:
    """(arrays, attributes) of a file from `save_arrays`; CheckpointError if it is unusable."""
    return _read_verified(path, lambda f: ({name: f[name][()] for name in f}, dict(f.attrs)))


def _write_whole(path: str, fill: Callable[[h5py.File], None], install: Callable[[str, str], None]) -> None:
    """`fill` a new file at a temporary name, add its checksum, sync it, `install` it at `path`:
    a crash leaves the old file or the new one, never half of one."""
    tmp = f"{path}.tmp.{os.getpid()}"
    unlink_if_link(tmp)
    try:
        with writes_fail_as_os_errors(tmp), h5py.File(tmp, "w") as f:
            fill(f)
            f.attrs["sha256"] = _digest(f)
            f.flush()
        with open(tmp, "rb") as fh:  # the data is on disk before the name points at it
            os.fsync(fh.fileno())
        install(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


_installed: dict[str, tuple[int, int]] = {}  # path -> (inode, mtime_ns) of the file this process installed there


def _install(complete: str, path: str) -> None:
    """Make a complete checkpoint file the latest; the latest becomes the previous one if it is
    usable. An unusable latest (corrupt, truncated: the run resumed from the previous one) is
    set aside as `*.damaged.<time>.h5` instead, so it never pushes out the good previous one."""
    if os.path.exists(path):
        stat = os.stat(path)
        known_good = _installed.get(path) == (stat.st_ino, stat.st_mtime_ns)  # skip re-hashing our own
        try:
            if not known_good:
                read_summary(path)
            target = previous_path(path)
        except CheckpointError:
            target = f"{os.path.splitext(path)[0]}.damaged.{time.strftime('%Y%m%d-%H%M%S')}.h5"
        os.replace(path, target)  # a crash right here leaves the previous one to load
    os.replace(complete, path)
    stat = os.stat(path)
    _installed[path] = (stat.st_ino, stat.st_mtime_ns)


def recover_temporaries(path: str) -> list[str]:
    """After a hard stop: temporary files of `path` whose checksum holds and that are newer than
    the latest usable checkpoint become the latest (the kill came between fsync and rename); the
    rest are half-written and removed. Returns what was done, one line each."""
    done = []
    for tmp in sorted(glob.glob(glob.escape(path) + ".tmp.*")):
        try:
            version = int(read_summary(tmp)[1].get("policy_version", -1))
        except CheckpointError:
            os.unlink(tmp)
            done.append(f"removed {tmp}, a checkpoint a stopped run had not finished writing")
            continue
        found, _, counters, _ = inspect_latest(path)
        if found is None or version > int(counters.get("policy_version", -1)):
            _install(tmp, path)
            done.append(f"installed {tmp}, a complete checkpoint of policy version {version} written just "
                        f"before the run stopped, as {path}")
        else:
            os.unlink(tmp)
            done.append(f"removed {tmp}, an older copy of a checkpoint")
    return done


def _read_verified(path: str, read: Callable[[h5py.File], Any]) -> Any:
    """`read(file)` on a checkpoint whose content matches its checksum, read within bounds of
    time and memory (io/h5safe.py); CheckpointError otherwise."""
    try:
        with open_for_reading(path) as f:
            check_contents(f, path, written_whole=True)  # before the digest reads every byte
            if f.attrs.get("sha256") != _digest(f):
                raise CheckpointError(f"{path}: checksum mismatch (the file is corrupt)")
            return read(f)
    except CheckpointError:
        raise
    except RefusedFileError as exc:
        raise CheckpointError(f"{path}: not a usable checkpoint: {exc.reason}") from None
    except DAMAGE_ERRORS as exc:
        raise CheckpointError(f"{path}: unreadable checkpoint ({exc})") from None


def _newest_usable(path: str, read: Callable[[str], Any]) -> tuple[str | None, Any, list[str]]:
    """`read` the first of `path` and its previous checkpoint that works: (file, result, warnings)."""
    problems = []
    for candidate in (path, previous_path(path)):
        if not os.path.exists(candidate):
            continue
        try:
            return candidate, read(candidate), problems
        except CheckpointError as exc:
            problems.append(f"skipping {exc}")
    return None, None, problems


def load_checkpoint(path: str) -> dict:
    """{'model', 'optimizer', 'counters', 'rng', 'parts', 'config', 'policies', 'provenance'}; tensors
    as torch tensors ('provenance': {} in checkpoints written before it was recorded; 'parts' from
    the flat /extra group of checkpoints written before parts had groups of their own).
    Raises CheckpointError if the file is unreadable, its content does not match its checksum or
    a counter is not a whole number (whether the weights fit a model: `check_fits`)."""
    return _read_verified(path, lambda f: {
        "model": _read_tree(f["model"], as_torch=True), "optimizer": _read_tree(f["optimizer"], as_torch=True),
        "counters": _read_counters(f, path), "rng": _read_tree(f["rng"], as_torch=False),
        "parts": (_read_tree(f["parts"], as_torch=False) if "parts" in f
                  else parts_of_extra(_read_tree(f["extra"], as_torch=False))), "config": str(f.attrs["config"]),
        "policies": _read_tree(f["policies"], as_torch=True) if "policies" in f else {},
        "provenance": _provenance(f)})


# where each key of an older checkpoint's flat /extra group went: (part, key in it, or "" for the whole part)
EXTRA_KEYS = {"step": ("step", ""), "return_window": ("stats", "return_window"), "rating": ("stats", "rating"),
              "hyperparameters": ("hyperparameters", ""), "population_waiting_round": ("population", "waiting_round"),
              "env_state": ("env", "")}


def parts_of_extra(extra: dict) -> dict:
    """The parts of a checkpoint written with a flat /extra group: its keys sorted into the parts
    that own them now (a league member's league_* keys: the part 'league')."""
    parts: dict = {}
    for key, value in extra.items():
        part, inner = EXTRA_KEYS.get(key, ("league", key) if key.startswith("league_") else (None, ""))
        if part is None:
            continue  # no part reads it any more
        if inner:
            parts.setdefault(part, {})[inner] = value
        else:
            parts[part] = value
    return parts


def _provenance(f: h5py.File) -> dict:
    """The checkpoint's record of package versions and layout ({} where it has none or it is not a
    JSON mapping of plain values: a run directory is data)."""
    try:
        value = json.loads(str(f.attrs.get("provenance", "{}")))
    except ValueError:
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, (str, int, float, bool, type(None)))} \
        if isinstance(value, dict) else {}


def read_summary(path: str) -> tuple[str, dict]:
    """(config text, counters) of one checkpoint, read without torch; CheckpointError if the file
    is unreadable, its content does not match its checksum or a counter is not a whole number."""
    return _read_verified(path, lambda f: (str(f.attrs["config"]), _read_counters(f, path)))


def read_counters_and_provenance(path: str) -> tuple[dict, dict]:
    """(counters, the package versions and layout shape it was written with: {} if it has none) of
    one checkpoint, in one verified read, without torch; CheckpointError as read_summary."""
    return _read_verified(path, lambda f: (_read_counters(f, path), _provenance(f)))


def _read_counters(f: h5py.File, path: str) -> dict:
    counters = _read_tree(f["counters"], as_torch=False)
    _check_counters(counters, path)
    return counters


def _check_counters(counters: dict, path: str) -> None:
    """CheckpointError unless the counters are what the trainer saves: each of
    WHOLE_NUMBER_COUNTERS present a whole number >= 0, wall_time a finite number, stopped_by text."""
    def refuse(key: str, what: str):
        return CheckpointError(f"{path}: counter {key!r} is {counters[key]!r}, not {what} (the file was written by "
                               f"something else, or edited)")

    for key in WHOLE_NUMBER_COUNTERS:
        value = counters.get(key, 0)
        whole = (isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
                 or isinstance(value, float) and value.is_integer())
        if not whole or value < 0:
            raise refuse(key, "a whole number >= 0")
    wall_time = counters.get("wall_time", 0.0)
    if isinstance(wall_time, bool) or not isinstance(wall_time, (int, float, np.number)) or not np.isfinite(wall_time):
        raise refuse("wall_time", "a finite number")
    if not isinstance(counters.get("stopped_by", ""), str):
        raise refuse("stopped_by", "text")


def inspect_latest(path: str) -> tuple[str | None, str, dict, list[str]]:
    """The newest checkpoint among `path` and its previous one whose checksum holds, read without
    torch: (file or None, config text, counters, warnings about files skipped)."""
    found, config_text, counters, _, problems = latest_summary(path)
    return found, config_text, counters, problems


def latest_summary(path: str) -> tuple[str | None, str, dict, dict, list[str]]:
    """`inspect_latest` with the found checkpoint's provenance too ({} where it has none), from the
    same verified read: (file or None, config text, counters, provenance, warnings)."""
    def read(candidate: str) -> tuple[str, dict, dict]:
        return _read_verified(candidate, lambda f: (str(f.attrs["config"]), _read_counters(f, candidate),
                                                    _provenance(f)))
    found, summary, problems = _newest_usable(path, read)
    config_text, counters, provenance = summary if found else ("", {}, {})
    return found, config_text, counters, provenance, problems


def load_latest(path: str) -> tuple[dict | None, str | None, list[str]]:
    """The newest usable checkpoint among `path` and its previous one: (checkpoint, file, warnings)."""
    found, checkpoint, problems = _newest_usable(path, load_checkpoint)
    return checkpoint, found, problems


def check_fits(checkpoint: dict, shapes: dict[str, dict[str, tuple[int, ...]]], path: str) -> None:
    """CheckpointError, one message naming `path`, unless `checkpoint` (as `load_checkpoint`
    returns it) holds weights a run can use: for each policy in `shapes` ({policy name: {state
    dict key: shape}} of the model the run builds; the first name is the checkpoint's own model,
    every other one checkpoint["policies"][name]) the same keys with the same shapes, only finite
    values in every floating tensor of its model and optimizer state, and whole-number counters.
    A checksum only says the file is as written: a run that diverged writes NaN weights faithfully."""
    _check_counters(checkpoint.get("counters", {}), path)
    first, *others = shapes
    stored = checkpoint.get("policies", {})
    if set(stored) != set(others):
        raise CheckpointError(f"{path}: holds the policies {[first, *stored]}, the run has {list(shapes)}; "
                              f"resume with the policies it was trained with, or start a new run")
    for name, expected in shapes.items():
        state = checkpoint if name == first else stored[name]
        model = state.get("model", {})
        missing, extra = [k for k in expected if k not in model], [k for k in model if k not in expected]
        if missing or extra:
            differences = ([f"lacks {missing}"] if missing else []) + ([f"has {extra} besides"] if extra else [])
            raise CheckpointError(f"{path}: policy {name!r}: the saved model is not the one this run builds: it "
                                  f"{' and '.join(differences)}; resume with the model settings it was trained "
                                  f"with, or start a new run")
        for key, shape in expected.items():
            found = getattr(model[key], "shape", None)
            if found is None or tuple(found) != tuple(shape):
                found_text = tuple(found) if found is not None else f"a {type(model[key]).__name__}, not a tensor"
                raise CheckpointError(f"{path}: policy {name!r}: {key} is {found_text} in the checkpoint, the "
                                      f"model this run builds has {tuple(shape)}; resume with the model settings "
                                      f"it was trained with, or start a new run")
        for part in ("model", "optimizer"):
            bad = _first_non_finite(state.get(part, {}), part)
            if bad:
                raise CheckpointError(f"{path}: policy {name!r}: {bad} holds NaN or infinite values (training "
                                      f"diverged before this checkpoint was written); resume from an earlier "
                                      f"checkpoint or start a new run")


def _first_non_finite(tree: Any, where: str) -> str | None:
    """The key path of the first floating tensor (torch or numpy) in `tree` with a value that is
    not finite, or None."""
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    else:
        if hasattr(tree, "is_floating_point"):  # a torch tensor (torch is imported only where they are made)
            return where if tree.is_floating_point() and not bool(tree.isfinite().all()) else None
        if isinstance(tree, np.ndarray) and np.issubdtype(tree.dtype, np.inexact):
            return where if not np.isfinite(tree).all() else None
        return None
    for key, value in items:
        found = _first_non_finite(value, f"{where}.{key}")
        if found:
            return found
    return None
