"""`hpcrl run`: the start-up phases (launch/startup.py), then every rank's workers polled until the
run ends.

Every rank runs `run()`. The phases check the config, the layout, the env and every rank's roles,
then prepare the run directory; a verdict reaches every rank, so a user mistake ends the job with
one message and status 2 everywhere. Then each rank builds the workers the layout gives it
(`wiring.build_workers`: the whole topology in one place) and polls them until the stop word on the
control stream ends the run: status 0, 3 when a signal preempted it, 4 when an output could not be
written.
"""
from __future__ import annotations

import os
import sys
import time

from hpcrl.core.config import Config
from hpcrl.core.layout import Layout
from hpcrl.core.policies import policy_spaces
from hpcrl.core.say import say
from hpcrl.core.sizing import Sizes, memory, warnings
from hpcrl.core.startup import CLOCK, MARKS, resume_collection
from hpcrl.core.stop import EXIT_CONFIG_ERROR, EXIT_DONE, EXIT_PREEMPTED, StopReason
from hpcrl.envs import EnvSpaces
from hpcrl.io import rundir, run_status
from hpcrl.io.config_history import HISTORY_FILE
from hpcrl.io.metrics import write_crossed_nodes, write_startup
from hpcrl.launch.packed import Packed
from hpcrl.launch.population import Alone, Population
from hpcrl.launch.startup import MEMBER_PHASES, PHASES, Refusal, StartUp
from hpcrl.launch.wiring import Hooks, build_workers
from hpcrl.runtime import comm, job, signals, traffic
from hpcrl.runtime.control import ControlStream, build_control_stream
from hpcrl.runtime.liveness import start_peer_watch
from hpcrl.runtime.watchdog import Watchdog

CONTROL_POLL_EVERY = 64  # passes of the poll loop between control-stream polls on a busy rank
CONTROL_POLL_IDLE_EVERY = 16  # idle passes between control-stream polls on a waiting rank


def run(config: str | Config, overrides: tuple[str, ...] = (), overwrite: bool = False) -> int:
    """This rank's part of the run of `config` (a file's path, or a Config built in Python); its
    exit status (README, "Exit statuses")."""
    signals.install()  # (done already by `python -m hpcrl run`, before the imports)
    try:
        return _run(config, overrides, overwrite)
    finally:
        signals.ignore()  # the status is decided: a late signal cannot turn it into a death


def _run(config: str | Config, overrides: tuple[str, ...], overwrite: bool) -> int:
    CLOCK.mark("imports")
    roles_here: list = []

    comm.install_abort_hook(lambda: _describe(roles_here))
    if isinstance(config, Config):
        s = StartUp(f"config of run {config.run.name!r}", overrides, overwrite, Alone(comm.JOB), given=config)
    else:
        s = StartUp(config, overrides, overwrite, Alone(comm.JOB))
    try:
        for phase in PHASES:
            phase(s)
    except Refusal as refusal:
        return _refuse(refusal.message, refusal.status)
    if isinstance(s.member, Packed):  # members taking turns on this rank, each a run of its own
        resume_collection()  # (start-up's objects frozen now, none of a turn's)
        if s.rank == 0 and s.member.announces_layout:
            _announce_layout(s.cfg, s.layout, s.sizes, s.spaces, s.num_params, s.hosts, s.member)
        return s.member.take_turns(lambda turn, cfg: _turn(s, turn, cfg, roles_here))
    return _train(s, roles_here)


def _turn(s: StartUp, turn, cfg: Config, roles_here: list) -> int:
    """A packed member's turn (launch/packed.py): the start-up phases of its own run, on this rank
    alone, then its training; its exit status."""
    t = StartUp(s.config_path, (), False, turn, cfg=cfg)
    try:
        for phase in MEMBER_PHASES:
            phase(t)
    except Refusal as refusal:  # (checked at the launch's start-up already: a disk that filled since)
        print(f"hpcrl: error:{turn.label}: {refusal.message}", file=sys.stderr, flush=True)
        return refusal.status
    return _train(t, roles_here)


