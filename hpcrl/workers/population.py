"""Population-based training between members: each member's learner root reports its
fitness to the population root, which decides exploit and explore (workers/population_root.py,
core/population.py) and orders the copies; the states travel in memory between the learner
roots (runtime/member_copy.py).

- `MemberLink`, on each member's learner root: after every `ready_frames` of its member's
  training it reports (its frames, fitness and live hyperparameters: a resumed member's come from
  its checkpoint, so the root never guesses them); it serves the root's orders between updates
  (the trainer calls `between_updates`; in rounds it waits there for the round's end), and by
  itself once its member has stopped, until the root's farewell: a stopped member may still be
  a parent.
- `PopulationRole`: the worker the poll loop polls on a member's learner root (the link, and on
  the population root the `Decider`), alive until every member has stopped and said goodbye.

No copy waits on another in a cycle: each member serves its orders in the order the root issued
them, so a copy waits only for copies issued before it.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from hpcrl.core.stop import StopReason
from hpcrl.runtime.member_copy import MemberState, PopulationChannel
from hpcrl.workers.league import SNAPSHOT_ORDERS, SNAPSHOT_RECEIVE, SNAPSHOT_RESTART, SNAPSHOT_SEND, LeagueMember
from hpcrl.workers.population_root import ABORT, DONE, END_ROUND, READY, RECEIVE, SEND, Decider

NAN_PATIENCE = 3  # ready_frames a member with no finished episode waits for one before it is judged
HOLD_SLEEP_S = 1e-3  # between tests of a member waiting for its round's end (synchronous)
WAIT_TICK_S = 1.0  # a root waiting for other members to finish counts as working this often (watchdog)


@dataclass
class Adoption:
    """What a member took in a copy: its parent, the parent's trainer-step state, and its new
    hyperparameters (algo keys without the 'algo.' prefix)."""

    parent: int
    step_state: dict
    hyperparameters: dict[str, float]
    # the parents of earlier copies served between the same two updates, which this one replaced
    # before the member trained on them (each was taken, and counts as taken in the lineage)
    replaced: tuple[int, ...] = ()


class MemberLink:
    def __init__(self, channel: PopulationChannel, ready_frames: int, live: tuple[str, ...], start_frames: int = 0,
                 synchronous: bool = False, waiting_round: int = 0, league: LeagueMember | None = None):
        """`live`: the algorithm's live keys (without 'algo.'), in the order every message uses.
        `synchronous`: rounds at every multiple of `ready_frames`, each waited for (population.
        synchronous); `waiting_round`: the round a resumed member was waiting in when it stopped.
        `league`: a league member's snapshots and slots (workers/league.py)."""
        self.channel, self.live, self.ready_frames = channel, live, ready_frames
        self.league = league
        self.synchronous, self.waiting_round = synchronous, waiting_round
        self.waiting_fitness = math.nan  # its fitness at the report it waits after
        self._ready_from(start_frames)
        self.stopped = False  # DONE was sent
        self.farewell = False
        self.taken = 0  # copies this member took (before it stopped)
        self.pause_s = 0.0  # seconds spent in copies, sending or receiving (metrics: exploit_pause_s)
        self._round_over = self._aborted = False
        self.decider = None  # on the population root: polled while this member waits in a round

    def state(self) -> dict[str, float]:
        """What its learner root's checkpoint keeps (the part 'population'): the round it was
        waiting in when it stopped (0: none), and its fitness there (which a packed launch reports
        for it: launch/packed.py)."""
        if not self.waiting_round:
            return {"waiting_round": 0}
        return {"waiting_round": self.waiting_round, "fitness": self.waiting_fitness}

    def restore(self, state: dict) -> None:
        # (a packed member's turn marks its round as turn_round: that launch's own count, not read here)
        self.waiting_round = int(state.get("waiting_round", 0)) if self.synchronous else 0

    def _ready_from(self, frames: int) -> None:
        """The next judgement: after `ready_frames` more; synchronous, at the next multiple of it.
        A member none of whose episodes has ended by then (its fitness NaN: right after a copy,
        episodes may be longer than ready_frames) waits for one, up to NAN_PATIENCE more
        ready_frames, before it is judged as it is (not in rounds, which wait for nobody)."""
        self.ready_at = ((frames // self.ready_frames + 1) * self.ready_frames if self.synchronous
                         else frames + self.ready_frames)
        self.patience_at = self.ready_at + (0 if self.synchronous else NAN_PATIENCE * self.ready_frames)

    def report(self, kind: float, trainer, frames: int, fitness: float, round_: int = 0,
                preempted: bool = False, resumed: bool = False) -> None:
        hyper = [float(getattr(trainer.cfg.algo, k)) if trainer is not None else math.nan for k in self.live]
        league = self.league.report_part() if self.league is not None else []
        self.channel.report([kind, frames, fitness, -1 if resumed else self.taken, round_, preempted, *hyper, *league])

    def between_updates(self, trainer, frames: int, fitness: float, code: int) -> tuple[Adoption | None, bool]:
        """After an update of the trainer root, before its checkpoint: report when due (DONE when
        the update's stop `code` says the run stops), then serve every order that has come;
        synchronous, wait for the round's end. (The adoption, when this member took a copy;
        whether it was preempted while it waited: it stops, and its checkpoint says the round.)"""
        reset = None
        if self.league is not None and not code:
            self.league.add_games(trainer.stats.pool_games)
            if self.league.snapshot_due(frames) and self.league.take_snapshot(trainer.member.copy_params, frames):
                reset = trainer.member.reset_to()  # an exploiter starts again from its initial weights (core/league.py)
        if code and not self.stopped:
            self.report(DONE, trainer, frames, fitness, preempted=code == StopReason.PREEMPTED)
            self.stopped = True
        elif not code and frames >= self.ready_at and (not math.isnan(fitness) or frames >= self.patience_at
                                                       or self.league is not None):  # (a league copies none)
            round_ = frames // self.ready_frames if self.synchronous else 0
            self.report(READY, trainer, frames, fitness, round_)
            self._ready_from(frames)
            if self.synchronous:
                adopted, preempted = self.hold(trainer, round_, frames, fitness)
                return adopted or reset, preempted
        return self.serve(trainer) or reset, False

    def resume_round(self, trainer, frames: int, fitness: float) -> None:
        """A member that stopped while waiting in a round takes that round up again before it
        trains on: the same report, the same decisions (the population root resumed its state)."""
        round_, self.waiting_round = self.waiting_round, 0
        self.report(READY, trainer, frames, fitness, round_)
        adoption, _ = self.hold(trainer, round_, frames, fitness)
        if adoption is not None:
            trainer.member.adopt_before_training(adoption)

    def hold(self, trainer, round_: int, frames: int, fitness: float) -> tuple[Adoption | None, bool]:
        """Synchronous: serve orders until the population root ends this member's round. A
        preemption meanwhile (of this member, or of another: the root aborts the round) stops it
        here, at the round, and its checkpoint says so (`waiting_round`)."""
        adopted = None
        while True:
            if self.decider is not None:  # (this rank ends the rounds)
                self.decider.poll()
            adopted = self.serve(trainer) or adopted
            if self._round_over:
                self._round_over = False
                return adopted, False
            if self._aborted or trainer.preempt_requested():
                self.report(DONE, trainer, frames, fitness, round_, preempted=True)
                self.stopped, self.waiting_round, self.waiting_fitness = True, round_, fitness
                return None, True
            trainer.heartbeat()  # waiting for the other members is not a hang
            time.sleep(HOLD_SLEEP_S)

    def serve(self, trainer) -> Adoption | None:
        """Every order that has come, in order: send this member's state, overwrite it with
        another's, the end of a round (or its abort), or the farewell. Once stopped, a member
        takes no copy: the state it is sent is received and dropped, so what it holds (and sends
        as a parent) stays what its last checkpoint holds; the root learns which copies it
        missed from its DONE report."""
        adopted = None
        while (order := self.channel.next_order()) is not None:
            kind, peer = order[0], int(order[1])
            start = time.perf_counter()
            if kind == SEND:
                self.channel.send_state(trainer.member.member_state(), peer)
                self.channel.send_step_state(trainer.step.state(), peer)
            elif kind == RECEIVE and self.stopped:
                mine = trainer.member.member_state()
                self.channel.receive_state(MemberState([np.empty_like(a) for a in mine.arrays]), peer)
                self.channel.receive_step_state(peer)
            elif kind == RECEIVE:
                self.channel.receive_state(trainer.member.member_state(), peer)
                earlier = () if adopted is None else (*adopted.replaced, adopted.parent)
                adopted = Adoption(peer, self.channel.receive_step_state(peer),
                                   dict(zip(self.live, (float(v) for v in order[2:]))), earlier)
                self._ready_from(trainer.frames)
                self.taken += 1
            elif kind == SNAPSHOT_RESTART:
                adopted = self._restart(trainer, int(order[1])) or adopted
            elif kind in SNAPSHOT_ORDERS:
                self._serve_snapshot(order)
            elif kind == END_ROUND:
                self._round_over = True
            elif kind == ABORT:
                self._aborted = True
            else:
                self.farewell = True
            self.pause_s += time.perf_counter() - start
        return adopted

    def _restart(self, trainer, owner: int) -> Adoption | None:
        """An exploiter starts again from main agent `owner`'s newest snapshot (population.league.
        restart 'main'): its weights and normalisers, a fresh optimizer and step state, as a start
        again from its initial weights. Once stopped, received and dropped."""
        weights = np.empty_like(self.league.slot_params[0])  # (rare: once per exploiter snapshot at most)
        self.channel.receive_state(MemberState([weights]), owner)
        if self.stopped:
            return None
        self.league.restarted(trainer.frames)
        return trainer.member.reset_to(weights, owner)

    def _serve_snapshot(self, order: np.ndarray) -> None:
        """A league snapshot's move: send one of this member's, take one into a slot, or copy
        one of its own into a slot (workers/league.py)."""
        kind, league = order[0], self.league
        if kind == SNAPSHOT_SEND:
            self.channel.send_state(MemberState([league.snapshot(int(order[2]))]), int(order[1]))
        elif kind == SNAPSHOT_RECEIVE:
            slot = int(order[2])
            self.channel.receive_state(MemberState([league.slot_params[slot]]), int(order[1]))
            league.set_slot(slot, int(order[3]))
        else:
            league.set_slot(int(order[1]), int(order[2]), league.snapshot(int(order[3])))


class PopulationRole:
    """The poll loop's worker on a member's learner root: the link once its member has stopped
    (before that the trainer serves the orders between updates), and the decider on the root.
    `trainer` None: a member whose run was complete before this launch (it only says so)."""

    name = "population"

    def __init__(self, link: MemberLink, trainer, decider: Decider | None = None):
        self.link, self.trainer, self.decider = link, trainer, decider
        self.finished = False  # the farewell has come and every message has gone
        self._last_tick = time.monotonic()

    @property
    def done(self) -> bool:
        """Done for the poll loop once the member's trainer is: its rank then serves the
        population until `finished` (launch/population.py, Population.rest)."""
        return self.trainer is None or self.trainer.done

    @property
    def status(self) -> str:
        if self.decider is not None and not self.decider.farewell_sent:
            left = np.flatnonzero(~self.decider.stopped)
            return f"population root: waiting for members {', '.join(map(str, left[:8]))}" \
                   f"{' and more' if len(left) > 8 else ''} to stop"
        return "waiting for the population root's farewell"

    def poll(self) -> int:
        work = self.decider.poll() if self.decider is not None else 0
        trainer = self.trainer
        if trainer is None or trainer.done or trainer.draining:  # until then the trainer serves between updates
            if trainer is None and not self.link.stopped:  # a member complete before this launch
                self.link.report(DONE, None, 0, math.nan, resumed=True)
                self.link.stopped = True
            work += self.link.serve(trainer) is not None
        if self.link.farewell and self.link.channel.flushed() and not self.finished:
            if self.decider is not None:
                self.decider.close()
            self.finished = True
        now = time.monotonic()
        if not work and now - self._last_tick >= WAIT_TICK_S:
            # other members train on; their own watchdogs judge them, so waiting for them is not a hang
            self._last_tick = now
            return 1
        return work
