"""The config's run.wandb section: Weights & Biases logging (io/wandb_log.py), off unless a
project is named.

Pure Python, like the rest of the config (core/config.py assembles it).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from hpcrl.core.config_base import OneOf, check, check_ranges, doc, shown

WANDB_MODES = ("online", "offline", "disabled")
NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")  # a W&B project, entity or group name


@dataclass
class WandbConfig:
    """Weights & Biases: the learner root logs every metrics row (TensorBoard's scalars) and the config."""

    project: str | None = doc("the W&B project to log to (null: no W&B). Needs the wandb package: pip install "
                              "'hpcrl[wandb]'", default=None)
    entity: str | None = doc("the W&B entity (user or team); null: your default", default=None)
    group: str | None = doc("the W&B group of the run; null: none, and a population's members are grouped under the "
                            "population's run.name", default=None)
    tags: list = doc("W&B tags of the run", default_factory=list)
    mode: str = doc("'online' (to the W&B server; needs a login), 'offline' (only W&B's local files in the run "
                    "directory's wandb/, for a later `wandb sync`: no network, no login) or 'disabled'",
                    range=OneOf(WANDB_MODES), default="online")


def validate_wandb(w: WandbConfig) -> None:
    check_ranges(w, "run.wandb")
    for key in ("project", "entity", "group"):
        value = getattr(w, key)
        check(value is None or (isinstance(value, str) and NAME.fullmatch(value)),
              lambda: f"run.wandb.{key}: expected null or a name of letters, digits, '_', '.' and '-' (up to 128), "
                      f"got {shown(value)}")
    check(isinstance(w.tags, list) and all(isinstance(t, str) and 0 < len(t) <= 64 for t in w.tags),
          lambda: f"run.wandb.tags: expected a list of tags, each text of 1 to 64 characters, got {shown(w.tags)}")
    check(w.project is not None or (w.entity is None and w.group is None and not w.tags),
          "run.wandb: entity, group and tags need a project (run.wandb.project); name one, or remove them")
