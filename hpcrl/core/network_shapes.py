"""The networks hpcrl builds (models/), as shapes, without torch.

Two parts. First, what the builders in models/ read before they make a layer: the encoder an
observation gets (`encoder_for`), what the Nature CNN and the grid convolutions leave of an
observation, each Dict or Tuple leaf's code, the critic's input, and the ConfigErrors of a network
that cannot take the env. The builders call these, so a width or a refusal has one home.

Second, from those, the shape of every tensor of a policy network, its parameters and normaliser
buffers (`network_shapes`), and the length of the weights message of the largest policy
(`policy_params`). `hpcrl plan` and launch's memory check count here, with neither torch nor MPI
loaded, and absurd layer widths cost nothing to count. What the layers hold (a linear layer's
weight and bias, an LSTM cell's four gates) is torch's, written out here; tests/test_param_count.py
holds these counts equal to the built networks' over every algorithm, encoder, core and env kind.

`spaces` arguments are hpcrl.envs.EnvSpaces and `cfg` ones the whole Config (`model` arguments its
model section), not imported: core stays below envs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from hpcrl.core.config_base import ConfigError
from hpcrl.core.config_model import is_custom
from hpcrl.core.dataflow import ALGORITHMS
from hpcrl.core.policies import policy_spaces

NATURE_CNN = ((32, 8, 4), (64, 4, 2), (64, 3, 1))  # (channels, kernel, stride): Mnih et al. 2015
NATURE_CNN_FEATURES = 512
CNN_MIN_SIZE = 36  # the smallest height/width the three Nature CNN convolutions reduce to 1x1
EMBEDDING_WIDTH = 16  # the code of a Discrete leaf of a Dict or Tuple observation

Shape = tuple[int, ...]


# --- what the builders read -------------------------------------------------------------------------

def nature_cnn_map(obs_shape: tuple) -> tuple[int, int, int]:
    """The [channels, H, W] the Nature CNN's convolutions leave of a [C, H, W] image."""
    channels, h, w = obs_shape
    for out, kernel, stride in NATURE_CNN:
        channels, h, w = out, (h - kernel) // stride + 1, (w - kernel) // stride + 1
    return channels, h, w


def grid_shape(obs_shape: tuple, convs: list) -> tuple[int, int, int]:
    """The [channels, H, W] the grid encoder's convolutions (model.grid_convs) leave of an
    [H, W, C] board: 'same' ones keep H and W, 'valid' ones take kernel - 1 off each."""
    h, w, channels = obs_shape
    for out, kernel, *padding in convs:
        if padding == ["valid"]:
            h, w = h - kernel + 1, w - kernel + 1
        channels = out
    return channels, h, w


def encoder_for(spaces, model) -> str:
    """'mlp', 'cnn', 'grid' or 'custom' (the user's own class) for these observations; a
    ConfigError if model.encoder cannot take them."""
    shape = tuple(spaces.obs_shape)
    if is_custom(model.encoder):
        if spaces.state_dim:
            raise ConfigError(f"model.encoder: {model.encoder} reads each agent's observation, and env.global_state "
                              f"appends the env's state to every row; turn global_state off, or use encoder: mlp")
        return "custom"
    if spaces.obs_leaves is not None:
        if model.encoder in ("cnn", "grid"):
            what = "image" if model.encoder == "cnn" else "board"
            raise ConfigError(f"model.encoder: {model.encoder} reads Box {what} observations; this env's are a Dict "
                              "or Tuple, whose leaves choose their own encoders (images: the CNN): use encoder: auto "
                              "or mlp")
        return "mlp"
    if model.encoder == "grid" and len(shape) != 3:
        raise ConfigError(f"model.encoder: grid needs board observations of shape [H, W, C] (channel-last planes, "
                          f"as PettingZoo's classic games give), got shape {shape}; use encoder: mlp")
    if model.encoder == "grid" and min(grid_shape(shape, model.grid_convs)[1:]) < 1:
        raise ConfigError(f"model.grid_convs: the 'valid' convolutions of {model.grid_convs} leave nothing of the "
                          f"{shape[0]} x {shape[1]} board (each takes kernel - 1 off its height and width); use "
                          f"smaller kernels or 'same' padding")
    kind = model.encoder if model.encoder != "auto" else ("cnn" if len(shape) == 3 else "mlp")
    if kind == "cnn":
        how = "model.encoder: auto chose cnn for 3-D observations" if model.encoder == "auto" else "model.encoder: cnn"
        if len(shape) != 3:
            raise ConfigError(f"{how} needs [C, H, W] image observations, got shape {shape}; use encoder: mlp")
        if min(shape[1:]) < CNN_MIN_SIZE:
            raise ConfigError(f"{how} needs channel-first [C, H, W] images with H, W >= {CNN_MIN_SIZE} "
                              f"(the Nature CNN), got shape {shape}; stack frames channel-first or use encoder: mlp")
    return kind


