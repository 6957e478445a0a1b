"""Partially observed versions of classic tasks, for policies that need memory (model.core).

`hpcrl/CartPolePositions-v1`: CartPole-v1 whose observations keep the cart position and the pole
angle and hide both velocities (the "CartPole with velocities hidden" POMDP of recurrent-RL
papers). A feed-forward policy sees no motion; a recurrent one can infer it from successive frames.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np

CARTPOLE_POSITIONS = "hpcrl/CartPolePositions-v1"


class KeepObservations(gym.ObservationWrapper):
    """A Box observation cut to the entries at `indices`."""

    def __init__(self, env: gym.Env, indices: list[int]):
        super().__init__(env)
        self.indices = np.asarray(indices, dtype=np.int64)
        box = env.observation_space
        self.observation_space = gym.spaces.Box(box.low[self.indices], box.high[self.indices], dtype=box.dtype)

    def observation(self, observation):
        return observation[self.indices]


def cartpole_positions(**kwargs) -> gym.Env:
    """CartPole-v1 observing [cart position, pole angle] only."""
    return KeepObservations(gym.make("CartPole-v1", **kwargs), [0, 2])


def register() -> None:
    if CARTPOLE_POSITIONS not in gym.registry:
        gym.register(CARTPOLE_POSITIONS, entry_point=cartpole_positions)
