"""The layout search of `hpcrl tune`: every layout it considers for the target nodes, from `hpcrl
plan`'s planner (`plan_layout`: counts, node-aware routing, fan-in) and checked as a run would check
it (batch_frames fitting, memory per rank), each predicted by the throughput model (model.py); and
the choice among them. The frames per update stay the config's own (algo.batch_frames, or what its
roles table gives at the target size); DQN's (and SAC's, TD3's) layouts keep their batch size (shared by the
learners) and, without a replay ratio (Ape-X), the config's learner count.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from hpcrl.core.config import Config, ConfigError
from hpcrl.core.config_sac import replay_settings
from hpcrl.core.dataflow import ALGORITHMS, inference_messages
from hpcrl.core.layout import plan_layout, simulated_nodes
from hpcrl.envs import EnvSpaces
from hpcrl.core.sizing import DEFAULT_MEMORY_PER_RANK, Sizes, memory
from hpcrl.tools.tune.measure import replays
from hpcrl.tools.tune.model import Measured, Prediction, Shape, predict

ENV_SIZES = (4, 8, 16, 32, 64, 128, 256)  # envs per env rank the tuner tries
TIE = 0.02  # layouts predicted within 2% of the best tie with it (the config's own layout wins a tie)


@dataclass
class Choice:
    cfg: Config  # the config with the chosen layout
    prediction: Prediction
    counts: tuple[int, int, int]  # learner, inference, env ranks


def fixed_learners(cfg: Config, own) -> int | None:
    """The learner count every layout keeps (None: the tuner chooses it). DQN without a replay
    ratio (Ape-X): the learners train flat out, so more of them never means more frames; their count
    stays the config's own layout's `own` (how much to train is the user's choice)."""
    return len(own.learners) if replays(cfg) and cfg.algo.replay.replay_ratio is None else None


def _counts(world: int, fixed_learners: int | None = None) -> list[tuple[int, int]]:
    """(learners, inference ranks) to try: the counts of _steps (`fixed_learners`: that many
    learners only)."""
    learners = [fixed_learners] if fixed_learners else _steps(world)
    return [(L, I) for L in learners for I in [0, *_steps(world)] if world - L - I >= max(L, I, 1)]


def _steps(world: int) -> list[int]:
    """1, powers of two and three times them, up to half the job."""
    powers = [2 ** k for k in range(int(np.log2(max(world, 1))) + 1)]
    return sorted(c for c in {1, *powers, *(3 * p for p in powers)} if c <= world // 2)


def pick(choices: list[Choice]) -> Choice:
    """Of the layouts predicted within TIE of the fastest, the one with the fewest envs per env rank
    (less memory, a fresher policy, a quicker start), then the fastest."""
    top = max(c.prediction.frames_per_s for c in choices)
    return min((c for c in choices if c.prediction.frames_per_s >= (1 - TIE) * top),
               key=lambda c: (c.cfg.env.num_envs, -c.prediction.frames_per_s))


def choose(ranked: list[Choice], own: Choice | None) -> Choice:
    """The layout to write: the config's own (`own`) unless a layout of `ranked` (fastest first) is
    predicted faster by more than the model can tell apart (TIE), else `pick`."""
    if own is not None and own.prediction.frames_per_s >= (1 - TIE) * ranked[0].prediction.frames_per_s:
        return own
    return pick(ranked)


def _role_tables(cfg: Config, world: int, nodes: int, fixed_learners: int | None, gpus_per_node: int):
    """The roles tables to try: learner and inference counts on CPUs (_counts), and with GPUs,
    inference ranks on them (j per node) beside CPU learners, and k learners per node on GPUs
    (k = 1..gpus_per_node) beside inference ranks on CPUs, or j per node on the GPUs left (one GPU
    per rank, every node alike)."""
    pairs = _counts(world, fixed_learners)
    for L, I in pairs:
        yield _roles(cfg, ("ranks", L, "cpu"), ("ranks", I, "cpu"))
    for L in sorted({L for L, _ in pairs}):
        for j in range(1, gpus_per_node + 1):
            if world - L - j * nodes >= L:
                yield _roles(cfg, ("ranks", L, "cpu"), ("per_node", j, "cuda"))
    for k in range(1, gpus_per_node + 1):
        L = k * nodes
        if L > world // 2 or fixed_learners not in (None, L):
            continue
        for I in [0, *_steps(world)]:  # CPU inference ranks beside them
            if world - L - I >= max(L, I, 1):
                yield _roles(cfg, ("per_node", k, "cuda"), ("ranks", I, "cpu"))
        for j in range(1, gpus_per_node - k + 1):
            if world - L - j * nodes >= L:
                yield _roles(cfg, ("per_node", k, "cuda"), ("per_node", j, "cuda"))


def candidates(cfg: Config, spaces: EnvSpaces, m: Measured, ranks_per_node: int, nodes: int, cores: float,
               memory_per_rank: int = DEFAULT_MEMORY_PER_RANK, gpus_per_node: int = 0
               ) -> tuple[list[Choice], Choice | None]:
    """Every layout the tuner considers for `nodes` x `ranks_per_node` ranks (and `gpus_per_node`
    GPUs, where `m` has GPU costs), with its prediction, fastest first, and the config's own layout
    predicted alike (None if it does not fit). The frames per update stay the config's (see the
    module's docstring)."""
    from hpcrl.models import build_policy, num_params
    world = nodes * ranks_per_node
    plan = _Planner(cfg, spaces, m, world, ranks_per_node, cores, memory_per_rank, num_params(build_policy(spaces, cfg)),
                    gpus_per_node)
    out = []
    gpus = gpus_per_node if m.update_cuda is not None else 0
    for roles in _role_tables(cfg, world, nodes, plan.fixed_learners, gpus):
        for n in ENV_SIZES:
            for G in ((1, 2) if roles.inference.ranks != 0 else (1,)):
                if n % G:
                    continue
                choice = plan(dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, num_envs=n, groups=G),
                                                  roles=roles))
                if choice is not None:
                    out.append(choice)
    if not out:
        raise ConfigError(plan.why_none())
    return sorted(out, key=lambda ch: -ch.prediction.frames_per_s), plan(cfg)


