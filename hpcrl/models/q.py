"""DQN's networks and their runner: Q-values over Discrete actions, from the same encoders as the
actor-critic (an MLP over flat or Dict observations, or the Nature CNN over frame stacks), with an
optional dueling head, Q(s, a) = V(s) + A(s, a) - mean_a A(s, a) (Wang et al. 2016); with
model.core, a recurrent core before the head (R2D2)."""
from __future__ import annotations

import numpy as np
import torch

from hpcrl.core.config import ModelConfig
from hpcrl.core.network_shapes import check_q
from hpcrl.core.observations import count_rows
from hpcrl.core.observations import take
from hpcrl.models.layers import _linear
from hpcrl.models.networks import ObservationInput
from hpcrl.models.runner import Runner
from hpcrl.models.recurrent import RecurrentCore


class QNetwork(ObservationInput):
    def __init__(self, spaces, cfg: ModelConfig, dueling: bool = True, env_id: str = "the env"):
        super().__init__(spaces, cfg)
        check_q(spaces, env_id)
        self.num_actions = spaces.num_actions
        self.trunk, width = self.feature_trunk(spaces, cfg)
        width = self._build_core(width, cfg)
        self.dueling = dueling
        self.advantage = _linear(width, self.num_actions, 1.0)
        self.value = _linear(width, 1, 1.0) if dueling else None

    def _build_core(self, width: int, cfg: ModelConfig) -> int:
        return width  # feed-forward: the heads read the trunk (RecurrentQNetwork puts its core here)

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        a = self.advantage(x)
        if self.value is None:
            return a
        return self.value(x) + a - a.mean(-1, keepdim=True)

    def q_values(self, obs: torch.Tensor) -> torch.Tensor:
        """[B, num_actions]."""
        return self._head(self.features(obs))


class RecurrentQNetwork(RecurrentCore, QNetwork):
    """R2D2's network (model.core with algo.name dqn): the trunk, an LSTM or GRU cell, the (dueling)
    head. Acting takes one step of the cell per call with the rows' states (`q_step`); training
    unrolls stored sequences from their stored states, the first `burn_in` steps without gradients
    (`q_sequence`)."""

    def q_step(self, obs: torch.Tensor, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Q-values [B, num_actions] of one step from the rows' states (zeros: None), and the next states."""
        h, state = self._step(self.features(obs), self._state_or_zeros(state, obs))
        return self._head(h), state

    def q_sequence(self, obs, state0: torch.Tensor, starts: torch.Tensor, burn_in: int) -> torch.Tensor:
        """Q-values [T - burn_in, B, num_actions] of steps burn_in..T-1 of B sequences: rows [T*B]
        in time-major order, each sequence's stored state before step 0 [B, S], `starts` [T*B] (an
        episode begins: the state is zeroed first). Burn-in steps only warm the state up: no
        gradient flows through them (R2D2's burn-in against its stored state's staleness)."""
        B = state0.shape[0]
        cut = burn_in * B
        state = state0
        if burn_in:
            with torch.no_grad():
                _, state = self._unroll(self.features(take(obs, slice(0, cut))), state0, starts[:cut])
        h, _ = self._unroll(self.features(take(obs, slice(cut, None))), state, starts[cut:])
        return self._head(h).reshape(-1, B, self.num_actions)

    def q_values(self, obs: torch.Tensor) -> torch.Tensor:
        raise TypeError("a recurrent Q-network's values depend on its state: use q_step or q_sequence")


def build_q_network(spaces, cfg) -> QNetwork:
    """DQN's network for cfg (the whole Config): recurrent with model.core (R2D2)."""
    cls = QNetwork if cfg.model.core == "none" else RecurrentQNetwork
    return cls(spaces, cfg.model, dueling=cfg.algo.dqn.dueling, env_id=cfg.env.id)


class QRunner(Runner):
    """A policy holder's DQN forward: every action's Q-value, for the actors to choose from."""

    outputs = ("q",)

    def _q(self, obs, state: np.ndarray | None, advance: bool) -> torch.Tensor:
        if not self.model.recurrent:
            return self.model.q_values(self._tensor(obs))
        q, new = self.model.q_step(self._tensor(obs), None if state is None else self._tensor(state))
        if advance and state is not None:
            state[...] = new.cpu().numpy()
        return q

    @torch.inference_mode()
    def act(self, obs: np.ndarray, out: dict[str, np.ndarray], mask: np.ndarray | None = None,
            state: np.ndarray | None = None, keys: tuple | None = None) -> None:
        """`mask`: DQN trains no env that gives action masks (its actors choose from every Q-value).
        `keys`: unused (the Q-values are the reply; the actors draw their own exploration).
        `state` (a recurrent Q-network): the rows' hidden states, [rows, state_size], advanced in place.
        A player (`play`, hpcrl eval) takes the greedy actions, sampled or not: exploration is the
        actors'."""
        q = self._q(obs, state, advance=True)
        if self.play is None:
            out["q"][...] = q.cpu().numpy()
        else:
            out["actions"][...] = q.argmax(-1).cpu().numpy()

    @torch.inference_mode()
    def value(self, obs: np.ndarray, out: np.ndarray, state: np.ndarray | None = None) -> None:
        """max_a Q(s, a) (the value of final observations, for requests that carry some); `state`
        (a recurrent Q-network): the rows' hidden states, left as they are."""
        if count_rows(obs):
            out[...] = self._q(obs, state, advance=False).max(-1).values.cpu().numpy()
