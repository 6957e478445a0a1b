"""Population-based training between members (issue 28): each member's learner root reports its
fitness to the population root, which decides exploit and explore (core/population.py) and
orders the copies; the states travel in memory between the learner roots
(runtime/member_copy.py).

- `MemberLink`, on each member's learner root: after every `ready_frames` of its member's
  training it reports (its frames, fitness and live hyperparameters: a resumed member's come from
  its checkpoint, so the root never guesses them); it serves the root's orders between updates
  (the trainer calls `between_updates`), and by itself once its member has stopped, until the
  root's farewell: a stopped member may still be a parent.
- `Decider`, on the population root (member 0's learner root): judges each report, orders the
  copies, and writes every report and decision to the population's metrics.h5 (the lineage,
  core/population.py: one row per event, with the member's hyperparameters after it).
- `PopulationRole`: the worker the poll loop polls on a member's learner root (the link, and on
  the root the decider), alive until every member has stopped and said goodbye.

No copy waits on another in a cycle: each member serves its orders in the order the root issued
them, so a copy waits only for copies issued before it.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from hpcrl.core.population import (CANCELLED, EXPLOIT, JUDGED, LINEAGE_KEYS, START, STOPPED, ExploreRule,
                                   exploit_parent, explore)
from hpcrl.io.metrics import MetricsWriter
from hpcrl.runtime.member_copy import MemberState, PopulationChannel, receive_state, send_state

READY, DONE = 1.0, 2.0  # reports: [kind, frames, fitness, copies taken, *hyperparameters]
SEND, RECEIVE, FAREWELL = 1.0, 2.0, 3.0  # orders: [kind, peer member, *hyperparameters]
NAN_PATIENCE = 3  # ready_frames a member with no finished episode waits for one before it is judged
WAIT_TICK_S = 1.0  # a root waiting for other members to finish counts as working this often (watchdog)


@dataclass
class Adoption:
    """What a member took in a copy: its parent, the parent's trainer-step state, and its new
    hyperparameters (algo keys without the 'algo.' prefix)."""

    parent: int
    step_state: dict
    hyperparameters: dict[str, float]


class MemberLink:
    def __init__(self, channel: PopulationChannel, ready_frames: int, live: tuple[str, ...], start_frames: int = 0):
        """`live`: the algorithm's live keys (without 'algo.'), in the order every message uses."""
        self.channel, self.live, self.ready_frames = channel, live, ready_frames
        self._ready_from(start_frames)
        self.stopped = False  # DONE was sent
        self.farewell = False
        self.taken = 0  # copies this member took (before it stopped)
        self.pause_s = 0.0  # seconds spent in copies, sending or receiving (metrics: exploit_pause_s)

    def _ready_from(self, frames: int) -> None:
        """The next judgement after `ready_frames` more; a member none of whose episodes has ended
        by then (its fitness NaN: right after a copy, episodes may be longer than ready_frames)
        waits for one, up to NAN_PATIENCE more ready_frames, before it is judged as it is."""
        self.ready_at = frames + self.ready_frames
        self.patience_at = self.ready_at + NAN_PATIENCE * self.ready_frames

    def between_updates(self, trainer, frames: int, fitness: float, stopping: bool) -> Adoption | None:
        """After an update of the trainer root: report when due (DONE when `stopping`: its last
        checkpoint is written), then serve every order that has come. The adoption, when this
        member took a copy."""
        hyper = [float(getattr(trainer.cfg.algo, k)) if trainer is not None else math.nan for k in self.live]
        if stopping and not self.stopped:
            self.channel.report([DONE, frames, fitness, self.taken, *hyper])
            self.stopped = True
        elif not stopping and frames >= self.ready_at and (not math.isnan(fitness) or frames >= self.patience_at):
            self.channel.report([READY, frames, fitness, self.taken, *hyper])
            self._ready_from(frames)
        return self.serve(trainer)

    def serve(self, trainer) -> Adoption | None:
        """Every order that has come, in order: send this member's state, overwrite it with
        another's, or the farewell. Once stopped, a member takes no copy: the state it is sent
        is received and dropped, so what it holds (and sends as a parent) stays what its last
        checkpoint holds; the root learns which copies it missed from its DONE report."""
        adopted = None
        while (order := self.channel.next_order()) is not None:
            kind, peer = order[0], int(order[1])
            start = time.perf_counter()
            if kind == SEND:
                send_state(self.channel.comm, trainer.member_state(), peer)
                self.channel.send_step_state(trainer.step.state(), peer)
            elif kind == RECEIVE and self.stopped:
                mine = trainer.member_state()
                receive_state(self.channel.comm, MemberState([np.empty_like(a) for a in mine.arrays]), peer)
                self.channel.receive_step_state(peer)
            elif kind == RECEIVE:
                receive_state(self.channel.comm, trainer.member_state(), peer)
                adopted = Adoption(peer, self.channel.receive_step_state(peer),
                                   dict(zip(self.live, (float(v) for v in order[2:]))))
                self._ready_from(trainer.frames)
                self.taken += 1
            else:
                self.farewell = True
            self.pause_s += time.perf_counter() - start
        return adopted


