"""Running mean and variance: Chan et al.'s parallel merge of (count, mean, M2) with a batch's.

The one place the merge lives: the observation normaliser (torch buffers, models.py) and reward
normalisation (numpy scalars, vector_envs.py) both call it. Only arithmetic operators are used, so
numpy arrays, torch tensors and floats all work; no torch import here (env ranks use it).
"""
from __future__ import annotations


def merge_moments(mean, var, count, batch_mean, batch_m2, n):
    """(mean, var, count) after folding in a batch of `n` samples with mean `batch_mean` and sum of
    squared deviations `batch_m2`. `count` and `n` must not both be 0."""
    delta, total = batch_mean - mean, count + n
    m2 = var * count + batch_m2 + delta * delta * count * n / total
    return mean + delta * n / total, m2 / total, total
