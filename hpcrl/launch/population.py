"""`hpcrl run` of a population: the job cut into one block of ranks per member, each
running the roles table as a run of its own (on `world`, its block's communicator), and the
members' learner roots joined on a communicator of their own for population-based training
(workers/population.py).

A population wraps a run: `launch/run.py` calls the same hooks on every run (agree, prepare,
connect, role, rest), and a run of its own (`Alone`) does nothing in them.

Rank 0 of the job locks and prepares the population's directory (output_dir/name: its
config.yaml, and metrics.h5 with the lineage); each member's rank 0 then prepares the member's
own directory inside it (memberNN, a run directory like any other, resumed from its own
checkpoint). Every start-up verdict is agreed over the whole job (`runtime/job.agree`), so one
member's refusal stops every member with one message.
"""
from __future__ import annotations

import os
import time

import numpy as np

from hpcrl.core.config import Config, ConfigError, to_yaml
from hpcrl.core.members import (block_sizes, member_config, member_name, member_role, member_seed, members_to_run,
                                population_problem, starting_values)
from hpcrl.core.population import Paused, Standing, standings
from hpcrl.core.dataflow import ALGORITHMS
from hpcrl.core.layout import Layout
from hpcrl.core.league import snapshot_rule
from hpcrl.core.say import say
from hpcrl.core.seeds import seed_for
from hpcrl.core.stop import EXIT_DONE, EXIT_OUTPUT_FAILED, EXIT_PREEMPTED
from hpcrl.io import rundir
from hpcrl.io.checkpoint import inspect_latest
from hpcrl.io.metrics import read_metrics
from hpcrl.runtime import job, signals
from hpcrl.runtime.member_copy import PopulationChannel

POLL_SLEEP_S = 0.01  # a stopped member's learner root, waiting for the population root's farewell


class Alone:
    """A run of its own: the hooks a population member has around its run, each doing nothing."""

    label = ""
    league = None
    section = None  # a population's section (the memory estimate counts its copies)
    announces_layout = True  # every run says its layout once; a population says it for all its members

    def __init__(self, world):
        self.world = world

    def agree(self, verdict: dict) -> dict:
        return verdict

    def prepare(self, overwrite: bool) -> dict:
        return {}

    def connect(self, layout: Layout, rank: int) -> None:
        pass

    def role(self, trainer, start_frames: int):
        return None

    def headline(self, layout: Layout) -> str | None:
        return None

    def rest(self, role) -> None:
        pass

    takes_turns = False  # a packed member's turn (launch/packed.py): it says less, and its stops are its turn's end

    def stop_requested(self) -> bool:
        """Whether the run stops at its next chance, with a checkpoint: a signal asked."""
        return signals.requested()

    def relaunch(self) -> str:
        """Why a self-healing job script started this launch (HPCRL_RELAUNCH), for the run
        directory's recovery.log; '' when it did not."""
        return os.environ.get("HPCRL_RELAUNCH", "")

    def ended_as(self, status: int) -> str:
        """The run directory's status once the run has stopped with exit status `status`."""
        return {EXIT_DONE: "done", EXIT_PREEMPTED: "preempted"}.get(status, "output_failed")


class InPopulation(Alone):
    """A rank of a population's job, spread (`Population`) or packed (launch/packed.py): its
    start-up verdicts agreed over the job, and the population's directory prepared by the job's
    rank 0. `whole`: the population's config."""

    whole: Config

    def agree(self, verdict: dict) -> dict:
        return job.agree(verdict)

    def prepare(self, overwrite: bool) -> dict:
        """Collective over the job: the population's directory, by the job's rank 0."""
        return job.broadcast(prepare_directory(self.whole, overwrite) if job.job_rank() == 0 else None)


