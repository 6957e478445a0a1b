"""A run directory read back: `hpcrl inspect`, and the opening of run directories that `hpcrl plot`
and `hpcrl eval` share. No MPI and no torch (checkpoints are read with h5py).

A run directory is data, possibly from someone else: whatever its files hold, reading
them ends in a report or in one RunDirError (CheckpointError for a checkpoint) that says what is
wrong where, never in a traceback, and nothing here writes into it or imports what it names.
- config.yaml that is not UTF-8, not YAML or not a mapping: RunDirError (`hpcrl inspect` and
  `hpcrl plot` exit 2: the config heads the report, and plot groups runs by it).
- metrics.h5 unreadable, without a series every row has, or with a series that is not numbers:
  RunDirError; `hpcrl inspect` still reports the rest, its progress line saying why there is none.
- a checkpoint whose counters are not numbers: CheckpointError; `hpcrl inspect` still reports the
  rest, its checkpoint line marking that file NOT USABLE as it does a corrupt one.
"""
from __future__ import annotations

import math
import os
import time

import numpy as np
import yaml

from hpcrl.core.config import parse_config
from hpcrl.core.config_base import ConfigError, load_bounded_yaml
from hpcrl.core.config_model import is_custom
from hpcrl.core.dataflow import ALGORITHMS
from hpcrl.core.reproducible import repeatability
from hpcrl.core.say import duration
from hpcrl.core.stop import StopReason
from hpcrl.io import env_states, run_status
from hpcrl.io.checkpoint import CheckpointError, inspect_latest, previous_path, read_counters_and_provenance
from hpcrl.io.metrics import read_metrics
from hpcrl.io.rundir import CHECKPOINT_FILE, METRICS_FILE, RECOVERY_LOG

CONFIG_FILE = "config.yaml"


# Series every metrics row has (workers/trainer_stats.py); the rest are optional to a reader
SERIES_OF_EVERY_ROW = ("frames", "wall_time", "policy_version")


class RunDirError(ValueError):
    """A run directory that cannot be read: missing, not a run, or without what was asked of it."""


def open_run_dir(path: str) -> str:
    """`path` if it holds a run (config.yaml, metrics.h5 or a checkpoint); RunDirError otherwise."""
    if not os.path.isdir(path):
        raise RunDirError(f"run directory {path!r} does not exist")
    names = (CONFIG_FILE, METRICS_FILE, CHECKPOINT_FILE, previous_path(CHECKPOINT_FILE))
    if not any(os.path.exists(os.path.join(path, n)) for n in names):
        raise RunDirError(f"{path!r} is not a run directory: it holds none of {', '.join(names)} "
                          f"(a run directory is run.output_dir/run.name, e.g. runs/cartpole_ppo)")
    return path


def load_metrics(run_dir: str) -> dict[str, np.ndarray]:
    """Every series of the run's metrics.h5; RunDirError if there is none or it has no rows yet."""
    path = os.path.join(open_run_dir(run_dir), METRICS_FILE)
    if not os.path.exists(path):
        raise RunDirError(f"{run_dir!r} holds no {METRICS_FILE} yet (the run writes it after its first update)")
    try:
        metrics = read_metrics(path)
    except (OSError, KeyError, TypeError, ValueError, RuntimeError) as exc:
        # not HDF5, damaged, or holding a group or a scalar where a series belongs
        raise RunDirError(f"cannot read {path!r}: {type(exc).__name__}: {exc}") from None
    missing = [key for key in SERIES_OF_EVERY_ROW if key not in metrics]
    if missing:
        raise RunDirError(f"{path!r} has no series {', '.join(missing)} (it has: {', '.join(metrics) or 'none'}); "
                          f"every metrics file hpcrl writes has {', '.join(SERIES_OF_EVERY_ROW)}")
    for key, series in metrics.items():
        if series.ndim == 0 or not (np.issubdtype(series.dtype, np.number) or series.dtype == bool):
            raise RunDirError(f"{path!r}: series {key!r} is {series.dtype} of shape {series.shape}, not a "
                              f"column of numbers, one per row, as hpcrl writes")
        if key in SERIES_OF_EVERY_ROW and (series.ndim != 1 or not np.isfinite(series).all()):
            raise RunDirError(f"{path!r}: series {key!r} is not one finite number a row (shape {series.shape}), "
                              f"as hpcrl writes it")
    # while a run writes, a reader may see some series a row longer than others: keep whole rows
    rows = min(len(series) for series in metrics.values())
    if not rows:
        raise RunDirError(f"{path!r} has no rows yet (the run writes one after every update)")
    return {key: series[:rows] for key, series in metrics.items()}