class Decider:
    def __init__(self, channel: PopulationChannel, live: tuple[str, ...], truncation: float,
                 rules: list[ExploreRule], rng: np.random.Generator, hyperparameters: np.ndarray,
                 metrics_path: str, resume: bool = False):
        """`hyperparameters`: members x live keys, each member's start (its config's)."""
        n = channel.members
        self.channel, self.live, self.truncation, self.rules, self.rng = channel, live, truncation, rules, rng
        self.fitness = np.full(n, np.nan)
        self.known = np.zeros(n, dtype=bool)  # judged since its start or its last copy
        self.seen = np.zeros(n, dtype=bool)  # reported at least once in this launch
        self.stopped = np.zeros(n, dtype=bool)
        self.copies: list[list[int]] = [[] for _ in range(n)]  # the parents of the copies ordered to each member
        self.hyper = np.array(hyperparameters, dtype=np.float64).reshape(n, len(live))
        self.farewell_sent = False
        self.start = time.perf_counter()
        self.metrics = MetricsWriter(metrics_path, attrs={"live": ",".join(f"algo.{k}" for k in live)},
                                     resume=resume)
        if not resume:  # a resumed member's first report gives its values, from its checkpoint
            for m in range(n):
                self._record(START, m, -1, 0, math.nan, math.nan)

    def poll(self) -> int:
        work = 0
        while (got := self.channel.next_report()) is not None:
            member, values = got
            kind, frames, fitness, taken = values[0], int(values[1]), float(values[2]), int(values[3])
            self.hyper[member] = values[4:]  # the member's own word: a resumed member's come from its checkpoint
            self.seen[member] = True
            if kind == READY:
                self._judge(member, frames, fitness)
            else:
                self.stopped[member] = True
                # a stopped member may still be a parent (not one that never trained in this launch)
                self.fitness[member], self.known[member] = fitness, not math.isnan(fitness)
                for parent in self.copies[member][taken:]:  # ordered, but it had stopped before taking them
                    self._record(CANCELLED, member, parent, frames, math.nan, math.nan)
                self._record(STOPPED, member, -1, frames, fitness, math.nan)
            work += 1
        if self.stopped.all() and not self.farewell_sent:
            for m in range(self.channel.members):
                self.channel.order(m, [FAREWELL, -1])
            self.farewell_sent = True
            self.metrics.flush()
        return work

    def _judge(self, member: int, frames: int, fitness: float) -> None:
        """Exploit among the members judged since their last copy, once every member has reported
        (members run at their own pace: the first to report would otherwise be ranked against
        the few that happened to come before it); then explore the copy."""
        self.fitness[member], self.known[member] = fitness, True
        judged = np.flatnonzero(self.known)
        parent = None
        if self.seen.all() and len(judged) >= 2:
            pick = exploit_parent(int(np.searchsorted(judged, member)), self.fitness[judged], self.truncation,
                                  self.rng)
            parent = None if pick is None else int(judged[pick])
        if parent is None:
            self._record(JUDGED, member, -1, frames, fitness, math.nan)
            return
        new = explore(dict(zip(self.live, self.hyper[parent])), self.rules_by_live(), self.rng)
        self.hyper[member] = [new[k] for k in self.live]
        self.known[member] = False  # judged again after its next ready_frames, as the copy it now is
        self.channel.order(member, [RECEIVE, parent, *self.hyper[member]])
        self.copies[member].append(parent)
        self.channel.order(parent, [SEND, member])
        self._record(EXPLOIT, member, parent, frames, fitness, float(self.fitness[parent]))
        if math.isnan(fitness):  # (a failed member, as far as the population can tell: said once more here)
            print(f"[hpcrl] population: member {member}'s fitness is NaN at {frames:,} frames (its training "
                  f"diverged, or none of its episodes ended since its start or last copy): reset from member "
                  f"{parent}", flush=True)

    def rules_by_live(self) -> list[ExploreRule]:
        """The explore rules with their keys as the live keys name them (no 'algo.')."""
        return [ExploreRule(r.key.split(".", 1)[1], r.perturb, r.resample, r.low, r.high) for r in self.rules]

    def _record(self, event: int, member: int, parent: int, frames: int, fitness: float,
                parent_fitness: float) -> None:
        row = dict(zip(LINEAGE_KEYS, (time.perf_counter() - self.start, event, member, parent, frames, fitness,
                                      parent_fitness)))
        row.update({f"algo.{k}": float(v) for k, v in zip(self.live, self.hyper[member])})
        self.metrics.append(row)

    def close(self) -> None:
        self.metrics.close()


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
            if not self.link.stopped:  # a member complete before this launch
                self.link.between_updates(trainer, 0, math.nan, stopping=True)
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
