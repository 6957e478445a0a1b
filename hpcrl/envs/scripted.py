"""Players written as functions (`module:function`): the fixed opponents of `hpcrl eval
--opponent` and a self-play run's anchors (algo.selfplay.anchors).

A player is called with an env's rows (each agent's own observation, flattened as the policies
see them), their action masks (None where the env gives none) and a numpy generator, and returns
one action per row. Pure numpy on hpcrl's side: env ranks that play anchors never import torch.

The module is imported by name from the Python path, which holds the working directory however
hpcrl was started (hpcrl.core.startup.find_modules_in_working_directory): a name the user gave on the
command line or in the config passed to `hpcrl run`, never one read from a run directory (tools
that read a run directory's config never play its anchors).
"""
from __future__ import annotations

import importlib
from typing import Callable

import numpy as np

from hpcrl.core.config_base import ConfigError
from hpcrl.core.observations import count_rows


def load_player(spec: str, where: str) -> Callable:
    """The function `spec` ("module:function") names; ConfigError naming `where` (the option or
    config key that gave it) if it cannot be imported or is not a function."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ConfigError(f"{where}: expected module:function (e.g. hpcrl.envs.anchors:uniform), got {spec!r}")
    try:
        play = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise ConfigError(f"{where}: cannot import module {module!r} ({exc}); give module:function of a module "
                          f"on the Python path (run from the directory that holds it, or install it)") from None
    except AttributeError:
        raise ConfigError(f"{where}: module {module!r} has no {name!r}") from None
    if not callable(play):
        raise ConfigError(f"{where}: {name!r} in {module!r} is not a function")
    return play


class ScriptedPlayer:
    """A loaded player and where it came from, for errors about what it returns."""

    def __init__(self, spec: str, where: str):
        self.spec, self.where = spec, where
        self.play = load_player(spec, where)

    def act(self, obs, mask: np.ndarray | None, rng: np.random.Generator) -> np.ndarray:
        actions = np.asarray(self.play(obs, mask, rng))
        rows = count_rows(obs)
        if actions.shape[:1] != (rows,):
            raise ValueError(f"{self.where} ({self.spec}): returned {actions.shape[:1]} actions for {rows} rows; "
                             f"a player returns one action per row")
        return actions


def anchor_players(selfplay) -> list[ScriptedPlayer]:
    """A self-play run's anchors (algo.selfplay.anchors) as players, in the config's order."""
    return [ScriptedPlayer(spec, f"algo.selfplay.anchors.{name}") for name, spec in selfplay.anchor_players().items()]
