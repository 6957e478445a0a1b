"""`hpcrl plan`: what a layout means before a job is submitted (no MPI).

Ranks per role and per node, fan-in per inference and learner rank, the bytes each role sends at
an assumed env step rate (from the exact message sizes), the memory each role's buffers, batch and
model take, and warnings about layouts that will be slow or exceed the fan-in or memory limits.
The arithmetic lives in `hpcrl.core.sizing`, which `hpcrl run` shares; this module formats it.
"""
from __future__ import annotations

import numpy as np

from hpcrl.core.league import LEAGUE_EXPLOITER, largest_ring, snapshot_rule
from hpcrl.workers.league import SAVE_INTERVAL_S
from hpcrl.core.config import Config
from hpcrl.core.config_sac import replay_settings
from hpcrl.core.dataflow import algorithm_of
from hpcrl.core.layout import INLINE, Layout
from hpcrl.core.sizing import (DEFAULT_MEMORY_PER_RANK, Crossing, Memory, Sizes, Traffic, crossing, format_bytes,
                               warnings)

def _crossing_lines(layout: Layout, c: Crossing) -> list[str]:
    envs = len(layout.envs)
    copies = f"{c.weights_copies} cop{'y' if c.weights_copies == 1 else 'ies'}"
    return [f"crossing nodes: {copies} of each weights version ({c.weights_bytes:,} bytes; one per node that "
            f"holds a policy copy, but the learner root's)",
            f"  requests and replies of {c.remote_inference:,} of {envs:,} env ranks (a policy server on another "
            f"node), fragments of {c.remote_learner:,} (a learner on another node)"]


def _per_node(layout: Layout, ranks: np.ndarray) -> str:
    if len(ranks) == 0:
        return "-"
    nodes, inverse = np.unique(layout.node_of_rank, return_inverse=True)
    counts = np.bincount(inverse[ranks], minlength=len(nodes))
    return f"{counts.min()}-{counts.max()}" if counts.min() != counts.max() else str(counts.min())


def _rate(x: float) -> str:
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if x >= size:
            return f"{x / size:.1f} {unit}"
    return f"{x:.0f} B/s"


def _batch_line(cfg: Config, sizes: Sizes) -> str:
    """The batch of one update: frames over all learners, fragments per env rank and per learner
    (DQN: transitions per gradient step, and the replay shards)."""
    if algorithm_of(cfg).replay:
        (d, _), r = replay_settings(cfg.algo), cfg.algo.replay
        shard = sizes.busiest.replay
        capacity, warmup, batch = shard.capacity, shard.warmup, shard.batch
        ratio = f"replay ratio {r.replay_ratio:g}" if r.replay_ratio else "no replay ratio (as fast as they can)"
        # a replay row: a team's episode (VDN, QMIX), R2D2's sequence, or a transition
        unit = ("episodes" if algorithm_of(cfg).mixer else "sequences" if cfg.model.core != "none"
                else "transitions")
        steps = (f"{d.gradient_steps} gradient steps per update" if cfg.algo.mode == "async" else
                 "sync rounds: after each record of every env rank, the gradient steps the ratio owes")
        return (f"batch: {d.batch_size:,} {unit} per gradient step ({batch:,} per learner), {steps}, {ratio}; "
                f"replay shard per learner: {capacity:,} {unit}, warm-up {warmup:,}")
    batches = [learner.batch_fragments for learner in sizes.learners.values()]
    low, high = min(batches), max(batches)
    per_learner = f"{low}-{high}" if low != high else str(low)
    F = sizes.fragment_frames
    text = f"batch: {sizes.update_frames:,} frames per update"
    text += " (algo.batch_frames)" if cfg.algo.batch_frames is not None else ""
    if cfg.algo.batch_frames is not None and cfg.algo.mode == "async":  # in arrival order, from any env rank
        return text + f": {per_learner} fragments of {F:,} frames per learner"
    k = sizes.fragments_per_version
    return text + f": {k} fragment{'s' if k > 1 else ''} of {F:,} frames per env rank, {per_learner} per learner"


