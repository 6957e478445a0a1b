"""Running mean and variance: Chan et al.'s parallel merge of (count, mean, M2) with a batch's.

The one place the merge lives: the observation normaliser (torch buffers, models.py), the actors'
discounted-return moments (envs/vector.py) and the trainers' reward scale (`ReturnScaler`) call it. Only arithmetic operators are used, so
numpy arrays, torch tensors and floats all work; no torch import here (env ranks use it).
"""
from __future__ import annotations

import numpy as np


def merge_moments(mean, var, count, batch_mean, batch_m2, n):
    """(mean, var, count) after folding in a batch of `n` samples with mean `batch_mean` and sum of
    squared deviations `batch_m2`. `count` and `n` must not both be 0."""
    delta, total = batch_mean - mean, count + n
    m2 = var * count + batch_m2 + delta * delta * count * n / total
    return mean + delta * n / total, m2 / total, total


def combine_moments(rows) -> tuple[float, float, float]:
    """(count, mean, M2) of several (count, mean, M2) rows taken together."""
    n, mu, m2 = np.asarray(rows, dtype=np.float64).reshape(-1, 3).T
    count = float(n.sum())
    if not count:
        return 0.0, 0.0, 0.0
    mean = float((n * mu).sum()) / count
    return count, mean, float((m2 + n * (mu - mean) ** 2).sum())


class ReturnScaler:
    """env.normalize_reward, on the trainers: rewards divided by the running standard deviation of
    the discounted return (as SB3's VecNormalize: no mean subtracted, clipped to +-10). Actors send
    the moments of the returns their envs saw with each fragment; every trainer folds in every
    trainer's batch (summed by `reduce`), so the statistics are merged over all env ranks, are the
    same on every trainer, and travel in the trainer's checkpoint."""

    CLIP, EPS = 10.0, 1e-8

    def __init__(self):
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4  # SB3's RunningMeanStd start

    def fold(self, rows, reduce=lambda sums: sums) -> None:
        """Fold in (count, mean, M2) rows; `reduce` sums them over trainers (an allreduce) as
        raw sums (count, sum, sum of squares), which add up where M2 about each mean would not."""
        n, mu, m2 = np.asarray(rows, dtype=np.float64).reshape(-1, 3).T
        count, total, sqsum = reduce(np.array([n.sum(), (n * mu).sum(), (m2 + n * mu * mu).sum()]))
        if count > 0:
            mean = total / count
            self.mean, self.var, self.count = merge_moments(self.mean, self.var, self.count, mean,
                                                            max(sqsum - count * mean * mean, 0.0), count)

    def scale(self, rewards):
        return np.clip(rewards / np.sqrt(self.var + self.EPS), -self.CLIP, self.CLIP).astype(np.float32)

    def state(self) -> dict:
        return {"reward_return_moments": np.array([self.mean, self.var, self.count], dtype=np.float64)}

    def restore(self, state: dict) -> None:
        if "reward_return_moments" in state:  # absent in checkpoints from before it was kept
            self.mean, self.var, self.count = (float(x) for x in state["reward_return_moments"])