def load_config_dict(run_dir: str) -> dict:
    """The run's resolved config as plain data: config.yaml, else the latest checkpoint's copy."""
    path = os.path.join(open_run_dir(run_dir), CONFIG_FILE)
    if os.path.exists(path):
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            raise RunDirError(f"cannot read {path!r}: {exc.strerror}") from None
        return _config_mapping(data, path)
    found, text, _, _ = inspect_latest(os.path.join(run_dir, CHECKPOINT_FILE))
    if found is None:
        raise RunDirError(f"{run_dir!r} holds neither {CONFIG_FILE} nor a usable checkpoint")
    return _config_mapping(text.encode("utf-8", "surrogateescape"), f"{found} (its config)")


def _config_mapping(data: bytes, where: str) -> dict:
    """A config file's content as a mapping; RunDirError naming `where` if it is not UTF-8, not
    YAML, or not a mapping of sections."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunDirError(f"{where!r} is not UTF-8 text (byte {exc.start}); hpcrl writes its config as UTF-8 "
                          f"YAML") from None
    try:
        cfg = load_bounded_yaml(text, where)  # a run directory's file: no alias bomb, no duplicate keys
    except ConfigError as exc:
        raise RunDirError(str(exc)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        why = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise RunDirError(f"{where!r} is not valid YAML ({at}{why})") from None
    if cfg is None:
        return {}
    if not isinstance(cfg, dict):
        raise RunDirError(f"{where!r} holds a YAML {type(cfg).__name__}, not a mapping of config sections "
                          f"(run:, env:, algo:, ...)")
    return cfg


def _checkpoint_file(path: str) -> dict | None:
    """Size, time and counters of one checkpoint file, and whether its checksum holds."""
    if not os.path.exists(path):
        return None
    info = {"file": path, "bytes": os.path.getsize(path), "written": os.path.getmtime(path)}
    try:
        counters, provenance = read_counters_and_provenance(path)  # the file's checksum is read once
        info.update(digest_ok=True, counters=counters, provenance=provenance)
    except CheckpointError as exc:
        info.update(digest_ok=False, problem=str(exc))
    return info


def describe(run_dir: str) -> dict:
    """What `hpcrl inspect` shows, as plain data (also its --json output)."""
    open_run_dir(run_dir)
    checkpoint = os.path.join(run_dir, CHECKPOINT_FILE)
    found, _, counters, _ = inspect_latest(checkpoint)  # (counters checked there: io/checkpoint.py)
    info: dict = {"run_dir": run_dir, "config": load_config_dict(run_dir),
                  "checkpoint": _checkpoint_file(checkpoint),
                  "previous_checkpoint": _checkpoint_file(previous_path(checkpoint)),
                  "resumes_from": found, "progress": None, "no_progress": "", "repairs": _repairs(run_dir)}
    info["repeatable"], info["repeatability"] = _repeatability(info["config"])
    version = counters.get("policy_version")
    info["env_states"] = None if found is None or version is None else env_states.kept_at(run_dir, int(version))
    info["env_states_per_env"] = bool(info["env_states"]) and env_states.kept_env_by_env(run_dir, int(version),
                                                                                         info["env_states"])
    try:
        m = load_metrics(run_dir)
    except RunDirError as exc:
        m, info["no_progress"] = None, _no_rows(run_dir) or str(exc)
    if m is not None:
        last = len(m["frames"]) - 1
        info["progress"] = {
            "frames": int(m["frames"][last]), "updates": last + 1,
            "policy_version": int(m["policy_version"][last]), "wall_time": float(m["wall_time"][last]),
            "return_window_mean": _last(m, "return_window_mean"), "return_mean": _last(m, "return_mean"),
            "episodes": _episodes(m), "rating": _last(m, "rating"), "rating_sigma": _last(m, "rating.sigma"),
            "anchors": _recent_anchor_games(m), "eval": _last_evaluation(m),
            "last_write_age_s": time.time() - os.path.getmtime(os.path.join(run_dir, METRICS_FILE))}
    info["ended"] = run_status.read(run_dir)  # (None for a run from before status.json)
    stopped_by = counters.get("stopped_by", "")
    info["stopped_by"] = stopped_by
    info["finished"] = StopReason.from_text(stopped_by) in (StopReason.TOTAL_FRAMES, StopReason.TARGET_RETURN)
    return info


SUPERBLOCK_BYTES = 96  # an HDF5 file no bigger than its superblock holds no dataset: no row was ever written


def _no_rows(run_dir: str) -> str:
    """Why a metrics.h5 that could not be read holds no rows, when it is only a superblock (its
    writer was created and the run ended, or has not written its first rows yet); '' otherwise."""
    try:
        size = os.path.getsize(os.path.join(run_dir, METRICS_FILE))
    except OSError:
        return ""
    return (f"metrics.h5 holds no rows ({size} bytes: the run ended before its first rows, or is starting)"
            if size <= SUPERBLOCK_BYTES else "")


def _repeatability(cfg: dict) -> tuple[bool | None, str]:
    """Whether the run repeats bit for bit (core/reproducible.py); None where its config does not
    read as one this hpcrl runs."""
    try:
        return repeatability(parse_config(yaml.safe_dump(cfg), "config.yaml", strict=False))
    except (ConfigError, yaml.YAMLError) as exc:
        return None, f"cannot tell: its config is not one this hpcrl runs ({exc})"


def _repairs(run_dir: str) -> list[str]:
    """The lines of recovery.log: what resuming after hard stops repaired (and any rows lost)."""
    try:
        with open(os.path.join(run_dir, RECOVERY_LOG), encoding="utf-8") as fh:
            return [line.rstrip("\n") for line in fh if line.strip()]
    except OSError:
        return []


ANCHOR_GAMES_SHOWN = 100  # inspect's win rate against an anchor: over the latest rows holding this many games


def _recent_anchor_games(metrics: dict[str, np.ndarray]) -> dict[str, dict]:
    """Per anchor of a self-play run (algo.selfplay.anchors): the win rate over its latest
    ANCHOR_GAMES_SHOWN games or more (whole rows), and how many games that is."""
    out = {}
    for key in sorted(k for k in metrics if k.startswith("anchor.") and k.endswith(".games")):
        name = key[len("anchor."):-len(".games")]
        games, rates = metrics[key].astype(np.int64), metrics.get(f"anchor.{name}.win_rate")
        if rates is None or games.ndim != 1 or rates.shape != games.shape:
            continue
        later = np.cumsum(games[::-1])  # games in the last 1, 2, ... rows
        rows = int(np.searchsorted(later, ANCHOR_GAMES_SHOWN)) + 1
        played = int(games[-rows:].sum())
        wins = float(np.nansum(rates[-rows:] * games[-rows:]))
        out[name] = {"games": played, "win_rate": wins / played if played else None}
    return out


def _last(metrics: dict[str, np.ndarray], key: str) -> float | None:
    """The last value of an optional series of one number a row; None if there is none."""
    series = metrics.get(key)
    if series is None or series.ndim != 1:
        return None
    value = float(series[-1])
    return value if math.isfinite(value) else None


def _last_evaluation(metrics: dict[str, np.ndarray]) -> dict | None:
    """The last of run.eval's evaluations (its row's frames and the eval_* values) and how many
    there were; None without any."""
    series = metrics.get("eval_return_mean")
    if series is None or series.ndim != 1:
        return None
    done = np.flatnonzero(np.isfinite(series[:len(metrics["frames"])]))
    if not len(done):
        return None
    row = int(done[-1])
    return {"frames": int(metrics["frames"][row]), "evaluations": len(done),
            **{key: float(metrics[f"eval_{key}"][row]) if f"eval_{key}" in metrics else None
               for key in ("return_mean", "return_std", "length_mean")}}


def _episodes(metrics: dict[str, np.ndarray]) -> int | None:
    """Episodes finished over all rows; None without a series of them."""
    series = metrics.get("episodes")
    total = float(np.nansum(series)) if series is not None and series.ndim == 1 else math.nan
    return int(total) if math.isfinite(total) else None


def _section(cfg: dict, key: str) -> dict:
    """A config section as a mapping: an edited config may hold anything there, and a summary
    shows what it can rather than fail."""
    value = cfg.get(key)
    return value if isinstance(value, dict) else {}


def _count(value) -> str:
    """A count with thousands separators, or as it is when it is not a number."""
    if value is None:
        return "n/a"
    return f"{value:,}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _config_summary(cfg: dict) -> list[str]:
    run, env, algo, model, roles = (_section(cfg, k) for k in ("run", "env", "algo", "model", "roles"))
    role_counts = ", ".join(f"{name} {_role_count(spec)}" for name, spec in roles.items() if isinstance(spec, dict))
    target = run.get("target_return")
    name = algo.get("name")  # (a run directory's config is data: anything may be there)
    declared = ALGORITHMS.get(name) if isinstance(name, str) else None
    if declared is not None and declared.replay:  # its step's own settings, not PPO's epochs
        dqn, replay = _section(algo, declared.replay_section), _section(algo, "replay")
        # (a team's replay holds whole episodes: one-step targets, batches of episodes)
        steps = f"{dqn.get('n_step')}-step" if "n_step" in dqn else f"episodes of {dqn.get('episode_length')} steps"
        step = (f"{steps}, batch {dqn.get('batch_size')}, replay {_count(replay.get('capacity', 0))} "
                f"ratio {replay.get('replay_ratio') or 'null'}")
    else:
        step = f"epochs {algo.get('epochs')}"
    # auto takes the CNN for the image observations of the atari preset
    cnn = model.get("encoder") == "cnn" or (model.get("encoder") == "auto" and env.get("preset") == "atari")
    net = "Nature CNN" if cnn else f"{model.get('hidden_sizes')} {model.get('activation')}"
    if model.get("encoder") == "grid":
        net = f"grid convolutions, then {net}"
    if is_custom(model.get("encoder")):  # the author's own class: named, never imported here
        net = f"{model.get('encoder')} {model.get('encoder_kwargs') or ''}".rstrip()
    return [f"{env.get('id')} x {env.get('num_envs')} per env rank; {algo.get('name')} {algo.get('mode')}, rollout "
            f"{algo.get('rollout_length')}, lr {algo.get('lr')} {algo.get('lr_schedule')}, {step}, model {net}",
            f"roles: {role_counts}; seed {run.get('seed')}; total_frames {_count(run.get('total_frames', 0))}"
            + (f"; target_return {target}" if target is not None else "")]


def _role_count(spec: dict) -> str:
    return str(spec["ranks"]) if spec.get("ranks") is not None else f"{spec.get('per_node')} per node"


def _status(info: dict) -> str:
    ended = info.get("ended")
    if ended is not None and ended["state"] != "done":  # (a finished run: its stop reason says more)
        return run_status.describe(ended)
    if info["stopped_by"]:
        reason = StopReason.from_text(info["stopped_by"])
        return reason.description if reason is not None else info["stopped_by"]
    p = info["progress"]
    age = f"; metrics.h5 last written {duration(p['last_write_age_s'])} ago" if p else ""
    if info["resumes_from"] is None:
        return f"not finished, no checkpoint yet{age}"
    return f"not finished: still running, or stopped without a final checkpoint{age}"


def _checkpoint_line(info: dict | None, run_dir: str) -> str:
    if info is None:
        return "none"
    name = os.path.relpath(info["file"], run_dir)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["written"]))
    head = f"{name}, {info['bytes'] / 1024:,.1f} KiB, written {when}"
    if not info["digest_ok"]:
        return f"{head}, NOT USABLE: {info['problem']}"
    c, p = info["counters"], info.get("provenance") or {}
    written = (f"\n             written by torch {p.get('torch')}, numpy {p.get('numpy')} on {p.get('world_size')} "
               f"ranks ({p.get('learners')} learner, {p.get('inference_ranks')} inference, {p.get('env_ranks')} "
               f"env; {p.get('envs')} envs)" if p else "")
    return (f"{head}, policy version {c.get('policy_version')}, {int(c.get('frames', 0)):,} frames, "
            f"{c.get('updates')} updates, digest OK{written}")


def _env_states_line(info: dict) -> str:
    """Whether every env rank's state at the resumed checkpoint's version is kept (io/env_states.py)."""
    kept = info["env_states"]
    checkpoint = info["checkpoint"] if info["checkpoint"] and info["checkpoint"]["file"] == info["resumes_from"] \
        else info["previous_checkpoint"]
    wanted = ((checkpoint or {}).get("provenance") or {}).get("env_ranks")
    version = ((checkpoint or {}).get("counters") or {}).get("policy_version")
    if isinstance(wanted, int) and kept == list(range(wanted)):
        if info["env_states_per_env"]:
            envs = ((checkpoint or {}).get("provenance") or {}).get("envs")
            return (f"kept by all {wanted} env ranks at policy version {version}, env by env: a resume on any "
                    f"number of env ranks with {envs} envs in all continues exactly")
        return (f"kept by all {wanted} env ranks at policy version {version}: a resume on this layout continues "
                f"exactly")
    of = f" of {wanted}" if isinstance(wanted, int) else ""
    return (f"kept by {len(kept)}{of} env ranks at policy version {version}: a resume starts new episodes "
            f"(the weights and optimizer go on)")


def format_report(info: dict, full_config: bool = False) -> str:
    run_dir = info["run_dir"]
    lines = [f"run          {run_dir}"]
    if full_config:
        lines += ["config", *("  " + line for line in yaml.safe_dump(info["config"], sort_keys=False).splitlines())]
    else:
        lines += [f"config       {line}" if i == 0 else f"             {line}"
                  for i, line in enumerate(_config_summary(info["config"]))]
    lines.append(f"status       {_status(info)}")
    first, *rest = info["repeatability"].split("; ")  # a clause a line
    lines += [f"repeats      {first}{';' if rest else ''}", *(f"             {c}{';' if i < len(rest) - 1 else ''}"
                                                              for i, c in enumerate(rest))]
    p = info["progress"]
    if p is None:
        lines.append(f"progress     none: {info['no_progress']}")
    else:
        total = _section(info["config"], "run").get("total_frames")
        share = (f" ({100 * p['frames'] / total:.1f}% of run.total_frames)"
                 if isinstance(total, (int, float)) and total > 0 else "")
        ret = "n/a" if p["return_window_mean"] is None else f"{p['return_window_mean']:.1f}"
        lines += [f"progress     {p['frames']:,} frames{share}, {p['updates']:,} updates, policy version "
                  f"{p['policy_version']}, wall time {duration(p['wall_time'])}",
                  f"             last return {ret} (mean of the last >= 20 episodes), {_count(p['episodes'])} episodes"]
        if p.get("eval") is not None:
            e = p["eval"]
            spread = "" if e["return_std"] is None else f" +- {e['return_std']:.1f}"
            lines.append(f"             last eval {e['return_mean']:.1f}{spread} at {e['frames']:,} frames "
                         f"({e['evaluations']} evaluation{'s' if e['evaluations'] != 1 else ''}, run.eval)")
        if p.get("rating") is not None:
            against = ", ".join(f"{name} {a['win_rate']:.2f} of {a['games']:,}" for name, a in p["anchors"].items()
                                if a["win_rate"] is not None)
            lines.append(f"             rating {p['rating']:.1f} +- {p['rating_sigma'] or 0:.1f} against the anchors; "
                         f"latest games won: {against or 'none yet'}")
    lines.append(f"checkpoint   {_checkpoint_line(info['checkpoint'], run_dir)}")
    lines.append(f"previous     {_checkpoint_line(info['previous_checkpoint'], run_dir)}")
    if info["env_states"] is not None:
        lines.append(f"env states   {_env_states_line(info)}")
    if info["resumes_from"] is not None and info["checkpoint"] and info["resumes_from"] != info["checkpoint"]["file"]:
        lines.append(f"resume from  {os.path.relpath(info['resumes_from'], run_dir)} (the latest one is not usable)")
    if info["repairs"]:
        lines.append(f"repairs      {len(info['repairs'])} after hard stops ({RECOVERY_LOG}); the last: {info['repairs'][-1]}")
    return "\n".join(lines)
