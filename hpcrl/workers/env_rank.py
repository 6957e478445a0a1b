"""Env rank (actor): steps its env groups in turns, asks a policy for actions, and ships records
to its trainers. What every algorithm's actor shares lives here: the groups (workers/env_group.py),
the poll loop and its double buffering, credits, the stop and goodbye sequence, the episode tally,
and serial snapshots. What a reply turns into, and the record it fills, is the algorithm's record
writer (a strategy, named per algorithm in core/dataflow.py): fragments for PPO, APPO, MAPPO and
IPPO (workers/fragment_writer.py), n-step transitions for Ape-X DQN (workers/transition_writer.py),
sequences for R2D2 (workers/sequence_writer.py).

Never imports torch: the policy is either remote (`RemotePolicy`, over MPI) or an inline policy
object handed in by the wiring (workers/policy_server.py), the only side that needs torch.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from hpcrl.core.config import Config
from hpcrl.core.layout import INLINE
from hpcrl.core.messages import KEEP_ENV_STATE, STOP, Message
from hpcrl.core.startup import CLOCK
from hpcrl.core.policies import row_policies
from hpcrl.envs import state
from hpcrl.io import env_states
from hpcrl.runtime.streams import SampleSender
from hpcrl.workers import env_deal
from hpcrl.workers.env_group import EnvGroup, EpisodeTally, Phase, RemotePolicy, make_groups
from hpcrl.core.say import say


class RecordWriter(Protocol):
    """How an env rank turns its policy's replies into records, and ships them. A writer is made
    from the config (`build(w)` from the wiring), then attached to its env rank: it steps the
    rank's groups, adds their episodes to the rank's tally, fills and sends the rank's records,
    and says what its envs are doing when a hang report asks (`stepping`)."""

    record_name: str  # what ships, for the status line
    in_turns: bool  # the rank hands it the groups' replies in turns (a record's rows in one order)

    def attach(self, env_rank: EnvRank) -> None:
        """Start recording `env_rank`'s groups (its groups, senders and tally exist)."""

    def full(self) -> bool:
        """The record must ship before any group steps on."""

    def take_reply(self, group: EnvGroup, reply: Message) -> None:
        """A reply to `group`'s request: step its envs (and ask again), or close its part of the record."""

    def stepping(self) -> str:
        """What its envs are doing, e.g. "stepping envs (step 12)": read only when a hang report asks."""

    def ship(self, header: dict) -> None:
        """Send the record(s) with the env rank's `header` fields and the tally's episode statistics."""

    def next_record(self) -> None:
        """The record has shipped and the tally is reset: begin the next one."""

    def between_records(self) -> bool:
        """No step has gone into a record since the last one shipped."""

    def serial_parts(self) -> dict | None:
        """Serial mode: the live objects a snapshot must hold besides the groups' (n-step windows,
        exploration generators), as `state.capture` reads them; None when the writer's state cannot
        be saved, so a serial resume starts new episodes."""


def _as_arrays(sampling_state):
    """A policy's sampling state as numpy arrays: a torch generator's state is a CPU byte tensor,
    which np.asarray views in place, so a restore writes into the tensor handed back to the policy."""
    if sampling_state is None:
        return None
    return {k: np.asarray(v) for k, v in sampling_state.items()} if isinstance(sampling_state, dict) \
        else np.asarray(sampling_state)


def _not_restored(why: str) -> None:
    say(f"warning: the checkpoint's env state was not restored: {why}; the resumed run starts new "
        f"episodes")


@dataclass
class ActorPlace:
    """Where an env rank starts in its run. `start_version`: the policy version it collects with
    first (a resume's). `fragments_per_version`: sync mode, records collected with each version
    (core/sizing.py Sizes.fragments_per_version). `control`: the rank's control stream, whose stop
    word ends the rollout (None: only a STOP reply does, as in tests that drive an actor alone).
    `agents`: the env's agent names, which cfg.policies maps to policies. `keep_state_in`: the run
    directory where the rank writes its state at the versions the learner root asks for, and at
    the stop (a sync run of several ranks with run.deterministic; io/env_states.py), of a layout
    of `env_ranks` env ranks."""

    start_version: int = 0
    fragments_per_version: int = 1
    control: object = None
    agents: tuple = ()
    keep_state_in: str | None = None
    env_ranks: int = 1


