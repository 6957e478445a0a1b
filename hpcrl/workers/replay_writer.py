"""What DQN's record writers share (Ape-X's n-step transitions, workers/transition_writer.py, and
R2D2's sequences, workers/sequence_writer.py): epsilon-greedy exploration on the Q-values a reply
brings, and records of rows for the trainers' replay shards, shipped once another group step
might not fit.

Never imports torch: the Q-values arrive as numpy (from a policy server, or from the inline
policy the wiring hands in), and everything here is numpy.
"""
from __future__ import annotations

import numpy as np

from hpcrl.algos.exploration import apex_epsilons, linear_epsilon
from hpcrl.core.config import Config
from hpcrl.core.messages import Message
from hpcrl.core.observations import assign
from hpcrl.core.observations import count_rows
from hpcrl.core.seeds import seed_for
from hpcrl.workers.env_group import EnvGroup, Phase


class RecordRows:
    """Appends rows (transitions, or R2D2's sequences) to the record being filled (a sample-stream buffer)."""

    def __init__(self, record):
        self.record, self.rows = record, 0
        self.capacity = record["priorities"].shape[0]

    def room(self) -> int:
        return self.capacity - self.rows

    def write(self, obs, actions, returns, discounts, next_obs, priorities) -> None:
        """One or more n-step transitions."""
        self.write_fields(obs=obs, actions=actions, returns=returns, discounts=discounts, next_obs=next_obs,
                          priorities=priorities)

    def write_fields(self, priorities: np.ndarray, **fields) -> None:
        """len(priorities) rows of the record's fields, by name."""
        a, b = self.rows, self.rows + len(priorities)
        self.record["priorities"][a:b] = priorities
        for name, values in fields.items():
            assign(self.record[name], values, slice(a, b))  # observations may be Dict leaves
        self.rows = b


class ReplayWriter:
    """A DQN record writer: each reply's Q-values choose the group's actions (greedy, or uniform with
    each env's epsilon), `step` turns them into rows, and the group asks again at once. The record
    ships once it has no room for `rows_per_step` more rows (the most one group step may write).

    Sync mode (algo.mode sync, a round per policy version): a record is exactly rollout_length
    steps of every group, taken in turns (group 0, 1, ..., 0, ...), so that its rows and the
    exploration draws come in one order whatever the order the replies arrive in. A group that has
    taken its rollout_length steps asks again only once the record has shipped, for the next version.
    """

    record_name = "transitions"
    rows_class = RecordRows  # what appends rows to a record
    exploration = "dqn"  # the algo section of its epsilon keys (core/config_dqn.py EpsilonGreedy)

    def __init__(self, cfg: Config, env_ranks: int = 1, frames: int = 0):
        """`env_ranks`: the run's, over which Ape-X spreads its epsilons. `frames`: this rank's env
        steps so far (a resume's share of the run's frames), where linear epsilon continues from."""
        self.cfg, self.dqn = cfg, getattr(cfg.algo, self.exploration)
        self.env_ranks = env_ranks
        self.frames = frames  # env steps of this rank
        self.record_frames = 0  # env steps since the last record shipped
        self.record_version = -1  # the policy version of the record's first step
        self.sync = cfg.algo.mode == "sync"
        self.T = cfg.algo.rollout_length  # sync: each group's steps per record
        self.stepping_window = None  # the window of the group whose envs step now (a hang report's)

    @classmethod
    def build(cls, w) -> ReplayWriter:
        """From the wiring (hpcrl.launch.wiring.Wiring): the env-rank count and where a resume starts."""
        env_ranks = len(w.layout.envs)
        return cls(w.cfg, env_ranks=env_ranks, frames=w.start.start_frames // env_ranks)

    def stepping(self) -> str:
        window = self.stepping_window
        return "stepping envs" if window is None else f"stepping envs (step {window.t})"

    def attach(self, env_rank) -> None:
        self.env_rank, self.groups, self.tally = env_rank, env_rank.groups, env_rank.tally
        self.sender = env_rank.senders[0]
        self.per_group = count_rows(self.groups[0].request["obs"])
        self.frames_per_step = self.per_group  # env steps of a group step (a team's rows step as one env)
        n = self.per_group * len(self.groups)  # the rank's envs
        self.rng = np.random.default_rng(seed_for(self.cfg.run.seed, "explore", env_rank.index))
        # apex: this rank's envs are numbers index*n .. index*n+n-1 of every env rank's envs
        d, index = self.dqn, env_rank.index
        self.epsilons = apex_epsilons(d.eps, d.eps_alpha, self.env_ranks * n)[index * n:(index + 1) * n]
        self.record = self.sender.current()
        self.out = self.rows_class(self.record)
        self.taken = [0] * len(self.groups)  # sync: each group's steps in this record

    def epsilon(self, group: EnvGroup) -> np.ndarray:
        """The exploration of `group`'s envs now."""
        if self.dqn.eps_schedule == "apex":
            return self.epsilons[group.columns]
        # linear: every env rank's frames, estimated from this rank's (the env ranks run alike)
        return np.full(self.per_group, linear_epsilon(self.dqn, self.frames * self.env_ranks))

    def explore(self, group: EnvGroup, q: np.ndarray) -> np.ndarray:
        """`group`'s actions on its Q-values `q` [envs, actions]: greedy, or uniform with each env's epsilon."""
        explore = self.rng.random(self.per_group) < self.epsilon(group)
        return np.where(explore, self.rng.integers(q.shape[1], size=self.per_group), q.argmax(1))

    def full(self) -> bool:
        """No group may step on until the record ships: another step might not fit (sync: every
        group has taken its rollout_length steps)."""
        if self.sync:
            return all(taken == self.T for taken in self.taken)
        return self.out.room() < self.rows_per_step

    @property
    def in_turns(self) -> bool:
        """Sync: the groups' replies are taken in turns, so a record's rows come in one order."""
        return self.sync

    def take_reply(self, group: EnvGroup, reply: Message) -> None:
        if self.record_version < 0:
            self.record_version = reply.get("version")
        self.step(group, reply)
        self.frames += self.frames_per_step
        self.record_frames += self.frames_per_step
        self.taken[group.index] += 1
        if self.sync and self.taken[group.index] == self.T:
            group.phase = Phase.AT_END  # its next step is the next record's, with the next version
            return
        group.submit(self.env_rank.version)  # at once: its round trip overlaps the other groups' steps

    def step(self, group: EnvGroup, reply: Message) -> None:
        """Act on the reply's Q-values, step the group's envs, write the rows that completes."""
        raise NotImplementedError

    def ship(self, header: dict) -> None:
        self.record.set(**header, version=max(self.record_version, 0), frames=self.record_frames,
                        count=self.out.rows)
        self.record["episode_stats"][:] = self.tally.stats[0]
        self.record = self.sender.send()
        self.out = self.rows_class(self.record)
        self.record_frames, self.record_version = 0, -1

    def next_record(self) -> None:
        """Async: every group asked again at its last reply. Sync: they ask now, for the next version."""
        self.taken = [0] * len(self.groups)
        if self.sync:
            for group in self.groups:
                group.phase = Phase.READY

    def between_records(self) -> bool:
        return self.record_frames == 0

    def serial_parts(self) -> dict | None:
        """The exploration generator and the n-step windows (the envs' last steps, whose
        transitions the next records complete)."""
        return {"rng": self.rng, "windows": self.windows}