def format_plan(cfg: Config, layout: Layout, sizes: Sizes, t: Traffic, steps_per_second: float, per_rank: bool,
                mem: Memory | None = None, memory_per_rank: int = DEFAULT_MEMORY_PER_RANK, num_params: int = 0) -> str:
    n_nodes = len(np.unique(layout.node_of_rank))
    lines = [f"world size {layout.world_size:,} on {n_nodes:,} node{'s' if n_nodes > 1 else ''}; "
             f"env {cfg.env.id} x {cfg.env.num_envs} per env rank, rollout {cfg.algo.rollout_length}"]
    if layout.serial:
        lines.append("serial mode: rank 0 runs learner + env with inline inference")
        return "\n".join(lines)
    lines.append(f"  {'role':<10} {'ranks':>9}  {'per node':>9}  device")
    for role, ranks in (("learner", layout.learners), ("inference", layout.inference), ("env", layout.envs)):
        lines.append(f"  {role:<10} {len(ranks):>9,}  {_per_node(layout, ranks):>9}  "
                     f"{getattr(cfg.roles, role).device}")
    learner_fan = layout.fan_in("learner")
    lines.append(f"fan-in: each learner trains on {learner_fan.min()}-{learner_fan.max()} env ranks' fragments"
                 if learner_fan.min() != learner_fan.max() else
                 f"fan-in: each learner trains on {learner_fan.min()} env ranks' fragments")
    if layout.inline_inference:
        lines.append("        inference is inline on every env rank (inference ranks: 0)")
    else:
        fan = layout.fan_in("inference")
        lines.append(f"        each inference rank serves {fan.min()}-{fan.max()} env ranks"
                     if fan.min() != fan.max() else f"        each inference rank serves {fan.min()} env ranks")
    lines.append(_batch_line(cfg, sizes))
    lines.append(f"traffic at {steps_per_second:,.0f} vector steps/s per env rank (--env-steps-per-s):")
    if not layout.inline_inference:
        lines.append(f"  env rank        sends {_rate(t.env_requests + t.env_fragments)} "
                     f"(observations {_rate(t.env_requests)}, fragments {_rate(t.env_fragments)})")
        lines.append(f"  inference rank  sends {_rate(t.inference_replies)} of actions (busiest rank)")
    else:
        lines.append(f"  env rank        sends {_rate(t.env_fragments)} of fragments")
    lines.append(f"  learner         receives {_rate(t.learner_fragments_in)} of fragments (busiest learner)")
    lines.append(f"  learner root    broadcasts {t.weights_per_update:,} bytes of weights per update, "
                 + (f"{t.updates_per_second:,.1f} updates/s" if t.updates_per_second else
                    "as many updates as the learners can train (no algo.replay.replay_ratio)"))
    if t.allreduce_per_second:
        lines.append(f"  each learner    allreduces {_rate(t.allreduce_per_second)} of gradients")
    if n_nodes > 1 and num_params:
        lines += _crossing_lines(layout, crossing(layout, num_params))
    if mem is not None:
        lines.append("memory for buffers, batch and model (busiest rank of each role):")
        lines.append(f"  learner {format_bytes(mem.learner)} ({sizes.busiest.sample_slots} sample "
                     f"slots), inference {format_bytes(mem.inference)}, env {format_bytes(mem.env)}")
    problems = warnings(cfg, layout, mem, memory_per_rank)
    lines += [f"warning: {w}" for w in problems] or ["no warnings"]
    if per_rank:
        lines.append("ranks:")
        for r in layout.learners:
            lines.append(f"  rank {int(r):>6}  learner    fragments from {len(layout.envs_of_learner(int(r)))} env ranks")
        for r in layout.inference:
            lines.append(f"  rank {int(r):>6}  inference  serves {len(layout.envs_of_inference(int(r)))} env ranks")
        for i, r in enumerate(layout.envs):
            inf = int(layout.env_inference[i])
            lines.append(f"  rank {int(r):>6}  env        inference {'inline' if inf == INLINE else f'rank {inf}'}, "
                         f"learner rank {int(layout.env_learner[i])}")
    return "\n".join(lines)



