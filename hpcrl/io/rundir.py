"""The run directory: start a new run, or resume the one already there from its latest checkpoint.

Runs on rank 0 before any role exists; no MPI and no torch (a checkpoint is inspected with h5py).
A run directory holds config.yaml, metrics.h5, checkpoint.h5 and checkpoint.prev.h5, and run.lock:
one run writes it at a time (`_lock`).

A run may have been stopped hard (kill -9, the OOM killer, a dead node, a full disk) at any
moment. Resuming repairs what that leaves: temporary checkpoint files (removed, or installed when
complete and newer), and metrics.h5 (rebuilt from what can be read, cut to the checkpoint). What
the repair did is printed and appended to `recovery.log` in the run directory.
"""
from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import socket
import time
from dataclasses import dataclass, field
from typing import Callable


from hpcrl.io import config_history, env_states
from hpcrl.io.checkpoint import CheckpointError, latest_summary, previous_path, recover_temporaries
from hpcrl.core.config import Config, ConfigError, parse_config, to_dict, to_yaml
from hpcrl.core.config_base import load_yaml
from hpcrl.io.metrics import rebuild_metrics, remove_temporaries
from hpcrl.core.say import say

CHECKPOINT_FILE = "checkpoint.h5"
METRICS_FILE = "metrics.h5"
RECOVERY_LOG = "recovery.log"
LOCK_FILE = "run.lock"
# A relaunch by a self-healing job script may find the lock of the run it replaces still held: on
# NFS a lost node's lock lasts until its lease runs out (90 s by default). It waits this long.
RELAUNCH_LOCK_WAIT_S = 180.0
# What a resumed run may not change: the policy's shape and what it was trained on.
MUST_MATCH = ("env.id", "env.kwargs", "model.hidden_sizes", "model.activation", "model.encoder", "model.obs_norm",
              "model.core", "model.core_size",
              "algo.name", "algo.mode", "algo.value_norm", "env.global_state", "policies")


@dataclass
class RunStart:
    run_dir: str
    config_text: str
    resume_file: str | None = None  # the checkpoint to continue from
    start_version: int = 0  # the policy version env ranks collect with first
    start_frames: int = 0
    # (env ranks, envs in all) of the run that wrote the checkpoint, whose env ranks' states a
    # resume reads (io/env_states.py); None where the checkpoint does not say
    saved_layout: tuple[int, int] | None = None
    finished: str = ""  # why the run in the directory is already complete (nothing left to do)
    warnings: list[str] = field(default_factory=list)
    changes: str = ""  # what this resume changed in the config, in one line ('' for none)


def _lookup(tree: dict, dotted: str):
    for part in dotted.split("."):
        tree = tree.get(part, {}) if isinstance(tree, dict) else {}
    return tree


def _resolved(config_text: str) -> dict:
    """A checkpoint's config with today's defaults filled in, so that a key added since it was
    written compares as its default rather than as missing."""
    try:
        return to_dict(parse_config(config_text, strict=False))
    except ConfigError:  # written by another version: compare what it says (read as bounded as any config)
        return load_yaml(config_text, "the checkpoint's config") or {}


def _saved_layout(provenance: dict) -> tuple[int, int] | None:
    """(env ranks, envs in all) of the layout that wrote a checkpoint, from its provenance."""
    ranks, envs = provenance.get("env_ranks"), provenance.get("envs")
    return (ranks, envs) if isinstance(ranks, int) and isinstance(envs, int) else None


