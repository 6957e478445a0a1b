"""VDN's and QMIX's record writer (an env rank's): episodes of whole teams, stored whole (PyMARL's
episode buffer) for the trainers' replay shards. Exploration and shipping are every DQN writer's
(workers/replay_writer.py): epsilon-greedy per agent row on the Q-values of the agents' networks.

Each env of a group keeps its episode in progress: every agent's observations, actions and
recurrent states, and the team's reward per step (the sum, or the mean, of its agents'). An
episode is emitted as one row of the record when it ends, its final observation after its last
step (a time limit bootstraps from it with algo.team.time_limit_bootstraps, else it is stored as
a termination, which does not), or after algo.team.episode_length
steps, with the next observation after them: the episode goes on in a new chunk, which starts
from the agents' states at that step. A chunk's steps past its episode's end are padding
(`filled` says which are not).

Never imports torch: the policy holder keeps every row's hidden state and zeroes it when an
episode begins (the request's `starts`), and each reply carries the states its Q-values came from.
"""
from __future__ import annotations

import numpy as np

from hpcrl.core.messages import Message
from hpcrl.core.observations import assign, fit
from hpcrl.envs.multiagent import ENV_DONE
from hpcrl.workers.action_writer import UNKNOWN_PRIORITY
from hpcrl.workers.env_group import EnvGroup
from hpcrl.workers.replay_writer import RecordRows, ReplayWriter


class TeamEpisodes:
    """The episode in progress of each of a group's E envs (A agents each), up to L steps: `t[e]`
    is env e's next step in it. Observations are flat rows (models/team.py reads no others)."""

    def __init__(self, cfg, envs: int, agents: int, obs: np.ndarray, action_dtype, state_size: int):
        """`obs`: one step's observations (a request's rows [E * A, W]), for their shape and dtype."""
        team = cfg.algo.team
        self.L, self.agents, self.mean = team.episode_length, agents, team.reward == "mean"
        self.time_limit_ends = not team.time_limit_bootstraps  # a truncated episode counts as terminated
        L = self.L
        self.obs = np.zeros((envs, L + 1, agents, *obs.shape[1:]), dtype=obs.dtype)
        self.actions = np.zeros((envs, L, agents), dtype=action_dtype)
        self.rewards = np.zeros((envs, L), dtype=np.float32)
        self.terminated = np.zeros((envs, L), dtype=np.uint8)
        self.filled = np.zeros((envs, L), dtype=np.uint8)
        self.state0 = np.zeros((envs, agents * state_size), dtype=np.float32)
        self.t = np.zeros(envs, dtype=np.int64)
        self.envs = np.arange(envs)
        self.emitted = 0  # episodes (and chunks) so far

    def observe(self, obs: np.ndarray, state: np.ndarray | None) -> None:
        """Every env's observations at its step t, and where a chunk begins, the states its agents start from."""
        self.obs[self.envs, self.t] = obs.reshape(len(self.envs), self.agents, *obs.shape[1:])
        first = self.t == 0
        if state is not None and first.any():
            self.state0[first] = state.reshape(len(self.envs), -1)[first]

    def acted(self, actions: np.ndarray) -> None:
        self.actions[self.envs, self.t] = actions.reshape(len(self.envs), self.agents)

    def stepped(self, rewards: np.ndarray, terminated: np.ndarray, info: dict, obs: np.ndarray,
                out: RecordRows) -> None:
        """Step t's rewards and terminations of every row, then the chunks this step ends into `out`: those
        of the envs that ended (restarted, info[ENV_DONE]) with their agents' final observations, and
        those that reached L steps with `obs`, the envs' next observations (rows [E * A, W])."""
        E, a = len(self.envs), self.agents
        ended = info[ENV_DONE]
        team = rewards.reshape(E, a)
        self.rewards[self.envs, self.t] = team.mean(1) if self.mean else team.sum(1)
        self.terminated[self.envs, self.t] = ended & (terminated.reshape(E, a).any(1) | self.time_limit_ends)
        self.filled[self.envs, self.t] = 1
        self.t += 1
        done = np.flatnonzero(ended | (self.t == self.L))
        for e in done:
            rows = np.arange(e * a, (e + 1) * a)
            last = obs[rows]  # (a copy) the next chunk's first observation; or, if the episode ended, its final one
            if ended[e]:
                for i, r in enumerate(rows):
                    if info["_final_obs"][r]:  # (an agent that left before the end keeps its last observation)
                        last[i] = info["final_obs"][r]
            self.obs[e, self.t[e]] = last
        if len(done):
            self.emit(done, out)

    def emit(self, envs: np.ndarray, out: RecordRows) -> None:
        """The chunks of `envs` into the record, then empty for their next ones."""
        fields = dict(obs=self.obs[envs], actions=self.actions[envs], rewards=self.rewards[envs],
                      terminated=self.terminated[envs], filled=self.filled[envs])
        if "state0" in out.record.arrays:
            fields["state0"] = self.state0[envs]
        out.write_fields(np.full(len(envs), UNKNOWN_PRIORITY, dtype=np.float32), **fields)
        for steps in (self.obs, self.actions, self.rewards, self.terminated, self.filled):
            steps[envs] = 0
        self.t[envs] = 0
        self.emitted += len(envs)


class TeamWriter(ReplayWriter):
    """VDN's and QMIX's records: a record carries the episodes (and chunks) that end in its steps,
    at most one per env and step, and ships once another group step might not fit."""

    record_name = "team episodes"
    exploration = "team"

    def attach(self, env_rank) -> None:
        super().attach(env_rank)
        actions = self.record["actions"]
        self.agents = actions.shape[2]
        envs = self.per_group // self.agents
        self.frames_per_step = envs  # a frame is an env step: all its agents act in it
        self.rows_per_step = envs  # a group's step ends at most one chunk per env
        state_size = self.record["state0"].shape[1] // self.agents if "state0" in self.record.arrays else 0
        self.episodes = [TeamEpisodes(self.cfg, envs, self.agents, g.request["obs"], actions.dtype, state_size)
                         for g in self.groups]

    def stepping(self) -> str:
        window = self.stepping_window
        return "stepping envs" if window is None else f"stepping envs (episode {window.emitted})"

    def serial_parts(self) -> dict | None:
        """The exploration generator and every env's episode in progress."""
        return {"rng": self.rng, "episodes": self.episodes}

    def step(self, group: EnvGroup, reply: Message) -> None:
        episodes, q = self.episodes[group.index], reply["q"]
        episodes.observe(group.request["obs"], reply["state"] if "state" in reply.arrays else None)
        actions = self.explore(group, q)
        episodes.acted(actions)
        self.stepping_window = episodes
        next_obs, rewards, terminated, truncated, info = group.envs.step(actions)
        obs = fit(group.request["obs"], next_obs)
        episodes.stepped(rewards, terminated, info, obs, self.out)
        assign(group.request["obs"], obs)
        self.tally.add(group, rewards, terminated | truncated, info)
        if group.recurrent:  # the holder zeroes the states of every agent of an env that restarted
            group.request["starts"][...] = np.repeat(info[ENV_DONE], self.agents)
