"""The population root (member 0's learner root, or the first running member's while member 0
is paused): it judges the members' reports, orders the copies (core/population.py decides), and
writes every report and decision to the population's metrics.h5 (the lineage: one row per event,
with the member's hyperparameters after it).

Two ways of judging (population.synchronous):
- as they come (the default): each report is judged when it arrives, once every member has
  reported once, against the latest fitness of the others; no member waits for another;
- in rounds: every member reports at each multiple of ready_frames and waits there; when every
  member still training has reported (or stopped), the root judges them all, in member order,
  against the same fitness, and ends the round for each. Serial members then repeat exactly for
  a seed, and so does a resumed population: the root saves its state after every round
  (`STATE_FILE`, JSON beside the lineage), and a member that was preempted while it waited in a
  round takes that round up again when it resumes.

Messages, float64 vectors on the members' learner roots' communicator (runtime/member_copy.py):
reports [kind, frames, fitness, copies taken (-1: complete before this launch), round, preempted,
*hyperparameters]; orders [kind, peer member, *hyperparameters].
"""
from __future__ import annotations

import json
import math
import os
import time

import numpy as np

from hpcrl.core.population import (CANCELLED, EXPLOIT, JUDGED, LINEAGE_KEYS, PAUSED, RESTART, START, STOPPED,
                                   ExploreRule, Paused, exploit_parent, explore)
from hpcrl.core.config_population import PopulationConfig, explore_rules
from hpcrl.io.metrics import MetricsWriter
from hpcrl.io.rundir import METRICS_FILE
from hpcrl.runtime.member_copy import PopulationChannel
from hpcrl.core.say import say

READY, DONE = 1.0, 2.0  # reports
SEND, RECEIVE, FAREWELL, END_ROUND, ABORT = 1.0, 2.0, 3.0, 4.0, 5.0  # orders
STATE_FILE = "population_state.json"
MAX_STATE_BYTES = 64 * 2**20  # the root's state is a few numbers per member; more is not a state file


