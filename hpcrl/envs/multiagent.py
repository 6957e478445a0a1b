"""PettingZoo environments as a vector of agent rows, so actors, policy servers and trainers move
them with the single-agent code (SRL and MAPPO's implementations do the same): parallel envs
(`ParallelVector`) and turn-based ones (`TurnVector`: one agent moves per step, the others sit out).

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
- Dict and Tuple observations (beside an action mask, or without one) are rows of each leaf, a
  dict by key (core/observations.py), as single-agent envs give them; they are not padded and get
  no env state appended.
- Agents whose spaces differ (a team of another kind, as in MPE's simple_tag) share padded
  spaces, as SuperSuit's pad_observations and pad_action_space do for parameter sharing: flat
  observations are zero-padded to the longest, Discrete actions padded to the most, and an
  agent's actions beyond its own are masked out, so it never takes one.

No MPI and no torch here.
"""
from __future__ import annotations

import functools
import importlib

import gymnasium as gym
import numpy as np

from hpcrl.core.config import ConfigError
from hpcrl.core.observations import apply, assign, leaves, zeros
from hpcrl.envs.gym_teams import team_factory
from hpcrl.envs.obs_leaves import leaves_of

ACTIVE = "active"  # info key: the rows whose agent acts on the returned observations
ACTION_MASK = "action_mask"  # info key (and observation-dict key): the valid actions of each row
ENV_DONE = "env_done"  # info key: the envs (not rows) whose episode ended in this step (bool [envs])


def pettingzoo_factory(env_id: str, kind: str = "parallel"):
    """The factory of a PettingZoo env id 'module:name': an id of PettingZoo's registry
    (pettingzoo:classic/connect_four-v3, pettingzoo:butterfly/pistonball-v6), the `parallel_env` of a
    PettingZoo env module (mpe2:simple_spread_v3) or a pettingzoo.ParallelEnv subclass; with kind
    'aec', a turn-based env of the registry, the `env` of a turn-based env module
    (pettingzoo.classic:connect_four_v3) or a pettingzoo.AECEnv subclass. None when env_id names
    no such env (an env with a parallel form is always stepped as one)."""
    if ":" not in env_id:
        return None
    module_name, name = env_id.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None  # not ours to explain: the gymnasium path says what cannot be imported
    registry = getattr(module, f"{kind}_registry", None)  # PettingZoo's own: pettingzoo:classic/connect_four-v3
    if registry is not None and name in registry:
        other = getattr(module, "parallel_registry", {})
        return None if kind == "aec" and name in other else functools.partial(module.make, kind, name)
    target = getattr(module, name, None) if name.isidentifier() else None
    if target is None:
        try:
            target = importlib.import_module(f"{module_name}.{name}")
        except ImportError:
            return None
    if isinstance(target, type):
        try:
            import pettingzoo
        except ImportError:
            return None
        return target if issubclass(target, pettingzoo.ParallelEnv if kind == "parallel" else pettingzoo.AECEnv) \
            else None
    if kind == "aec" and callable(getattr(target, "parallel_env", None)):
        return None  # a parallel env: ParallelVector steps it
    factory = getattr(target, "parallel_env" if kind == "parallel" else "env", None)
    return factory if callable(factory) else None


def pettingzoo_vector(env_id: str):
    """What makes the vector of rows for a PettingZoo env id, called with (kwargs, num_envs): a
    ParallelVector, or a TurnVector for a turn-based env; a ParallelVector too for a gymnasium team
    env (envs/gym_teams.py: lbforaging:Foraging-8x8-2p-3f-v3). None when env_id names neither."""
    for cls in (ParallelVector, TurnVector):
        factory = pettingzoo_factory(env_id, cls.kind)
        if factory is not None:
            return functools.partial(cls, env_id, factory)
    factory = team_factory(env_id)
    return None if factory is None else functools.partial(ParallelVector, env_id, factory)


def _make(factory, env_id: str, kwargs: dict):
    try:
        return factory(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"env.kwargs: {env_id!r} rejected the keyword arguments {kwargs}: {exc}") from None


