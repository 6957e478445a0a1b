"""Every random stream of a run, derived from the run seed with numpy's SeedSequence.

A stream is keyed by (run seed, purpose, index, group, env): the purpose (envs, a learner's
minibatch order, a policy's action sampling) and the index of the rank within its role, so no
two envs, ranks or purposes of one run share a seed, and run seeds 1, 2, 3 give independent
streams (the old `seed * k + i` arithmetic made seed s+1 on one rank replay seed s on another).
Seeds are 64-bit: at thousands of ranks, 32-bit seeds would collide by the birthday bound.
Pure numpy; the ids below are part of the results' reproducibility, so they are never renumbered.
"""
from __future__ import annotations

import numpy as np

PURPOSES = {"env": 1, "learner": 2, "inference": 3, "inline_policy": 4, "replay": 5, "explore": 6,
            "policy_init": 7, "selfplay": 8, "population": 9,
            "league": 10}


def seed_for(run_seed: int, purpose: str, index: int, group: int = 0, env: int = 0) -> int:
    """The 64-bit seed of one stream: `purpose` in PURPOSES, `index` the rank's index in its role."""
    words = np.random.SeedSequence(run_seed, spawn_key=(PURPOSES[purpose], index, group, env)).generate_state(2)
    return int(words[0]) << 32 | int(words[1])


def env_seeds(run_seed: int, env_index: int, group: int, num_envs: int) -> list[int]:
    """The seeds of the `num_envs` envs of one group of env rank number `env_index`."""
    return [seed_for(run_seed, "env", env_index, group, env) for env in range(num_envs)]