# Metadata system calls (open, stat, access, readlink, directory listings) one rank's start-up
# makes on the shared file system: the venv, the interpreter's install and the checkout (from the
# venv, from hpcrl stage's node-local copy), as bench/startup.py counted them here
# (bench/results/startup.json). An env rank with an inline policy imports torch as a policy server
# does. A venv made from the node image's Python (/usr) costs less unstaged: its interpreter is local.
STARTUP_CALLS = {"learner": (19_587, 15), "inference": (18_341, 13), "env": (2_383, 3)}
UNPACK_CALLS_PER_NODE = 8  # hpcrl stage unpack: the archive's stat and open, the command itself
DEFAULT_MDS_OPS_PER_S = 20_000.0  # a metadata server: on the order of 10^4-10^5 such calls per second


def startup_calls(layout: Layout, members: int = 1) -> tuple[int, int]:
    """(unstaged, staged) metadata calls on the shared file system of the whole job's start-up:
    `members` blocks of `layout` (a population's), on the nodes of all of them."""
    learner, inference, env = STARTUP_CALLS["learner"], STARTUP_CALLS["inference"], STARTUP_CALLS["env"]
    if layout.serial:
        counts = [(learner, 1)]
    else:
        env_kind = inference if layout.inline_inference else env
        counts = [(learner, len(layout.learners)), (inference, len(layout.inference)), (env_kind, len(layout.envs))]
    nodes = len(np.unique(layout.node_of_rank)) * members
    unstaged = members * sum(calls[0] * n for calls, n in counts)
    staged = members * sum(calls[1] * n for calls, n in counts) + UNPACK_CALLS_PER_NODE * nodes
    return unstaged, staged


def format_startup(layout: Layout, mds_ops_per_s: float, members: int = 1) -> str:
    """The start-up's load on the shared file system's metadata server, unstaged and staged."""
    unstaged, staged = startup_calls(layout, members)
    return (f"start-up on the shared file system: {unstaged:,} metadata calls from the venv "
            f"({_about(unstaged / mds_ops_per_s)} at --mds-ops-per-s {mds_ops_per_s:,.0f}), {staged:,} staged "
            f"(hpcrl stage: {_about(staged / mds_ops_per_s)})")


def _about(s: float) -> str:
    """'about 71 s', 'about 0.4 s', 'under 0.1 s'."""
    return f"about {s:,.0f} s" if s >= 10 else f"about {s:.1f} s" if s >= 0.1 else "under 0.1 s"


MAX_PAYOFFS = 1_000_000  # win rates in a league's payoff matrix beyond which plan warns
PAYOFF_JSON_BYTES = 40  # one win rate in league_state.json: [member, snapshot id, rate, games]
ROOT_REPORTS_PER_S = 1_000  # a report costs the population root a receive, a ranking and a lineage row


