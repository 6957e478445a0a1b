"""Gymnasium (and PettingZoo, a row per agent: envs/multiagent.py) environments: the vector an env
rank steps, and the spaces every role sizes buffers by. Gymnasium envs of a whole team
(`lbforaging:Foraging-8x8-2p-3f-v3`, `rware:rware-tiny-2ag-v2`: envs/gym_teams.py) are rows per
agent too, as PettingZoo envs are.

No MPI and no torch here: env ranks that use remote inference import only this and numpy.
The vector's step contract (SAME_STEP autoreset, raw episode rewards) is described in
envs/vector.py, which adapts every backend to it.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import re
import sys
import warnings
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from hpcrl.core.config import ConfigError, EnvConfig
from hpcrl.core.observations import ObsLeaves
from hpcrl.envs.obs_leaves import leaves_of
from hpcrl.envs.gym_teams import TEAM_ENV_MODULES
from hpcrl.envs.multiagent import pettingzoo_vector
from hpcrl.envs.pomdp import register as _register_pomdp
from hpcrl.envs.vector import (GAME_OVER, RAW_REWARD, ClipActions, LiftEpisodeInfo, DiscountedReturns, SyncVector,
                               envpool_vector, numpy_vector)
from hpcrl.core.say import say

__all__ = ["EnvSpaces", "make_env", "env_spaces", "make_vector_env", "random_actions", "imports_of_env_id",
           "KNOWN_ENV_FAMILIES", "RAW_REWARD", "GAME_OVER"]

_register_pomdp()  # hpcrl/CartPolePositions-v1 and friends, by id like gymnasium's own


@dataclass(frozen=True)
class EnvSpaces:
    """What buffers and networks need to know about an env, small enough to broadcast at start."""

    obs_shape: tuple          # e.g. (4,) or (4, 84, 84) for stacked Atari frames
    obs_dtype: str            # 'float32', 'float64' or 'uint8'
    num_actions: int          # Discrete: n; continuous (Box actions): 0
    action_shape: tuple = ()  # Discrete: (); Box: (d,)
    action_dtype: str = "int64"   # Discrete: 'int64'; Box: 'float32'
    action_low: tuple = ()    # Box only: per-dimension bounds (floats), for clipping on env ranks
    action_high: tuple = ()
    action_mask: bool = False  # the env says which Discrete actions are valid (PettingZoo's action_mask)
    state_dim: int = 0        # PettingZoo with env.global_state: the last state_dim numbers of a row are the env's state
    num_agents: int = 1       # PettingZoo: agents per env, each a row of the vector (envs/multiagent.py)
    agents: tuple = ()        # PettingZoo: the agent names, in row order
    # Dict or Tuple observations: their leaves (core/observations.py); obs_shape is then () and
    # obs_dtype 'structured', and everything that moves or encodes observations reads its leaves
    obs_leaves: ObsLeaves | None = None

    @property
    def observation(self) -> ObsLeaves:
        """The observation's leaves: one for a Box observation."""
        return self.obs_leaves if self.obs_leaves is not None else ObsLeaves.box(self.obs_shape, self.obs_dtype)

    @property
    def continuous(self) -> bool:
        return self.num_actions == 0

    @property
    def multiagent(self) -> bool:
        """A PettingZoo env (rows are agents, which may be inactive), even as a policy of one agent sees it."""
        return bool(self.agents)


# --- which env ids import code -------------------------------------------------------------------

_REGISTERED_ID = r"(?:[\w.-]+/)?[\w.-]+-v\d+"  # an id the module registers: looked up, never an attribute called
_ENV_MODULE = r"[a-z][a-z0-9_]*_v\d+"  # a PettingZoo env module (connect_four_v3): its env or parallel_env made
# 'module:name' ids of the installed env families hpcrl supports, by module: importing such a
# module only registers its envs, and a name of this form only looks an env up, so a run
# directory that names one runs no code of its author's choosing
_KNOWN_ENV_MODULES = {
    "gymnasium": re.compile(_REGISTERED_ID), "ale_py": re.compile(_REGISTERED_ID),
    "minigrid": re.compile(_REGISTERED_ID),
    "pettingzoo": re.compile(r"[a-z_]+/[a-z0-9_]+-v\d+"),  # its registry: classic/connect_four-v3
    **{f"pettingzoo.{family}": re.compile(_ENV_MODULE)
       for family in ("atari", "butterfly", "classic", "mpe", "sisl")},  # pettingzoo.classic:connect_four_v3
    "mpe2": re.compile(_ENV_MODULE),
    # gymnasium team envs, a row per agent (envs/gym_teams.py): lbforaging:Foraging-8x8-2p-3f-v3
    **{module: re.compile(_REGISTERED_ID) for module in TEAM_ENV_MODULES},
}
KNOWN_ENV_FAMILIES = ("gymnasium ids (CartPole-v1, ALE/Breakout-v5, hpcrl/...), minigrid:<id>, "
                      "pettingzoo:<family>/<env>, pettingzoo.<family>:<env>, mpe2:<env>, lbforaging:<id>, rware:<id>")