class EnvRank:
    """Steps `env.groups` groups of envs in turns and ships the records its writer fills. With
    PettingZoo envs each agent is a row of the vector (envs/multiagent.py), so a group's rows
    count agents, and a frame is still one env step.

    Sync mode: the rank collects `fragments_per_version` records (1 unless algo.batch_frames says
    more) with policy version v, then waits for v+1. Async mode: every request takes the newest
    version the policy has (at least the start version), and the rank never waits for the learner.
    """

    name = "env"

    def __init__(self, cfg: Config, rank: int, index: int, policies: list, senders: list[SampleSender],
                 writer: RecordWriter, place: ActorPlace | None = None):
        """`policies`: a policy channel per env group. `senders`: one per policy, to the trainer of
        that policy. `writer`: what the replies turn into (fragments, transitions or sequences).
        `place`: where in the run it starts (default: a fresh run, alone)."""
        place = place or ActorPlace()
        start_version, fragments_per_version, control = place.start_version, place.fragments_per_version, place.control
        agents, keep_state_in, env_ranks = place.agents, place.keep_state_in, place.env_ranks
        self.rank, self.index = rank, index
        self.control = control
        self.sync = cfg.algo.mode == "sync"
        self.senders = senders
        self.row_policy = row_policies(cfg.policies, agents, cfg.env.num_envs)  # of every row of the rank
        self.tally = EpisodeTally(len(senders))  # per policy, of its agents' episodes
        self.groups = make_groups(cfg, index, policies, self.row_policy, len(senders))
        # sync: the version this rollout must be collected with; async: the oldest version accepted
        self.version = start_version
        self.fragments_per_version = fragments_per_version
        self.version_fragments = 0  # sync: records sent with self.version so far
        self.done = False
        self.stopping = False  # the stop word is in: every group collects its STOP reply, then finish
        self.fragments_sent = 0
        self.said_goodbye = False
        self.credit_wait_since: float | None = None  # a finished record waits for a credit
        self.rollout_start = time.perf_counter()
        self.waited = 0.0  # seconds of this rollout in which every group was waiting for actions
        self.idle_since: float | None = None
        self.status = "starting"
        # the group whose reply is taken next, where the writer needs the groups in turns (sync
        # replay: a record's rows in one order); None: each as it arrives
        self.turn: int | None = None
        self.writer = writer
        writer.attach(self)
        if writer.in_turns:
            self.turn = 0
        # each group's action steps since the run began, which key its policy's draws: a sync run
        # (re)starts at a version's first record, of T steps each (a serial snapshot holds the count)
        for group in self.groups:
            group.steps = start_version * fragments_per_version * cfg.algo.rollout_length if self.sync else 0
        # serial mode with a replay ratio (launch/wiring.py): true while the trainer in this process
        # owes updates, and the actor waits, so every update finds it between records
        self.hold = None
        self.keep_state_in, self.env_ranks = keep_state_in, env_ranks
        self.first_env, self.num_envs = index * cfg.env.num_envs, cfg.env.num_envs  # (of the run's envs)
        self.keep_state_at: int | None = None  # the version at whose start the learner root asked for it
        self.kept_version: int | None = None  # the version of the state written last
        self.told_whole = False  # the note that its state is kept whole, not env by env, is out

    @classmethod
    def build(cls, w) -> EnvRank:
        """From the wiring (hpcrl.launch.wiring.Wiring): its policy (a policy server's channels, one
        per env group, or an inline policy), its senders to the trainers, and the algorithm's writer."""
        index = w.layout.index_in("env", w.rank)
        writer = w.parts.writer(w.cfg).build(w)
        keeps = env_states.wanted(w.cfg, w.layout.serial, w.member_label)
        actor = cls(w.cfg, w.rank, index, cls.policies(w, index), cls.senders(w, index), writer,
                    ActorPlace(w.start.start_version, w.sizes.fragments_per_version, w.control, w.spaces.agents,
                               keep_state_in=w.start.run_dir if keeps else None, env_ranks=len(w.layout.envs)))
        if keeps and w.start.resume_file:
            actor.resume_state(w.start.start_version, w.start.saved_layout)
        return actor

    @staticmethod
    def policies(w, index: int) -> list:
        """Env rank number `index`'s policy: its policy server's channels, one per env group, or
        an inline policy (with inference: {ranks: 0}, and in serial mode)."""
        server = int(w.layout.env_inference[index])
        if server == INLINE:
            from hpcrl.workers.policy_server import InlinePolicy  # torch: only env ranks that hold a policy
            return [InlinePolicy.build(w, index)]
        return [RemotePolicy(w.inference.client(server, group=g)) for g in range(w.groups)]

    @staticmethod
    def senders(w, index: int) -> list[SampleSender]:
        """Env rank number `index`'s ends of the sample streams: one per policy, to its trainer."""
        return [stream.sender(int(w.layout.env_learners[p, index])) for p, stream in enumerate(w.sample)]

    @property
    def status(self) -> str:
        """What this rank does or waits for (a hang report's line): while its envs step, the writer's."""
        return self._status if self._status is not None else self.writer.stepping()

    @status.setter
    def status(self, text: str) -> None:
        self._status = text

    def poll(self) -> int:
        if not self.stopping and self.control is not None and self.control.stopped:
            self.stopping = True
        if self.stopping:
            return self._stop_groups()
        if self.hold is not None and self.hold():
            self.status = "waiting for the updates its trainer owes the replay ratio (serial mode)"
            return 0
        work = 0
        for group in self.groups:
            if group.phase is Phase.READY:
                group.submit(self.version)
            work += self._poll_group(group)
            if self.stopping:
                return work + self._stop_groups()
        if self.writer.full():
            blocked = next((s for s in self.senders if not s.can_send()), None)
            if blocked is None:
                self._ship()
                work += 1
            else:  # flow control: a trainer has no free slot yet (a wait on a peer)
                if self.credit_wait_since is None:
                    self.credit_wait_since = time.perf_counter()
                    self.status = (f"waiting for a credit from its trainer (rank {blocked.peer}) to send "
                                   f"{self.writer.record_name}")
                return work
        self._account_wait(work)
        return work

    def _account_wait(self, work: int) -> None:
        """Time in which no group had anything to step (what double buffering is meant to hide)
        runs from the first poll that found nothing to the next reply."""
        if not work and self.idle_since is None:
            self.idle_since = time.perf_counter()
            self.status = f"waiting for actions (policy version {self.version}, step {self.groups[0].t})"

    def _reply_arrived(self) -> None:
        if self.idle_since is not None:
            self.waited += time.perf_counter() - self.idle_since
            self.idle_since = None

    def _poll_group(self, group: EnvGroup) -> int:
        if group.phase is not Phase.WAITING or self.writer.full():
            return 0  # a reply that came while the record is full waits in its buffer until it ships
        if self.turn is not None and group.index != self.turn:
            return 0  # it waits in its buffer for its turn
        reply = group.policy.poll()
        if reply is None:
            return 0
        self._reply_arrived()
        if reply.get("flags") & STOP:  # the policy side heard the stop word first
            group.phase = Phase.STOPPED
            self.stopping = True
            return 1
        group.phase = Phase.READY
        if reply.get("flags") & KEEP_ENV_STATE and self.keep_state_in is not None:
            self.keep_state_at = self.version + 1  # a checkpoint of that version follows
        if self.sync and reply.get("version") != self.version:
            raise RuntimeError(f"env rank {self.rank}: sync mode got actions from policy version "
                               f"{reply.get('version')} while collecting with version {self.version}")
        self._status = None  # the writer's envs step: it says which step when asked
        self.writer.take_reply(group, reply)
        if self.turn is not None:
            self.turn = (self.turn + 1) % len(self.groups)
        CLOCK.mark("first_step")
        return 1

    def _ship(self) -> None:
        if self.sync and self.keep_state_at == self.version + 1 and \
                self.version_fragments + 1 == self.fragments_per_version:
            # this record ends the version: the state at the next one's start goes to disk first, so
            # it is there before the update on this record, after which the checkpoint names it
            self._keep_state(self.version + 1, fragments_sent=self.fragments_sent + 1)
        now = time.perf_counter()
        credit_wait = now - self.credit_wait_since if self.credit_wait_since is not None else 0.0
        self.credit_wait_since = None
        self.writer.ship(dict(env_rank=self.rank, index=self.fragments_sent, flags=0,
                              rollout_us=int(1e6 * (now - self.rollout_start)), wait_us=int(1e6 * self.waited),
                              credit_wait_us=int(1e6 * credit_wait)))
        self.fragments_sent += 1
        if self.sync:  # the next version only once this one's share of the batch is sent
            self.version_fragments += 1
            if self.version_fragments == self.fragments_per_version:
                self.version, self.version_fragments = self.version + 1, 0
        self.rollout_start, self.waited = time.perf_counter(), 0.0
        self.tally.reset()
        self.writer.next_record()

    def _stop_groups(self) -> int:
        """The inference side answers one request per group with STOP before it closes: make sure
        every group has asked (again, if its last reply was an ordinary one) and had that answer."""
        work = 0
        for group in self.groups:
            if group.phase is Phase.STOPPED:
                continue
            if group.phase is not Phase.WAITING:
                group.submit(self.version)
                continue
            reply = group.policy.poll()
            if reply is not None:
                group.phase = Phase.STOPPED if reply.get("flags") & STOP else Phase.READY
                work += 1
        if all(g.phase is Phase.STOPPED for g in self.groups):
            work += self._say_goodbye()
        return work

    def _say_goodbye(self) -> int:
        """The last record to the trainer (it needs a credit like any other), then wait for the
        trainer's farewell, after which no message to this rank is in flight."""
        if not self.said_goodbye:
            if self.keep_state_in is not None and self.kept_version != self.version and self.version_fragments == 0 \
                    and self.between_records():
                self._keep_state(self.version, self.fragments_sent)  # where the stop's checkpoint resumes
            if not all(s.can_send() for s in self.senders):
                self.status = "stopping: waiting for a credit to say goodbye to the trainer"
                return 0
            for sender in self.senders:
                sender.say_goodbye(self.rank)
            self.said_goodbye = True
            self.status = "stopping: waiting for the trainer's farewell"
            return 1
        if not all(s.closed() for s in self.senders):
            return 0
        if not all(group.policy.finished() for group in self.groups):  # inline: the weights' END
            self.status = "stopping: waiting for the parameter stream's last version"
            return 0
        self._finish()
        return 1

    def _saved_parts(self) -> tuple[dict, list]:
        """What a serial checkpoint holds of this rank, as the live objects and arrays themselves:
        `state.capture` reads them and `state.restore` writes into them. Also each group's policy
        sampling state as the policy gives it (`parts` views its arrays)."""
        sampling = [g.policy.sampling_state() for g in self.groups]
        parts = {"groups": [{"envs": g.envs, "obs": g.request["obs"], "ep_return": g.ep_return,
                             "ep_length": g.ep_length, "active": g.active,
                             "mask": g.request["action_mask"] if g.masked else None,
                             "starts": g.request["starts"] if g.recurrent else None,
                             "sampling": _as_arrays(s), "steps": g.next_step(),
                             # self-play: the seats' draws, games and win rates (absent without a pool,
                             # so the checkpoints of other runs keep their layout)
                             **({"seats": g.seats.saved_parts()} if g.seats is not None else {})}
                            for g, s in zip(self.groups, sampling)],
                 "version": self.version, "version_fragments": self.version_fragments,
                 "fragments_sent": self.fragments_sent}
        if writer := self.writer.serial_parts():  # (absent where empty: older checkpoints keep their layout)
            parts["writer"] = writer
        return parts, sampling

    def between_records(self) -> bool:
        """Serial mode: no step has gone into a record since the last one shipped (the point a
        snapshot holds, and an uninterrupted run passes through)."""
        return self.writer.between_records()

    def _keep_state(self, version: int, fragments_sent: int) -> None:
        """Write this rank's state as it stands at version `version`'s start (the records of the
        version before are all collected) to the run directory (hpcrl/io/env_states.py): env by env
        where it can be (workers/env_deal.py), so a resume on any number of env ranks continues it,
        else whole, for a resume on this layout."""
        self.kept_version = version
        writer_parts = self.writer.serial_parts()
        if writer_parts is None or (any(g.recurrent for g in self.groups) and
                                    isinstance(self.groups[0].policy, RemotePolicy)):
            return self._cannot_keep("its record writer's or its policy servers' state (recurrent) is not saved")
        why_whole = env_deal.why_not(self.groups, writer_parts)
        try:
            if not why_whole:
                env_states.keep_envs(self.keep_state_in, self.index, version, env_deal.capture(self.groups),
                                     self.first_env, self.env_ranks, fragments_sent)
                return
            parts = self._saved_parts()[0]  # (at a version's last record, whose shipping changes only these counters)
            parts.update(version=version, version_fragments=0, fragments_sent=fragments_sent)
            snapshot = state.as_record(parts)
        except state.NotCapturable as exc:
            return self._cannot_keep(str(exc))
        if self.index == 0 and not self.told_whole:
            say(f"note: env ranks save their state whole ({why_whole}): a resume continues exactly on "
                f"{self.env_ranks} env ranks only")
        self.told_whole = True
        env_states.keep(self.keep_state_in, self.index, version, snapshot, self.env_ranks)

    def _cannot_keep(self, why: str) -> None:
        if self.index == 0:  # (every env rank has the same reason)
            say(f"warning: env ranks cannot save their state ({why}); a resumed run starts new "
                f"episodes, so it does not repeat the uninterrupted run exactly")
        self.keep_state_in = None

    def resume_state(self, version: int, saved_layout: tuple[int, int] | None) -> None:
        """A resume from the checkpoint of `version`, written by a layout of `saved_layout` = (env
        ranks, envs in all; None: this one): continue from the state of this rank's envs at its start."""
        kind, saved, why = env_states.load(self.keep_state_in, version, self.index, self.first_env, self.num_envs,
                                           self.env_ranks, saved_layout or (self.env_ranks, self.env_ranks * self.num_envs))
        if kind == env_states.WHOLE:
            return self.restore(saved)
        if kind == env_states.PER_ENV:
            try:
                env_deal.restore(self.groups, saved)
            except (state.StateMismatch, UnicodeDecodeError, TypeError) as exc:
                why = str(exc)
            else:
                self.version, self.version_fragments, self.fragments_sent = version, 0, saved["fragments_sent"]
                return
        if self.index == 0 or kind:
            _not_restored(why)

    def snapshot(self) -> dict:
        """Serial mode: everything needed to continue exactly, taken between records (when the
        learner checkpoints), as data the checkpoint stores without pickle (`state.as_record`).
        NotCapturable for envs whose state is not plain data."""
        if not self.between_records():
            raise RuntimeError("env snapshots are taken between records")
        return state.as_record(self._saved_parts()[0])

    def restore(self, saved) -> None:
        """Continue from a snapshot into the envs this run built from its config. One that cannot
        be restored leaves every group as built (new episodes, as an MPI run resumes) with a warning."""
        if not isinstance(saved, dict):  # a uint8 array: the pickle that older checkpoints held
            return _not_restored("it is in the old pickled format, which runs code when loaded, so it was not loaded")
        parts, sampling = self._saved_parts()
        try:
            state.planned_record(parts, saved)()
        except (state.StateMismatch, UnicodeDecodeError, TypeError) as exc:
            return _not_restored(str(exc))
        for group, policy_state in zip(self.groups, sampling):
            group.policy.restore_sampling_state(policy_state)  # its arrays were written in place
        self.version, self.fragments_sent = parts["version"], parts["fragments_sent"]
        self.version_fragments = parts["version_fragments"]
        for group, saved in zip(self.groups, parts["groups"]):
            group.steps = saved["steps"]

    def _finish(self) -> None:
        for sender in self.senders:
            sender.close()
        for group in self.groups:
            group.policy.close()
            group.envs.close()
        self.done = True
        self.status = "finished"
