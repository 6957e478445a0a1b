"""VDN's and QMIX's networks: every agent's Q-network and the mixer that makes the team's Q-value
of its agents' (Sunehag et al. 2018; Rashid et al. 2018), one module, so the weights message, the
checkpoint and the target network carry both.

The agents act on rows (envs/multiagent.py: env-major, an env's A agents side by side), so any
batch of whole envs tells each row's agent by its place: a shared network reads the agent's
one-hot index after its observation (algo.team.agent_id), or each agent has a network of its own
(algo.team.shared: false). An agent's network is PyMARL's: a layer of model.hidden_sizes, then a
GRU or LSTM cell (model.core) or the rest of the layers, then the Q head; it reads only the
agent's own observation, never the env's state that may end its row (env.global_state).

The mixer reads what the agents chose: VDN sums their Q-values; QMIX mixes them through one hidden
layer whose weights hypernetworks make from the env's state, non-negative (their absolute value),
so the team's Q never falls as an agent's rises and each agent's greedy action is the team's. Its
state is the env's (env.global_state), or else every agent's observation side by side (EPyMARL's
state for envs that have none).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from hpcrl.core.dataflow import algorithm_of, state_size
from hpcrl.core.network_shapes import check_team, input_width, mixer_state_width
from hpcrl.models.layers import ACTIVATIONS, _linear, _mlp
from hpcrl.models.networks import ObservationInput
from hpcrl.models.recurrent import RecurrentCore


class AgentQ(nn.Module):
    """One agent's Q-network (or every agent's, shared): an MLP of model.hidden_sizes, the Q head."""

    recurrent = False

    def __init__(self, width: int, cfg, num_actions: int):
        super().__init__()
        act, hidden = ACTIVATIONS[cfg.activation], list(cfg.hidden_sizes)
        layers = hidden if cfg.core == "none" else hidden[:1]  # a recurrent agent: one layer, then its cell
        self.trunk = nn.Sequential(_mlp([width, *layers], act, out_gain=math.sqrt(2)), act())
        self.head = _linear(self._build_core(layers[-1], cfg), num_actions, 1.0)

    def _build_core(self, width: int, cfg) -> int:
        return width

    def step(self, x: torch.Tensor, state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Q-values [B, actions] of inputs [B, F], and the next states (none: feed-forward)."""
        return self.head(self.trunk(x)), state