def leaf_code(leaf) -> tuple[str, int]:
    """How a leaf of a Dict or Tuple observation (core/observations.py Leaf) is encoded, and its
    code's width: 'discrete' (an embedding), 'image' (a uint8 [C, H, W] image the Nature CNN
    takes) or 'numbers' (the leaf itself, flattened)."""
    if leaf.categories:
        return "discrete", EMBEDDING_WIDTH
    if leaf.dtype == "uint8" and len(leaf.shape) == 3 and min(leaf.shape[1:]) >= CNN_MIN_SIZE:
        return "image", NATURE_CNN_FEATURES
    return "numbers", math.prod(leaf.shape)


def custom_input_shape(spaces) -> tuple[int, ...] | dict[str, tuple[int, ...]]:
    """What the user's own encoder reads of a row: the observation's shape as the env gives it
    (uint8 frames scaled to [0, 1], normalised with model.obs_norm), or of a Dict or Tuple
    observation each leaf's, by its key (a Discrete leaf's is (): its id, an int64)."""
    if spaces.obs_leaves is None:
        return tuple(spaces.obs_shape)
    return {leaf.key: () if leaf.categories else tuple(leaf.shape) for leaf in spaces.obs_leaves.leaves}


def input_width(spaces) -> int:
    """Numbers per row the trunk of an MLP network reads: the observation flattened, or the
    leaves' codes side by side."""
    if spaces.obs_leaves is not None:
        return sum(leaf_code(leaf)[1] for leaf in spaces.obs_leaves.leaves)
    return math.prod(spaces.obs_shape)


def policy_outputs(spaces) -> int:
    """The policy head's outputs: one per action, or per action dimension (Box actions)."""
    return math.prod(spaces.action_shape) if spaces.continuous else spaces.num_actions


def critic_input(spaces, central_critic: bool, own: int) -> int:
    """The width of what an actor-critic's critic reads, where each row gives it `own` numbers:
    those; or (a central critic) the env's state that ends the row (env.global_state) and the
    agent's one-hot, or else every agent's `own` numbers of the env and the one-hot."""
    if not central_critic:
        return own
    if spaces.state_dim:
        return spaces.state_dim + spaces.num_agents
    return (own + 1) * spaces.num_agents


def spatial_map(spaces, model, out: int) -> tuple[int, int, int]:
    """model.grid_policy columns, landing or cells: the [channels, H, W] map of the convolutions the
    policy reads, or a ConfigError where it has no place for each of the `out` actions."""
    shape, mode = tuple(spaces.obs_shape), model.grid_policy
    channels, h, w = grid_shape(shape, model.grid_convs)
    per = "cell" if mode == "cells" else "column"
    wanted = h * w if mode == "cells" else w
    if out != wanted:
        raise ConfigError(f"model.grid_policy: {mode} gives one action per {per} of the convolutions' "
                          f"{h} x {w} map, {wanted} in all, and this env has {out} actions; use 'same' "
                          f"convolutions (model.grid_convs) on a board with one action per {per}, or "
                          f"grid_policy: mlp")
    if mode == "landing" and (h, w) != shape[:2]:
        raise ConfigError(f"model.grid_policy: landing reads the board's cells on the convolutions' map, "
                          f"and 'valid' convolutions leave a {h} x {w} map of the {shape[0]} x {shape[1]} "
                          f"board; use 'same' convolutions (model.grid_convs)")
    return channels, h, w


# --- what cannot be built -------------------------------------------------------------------------------

def check_env_kind(cfg, spaces) -> None:
    """An algorithm of PettingZoo envs (MAPPO, IPPO) given a single-agent env."""
    if ALGORITHMS[cfg.algo.name].multiagent and not spaces.multiagent:
        raise ConfigError(f"algo.name: {cfg.algo.name} trains PettingZoo envs (env.id such as "
                          f"mpe2:simple_spread_v3), and {cfg.env.id} is a single-agent env; use algo.name: ppo")


