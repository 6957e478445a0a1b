"""SAC's and TD3's trainer steps (Haarnoja et al. 2018; Fujimoto et al. 2018) on n-step transitions
from the learner's replay shard (workers/replay_source.py), as DQN's step uses it: one place for
each loss and target, below, and the steps that run them.

The actors computed the n-step returns G and the discounts of their bootstraps (gamma^k, or 0
after a terminal step), so the critics' target is y = G + discount * (min_i Q'_i(s', a') - alpha
log pi(a'|s')), a' drawn from the current actor (SAC), or y = G + discount * min_i Q'_i(s', a'),
a' the target actor's action with clipped noise (TD3). Actions are in [-1, 1] (models/sac.py).

One optimizer holds every parameter (the trainer's, which Horovod wraps), so one gradient step
sums the critics' loss, the actor's and the entropy coefficient's into one backward pass: the
actor's loss reads the critics through detached copies of their parameters, and the entropy
coefficient's reads the log-probabilities detached, so no loss reaches another's parameters.
Parameters a step does not train (TD3's actor between its delayed updates, SAC's fixed entropy
coefficient) have their gradients dropped after the averaging, so Adam leaves them as they are.
No gradient clipping: neither paper nor SB3 clips. The targets follow the critics (and TD3's
actor) by a Polyak step after each update of theirs; every learner takes the same steps on the
same averaged gradients, so online and target networks stay bit-identical across learners.
"""
from __future__ import annotations

import copy
import math
from typing import Callable

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from hpcrl.core.config import AlgoConfig, Config
from hpcrl.core.observations import grouped

LOSS_KEYS = ("critic_loss", "actor_loss", "q_mean", "td_error")