class RecurrentAgentQ(RecurrentCore, AgentQ):
    """PyMARL's recurrent agent: one layer, a GRU (or LSTM) cell of model.core_size, the Q head."""

    def step(self, x: torch.Tensor, state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        h, state = self._step(self.trunk(x), state)
        return self.head(h), state


class SumMixer(nn.Module):
    """VDN: the team's Q-value is the sum of its agents'."""

    def forward(self, q: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return q.sum(-1)


class QMixer(nn.Module):
    """QMIX's mixer: Q_tot = elu(q W1 + b1) w2 + V, with W1 [A, embed] and w2 [embed] the absolute
    values of hypernetworks of the state (one hidden layer of `hidden` each), b1 a linear map of it and
    V a small MLP of it (PyMARL's qmix.py with hypernet_layers 2)."""

    def __init__(self, agents: int, state_width: int, embed: int, hidden: int):
        super().__init__()
        self.agents, self.embed = agents, embed
        self.w1 = nn.Sequential(nn.Linear(state_width, hidden), nn.ReLU(), nn.Linear(hidden, agents * embed))
        self.b1 = nn.Linear(state_width, embed)
        self.w2 = nn.Sequential(nn.Linear(state_width, hidden), nn.ReLU(), nn.Linear(hidden, embed))
        self.v = nn.Sequential(nn.Linear(state_width, embed), nn.ReLU(), nn.Linear(embed, 1))

    def forward(self, q: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """The team's Q [...] from its agents' [..., A] and the state [..., width]."""
        lead = q.shape[:-1]
        q, s = q.reshape(-1, 1, self.agents), state.reshape(-1, state.shape[-1])
        hidden = F.elu(torch.bmm(q, self.w1(s).abs().view(-1, self.agents, self.embed))
                       + self.b1(s).view(-1, 1, self.embed))
        return (torch.bmm(hidden, self.w2(s).abs().view(-1, self.embed, 1)) + self.v(s).view(-1, 1, 1)).view(lead)


class TeamQNetwork(ObservationInput):
    """Every agent's Q-network and the team's mixer (see the module's docstring). Acting: rows of
    whole envs (`q_values`, or `q_step` with the rows' states). Training: episodes of whole teams
    (`q_episodes`, `mix`)."""

    def __init__(self, spaces, cfg):
        super().__init__(spaces, cfg.model)
        check_team(spaces, cfg)
        t, model = cfg.algo.team, cfg.model
        self.num_agents, self.num_actions = spaces.num_agents, spaces.num_actions
        self.own = input_width(spaces) - spaces.state_dim  # the agent's own observation, before any state
        self.state_dim = spaces.state_dim
        self.agent_id = t.shared and t.agent_id
        self.recurrent = model.core != "none"
        self.state_size = state_size(model)
        width = self.own + (self.num_agents if self.agent_id else 0)
        cls = RecurrentAgentQ if self.recurrent else AgentQ
        self.agents = nn.ModuleList(cls(width, model, self.num_actions)
                                    for _ in range(1 if t.shared else self.num_agents))
        self.mixer = (QMixer(self.num_agents, mixer_state_width(spaces), t.mixing_embed, t.hypernet_hidden)
                      if algorithm_of(cfg).mixer == "qmix" else SumMixer())

    def _agent_inputs(self, obs) -> torch.Tensor:
        """Rows [N, W] of whole envs -> what the agents read [N, F]: their own observation, and with
        agent_id their one-hot index."""
        x = self.inputs(obs).reshape(-1, self.own + self.state_dim)[:, :self.own]
        if not self.agent_id:
            return x
        a = self.num_agents
        if x.shape[0] % a:
            raise ValueError(f"the agents' networks need whole envs: {x.shape[0]} rows for {a} agents per env")
        return torch.cat([x, torch.eye(a, dtype=x.dtype, device=x.device).repeat(x.shape[0] // a, 1)], dim=-1)

    def _agents_step(self, x: torch.Tensor, state: torch.Tensor | None):
        """Every row's Q-values [N, actions] and next state: the shared network on all rows, or agent
        i's own on rows i, i + A, ..."""
        if len(self.agents) == 1:
            return self.agents[0].step(x, state)
        a = self.num_agents
        x = x.reshape(-1, a, x.shape[-1])
        states = None if state is None else state.reshape(-1, a, state.shape[-1])
        outs = [net.step(x[:, i], None if states is None else states[:, i]) for i, net in enumerate(self.agents)]
        q = torch.stack([o[0] for o in outs], dim=1).reshape(-1, self.num_actions)
        return q, (None if state is None else torch.stack([o[1] for o in outs], dim=1).reshape(state.shape))

    def q_values(self, obs) -> torch.Tensor:
        """Feed-forward agents: every row's Q-values [N, actions]."""
        if self.recurrent:
            raise TypeError("a recurrent agent's values depend on its state: use q_step or q_episodes")
        return self._agents_step(self._agent_inputs(obs), None)[0]

    def q_step(self, obs, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Recurrent agents: every row's Q-values [N, actions] from the rows' states (zeros: None)."""
        x = self._agent_inputs(obs)
        if state is None:
            state = torch.zeros(x.shape[0], self.state_size, device=x.device)
        return self._agents_step(x, state)

    def q_episodes(self, obs: torch.Tensor, state0: torch.Tensor | None) -> torch.Tensor:
        """Every agent's Q-values [B, L + 1, A, actions] over B stored episodes, observations
        [B, L + 1, A, W], recurrent agents unrolled from their stored states [B, A * S] (an episode
        never begins inside one: it is stored whole, or in chunks that each carry their state)."""
        B, steps, a = obs.shape[:3]
        if not self.recurrent:
            return self.q_values(obs.reshape(B * steps * a, -1)).reshape(B, steps, a, -1)
        state, outs = state0.reshape(B * a, self.state_size), []
        for t in range(steps):
            q, state = self.q_step(obs[:, t].reshape(B * a, -1), state)
            outs.append(q.reshape(B, a, -1))
        return torch.stack(outs, dim=1)

    def mixer_state(self, obs: torch.Tensor) -> torch.Tensor:
        """What the mixer reads [..., width] of the team's observations [..., A, W]: the env's state
        that ends each row (env.global_state), or every agent's own observation side by side."""
        x = self.inputs(obs)
        if self.state_dim:
            return x[..., 0, self.own:]
        return x[..., :self.own].flatten(-2)

    def mix(self, q: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """The team's Q-values [...] of its agents' chosen ones [..., A], by the team's observations [..., A, W]."""
        return self.mixer(q, self.mixer_state(obs))
