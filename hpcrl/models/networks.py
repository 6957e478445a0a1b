"""Actor-critic networks (models/runner.py runs them for policy holders and packs their weights).

Encoders: an MLP over flat observations (separate actor and critic nets) or the Nature CNN over
[C, H, W] frame stacks (one trunk shared by both heads). Heads: categorical for Discrete actions,
diagonal Gaussian with a state-independent log-std for Box actions. An optional running
observation normaliser lives inside the model as buffers, so checkpoints and the weights message
carry it. Pure torch: learners pass a `reduce` callable to synchronise the normaliser.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch
from torch import nn

from hpcrl.core.config import ModelConfig
from hpcrl.core.config_model import is_custom
from hpcrl.core.network_shapes import (NATURE_CNN_FEATURES, check_central_critic, critic_input, custom_input_shape,
                                       encoder_for, input_width, policy_outputs, spatial_map)
from hpcrl.models.custom import build_encoder
from hpcrl.models.layers import (ACTIVATIONS, HALF_LOG_2PI, LandingMap, RunningNorm, SpatialPolicy, _linear,
                                 _grid_cnn, _grid_convs, _masked_log_softmax, _mlp, _nature_cnn)

if TYPE_CHECKING:  # not at run time: inference ranks need no gymnasium
    from hpcrl.envs import EnvSpaces


class ObservationInput(nn.Module):
    """What every policy network does to its observations before its own layers: uint8 frames
    scaled to [0, 1] (they travel and are stored as bytes), the optional running normaliser, then
    the network's `trunk`. A recurrent policy (models/recurrent.py) also has a hidden state of
    `state_size` floats per row."""

    recurrent = False
    state_size = 0

    def __init__(self, spaces: EnvSpaces, cfg: ModelConfig):
        super().__init__()
        if spaces.obs_leaves is not None:  # a Dict or Tuple observation: each leaf its own way
            from hpcrl.models.structured import StructuredInput
            self.structured = StructuredInput(spaces.obs_leaves, cfg.obs_norm, encode=not is_custom(cfg.encoder))
            self.obs_scale, self.obs_norm = None, None
            return
        self.structured = None
        self.obs_scale = 1.0 / 255.0 if spaces.obs_dtype == "uint8" else None
        self.obs_norm = RunningNorm(tuple(spaces.obs_shape)) if cfg.obs_norm else None

    def feature_trunk(self, spaces: EnvSpaces, cfg: ModelConfig, width: int | None = None) -> tuple[nn.Module, int]:
        """One trunk for every head (Q-networks, recurrent cores) and its output width: the Nature
        CNN over frames, the user's own encoder (models/custom.py), or an MLP of model.hidden_sizes
        that ends in its activation, reading `width` numbers per row (default: the whole input row)."""
        kind, act, hidden = encoder_for(spaces, cfg), ACTIVATIONS[cfg.activation], list(cfg.hidden_sizes)
        if kind == "custom":
            return build_encoder(cfg, custom_input_shape(spaces))
        if kind == "cnn":
            return _nature_cnn(tuple(spaces.obs_shape)), NATURE_CNN_FEATURES
        if kind == "grid":
            return _grid_cnn(tuple(spaces.obs_shape), cfg.grid_convs, hidden, act), hidden[-1]
        width = input_width(spaces) if width is None else width
        return nn.Sequential(nn.Flatten(), _mlp([width, *hidden], act, out_gain=math.sqrt(2)), act()), hidden[-1]

    def _scaled(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float()
        return x * self.obs_scale if self.obs_scale is not None else x

    def inputs(self, obs) -> torch.Tensor:
        """What the trunk reads: scaled, normalised observations (Dict and Tuple observations, a
        dict of leaf tensors, each encoded its own way and concatenated)."""
        if self.structured is not None:  # (the user's own encoder reads the leaves themselves)
            return self.structured(obs) if self.structured.encodes else self.structured.leaves(obs)
        x = self._scaled(obs)
        return self.obs_norm(x) if self.obs_norm is not None else x

    def features(self, obs) -> torch.Tensor:
        """What the heads read: the trunk's encoding of the inputs."""
        return self.trunk(self.inputs(obs))

    def update_obs_norm(self, obs, reduce: Callable[[np.ndarray], np.ndarray] = lambda m: m) -> None:
        """Fold a batch into the observation normaliser (a no-op without model.obs_norm). `reduce`
        sums the moments over every learner's batch (an allreduce), so all learners merge the same
        numbers and hold identical stats."""
        if self.structured is not None:
            self.structured.update_norms(obs, reduce)
        elif self.obs_norm is not None:
            self.obs_norm.merge(reduce(self.obs_norm.moments(self._scaled(obs))))