# --- the losses and targets -----------------------------------------------------------------------------
def soft_target(returns: torch.Tensor, discounts: torch.Tensor, next_q1: torch.Tensor, next_q2: torch.Tensor,
                next_logp: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    """SAC's critic target: G + discount * (min(Q'1, Q'2) - alpha log pi(a'|s'))."""
    return returns + discounts * (torch.min(next_q1, next_q2) - alpha * next_logp)


def clipped_double_target(returns: torch.Tensor, discounts: torch.Tensor, next_q1: torch.Tensor,
                          next_q2: torch.Tensor) -> torch.Tensor:
    """TD3's critic target: G + discount * min(Q'1, Q'2)."""
    return returns + discounts * torch.min(next_q1, next_q2)


def critic_loss(q1: torch.Tensor, q2: torch.Tensor, y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Half the sum of both critics' importance-weighted squared errors (SB3's 0.5 (MSE1 + MSE2))."""
    return 0.5 * (weights * ((q1 - y) ** 2 + (q2 - y) ** 2)).mean()


def sac_actor_loss(logp: torch.Tensor, q1: torch.Tensor, q2: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    """E[alpha log pi(a|s) - min(Q1, Q2)(s, a)], a drawn from the actor (reparameterised)."""
    return (alpha * logp - torch.min(q1, q2)).mean()


def td3_actor_loss(q1: torch.Tensor) -> torch.Tensor:
    """-E[Q1(s, mu(s))]."""
    return -q1.mean()


def alpha_loss(log_alpha: torch.Tensor, logp: torch.Tensor, target_entropy: float) -> torch.Tensor:
    """The entropy coefficient's loss: -E[log alpha (log pi + target entropy)], the log-probs
    detached; its gradient raises alpha while the entropy is below the target."""
    return -(log_alpha * (logp.detach() + target_entropy)).mean()


@torch.no_grad()
def polyak(target: list[torch.Tensor], online: list[torch.Tensor], tau: float) -> None:
    """target <- (1 - tau) target + tau online, in place."""
    torch._foreach_mul_(target, 1.0 - tau)
    torch._foreach_add_(target, online, alpha=tau)


def smoothed_target_actions(actions: torch.Tensor, std: float, clip: float, generator: torch.Generator | None = None
                            ) -> torch.Tensor:
    """TD3's target policy smoothing: a' + clip(N(0, std), -clip, clip), clipped to [-1, 1]."""
    noise = torch.randn(actions.shape, generator=generator, device=actions.device, dtype=actions.dtype)
    return (actions + (noise * std).clamp(-clip, clip)).clamp(-1.0, 1.0)


def critics_detached(model: nn.Module, obs, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both critics' Q(s, a) through detached copies of their parameters: gradients reach the
    actions (and so the actor), never the critics."""
    x = torch.cat([model.inputs(obs).flatten(1), actions.reshape(actions.shape[0], -1)], -1)
    q = [functional_call(net, {k: v.detach() for k, v in net.named_parameters()}, (x,)).squeeze(-1)
         for net in (model.q1, model.q2)]
    return q[0], q[1]


# --- the steps ------------------------------------------------------------------------------------------
class ContinuousStep:
    """One update: algo.sac.gradient_steps gradient steps, each on its own sample from the
    trainer's replay shard, |y - Q1| written back as the priorities (with algo.replay.alpha > 0)."""

    progress = ("critic {critic_loss:.3f} actor {actor_loss:.3f} q {q_mean:.2f} alpha {alpha:.3f} "
                "| replay {replay_size:,.0f}")
    target_actor = False  # TD3: the target networks include the actor

    def __init__(self, cfg: Config, model: nn.Module, optimizer, device: torch.device, rng: np.random.Generator,
                 obs_dtype: str, action_dtype: str):
        self.cfg, self.model, self.optimizer, self.device = cfg, model, optimizer, device
        self.s = cfg.algo.sac
        self.target = copy.deepcopy(model).requires_grad_(False)
        self.gradient_steps = 0
        self.generator = torch.Generator(device=device)  # the targets' and the actor's noise, per learner seed
        self.generator.manual_seed(int(rng.integers(2**63)))
        self.metric_keys = LOSS_KEYS + ("alpha", "replay_size", "replay_ratio", "priority_mean", "beta")

    def alpha(self) -> torch.Tensor:
        return torch.tensor(0.0)

    def __call__(self, source, reduce_moments: Callable[[np.ndarray], np.ndarray] = lambda m: m,
                 average_gradients: Callable[[], None] = lambda: None, apply_step: Callable[[], None] | None = None,
                 loss_scale: float = 1.0, algo: AlgoConfig | None = None) -> dict[str, float]:
        """The hooks are the trainer's, as for PPOStep. `algo`, the algo section in effect, changes
        nothing here: SAC's one live key, lr, is the optimizer's, and the trainer sets it."""
        apply_step = apply_step or self.optimizer.step
        totals = dict.fromkeys(LOSS_KEYS, 0.0)
        actor_steps = 0
        n = source.steps_due(reduce_moments)  # (sync mode: what the replay ratio owes; 0 while warming up)
        for _ in range(n):
            indices, weights, data = source.sample()
            t = {name: torch.as_tensor(values, device=self.device) for name, values in data.items()}
            obs, next_obs = grouped(t, "obs"), grouped(t, "next_obs")
            y = self.critic_target(t["returns"].float(), t["discounts"].float(), next_obs)
            q1, q2 = self.model.q_values(obs, t["actions"])
            loss = critic_loss(q1, q2, y, torch.as_tensor(weights, device=self.device, dtype=torch.float32))
            totals["critic_loss"] += float(loss.detach())
            train_actor = self.gradient_steps % self.s.policy_delay == 0
            if train_actor:
                actor, extra = self.actor_losses(obs)
                totals["actor_loss"] += float(actor.detach())
                loss = loss + actor + extra
                actor_steps += 1
            self.optimizer.zero_grad()
            (loss * loss_scale).backward()
            average_gradients()
            self.drop_untrained(train_actor)
            apply_step()
            polyak(self.target.critic_parameters(), self.model.critic_parameters(), self.s.tau)
            if train_actor and self.target_actor:
                polyak(self.target.actor_parameters(), self.model.actor_parameters(), self.s.tau)
            td = (y - q1).detach().abs().cpu().numpy()
            source.update_priorities(indices, td)
            self.gradient_steps += 1
            totals["q_mean"] += float(q1.detach().mean())
            totals["td_error"] += float(td.mean())
        metrics = {k: v / n if n else math.nan for k, v in totals.items()}  # (nan: no step this round)
        metrics["actor_loss"] = totals["actor_loss"] / actor_steps if actor_steps else math.nan
        metrics["alpha"] = float(self.alpha())
        metrics.update(source.metrics())
        return metrics

    def drop_untrained(self, train_actor: bool) -> None:
        """Gradients of parameters this gradient step does not train: none (Adam skips them)."""
        if not train_actor:
            for p in self.model.actor_parameters():
                p.grad = None

    def critic_target(self, returns: torch.Tensor, discounts: torch.Tensor, next_obs) -> torch.Tensor:
        raise NotImplementedError

    def actor_losses(self, obs) -> tuple[torch.Tensor, torch.Tensor]:
        """(the actor's loss, any other loss trained with it)."""
        raise NotImplementedError

    def state(self) -> dict:
        """What a resume needs besides the model and optimizer: the target networks, the step
        count and the noise generator."""
        return {"target": {k: v.detach().cpu() for k, v in self.target.state_dict().items()},
                "gradient_steps": self.gradient_steps, "generator": self.generator.get_state()}

    def restore(self, state: dict) -> None:
        if not state:
            return
        self.target.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in state["target"].items()})
        self.gradient_steps = int(state["gradient_steps"])
        self.generator.set_state(torch.as_tensor(np.asarray(state["generator"]), dtype=torch.uint8))


