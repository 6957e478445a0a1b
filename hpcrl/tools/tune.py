"""`hpcrl tune CONFIG --ranks-per-node C [--nodes N] [-o tuned.yaml] [--budget-s S]`: measure this
machine for the config (env steps, policy forwards, trainer updates, stream messages), then choose
the role counts, envs per env rank, env groups and inline or remote inference that the throughput
model (tools/tune_model.py) predicts fastest for the target nodes, keeping the algorithm as the
config has it: the frames per update stay the config's own (algo.batch_frames, or what its roles
table gives at the target size), and algo.rollout_length and every other setting are untouched.

Layouts come from `hpcrl plan`'s planner (`plan_layout`: counts, node-aware routing, fan-in) and
are checked as a run would check them (batch_frames fitting, memory per rank); nothing is planned
twice. No MPI across ranks: stream messages are timed in this one process (runtime/probe.py).
"""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass

import numpy as np

from hpcrl.core.observations import zeros
from hpcrl.core.config import Config, ConfigError, load_config, to_dict
from hpcrl.core.dataflow import ALGORITHMS, inference_messages
from hpcrl.core.layout import plan_layout, simulated_nodes, update_frames
from hpcrl.envs import EnvSpaces, probe_spaces
from hpcrl.tools.plan import DEFAULT_MEMORY_PER_RANK, memory
from hpcrl.tools.tune_model import Measured, Prediction, Shape, fit_line, predict

ENV_SIZES = (4, 8, 16, 32, 64, 128, 256)  # envs per env rank the tuner tries
FORWARD_ROWS = (1, 8, 64, 512)


# --- measuring ------------------------------------------------------------------------------------

def _timed(call, seconds: float, least: int = 3) -> float:
    """CPU seconds of one call, over about `seconds` of calls."""
    call()  # warm-up: first-call costs (allocation, lazy imports) are not the steady state
    count, start, wall = 0, time.process_time(), time.perf_counter()
    while count < least or time.perf_counter() - wall < seconds:
        call()
        count += 1
    return (time.process_time() - start) / count


