"""`hpcrl plan`: what a layout means before a job is submitted (no MPI).

Ranks per role and per node, fan-in per inference and learner rank, the bytes each role sends at
an assumed env step rate (from the exact message sizes), the memory each role's buffers, batch and
model take, and warnings about layouts that will be slow or exceed the fan-in or memory limits.
`memory_problem` turns that estimate into a config error before a run allocates anything.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from hpcrl.core.config import DEFAULT_MAX_ENV_RANKS, Config
from hpcrl.core.dataflow import ALGORITHMS, inference_messages
from hpcrl.core.layout import (FRAGMENT_BUFFERS, INLINE, Layout, batch_fragments, env_groups, fragments_per_env_rank,
                               plan_layout, replay_shard, sample_slots, update_frames)
from hpcrl.core.messages import MessageSpec, replay_fields, weights_spec
from hpcrl.core.policies import num_policies, policy_spaces
from hpcrl.envs import EnvSpaces

MODEL_COPIES = {"learner": 5, "inference": 2, "env": 2}  # params x: weights, grads, Adam's two moments, message
DEFAULT_MEMORY_PER_RANK = 4 * 2**30  # what a core of a typical HPC node has
MEMORY_LIMIT_UNKNOWN_NODE = 64 * 2**30  # run.memory_limit_gib's default where a node's memory cannot be read


@dataclass
class Memory:
    """Bytes the busiest rank of each role holds for hpcrl's own buffers, batch and model (the
    Python, torch and env processes themselves come on top: about 50 MiB for a torch-free env
    rank, 250 MiB for a rank with torch)."""

    env: int
    inference: int
    learner: int

    def of(self, role: str) -> int:
        return getattr(self, role)


def memory(cfg: Config, layout: Layout, spaces: EnvSpaces, num_params: int) -> Memory:
    G = env_groups(cfg, layout)
    req, rep = (m.nbytes for m in inference_messages(cfg, spaces, G))
    frag = ALGORITHMS[cfg.algo.name].record(cfg, spaces).nbytes
    weights = weights_spec(num_params).nbytes
    model = 4 * num_params
    learner_fan = int(layout.fan_in("learner").max()) if len(layout.learners) else 0
    inference_fan = int(layout.fan_in("inference").max()) if len(layout.inference) else 0
    inline = layout.inline_inference
    env = G * (req + rep) + FRAGMENT_BUFFERS * frag + (MODEL_COPIES["env"] * model + weights if inline else 0)
    # inference: a request and a reply buffer per (env rank, group), the batch arrays, the policy
    inference = inference_fan * G * (2 * req + 2 * rep) + MODEL_COPIES["inference"] * model + weights
    # learner: the sample slots, the batch assembled from them (a copy of its fragments), the model;
    # DQN: the replay shard and its sum-tree instead of the batch, and a target network
    if cfg.algo.name == "dqn":
        data = replay_bytes(cfg, layout, ALGORITHMS["dqn"].record(cfg, spaces)) + model
    else:
        data = batch_fragments(cfg, layout, learner_fan) * frag
    learner = (sample_slots(cfg, layout, learner_fan) * frag + data + MODEL_COPIES["learner"] * model
               + weights) if learner_fan else 0
    return Memory(env=env, inference=inference if inference_fan else 0, learner=learner)


def policy_params(cfg: Config, spaces: EnvSpaces) -> int:
    """Parameters (and normaliser buffers: the weights message's length) of the largest policy,
    counted on a model built on torch's meta device: it allocates nothing, so absurd layer widths
    cost nothing to count. A ConfigError if model.encoder cannot take the observations."""
    import torch

    from hpcrl.models import build_policy, num_params
    with torch.device("meta"):
        return max(num_params(build_policy(s, cfg)) for s in policy_spaces(spaces, cfg.policies))


def memory_limit(cfg: Config) -> tuple[int, str]:
    """Bytes one rank may need for hpcrl's buffers, batch and model, and where that number comes from:
    run.memory_limit_gib, or the physical memory of this node (rank 0's, which checks the config)."""
    if cfg.run.memory_limit_gib is not None:
        return int(cfg.run.memory_limit_gib * 2**30), "run.memory_limit_gib"
    try:
        node = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return node, "this node's memory, run.memory_limit_gib: null"
    except (ValueError, OSError, AttributeError):  # no sysconf, or it does not know these names
        return MEMORY_LIMIT_UNKNOWN_NODE, "run.memory_limit_gib: null, where a node's memory is unknown"


def memory_problem(cfg: Config, world_size: int, spaces: EnvSpaces) -> str | None:
    """What is wrong when the busiest rank of some role would need more memory than `memory_limit`
    for hpcrl's buffers, batch and model (as `hpcrl plan` estimates them, with no model built and
    nothing allocated), naming the config key that drives it; None when every rank fits. A run
    checks this before it builds its first model, so a 10**9-wide layer or a 10**9-frame fragment
    is a config error, not a MemoryError after the run directory was written."""
    layout = plan_layout(cfg.roles, world_size, policies=num_policies(cfg.policies))
    n_params = policy_params(cfg, spaces)
    mem = memory(cfg, layout, spaces, n_params)
    # serial mode: rank 0 is the learner and the env rank at once
    need = {"learner": mem.learner + mem.env} if layout.serial else {r: mem.of(r) for r in MODEL_COPIES}
    role = max(need, key=need.get)
    limit, source = memory_limit(cfg)
    if need[role] <= limit:
        return None
    model = MODEL_COPIES[role] * 4 * n_params
    if 2 * model >= need[role]:
        key = "model.hidden_sizes" + (" and model.core_size" if cfg.model.core != "none" else "")
        advice = f"lower {key}"
    else:
        key, advice = _data_key(cfg, role), _lower_memory(cfg, role)
    who = "rank 0 (learner and env rank at once, serial mode)" if layout.serial else f"each {role} rank"
    return (f"{key}: {who} would need about {_bytes(need[role])} for its buffers, batch and model "
            f"({n_params:,} parameters), more than the {_bytes(limit)} one rank may use ({source}): {advice}")


def _data_key(cfg: Config, role: str) -> str:
    """The config key whose value sizes a role's buffers most."""
    if role == "learner" and cfg.algo.name == "dqn":
        return "algo.replay.capacity"
    if role == "learner" and cfg.algo.batch_frames is not None:
        return "algo.batch_frames"
    return "env.num_envs" if role == "inference" else "env.num_envs x algo.rollout_length"


def _lower_memory(cfg: Config, role: str) -> str:
    """What shrinks the buffers and batch of one rank of `role`."""
    if role == "learner":
        return ("add learners or lower algo.replay.capacity" if cfg.algo.name == "dqn" else
                "add learners or lower roles.learner.sample_slots, env.num_envs or algo.rollout_length"
                if cfg.algo.batch_frames is None else
                "add learners or lower roles.learner.sample_slots or algo.batch_frames")
    return "add inference ranks or lower env.num_envs" if role == "inference" else \
        "lower env.num_envs or algo.rollout_length"


def replay_bytes(cfg: Config, layout: Layout, record: MessageSpec) -> int:
    """One DQN learner's replay shard: its transitions (or sequences), their raw priorities, the sum-tree (float64
    over the next power of two of leaves) and a sampled batch."""
    capacity, _, batch = replay_shard(cfg, layout)
    row = sum(record.field(name).nbytes // record.field(name).shape[0] for name in replay_fields(record))
    leaves = 1 << max(capacity - 1, 0).bit_length()
    return capacity * (row + 8) + 2 * leaves * 8 + batch * row


@dataclass
class Traffic:
    """Bytes per second sent by one rank of each kind, at `steps_per_second` vector steps per env rank."""

    env_requests: float
    env_fragments: float
    inference_replies: float  # per inference rank at its largest fan-in
    learner_fragments_in: float  # received by the learner with the largest fan-in
    weights_per_update: int
    updates_per_second: float
    allreduce_per_second: float  # gradient bytes each learner reduces per second


def traffic(cfg: Config, layout: Layout, spaces: EnvSpaces, num_params: int, steps_per_second: float) -> Traffic:
    T, N = cfg.algo.rollout_length, cfg.env.num_envs
    G = env_groups(cfg, layout)
    req, rep = inference_messages(cfg, spaces, G)
    frag = ALGORITHMS[cfg.algo.name].record(cfg, spaces)
    # per group and step one request (G per env step), plus one per rollout for bootstrap values (PPO)
    dqn = cfg.algo.name == "dqn"
    requests_per_s = G * steps_per_second * (1 if dqn else (T + 1) / T)
    fragments_per_s = steps_per_second / T
    remote = not layout.inline_inference
    inf_fan = int(layout.fan_in("inference").max()) if remote else 0
    learner_fan = int(layout.fan_in("learner").max())
    frames_per_s = fragments_per_s * len(layout.envs) * T * N
    if dqn:  # replay_ratio samples per frame, in updates of gradient_steps x batch_size (null: as fast as they can)
        d = cfg.algo.dqn
        updates_per_s = frames_per_s * (cfg.algo.replay.replay_ratio or 0.0) / (d.gradient_steps * d.batch_size)
        steps_per_update = d.gradient_steps
    else:  # one update per batch_frames frames (a fragment per env rank by default), if training keeps up
        updates_per_s = frames_per_s / update_frames(cfg, layout)
        steps_per_update = cfg.algo.epochs * cfg.algo.num_minibatches
    return Traffic(
        env_requests=requests_per_s * req.group_offset("final_obs") if remote else 0.0,
        env_fragments=fragments_per_s * frag.nbytes,
        inference_replies=inf_fan * requests_per_s * rep.nbytes,
        learner_fragments_in=learner_fan * fragments_per_s * frag.nbytes,
        weights_per_update=4 * num_params,
        updates_per_second=updates_per_s,
        allreduce_per_second=(updates_per_s * steps_per_update * 4 * num_params
                              if len(layout.learners) > 1 else 0.0))


@dataclass
class Crossing:
    """What crosses nodes in a layout, per event: the prediction that a run's measured counts
    (metrics.h5's crossed_nodes attributes, `hpcrl.runtime.traffic`) are checked against."""

    weights_copies: int  # messages per weights version: one to each node holding a policy copy, but the root's
    weights_bytes: int  # bytes of one of them
    remote_inference: int  # env ranks whose policy server is on another node: each step's request and reply cross
    remote_learner: int  # env ranks (per policy) whose learner is on another node: each fragment and credit crosses


def crossing(layout: Layout, num_params: int) -> Crossing:
    node = layout.node_of_rank
    root = layout.learner_root
    holders = {int(node[r]) for r in layout.weight_subscribers()}
    served = layout.env_inference != INLINE
    remote_inference = int(np.sum(node[layout.env_inference[served]] != node[layout.envs[served]]))
    remote_learner = int(np.sum(node[layout.env_learners] != node[layout.envs][None, :]))
    return Crossing(len(holders - {int(node[root])}), weights_spec(num_params).nbytes, remote_inference,
                    remote_learner)


def _crossing_lines(layout: Layout, c: Crossing) -> list[str]:
    envs = len(layout.envs)
    copies = f"{c.weights_copies} cop{'y' if c.weights_copies == 1 else 'ies'}"
    return [f"crossing nodes: {copies} of each weights version ({c.weights_bytes:,} bytes; one per node that "
            f"holds a policy copy, but the learner root's)",
            f"  requests and replies of {c.remote_inference:,} of {envs:,} env ranks (a policy server on another "
            f"node), fragments of {c.remote_learner:,} (a learner on another node)"]


def warnings(cfg: Config, layout: Layout, mem: Memory | None = None,
             memory_per_rank: int = DEFAULT_MEMORY_PER_RANK) -> list[str]:
    """Layout problems worth fixing before a long job: fan-in and memory limits, imbalance,
    cross-node traffic."""
    out = []
    for role in ("learner", "inference", "env") if mem is not None else ():
        if mem.of(role) > memory_per_rank:
            out.append(f"each {role} rank needs about {_bytes(mem.of(role))} for its buffers, batch and model, more "
                       f"than the {_bytes(memory_per_rank)} per rank assumed (--memory-per-rank-gib): "
                       + _lower_memory(cfg, role))
    for role in ("inference", "learner"):
        fan = layout.fan_in(role)
        if len(fan) == 0:
            continue
        limit = getattr(cfg.roles, role).max_env_ranks
        limit = DEFAULT_MAX_ENV_RANKS if limit is None else limit
        servers = layout.learners if role == "learner" else layout.inference
        if limit and fan.max() > limit:
            worst = int(servers[int(np.argmax(fan))])
            out.append(f"{int((fan > limit).sum())} {role} ranks serve more than roles.{role}.max_env_ranks = "
                       f"{limit} env ranks (rank {worst} serves {int(fan.max())}); add {role} ranks")
        # learners: imbalance stalls every sync update; inference: only a marked one matters
        uneven = (fan.max() > 1.05 * fan.min() if role == "learner"
                  else fan.max() > max(1.2 * fan.mean(), fan.min() + 1))
        if uneven:
            slow = int(servers[int(np.argmax(fan))])
            what = ("its env ranks wait longer for actions" if role != "learner" else
                    "every sync update waits for it" if cfg.algo.mode == "sync" else
                    "the learners average gradients in lockstep, so every update waits for its batch")
            out.append(f"{role} fan-in is uneven ({int(fan.min())} to {int(fan.max())} env ranks): {role} rank "
                       f"{slow} will be the bottleneck, {what}; make the env rank count a multiple of the "
                       f"{role} count")
    if not layout.inline_inference:
        remote = layout.node_of_rank[layout.envs] != layout.node_of_rank[layout.env_inference]
        if remote.any():
            out.append(f"{int(remote.sum())} env ranks use an inference rank on another node (their nodes have "
                       f"none): observations cross the network every step; use inference per_node")
    return out


def _per_node(layout: Layout, ranks: np.ndarray) -> str:
    if len(ranks) == 0:
        return "-"
    nodes, inverse = np.unique(layout.node_of_rank, return_inverse=True)
    counts = np.bincount(inverse[ranks], minlength=len(nodes))
    return f"{counts.min()}-{counts.max()}" if counts.min() != counts.max() else str(counts.min())


def _bytes(x: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if x >= size:
            return f"{x / size:.1f} {unit}"
    return f"{x:.0f} B"


def _rate(x: float) -> str:
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if x >= size:
            return f"{x / size:.1f} {unit}"
    return f"{x:.0f} B/s"


def _batch_line(cfg: Config, layout: Layout) -> str:
    """The batch of one update: frames over all learners, fragments per env rank and per learner
    (DQN: transitions per gradient step, and the replay shards)."""
    if cfg.algo.name == "dqn":
        d, r = cfg.algo.dqn, cfg.algo.replay
        capacity, warmup, batch = replay_shard(cfg, layout)
        ratio = f"replay ratio {r.replay_ratio:g}" if r.replay_ratio else "no replay ratio (as fast as they can)"
        unit = "sequences" if cfg.model.core != "none" else "transitions"  # R2D2's rows are sequences
        return (f"batch: {d.batch_size:,} {unit} per gradient step ({batch:,} per learner), {d.gradient_steps} "
                f"gradient steps per update, {ratio}; replay shard per learner: {capacity:,} {unit}, warm-up "
                f"{warmup:,}")
    fan = layout.fan_in("learner")
    low, high = batch_fragments(cfg, layout, int(fan.min())), batch_fragments(cfg, layout, int(fan.max()))
    per_learner = f"{low}-{high}" if low != high else str(low)
    F = cfg.algo.rollout_length * cfg.env.num_envs
    text = f"batch: {update_frames(cfg, layout):,} frames per update"
    text += " (algo.batch_frames)" if cfg.algo.batch_frames is not None else ""
    if cfg.algo.batch_frames is not None and cfg.algo.mode == "async":  # in arrival order, from any env rank
        return text + f": {per_learner} fragments of {F:,} frames per learner"
    k = fragments_per_env_rank(cfg, layout)
    return text + f": {k} fragment{'s' if k > 1 else ''} of {F:,} frames per env rank, {per_learner} per learner"


def format_plan(cfg: Config, layout: Layout, t: Traffic, steps_per_second: float, per_rank: bool,
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
    lines.append(_batch_line(cfg, layout))
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
        lines.append(f"  learner {_bytes(mem.learner)} ({sample_slots(cfg, layout, int(learner_fan.max()))} sample "
                     f"slots), inference {_bytes(mem.inference)}, env {_bytes(mem.env)}")
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