def format_population(cfg: Config, world_size: int, node_of_rank: np.ndarray, member_layout: Layout,
                      frames_per_second: float, n_params: int) -> list[str]:
    """A population's lines (launch/population.py): members and their blocks of ranks, how the
    blocks sit on nodes, and what the population root and a copy carry (or, in a league, the
    snapshots). `frames_per_second`: one member's env frames per second at the assumed step
    rate; `n_params`: the policy's size."""
    # a copy: the weights, Adam's two moments (float32 each) and its step counts; buffers are small
    weights_bytes = 4 * n_params
    state_bytes = 3 * weights_bytes
    p = cfg.population
    per = world_size // p.members
    blocks = node_of_rank.reshape(p.members, per)
    spanning = int((blocks.min(axis=1) != blocks.max(axis=1)).sum())
    nodes_each = [len(np.unique(b)) for b in blocks]
    reports = p.members * frames_per_second / p.ready_frames
    blocks_text = "rank i is member i" if per == 1 else f"ranks {per}i to {per}i + {per - 1} are member i"
    lines = [f"population: {p.members:,} members x {per:,} rank{'s' if per > 1 else ''} ({blocks_text}), each "
             f"member laid out as below; the population root is member 0's learner root (rank "
             f"{member_layout.learner_root})",
             f"  nodes per member: {min(nodes_each)}-{max(nodes_each)}" if min(nodes_each) != max(nodes_each) else
             f"  nodes per member: {nodes_each[0]}",
             f"  the population root receives {reports:,.1f} reports/s ({p.members:,} members, one per "
             f"{p.ready_frames:,} frames of each, at {frames_per_second:,.0f} frames/s per member) and writes one "
             f"lineage row per report"]
    if p.league.members:  # a league copies no member onto another, but its exploiters may start again from one
        lines += _league_lines(cfg, reports, weights_bytes)
        if p.league.restart == "main" and p.league.main_exploiters + p.league.league_exploiters:
            lines.append(f"  an exploiter starts again from a main agent's newest snapshot: {format_bytes(weights_bytes)} "
                         f"from the main agent's learner root, at the exploiter's first report after its snapshot")
    else:
        lines.append(f"  a copy (exploit) moves {format_bytes(state_bytes)} from one learner root to another (weights, "
                     f"normalisers, Adam's state), then to the member's other learners; up to "
                     f"{max(1, int(p.members * p.truncation)):,} copies per round of judgements")
    if reports > ROOT_REPORTS_PER_S:
        wanted = p.members * frames_per_second / ROOT_REPORTS_PER_S
        lines.append(f"warning: {reports:,.0f} reports/s would keep the population root (one rank, which also "
                     f"trains member 0) busy; population.ready_frames >= {wanted:,.0f} keeps it under "
                     f"{ROOT_REPORTS_PER_S:,} a second")
    if spanning and per > 1:
        lines.append(f"warning: {spanning:,} of {p.members:,} members span two or more nodes (their ranks' "
                     f"traffic crosses the network); a member size that divides the ranks per node, or a "
                     f"multiple of it, keeps each member on whole nodes")
    return lines


def _league_lines(cfg: Config, reports: float, weights_bytes: int) -> list[str]:
    """What a league adds (core/league.py): the roles, the snapshots each learner root holds and
    the payoff matrix the population root keeps, and the snapshots' moves."""
    p, lg, slots = cfg.population, cfg.population.league, cfg.algo.selfplay.pool
    exploiters = lg.main_exploiters + lg.league_exploiters
    frames, win_rate = snapshot_rule(LEAGUE_EXPLOITER, lg.snapshot_frames, lg.exploiter_snapshot_frames,
                                     lg.snapshot_win_rate)
    ring = largest_ring(lg, p.ready_frames)
    kept = p.members * lg.keep
    every = f"a snapshot every {lg.snapshot_frames:,} frames of each"
    if exploiters and (frames != lg.snapshot_frames or win_rate):
        every = (f"a snapshot every {lg.snapshot_frames:,} frames of each main agent, every {frames:,} of each "
                 f"exploiter" + (f" (sooner once it wins {win_rate:.0%} of its games)" if win_rate else ""))
    return [f"  league: {lg.main:,} main agent{'s' if lg.main != 1 else ''}, {lg.main_exploiters:,} main exploiter"
            f"{'s' if lg.main_exploiters != 1 else ''}, {lg.league_exploiters:,} league exploiter"
            f"{'s' if lg.league_exploiters != 1 else ''}; {every}, {kept:,} kept in the league "
            f"({lg.keep:,} per member)",
            f"  each learner root holds {ring:,} of its own snapshots and {slots:,} slots: "
            f"{format_bytes((ring + slots) * weights_bytes)}; its weights messages carry one slot besides the policy "
            f"(twice the weights), and each policy holder holds {slots:,} slot copies",
            f"  a report redraws the member's {slots:,} slots: up to {reports * slots:,.1f} snapshot moves/s of "
            f"{format_bytes(weights_bytes)}, learner root to learner root; the population root's payoff matrix holds "
            f"up to {p.members * kept:,} win rates (members x snapshots kept)"] + (
        [f"warning: a payoff matrix of {p.members * kept:,} win rates makes the population root's league_state.json "
         f"about {format_bytes(PAYOFF_JSON_BYTES * p.members * kept)}, written every {SAVE_INTERVAL_S:g} s, and each "
         f"report draws from {kept:,} snapshots; population.league.keep <= "
         f"{max(1, MAX_PAYOFFS // (p.members * p.members)):,} keeps it under {MAX_PAYOFFS:,}"]
        if p.members * kept > MAX_PAYOFFS else [])
