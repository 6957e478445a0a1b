"""VDN's and QMIX's trainer step: one-step TD on the team's Q-value, over stored episodes of the
whole team (PyMARL's learner, Rashid et al. 2018), on DQN's update loop (algos/dqn.py: samples
from the replay shard, gradient steps, the target network copied every target_update_interval
steps, priorities written back, Horovod averaging).

For step t of a stored episode (core/messages.py team_spec):
    y_t = r_t + gamma (1 - terminated_t) Q_tot^target(o_t+1, argmax of each agent's online Q at o_t+1)
with each agent's choice made by the online network under double Q (algo.team.double), else by
the target network; Q_tot is the mixer's (models/team.py) of the agents' Q-values of the actions
they took. The step after an episode's last is its final observation (a time limit bootstraps from
it where algo.team.time_limit_bootstraps; a termination does not); the step after a chunk's last
is the next chunk's first. Padding steps (past the episode's end) are masked out of the loss,
which is the mean squared TD error over the filled steps, each episode's steps weighted by its
importance weight; an episode's new priority is the mean |TD error| of its filled steps. With
algo.team.standardize_rewards the rewards r are (r - mean) / std by the running moments of every
sampled batch's filled steps (EPyMARL's standardise_rewards), summed over the learners so all hold
the same.
"""
from __future__ import annotations

import numpy as np
import torch

from hpcrl.algos.dqn import DQNStep
from hpcrl.core.config import Config
from hpcrl.core.moments import ReturnScaler


def team_td_errors(model, target, data: dict[str, torch.Tensor], gamma: float,
                   double: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(y - Q_tot, Q_tot), both [B, L], zero at padding steps, of B stored episodes (`data`: the
    replay's rows by field name); y carries no gradient."""
    obs, filled = data["obs"], data["filled"].float()
    state0 = data.get("state0")
    q = model.q_episodes(obs, state0)  # [B, L + 1, A, actions]
    taken = q[:, :-1].gather(-1, data["actions"].long().unsqueeze(-1)).squeeze(-1)  # [B, L, A]
    q_tot = model.mix(taken, obs[:, :-1])
    with torch.no_grad():
        q_next = target.q_episodes(obs, state0)[:, 1:]
        choice = (q[:, 1:] if double else q_next).argmax(-1, keepdim=True)
        next_tot = target.mix(q_next.gather(-1, choice).squeeze(-1), obs[:, 1:])
        y = data["rewards"].float() + gamma * (1.0 - data["terminated"].float()) * next_tot
    return (y - q_tot) * filled, q_tot * filled


class RewardMoments(ReturnScaler):
    """The running moments of the team's rewards, for algo.team.standardize_rewards: folded in from
    every sampled batch on every learner (ReturnScaler's merge), applied as (r - mean) / std."""

    def standardized(self, rewards: torch.Tensor, filled: torch.Tensor, reduce) -> torch.Tensor:
        """`rewards` [B, L] standardised, after folding in those of the filled steps."""
        seen = rewards[filled.bool()].double().cpu().numpy()
        if len(seen):
            self.fold([len(seen), seen.mean(), ((seen - seen.mean()) ** 2).sum()], reduce)
        return (rewards - self.mean) / float(np.sqrt(self.var + self.EPS))


class TeamStep(DQNStep):
    """One update of VDN or QMIX: algo.team.gradient_steps gradient steps, each on its own sample of
    episodes (the model is models/team.py's TeamQNetwork: agents and mixer, one module)."""

    progress = "loss {loss:.3f} td {td_error:.3f} q_tot {q_mean:.2f} | replay {replay_size:,.0f} eps {eps_min:.3f}"

    def __init__(self, cfg: Config, *args, **kwargs):
        super().__init__(cfg, *args, **kwargs)
        self.reward_moments = RewardMoments() if self.d.standardize_rewards else None
        self.reduce_moments = lambda sums: sums  # the update's allreduce over learners (set by each call)

    def __call__(self, source, reduce_moments=lambda m: m, *args, **kwargs) -> dict[str, float]:
        self.reduce_moments = reduce_moments
        return super().__call__(source, reduce_moments, *args, **kwargs)

    @staticmethod
    def settings(cfg: Config):
        """The algo section this step reads: algo.team."""
        return cfg.algo.team

    def _td_errors(self, data: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.reward_moments is not None:
            data = {**data, "rewards": self.reward_moments.standardized(data["rewards"].float(), data["filled"],
                                                                        self.reduce_moments)}
        td, q_tot = team_td_errors(self.model, self.target, data, self.cfg.algo.gamma, self.d.double)
        return td, q_tot[data["filled"].bool()]

    def _loss(self, data: dict[str, torch.Tensor], td: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The importance-weighted mean squared TD error over the filled steps (PyMARL's masked loss)."""
        return (weights[:, None] * td ** 2).sum() / data["filled"].sum().clamp(min=1)

    def _priorities(self, data: dict[str, torch.Tensor], abs_td: np.ndarray) -> np.ndarray:
        """Each episode's mean |TD error| over its filled steps."""
        steps = data["filled"].sum(1).clamp(min=1).cpu().numpy()
        return (abs_td.sum(1) / steps).astype(np.float32)

    def state(self) -> dict:
        """DQN's (the target network, the step count) and the rewards' running moments."""
        state = super().state()
        if self.reward_moments is not None:
            state["reward_moments"] = self.reward_moments.state()["reward_return_moments"]
        return state

    def restore(self, state: dict) -> None:
        super().restore(state)
        if state and self.reward_moments is not None and "reward_moments" in state:
            self.reward_moments.restore({"reward_return_moments": state["reward_moments"]})
