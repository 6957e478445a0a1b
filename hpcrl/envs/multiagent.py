"""PettingZoo parallel environments as a vector of agent rows, so actors, policy servers and
trainers move them with the single-agent code (SRL and MAPPO's implementations do the same).

`num_envs` PettingZoo envs of A possible agents become a vector of num_envs x A rows, env-major
(row e*A + i is agent i of env e, agents in `possible_agents` order), so any batch of whole envs
keeps each env's agents side by side (the centralised critic reads them there, hpcrl/models).
- An agent that is not in `env.agents` (it has left, or has not joined yet) is an inactive row:
  zero observation and reward, never done, and info["active"] False. Trainers leave inactive rows
  out of the loss; an agent's rows between its own end and its return are cut off from its
  advantages by the done of the step it left in.
- An env whose agents have all gone is reset in the same step (the vector contract of
  hpcrl/envs/vector.py): its rows' final observations are in info["final_obs"].
- info["active"] (bool [rows]) says which rows act on the observations the call returns; reset's
  info has it too. info["env_done"] (bool [envs]) says which envs ended (and restarted) in the step.
- Action masks: agents observing PettingZoo's {"observation": ..., "action_mask": ...} dict (the
  classic envs' convention), or given infos[agent]["action_mask"], get the observation leaf as
  their row and the mask in info["action_mask"] (bool [rows, actions]); rows without a mask (or
  inactive, or with no valid action) allow every action.

No MPI and no torch here.
"""
from __future__ import annotations

import importlib

import gymnasium as gym
import numpy as np

from hpcrl.core.config import ConfigError

ACTIVE = "active"  # info key: the rows whose agent acts on the returned observations
ACTION_MASK = "action_mask"  # info key (and observation-dict key): the valid actions of each row
ENV_DONE = "env_done"  # info key: the envs (not rows) whose episode ended in this step (bool [envs])


def parallel_env_factory(env_id: str):
    """The factory of a PettingZoo id 'module:name': the `parallel_env` of a PettingZoo env module (for
    example mpe2:simple_spread_v3, pettingzoo.butterfly:pistonball_v6) or a pettingzoo.ParallelEnv
    subclass; None when env_id names no PettingZoo env."""
    if ":" not in env_id:
        return None
    module_name, name = env_id.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None  # not ours to explain: the gymnasium path says what cannot be imported
    target = getattr(module, name, None) if name.isidentifier() else None
    if target is None:
        try:
            target = importlib.import_module(f"{module_name}.{name}")
        except ImportError:
            return None
    factory = getattr(target, "parallel_env", None)
    if callable(factory):
        return factory
    if isinstance(target, type):
        try:
            from pettingzoo import ParallelEnv
        except ImportError:
            return None
        return target if issubclass(target, ParallelEnv) else None
    return None


def make_parallel_env(env_id: str, kwargs: dict):
    factory = parallel_env_factory(env_id)
    try:
        return factory(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"env.kwargs: {env_id!r} rejected the keyword arguments {kwargs}: {exc}") from None


def _observation_leaf(space: gym.Space) -> tuple[gym.Space, bool]:
    """An agent's observation space, and whether it carries an action mask: the Box inside
    PettingZoo's {"observation", "action_mask"} dict, or the space itself."""
    if isinstance(space, gym.spaces.Dict) and set(space.spaces) == {"observation", ACTION_MASK}:
        return space["observation"], True
    return space, False


def common_spaces(env, env_id: str) -> tuple[gym.Space, gym.Space]:
    """The observation and action space every agent shares (the observation leaf of a masked
    observation dict); a ConfigError names the agents that differ."""
    agents = list(env.possible_agents)
    first = agents[0]
    obs, act = env.observation_space(first), env.action_space(first)
    differ = [a for a in agents[1:] if env.observation_space(a) != obs or env.action_space(a) != act]
    if differ:
        raise ConfigError(f"env.id: the agents of {env_id!r} do not share one observation and action space "
                          f"({first}: {obs}, {act}; {differ[0]}: {env.observation_space(differ[0])}, "
                          f"{env.action_space(differ[0])}); one shared policy needs them alike")
    return obs, act


