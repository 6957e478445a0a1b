"""VDN's and QMIX's trainer step: one-step TD on the team's Q-value, over stored episodes of the
whole team (PyMARL's learner, Rashid et al. 2018), on DQN's update loop (algos/dqn.py: samples
from the replay shard, gradient steps, the target network copied every target_update_interval
steps, priorities written back, Horovod averaging).

For step t of a stored episode (core/messages.py team_spec):
    y_t = r_t + gamma (1 - terminated_t) Q_tot^target(o_t+1, argmax of each agent's online Q at o_t+1)
with each agent's choice made by the online network under double Q (algo.team.double), else by
the target network; Q_tot is the mixer's (models/team.py) of the agents' Q-values of the actions
they took. The step after an episode's last is its final observation (a time limit bootstraps from
it, a termination does not); the step after a chunk's last is the next chunk's first. Padding
steps (past the episode's end) are masked out of the loss, which is the mean squared TD error over
the filled steps, each episode's steps weighted by its importance weight; an episode's new
priority is the mean |TD error| of its filled steps.
"""
from __future__ import annotations

import numpy as np
import torch

from hpcrl.algos.dqn import DQNStep
from hpcrl.core.config import Config


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


class TeamStep(DQNStep):
    """One update of VDN or QMIX: algo.team.gradient_steps gradient steps, each on its own sample of
    episodes (the model is models/team.py's TeamQNetwork: agents and mixer, one module)."""

    progress = "loss {loss:.3f} td {td_error:.3f} q_tot {q_mean:.2f} | replay {replay_size:,.0f} eps {eps_min:.3f}"

    @staticmethod
    def settings(cfg: Config):
        """The algo section this step reads: algo.team."""
        return cfg.algo.team

    def _td_errors(self, data: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        td, q_tot = team_td_errors(self.model, self.target, data, self.cfg.algo.gamma, self.d.double)
        return td, q_tot[data["filled"].bool()]

    def _loss(self, data: dict[str, torch.Tensor], td: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The importance-weighted mean squared TD error over the filled steps (PyMARL's masked loss)."""
        return (weights[:, None] * td ** 2).sum() / data["filled"].sum().clamp(min=1)

    def _priorities(self, data: dict[str, torch.Tensor], abs_td: np.ndarray) -> np.ndarray:
        """Each episode's mean |TD error| over its filled steps."""
        steps = data["filled"].sum(1).clamp(min=1).cpu().numpy()
        return (abs_td.sum(1) / steps).astype(np.float32)