@dataclass
class _Planner:
    """A candidate config -> its Choice, through plan_layout and the run's own checks (None when
    the layout does not fit: counts, batch_frames, memory per rank)."""

    cfg: Config
    spaces: EnvSpaces
    measured: Measured
    world: int
    ranks_per_node: int
    cores: float
    memory_per_rank: int
    n_params: int
    gpus_per_node: int = 0

    def __post_init__(self):
        self.node_map = simulated_nodes(self.world, self.ranks_per_node)
        self.gpus = np.full(self.world, self.gpus_per_node) if self.gpus_per_node else None
        # the algorithm's frames per update: the config's, or what its roles table gives at this size
        own = plan_layout(self.cfg.roles, self.world, self.node_map, self.gpus)
        # (a replay algorithm's batch is algo.dqn.batch_size or algo.sac.batch_size, shared by the learners: the config's own count may not
        # split it, and others do)
        self.batch = 0 if replays(self.cfg) else self.cfg.algo.batch_frames or Sizes.of(self.cfg, own).update_frames
        self.fixed_learners = fixed_learners(self.cfg, own)
        self.tried = 0  # layouts tried
        self.rejected: dict[str, int] = {"batch": 0, "memory": 0}  # layouts that did not fit, by why
        self.least_memory = (float("inf"), "")  # of those over the memory per rank: the least a rank needed

    def why_none(self) -> str:
        """Why no layout fitted: the batch, or the memory per rank (what a user can change)."""
        c, gib = self.cfg, 2 ** 30
        parts = [f"no layout of {self.world} ranks fits"]
        if not self.tried:
            need = (f"the config's {self.fixed_learners} learner(s) (Ape-X keeps the config's learner count) and at "
                    f"least as many env ranks" if self.fixed_learners else "a learner and an env rank")
            return f"{parts[0]}: it needs {need}; give the job more ranks"
        if self.rejected["memory"]:
            most, role = self.least_memory
            parts.append(f"{self.rejected['memory']} need more than {self.memory_per_rank / gib:g} GiB on a rank (at "
                         f"least {most / gib:.1f} GiB on a {role} rank; --memory-per-rank-gib raises the limit"
                         + ("; algo.replay.capacity sets the replay shards)" if replays(c) else
                            "; learners hold their batch: more learners, or a smaller algo.batch_frames)"))
        if self.rejected["batch"]:
            parts.append(f"{self.rejected['batch']} do not split " + (
                f"{replay_settings(c.algo)[1]}.batch_size {replay_settings(c.algo)[0].batch_size} evenly over the "
                f"learners" if replays(c) else
                f"algo.batch_frames {self.batch:,} into whole fragments of algo.rollout_length "
                f"{c.algo.rollout_length} x a power-of-two env.num_envs per learner (a multiple of "
                f"{c.algo.rollout_length * 64:,} splits for most)"))
        return parts[0] + ": " + "; ".join(parts[1:])

    def __call__(self, c: Config) -> Choice | None:
        self.tried += 1
        replay = replays(c)
        if not replay:  # a replay algorithm's batch size is shared by the learners
            c = dataclasses.replace(c, algo=dataclasses.replace(c.algo, batch_frames=self.batch))
        try:
            layout = plan_layout(c.roles, self.world, self.node_map, self.gpus)
            sizes = Sizes.of(c, layout)  # batch_frames in whole fragments of every env rank (sync) or learner (async)
            need = memory(c, layout, sizes, self.spaces, self.n_params)
        except ConfigError:
            self.rejected["batch"] += 1
            return None
        role, most = max(dataclasses.asdict(need).items(), key=lambda item: item[1])
        if most > self.memory_per_rank:
            self.rejected["memory"] += 1
            self.least_memory = min(self.least_memory, (most, role))
            return None
        G, remote = c.env.groups, not layout.inline_inference
        request, reply = inference_messages(c, self.spaces, G)
        record = ALGORITHMS[c.algo.name].record(c, self.spaces)
        shape = Shape(learners=len(layout.learners), inference=len(layout.inference), envs=len(layout.envs),
                      num_envs=c.env.num_envs, groups=G, rollout=c.algo.rollout_length, batch_frames=self.batch,
                      envs_per_inference=int(layout.fan_in("inference").max()) if remote else 0,
                      envs_per_learner=int(layout.fan_in("learner").max()),
                      request_bytes=request.group_offset("final_obs"), reply_bytes=reply.nbytes,
                      fragment_bytes=record.nbytes, sync=c.algo.mode == "sync",
                      gradient_steps=(replay_settings(c.algo)[0].gradient_steps if replay
                                      else c.algo.epochs * c.algo.num_minibatches),
                      gradient_bytes=4 * self.n_params, replay=replay, replay_ratio=c.algo.replay.replay_ratio,
                      step_rows=sizes.busiest.replay.batch if replay else 0,
                      **(_record_size(c, record, G) if replay else {}),
                      learner_cuda=c.roles.learner.device == "cuda", inference_cuda=c.roles.inference.device == "cuda")
        return Choice(c, predict(self.measured, shape, self.cores),
                      (len(layout.learners), len(layout.inference), len(layout.envs)))