def imports_of_env_id(env_id: str) -> str | None:
    """The module that making `env_id` imports to call a name of it, outside the env families
    hpcrl supports ('os' for 'os:system', 'tests.ma_envs' for 'tests.ma_envs:Relay'); None when
    it imports nothing of the kind. An id without ':' is looked up in gymnasium's registry, whose
    entry points only installed packages and hpcrl register; gymnasium, PettingZoo and hpcrl
    itself import the module before the ':' of any other id."""
    if ":" not in env_id:
        return None
    module_name, name = env_id.split(":", 1)
    form = _KNOWN_ENV_MODULES.get(module_name)
    return None if form is not None and form.fullmatch(name) else module_name


# --- one env -------------------------------------------------------------------------------------

def _import_module(env_id: str, module_name: str):
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"env.id: cannot import module {module_name!r} of {env_id!r}: "
                          f"{type(exc).__name__}: {exc}") from None


def _call_factory(factory, env_id: str, **kwargs) -> gym.Env:
    env = factory(**kwargs)
    if not isinstance(env, gym.Env):
        raise ConfigError(f"env.id: {env_id!r} returned {type(env).__name__}, not a gymnasium.Env")
    return env


def _resolve(env_id: str):
    """What gymnasium.make gets for env.id: a registered id, or an EnvSpec around a 'module:Name'
    class or factory. Imports the module first (it may register ids)."""
    if env_id.startswith("ALE/"):
        from hpcrl.envs.atari import import_ale
        import_ale()
    if ":" not in env_id:
        return env_id
    module_name, name = env_id.split(":", 1)
    module = _import_module(env_id, module_name)
    target = getattr(module, name, None) if name.isidentifier() else None
    if target is None:
        if name in gym.registry:
            return name  # 'module:EnvId': the module registered EnvId on import
        candidates = [a for a in dir(module) if not a.startswith("_")] + list(gym.registry)
        close = difflib.get_close_matches(name, candidates, n=3)
        raise ConfigError(f"env.id: module {module_name!r} has no attribute {name!r} and no environment id "
                          f"{name!r} is registered" + (f"; close names: {', '.join(close)}" if close else ""))
    if isinstance(target, type):
        if not issubclass(target, gym.Env):
            raise ConfigError(f"env.id: {env_id!r} is a class but not a gymnasium.Env subclass")
        entry_point = target
    elif callable(target):
        entry_point = functools.partial(_call_factory, target, env_id)
    else:
        raise ConfigError(f"env.id: {env_id!r} is a {type(target).__name__}, not a gymnasium.Env subclass "
                          f"or a function returning one")
    return gym.envs.registration.EnvSpec(id=name, entry_point=entry_point)


def _make(env_id: str, kwargs: dict) -> gym.Env:
    target = _resolve(env_id)
    try:
        return gym.make(target, **kwargs)
    except gym.error.Error as exc:
        raise ConfigError(f"env.id: cannot make environment {env_id!r}: {exc}") from None
    except ImportError as exc:
        raise ConfigError(f"env.id: cannot import the module for {env_id!r}: {exc}") from None
    except TypeError as exc:
        raise ConfigError(f"env.kwargs: {env_id!r} rejected the keyword arguments {kwargs}: {exc}") from None


def make_env(cfg: EnvConfig) -> gym.Env:
    """One env as configured: env.id made with env.kwargs, inside the preset's wrappers."""
    if cfg.preset == "atari":
        from hpcrl.envs import atari
        return atari.wrap(_make(cfg.id, {**cfg.kwargs, **atari.make_kwargs(cfg.atari)}), cfg.atari, cfg.id)
    return _make(cfg.id, cfg.kwargs)


# --- the vector an env rank steps ----------------------------------------------------------------

