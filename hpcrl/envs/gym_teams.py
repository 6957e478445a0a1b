"""Gymnasium envs of a whole team as PettingZoo-style parallel envs, so `ParallelVector`
(envs/multiagent.py) steps them as agent rows: Level-Based Foraging (`lbforaging`) and the
Multi-Robot Warehouse (`rware`), the EPyMARL benchmark's grid worlds (Papoudakis et al. 2021).

env.id `MODULE:GYM_ID` names an id that importing MODULE registers in gymnasium, for a MODULE of
`TEAM_ENV_MODULES`: `lbforaging:Foraging-8x8-2p-3f-v3`, `rware:rware-tiny-2ag-v2`. env.kwargs go
into the registered id's kwargs (`lbforaging:Foraging-8x8-2p-3f-v3` with {players: 3}). Such an
env acts for every agent at once: its observation and action spaces are Tuples of one space per
agent, its step takes one action per agent and returns one observation and one reward per agent,
but one terminated and one truncated for the whole team. The adapter (`GymTeamEnv`) gives:
- agents "agent_0" ... "agent_{N-1}", in the Tuples' order;
- each agent its own reward, as the env returns it (a scalar reward, shared, goes to every
  agent): what the team earns is their sum, which a team learner (algo.team.reward) takes;
  Level-Based Foraging's rewards are already normalised so that a whole episode's foraging
  totals 1 over all agents (with `normalize_reward`, its default);
- the end of an episode for every agent at once (they all leave `agents` together), as the env
  says: both packages count their step limit themselves and report reaching it as terminated,
  which would leave out the value of the state a learner bootstraps from at a time limit, so the
  adapter moves the env's own limit a step beyond and puts gymnasium's TimeLimit at the limit
  itself (LBF's `max_episode_steps`, 50; RWARE's `max_steps`, 500; env.kwargs may set either):
  an episode cut off there is truncated, one that ends by itself (LBF: no food left) terminated;
- `state()`: every agent's observation, flattened and concatenated in agent order, as float32
  (the global state EPyMARL gives these envs; `state_space` its Box);
- a seeded reset that depends on the seed only: it starts from a freshly made env (LBF's reset
  keeps its players off the cells where the last episode's stood, so it depends on that episode);
- no env state in a serial checkpoint (`capture_state` refuses): a resumed run starts new episodes.

No MPI and no torch here.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib

import gymnasium as gym
import numpy as np

from hpcrl.core.config import ConfigError
from hpcrl.envs.state import NotCapturable

# the packages whose gymnasium envs are teams, with the env kwarg that sets their step limit
TEAM_ENV_MODULES = {"lbforaging": "max_episode_steps", "rware": "max_steps"}
MARL_EXTRA = "pip install 'hpcrl[marl]'"


def team_factory(env_id: str):
    """What makes one `GymTeamEnv` of env_id 'module:GymId', called with env.kwargs; None when env_id
    names no gymnasium id of a team package (TEAM_ENV_MODULES). A ConfigError that names the
    extra to install when the package is missing."""
    if ":" not in env_id:
        return None
    module_name, name = env_id.split(":", 1)
    if module_name not in TEAM_ENV_MODULES:
        return None
    try:
        importlib.import_module(module_name)  # registers its ids in gymnasium
    except ImportError as exc:
        raise ConfigError(f"env.id: {env_id!r} needs the {module_name} package ({exc}); install it with: "
                          f"{MARL_EXTRA}") from None
    if name not in gym.registry:
        return None  # the gymnasium path names the close ids
    return functools.partial(GymTeamEnv, env_id, name, TEAM_ENV_MODULES[module_name])


def _native(action):
    """An action as the team env takes it: a Python int for a Discrete action (numpy's int64 is
    not an int to every env), an array otherwise."""
    return action.item() if np.ndim(action) == 0 and hasattr(action, "item") else action


class GymTeamEnv:
    """One gymnasium team env as a PettingZoo parallel env (see the module's docstring)."""

    metadata = {"is_parallelizable": True}

    def __init__(self, env_id: str, gym_id: str, limit_kwarg: str, /, **kwargs):
        """`kwargs` (env.kwargs) update the registered id's; `limit_kwarg` is the one that sets the step limit."""
        spec = gym.spec(gym_id)
        env_kwargs = {**spec.kwargs, **kwargs}
        limit = env_kwargs.get(limit_kwarg)
        if limit is not None:  # the env's own limit a step beyond TimeLimit's, so only TimeLimit cuts off
            env_kwargs[limit_kwarg] = int(limit) + 1
        self._spec = dataclasses.replace(spec, kwargs=env_kwargs, max_episode_steps=limit)
        self.env = self._make()
        observations, actions = self.env.observation_space, self.env.action_space
        if not (isinstance(observations, gym.spaces.Tuple) and isinstance(actions, gym.spaces.Tuple)
                and len(observations.spaces) == len(actions.spaces) > 0):
            raise ConfigError(f"env.id: {env_id!r} is not a team env: its observation space {observations} and "
                              f"action space {actions} are not Tuples with one entry per agent")
        self.name = env_id
        self.possible_agents = [f"agent_{i}" for i in range(len(actions.spaces))]
        self.agents: list[str] = []
        self._observation_spaces = dict(zip(self.possible_agents, observations.spaces))
        self._action_spaces = dict(zip(self.possible_agents, actions.spaces))
        flat = [gym.spaces.flatten_space(space) for space in observations.spaces]
        self.state_space = gym.spaces.Box(np.concatenate([s.low for s in flat]).astype(np.float32),
                                          np.concatenate([s.high for s in flat]).astype(np.float32),
                                          dtype=np.float32)
        self._observations: tuple = ()

    def _make(self) -> gym.Env:
        self._fresh = True
        # no env checker: it warns on every step that a list of rewards is not a float
        return gym.make(self._spec, disable_env_checker=True)

    def observation_space(self, agent: str) -> gym.Space:
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> gym.Space:
        return self._action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None and not self._fresh:  # LBF places its players around where the last episode's stood
            self.env.close()
            self.env = self._make()
        self._fresh = False
        observations, info = self.env.reset(seed=seed, options=options)
        self._observations = tuple(observations)
        self.agents = list(self.possible_agents)
        return self._by_agent(self._observations), {agent: dict(info) for agent in self.agents}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        observations, rewards, terminated, truncated, info = self.env.step(
            tuple(_native(actions[agent]) for agent in self.possible_agents))
        self._observations = tuple(observations)
        if np.ndim(rewards) == 0:  # one reward for the team: each agent's
            rewards = [rewards] * len(self.possible_agents)
        # a team env ends for all its agents together; gymnasium's bools, or one per agent (all must end)
        terminated, truncated = bool(np.all(terminated)), bool(np.all(truncated))
        agents = self.possible_agents
        result = (self._by_agent(self._observations), {a: float(r) for a, r in zip(agents, rewards)},
                  {a: terminated for a in agents}, {a: truncated and not terminated for a in agents},
                  {a: dict(info) for a in agents})
        if terminated or truncated:
            self.agents = []
        return result

    def _by_agent(self, observations: tuple) -> dict:
        return dict(zip(self.possible_agents, observations))

    def state(self) -> np.ndarray:
        """Every agent's last observation, flattened and concatenated (EPyMARL's state for these envs)."""
        return np.concatenate([gym.spaces.flatten(self._observation_spaces[agent], obs).astype(np.float32)
                               for agent, obs in zip(self.possible_agents, self._observations)])

    def capture_state(self) -> dict:
        """Refused: these envs' objects refer to each other (LBF's valid actions are keyed by its
        players, RWARE's request queue holds some of its shelves), which envs/state.py's walk of
        plain data cannot bring back, so a serial checkpoint holds no env state and says so."""
        raise NotCapturable(f"{self.name}: its objects refer to each other, which cannot be saved as plain data")

    def restore_state(self, state: dict) -> None:
        raise NotCapturable(f"{self.name}: its state is never saved")

    def close(self) -> None:
        self.env.close()
