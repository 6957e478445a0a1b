"""The costs file of `hpcrl tune`: what was measured, saved with --save-costs (on a compute node,
say) and read back with --costs to plan other sizes without measuring again. A file belongs to one
env, algorithm and network size; costs of another are refused.
"""
from __future__ import annotations

import json
import os
import time

from hpcrl.core.config import Config, ConfigError
from hpcrl.envs import EnvSpaces


def _measured_for(cfg: Config, spaces: EnvSpaces) -> dict:
    """What measured costs belong to: the env, the algorithm, the network's size."""
    from hpcrl.models import build_policy, num_params
    return {"env": cfg.env.id, "algo": cfg.algo.name, "params": num_params(build_policy(spaces, cfg))}


def save_costs(path: str, cfg: Config, spaces: EnvSpaces, points: dict) -> None:
    """The measurements (`points`: name -> (sizes, seconds)) as JSON, with what they belong to and
    where and when they were measured."""
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"hpcrl_tune_costs": 1, **_measured_for(cfg, spaces), "host": os.uname().nodename,
                   "measured": time.strftime("%Y-%m-%d %H:%M"),
                   "points": {name: [list(xs), list(ys)] for name, (xs, ys) in points.items()}}, fh, indent=1)


def load_costs(path: str, cfg: Config, spaces: EnvSpaces) -> tuple[dict, str]:
    """Costs saved by `hpcrl tune --save-costs` (on a compute node, say) for this config's env,
    algorithm and network, and where and when they were measured; a ConfigError when they belong
    to another."""
    try:
        with open(path, encoding="utf-8") as fh:
            saved = json.load(fh)
        points = {name: (xs, ys) for name, (xs, ys) in saved["points"].items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"--costs {path}: not costs saved by hpcrl tune --save-costs ({exc})") from None
    want = _measured_for(cfg, spaces)
    have = {key: saved.get(key) for key in want}
    if have != want:
        raise ConfigError(f"--costs {path}: measured for {have}, but this config is {want}; measure it again "
                          f"(without --costs)")
    return points, f"{saved.get('host', '?')} at {saved.get('measured', '?')}"
