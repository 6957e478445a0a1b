"""DQN's network and its runner: Q-values over Discrete actions, from the same encoders as the
actor-critic (an MLP over flat observations, or the Nature CNN over frame stacks), with an
optional dueling head, Q(s, a) = V(s) + A(s, a) - mean_a A(s, a) (Wang et al. 2016)."""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from hpcrl.core.config import ConfigError, ModelConfig
from hpcrl.models import (ACTIVATIONS, NATURE_CNN_FEATURES, ObservationInput, Runner, _linear, _mlp, _nature_cnn,
                          encoder_for)


class QNetwork(ObservationInput):
    def __init__(self, spaces, cfg: ModelConfig, dueling: bool = True, env_id: str = "the env"):
        super().__init__(spaces, cfg)
        if spaces.continuous:
            raise ConfigError(f"algo.name: dqn needs a Discrete action space, and {env_id} has Box actions of "
                              f"shape {tuple(spaces.action_shape)}; use algo.name: ppo for continuous control")
        if spaces.multiagent:
            raise ConfigError(f"algo.name: dqn trains single-agent envs, and {env_id} is a PettingZoo env with "
                              f"{spaces.num_agents} agents; use algo.name: mappo or ippo")
        self.num_actions = spaces.num_actions
        if encoder_for(spaces, cfg) == "cnn":
            self.trunk, width = _nature_cnn(tuple(spaces.obs_shape)), NATURE_CNN_FEATURES
        else:
            sizes = [int(np.prod(spaces.obs_shape)), *cfg.hidden_sizes]
            # every hidden layer ends in the activation: the heads below are the outputs
            self.trunk = nn.Sequential(nn.Flatten(), _mlp(sizes, ACTIVATIONS[cfg.activation], math.sqrt(2)),
                                       ACTIVATIONS[cfg.activation]())
            width = sizes[-1]
        self.dueling = dueling
        self.advantage = _linear(width, self.num_actions, 1.0)
        self.value = _linear(width, 1, 1.0) if dueling else None

    def q_values(self, obs: torch.Tensor) -> torch.Tensor:
        """[B, num_actions]."""
        x = self.features(obs)
        a = self.advantage(x)
        if self.value is None:
            return a
        return self.value(x) + a - a.mean(-1, keepdim=True)

    def mode(self, obs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The greedy action (hpcrl eval --deterministic, and what the actors exploit). `mask`:
        always None, as DQN trains no env that gives action masks (the actor-critic's signature)."""
        return self.q_values(obs).argmax(-1)

    def sample(self, obs: torch.Tensor, generator: torch.Generator | None = None, mask: torch.Tensor | None = None):
        """hpcrl eval without --deterministic: a Q-network's policy is greedy (exploration is the
        actors'), so the sample is the greedy action."""
        return (self.mode(obs),)


class QRunner(Runner):
    """A policy holder's DQN forward: every action's Q-value, for the actors to choose from."""

    outputs = ("q",)

    @torch.inference_mode()
    def act(self, obs: np.ndarray, out: dict[str, np.ndarray], mask: np.ndarray | None = None) -> None:
        """`mask`: DQN trains no env that gives action masks (its actors choose from every Q-value)."""
        out["q"][...] = self.model.q_values(self._tensor(obs)).cpu().numpy()

    @torch.inference_mode()
    def value(self, obs: np.ndarray, out: np.ndarray) -> None:
        """max_a Q(s, a) (the value of final observations, for requests that carry some)."""
        if len(obs):
            out[...] = self.model.q_values(self._tensor(obs)).max(-1).values.cpu().numpy()
