"""An env vector's state split env by env, so a resume can deal the envs of a run to another number
of env ranks (hpcrl/workers/env_deal.py; docs/reproducibility.md, "An exact resume").

A vector can be split when each layer of it, its wrappers and the vector itself, says what state
it keeps per row in a class attribute `ROW_STATE`: the names of its attributes that hold one entry
per row (an array, or a dict of arrays: a structured observation), all else being config or
scratch a step overwrites. The vector at the bottom keeps its envs in `envs`, one object graph
each, which `hpcrl.envs.state` captures alone. A layer without `ROW_STATE` keeps state across its
envs (gymnasium's numpy vectors and envpool's pools draw from one generator for the whole
vector), so the vector cannot be split, and an env rank keeps its state whole instead.

No MPI and no torch here.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np


class NotSplittable(TypeError):
    """The vector keeps state that is not per env."""


def split(envs: gym.vector.VectorEnv) -> tuple[list, dict[str, object]]:
    """(the vector's envs in row order, {name: its per-row state}), where a name says the layer
    (its depth under the outermost wrapper) and the attribute; the values are the live arrays (or
    dicts of arrays), so a restore writes into them. NotSplittable says which layer stands in the way."""
    rows: dict[str, object] = {}
    layer, depth = envs, 0
    while True:
        names = type(layer).__dict__.get("ROW_STATE")  # declared by the class itself, not inherited
        if names is None:
            raise NotSplittable(f"{type(layer).__name__} keeps state across its envs")
        for name in names:
            value = getattr(layer, name)
            if value is not None:
                rows[f"{depth}.{name}"] = value
        if not isinstance(layer, gym.vector.VectorWrapper):
            break
        layer, depth = layer.env, depth + 1
    sub_envs = getattr(layer, "envs", None)
    if not isinstance(sub_envs, list):
        raise NotSplittable(f"{type(layer).__name__} keeps no list of envs")
    return sub_envs, rows


def row_arrays(rows: dict[str, object]) -> dict[str, np.ndarray]:
    """Per-row state as flat named arrays: a dict of arrays gives one per key ('0._obs.image')."""
    flat = {}
    for name, value in rows.items():
        if isinstance(value, dict):
            flat.update({f"{name}.{key}": array for key, array in value.items()})
        else:
            flat[name] = value
    return flat
