"""Generalised advantage estimation (Schulman et al. 2016) over [T, N] fragments.

The one place GAE lives: the learner, the tests and (later) the C kernel's reference all call it.
Episode ends come in two kinds. A terminated episode has no future (its successor value is 0); a
truncated one (time limit) does, so its successor value is the critic's value of the final
observation, which env ranks send as `trunc_values`. Both cut the recursion.
"""
from __future__ import annotations

import numpy as np


def successor_values(values: np.ndarray, last_values: np.ndarray, dones: np.ndarray,
                     trunc_values: np.ndarray) -> np.ndarray:
    """V(s_{t+1}) as seen from step t: the next step's value, last_values after the final step,
    and trunc_values (0 when terminated) where the episode ended at t."""
    nxt = np.empty_like(values)
    nxt[:-1] = values[1:]
    nxt[-1] = last_values
    return np.where(dones.astype(bool), trunc_values, nxt).astype(values.dtype, copy=False)


def gae(rewards: np.ndarray, values: np.ndarray, next_values: np.ndarray, dones: np.ndarray,
        gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and value targets (advantages + values), all arrays [T, N]."""
    T = rewards.shape[0]
    advantages = np.zeros_like(rewards, dtype=np.float32)
    carry = np.zeros(rewards.shape[1:], dtype=np.float32)
    not_done = 1.0 - dones.astype(np.float32)
    deltas = rewards + gamma * next_values - values
    for t in range(T - 1, -1, -1):
        carry = deltas[t] + gamma * lam * not_done[t] * carry
        advantages[t] = carry
    return advantages, advantages + values