def check_central_critic(spaces, model) -> None:
    """A centralised critic reads flat observations."""
    if encoder_for(spaces, model) == "custom":
        raise ConfigError(f"model.encoder: mappo's centralised critic reads every agent's flat observation, not "
                          f"{model.encoder}'s features: use encoder: mlp, or algo.name: ippo with your own encoder")
    if encoder_for(spaces, model) != "mlp":
        raise ConfigError("algo.name: mappo's centralised critic reads flat observations (model.encoder: mlp); "
                          f"these are images or boards of shape {tuple(spaces.obs_shape)}: use algo.name: ippo")


def check_q(spaces, env_id: str) -> None:
    """A Q-network needs Discrete actions and one agent."""
    if spaces.continuous:
        raise ConfigError(f"algo.name: dqn needs a Discrete action space, and {env_id} has Box actions of "
                          f"shape {tuple(spaces.action_shape)}; use algo.name: ppo for continuous control")
    if spaces.multiagent:
        raise ConfigError(f"algo.name: dqn trains single-agent envs, and {env_id} is a PettingZoo env with "
                          f"{spaces.num_agents} agents; use algo.name: mappo or ippo")


def check_team(spaces, cfg) -> None:
    """VDN's and QMIX's agents need Discrete actions without masks, several agents and flat observations."""
    name, env_id = cfg.algo.name, cfg.env.id
    if spaces.continuous:
        raise ConfigError(f"algo.name: {name} needs a Discrete action space, and {env_id} has Box actions of "
                          f"shape {tuple(spaces.action_shape)}; use algo.name: mappo for continuous control")
    if not spaces.multiagent:
        raise ConfigError(f"algo.name: {name} mixes the Q-values of a team's agents, and {env_id} is a single-agent "
                          f"env; use a PettingZoo env, or algo.name: dqn")
    if spaces.action_mask:
        raise ConfigError(f"algo.name: {name} chooses from every action, and the agents of {env_id} have action masks "
                          f"(or differ in their action counts); use algo.name: mappo or ippo")
    if spaces.obs_leaves is not None or len(spaces.obs_shape) != 1 or encoder_for(spaces, cfg.model) != "mlp":
        given = ("Dict or Tuple observations" if spaces.obs_leaves is not None
                 else f"observations of shape {tuple(spaces.obs_shape)}")
        raise ConfigError(f"model.encoder: algo.name {name} reads flat observations with MLPs, and {env_id} gives "
                          f"{given} to encoder {cfg.model.encoder!r}; use a flat Box observation and encoder: mlp "
                          f"or auto")


def mixer_state_width(spaces) -> int:
    """What QMIX's mixer reads per env: the env's state (env.global_state), or every agent's observation."""
    return spaces.state_dim or spaces.num_agents * (input_width(spaces) - spaces.state_dim)


def check_continuous(spaces, model, algo_name: str, env_id: str) -> None:
    """SAC's and TD3's networks need bounded Box actions, one agent and the MLP encoder."""
    if not spaces.continuous:
        raise ConfigError(f"algo.name: {algo_name} needs a Box (continuous) action space, and {env_id} has "
                          f"{spaces.num_actions} Discrete actions; use algo.name: dqn or ppo")
    if spaces.multiagent:
        raise ConfigError(f"algo.name: {algo_name} trains single-agent envs, and {env_id} is a PettingZoo env "
                          f"with {spaces.num_agents} agents; use algo.name: mappo or ippo")
    if encoder_for(spaces, model) != "mlp":
        raise ConfigError(f"model.encoder: algo.name {algo_name} reads its observations with MLPs (its critics "
                          f"take the action beside them); use encoder: mlp")
    if not (np.isfinite(spaces.action_low).all() and np.isfinite(spaces.action_high).all()):
        raise ConfigError(f"algo.name: {algo_name} squashes its actions into the env's bounds, and {env_id} has "
                          f"unbounded Box actions (low {spaces.action_low}, high {spaces.action_high}); bound "
                          f"them with a wrapper, or use algo.name: ppo")


# --- the tensors of a network ---------------------------------------------------------------------------

def _linear(a: int, b: int) -> list[Shape]:
    return [(b, a), (b,)]


def _mlp(sizes: list[int]) -> list[Shape]:
    """Linear layers from sizes[0] numbers to sizes[-1] (activations hold nothing)."""
    return [s for a, b in zip(sizes[:-1], sizes[1:]) for s in _linear(a, b)]


def _conv(channels: int, out: int, kernel: int) -> list[Shape]:
    return [(out, channels, kernel, kernel), (out,)]


