"""SAC's and TD3's networks and their runner: an actor whose actions are squashed into [-1, 1] by
tanh, and two Q critics over (observation, action). SAC's actor is a Gaussian whose log-std is a
head of its own (clamped as CleanRL's, to [-5, 2]), and its log entropy coefficient is a
parameter of the network; TD3's actor is deterministic. The target networks are the trainer
step's (algos/sac.py), never the holders'.

Actions live in [-1, 1] everywhere but the env: the replies carry them so, the replay stores them
so, and the critics read them so; the env ranks rescale them to the env's bounds as they step
(workers/action_writer.py), and so does a player (`hpcrl eval`), which steps the env itself.
Layers keep torch's default initialisation, as CleanRL's and SB3's SAC and TD3 do.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from hpcrl.core.config import ModelConfig
from hpcrl.core.dataflow import algorithm_of
from hpcrl.core.network_shapes import check_continuous, input_width, policy_outputs
from hpcrl.core.observations import count_rows
from hpcrl.models.layers import ACTIVATIONS
from hpcrl.models.networks import ObservationInput
from hpcrl.models.runner import Runner

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
SQUASH_EPS = 1e-6  # in log(1 - tanh(u)^2 + eps): the log-prob's correction for the squashing


def plain_mlp(sizes: list[int], activation: type) -> nn.Sequential:
    """Linear layers of torch's default initialisation, the activation between them."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)


class ContinuousActorCritics(ObservationInput):
    """The actor and the twin critics. `stochastic`: SAC's Gaussian actor (else TD3's)."""

    def __init__(self, spaces, cfg: ModelConfig, stochastic: bool, algo_name: str, env_id: str = "the env",
                 alpha_init: float = 1.0):
        super().__init__(spaces, cfg)
        check_continuous(spaces, cfg, algo_name, env_id)
        self.stochastic = stochastic
        self.action_shape = tuple(spaces.action_shape)
        self.action_dim = policy_outputs(spaces)
        self.draw_width = self.action_dim  # a sampled row's random numbers: one normal per dimension
        self.low = torch.as_tensor(np.array(spaces.action_low, dtype=np.float32).reshape(self.action_shape))
        self.high = torch.as_tensor(np.array(spaces.action_high, dtype=np.float32).reshape(self.action_shape))
        width, hidden = input_width(spaces), list(cfg.hidden_sizes)
        act = ACTIVATIONS[cfg.activation]
        self.actor = nn.Sequential(nn.Flatten(), plain_mlp([width, *hidden], act), act())
        self.mean = nn.Linear(hidden[-1], self.action_dim)
        self.log_std = nn.Linear(hidden[-1], self.action_dim) if stochastic else None
        self.q1 = plain_mlp([width + self.action_dim, *hidden, 1], act)
        self.q2 = plain_mlp([width + self.action_dim, *hidden, 1], act)
        # SAC's entropy coefficient, learned in log space (used only with algo.sac.alpha: null)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(alpha_init))) if stochastic else None

    def critic_parameters(self) -> list[nn.Parameter]:
        return [*self.q1.parameters(), *self.q2.parameters()]

    def actor_parameters(self) -> list[nn.Parameter]:
        heads = [self.mean] + ([self.log_std] if self.log_std is not None else [])
        return [*self.actor.parameters(), *(p for h in heads for p in h.parameters())]

    def _hidden(self, obs) -> torch.Tensor:
        return self.actor(self.inputs(obs))

    def mode(self, obs) -> torch.Tensor:
        """The most likely action in [-1, 1]: tanh of the mean (TD3: the policy's action)."""
        return torch.tanh(self.mean(self._hidden(obs))).reshape(-1, *self.action_shape)

    def sample(self, obs, generator: torch.Generator | None = None, noise: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """SAC: actions in [-1, 1] drawn from the squashed Gaussian, [B, *action_shape], and their
        log-probabilities [B] (with the tanh correction). `noise`: the standard normal draws to use
        (tests); else drawn from `generator`."""
        h = self._hidden(obs)
        mean = self.mean(h)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(self.log_std(h)) + 1.0)
        if noise is None:
            noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        u = mean + log_std.exp() * noise.reshape(mean.shape)
        a = torch.tanh(u)
        logp = (-0.5 * noise.reshape(mean.shape) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        logp = logp - torch.log(1.0 - a * a + SQUASH_EPS).sum(-1)
        return a.reshape(-1, *self.action_shape), logp

    def q_values(self, obs, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both critics' Q(s, a) [B] of actions in [-1, 1]."""
        x = torch.cat([self.inputs(obs).flatten(1), actions.reshape(-1, self.action_dim).to(torch.float32)], -1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)

    def to_env(self, actions: torch.Tensor) -> torch.Tensor:
        """Actions in [-1, 1] rescaled to the env's bounds (a player's, which steps the env itself)."""
        low, high = self.low.to(actions.device), self.high.to(actions.device)
        return low + 0.5 * (actions + 1.0) * (high - low)


def build_continuous(spaces, cfg) -> ContinuousActorCritics:
    """SAC's or TD3's network for cfg (the whole Config)."""
    s = cfg.algo.sac
    return ContinuousActorCritics(spaces, cfg.model, stochastic=not algorithm_of(cfg).action_noise,
                                  algo_name=cfg.algo.name, env_id=cfg.env.id,
                                  alpha_init=s.alpha_init if s.alpha is None else max(s.alpha, 1e-8))


class ContinuousRunner(Runner):
    """A policy holder's SAC or TD3 forward: the policy's actions in [-1, 1] (SAC's sampled, TD3's
    deterministic: its actors add the exploration noise). A player (`play`, hpcrl eval) answers
    with actions in the env's bounds: "greedy" the mean's, "sample" as a holder draws them."""

    outputs = ("actions",)

    @torch.inference_mode()
    def act(self, obs: np.ndarray, out: dict[str, np.ndarray], mask: np.ndarray | None = None,
            state: np.ndarray | None = None, keys: tuple | None = None) -> None:
        """`keys`: each row's (global index, action step), which key SAC's draws (else the generator)."""
        x = self._tensor(obs)
        if self.play == "greedy" or not self.model.stochastic:
            a = self.model.mode(x)
        else:
            uniforms = self._uniforms(keys)
            noise = None if uniforms is None else torch.special.ndtri(uniforms).to(torch.float32)  # models are float32
            a, _ = self.model.sample(x, self.generator, noise)
        if self.play is not None:
            a = self.model.to_env(a)
        out["actions"][...] = a.cpu().numpy()

    @torch.inference_mode()
    def value(self, obs: np.ndarray, out: np.ndarray, state: np.ndarray | None = None) -> None:
        """The first critic's value of the policy's most likely action (no request asks for it:
        transitions bootstrap on the learner)."""
        if count_rows(obs):
            x = self._tensor(obs)
            out[...] = self.model.q_values(x, self.model.mode(x))[0].cpu().numpy()
