"""A population packed several members to a rank: a resume on fewer ranks than members still
training (a node lost), with population.fewer_ranks 'pack'.

Each rank hosts a block of the members, and the members take turns on it in serial mode: a turn is
a run of the member's own (its run directory, resumed from its checkpoint), until its frames reach
its next multiple of population.ready_frames; there it stops as a preempted run does, with its
checkpoint, which marks the round it reported in. When every member has taken its turn, the job's
rank 0 judges them all in rounds (workers/population_root.Decider, as `population.synchronous`
judges, whatever that key says: every member has trained the same frames), and each copy goes
through the checkpoints: the rank hosting the copying member writes the parent's weights,
normalisers, Adam state and step state into the member's checkpoint (io/checkpoint.adopt_into),
before any rank starts the next round's turns. So time is shared fairly, every copy is durable once
decided, and a preempted or killed packed population resumes as any population does: a member
whose checkpoint marks a round the root has not ended reports again without training.

The turns cost a start-up each (the env built, the checkpoint read and written; a replay shard
too): tens of milliseconds for small models, against ready_frames of training.
"""
from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from hpcrl.core.config import Config
from hpcrl.core.dataflow import ALGORITHMS
from hpcrl.core.members import block_sizes, member_config, member_name, starting_values
from hpcrl.core.say import say
from hpcrl.core.seeds import seed_for
from hpcrl.core.stop import EXIT_CONFIG_ERROR, EXIT_DONE, EXIT_OUTPUT_FAILED, EXIT_PREEMPTED
from hpcrl.io import rundir
from hpcrl.io.checkpoint import CheckpointError, adopt_into, load_latest
from hpcrl.launch.population import Alone, InPopulation, member_checkpoint
from hpcrl.runtime import job, signals


class Packed(InPopulation):
    """This rank's place in a packed population: the members it hosts (a block of those still
    training), each run in turns on this rank alone. The start-up phases check the first one."""

    def __init__(self, whole: Config, unfinished: list[int], complete: list[int]):
        """Collective over the job: this rank's block of `unfinished`, and its own communicator."""
        n = whole.population.members
        self.whole, self.members, self.complete = whole, n, list(complete)
        self.unfinished = list(unfinished)
        sizes = block_sizes(len(unfinished), job.job_size())
        start = sum(sizes[:job.job_rank()])
        self.hosted = self.unfinished[start:start + sizes[job.job_rank()]]
        self.per_rank = (min(sizes), max(sizes))
        self.cfg = member_config(whole, self.hosted[0])
        self.label = f" {member_name(self.hosted[0], n)}"
        self.run_dir = os.path.join(whole.run.output_dir, whole.run.name)
        self.world = job.split(job.job_rank(), 0)  # this rank alone: every member runs here in serial mode
        self.section = whole.population
        self.announces_layout = job.job_rank() == 0

    def relaunch(self) -> str:
        return ""  # (the start-up's check of the first member: its first turn logs the relaunch)

    def headline(self, layout) -> str:
        low, high = self.per_rank
        each = f"{low}" if low == high else f"{low}-{high}"
        ranks = job.job_size()
        what = (f"resumed {self.members} members on {ranks} rank{'s' * (ranks > 1)}: {each} per rank, taking turns "
                f"of {self.whole.population.ready_frames:,} frames (population.fewer_ranks: pack)")
        if self.complete:
            what += f", {len(self.complete)} complete"
        lineage = os.path.join(self.run_dir, rundir.METRICS_FILE)
        return f"{what}; each member in serial mode as below; lineage in {lineage}"

    def take_turns(self, take_turn) -> int:
        """Every round: each member hosted here takes its turn (`take_turn(hooks, config)`: its
        run's start-up and training, launch/run.py; its exit status), then the job's rank 0 judges
        the round and each copy is written. The job's exit status: 0 once every member has
        finished, 3 when a signal stopped it (every member's checkpoint written), 4 when an output
        could not be written."""
        rounds = Rounds(self.whole, self.complete) if job.job_rank() == 0 else None
        decided = job.broadcast(rounds.decided if rounds else None)
        states = {m: MemberStart.read(self.whole, m) for m in self.hosted}
        while True:
            reports, status = [], EXIT_DONE
            for m, state in states.items():
                if state.stopped or status != EXIT_DONE:
                    continue
                if state.turn_round > decided:  # at its report point already: its round is not over
                    reports.append(state.report())
                    continue
                if signals.requested():
                    status = EXIT_PREEMPTED
                    break
                turn = Turn(self, m, state.turn_end(self.whole.population.ready_frames), decided + 1,
                            first=not state.turns)
                state.turns += 1
                code = take_turn(turn, member_config(self.whole, m))
                reports.append(state.after_turn(turn, code))
                status = code if code != EXIT_PREEMPTED or signals.requested() else EXIT_DONE
            gathered = job.gather((reports, status))
            verdict = job.broadcast(rounds.judge(gathered) if rounds else None)
            decided = verdict["round"]
            # (collective: also the barrier that keeps every member's next turn from overwriting a
            # checkpoint that a copy still reads)
            failed = job.any_of(self._write_copies(verdict["copies"], states))
            if verdict["over"] or failed:
                break
        if rounds is not None:
            rounds.close()
        status = EXIT_OUTPUT_FAILED if failed else verdict["status"]
        if job.job_rank() == 0 and status == EXIT_DONE:
            say(f"population done: {self.run_dir}")
        elif job.job_rank() == 0 and status == EXIT_PREEMPTED:
            say("preempted: every member's checkpoint is written; run the same command again to resume")
        return status

    def _write_copies(self, copies: list, states: dict) -> bool:
        """The copies decided into the checkpoints of the members hosted here (whether one failed)."""
        failed = False
        for child, parent, hyper in copies:
            if child not in states:
                continue
            path = member_checkpoint(self.whole, child)
            try:
                adopt_into(path, member_checkpoint(self.whole, parent), hyper)
            except (CheckpointError, OSError) as exc:
                say(f"error: cannot write member {parent}'s state into {path}: {exc}; the copy is lost, and the "
                    f"population stops here (status 4): free space, then run the same command again")
                failed = True
                continue
            before, states[child].hyper, states[child].turn_round = states[child].hyper, hyper, 0
            changed = ", ".join(f"algo.{k} {before[k]:.4g} -> {v:.4g}" for k, v in hyper.items() if v != before[k])
            say(f"exploit: took member {parent}'s state at {states[child].frames:,} frames, through its checkpoint"
                f"{'; ' + changed if changed else ''}", label=f" {member_name(child, self.members)}")
        return failed