def _norm(shape: tuple) -> list[Shape]:
    """A running normaliser's buffers: count, mean, var."""
    return [(), tuple(shape), tuple(shape)]


def _nature_cnn(obs_shape: tuple) -> list[Shape]:
    channels, shapes = obs_shape[0], []
    for out, kernel, _ in NATURE_CNN:
        shapes += _conv(channels, out, kernel)
        channels = out
    return shapes + _linear(math.prod(nature_cnn_map(obs_shape)), NATURE_CNN_FEATURES)


def _grid_convs(obs_shape: tuple, convs: list) -> list[Shape]:
    channels, shapes = obs_shape[2], []
    for out, kernel, *_ in convs:
        shapes += _conv(channels, out, kernel)
        channels = out
    return shapes


def _observation_input(spaces, model) -> list[Shape]:
    """What ObservationInput holds: each Dict leaf's encoder (none before the user's own encoder,
    which reads the leaves) and normaliser, or the normaliser."""
    if spaces.obs_leaves is None:
        return _norm(spaces.obs_shape) if model.obs_norm else []
    shapes, encodes = [], not is_custom(model.encoder)
    for leaf in spaces.obs_leaves.leaves:
        kind, _ = leaf_code(leaf)
        if kind == "discrete" and encodes:
            shapes.append((leaf.categories, EMBEDDING_WIDTH))
        elif kind == "image" and encodes:
            shapes += _nature_cnn(leaf.shape)
        if model.obs_norm and kind != "discrete":
            shapes += _norm(leaf.shape)
    return shapes


@dataclass(frozen=True)
class CustomTrunk:
    """The user's own encoder (model.encoder 'package.module:Class') as built: the shapes of its
    tensors (parameters, then buffers) and its out_features. Only building it tells (models/
    custom.py `custom_trunk`, on the meta device), so the counts here take it from the caller."""
    shapes: tuple[Shape, ...]
    width: int


CustomTrunks = Callable[[object], CustomTrunk]  # custom_input_shape -> the user's encoder built for it


def _feature_trunk(spaces, model, width: int | None = None,
                   custom: CustomTrunks | None = None) -> tuple[list[Shape], int]:
    """ObservationInput.feature_trunk's tensors and output width."""
    kind, hidden = encoder_for(spaces, model), list(model.hidden_sizes)
    if kind == "custom":
        if custom is None:
            raise ValueError(f"counting the tensors of {model.encoder} needs it built (models/custom.py custom_trunk)")
        built = custom(custom_input_shape(spaces))
        return list(built.shapes), built.width
    if kind == "cnn":
        return _nature_cnn(tuple(spaces.obs_shape)), NATURE_CNN_FEATURES
    if kind == "grid":
        shape = tuple(spaces.obs_shape)
        flat = math.prod(grid_shape(shape, model.grid_convs))
        return _grid_convs(shape, model.grid_convs) + _mlp([flat, *hidden]), hidden[-1]
    return _mlp([input_width(spaces) if width is None else width, *hidden]), hidden[-1]


def _core(model, width: int) -> list[Shape]:
    """An LSTM cell's (4 gates) or a GRU cell's (3) weights and two biases."""
    gates = (4 if model.core == "lstm" else 3) * model.core_size
    return [(gates, width), (gates, model.core_size), (gates,), (gates,)]


def _actor_critic(spaces, model, central_critic: bool, value_norm: bool,
                  custom: CustomTrunks | None = None) -> list[Shape]:
    """models/networks.py ActorCritic, or models/recurrent.py RecurrentActorCritic with model.core."""
    shapes = _observation_input(spaces, model)
    out, hidden = policy_outputs(spaces), list(model.hidden_sizes)
    if central_critic:
        check_central_critic(spaces, model)
    if model.core != "none":
        trunk, width = _feature_trunk(spaces, model, input_width(spaces) - spaces.state_dim, custom)
        critic = (_mlp([critic_input(spaces, True, model.core_size), *hidden, 1]) if central_critic
                  else _linear(model.core_size, 1))
        shapes += trunk + _core(model, width) + _linear(model.core_size, out) + critic
    elif (kind := encoder_for(spaces, model)) == "grid" and model.grid_policy != "mlp":
        channels, h, w = spatial_map(spaces, model, out)
        critic_channels = channels + 1 if model.grid_policy == "landing" else channels  # (+ the taken cells)
        shapes += (_grid_convs(tuple(spaces.obs_shape), model.grid_convs) + _conv(channels, 1, 1)
                   + _mlp([critic_channels * h * w, *hidden, 1]))
    elif kind != "mlp":
        trunk, features = _feature_trunk(spaces, model, custom=custom)
        shapes += trunk + _linear(features, out) + _linear(features, 1)
    else:
        own = input_width(spaces) - spaces.state_dim  # the agent's own view
        shapes += _mlp([own, *hidden, out]) + _mlp([critic_input(spaces, central_critic, own), *hidden, 1])
    if spaces.continuous:
        shapes.append((out,))  # the state-independent log-std
    return shapes + (_norm(()) if value_norm else [])