def _train(s: StartUp, roles_here: list) -> int:
    """The run the start-up phases prepared: its workers built and polled until the stop word;
    its exit status."""
    cfg, rank, layout, start, member = s.cfg, s.rank, s.layout, s.start, s.member
    roles_here.clear()
    member.connect(layout, rank)  # a population's: MPI over the job, its members' learner roots
    if start.finished:
        if rank == 0:
            say(f"nothing to do: the run in {start.run_dir} is complete: {start.finished} "
                f"(or pass --overwrite to start it again)", label=member.label)
        member.rest(member.role(None, start.start_frames))
        return 0
    comm.report_failures(lambda job_rank, doing, error: run_status.write(
        start.run_dir, "failed", rank=job_rank, doing=doing, error=error))
    if rank == 0:
        if not member.takes_turns:
            _announce(s)
        _record_status(start.run_dir, "running", ranks=layout.world_size)
    watchdog = Watchdog(cfg.run.hang_timeout_s, lambda: _describe(roles_here), comm.abort_job, rank).start()
    control = build_control_stream(s.world, rank, layout.learner_root, layout.node_of_rank)
    peers = start_peer_watch(s.world, rank, control.neighbours, cfg.run.peer_timeout_s,
                             _rank_names(layout, s.hosts), comm.leave_cut_off_job)
    roles_here.extend(build_workers(s, control, Hooks(member.stop_requested,
                                                      heartbeat=lambda: watchdog.tick(True))))
    member_role = member.role(_learner(roles_here), start.start_frames)
    if member_role is not None:
        roles_here.append(member_role)
    CLOCK.set_roles(f"rank {rank} ({'/'.join(r.name for r in roles_here)})", tuple(r.name for r in roles_here))
    CLOCK.mark("roles")
    resume_collection()  # paused by `hpcrl run` from its first import (core/startup.py)
    poll_until_done(roles_here, control, watchdog)
    control.close()
    if not member.takes_turns:  # (a turn of a packed member: its launch's totals are not a launch's)
        _report_launch(s.world, start, control.stop_flags, len(set(s.nodes.tolist())))
    watchdog.stop()
    peers.close()  # after the watchdog: waiting for the neighbours' BYE is watched by the peers' clock
    # why the run stopped, the same word on every rank: the exit status
    status = StopReason.from_flags(control.stop_flags).exit_status
    if rank == 0:
        _record_status(start.run_dir, member.ended_as(status))
    if rank == 0 and status == 0:
        say(f"done: {start.run_dir}", label=member.label)
    member.rest(member_role)  # a population member's learner root serves it until every member has stopped
    return status


def _describe(roles_here: list) -> str:
    """What this rank is doing, for the abort hook and the watchdog."""
    if roles_here and all(r.done for r in roles_here):
        return "its roles are finished; waiting for the stop word on the control stream (from the learner root)"
    return ", ".join(f"{r.name}: {r.status}" for r in roles_here) or "starting up"


def _record_status(run_dir: str, state: str, **details) -> None:
    """The run directory's status.json (io/run_status.py); a report, so a failed write costs it only."""
    try:
        run_status.write(run_dir, state, **details)
    except OSError as exc:
        if state != "output_failed":  # (after a full disk, failing again is expected)
            say(f"warning: could not record the run's status in {run_dir}: {rundir.os_reason(exc)}")


def _learner(roles: list):
    return next((r for r in roles if r.name == "learner"), None)


def _report_launch(world, start: rundir.RunStart, flags: int, n_nodes: int) -> None:
    """Totals of this launch on rank 0 (collectives): every rank's cross-node counts summed,
    printed for a multi-node run, and every rank's start-up marks; both written to metrics.h5."""
    import numpy as np
    sums = comm.sum_polled(world, traffic.table())
    marks = comm.gather_polled(world, np.array(CLOCK.row(), dtype=np.float64))
    if world.Get_rank() != 0 or StopReason.from_flags(flags) is StopReason.OUTPUT_FAILED:
        return
    if n_nodes > 1:
        say(f"crossed nodes (messages): {traffic.describe(sums)}")
    metrics = os.path.join(start.run_dir, rundir.METRICS_FILE)
    try:
        write_crossed_nodes(metrics, traffic.STREAMS, sums)
        write_startup(metrics, MARKS, marks)
    except OSError as exc:  # the totals are a report: a failed write costs them, not the run
        say(f"warning: could not record the launch's totals in {metrics}: {rundir.os_reason(exc)}")


def _rank_names(layout: Layout, hosts: list[str]):
    """rank -> 'env rank on node n1', for the messages that name a lost peer."""
    return lambda r: f"{'/'.join(layout.roles_of(r)) or 'idle'} rank on node {hosts[r]}"


def _refuse(message: str, status: int = EXIT_CONFIG_ERROR) -> int:
    """A user mistake (or an unwritable run directory) found at start-up: one message (from
    the job's rank 0), the same status on every rank."""
    if job.job_rank() == 0:
        what = "config error" if status == EXIT_CONFIG_ERROR else "error"
        print(f"hpcrl: {what}: {message}", file=sys.stderr, flush=True)
    return status


def _announce(s: StartUp) -> None:
    """The run's layout, once (a population's: by its first member, for every member alike), then
    this run's (member's) directory and what its start found."""
    label, start = s.member.label, s.start
    if s.member.announces_layout:
        _announce_layout(s.cfg, s.layout, s.sizes, s.spaces, s.num_params, s.hosts, s.member)
    say(f"run directory: {start.run_dir}", label=label)
    for warning in start.warnings:
        say(f"warning: {warning}", label=label)
    if start.resume_file:
        say(f"resuming from {start.resume_file}: policy version {start.start_version}, "
            f"{start.start_frames:,} frames", label=label)
        if start.changes:
            say(f"resuming with {start.changes}; the config before is kept in {HISTORY_FILE}", label=label)