def prepare(cfg: Config, overwrite: bool, relaunch: str = "",
            check_checkpoint: Callable[[str], None] | None = None) -> RunStart:
    """Create or reopen output_dir/name; a ConfigError says what stands in the way and what to do.
    `relaunch`: why a self-healing job script started the run again (HPCRL_RELAUNCH), for
    recovery.log. `check_checkpoint(path)`: raises CheckpointError when the checkpoint to resume
    does not fit this run (shapes, non-finite values); checked before anything is changed but the
    lock and the repair of a checkpoint write a kill interrupted."""
    run_dir = os.path.join(cfg.run.output_dir, cfg.run.name)
    checkpoint = os.path.join(run_dir, CHECKPOINT_FILE)
    start = RunStart(run_dir=run_dir, config_text=to_yaml(cfg))
    _check_inside(run_dir, cfg.run.output_dir)
    existed = os.path.isdir(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    _check_inside(run_dir, cfg.run.output_dir)  # (again: a link put there meanwhile)
    start.warnings += _lock(run_dir, RELAUNCH_LOCK_WAIT_S if relaunch else 0.0)
    if overwrite and existed:
        _empty(run_dir)
    elif existed:
        repairs = recover_temporaries(checkpoint)  # a kill inside a checkpoint write
        env_states.remove_temporaries(run_dir)  # or inside an env rank's state write
        found, old_text, counters, provenance, problems = latest_summary(checkpoint)
        start.warnings += problems
        metrics = os.path.join(run_dir, METRICS_FILE)
        if found is None and os.path.exists(metrics):
            if any(os.path.exists(p) for p in (checkpoint, previous_path(checkpoint))):
                raise ConfigError(f"run directory {run_dir!r} holds a run but no usable checkpoint"
                                  f"{' (' + '; '.join(problems) + ')' if problems else ''}; pass --overwrite to "
                                  f"start it again, or choose another run.name")
            repairs.append("the run stopped before its first checkpoint: starting it from the beginning")
        if found is not None:
            old, new = _resolved(old_text), to_dict(cfg)
            for key in MUST_MATCH:
                if _lookup(old, key) != _lookup(new, key):
                    raise ConfigError(f"cannot resume {run_dir!r}: its checkpoint was trained with {key} = "
                                      f"{_lookup(old, key)!r}, the config now says {_lookup(new, key)!r}; put it "
                                      f"back, or start a new run (another run.name, or --overwrite)")
            if check_checkpoint is not None:
                try:
                    check_checkpoint(found)
                except CheckpointError as exc:
                    raise ConfigError(f"cannot resume {run_dir!r}: {exc}; nothing in the run directory was "
                                      f"changed. Move the file aside to resume from the one before it, or "
                                      f"start a new run (another run.name, or --overwrite)") from None
            start.resume_file = found
            start.start_version = int(counters.get("policy_version", 0))
            start.start_frames = int(counters.get("frames", 0))
            start.saved_layout = _saved_layout(provenance)
            start.finished = already_finished(cfg, counters)
            changed = config_history.changes(old, new)
            start.changes = config_history.describe(changed)
            config_history.keep(run_dir, start.config_text, f"policy version {start.start_version}, "
                                f"{start.start_frames:,} frames", changed)
        if not start.finished:
            repairs += _repair_metrics(metrics, start.start_version, int(counters.get("updates", 0)))
        _log_repairs(run_dir, repairs)
        start.warnings += repairs
    if relaunch:
        where = (f"resuming from {start.resume_file}: policy version {start.start_version}, "
                 f"{start.start_frames:,} frames" if start.resume_file else
                 "starting from the beginning (no checkpoint)")
        _log_repairs(run_dir, [f"{relaunch}; {where}"])
    replace_text(os.path.join(run_dir, "config.yaml"), start.config_text)
    return start


def prepare_population(output_dir: str, name: str, overwrite: bool, config_text: str) -> str:
    """A population's directory (output_dir/name), locked by this process, emptied with
    `overwrite` (its members' directories with it), with the population's config.yaml and, on a
    resume, its lineage (metrics.h5) rebuilt as a closed file (a killed launch leaves it open); the
    members' directories inside it are prepared by `prepare`, each by its member. Returns it."""
    run_dir = os.path.join(output_dir, name)
    _check_inside(run_dir, output_dir)
    existed = os.path.isdir(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    _check_inside(run_dir, output_dir)
    _lock(run_dir, 0.0)
    if overwrite and existed:
        _empty(run_dir)
    elif existed and any(os.path.lexists(os.path.join(run_dir, f)) for f in (CHECKPOINT_FILE, previous_path(
            os.path.join(run_dir, CHECKPOINT_FILE)))):
        raise ConfigError(f"run directory {run_dir!r} holds a run of one policy set, not a population; choose "
                          f"another run.name, or pass --overwrite to replace it")
    elif existed:  # the lineage of a launch that was killed keeps SWMR's "open for writing" flags
        _log_repairs(run_dir, _repair_metrics(os.path.join(run_dir, METRICS_FILE), LINEAGE_WHOLE, 0))
    replace_text(os.path.join(run_dir, "config.yaml"), config_text)
    return run_dir


def _check_inside(run_dir: str, output_dir: str) -> None:
    """The run directory is a real directory right inside output_dir (run.name is one path
    component, checked with the config): nothing hpcrl writes or deletes there lands elsewhere."""
    if os.path.islink(run_dir):
        raise ConfigError(f"run directory {run_dir!r} is a symbolic link (to {os.readlink(run_dir)!r}); hpcrl writes "
                          f"and deletes only inside a real directory under run.output_dir: put the directory itself "
                          f"there, or choose another run.name")
    if os.path.dirname(os.path.realpath(run_dir)) != os.path.realpath(output_dir):
        raise ConfigError(f"run directory {run_dir!r} resolves to {os.path.realpath(run_dir)!r}, outside "
                          f"run.output_dir {output_dir!r}; choose another run.name")


_held: dict[str, int] = {}  # run directory -> the open lock file's descriptor, held until the process ends


def _lock(run_dir: str, wait_s: float) -> list[str]:
    """Make this process the run directory's one writer: an exclusive flock on run.lock, released
    by the kernel when the process ends however it ends (kill -9 leaves nothing stale). The file
    names the holder (host, pid, start, SLURM job) for the message a second run gets. Busy: wait
    up to `wait_s` (a relaunch), then a ConfigError. Returns warnings (a file system without locks)."""
    path = os.path.join(run_dir, LOCK_FILE)
    if os.path.realpath(run_dir) in _held:  # this process holds it already (a second prepare)
        return []
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    deadline, said = time.monotonic() + wait_s, False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)  # ENOLCK, EOPNOTSUPP...: Lustre mounted without -o flock, some NFS set-ups
                return [f"cannot lock {path} ({os.strerror(exc.errno)}): this file system has no file locks, so "
                        f"nothing stops a second run on {run_dir!r} from writing it at the same time"]
            holder = _holder(path)
            if time.monotonic() >= deadline:
                os.close(fd)
                raise ConfigError(f"run directory {run_dir!r} is in use by another run ({holder}); one run writes "
                                  f"a run directory at a time: wait for that run to end or stop it, or choose "
                                  f"another run.name") from None
            if not said:
                say(f"waiting up to {wait_s:.0f} s for the lock on {run_dir!r}, held by {holder} "
                    f"(a run on a lost node holds it until its file-system lease runs out)")
                said = True
            time.sleep(1.0)
    os.ftruncate(fd, 0)
    job = os.environ.get("SLURM_JOB_ID")
    os.pwrite(fd, (f"host {socket.gethostname()}, pid {os.getpid()}, started "
                   f"{time.strftime('%Y-%m-%d %H:%M:%S')}{f', SLURM job {job}' if job else ''}\n").encode(), 0)
    _held[os.path.realpath(run_dir)] = fd
    return []


def _holder(path: str) -> str:
    """Who holds run.lock, as its holder wrote it ('host n0, pid 42, started ...')."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(300).strip() or "a run still starting"
    except OSError:
        return "a run that did not say who it is"


def _empty(run_dir: str) -> None:
    """--overwrite: remove everything in the run directory but the lock this run holds (removing
    that would let a second run take a new lock on a new file)."""
    for entry in os.scandir(run_dir):
        if entry.name == LOCK_FILE:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


def replace_text(path: str, text: str) -> None:
    """Write a small text file by temp-and-rename: a symbolic link at `path` is replaced, never
    written through."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def already_finished(cfg: Config, counters: dict) -> str:
    """Why resuming would have nothing to do, or '' when the run should go on."""
    frames, stopped_by = int(counters.get("frames", 0)), counters.get("stopped_by", "")
    if frames >= cfg.run.total_frames:
        return (f"it reached run.total_frames ({frames:,} >= {cfg.run.total_frames:,}); raise run.total_frames "
                f"to train on")
    if stopped_by == "target_return" and counters.get("target_return") == cfg.run.target_return:
        return (f"it reached run.target_return ({cfg.run.target_return}); change or remove run.target_return "
                f"to train on")
    return ""


LINEAGE_WHOLE = 2**63 - 1  # a population's lineage has no policy versions: every whole row stays


def _repair_metrics(path: str, through_version: int, updates: int) -> list[str]:
    """metrics.h5 as the resumed run continues it: readable, closed, cut to the checkpoint."""
    repairs = [f"removed {name}, a metrics file a stopped run had not finished rebuilding"
               for name in remove_temporaries(path)]
    if not os.path.exists(path):
        return repairs
    rebuilt = rebuild_metrics(path, through_version)
    if rebuilt.problem:
        lost = (f": the metrics rows of the {updates:,} updates up to the checkpoint are lost (the checkpoint "
                f"and the training are not affected)" if updates else "")
        repairs.append(f"{path} could not be read ({rebuilt.problem}); it was moved to {rebuilt.damaged_copy} "
                       f"and a new one started{lost}")
    return repairs


def _log_repairs(run_dir: str, repairs: list[str]) -> None:
    """Append what resuming repaired to the run directory's recovery.log (the lasting note)."""
    if not repairs:
        return
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    path = os.path.join(run_dir, RECOVERY_LOG)
    if os.path.islink(path):  # O_NOFOLLOW below refuses it too; this says why
        raise ConfigError(f"{path} is a symbolic link (to {os.readlink(path)!r}); hpcrl appends to the run's own file, "
                          f"never through a link: remove the link (its target is untouched), then run again")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.writelines(f"{stamp} {line}\n" for line in repairs)


def os_reason(exc: OSError) -> str:
    """The operating system's words for a failed write ('No space left on device'); h5py hides
    them inside a long message."""
    if exc.errno:
        return os.strerror(exc.errno)
    found = re.search(r"errno = (\d+)", str(exc))
    if found:
        return os.strerror(int(found.group(1)))
    return str(exc)


def free_space(path: str) -> str:
    """' (N bytes free there)' for the file system holding `path`, or '' when unknown."""
    try:
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
    except OSError:
        return ""
    return f" ({free:,} bytes free there)"