def measure_actor(cfg: Config, spaces: EnvSpaces, seconds: float) -> tuple[list[int], list[float]]:
    """Seconds per vector step of an env rank as a run steps it, at a few vector sizes around the
    config's: the algorithm's own actor with an inline policy (async: it never waits for weights)
    sending its records to this process, so the env step, the policy forward and the actor's own
    per-step work (filling the record, episode statistics, final observations) are all in it."""
    import torch

    from hpcrl.core.messages import weights_spec
    from hpcrl.models import build_policy, copy_params_to, make_runner, num_params
    from hpcrl.runtime import comm
    from hpcrl.runtime.params import ParameterPublisher
    from hpcrl.runtime.streams import SampleReceiver, SampleSender
    from hpcrl.workers.policy_server import InlinePolicy, PolicySet
    torch.set_num_threads(cfg.run.torch_threads)
    sizes = sorted({max(1, cfg.env.num_envs // 2), cfg.env.num_envs, 2 * cfg.env.num_envs})
    algorithm = ALGORITHMS[cfg.algo.name]
    out = []
    for n in sizes:
        c = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, num_envs=n, groups=1),
                                algo=dataclasses.replace(cfg.algo, mode="async"))
        model = build_policy(spaces, c)
        publisher = ParameterPublisher(None, weights_spec(num_params(model)))
        publisher.publish(0, lambda flat: copy_params_to(model, flat))
        request, reply = inference_messages(c, spaces, 1)
        policy = InlinePolicy(PolicySet([make_runner(model, c.roles.env.device, seed=0)],
                                        [comm.LocalWeightSubscriber(publisher)]),
                              request.allocate(), reply.allocate(), sync=False)
        record = algorithm.record(c, spaces)
        me, stream = comm.world_rank(), comm.stream_communicator()
        receiver = SampleReceiver(stream, [me], [record.allocate() for _ in range(2)], per_sender=2)
        actor = algorithm.worker_class("env")(c, me, 0, [policy], [SampleSender(stream, me, [record.allocate()
                                                                                            for _ in range(2)])])
        steps = [0]

        def fragment():
            arrived = receiver.ready()
            while not arrived:
                actor.poll()
                arrived = receiver.ready()
            for slot in arrived:  # its credit goes back to the actor
                receiver.release(slot)
            steps[0] += c.algo.rollout_length * len(arrived)
        fragment()  # warm-up
        steps[0], start, wall = 0, time.process_time(), time.perf_counter()
        while steps[0] < 3 * c.algo.rollout_length or time.perf_counter() - wall < seconds / len(sizes):
            fragment()
        out.append((time.process_time() - start) / steps[0])
        for group in actor.groups:
            group.envs.close()
        receiver.close()
    return sizes, out


def measure_forward(cfg: Config, spaces: EnvSpaces, seconds: float) -> tuple[list[int], list[float]]:
    """Seconds per policy forward (an inference rank's runner) at a few batch sizes."""
    import torch

    from hpcrl.models import build_policy, make_runner
    torch.set_num_threads(cfg.run.torch_threads)
    runner = make_runner(build_policy(spaces, cfg), cfg.roles.inference.device, seed=0)
    out = []
    for rows in FORWARD_ROWS:
        obs = zeros(spaces.observation, (rows,))
        reply = {name: np.zeros((rows, *spaces.action_shape) if name == "actions" else
                                (rows, spaces.num_actions) if name == "q" else (rows,)) for name in runner.outputs}
        out.append(_timed(lambda: runner.act(obs, reply), seconds / len(FORWARD_ROWS)))
    return list(FORWARD_ROWS), out


def measure_update(cfg: Config, spaces: EnvSpaces, seconds: float) -> tuple[list[int], list[float]]:
    """Seconds per trainer update (the algorithm's own step, one trainer) at two batch sizes."""
    import torch

    from hpcrl.models import build_optimizer, build_policy
    algorithm = ALGORITHMS[cfg.algo.name]
    torch.set_num_threads(cfg.run.torch_threads)
    model = build_policy(spaces, cfg)
    optimizer = build_optimizer(model, cfg)  # the trainers' own
    step = algorithm.load("step")(cfg, model, optimizer, torch.device(cfg.roles.learner.device),
                                  np.random.default_rng(0), spaces.obs_dtype, spaces.action_dtype)
    record = algorithm.record(cfg, spaces)
    frames_per_fragment = cfg.algo.rollout_length * cfg.env.num_envs
    sizes, out = [], []
    for k in (1, 4):
        fragments = [record.allocate() for _ in range(k)]
        for f in fragments:
            f["logp"][...] = -np.log(max(spaces.num_actions, 2))
            if "active" in f.arrays:
                f["active"][...] = 1
            if "action_mask" in f.arrays:
                f["action_mask"][...] = 1
        sizes.append(k * frames_per_fragment)
        out.append(_timed(lambda: step(fragments, apply_step=optimizer.step), seconds / 2, least=2))
    return sizes, out


def measure_messages(cfg: Config, spaces: EnvSpaces, seconds: float) -> tuple[list[int], list[float]]:
    """Seconds per message by bytes: a request and its reply together (by their bytes together),
    and a fragment with its credit."""
    from hpcrl.runtime.probe import record_seconds, request_seconds
    request, reply = inference_messages(cfg, spaces, 1)
    record = ALGORITHMS[cfg.algo.name].record(cfg, spaces)
    pair = request_seconds(request, reply, seconds / 2)
    return ([request.nbytes + reply.nbytes, record.nbytes],
            [pair, record_seconds(record, seconds / 2)])


def measure(cfg: Config, spaces: EnvSpaces, budget_s: float) -> tuple[Measured, dict]:
    """Every measurement, within about `budget_s` seconds; the fitted costs and the raw points."""
    if ALGORITHMS[cfg.algo.name].batch_source != ALGORITHMS["ppo"].batch_source:
        raise ConfigError(f"hpcrl tune models the PPO family (ppo, mappo, ippo) so far; algo.name {cfg.algo.name} "
                          f"(a replay learner) is not modelled yet")
    share = budget_s / 4
    points = {"actor_step": measure_actor(cfg, spaces, share), "forward": measure_forward(cfg, spaces, share),
              "update": measure_update(cfg, spaces, share), "message": measure_messages(cfg, spaces, share)}
    fits = {name: fit_line([float(x) for x in xs], ys) for name, (xs, ys) in points.items()}
    return Measured(rows_per_env=spaces.num_agents, **fits), points


# --- choosing ---------------------------------------------------------------------------------------

@dataclass
class Choice:
    cfg: Config  # the config with the chosen layout
    prediction: Prediction
    counts: tuple[int, int, int]  # learner, inference, env ranks


def _counts(world: int) -> list[tuple[int, int]]:
    """(learners, inference ranks) to try: powers of two and a few small counts, up to half the job."""
    steps = sorted({1, 2, 3, 4} | {2 ** k for k in range(int(np.log2(max(world, 1))) + 1)})
    learners = [c for c in steps if c <= world // 2]
    inference = [0] + [c for c in steps if c <= world // 2]
    return [(L, I) for L in learners for I in inference if world - L - I >= max(L, I, 1)]


def candidates(cfg: Config, spaces: EnvSpaces, m: Measured, ranks_per_node: int, nodes: int, cores: float,
               memory_per_rank: int = DEFAULT_MEMORY_PER_RANK) -> tuple[list[Choice], Choice | None]:
    """Every layout the tuner considers for `nodes` x `ranks_per_node` ranks, with its prediction,
    fastest first, and the config's own layout predicted alike (None if it does not fit). The
    frames per update stay the config's (see the module's docstring)."""
    from hpcrl.models import build_policy, num_params
    world = nodes * ranks_per_node
    plan = _Planner(cfg, spaces, m, world, ranks_per_node, cores, memory_per_rank, num_params(build_policy(spaces, cfg)))
    out = []
    for L, I in _counts(world):
        for n in ENV_SIZES:
            for G in ((1, 2) if I else (1,)):
                if n % G:
                    continue
                choice = plan(dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, num_envs=n, groups=G),
                                                  roles=_roles(cfg, L, I)))
                if choice is not None:
                    out.append(choice)
    if not out:
        raise ConfigError(f"no layout of {world} ranks fits algo.batch_frames {plan.batch:,} in whole fragments of "
                          f"algo.rollout_length {cfg.algo.rollout_length} x a power-of-two env.num_envs; set "
                          f"algo.batch_frames to a multiple of {cfg.algo.rollout_length * 64:,}")
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

    def __post_init__(self):
        self.node_map = simulated_nodes(self.world, self.ranks_per_node)
        # the algorithm's frames per update: the config's, or what its roles table gives at this size
        self.batch = self.cfg.algo.batch_frames or update_frames(self.cfg, plan_layout(self.cfg.roles, self.world,
                                                                                       self.node_map))

    def __call__(self, c: Config) -> Choice | None:
        c = dataclasses.replace(c, algo=dataclasses.replace(c.algo, batch_frames=self.batch))
        try:
            layout = plan_layout(c.roles, self.world, self.node_map)
            update_frames(c, layout)  # batch_frames in whole fragments of every env rank (sync) or learner (async)
            if max(dataclasses.astuple(memory(c, layout, self.spaces, self.n_params))) > self.memory_per_rank:
                return None
        except ConfigError:
            return None
        G, remote = c.env.groups, not layout.inline_inference
        request, reply = inference_messages(c, self.spaces, G)
        shape = Shape(learners=len(layout.learners), inference=len(layout.inference), envs=len(layout.envs),
                      num_envs=c.env.num_envs, groups=G, rollout=c.algo.rollout_length, batch_frames=self.batch,
                      envs_per_inference=int(layout.fan_in("inference").max()) if remote else 0,
                      envs_per_learner=int(layout.fan_in("learner").max()),
                      request_bytes=request.group_offset("final_obs"), reply_bytes=reply.nbytes,
                      fragment_bytes=ALGORITHMS[c.algo.name].record(c, self.spaces).nbytes,
                      sync=c.algo.mode == "sync", gradient_steps=c.algo.epochs * c.algo.num_minibatches,
                      gradient_bytes=4 * self.n_params)
        return Choice(c, predict(self.measured, shape, self.cores),
                      (len(layout.learners), len(layout.inference), len(layout.envs)))


def _roles(cfg: Config, learners: int, inference: int):
    r = cfg.roles
    return dataclasses.replace(r, learner=dataclasses.replace(r.learner, ranks=learners, per_node=None),
                               inference=dataclasses.replace(r.inference, ranks=inference, per_node=None),
                               env=dataclasses.replace(r.env, ranks="rest", per_node=None))


# --- reporting ----------------------------------------------------------------------------------------

def header(config_path: str, points: dict, best: Choice, shipped: Prediction | None, nodes: int,
           ranks_per_node: int, cores: float) -> str:
    """The comment block of a tuned config: what was measured, what is predicted, what bounds it."""
    p = best.prediction
    lines = [f"tuned by hpcrl tune from {config_path} for {nodes} node(s) x {ranks_per_node} ranks "
             f"({cores:g} cores) on {os.uname().nodename}, {time.strftime('%Y-%m-%d %H:%M')}",
             "measured (CPU seconds on one core of this machine):"]
    for name, (xs, ys) in points.items():
        unit = {"actor_step": "envs", "forward": "rows", "update": "frames", "message": "bytes"}[name]
        lines.append(f"  {name:9s} " + ", ".join(f"{x:,} {unit}: {y * 1e6:,.0f} us" for x, y in zip(xs, ys)))
    L, I, E = best.counts
    lines.append(f"chosen: {L} learner, {I} inference{' (inline)' if not I else ''}, {E} env ranks x "
                 f"{best.cfg.env.num_envs} envs in {best.cfg.env.groups} group(s); "
                 f"algo.batch_frames {best.cfg.algo.batch_frames:,}")
    lines.append(f"predicted: {p.frames_per_s:,.0f} frames/s, bound by {p.bound}; each role alone: "
                 + ", ".join(f"{r} {v:,.0f}" for r, v in p.per_role.items()))
    if shipped is not None:
        lines.append(f"the config's own layout, predicted: {shipped.frames_per_s:,.0f} frames/s, bound by {shipped.bound}")
    return "".join(f"# {line}\n" for line in lines)


@dataclass
class Tuned:
    text: str  # the tuned config: its header and YAML
    best: Choice
    ranked: list[Choice]  # every candidate, fastest first
    own: Choice | None  # the config's own layout, predicted alike (None: it does not fit)
    points: dict  # the measurements: name -> (sizes, CPU seconds)


def tune(config_path: str, ranks_per_node: int, nodes: int = 1, cores_per_node: float | None = None,
         budget_s: float = 60.0, overrides: tuple[str, ...] = ()) -> Tuned:
    """Measure, choose, and return the tuned config with what led to it."""
    import yaml
    cfg, _ = load_config(config_path, overrides)
    spaces = probe_spaces(cfg.env)
    measured, points = measure(cfg, spaces, budget_s)
    cores = float(cores_per_node or ranks_per_node) * nodes
    ranked, own = candidates(cfg, spaces, measured, ranks_per_node, nodes, cores)
    best = ranked[0]
    text = header(config_path, points, best, own.prediction if own else None, nodes, ranks_per_node, cores)
    return Tuned(text + yaml.safe_dump(to_dict(best.cfg), sort_keys=False), best, ranked, own, points)