class Decider:
    def __init__(self, channel: PopulationChannel, live: tuple[str, ...], population: PopulationConfig,
                 rng: np.random.Generator, hyperparameters: np.ndarray, run_dir: str, league=None,
                 paused: Paused | None = None):
        """`population`: the config's section (its truncation, explore rules, rounds);
        `hyperparameters`: members x live keys, each member's start (its config's). A lineage the
        population's directory `run_dir` holds already (--overwrite empties it, so only this run's
        own) goes on, and in rounds the root's state is read back. Members the channel does not
        run are stopped: complete before this launch, or `paused` (a launch on too few ranks). A
        paused one ranks with its standing (its last fitness and frames in the lineage:
        core/population.standings) and is never a parent: its state is in its checkpoint, in no
        rank's memory."""
        n = channel.members
        self.channel, self.live, self.truncation, self.rng = channel, live, population.truncation, rng
        self.rules = [ExploreRule(r.key.split(".", 1)[1], r.perturb, r.resample, r.low, r.high)
                      for r in explore_rules(population)]
        self.synchronous = synchronous = population.synchronous
        self.league = league  # a league (workers/league.LeagueRoot): no member is copied onto another
        self.fitness = np.full(n, np.nan)
        self.known = np.zeros(n, dtype=bool)  # judged since its start or its last copy
        self.seen = np.zeros(n, dtype=bool)  # reported at least once in this launch
        self.stopped = np.zeros(n, dtype=bool)
        self.waiting = np.zeros(n, dtype=bool)  # in rounds: reported this round, waiting for its end
        self.frames_at = np.zeros(n, dtype=np.int64)  # in rounds: each waiting member's frames
        self.round = 0  # in rounds: the last round decided
        self.aborting = False  # in rounds: a member was preempted; no round ends any more
        self.copies: list[list[int]] = [[] for _ in range(n)]  # the parents of the copies ordered to each member
        self.running = np.zeros(n, dtype=bool)  # the others are paused
        self.running[channel.running] = True
        self.hyper = np.array(hyperparameters, dtype=np.float64).reshape(n, len(live))
        self.farewell_sent = False
        self.write_failed = False
        self.start = time.perf_counter()
        self.state_path = os.path.join(run_dir, STATE_FILE)
        path = os.path.join(run_dir, METRICS_FILE)
        resume = os.path.exists(path)
        if synchronous and resume and os.path.exists(self.state_path):
            self._load_state()
        self.metrics = MetricsWriter(path, attrs={"live": ",".join(f"algo.{k}" for k in live)}, resume=resume)
        if not resume:  # a resumed member's first report gives its values, from its checkpoint
            for m in range(n):
                self._record(START, m, -1, 0, math.nan, math.nan)
        self.seen[~self.running] = self.stopped[~self.running] = True
        self.known[~self.running] = False  # a complete one holds no state to send (a paused one: below)
        standing = None if paused is None else paused.standing
        for m in () if paused is None else paused.members:
            fitness, frames = (math.nan, 0) if standing is None else \
                (float(standing.fitness[m]), int(standing.frames[m]))
            if standing is not None and np.isfinite(standing.hyper[m]).all():
                self.hyper[m] = standing.hyper[m]  # its values as its last report left them
            self.fitness[m], self.known[m] = fitness, not math.isnan(fitness)
            self._record(PAUSED, int(m), -1, frames, fitness, math.nan)

    # --- reports ----------------------------------------------------------------------------------
    def poll(self) -> int:
        work = 0
        while (got := self.channel.next_report()) is not None:
            member, v = got
            kind, frames, fitness, taken, preempted = v[0], int(v[1]), float(v[2]), int(v[3]), bool(v[5])
            hyper_end = 6 + len(self.live)
            if taken >= 0:  # (a member complete before this launch knows none of its values)
                # the member's own word: a resumed member's come from its checkpoint
                self.hyper[member] = v[6:hyper_end]
            restart = None  # the main agent whose newest snapshot a league exploiter now starts again from
            if self.league is not None:  # its snapshots and games; after READY, its slots drawn anew
                restart = self.league.on_report(member, v[hyper_end:], ready=kind == READY, holds_snapshots=taken >= 0)
            self.seen[member] = True
            if kind == READY and self.synchronous:
                self._wait_for_round(member, frames, fitness)
            elif kind == READY:
                self._judge(member, frames, fitness)
            else:
                self._stopped(member, frames, fitness, taken, preempted)
            if restart is not None:  # (ordered by the league: the lineage says so)
                self._record(RESTART, member, restart, frames, fitness, float(self.fitness[restart]))
            work += 1
        if self.synchronous and not self.aborting and self.waiting.any() and (self.waiting | self.stopped).all():
            self._end_round()
        if self.stopped.all() and not self.farewell_sent:
            for m in self.channel.running:
                self.channel.order(m, [FAREWELL, -1])
            self.farewell_sent = True
            try:
                self.metrics.flush()
            except OSError as exc:
                if not self.write_failed:
                    self._write_failed(exc)
        return work

    def _stopped(self, member: int, frames: int, fitness: float, taken: int, preempted: bool) -> None:
        if self.synchronous and preempted and not self.aborting:  # no round ends any more: each waiting
            self.aborting = True                                    # member stops where it is
            for m in np.flatnonzero(self.waiting):
                self.channel.order(int(m), [ABORT, -1])
            self.waiting[:] = False
        if taken < 0:  # complete before this launch: it holds no state to send, so it is no parent
            self.known[member] = False
        else:  # a stopped member may still be a parent
            self.fitness[member], self.known[member] = fitness, not math.isnan(fitness)
        self.stopped[member] = True
        for parent in self.copies[member][max(taken, 0):]:  # ordered, but it had stopped before taking them
            self._record(CANCELLED, member, parent, frames, math.nan, math.nan)
        self._record(STOPPED, member, -1, frames, fitness, math.nan)

    # --- as they come -------------------------------------------------------------------------------
    def _judge(self, member: int, frames: int, fitness: float) -> None:
        """Exploit among the members judged since their last copy, once every member has reported
        (members run at their own pace: the first to report would otherwise be ranked against
        the few that happened to come before it); then explore the copy."""
        self.fitness[member], self.known[member] = fitness, True
        judged = np.flatnonzero(self.known)
        parent = self._parent(member, judged) if self.seen.all() else None
        self._decide(member, parent, frames, fitness)

    def _parent(self, member: int, judged: np.ndarray) -> int | None:
        if len(judged) < 2 or self.league is not None:
            return None
        pick = exploit_parent(int(np.searchsorted(judged, member)), self.fitness[judged], self.truncation, self.rng,
                              can_send=self.running[judged])
        return None if pick is None else int(judged[pick])

    def _decide(self, member: int, parent: int | None, frames: int, fitness: float) -> None:
        """Record the judgement; for an exploit, explore and order the copy."""
        if parent is None:
            self._record(JUDGED, member, -1, frames, fitness, math.nan)
            return
        new = explore(dict(zip(self.live, self.hyper[parent])), self.rules, self.rng)
        self.hyper[member] = [new[k] for k in self.live]
        self.known[member] = False  # judged again after its next ready_frames, as the copy it now is
        self.channel.order(parent, [SEND, member])
        self.channel.order(member, [RECEIVE, parent, *self.hyper[member]])
        self.copies[member].append(parent)
        self._record(EXPLOIT, member, parent, frames, fitness, float(self.fitness[parent]))
        if math.isnan(fitness):  # (a failed member, as far as the population can tell: said once more here)
            say(f"population: member {member}'s fitness is NaN at {frames:,} frames (its training "
                f"diverged, or none of its episodes ended since its start or last copy): reset from member "
                f"{parent}")

    # --- in rounds ----------------------------------------------------------------------------------
    def _wait_for_round(self, member: int, frames: int, fitness: float) -> None:
        if self.aborting:
            self.channel.order(member, [ABORT, -1])
            return
        self.fitness[member], self.known[member], self.waiting[member] = fitness, True, True
        self.frames_at[member] = frames

    def _end_round(self) -> None:
        """Judge every member that waits, in member order, against the same fitness; order the
        copies, then end each one's round; save the state this round leaves."""
        judged = np.flatnonzero(self.known)
        members = np.flatnonzero(self.waiting)
        parents = {int(m): self._parent(int(m), judged) for m in members}
        self.round += 1
        for m in members:
            self._decide(int(m), parents[int(m)], int(self.frames_at[m]), float(self.fitness[m]))
        for m in members:
            self.channel.order(int(m), [END_ROUND, -1])
        self.waiting[:] = False
        self._save_state()

    def _save_state(self) -> None:
        if self.write_failed:
            return
        state = {"round": self.round, "rng": self.rng.bit_generator.state,
                 "fitness": [None if math.isnan(f) else f for f in self.fitness.tolist()],
                 "known": self.known.tolist(), "stopped": (self.stopped & self.running).tolist(),  # (not the paused)
                 "hyper": self.hyper.tolist(),
                 "copies": self.copies}
        temporary = self.state_path + ".tmp"
        try:
            self.metrics.flush()  # the lineage up to this round first: the state says it is complete
            with open(temporary, "w", encoding="utf-8") as fh:
                json.dump(state, fh)
            os.replace(temporary, self.state_path)
        except OSError as exc:
            self._write_failed(exc)

    def _load_state(self) -> None:
        """The state the last round left (written by `_save_state`): data, read bounded."""
        n = self.channel.members
        try:
            with open(self.state_path, "rb") as fh:
                state = json.loads(fh.read(MAX_STATE_BYTES + 1)[:MAX_STATE_BYTES + 1])
            hyper = np.array(state["hyper"], dtype=np.float64).reshape(n, len(self.live))
            fitness = np.array([np.nan if f is None else f for f in state["fitness"]], dtype=np.float64)
            known, stopped = np.array(state["known"], dtype=bool), np.array(state["stopped"], dtype=bool)
            copies = [[int(p) for p in c] for c in state["copies"]]
            if not (len(fitness) == len(known) == len(stopped) == len(copies) == n):
                raise ValueError(f"it is for {len(fitness)} members, the population has {n}")
            self.rng.bit_generator.state = state["rng"]
            self.round = int(state["round"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RuntimeError(f"cannot resume the population's rounds from {self.state_path}: "
                               f"{type(exc).__name__}: {exc}; move it aside to start the rounds afresh") from None
        # (the copies ordered in earlier launches were taken or cancelled there: a member's count of
        # those it took starts again with each launch, and so does this list)
        del copies
        self.hyper, self.fitness, self.known, self.stopped = hyper, fitness, known, stopped

    # --- the lineage --------------------------------------------------------------------------------
    def _record(self, event: int, member: int, parent: int, frames: int, fitness: float,
                parent_fitness: float) -> None:
        row = dict(zip(LINEAGE_KEYS, (time.perf_counter() - self.start, event, member, parent, frames, fitness,
                                      parent_fitness)))
        row.update({f"algo.{k}": float(v) for k, v in zip(self.live, self.hyper[member])})
        if self.write_failed:
            return
        try:
            self.metrics.append(row)
        except OSError as exc:
            self._write_failed(exc)

    def _write_failed(self, exc: OSError) -> None:
        """The lineage and the rounds' state are a record: the members train on without them, and
        this says so once (a resume of the rounds from here would not be exact)."""
        self.write_failed = True
        say(f"warning: population: cannot write the lineage or the rounds' state in "
            f"{os.path.dirname(self.state_path)} ({exc.strerror or exc}); the members train on, but nothing more "
            f"of the lineage is recorded, and a resume of the rounds would start from the last state saved")

    def close(self) -> None:
        if self.league is not None:
            self.league.save(now=True)
        try:
            self.metrics.close()
        except OSError as exc:
            if not self.write_failed:
                self._write_failed(exc)