def _observation_leaf(space: gym.Space) -> tuple[gym.Space, bool]:
    """An agent's observation space, and whether it carries an action mask: the space inside
    PettingZoo's {"observation", "action_mask"} dict, or a dict's other keys beside its mask, or
    the space itself."""
    if isinstance(space, gym.spaces.Dict) and ACTION_MASK in space.spaces:
        rest = _without_mask(space.spaces)
        return (rest if isinstance(rest, gym.Space) else gym.spaces.Dict(rest)), True
    return space, False


def _without_mask(observation: dict):
    """An agent's observation dict (or its space's) without its action mask: PettingZoo's
    {"observation", "action_mask"} gives the observation, any other dict the rest of its keys."""
    if set(observation) == {"observation", ACTION_MASK}:
        return observation["observation"]
    return {k: v for k, v in observation.items() if k != ACTION_MASK}


def _state_dim(env, leaf: gym.Space) -> int:
    """The size of the env's global state (PettingZoo's state() and state_space), or 0 when it has
    none, or when rows are not flat (a state is appended to flat observations only)."""
    space = getattr(env, "state_space", None)
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1 or not isinstance(leaf, gym.spaces.Box) \
            or len(leaf.shape) != 1:
        return 0
    return int(space.shape[0])


def _with_state(leaf: gym.spaces.Box, env) -> gym.spaces.Box:
    """A row's space when the env's state follows the agent's observation."""
    state = env.state_space
    return gym.spaces.Box(np.concatenate([leaf.low, state.low]), np.concatenate([leaf.high, state.high]),
                          dtype=np.result_type(leaf.dtype, state.dtype))


def common_spaces(env, env_id: str) -> tuple[gym.Space, gym.Space, bool, np.ndarray]:
    """The observation space of every row (the observation leaf of a masked observation dict)
    and the action space, each agent's when they agree, else padded (see the module's docstring);
    whether the observation dicts carry masks; and each agent's own action count (0: Box
    actions). A ConfigError names agents whose spaces cannot share a row."""
    agents = list(env.possible_agents)
    leaves = [_observation_leaf(env.observation_space(a)) for a in agents]
    actions = [env.action_space(a) for a in agents]
    obs, act = leaves[0][0], actions[0]
    counts = np.array([int(getattr(a, "n", 0)) for a in actions], dtype=np.int64)
    if len({m for _, m in leaves}) > 1:
        raise ConfigError(f"env.id: some agents of {env_id!r} observe an action-mask dict and some do not")
    if all(leaf == obs for leaf, _ in leaves) and all(a == act for a in actions):
        return obs, act, leaves[0][1], counts
    other = next(i for i in range(1, len(agents)) if leaves[i][0] != obs or actions[i] != act)
    if not all(isinstance(leaf, gym.spaces.Box) and len(leaf.shape) == 1 for leaf, _ in leaves) or not all(
            isinstance(a, gym.spaces.Discrete) and int(a.start) == 0 for a in actions):
        raise ConfigError(f"env.id: the agents of {env_id!r} do not share one observation and action space "
                          f"({agents[0]}: {obs}, {act}; {agents[other]}: {leaves[other][0]}, {actions[other]}); "
                          f"agents that differ are padded to one row only with flat Box observations and "
                          f"Discrete actions")
    width = max(leaf.shape[0] for leaf, _ in leaves)
    low, high = np.full(width, np.inf), np.full(width, -np.inf)
    for leaf, _ in leaves:  # the padding itself is 0
        n = leaf.shape[0]
        low, high = np.minimum(low, np.r_[leaf.low, np.zeros(width - n)]), np.maximum(high, np.r_[leaf.high, np.zeros(width - n)])
    dtype = np.result_type(*[leaf.dtype for leaf, _ in leaves])
    return gym.spaces.Box(low.astype(dtype), high.astype(dtype), dtype=dtype), gym.spaces.Discrete(int(counts.max())), \
        leaves[0][1], counts