def _record_size(c: Config, record, groups: int) -> dict[str, int]:
    """DQN: the rows and env steps a record holds as its actor ships it. Transitions: one per env
    step, shipped once another group step might not fit (workers/replay_writer.py: a step may write n_step
    + 1 rows per env); sequences: one per env every sequence_period steps, shipped full."""
    rows, per_group, (d, _) = record.field("priorities").shape[0], c.env.num_envs // groups, replay_settings(c.algo)
    if "state0" in (f.name for f in record.fields):
        return {"record_rows": rows, "record_frames": rows * d.sequence_period}
    filled = max(rows - d.n_step * per_group, per_group)
    return {"record_rows": filled, "record_frames": filled}


def _roles(cfg: Config, learner: tuple[str, int, str], inference: tuple[str, int, str]):
    """The config's roles with learner and inference as (`ranks` or `per_node`, count, device), and
    the env ranks the rest."""
    r = cfg.roles

    def role(spec, how):
        key, count, device = how
        return dataclasses.replace(spec, ranks=count if key == "ranks" else None,
                                   per_node=count if key == "per_node" else None, device=device)
    return dataclasses.replace(r, learner=role(r.learner, learner), inference=role(r.inference, inference),
                               env=dataclasses.replace(r.env, ranks="rest", per_node=None))