class Population(InPopulation):
    """This rank's place in a population run."""

    def __init__(self, whole: Config, running: list[int], standing: Standing | None, complete: list[int] = ()):
        """Collective over the job: the member this rank belongs to (of the `running` ones:
        `population_launch`; of the others, those `complete` have nothing left to do, the rest are
        paused), its config, and its block of ranks as the world from now on."""
        n = whole.population.members
        self.whole = whole
        self.members = n
        self.running = running
        self.paused = Paused(tuple(sorted(set(range(n)) - set(running) - set(complete))), standing)
        ends = np.cumsum(block_sizes(job.job_size(), len(running)))
        block = int(np.searchsorted(ends, job.job_rank(), side="right"))
        self.member = running[block]
        self.cfg = member_config(whole, self.member)
        self.label = f" {member_name(self.member, n)}"
        self.run_dir = os.path.join(whole.run.output_dir, whole.run.name)
        self.world = job.split(block, job.job_rank())  # this member's run lives on its block
        self.section = whole.population
        self.announces_layout = job.job_rank() == 0
        self.channel: PopulationChannel | None = None
        self.league = whole.population.league if whole.population.league.members else None
        self.role_name = member_role(whole, self.member)  # in a league: main, main_exploiter or league_exploiter
        if self.league:
            self.label = f" {member_name(self.member, n)} ({self.role_name})"

    def connect(self, layout: Layout, rank: int) -> None:
        """Collective over the job: the members' learner roots on a communicator of their own
        (rank m: member m)."""
        root = rank == layout.learner_root
        sub = job.split(0 if root else None, self.member)
        self.channel = PopulationChannel(sub, self.running, self.members) if root else None

    def role(self, trainer, start_frames: int):
        """On a member's learner root: its link, in a worker (with the decider on the population
        root). None elsewhere."""
        if self.channel is None:
            return None
        from hpcrl.workers.population import Decider, MemberLink, PopulationRole
        p, live = self.whole.population, ALGORITHMS[self.whole.algo.name].live
        league = self._league_member(trainer) if self.league and trainer is not None else None
        link = MemberLink(self.channel, p.ready_frames, live, start_frames, p.synchronous, league=league)
        if trainer is not None:  # a part of its checkpoints, as its league snapshots are
            link.restore(trainer.saved.get("population", {}))
            trainer.join_population(link, None if league is None else
                                    lambda message: league.fill_message(message, trainer.version))
            if league is not None:
                trainer.keep("league", league)
        decider = None
        if self.channel.is_root:
            rng = np.random.default_rng(seed_for(self.whole.run.seed, "population", 0))
            decider = Decider(self.channel, live, p, rng, starting_values(self.whole, live), self.run_dir,
                              league=self._league_root(rng) if self.league else None,
                              paused=self.paused)
            link.decider = decider
        if link.waiting_round and trainer.comm.Get_size() == 1:  # preempted in a round: take it up again first
            link.resume_round(trainer, trainer.frames, trainer.stats.fitness())
        return PopulationRole(link, trainer, decider)

    def _league_member(self, trainer):
        """A league member's snapshots and slots, on its learner root (from its checkpoint, when it resumes)."""
        from hpcrl.workers.league import LeagueMember, SnapshotRules
        saved, lg = trainer.saved.get("league"), self.league
        frames, win_rate = snapshot_rule(self.role_name, lg.snapshot_frames, lg.exploiter_snapshot_frames,
                                         lg.snapshot_win_rate)
        try:
            rules = SnapshotRules(lg.keep, frames, lg.exploiter_reset, self.whole.population.ready_frames,
                                  snapshot_win_rate=win_rate, restart_from_main=lg.restart == "main")
            member = LeagueMember(self.role_name, self.member, self.cfg.run.seed, trainer.member.num_params,
                                  self.cfg.algo.selfplay.pool, rules, saved=saved, initial=trainer.member.copy_params)
        except ValueError as exc:
            raise ConfigError(f"population.league: cannot resume member {self.member}'s league snapshots: {exc}; "
                              f"resume with the league's settings as they were, or start afresh with "
                              f"--overwrite") from None
        return member

    def _league_root(self, rng):
        from hpcrl.core.league import League, member_roles
        from hpcrl.workers.league import LeagueRoot
        lg = self.league
        league = League(member_roles(lg.main, lg.main_exploiters, lg.league_exploiters), lg.keep,
                        self.whole.algo.selfplay.pool, lg.opponents, lg.payoff_decay)
        # each member's own seed: its own draws of whether it starts again (core/league.resets_after_snapshot)
        restart = ([member_seed(self.whole, m) for m in range(lg.members)], lg.exploiter_reset) \
            if lg.restart == "main" else None
        return LeagueRoot(self.channel, league, rng, self.run_dir, restart)

    def headline(self, layout: Layout) -> str:
        lineage = os.path.join(self.run_dir, rundir.METRICS_FILE)
        sizes = block_sizes(job.job_size(), len(self.running))
        if len(self.running) == self.members and min(sizes) == max(sizes):
            return (f"population of {self.members} members, each on {layout.world_size} "
                    f"rank{'s' if layout.world_size > 1 else ''} as below; lineage in {lineage}")
        each = f"{sizes[0]}" if min(sizes) == max(sizes) else f"{min(sizes)}-{max(sizes)}"
        what = (f"resumed {self.members} members on {job.job_size()} rank{'s' * (job.job_size() > 1)}: "
                f"{len(self.running)} running on {each} rank{'s' * (max(sizes) > 1)} each")
        paused = self.paused.members
        done = self.members - len(self.running) - len(paused)
        if done:
            what += f", {done} complete"
        if paused:
            waits = "their checkpoints wait" if len(paused) > 1 else "its checkpoint waits"
            what += (f", {len(paused)} paused (member{'s' * (len(paused) > 1)} {', '.join(map(str, paused))}: "
                     f"{waits} for a launch on {self.members} ranks or more)")
        return f"{what}; member {self.member}'s layout below; lineage in {lineage}"

    def rest(self, role) -> None:
        """After this member's run: its learner root serves the population until the farewell
        (its state may still be copied); then every rank waits, sleeping, for every member."""
        if role is not None:
            while not role.finished:
                if not role.poll():
                    time.sleep(POLL_SLEEP_S)
        job.wait_for_every_member()
        if job.job_rank() == 0:
            say(f"population done: {self.run_dir}")


