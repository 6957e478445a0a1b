"""The PPO clipped-objective loss and the minibatch-epoch update (one place for both)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import nn

from hpcrl.core.config import AlgoConfig

LOSS_KEYS = ("loss_policy", "loss_value", "entropy", "approx_kl", "clip_frac")


@dataclass
class Batch:
    """Flat [B, ...] tensors for one learner's update."""

    obs: torch.Tensor
    actions: torch.Tensor
    logp: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor

    def __len__(self) -> int:
        return self.obs.shape[0]

    def take(self, idx: torch.Tensor) -> "Batch":
        return Batch(*(getattr(self, f)[idx] for f in self.__dataclass_fields__))


def ppo_loss(model: nn.Module, mb: Batch, cfg: AlgoConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate + value loss - entropy bonus; returns the loss and detached statistics."""
    new_logp, entropy, new_values = model.evaluate(mb.obs, mb.actions)
    log_ratio = new_logp - mb.logp
    ratio = log_ratio.exp()
    adv = mb.advantages
    if cfg.norm_adv and len(adv) > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
    if cfg.clip_vloss:
        clipped = mb.values + (new_values - mb.values).clamp(-cfg.clip_coef, cfg.clip_coef)
        v_loss = 0.5 * torch.max((new_values - mb.returns) ** 2, (clipped - mb.returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((new_values - mb.returns) ** 2).mean()
    ent = entropy.mean()
    loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * ent
    with torch.no_grad():
        stats = {"loss_policy": pg_loss.detach(), "loss_value": v_loss.detach(), "entropy": ent.detach(),
                 # k3 estimator of KL(old || new), low variance (Schulman's note on KL approximation)
                 "approx_kl": ((ratio - 1) - log_ratio).mean(),
                 "clip_frac": ((ratio - 1).abs() > cfg.clip_coef).float().mean()}
    return loss, stats


def ppo_update(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, cfg: AlgoConfig,
               rng: np.random.Generator, average_gradients: Callable[[], None] = lambda: None,
               apply_step: Callable[[], None] | None = None, loss_scale: float = 1.0) -> dict[str, float]:
    """`epochs` passes of `num_minibatches` minibatches. `average_gradients` runs between backward
    and clipping (Horovod's synchronize), so the norm is clipped on the averaged gradient.
    `loss_scale` weights this learner's gradient by its share of the global batch, so that an
    equal-weight average over learners with unequal batches is still the mean over all samples."""
    apply_step = apply_step or optimizer.step
    totals = {k: 0.0 for k in LOSS_KEYS}
    steps = 0
    for _ in range(cfg.epochs):
        order = torch.from_numpy(rng.permutation(len(batch)))
        for idx in torch.tensor_split(order, cfg.num_minibatches):
            loss, stats = ppo_loss(model, batch.take(idx), cfg)
            optimizer.zero_grad()
            (loss * loss_scale).backward()
            average_gradients()
            nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            apply_step()
            for k in LOSS_KEYS:
                totals[k] += float(stats[k])
            steps += 1
    return {k: v / steps for k, v in totals.items()}


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, cfg: AlgoConfig,
               rng: np.random.Generator, reduce_moments: Callable[[np.ndarray], np.ndarray] = lambda m: m,
               **update_kwargs) -> dict[str, float]:
    """One PPO/APPO trainer step: the update (unless algo.train is false), then the observation
    normaliser folds in the batch. In that order the update trains with the statistics the batch
    was collected with, so in sync mode the first minibatch's ratios are exactly 1. `reduce_moments`
    sums the normaliser's moments over all learners (an allreduce)."""
    losses = ppo_update(model, optimizer, batch, cfg, rng, **update_kwargs) if cfg.train \
        else dict.fromkeys(LOSS_KEYS, 0.0)
    model.update_obs_norm(batch.obs, reduce=reduce_moments)
    return losses
