"""Generalised advantage estimation (Schulman et al. 2016) over [T, N] fragments.

The numpy reference, the one place the recursion is written in Python; `hpcrl.algos.kernels` runs
the same recursion in C when the extension is built (the learner calls it there), and the tests
compare the two.
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


class OwnSteps:
    """Advantages over each agent's own steps: in a multi-agent fragment a row may sit out steps
    (inactive: an agent waiting for its turn, dead, or not joined yet). Each column's active steps
    are moved, in order, to its top, so GAE or V-trace run unchanged on the compacted [T, N] arrays
    and the results go back to where the steps were:
    - the successor of an own step is the value at the column's next own step (or the fragment's
      last_values after its last one), never an inactive step's;
    - rewards that arrive while a row sits out (an opponent's move ends the game) belong to its
      previous own step, and so does an episode end among them (with that step's trunc_values);
    - the compacted tail past a column's own steps is padding: done, zero reward and value, so
      neither estimator reads it, and its results are dropped.
    Rewards and ends that come before a column's first own step in the fragment are dropped: they
    follow the previous fragment's last own step, which bootstrapped from its value instead."""

    def __init__(self, active: np.ndarray):
        self.active = active.astype(bool)
        T = len(self.active)
        self.order = np.argsort(~self.active, axis=0, kind="stable")  # own steps first, in time order
        self.valid = np.arange(T)[:, None] < self.active.sum(0)  # compacted positions holding an own step
        # the step after each own step's span: the next own step, or T after the last
        following = np.full_like(self.order, T)
        following[:-1] = np.where(self.valid[1:], self.order[1:], T)
        self.following = np.where(self.valid, following, T)

    def gather(self, x: np.ndarray) -> np.ndarray:
        return np.where(self.valid, np.take_along_axis(x, self.order, 0), 0).astype(x.dtype, copy=False)

    def compact(self, rewards: np.ndarray, values: np.ndarray, last_values: np.ndarray, dones: np.ndarray,
                trunc_values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Compacted rewards, values, successor values and dones, ready for gae or vtrace."""
        T, N = rewards.shape
        start = np.where(self.valid, self.order, T)
        summed = np.concatenate([np.zeros((1, N)), np.cumsum(rewards, axis=0, dtype=np.float64)])
        rc = (np.take_along_axis(summed, self.following, 0) - np.take_along_axis(summed, start, 0))
        # the first end at or after each step (T where none follows)
        ends = np.where(dones.astype(bool), np.arange(T)[:, None], T)
        first_end = np.concatenate([np.minimum.accumulate(ends[::-1], axis=0)[::-1], np.full((1, N), T)])
        end = np.take_along_axis(first_end, start, 0)
        ended = self.valid & (end < self.following)
        vc = self.gather(values)
        last = self.valid & ~np.append(self.valid[1:], np.zeros((1, N), dtype=bool), axis=0)  # last own step
        nxt = np.zeros_like(vc)
        nxt[:-1] = vc[1:]
        nxt = np.where(last, last_values, nxt)
        trunc = np.take_along_axis(np.concatenate([trunc_values, np.zeros((1, N), trunc_values.dtype)]),
                                   end, 0)
        nxt = np.where(ended, trunc, nxt)
        # a column's last own step is cut like a truncation: its successor is given, not the padding
        dc = ended | last | ~self.valid
        return (np.where(self.valid, rc, 0).astype(np.float32), vc, np.where(self.valid, nxt, 0).astype(np.float32),
                dc.astype(np.uint8))

    def scatter(self, xc: np.ndarray, fill: np.ndarray) -> np.ndarray:
        """Compacted results back to their steps; inactive steps keep `fill`."""
        out = fill.astype(np.float32, copy=True)
        rows, cols = self.order[self.valid], np.nonzero(self.valid)[1]
        out[rows, cols] = xc[self.valid]
        return out
