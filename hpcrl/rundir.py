"""The run directory: start a new run, or resume the one already there from its latest checkpoint.

Runs on rank 0 before any role exists; no MPI and no torch (a checkpoint is inspected with h5py).
A run directory holds config.yaml, metrics.h5, checkpoint.h5 and checkpoint.prev.h5.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

import yaml

from hpcrl.checkpoint import inspect_latest
from hpcrl.config import Config, ConfigError, parse_config, to_dict, to_yaml

CHECKPOINT_FILE = "checkpoint.h5"
METRICS_FILE = "metrics.h5"
# What a resumed run may not change: the policy's shape and what it was trained on.
MUST_MATCH = ("env.id", "env.kwargs", "model.hidden_sizes", "model.activation", "model.encoder", "model.obs_norm",
              "algo.name", "algo.mode")


@dataclass
class RunStart:
    run_dir: str
    config_text: str
    resume_file: str | None = None  # the checkpoint to continue from
    start_version: int = 0  # the policy version env ranks collect with first
    start_frames: int = 0
    finished: str = ""  # why the run in the directory is already complete (nothing left to do)
    warnings: list[str] = field(default_factory=list)


def _lookup(tree: dict, dotted: str):
    for part in dotted.split("."):
        tree = tree.get(part, {}) if isinstance(tree, dict) else {}
    return tree


def _resolved(config_text: str) -> dict:
    """A checkpoint's config with today's defaults filled in, so that a key added since it was
    written compares as its default rather than as missing."""
    try:
        return to_dict(parse_config(config_text))
    except ConfigError:  # written by another version: compare what it says
        return yaml.safe_load(config_text) or {}


def prepare(cfg: Config, overwrite: bool) -> RunStart:
    """Create or reopen output_dir/name; a ConfigError says what stands in the way and what to do."""
    run_dir = os.path.join(cfg.run.output_dir, cfg.run.name)
    checkpoint = os.path.join(run_dir, CHECKPOINT_FILE)
    start = RunStart(run_dir=run_dir, config_text=to_yaml(cfg))
    if overwrite and os.path.isdir(run_dir):
        shutil.rmtree(run_dir)
    elif os.path.isdir(run_dir):
        found, old_text, counters, problems = inspect_latest(checkpoint)
        start.warnings += problems
        if found is None and os.path.exists(os.path.join(run_dir, METRICS_FILE)):
            raise ConfigError(f"run directory {run_dir!r} holds a run but no usable checkpoint"
                              f"{' (' + '; '.join(problems) + ')' if problems else ''}; pass --overwrite to start "
                              f"it again, or choose another run.name")
        if found is not None:
            old, new = _resolved(old_text), to_dict(cfg)
            for key in MUST_MATCH:
                if _lookup(old, key) != _lookup(new, key):
                    raise ConfigError(f"cannot resume {run_dir!r}: its checkpoint was trained with {key} = "
                                      f"{_lookup(old, key)!r}, the config now says {_lookup(new, key)!r}; put it "
                                      f"back, or start a new run (another run.name, or --overwrite)")
            start.resume_file = found
            start.start_version = int(counters.get("policy_version", 0))
            start.start_frames = int(counters.get("frames", 0))
            start.finished = _already_finished(cfg, counters)
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "config.yaml"), "w", encoding="utf-8") as fh:
        fh.write(start.config_text)
    return start


def _already_finished(cfg: Config, counters: dict) -> str:
    """Why resuming would have nothing to do, or '' when the run should go on."""
    frames, stopped_by = int(counters.get("frames", 0)), counters.get("stopped_by", "")
    if frames >= cfg.run.total_frames:
        return (f"it reached run.total_frames ({frames:,} >= {cfg.run.total_frames:,}); raise run.total_frames "
                f"to train on")
    if stopped_by == "target_return" and counters.get("target_return") == cfg.run.target_return:
        return (f"it reached run.target_return ({cfg.run.target_return}); change or remove run.target_return "
                f"to train on")
    return ""
