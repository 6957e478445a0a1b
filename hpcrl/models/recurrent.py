"""Recurrent policies (model.core: lstm or gru): encoder -> core -> heads. The core and its steps
(`RecurrentCore`) serve the actor-critic here and the Q-network of R2D2-style DQN (models/q.py).

The hidden state crosses every boundary as plain float32 numbers, [rows, state_size] (GRU: h; LSTM:
h and c side by side): policy servers keep one per env row, replies carry the state each action
was taken from, fragments the state each sequence starts from (core/messages.py), so actors never
import torch. A row whose episode starts gets a zero state: holders zero it before acting, and a
sequence replayed by the trainer is zeroed after every step whose `dones` is set.
"""
from __future__ import annotations

import torch
from torch import nn

from hpcrl.core.dataflow import state_size
from hpcrl.core.network_shapes import critic_input, input_width
from hpcrl.core.observations import leaves
from hpcrl.models.layers import ACTIVATIONS, _linear, _masked_log_softmax, _mlp
from hpcrl.models.networks import ActorCritic


class RecurrentCore:
    """An LSTM or GRU cell of model.core_size after a network's trunk, and the steps through it that
    actor-critics and Q-networks (models/q.py) share. Mixed into an ObservationInput."""

    recurrent = True

    def _build_core(self, width: int, cfg) -> int:
        """The cell, reading `width` features; returns its output width."""
        self.lstm = cfg.core == "lstm"
        self.core = (nn.LSTMCell if self.lstm else nn.GRUCell)(width, cfg.core_size)
        for name, weight in self.core.named_parameters():  # orthogonal weights, zero biases (CleanRL's LSTM PPO)
            nn.init.orthogonal_(weight, 1.0) if name.startswith("weight") else nn.init.zeros_(weight)
        self.state_size = state_size(cfg)
        return cfg.core_size

    def _step(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoded rows and their states -> the cell's output and the new states."""
        if self.lstm:
            h, c = state.chunk(2, dim=-1)
            h, c = self.core(x, (h.contiguous(), c.contiguous()))
            return h, torch.cat([h, c], dim=-1)
        h = self.core(x, state)
        return h, h

    def _state_or_zeros(self, state: torch.Tensor | None, obs: torch.Tensor) -> torch.Tensor:
        if state is not None:
            return state
        first = leaves(obs)[0]
        return torch.zeros(first.shape[0], self.state_size, device=first.device)

    def _unroll(self, x: torch.Tensor, state: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoded rows [T*B, F] in time-major order (row t*B + b is step t of column b) from each
        column's state [B, S], zeroing a column's state before every step whose `starts` [T*B] is
        set. Returns the cell's outputs [T*B, H] and the states after the last step [B, S]."""
        B = state.shape[0]
        x = x.reshape(-1, B, x.shape[-1])
        keep = (1.0 - starts.float()).reshape(-1, B, 1)
        outs = []
        for t in range(x.shape[0]):  # truncated BPTT over the sequence
            h, state = self._step(x[t], state * keep[t])
            outs.append(h)
        return torch.cat(outs), state


class RecurrentActorCritic(RecurrentCore, ActorCritic):
    """One trunk (the MLP of model.hidden_sizes, or the Nature CNN), an LSTM or GRU cell of
    model.core_size, and linear policy and value heads on the cell's output. Acting takes one step
    of the cell per call (`sample`, `value`, `mode` with the rows' states); training unrolls a
    fragment's [T, B] rows from each column's start state (`evaluate_sequence`).

    Recurrent MAPPO (`central_critic`, rows in whole envs of A agents): the trunk and the cell read
    the agent's own observation; the critic is an MLP over the env's state and the agent's one-hot
    when the rows end with the env's state (env.global_state), or else over every agent's cell
    output of the env and the one-hot, so it sees what each agent remembers."""

    def _build(self, spaces, cfg, out: int) -> None:
        self.trunk, width = self.feature_trunk(spaces, cfg, input_width(spaces) - self.state_dim)
        width = self._build_core(width, cfg)
        self.actor = _linear(width, out, 0.01)
        if not self.central_critic:
            self.critic = _linear(width, 1, 1.0)
            return
        self.critic = _mlp([critic_input(spaces, True, width), *cfg.hidden_sizes, 1], ACTIVATIONS[cfg.activation], 1.0)

    def _encoded(self, obs) -> tuple[torch.Tensor, torch.Tensor]:
        """The trunk's inputs (rows that may end with the env's state) and its encoding of the agent's own part."""
        x = self.inputs(obs)
        return x, self.trunk(self._own(x))

    def _outputs(self, x: torch.Tensor, h: torch.Tensor,
                 mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The heads: log-probs (or the Gaussian mean) on the cell's output `h`, and the critic's raw output."""
        out = self.actor(h)
        return (out if self.continuous else _masked_log_softmax(out, mask)), self._critic_raw(x, h)

    def _critic_raw(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        if not self.central_critic:
            return self.critic(h).squeeze(-1)
        return self.critic(self.critic_input(x if self.state_dim else h)).squeeze(-1)

    def sample(self, obs: torch.Tensor, generator: torch.Generator | None = None, mask: torch.Tensor | None = None,
               state: torch.Tensor | None = None, uniforms: torch.Tensor | None = None):
        """Actions, their log-probs, state values and the rows' next states, from `state` (zeros: None);
        `uniforms`: the rows' own random numbers, as ActorCritic.sample takes them."""
        x, f = self._encoded(obs)
        h, state = self._step(f, self._state_or_zeros(state, obs))
        out, raw = self._outputs(x, h, mask)
        return (*self._draw(out, self.returns_of(raw), generator, uniforms), state)

    def value(self, obs: torch.Tensor, state: torch.Tensor | None = None) -> torch.Tensor:
        x, f = self._encoded(obs)
        h, _ = self._step(f, self._state_or_zeros(state, obs))
        return self.returns_of(self._critic_raw(x, h))

    def mode(self, obs: torch.Tensor, mask: torch.Tensor | None = None, state: torch.Tensor | None = None):
        """The most likely actions and the rows' next states."""
        h, state = self._step(self._encoded(obs)[1], self._state_or_zeros(state, obs))
        return self._best(self.actor(h), mask), state

    # --- a fragment as sequences --------------------------------------------------------------------
    def evaluate_sequence(self, obs: torch.Tensor, actions: torch.Tensor, mask: torch.Tensor | None,
                          state0: torch.Tensor, starts: torch.Tensor):
        """Rows [T*B] in time-major order (row t*B + b is step t of column b), each column's state
        before step 0 [B, S], and `starts` [T*B] (1 where the state is zeroed before the step:
        an episode began). Returns log-probs of `actions`, entropy, the critic's raw output, all
        [T*B], and the states after the last step [B, S] (for a bootstrap value)."""
        x, f = self._encoded(obs)  # rows of any observation kind
        h, state = self._unroll(f, state0, starts)
        out, raw = self._outputs(x, h, mask)
        return (*self._scored(out, raw, actions), state)

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor, mask: torch.Tensor | None = None,
                 state0: torch.Tensor | None = None, starts: torch.Tensor | None = None):
        """What the PPO loss needs, over whole sequences (see `evaluate_sequence`)."""
        if state0 is None:
            raise ValueError("a recurrent policy evaluates whole sequences: pass state0 and starts")
        return self.evaluate_sequence(obs, actions, mask, state0, starts)[:3]

    def log_probs(self, obs, mask=None):
        raise TypeError("a recurrent policy's log-probabilities depend on its state: use evaluate_sequence")
