"""A gymnasium observation space -> its leaves (hpcrl.core.observations.ObsLeaves)."""
from __future__ import annotations

from typing import Callable

import gymnasium as gym
import numpy as np

from hpcrl.core.observations import Leaf, ObsLeaves


def leaves_of(space, warn: Callable[[str], None] = lambda message: None) -> ObsLeaves:
    """The leaves of a gymnasium observation space: Box, Discrete, MultiBinary leaves of Dict and
    Tuple spaces (nested). Text leaves are dropped (with `warn`); other spaces raise ValueError."""
    leaves, dropped = [], []

    def walk(sp, key: str) -> None:
        if isinstance(sp, gym.spaces.Dict):
            for name, sub in sp.spaces.items():
                walk(sub, f"{key}.{name}" if key else str(name))
        elif isinstance(sp, gym.spaces.Tuple):
            for i, sub in enumerate(sp.spaces):
                walk(sub, f"{key}.{i}" if key else str(i))
        elif isinstance(sp, gym.spaces.Box):
            leaves.append(Leaf(key, tuple(sp.shape), np.dtype(sp.dtype).name))
        elif isinstance(sp, gym.spaces.Discrete) and int(sp.start) == 0:
            leaves.append(Leaf(key, (), "int64", categories=int(sp.n)))
        elif isinstance(sp, gym.spaces.MultiBinary):
            leaves.append(Leaf(key, tuple(np.atleast_1d(sp.n)), "int8"))
        elif isinstance(sp, gym.spaces.Text) or _text_like(sp):
            dropped.append(key)
        else:
            raise ValueError(f"observation key {key or '(whole)'!r} has space {sp}; hpcrl supports Box, Discrete "
                             f"(from 0) and MultiBinary leaves, in Dict and Tuple spaces")

    walk(space, "")
    if dropped:
        warn(f"observation keys {', '.join(dropped)} are text, which hpcrl does not encode: left out")
    if not leaves:
        raise ValueError(f"observation space {space} has no array leaves")
    return ObsLeaves(tuple(leaves), tuple(dropped))


def _text_like(space) -> bool:
    """A space of strings that is not gymnasium's Text (MiniGrid's MissionSpace)."""
    try:
        return (space.dtype is None or np.dtype(space.dtype).kind in "US") and isinstance(space.sample(), str)
    except Exception:  # a space that cannot sample is not one we can use either
        return False