class ActorCritic(ObservationInput):
    """An encoder, a policy head (categorical or diagonal Gaussian) and a state-value head.

    Multi-agent (PettingZoo envs, rows of A agents per env, hpcrl/envs/multiagent.py): with
    `central_critic` the critic of agent i reads every agent's observation of its env and a one-hot
    of i (MAPPO's agent-specific global state), so a batch must hold whole envs in row order, as
    requests and fragments do and as the PPO update's minibatches keep them. When the rows end with
    the env's own state (env.global_state, `spaces.state_dim`), the critic reads that state and the
    one-hot instead, and the policy only ever reads the agent's observation before it. With
    `value_norm` the critic learns normalised returns (algo.value_norm) and `value`/`sample` give
    return units."""

    def __init__(self, spaces: EnvSpaces, cfg: ModelConfig, central_critic: bool = False, value_norm: bool = False):
        super().__init__(spaces, cfg)
        self.continuous = spaces.continuous
        self.action_shape = tuple(spaces.action_shape)
        self.num_agents = spaces.num_agents
        self.central_critic = central_critic
        self.state_dim = spaces.state_dim
        self.value_norm = RunningNorm((), clip=None) if value_norm else None
        out = policy_outputs(spaces)
        self.draw_width = out  # random numbers a sampled row takes: one per action, or per action dimension
        if central_critic:
            check_central_critic(spaces, cfg)
        self._build(spaces, cfg, out)
        if self.continuous:  # state-independent log-std, init 0 (std 1), as CleanRL ppo_continuous_action
            self.log_std = nn.Parameter(torch.zeros(out))

    def _build(self, spaces: EnvSpaces, cfg: ModelConfig, out: int) -> None:
        """The encoder and the two heads (`out` policy outputs)."""
        central_critic = self.central_critic
        kind = encoder_for(spaces, cfg)
        if kind == "grid" and cfg.grid_policy != "mlp":
            self._spatial(spaces, cfg, out)
        elif kind != "mlp":
            # One trunk for both heads, as in Atari PPO: the features are learned once.
            self.trunk, features = self.feature_trunk(spaces, cfg)
            self.actor = _linear(features, out, 0.01)
            self.critic = _linear(features, 1, 1.0)
        else:
            self.trunk = nn.Flatten() if self.structured is None else nn.Identity()
            act, hidden = ACTIVATIONS[cfg.activation], list(cfg.hidden_sizes)
            obs_dim = input_width(spaces) - self.state_dim  # the agent's own view
            self.actor = _mlp([obs_dim, *hidden, out], act, out_gain=0.01)
            self.critic = _mlp([critic_input(spaces, central_critic, obs_dim), *hidden, 1], act, out_gain=1.0)

    def _spatial(self, spaces: EnvSpaces, cfg: ModelConfig, out: int) -> None:
        """model.grid_policy columns, landing or cells: the convolutions' map is the trunk (landing:
        with the taken cells appended, `LandingMap`), the policy a SpatialPolicy over it, the critic
        an MLP of hidden_sizes over the flattened map."""
        shape, mode = tuple(spaces.obs_shape), cfg.grid_policy
        channels, h, w = spatial_map(spaces, cfg, out)  # ConfigError: no place for each action
        convs = _grid_convs(shape, cfg.grid_convs)
        self.trunk = LandingMap(convs) if mode == "landing" else convs
        self.actor = SpatialPolicy(channels, mode)
        critic_channels = channels + 1 if mode == "landing" else channels  # (+ the taken cells)
        self.critic = nn.Sequential(nn.Flatten(), _mlp([critic_channels * h * w, *cfg.hidden_sizes, 1],
                                                       ACTIVATIONS[cfg.activation], out_gain=1.0))

    # --- the policy --------------------------------------------------------------------------------
    def critic_input(self, x: torch.Tensor) -> torch.Tensor:
        """The critic's view of encoded rows `x`: the rows themselves, or (central critic) for each
        row its env's A rows side by side, or the env's state that ends the row, and the row's
        agent index, one-hot."""
        if not self.central_critic:
            return self._own(x)
        a = self.num_agents
        if x.shape[0] % a:
            raise ValueError(f"a centralised critic needs whole envs: {x.shape[0]} rows for {a} agents per env")
        agent = torch.eye(a, dtype=x.dtype, device=x.device).repeat(x.shape[0] // a, 1)
        if self.state_dim:
            return torch.cat([x[:, -self.state_dim:], agent], dim=-1)
        envs = x.reshape(-1, a * x.shape[-1]).repeat_interleave(a, dim=0)
        return torch.cat([envs, agent], dim=-1)

    def _own(self, x: torch.Tensor) -> torch.Tensor:
        """What the policy reads of encoded rows: the agent's own observation, without the env state."""
        return x[:, :-self.state_dim] if self.state_dim else x

    def _critic(self, x: torch.Tensor) -> torch.Tensor:
        """The critic's raw output: normalised returns under algo.value_norm."""
        return self.critic(self.critic_input(x)).squeeze(-1)

    def returns_of(self, raw: torch.Tensor) -> torch.Tensor:
        """Raw critic output -> values in return units."""
        return raw if self.value_norm is None else self.value_norm.denormalize(raw)

    def raw_of(self, returns: torch.Tensor) -> torch.Tensor:
        """Returns (or values) -> the units the critic learns in."""
        return returns if self.value_norm is None else self.value_norm(returns)

    def update_value_norm(self, returns: torch.Tensor, reduce: Callable[[np.ndarray], np.ndarray] = lambda m: m):
        """algo.value_norm: fold a batch of return targets in (summed over learners by `reduce`)."""
        if self.value_norm is not None:
            self.value_norm.merge(reduce(self.value_norm.moments(returns.reshape(-1, 1))))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.returns_of(self._critic(self.features(obs)))

    def log_probs(self, obs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Categorical only: log-probabilities of every action, [B, num_actions]. Written out rather
        than through torch.distributions.Categorical, whose argument checks double the cost of small
        batches."""
        return _masked_log_softmax(self.actor(self._own(self.features(obs))), mask)

    def _heads(self, obs: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Policy output (log-probs, or the Gaussian mean flattened to [B, d]) and the critic's raw output."""
        x = self.features(obs)
        out = self.actor(self._own(x))
        return (out if self.continuous else _masked_log_softmax(out, mask)), self._critic(x)

    def _gaussian_logp(self, mean: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        z = (actions - mean) * torch.exp(-self.log_std)
        return (-0.5 * z * z - self.log_std - HALF_LOG_2PI).sum(-1)

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor, mask: torch.Tensor | None = None):
        """log-prob of `actions`, entropy and the critic's raw output (`returns_of` gives values):
        what the PPO loss needs. `mask`: the valid actions the rows were sampled under."""
        return self._scored(*self._heads(obs, mask), actions)

    def _scored(self, out: torch.Tensor, values: torch.Tensor, actions: torch.Tensor):
        """`evaluate` from the heads' outputs."""
        if self.continuous:
            logp = self._gaussian_logp(out, actions.reshape(out.shape).to(out.dtype))
            entropy = (0.5 + HALF_LOG_2PI + self.log_std).sum().expand(out.shape[0])
            return logp, entropy, values
        entropy = -(out.exp() * out).sum(-1)
        return out.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1), entropy, values

    def sample(self, obs: torch.Tensor, generator: torch.Generator | None = None, mask: torch.Tensor | None = None,
               uniforms: torch.Tensor | None = None):
        """Sampled actions, their log-probs, and state values. Gaussian samples are not clipped to
        the action bounds: env ranks clip what they step with, the fragment keeps the sample, so its
        log-prob stays right. `mask` (categorical): only valid actions are ever drawn. `uniforms`
        ([B, draw_width] in (0, 1), float64): each row's own random numbers (a holder's keyed draws,
        core/seeds.py), used instead of `generator`."""
        out, raw = self._heads(obs, mask)
        return self._draw(out, self.returns_of(raw), generator, uniforms)

    def _draw(self, out: torch.Tensor, values: torch.Tensor, generator: torch.Generator | None,
              uniforms: torch.Tensor | None = None):
        """`sample` from the heads' outputs: the draws from `uniforms` where given (each row's
        action then depends on that row's numbers alone), else from `generator`."""
        if self.continuous:
            noise = (torch.randn(out.shape, generator=generator, device=out.device, dtype=out.dtype)
                     if uniforms is None else torch.special.ndtri(uniforms).to(out.dtype).reshape(out.shape))
            actions = out + torch.exp(self.log_std) * noise
            return actions.reshape(-1, *self.action_shape), self._gaussian_logp(out, actions), values
        # torch.multinomial's own method for one draw, an exponential race (argmax p_i / E_i with
        # E_i ~ Exp(1): the same draws from the same generator), without its checks of the
        # probabilities, which cost a small policy's forward about a sixth of its time; from
        # uniforms, E = -log U
        probs = out.exp()
        race = (torch.empty_like(probs).exponential_(1, generator=generator) if uniforms is None
                else (-torch.log(uniforms)).to(probs.dtype))
        actions = (probs / race).argmax(-1, keepdim=True)
        return actions.squeeze(-1), out.gather(-1, actions).squeeze(-1), values

    def mode(self, obs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The most likely action: the (valid) argmax for categorical, the mean for Gaussian."""
        return self._best(self.actor(self._own(self.features(obs))), mask)

    def _best(self, out: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """`mode` from the policy head's output."""
        return out.reshape(-1, *self.action_shape) if self.continuous else _masked_log_softmax(out, mask).argmax(-1)