class SACStep(ContinuousStep):
    """SAC: the soft target from the current actor's next actions, the reparameterised actor loss,
    and (algo.sac.alpha null) the entropy coefficient tuned towards the target entropy."""

    def __init__(self, cfg: Config, model: nn.Module, *args, **kwargs):
        super().__init__(cfg, model, *args, **kwargs)
        self.tuned = self.s.alpha is None
        self.target_entropy = (float(-model.action_dim) if self.s.target_entropy is None
                               else float(self.s.target_entropy))

    def alpha(self) -> torch.Tensor:
        return self.model.log_alpha.detach().exp() if self.tuned else torch.tensor(float(self.s.alpha))

    @torch.no_grad()
    def critic_target(self, returns, discounts, next_obs) -> torch.Tensor:
        next_actions, next_logp = self.model.sample(next_obs, self.generator)
        next_q1, next_q2 = self.target.q_values(next_obs, next_actions)
        return soft_target(returns, discounts, next_q1, next_q2, next_logp, self.alpha().to(returns.device))

    def actor_losses(self, obs) -> tuple[torch.Tensor, torch.Tensor]:
        actions, logp = self.model.sample(obs, self.generator)
        q1, q2 = critics_detached(self.model, obs, actions)
        alpha = self.alpha().to(logp.device)
        extra = alpha_loss(self.model.log_alpha, logp, self.target_entropy) if self.tuned else logp.new_zeros(())
        return sac_actor_loss(logp, q1, q2, alpha), extra

    def drop_untrained(self, train_actor: bool) -> None:
        super().drop_untrained(train_actor)
        if not (train_actor and self.tuned):
            self.model.log_alpha.grad = None


class TD3Step(ContinuousStep):
    """TD3: the clipped double-Q target from the target actor's smoothed actions, the
    deterministic policy gradient through the first critic, every policy_delay gradient steps."""

    target_actor = True
    progress = "critic {critic_loss:.3f} actor {actor_loss:.3f} q {q_mean:.2f} | replay {replay_size:,.0f}"

    @torch.no_grad()
    def critic_target(self, returns, discounts, next_obs) -> torch.Tensor:
        actions = smoothed_target_actions(self.target.mode(next_obs), self.s.target_noise, self.s.target_noise_clip,
                                          self.generator)
        next_q1, next_q2 = self.target.q_values(next_obs, actions)
        return clipped_double_target(returns, discounts, next_q1, next_q2)

    def actor_losses(self, obs) -> tuple[torch.Tensor, torch.Tensor]:
        q1, _ = critics_detached(self.model, obs, self.model.mode(obs))
        return td3_actor_loss(q1), q1.new_zeros(())
