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
            "league": 10, "action": 11, "eval": 12}


def seed_for(run_seed: int, purpose: str, index: int, group: int = 0, env: int = 0) -> int:
    """The 64-bit seed of one stream: `purpose` in PURPOSES, `index` the rank's index in its role."""
    words = np.random.SeedSequence(run_seed, spawn_key=(PURPOSES[purpose], index, group, env)).generate_state(2)
    return int(words[0]) << 32 | int(words[1])


def env_seeds(run_seed: int, first_env: int, num_envs: int) -> list[int]:
    """The seeds of `num_envs` envs whose global indices start at `first_env`: keyed by the env's
    place among all of the run's envs, never by the rank that steps it, so a layout with other
    env-rank counts steps the same envs from the same seeds."""
    return [seed_for(run_seed, "env", first_env + env) for env in range(num_envs)]


# splitmix64's constants (Steele, Lea and Flood 2014): a counter-based generator, so a draw is a
# pure function of its key and needs no state to save, restore or hand between ranks
_GOLDEN, _MIX1, _MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


def keyed_uniforms(key: int, rows: np.ndarray, steps: np.ndarray, width: int) -> np.ndarray:
    """Uniform draws in (0, 1), float64 [len(rows), width]: row i's depend only on (key, rows[i],
    steps[i]), never on which other rows are drawn with it, in which order or on which rank. An
    action's draw is keyed by (the env row's global index, the step), so a policy holder draws the
    same numbers for an env whichever requests arrived together and whichever rank holds the env."""
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps by design
        base = _mix(np.uint64(key) ^ _mix(np.asarray(rows, np.uint64) * _GOLDEN + np.asarray(steps, np.uint64)))
        x = _mix(base[:, None] + (np.arange(1, width + 1, dtype=np.uint64) * _GOLDEN)[None, :])
    return ((x >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53