def _announce_layout(cfg: Config, layout: Layout, sizes: Sizes, spaces: EnvSpaces, n_params: list[int],
                     hosts: list[str], member: Alone | Population) -> None:
    if headline := member.headline(layout):
        say(headline)
    if layout.serial:
        say("world size 1: serial mode (learner, env and inline inference in one process)")
    else:
        n_nodes = len(set(layout.node_of_rank.tolist()))
        say(f"{layout.world_size} ranks on {n_nodes} node{'s' if n_nodes > 1 else ''}: "
            f"{len(layout.learners)} learner, {len(layout.inference)} "
            f"inference{' (inline on env ranks)' if layout.inline_inference else ''}, {len(layout.envs)} env "
            f"x {cfg.env.num_envs} {cfg.env.id}")
    if not layout.serial:  # which rank is what: Open MPI names dead ranks by number only
        say("roles: " + "; ".join(f"{name} ranks {_ranges(ranks)}" for name, ranks in (
            ("learner", layout.learners), ("inference", layout.inference), ("env", layout.envs)) if len(ranks)))
        if n_nodes > 1:  # which node holds which ranks: a lost node's message names the node
            say("nodes: " + _nodes_line(layout, hosts))
    if layout.policies > 1:
        say("policies: " + "; ".join(
            f"{name} acts for {', '.join(s.agents)} (learner ranks {_ranges(layout.learners_of_policy(p))})"
            for p, (name, s) in enumerate(zip(cfg.policies, policy_spaces(spaces, cfg.policies)))))
    for warning in warnings(cfg, layout, memory(cfg, layout, sizes, spaces, max(n_params), member.section)):
        say(f"warning: {warning}")


def _nodes_line(layout: Layout, hosts: list[str], limit: int = 16) -> str:
    """'n0 ranks 0-3; n1 ranks 4-7' (the first `limit` nodes, then a count)."""
    import numpy as np
    leaders = list(dict.fromkeys(layout.node_of_rank.tolist()))  # in rank order
    text = "; ".join(f"{hosts[leader]} ranks {_ranges(np.flatnonzero(layout.node_of_rank == leader))}"
                     for leader in leaders[:limit])
    return text + (f"; and {len(leaders) - limit} more nodes" if len(leaders) > limit else "")


def _ranges(ranks, limit: int = 8) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8' (the first `limit` runs, then a count)."""
    runs, start = [], None
    for i, r in enumerate(ranks):
        r = int(r)
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            runs.append((start, prev))
            start = prev = r
        if i == len(ranks) - 1:
            runs.append((start, prev))
    text = ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in runs[:limit])
    return text + (f" and {len(runs) - limit} more runs" if len(runs) > limit else "")


SPIN_PASSES = 50  # idle poll passes before a rank with latency-bound work starts to sleep
IDLE_SLEEP_MAX_S = 1e-3  # the longest idle sleep: the latency a sleeping rank adds to a message


def poll_until_done(roles: list, control: ControlStream, watchdog: Watchdog | None = None) -> None:
    """SRL-style poll loop, until this rank's roles are done and the stop word has passed on to
    its subtree of the control stream. Idle ranks back off to sleeping, so oversubscribed nodes
    (more ranks than cores) give their cores to ranks that have work instead of spinning. Actors
    and policy servers spin SPIN_PASSES idle passes first (a reply or request is due within
    microseconds); a rank that only trains sleeps IDLE_SLEEP_MAX_S from its first idle pass: its
    work comes in whole batches, a wake-up a millisecond late costs it nothing, and its polling
    would take a share of the cores from the actors (in bench/sampling.py's 4 ranks on 2 cores,
    about 9% of the frames)."""
    learner_only = all(r.name in ("learner", "population") for r in roles)
    spin = 1 if learner_only else SPIN_PASSES
    idle = passes = 0
    while True:
        active = [r for r in roles if not r.done]
        if not active and control.finished():
            return
        work = sum(r.poll() for r in active)
        passes += 1
        # The stop word comes once per run and may wait a few passes, while every MPI test that
        # finds nothing costs a progress call (under oversubscription Open MPI yields the core in
        # it, and a waiting actor's tests of the control stream took a third of its samples): ask
        # for it every CONTROL_POLL_IDLE_EVERY idle passes (the first included), and every
        # CONTROL_POLL_EVERY passes on a rank never idle.
        if (not work and idle % CONTROL_POLL_IDLE_EVERY == 0) or passes % CONTROL_POLL_EVERY == 0:
            work += control.poll()
        if watchdog is not None:
            watchdog.tick(work > 0)
        if work:
            idle = 0
        else:
            idle += 1
            if idle > spin:
                time.sleep(IDLE_SLEEP_MAX_S if learner_only else min(IDLE_SLEEP_MAX_S, 2e-6 * idle))