@dataclasses.dataclass
class MemberStart:
    """What the driver knows of a hosted member between its turns."""

    member: int
    frames: int
    hyper: dict  # its live hyperparameters ('lr': value)
    turn_round: int = 0  # the round its last turn ended in, at its report point (0: none open)
    fitness: float = math.nan  # its fitness there
    stopped: bool = False
    turns: int = 0  # taken in this launch

    @classmethod
    def read(cls, whole: Config, member: int) -> "MemberStart":
        """From the member's checkpoint (none yet: a fresh start): its frames, values, and whether it
        waits at its report point (a turn's end, or a round a preempted spread member waited in)."""
        live = ALGORITHMS[whole.algo.name].live
        checkpoint = load_latest(member_checkpoint(whole, member))[0]
        hyper = dict(zip(live, starting_values(whole, live)[member].tolist()))  # (member_config's values)
        if checkpoint is None:
            return cls(member, 0, hyper)
        parts = checkpoint["parts"]
        hyper.update({k: float(v) for k, v in parts.get("hyperparameters", {}).items() if k in hyper})
        mark = parts.get("population", {})
        waiting = int(mark.get("turn_round", 0)) or int(mark.get("waiting_round", 0))
        fitness = mark.get("turn_fitness", mark.get("fitness"))
        if fitness is None:  # (a round waited in before its fitness was kept: the turn is taken again)
            waiting = 0
        return cls(member, int(checkpoint["counters"]["frames"]), hyper, waiting,
                   math.nan if fitness is None else float(fitness))

    def turn_end(self, ready_frames: int) -> int:
        return (self.frames // ready_frames + 1) * ready_frames

    def report(self, kind: float = 1.0, preempted: bool = False) -> tuple:
        """(member, the Decider's report: READY or DONE, its frames, fitness and values)."""
        return self.member, [kind, self.frames, self.fitness, 0, self.turn_round, preempted, *self.hyper.values()]

    def after_turn(self, turn: "Turn", code: int) -> tuple:
        trainer = turn.trainer
        if trainer is not None:
            self.frames, self.fitness = trainer.frames, trainer.stats.fitness()
            self.hyper = {k: float(getattr(trainer.cfg.algo, k)) for k in self.hyper}
        if code == EXIT_PREEMPTED and not signals.requested():
            self.turn_round = turn.round
            return self.report()
        self.stopped = True
        return self.report(kind=2.0, preempted=code != EXIT_DONE)


class Turn(Alone):
    """The hooks around one member's turn: a serial run that stops, with its checkpoint, at its
    first update (between the actor's records) at or past `until` frames, where that checkpoint
    marks the round it reports in."""

    takes_turns = True
    announces_layout = False

    def __init__(self, packed: Packed, member: int, until: int, round_: int, first: bool):
        """`first`: the member's first turn in this launch (a relaunch is logged once)."""
        super().__init__(packed.world)
        self.first = first
        self.label = f" {member_name(member, packed.members)}"
        self.until, self.round = until, round_
        self.trainer = None

    def stop_requested(self) -> bool:
        """A signal, or the turn's end (unless the run stops there on its own rules: then it is done)."""
        t = self.trainer
        return signals.requested() or (t is not None and self.until <= t.frames < t.cfg.run.total_frames
                                       and not t.stats.target_reached(t.cfg.run.target_return))

    def relaunch(self) -> str:
        return super().relaunch() if self.first else ""

    def ended_as(self, status: int) -> str:
        return "waiting" if status == EXIT_PREEMPTED and not signals.requested() else super().ended_as(status)

    def role(self, trainer, start_frames: int):
        self.trainer = trainer
        if trainer is not None:  # its link: its checkpoints keep `state`, its rows the copies' pause
            trainer.join_population(self)
        return None

    # --- the trainer's population link (workers/population.MemberLink's part of it) ----------------
    pause_s = 0.0  # (the copies are written between turns: no pause inside one)

    def between_updates(self, trainer, frames: int, fitness: float, code: int) -> tuple[None, bool]:
        return None, False  # (reported by the driver after the turn)

    def state(self) -> dict:
        """What the member's checkpoint keeps (the part 'population'): at the turn's end, the
        round it reports in and its fitness there."""
        if self.trainer is None or self.trainer.frames < self.until:
            return {"waiting_round": 0}
        return {"waiting_round": 0, "turn_round": self.round, "turn_fitness": float(self.trainer.stats.fitness())}

    def restore(self, state: dict) -> None:
        pass  # (kept after the trainer has restored its parts: the driver read the mark already)


class Rounds:
    """On the job's rank 0: the population root's decisions over the turns' reports (the Decider
    of a population in rounds, on a channel the reports are handed to)."""

    def __init__(self, whole: Config, complete: list[int]):
        from hpcrl.workers.population_root import Decider  # (torch-free, but not needed before)
        p = whole.population
        self.live = ALGORITHMS[whole.algo.name].live
        self.channel = TurnChannel(p.members)
        rng = np.random.default_rng(seed_for(whole.run.seed, "population", 0))
        self.decider = Decider(self.channel, self.live, dataclasses.replace(p, synchronous=True), rng,
                               starting_values(whole, self.live), os.path.join(whole.run.output_dir, whole.run.name))
        self.complete = complete  # they say so in the first round, as a complete member does

    @property
    def decided(self) -> int:
        return self.decider.round

    def judge(self, gathered: list) -> dict:
        """Every rank's reports of this round judged; the copies ordered, the round, and whether
        the population is over (every member stopped, or a signal or a failure stopped a turn)."""
        from hpcrl.workers.population_root import DONE, RECEIVE
        d, reports = self.decider, [(m, [2.0, 0, math.nan, -1, 0, False, *[math.nan] * len(self.live)])
                                    for m in self.complete]
        self.complete = []
        statuses = {s for _, s in gathered}
        status = next((s for s in (EXIT_OUTPUT_FAILED, EXIT_CONFIG_ERROR, EXIT_PREEMPTED) if s in statuses), EXIT_DONE)
        for rank_reports, _ in gathered:
            reports.extend(rank_reports)
        for member, v in reports:
            if v[0] == DONE and v[3] >= 0:  # every copy decided was written before its next turn: all taken
                v[3] = len(d.copies[member])
            self.channel.reports.append((member, np.asarray(v, dtype=np.float64)))
        d.poll()
        copies = [(m, int(v[1]), {k: float(x) for k, x in zip(self.live, v[2:])})
                  for m, v in self.channel.orders if v[0] == RECEIVE]
        self.channel.orders.clear()
        return {"copies": copies, "round": d.round, "status": status,
                "over": d.farewell_sent or d.aborting or status != EXIT_DONE}

    def close(self) -> None:
        self.decider.close()


class TurnChannel:
    """The population root's channel when the members take turns: the reports `Rounds` hands in,
    the orders kept for it (the copies are written through the checkpoints, not sent)."""

    is_root = True

    def __init__(self, members: int):
        self.members = members
        self.running = list(range(members))
        self.reports: list = []
        self.orders: list = []

    def next_report(self):
        return self.reports.pop(0) if self.reports else None

    def order(self, member: int, values) -> None:
        self.orders.append((member, np.asarray(values, dtype=np.float64)))

    def flushed(self) -> bool:
        return True