class ParallelVector(gym.vector.VectorEnv):
    """`num_envs` PettingZoo parallel envs as num_envs x A rows (see the module's docstring)."""

    def __init__(self, env_id: str, kwargs: dict, num_envs: int):
        self.envs = [make_parallel_env(env_id, kwargs) for _ in range(num_envs)]
        self.agents = list(self.envs[0].possible_agents)
        self.num_agents = len(self.agents)
        space, self.single_action_space = common_spaces(self.envs[0], env_id)
        self.single_observation_space, self._mask_in_obs = _observation_leaf(space)
        self.masked = self._mask_in_obs
        if not self.masked:  # masks in the infos instead? a first reset tells (the actors reset again, seeded)
            _, infos = self.envs[0].reset(seed=0)
            self.masked = any(ACTION_MASK in (info or {}) for info in infos.values())
        self.num_envs = num_envs * self.num_agents
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
        self._obs = np.zeros((self.num_envs, *self.single_observation_space.shape),
                             dtype=self.single_observation_space.dtype)
        self._active = np.zeros(self.num_envs, dtype=bool)
        n_actions = int(getattr(self.single_action_space, "n", 0))
        self._mask = np.ones((self.num_envs, n_actions), dtype=bool)
        self._seeds: list[int | None] = [None] * num_envs

    def _rows(self, e: int) -> slice:
        return slice(e * self.num_agents, (e + 1) * self.num_agents)

    def _fill(self, e: int, observations: dict, infos: dict) -> None:
        """Env e's rows from its agents' observations: agents absent from the dict are inactive."""
        rows = self._rows(e)
        self._obs[rows] = 0
        self._active[rows] = False
        self._mask[rows] = True
        for i, agent in enumerate(self.agents):
            if agent not in observations:
                continue
            r, seen = rows.start + i, observations[agent]
            mask = (infos.get(agent) or {}).get(ACTION_MASK)
            if self._mask_in_obs:
                seen, mask = seen["observation"], seen[ACTION_MASK]
            self._obs[r] = seen
            self._active[r] = agent in self.envs[e].agents
            if mask is not None and self._active[r] and np.any(mask):
                self._mask[r] = np.asarray(mask, dtype=bool)

    def _reset_env(self, e: int, seed: int | None = None) -> None:
        observations, infos = self.envs[e].reset(seed=seed)
        self._fill(e, observations, infos)

    def reset(self, *, seed=None, options=None):
        seeds = seed if isinstance(seed, (list, tuple)) else [None if seed is None else seed + e
                                                              for e in range(len(self.envs))]
        for e, s in enumerate(seeds):
            self._reset_env(e, s)
        return self._obs.copy(), self._info()

    def _info(self) -> dict:
        return {ACTIVE: self._active.copy(), ACTION_MASK: self._mask.copy()}

    def step(self, actions):
        actions = np.asarray(actions)
        n = self.num_envs
        rewards = np.zeros(n, dtype=np.float64)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        final_obs = np.empty(n, dtype=object)
        ended = np.zeros(n, dtype=bool)
        env_done = np.zeros(len(self.envs), dtype=bool)
        for e, env in enumerate(self.envs):
            rows = self._rows(e)
            acting = {agent: actions[rows.start + i] for i, agent in enumerate(self.agents)
                      if self._active[rows.start + i]}
            observations, reward, term, trunc, infos = env.step(acting)
            for i, agent in enumerate(self.agents):
                if agent not in acting:
                    continue
                r = rows.start + i
                rewards[r] = reward.get(agent, 0.0)
                terminated[r], truncated[r] = bool(term.get(agent, False)), bool(trunc.get(agent, False))
            self._fill(e, observations, infos)  # agents done in this step are inactive from now on
            done = np.flatnonzero(terminated[rows] | truncated[rows]) + rows.start
            for r in done:  # their last observations, for the value of a truncated episode
                final_obs[r] = self._obs[r].copy()
            ended[done] = True
            if not env.agents:  # everyone has gone: a new episode at once (SAME_STEP)
                env_done[e] = True
                self._reset_env(e)
        info = {**self._info(), ENV_DONE: env_done}
        if ended.any():
            info["final_obs"], info["_final_obs"] = final_obs, ended
        return self._obs.copy(), rewards, terminated, truncated, info

    @property
    def active(self) -> np.ndarray:
        """The rows whose agent acts on the last returned observations."""
        return self._active.copy()

    @property
    def action_mask(self) -> np.ndarray | None:
        """The valid actions of each row for the last returned observations (None: no masks)."""
        return self._mask.copy() if self.masked else None

    def close_extras(self, **kwargs):
        for env in self.envs:
            env.close()