def _vector(cfg: EnvConfig, num_envs: int, seed: int, gamma: float) -> gym.vector.VectorEnv:
    agent_rows = pettingzoo_vector(cfg.id)
    if agent_rows is not None:  # PettingZoo: one row per agent
        if cfg.backend != "sync" or cfg.preset is not None:
            raise ConfigError(f"env.id: {cfg.id!r} is a PettingZoo env, stepped by env.backend: sync with no "
                              f"env.preset (got backend {cfg.backend!r}, preset {cfg.preset!r})")
        envs = agent_rows(cfg.kwargs, num_envs, global_state=bool(cfg.global_state))
    elif cfg.backend == "sync":
        # partial, not a lambda: a config value, which a serial checkpoint's env state leaves as built
        envs = SyncVector([functools.partial(make_env, cfg) for _ in range(num_envs)],
                          autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        envs = LiftEpisodeInfo(envs)
    elif cfg.backend == "numpy":
        if cfg.preset is not None:
            raise ConfigError(f"env.backend: 'numpy' has no {cfg.preset} preset; use backend: sync or envpool")
        envs = numpy_vector(_resolve(cfg.id), cfg.id, cfg.kwargs, num_envs)
    else:
        atari_kwargs = None
        if cfg.preset == "atari":
            from hpcrl.envs.atari import envpool_kwargs
            atari_kwargs = envpool_kwargs(cfg.atari)
        envs = envpool_vector(cfg.id, cfg.kwargs, num_envs, seed, atari_kwargs)
    if isinstance(envs.single_action_space, gym.spaces.Box):
        envs = ClipActions(envs)
    if cfg.normalize_reward:
        envs = DiscountedReturns(envs, gamma)
    return envs


def make_vector_env(cfg: EnvConfig, seed: int | list[int], gamma: float = 0.99,
                    num_envs: int | None = None) -> tuple[gym.vector.VectorEnv, np.ndarray]:
    """`num_envs` envs (default: the config's) stepped in this process by `cfg.backend`, reset with
    `seed`: one seed per env (hpcrl.core.seeds.env_seeds), or an int (env i gets seed + i). The numpy
    and envpool backends seed a whole vector from one seed, the first. Every backend
    autoresets SAME_STEP: a finished env returns its reset observation at once and its final
    observation in info["final_obs"] (needed to bootstrap truncation). `gamma` is the discount of
    env.normalize_reward. Returns the vector and its first observations."""
    n = num_envs or cfg.num_envs  # envs; a PettingZoo vector has n x agents rows
    seeds = [seed + i for i in range(n)] if isinstance(seed, int) else list(seed)
    if len(seeds) != n:
        raise ValueError(f"{len(seeds)} seeds for {n} envs")
    first = seeds[0] % 2**31  # envpool takes an int32 base seed
    envs = _vector(cfg, n, first, gamma)
    obs, _ = envs.reset(seed=seeds if cfg.backend == "sync" else first)  # PettingZoo: info["active"] too
    return envs, obs


def check_observations(cfg: EnvConfig) -> None:
    """One env of the config reset and stepped once (a seeded random action): a ConfigError naming
    the env, its observation space and what reset() or step() returned, when an observation does
    not have the shape its space declares. The vector an env rank steps writes observations into
    arrays of the space's shape, and failed there with numpy's 'Output array is the wrong shape'
    deep inside gymnasium. (PettingZoo envs and the numpy and envpool backends build their own
    vectors, with their own checks.)"""
    with warnings.catch_warnings():  # gymnasium's env checker says less, and only warns
        warnings.simplefilter("ignore")
        env = make_env(cfg)
        try:
            space = env.observation_space
            obs, _ = env.reset(seed=0)
            _check_fits(cfg.id, "reset()", obs, space, "")
            if _supported_actions(env.action_space):  # (else env_spaces says what is supported)
                env.action_space.seed(0)
                obs = env.step(env.action_space.sample())[0]
                _check_fits(cfg.id, "step()", obs, space, "")
        finally:
            env.close()


def _supported_actions(act: gym.spaces.Space) -> bool:
    """Discrete actions from 0, or one-dimensional Box (continuous) actions."""
    return (isinstance(act, gym.spaces.Discrete) and int(act.start) == 0) or \
        (isinstance(act, gym.spaces.Box) and len(act.shape) == 1)


def _check_fits(env_id: str, call: str, obs, space: gym.spaces.Space, where: str) -> None:
    if isinstance(space, gym.spaces.Dict):
        for key, sub in space.spaces.items():
            if not isinstance(obs, dict) or key not in obs:
                raise ConfigError(f"env.id {env_id!r}: {call} returned an observation without key {key!r}{where}, "
                                  f"but its observation_space is a Dict with keys {list(space.spaces)}")
            _check_fits(env_id, call, obs[key], sub, f"{where}[{key!r}]")
    elif isinstance(space, gym.spaces.Tuple):
        if not isinstance(obs, (tuple, list)) or len(obs) != len(space.spaces):
            raise ConfigError(f"env.id {env_id!r}: {call} returned {type(obs).__name__} for{where or ' the'} "
                              f"observation, but its observation_space is a Tuple of {len(space.spaces)}")
        for i, sub in enumerate(space.spaces):
            _check_fits(env_id, call, obs[i], sub, f"{where}[{i}]")
    elif isinstance(space, gym.spaces.Box):
        array = np.asarray(obs)
        if array.shape != space.shape:
            part = f"observation{where}" if where else "an observation"
            raise ConfigError(f"env.id {env_id!r}: {call} returned {part} of shape {array.shape} ({array.dtype}), "
                              f"but its observation_space{where} is {space} (shape {space.shape}, {space.dtype}); "
                              f"return arrays of shape {space.shape} from reset() and step(), or declare the space "
                              f"the env really gives")


def env_spaces(cfg: EnvConfig) -> EnvSpaces:
    """Make the configured vector with one env to read its spaces; a ConfigError if the env or its
    spaces are unsupported, or if its observations do not fit its observation space."""
    if cfg.backend == "sync" and pettingzoo_vector(cfg.id) is None:
        check_observations(cfg)
    envs = _vector(dataclasses.replace(cfg, num_envs=1), 1, seed=0, gamma=0.99)
    try:
        envs.reset(seed=0)  # a single-agent env says whether it gives action masks in its reset info
        obs, act = envs.single_observation_space, envs.single_action_space
        agents = tuple(getattr(envs.unwrapped, "agents", ()))
        masked = bool(getattr(envs.unwrapped, "masked", False))
        mask_width = envs.unwrapped.action_mask.shape[-1] if masked else 0
        state_dim = int(getattr(envs.unwrapped, "state_dim", 0))
    finally:
        envs.close()
    if isinstance(obs, gym.spaces.Box):
        shape, dtype, leaves = tuple(obs.shape), np.dtype(obs.dtype).name, None
    else:
        try:
            leaves = leaves_of(obs, warn=lambda message: _warn_once(f"env.id {cfg.id}: {message}"))
        except ValueError as exc:
            raise ConfigError(f"env.id: {cfg.id!r}: {exc}") from None
        shape, dtype = (), "structured"
    spaces = EnvSpaces(obs_shape=shape, obs_dtype=dtype, num_actions=0, obs_leaves=leaves,
                       num_agents=max(len(agents), 1), agents=agents, action_mask=masked, state_dim=state_dim)
    if masked and not agents and (not isinstance(act, gym.spaces.Discrete) or mask_width != int(act.n)):
        raise ConfigError(f"env.id: {cfg.id!r} gives info['action_mask'] of {mask_width} entries for action space "
                          f"{act}; masks are for Discrete actions, one entry per action")
    if _supported_actions(act) and isinstance(act, gym.spaces.Discrete):
        return dataclasses.replace(spaces, num_actions=int(act.n))
    if _supported_actions(act):
        return dataclasses.replace(spaces, action_shape=tuple(act.shape), action_dtype="float32",
                                   action_low=tuple(float(x) for x in act.low),
                                   action_high=tuple(float(x) for x in act.high))
    raise ConfigError(f"env.id: {cfg.id!r} has action space {act}; hpcrl supports Discrete actions (starting "
                      f"at 0) and one-dimensional Box (continuous) actions, not Dict, Tuple, MultiDiscrete, "
                      f"MultiBinary or multi-dimensional Box")


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    """A warning about the env, printed once per process (spaces are read more than once)."""
    if message not in _WARNED:
        _WARNED.add(message)
        say(f"warning: {message}", stream=sys.stderr)


# --- random actions (tests drive every backend with them) ---------------------------------------

def random_actions(spaces: EnvSpaces, n: int, rng: np.random.Generator) -> np.ndarray:
    """Uniform random actions for `n` envs (continuous: uniform within the bounds; an unbounded
    dimension draws from a standard normal)."""
    if not spaces.continuous:
        return rng.integers(0, spaces.num_actions, size=n, dtype=np.int64)
    low, high = np.array(spaces.action_low), np.array(spaces.action_high)
    bounded = np.isfinite(low) & np.isfinite(high)
    uniform = rng.uniform(np.where(bounded, low, 0.0), np.where(bounded, high, 1.0), size=(n, *spaces.action_shape))
    return np.where(bounded, uniform, rng.standard_normal((n, *spaces.action_shape))).astype(np.float32)
