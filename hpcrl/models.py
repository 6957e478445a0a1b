"""Actor-critic networks and the policy runner shared by inference ranks and inline inference."""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from hpcrl.config import ModelConfig

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


def _mlp(sizes: list[int], activation: type, out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        linear = nn.Linear(a, b)
        last = i == len(sizes) - 2
        # Orthogonal init with small policy-head gain: the standard PPO recipe (Andrychowicz et al. 2021).
        nn.init.orthogonal_(linear.weight, out_gain if last else math.sqrt(2))
        nn.init.zeros_(linear.bias)
        layers.append(linear)
        if not last:
            layers.append(activation())
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Separate MLPs for a categorical policy and a state-value function over flat observations."""

    def __init__(self, obs_dim: int, num_actions: int, cfg: ModelConfig):
        super().__init__()
        act = ACTIVATIONS[cfg.activation]
        hidden = list(cfg.hidden_sizes)
        self.actor = _mlp([obs_dim, *hidden, num_actions], act, out_gain=0.01)
        self.critic = _mlp([obs_dim, *hidden, 1], act, out_gain=1.0)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs.flatten(1)).squeeze(-1)

    def log_probs(self, obs: torch.Tensor) -> torch.Tensor:
        """Log-probabilities of every action, [B, num_actions]. Written out rather than through
        torch.distributions.Categorical, whose argument checks double the cost of small batches."""
        return F.log_softmax(self.actor(obs.flatten(1)), dim=-1)

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor):
        """log-prob of `actions`, entropy and value: what the PPO loss needs."""
        log_p = self.log_probs(obs)
        entropy = -(log_p.exp() * log_p).sum(-1)
        return log_p.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1), entropy, self.value(obs)

    def mode(self, obs: torch.Tensor) -> torch.Tensor:
        """The most likely actions (hpcrl eval --deterministic)."""
        return self.log_probs(obs).argmax(-1)

    def sample(self, obs: torch.Tensor, generator: torch.Generator | None = None):
        """Sampled actions, their log-probs, and state values."""
        log_p = self.log_probs(obs)
        actions = torch.multinomial(log_p.exp(), 1, generator=generator)
        return actions.squeeze(-1), log_p.gather(-1, actions).squeeze(-1), self.value(obs)


def build_model(obs_shape: tuple, num_actions: int, cfg: ModelConfig) -> ActorCritic:
    return ActorCritic(int(np.prod(obs_shape)), num_actions, cfg)


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def copy_params_to(model: nn.Module, flat: np.ndarray) -> None:
    """Model parameters -> a preallocated float32 vector (the weights message)."""
    offset = 0
    for p in model.parameters():
        n = p.numel()
        flat[offset:offset + n] = p.detach().reshape(-1).cpu().numpy()
        offset += n


def load_params_from(model: nn.Module, flat: np.ndarray) -> None:
    """A float32 vector (the weights message) -> model parameters, in place."""
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            n = p.numel()
            p.copy_(torch.from_numpy(flat[offset:offset + n]).view_as(p))
            offset += n


class PolicyRunner:
    """Runs the policy forward on numpy batches: sample actions, log-probs and values."""

    def __init__(self, model: ActorCritic, device: str, seed: int):
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.model.eval()
        self.version = -1
        # Its own stream: action sampling repeats per seed and can be saved and restored alone.
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)

    def load(self, flat: np.ndarray, version: int) -> None:
        load_params_from(self.model, flat)
        self.version = version

    @torch.no_grad()
    def act(self, obs: np.ndarray, actions: np.ndarray, logp: np.ndarray, values: np.ndarray) -> None:
        """Fill the output arrays (views into a reply or fragment buffer) for a batch of obs."""
        a, lp, v = self.model.sample(torch.as_tensor(obs, device=self.device, dtype=torch.float32), self.generator)
        actions[...] = a.cpu().numpy()
        logp[...] = lp.cpu().numpy()
        values[...] = v.cpu().numpy()

    @torch.no_grad()
    def value(self, obs: np.ndarray, out: np.ndarray) -> None:
        if len(obs):
            out[...] = self.model.value(torch.as_tensor(obs, device=self.device, dtype=torch.float32)).cpu().numpy()