def _q_network(spaces, model, dueling: bool, env_id: str, custom: CustomTrunks | None = None) -> list[Shape]:
    """models/q.py QNetwork, or RecurrentQNetwork with model.core."""
    shapes = _observation_input(spaces, model)
    check_q(spaces, env_id)
    trunk, width = _feature_trunk(spaces, model, custom=custom)
    shapes += trunk
    if model.core != "none":
        shapes += _core(model, width)
        width = model.core_size
    return shapes + _linear(width, spaces.num_actions) + (_linear(width, 1) if dueling else [])


def _team_q(spaces, cfg) -> list[Shape]:
    """models/team.py TeamQNetwork: the agents' networks (one shared, or one each) and QMIX's mixer."""
    check_team(spaces, cfg)
    model, t, a = cfg.model, cfg.algo.team, spaces.num_agents
    layers = list(model.hidden_sizes) if model.core == "none" else list(model.hidden_sizes[:1])
    width = input_width(spaces) - spaces.state_dim + (a if t.shared and t.agent_id else 0)
    agent = _mlp([width, *layers])
    if model.core != "none":
        agent += _core(model, layers[-1])
    agent += _linear(model.core_size if model.core != "none" else layers[-1], spaces.num_actions)
    shapes = _observation_input(spaces, model) + agent * (1 if t.shared else a)
    if ALGORITHMS[cfg.algo.name].mixer != "qmix":
        return shapes
    state, hidden, embed = mixer_state_width(spaces), t.hypernet_hidden, t.mixing_embed
    return shapes + (_mlp([state, hidden, a * embed]) + _linear(state, embed) + _mlp([state, hidden, embed])
                     + _mlp([state, embed, 1]))


def _continuous(spaces, model, stochastic: bool, algo_name: str, env_id: str) -> list[Shape]:
    """models/sac.py ContinuousActorCritics: the actor, its heads, twin critics and SAC's log alpha."""
    shapes = _observation_input(spaces, model)
    check_continuous(spaces, model, algo_name, env_id)
    width, hidden, actions = input_width(spaces), list(model.hidden_sizes), policy_outputs(spaces)
    shapes += _mlp([width, *hidden]) + _linear(hidden[-1], actions)
    if stochastic:
        shapes += _linear(hidden[-1], actions) + [()]  # the log-std head; log alpha
    return shapes + 2 * _mlp([width + actions, *hidden, 1])


def network_shapes(cfg, spaces, custom: CustomTrunks | None = None) -> list[Shape]:
    """The shape of every tensor of the network cfg's algorithm trains on `spaces` (one policy's
    view of the env), parameters and buffers, as hpcrl.models.build_policy builds it; its
    ConfigError where it cannot be built. `custom`: the user's own encoder's facts, where the
    config names one."""
    algorithm, model = ALGORITHMS[cfg.algo.name], cfg.model
    if algorithm.policy == "q":
        return _q_network(spaces, model, cfg.algo.dqn.dueling, cfg.env.id, custom)
    if algorithm.policy == "team_q":
        return _team_q(spaces, cfg)
    if algorithm.continuous:
        return _continuous(spaces, model, not algorithm.action_noise, cfg.algo.name, cfg.env.id)
    check_env_kind(cfg, spaces)
    return _actor_critic(spaces, model, algorithm.policy == "central_critic", bool(cfg.algo.value_norm), custom)


def policy_params(cfg, spaces, custom: CustomTrunks | None = None) -> int:
    """The weights message's length (parameters and normaliser buffers) of the largest policy of
    the policies table; a ConfigError if model.encoder cannot take the observations, or the
    algorithm's network cannot take the env. `custom`: as `network_shapes`."""
    return max(sum(math.prod(s) for s in network_shapes(cfg, view, custom))
               for view in policy_spaces(spaces, cfg.policies))