def episode_starts(done: np.ndarray, info: dict) -> np.ndarray:
    """The rows whose next observation begins an episode: those that ended in the step, and every
    row of an env that restarted (info[ENV_DONE]), since an agent that left early is not done again
    when its env restarts. What a recurrent policy's holder zeroes, and its trainer too."""
    restart = info.get(ENV_DONE)
    if restart is None or not restart.any():
        return done
    return done | np.repeat(restart, len(done) // len(restart))


class ParallelVector(gym.vector.VectorEnv):
    """`num_envs` PettingZoo parallel envs as num_envs x A rows (see the module's docstring), each
    made by `factory(**kwargs)` (pettingzoo_factory)."""

    kind = "parallel"
    # per row, besides its envs (hpcrl/envs/per_env.py); the rest is config or a step's scratch
    ROW_STATE = ("_obs", "_active", "_mask")

    def __init__(self, env_id: str, factory, kwargs: dict, num_envs: int, global_state: bool = False):
        """`global_state` (env.global_state): each row ends with the env's state(), where it has one."""
        self.envs = [_make(factory, env_id, kwargs) for _ in range(num_envs)]
        self.agents = list(self.envs[0].possible_agents)
        self.num_agents = len(self.agents)
        leaf, self.single_action_space, self._mask_in_obs, counts = common_spaces(self.envs[0], env_id)
        self.state_dim = _state_dim(self.envs[0], leaf) if global_state else 0
        self.single_observation_space = _with_state(leaf, self.envs[0]) if self.state_dim else leaf
        # Dict and Tuple observations: rows of each leaf (core/observations.py), no state appended
        self._layout = None if isinstance(leaf, gym.spaces.Box) else leaves_of(leaf, warn=lambda message: None)
        self._obs_dim = 0 if self._layout is not None else int(np.prod(leaf.shape))
        n_actions = int(getattr(self.single_action_space, "n", 0))
        # each agent's own actions (padded action spaces: the rest are masked out for it)
        self._own_actions = np.arange(n_actions)[None, :] < counts[:, None]
        self.masked = self._mask_in_obs or not self._own_actions.all()
        self.num_envs = num_envs * self.num_agents
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
        self._obs = zeros(self._layout, (self.num_envs,)) if self._layout is not None else \
            np.zeros((self.num_envs, *self.single_observation_space.shape), dtype=self.single_observation_space.dtype)
        self._active = np.zeros(self.num_envs, dtype=bool)
        self._mask = np.ones((self.num_envs, n_actions), dtype=bool)
        if not self.masked:  # masks in the infos instead? a first reset tells (the actors reset again, seeded)
            self.masked = any(ACTION_MASK in (info or {}) for info in self._reset_env(0, seed=0).values())

    def _rows(self, e: int) -> slice:
        return slice(e * self.num_agents, (e + 1) * self.num_agents)

    def _fill(self, e: int, observations: dict, infos: dict, acting=None) -> None:
        """Env e's rows from its agents' observations: agents absent from the dict are inactive, and
        so are those not in `acting` (default: the env's live agents)."""
        acting = self.envs[e].agents if acting is None else acting
        rows = self._rows(e)
        for leaf in leaves(self._obs):
            leaf[rows] = 0
        self._active[rows] = False
        self._mask[rows] = self._own_actions
        for i, agent in enumerate(self.agents):
            if agent not in observations:
                continue
            r, seen = rows.start + i, observations[agent]
            mask = seen[ACTION_MASK] if self._mask_in_obs else (infos.get(agent) or {}).get(ACTION_MASK)
            leaf = self._leaf(seen)
            if self._layout is not None:  # a Dict or Tuple observation: its leaves by key
                assign(self._obs, self._layout.flatten(leaf), r)
            elif np.ndim(leaf) == 1:  # flat: shorter (padded) agents leave zeros, the env state may follow
                self._obs[r, :len(leaf)] = leaf
            else:
                self._obs[r] = leaf
            self._active[r] = agent in acting
            self._set_mask(r, mask)
        if self.state_dim:  # the env's state after this step, on every row (the critic's input)
            self._obs[rows, self._obs_dim:] = self.envs[e].state()

    def _set_mask(self, r: int, mask) -> None:
        if mask is not None and self._active[r] and np.any(mask):
            self._mask[r, :len(mask)] = np.asarray(mask, dtype=bool)
            self._mask[r, len(mask):] = False

    def _leaf(self, seen):
        """An agent's observation without the action mask that may come with it."""
        return _without_mask(seen) if self._mask_in_obs else seen

    def _copy_obs(self, rows=slice(None)):
        return apply(lambda leaf: leaf[rows].copy(), self._obs)

    def _reset_env(self, e: int, seed: int | None = None) -> dict:
        """Env e anew; returns its agents' infos."""
        observations, infos = self.envs[e].reset(seed=seed)
        self._fill(e, observations, infos)
        return infos

    def reset(self, *, seed=None, options=None):
        seeds = seed if isinstance(seed, (list, tuple)) else [None if seed is None else seed + e
                                                              for e in range(len(self.envs))]
        for e, s in enumerate(seeds):
            self._reset_env(e, s)
        return self._copy_obs(), self._info()

    def _info(self) -> dict:
        return {ACTIVE: self._active.copy(), ACTION_MASK: self._mask.copy()}

    def step(self, actions):
        actions = np.asarray(actions)
        rewards, terminated, truncated, final_obs, ended, env_done = self._step_arrays()
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
                final_obs[r] = self._copy_obs(r)
            ended[done] = True
            if not env.agents:  # everyone has gone: a new episode at once (SAME_STEP)
                env_done[e] = True
                self._reset_env(e)
        return self._step_result(rewards, terminated, truncated, final_obs, ended, env_done)

    def _step_arrays(self):
        """A step's per-row rewards, terminated, truncated, final observations and ends, and its
        per-env restarts, all empty."""
        n = self.num_envs
        return (np.zeros(n, dtype=np.float64), np.zeros(n, dtype=bool), np.zeros(n, dtype=bool),
                np.empty(n, dtype=object), np.zeros(n, dtype=bool), np.zeros(len(self.envs), dtype=bool))

    def _step_result(self, rewards, terminated, truncated, final_obs, ended, env_done):
        info = {**self._info(), ENV_DONE: env_done}
        if ended.any():
            info["final_obs"], info["_final_obs"] = final_obs, ended
        return self._copy_obs(), rewards, terminated, truncated, info

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


class TurnVector(ParallelVector):
    """Turn-based PettingZoo (AEC) envs, such as board games, as rows: a vector step is one move in
    every env, made by the agent whose turn it is; the other agents' rows sit the step out
    (inactive) but still hold their current observation (what their critic bootstraps from) and
    get the rewards and ends the move brings them (an opponent's winning move). The trainers
    credit those to each agent's previous own move (algos/gae.py:OwnSteps). Agents whose game has
    ended are stepped out (PettingZoo's dead steps) at once; an env whose agents have all gone
    restarts in the same step."""

    kind = "aec"
    ROW_STATE = ParallelVector.ROW_STATE  # (its agent_selection lives in its envs)

    def _observe(self, e: int) -> None:
        env = self.envs[e]
        self._fill(e, {a: env.observe(a) for a in env.agents}, env.infos, acting={env.agent_selection})

    def _reset_env(self, e: int, seed: int | None = None) -> dict:
        self.envs[e].reset(seed=seed)
        self._observe(e)
        return self.envs[e].infos

    def step(self, actions):
        actions = np.asarray(actions)
        rewards, terminated, truncated, final_obs, ended, env_done = self._step_arrays()
        for e, env in enumerate(self.envs):
            start = e * self.num_agents
            mover = self.agents.index(env.agent_selection)
            env.step(actions[start + mover])
            while True:  # the move's rewards and ends, then the dead steps of agents it finished
                for i, agent in enumerate(self.agents):
                    r = start + i
                    rewards[r] += env.rewards.get(agent, 0.0)
                    if agent in env.agents and not ended[r] and (env.terminations[agent] or env.truncations[agent]):
                        terminated[r], truncated[r] = bool(env.terminations[agent]), bool(env.truncations[agent])
                        ended[r] = True
                        final_obs[r] = self._leaf(env.observe(agent))
                if not env.agents or not (env.terminations[env.agent_selection]
                                          or env.truncations[env.agent_selection]):
                    break
                env.step(None)
            if env.agents:
                self._observe(e)
            else:
                env_done[e] = True
                self._reset_env(e)
        return self._step_result(rewards, terminated, truncated, final_obs, ended, env_done)