def prepare_directory(whole: Config, overwrite: bool) -> dict:
    """The population's directory: locked by the job's rank 0, emptied with --overwrite, its
    config.yaml the population's config."""
    try:
        run_dir = rundir.prepare_population(whole.run.output_dir, whole.run.name, overwrite, to_yaml(whole))
        return {"run_dir": run_dir}
    except ConfigError as exc:
        return {"error": str(exc)}
    except OSError as exc:  # a full disk or an unwritable output_dir: not a config mistake
        return {"error": f"cannot prepare the population's directory {exc.filename or ''}: {rundir.os_reason(exc)}"
                         f"; fix that, then run the same command again", "status": EXIT_OUTPUT_FAILED}


def population_launch(whole: Config, world_size: int, overwrite: bool, config_path: str) -> dict:
    """Rank 0: which members this launch runs ({"running": [...], "standing": Standing or None}),
    or a refusal. A new population needs a world size that is a multiple of its members. One
    that resumes (its lineage is there, and no --overwrite) runs on any world size: every member
    on blocks as even as they go. On fewer ranks than members still training, population.
    fewer_ranks 'pack' runs them all, several to a rank, in turns ({"packed": [...], "complete":
    [...]}: launch/packed.py); otherwise, and always in a league, only as many as there are
    ranks run, those of the best standing in the lineage (a league's: its first, main agents
    first), on blocks as even as they go, and those left out are paused."""
    n = whole.population.members
    lineage = os.path.join(whole.run.output_dir, whole.run.name, rundir.METRICS_FILE)
    if overwrite or not os.path.exists(lineage):
        if problem := population_problem(whole, world_size):
            return {"error": f"{config_path}: {problem}"}
        return {"running": list(range(n)), "standing": None}
    try:
        standing = standings(read_metrics(lineage), n, ALGORITHMS[whole.algo.name].live)
    except OSError:  # (a lineage that cannot be read: the Decider says so; members in order meanwhile)
        standing = None
    if world_size >= n:
        return {"running": list(range(n)), "standing": standing}
    complete = [_complete(whole, m) for m in range(n)]
    unfinished = [m for m in range(n) if not complete[m]]
    if whole.population.fewer_ranks == "pack" and not whole.population.league.members \
            and len(unfinished) > world_size:  # every member still training runs, several to a rank
        return {"packed": unfinished, "complete": [m for m in range(n) if complete[m]]}
    fitness = np.full(n, np.nan) if standing is None else standing.fitness
    running = members_to_run(fitness, world_size, in_order=bool(whole.population.league.members), complete=complete)
    return {"running": running, "standing": standing, "complete": [m for m in range(n) if complete[m]]}


def _complete(whole: Config, member: int) -> bool:
    """Whether member `member`'s run has nothing left to do (as its own resume would find)."""
    found, _, counters, _ = inspect_latest(member_checkpoint(whole, member))
    return found is not None and bool(rundir.already_finished(member_config(whole, member), counters))


def member_checkpoint(whole: Config, member: int) -> str:
    """Member `member`'s checkpoint: in its run directory inside the population's (member_config's)."""
    return os.path.join(whole.run.output_dir, whole.run.name, member_name(member, whole.population.members),
                        rundir.CHECKPOINT_FILE)
