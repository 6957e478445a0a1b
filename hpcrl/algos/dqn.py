"""DQN's trainer step: double DQN on n-step transitions from prioritized replay, with a target
network, the Huber loss weighted by importance sampling, and TD errors written back as the new
priorities (one place for each). With a recurrent Q-network (model.core) the replay holds R2D2's
sequences instead (`sequence_td_errors`), and a sequence's priority mixes the max and the mean of
its TD errors.

The actors computed the n-step returns G and the discounts of their bootstraps (gamma^k, or 0
after a terminal step), so the target is y = G + discount * Q_target(s', argmax_a Q(s', a)).
Every trainer samples its own shard; Horovod averages the gradients, so the online networks stay
bit-identical, and so do the target networks, copied from them after the same gradient steps.
"""
from __future__ import annotations

import copy
import math
from typing import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from hpcrl.algos.exploration import linear_epsilon
from hpcrl.algos.sequences import n_step_target, sequence_priorities, sequence_targets
from hpcrl.core.config import AlgoConfig, Config
from hpcrl.core.observations import apply, grouped

LOSS_KEYS = ("loss", "td_error", "q_mean")


def td_errors(model: nn.Module, target: nn.Module, obs: torch.Tensor, actions: torch.Tensor,
              returns: torch.Tensor, discounts: torch.Tensor, next_obs: torch.Tensor,
              double: bool = True, value_rescale: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(y - Q(s, a), Q(s, a)) of a batch; y carries no gradient. `value_rescale`: the network
    learns h(Q) (algos/sequences.py)."""
    q = model.q_values(obs).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        next_target = target.q_values(next_obs)
        # double DQN: the online network picks the action, the target network values it
        choice = (model.q_values(next_obs) if double else next_target).argmax(-1, keepdim=True)
        y = n_step_target(returns, discounts, next_target.gather(-1, choice).squeeze(-1), value_rescale)
    return y - q, q


def sequence_td_errors(model: nn.Module, target: nn.Module, data: dict[str, torch.Tensor], d,
                       gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """R2D2: (y - Q(s, a), Q(s, a)), both [L - burn_in, B], of the trained steps of B stored
    sequences (`data`: the replay's rows by field name, [B, L(+1), ...]). Both networks unroll every sequence
    from its stored state, zeroing it where an episode begins; the targets are the double-Q n-step
    returns inside the sequence (algos/sequences.py, the actors' priorities use the same), computed
    on numpy from the bootstrap values: they carry no gradient. `d`: algo.dqn."""
    # time-major rows (row t*B + b is step t of sequence b), of every leaf of a Dict observation
    rows = apply(lambda leaf: leaf.transpose(0, 1).reshape(-1, *leaf.shape[2:]), grouped(data, "obs"))
    ended = (data["terminated"] | data["truncated"]).T.bool()
    starts = torch.cat([torch.zeros_like(ended[:1]), ended]).reshape(-1)  # step 0's state is the stored one
    q_all = model.q_sequence(rows, data["state0"], starts, d.burn_in)  # [L + 1 - burn_in, B, A]
    with torch.no_grad():
        q_next = target.q_sequence(rows, data["state0"], starts, d.burn_in)
        choice = (q_all if d.double else q_next).argmax(-1, keepdim=True)
        bootstrap = q_next.gather(-1, choice).squeeze(-1).cpu().numpy()
    steps = lambda name: data[name].T.cpu().numpy()  # noqa: E731  [L, B]
    y = sequence_targets(steps("rewards"), steps("terminated"), steps("truncated"), steps("final_values"), bootstrap,
                         gamma, d.n_step, d.burn_in, d.value_rescale)
    q = q_all[:-1].gather(-1, data["actions"].T[d.burn_in:].long().unsqueeze(-1)).squeeze(-1)
    return torch.as_tensor(y, device=q.device) - q, q


def dqn_loss(td: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The importance-weighted Huber loss (delta 1) of TD errors: one per sampled row [B], or (R2D2)
    per trained step of each sampled sequence [T, B], every step weighted by its sequence's weight."""
    return (weights * F.huber_loss(td, torch.zeros_like(td), reduction="none", delta=1.0)).mean()


class DQNStep:
    """One update: algo.dqn.gradient_steps gradient steps, each on its own prioritized sample from
    the trainer's replay shard (the batch source, workers/replay_source.py), its TD errors written
    back as priorities before the next sample."""

    # the progress line's part (io/learner_outputs.py)
    progress = "loss {loss:.3f} td {td_error:.3f} q {q_mean:.2f} | replay {replay_size:,.0f} eps {eps_min:.3f}"

    def __init__(self, cfg: Config, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
                 rng: np.random.Generator, obs_dtype: str, action_dtype: str):
        self.cfg, self.model, self.optimizer, self.device = cfg, model, optimizer, device
        self.d = self.settings(cfg)
        self.target: nn.Module | None = None  # copied from the model at the first update (or restored)
        self.gradient_steps = 0
        self.sequences = model.recurrent  # R2D2: the replay's rows are sequences
        self.metric_keys = LOSS_KEYS + ("replay_size", "replay_ratio", "priority_mean", "beta",
                                        "eps_min", "eps_max")

    @staticmethod
    def settings(cfg: Config):
        """The algo section this step reads: algo.dqn."""
        return cfg.algo.dqn

    def _td_errors(self, data: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """TD errors and Q(s, a) of a sample: n-step transitions, or R2D2's sequences."""
        if self.sequences:
            return sequence_td_errors(self.model, self.target, data, self.d, self.cfg.algo.gamma)
        return td_errors(self.model, self.target, grouped(data, "obs"), data["actions"], data["returns"].float(),
                         data["discounts"].float(), grouped(data, "next_obs"), double=self.d.double,
                         value_rescale=self.d.value_rescale)

    def _loss(self, data: dict[str, torch.Tensor], td: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return dqn_loss(td, weights)

    def _priorities(self, data: dict[str, torch.Tensor], abs_td: np.ndarray) -> np.ndarray:
        """The sampled rows' new priorities: their |TD errors| (a sequence's from its steps')."""
        return sequence_priorities(abs_td, self.d.priority_eta) if self.sequences else abs_td

    def _copy_target(self) -> None:
        if self.target is None:
            self.target = copy.deepcopy(self.model)
            self.target.requires_grad_(False)
        self.target.load_state_dict(self.model.state_dict())

    def _tensor(self, a: np.ndarray, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.as_tensor(a, device=self.device, dtype=dtype)

    def __call__(self, source, reduce_moments: Callable[[np.ndarray], np.ndarray] = lambda m: m,
                 average_gradients: Callable[[], None] = lambda: None, apply_step: Callable[[], None] | None = None,
                 loss_scale: float = 1.0, algo: AlgoConfig | None = None) -> dict[str, float]:
        """`source`: the replay batch source (sample, update_priorities, metrics). The hooks are
        the trainer's, as for PPOStep: average gradients (Horovod), apply the optimizer step.
        `algo`: the algo section in effect (algo.schedule's steps applied; default the config's)."""
        apply_step = apply_step or self.optimizer.step
        max_grad_norm = (algo or self.cfg.algo).max_grad_norm
        if self.target is None:
            self._copy_target()
        totals = dict.fromkeys(LOSS_KEYS, 0.0)
        n = source.steps_due(reduce_moments)  # (sync mode: what the replay ratio owes; 0 while warming up)
        for _ in range(n):
            indices, weights, data = source.sample()
            data = {name: self._tensor(values) for name, values in data.items()}
            td, q = self._td_errors(data)
            loss = self._loss(data, td, self._tensor(weights, torch.float32))
            self.optimizer.zero_grad()
            (loss * loss_scale).backward()
            average_gradients()
            nn.utils.clip_grad_norm_(self.model.parameters(), max_grad_norm)
            apply_step()
            abs_td = td.detach().abs().cpu().numpy()
            source.update_priorities(indices, self._priorities(data, abs_td))
            self.gradient_steps += 1
            if self.gradient_steps % self.d.target_update_interval == 0:
                self._copy_target()
            totals["loss"] += float(loss.detach())
            totals["td_error"] += float(abs_td.mean())
            totals["q_mean"] += float(q.detach().mean())
        metrics = {k: v / n if n else math.nan for k, v in totals.items()}  # (nan: no step this round)
        metrics.update(source.metrics())
        metrics["eps_min"], metrics["eps_max"] = self.epsilon_range(source.frames)
        return metrics

    def epsilon_range(self, frames: int) -> tuple[float, float]:
        """The actors' exploration now (workers/replay_writer.py): apex, fixed per env, from eps^(1 +
        eps_alpha) to eps; linear, one epsilon for all."""
        d = self.d
        if d.eps_schedule == "apex":
            return d.eps ** (1.0 + d.eps_alpha), d.eps
        eps = linear_epsilon(d, frames)
        return eps, eps

    def state(self) -> dict:
        """What a resume needs besides the model and optimizer: the target network and the step count."""
        if self.target is None:
            self._copy_target()
        return {"target": {k: v.detach().cpu() for k, v in self.target.state_dict().items()},
                "gradient_steps": self.gradient_steps}

    def restore(self, state: dict) -> None:
        if not state:
            return
        self._copy_target()
        self.target.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in state["target"].items()})
        self.gradient_steps = int(state["gradient_steps"])
