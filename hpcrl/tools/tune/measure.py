"""What `hpcrl tune` measures on the machine it runs on, in one process (CPU seconds on one core):
an env rank's step as the algorithm's own actor takes it, the policy forward, the trainer's update
(DQN: a gradient step, and taking records into a replay shard) and hpcrl's stream messages. The
update's cost with two learners averaging gradients needs two processes: `measure_averaging` starts
tools/tune/averaging.py on two ranks under mpirun and reads back what it measured.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time

import numpy as np

import hpcrl
from hpcrl.core.config import Config
from hpcrl.core.config_sac import replay_settings
from hpcrl.core.dataflow import algorithm_of, inference_messages
from hpcrl.core.observations import zeros
from hpcrl.envs import EnvSpaces
from hpcrl.tools.tune.model import Measured, fit_line

FORWARD_ROWS = (1, 8, 64, 512)


def replays(cfg: Config) -> bool:
    """The algorithm trains from a replay shard in every learner (DQN, SAC, TD3), not from batches
    of fragments."""
    return algorithm_of(cfg).replay


# --- measuring ------------------------------------------------------------------------------------

def _timed(call, seconds: float, least: int = 3, clock=time.process_time) -> float:
    """CPU seconds of one call (`clock`: time.perf_counter for wall seconds, as on a GPU), over
    about `seconds` of calls."""
    call()  # warm-up: first-call costs (allocation, lazy imports) are not the steady state
    count, start, wall = 0, clock(), time.perf_counter()
    while count < least or time.perf_counter() - wall < seconds:
        call()
        count += 1
    return (clock() - start) / count


def _clock(device: str):
    """A GPU works while its rank's CPU waits: wall seconds there (every call ends by reading its
    results back, which waits for the GPU), CPU seconds on a CPU."""
    return time.perf_counter if device == "cuda" else time.process_time


def measure_actor(cfg: Config, spaces: EnvSpaces, seconds: float) -> tuple[list[int], list[float]]:
    """Seconds per vector step of an env rank as a run steps it, at a few vector sizes around the
    config's: the algorithm's own actor with an inline policy (async: it never waits for weights)
    sending its records to this process, so the env step, the policy forward and the actor's own
    per-step work (filling the record, episode statistics, final observations) are all in it."""
    import torch

    from hpcrl.launch.solo import solo_actor
    torch.set_num_threads(cfg.run.torch_threads)
    sizes = sorted({max(1, cfg.env.num_envs // 2), cfg.env.num_envs, 2 * cfg.env.num_envs})
    out = []
    for n in sizes:
        c = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, num_envs=n, groups=1),
                                algo=dataclasses.replace(cfg.algo, mode="async"))
        solo = solo_actor(c, spaces, receiver_slots=2)
        steps = [0]

        def take(record):
            steps[0] += record.get("frames")
        solo.records(1, 10 ** 9, take)  # warm-up
        steps[0], start, wall = 0, time.process_time(), time.perf_counter()
        while steps[0] < 3 * c.algo.rollout_length * n or time.perf_counter() - wall < seconds / len(sizes):
            solo.records(1, 10 ** 9, take)
        out.append((time.process_time() - start) / steps[0] * n)
        solo.close()
    return sizes, out


def measure_forward(cfg: Config, spaces: EnvSpaces, seconds: float) -> tuple[list[int], list[float]]:
    """Seconds per policy forward (an inference rank's runner) at a few batch sizes."""
    import torch

    from hpcrl.models import build_policy, make_runner
    torch.set_num_threads(cfg.run.torch_threads)
    device = cfg.roles.inference.device
    runner = make_runner(build_policy(spaces, cfg), device, seed=0)
    out = []
    for rows in FORWARD_ROWS:
        obs = zeros(spaces.observation, (rows,))
        reply = {name: np.zeros((rows, *spaces.action_shape) if name == "actions" else
                                (rows, spaces.num_actions) if name == "q" else (rows,)) for name in runner.outputs}
        out.append(_timed(lambda: runner.act(obs, reply), seconds / len(FORWARD_ROWS), clock=_clock(device)))
    return list(FORWARD_ROWS), out


class UpdateBench:
    """The algorithm's own trainer update on made-up samples, to time (here, and with two learners
    in tools/tune/averaging.py): PPO's step on k whole fragments, or one DQN gradient step of `rows`
    rows sampled from a real, filled replay shard, its priorities written back. `wrap`: what the
    trainer does to its optimizer (averaging.py: Horovod's averaging), `hooks` how its step then
    averages and applies gradients (workers/averaging.py: averaging_hooks)."""

    def __init__(self, cfg: Config, spaces: EnvSpaces, wrap=lambda model, optimizer: optimizer,
                 hooks=lambda optimizer: {"apply_step": optimizer.step}):
        import torch

        from hpcrl.models import build_optimizer, build_policy
        self.cfg, self.spaces, self.algorithm = cfg, spaces, algorithm_of(cfg)
        torch.set_num_threads(cfg.run.torch_threads)
        self.device = cfg.roles.learner.device
        self.model = build_policy(spaces, cfg).to(self.device)
        self.optimizer = wrap(self.model, build_optimizer(self.model, cfg))  # the trainers' own
        self.hooks = hooks(self.optimizer)  # how the step averages and applies gradients
        self.record = self.algorithm.record(cfg, spaces)
        self.replay = _filled_shard(cfg, self.record) if replays(cfg) else None

    @property
    def steps_per_update(self) -> int:
        """Gradient steps of one call (a PPO update: epochs x minibatches; here one DQN step)."""
        return 1 if self.replay is not None else self.cfg.algo.epochs * self.cfg.algo.num_minibatches

    def call(self, size: int):
        """A call of one update: `size` fragments (PPO), or rows of one gradient step (DQN)."""
        import torch

        from hpcrl.launch.registry import parts_of
        cfg, spaces = self.cfg, self.spaces
        if self.replay is not None:
            from hpcrl.workers.replay_source import ReplaySchedule, ReplaySource
            section, where = replay_settings(cfg.algo)  # one gradient step a call
            one_step = dataclasses.replace(section, gradient_steps=1)
            cfg = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, **{where.split(".")[1]: one_step}))
            batch = ReplaySource(None, [], self.replay, ReplaySchedule(size, 0, beta=cfg.algo.replay.beta,
                                                                       total_frames=cfg.run.total_frames),
                                 np.random.default_rng(0))
        else:
            batch = [self.record.allocate() for _ in range(size)]
            for f in batch:
                f["logp"][...] = -np.log(max(spaces.num_actions, 2))
                for name in ("active", "action_mask"):
                    if name in f.arrays:
                        f[name][...] = 1
        step = parts_of(cfg).step()(cfg, self.model, self.optimizer, torch.device(cfg.roles.learner.device),
                                    np.random.default_rng(0), spaces.obs_dtype, spaces.action_dtype)
        return lambda: step(batch, **self.hooks)


def measure_update(cfg: Config, spaces: EnvSpaces, seconds: float) -> tuple[list[int], list[float]]:
    """Seconds per trainer update (the algorithm's own step, one trainer) at two batch sizes, by
    frames; DQN: per gradient step, by rows."""
    bench = UpdateBench(cfg, spaces)
    clock = _clock(bench.device)
    if replays(cfg):
        batch = replay_settings(cfg.algo)[0].batch_size
        sizes = sorted({max(1, batch // 4), batch})
        return sizes, [_timed(bench.call(rows), seconds / 2, least=2, clock=clock) for rows in sizes]
    frames = cfg.algo.rollout_length * cfg.env.num_envs
    return [k * frames for k in (1, 4)], [_timed(bench.call(k), seconds / 2, least=2, clock=clock) for k in (1, 4)]


def _filled_shard(cfg: Config, spec):
    """A replay shard of the trainer's own kind, filled with (zero) records of layout `spec`."""
    from hpcrl.core.messages import replay_fields
    from hpcrl.workers.replay_source import shard_for
    record = spec.allocate()
    names = replay_fields(spec)
    rows = record["priorities"].shape[0]
    # the sum-tree's depth grows with the capacity (log), so a smaller shard costs about the same
    batch = replay_settings(cfg.algo)[0].batch_size
    replay = shard_for(spec, min(cfg.algo.replay.capacity, max(8 * rows, 4 * batch)),
                       cfg.algo.replay.alpha)
    record["priorities"][...] = 1.0
    while replay.size < replay.capacity:
        replay.add({name: record[name] for name in names}, record["priorities"])
    return replay


def measure_insert(cfg: Config, spaces: EnvSpaces, seconds: float) -> tuple[list[int], list[float]]:
    """DQN: seconds per record of rows taken into a (full) replay shard, at two record sizes."""
    from hpcrl.core.messages import replay_fields
    spec = algorithm_of(cfg).record(cfg, spaces)
    replay, record = _filled_shard(cfg, spec), spec.allocate()
    names, rows = replay_fields(spec), record["priorities"].shape[0]
    record["priorities"][...] = 1.0
    sizes = sorted({max(1, rows // 4), rows})
    return sizes, [_timed(lambda k=k: replay.add({name: record[name][:k] for name in names},
                                                 record["priorities"][:k]), seconds / len(sizes)) for k in sizes]


def measure_messages(cfg: Config, spaces: EnvSpaces, seconds: float) -> tuple[list[int], list[float]]:
    """Seconds per message by bytes: a request and its reply together (by their bytes together),
    and a fragment with its credit."""
    from hpcrl.runtime.message_costs import record_seconds, request_seconds
    request, reply = inference_messages(cfg, spaces, 1)
    record = algorithm_of(cfg).record(cfg, spaces)
    pair = request_seconds(request, reply, seconds / 2)
    return ([request.nbytes + reply.nbytes, record.nbytes],
            [pair, record_seconds(record, seconds / 2)])


def on_devices(cfg: Config, device: str) -> Config:
    """`cfg` with its learners and inference ranks on `device`."""
    r = cfg.roles
    return dataclasses.replace(cfg, roles=dataclasses.replace(
        r, learner=dataclasses.replace(r.learner, device=device), inference=dataclasses.replace(r.inference, device=device)))


def measure_all(cfg: Config, spaces: EnvSpaces, budget_s: float, gpu: bool = False) -> dict:
    """Every measurement, within about `budget_s` seconds (`gpu`: the forward and the update on
    this machine's GPU too, in wall seconds): name -> (sizes, seconds)."""
    share = budget_s / (5 if gpu else 4)
    cpu = on_devices(cfg, "cpu")
    points = {"actor_step": measure_actor(cfg, spaces, share), "forward": measure_forward(cpu, spaces, share),
              "update": measure_update(cpu, spaces, share * (0.75 if replays(cfg) else 1.0))}
    if replays(cfg):
        points["insert"] = measure_insert(cfg, spaces, share / 4)
    points["message"] = measure_messages(cfg, spaces, share)
    if gpu:
        points["forward_cuda"] = measure_forward(on_devices(cfg, "cuda"), spaces, share / 2)
        points["update_cuda"] = measure_update(on_devices(cfg, "cuda"), spaces, share / 2)
    return points


def fitted(points: dict, rows_per_env: int) -> Measured:
    """The model's costs from measured points (a line through each; averaging is one number)."""
    fits = {name: fit_line([float(x) for x in xs], ys) for name, (xs, ys) in points.items() if name != "averaging"}
    averaging = points["averaging"][1][0] if "averaging" in points else None
    return Measured(rows_per_env=rows_per_env, averaging_step=averaging, **fits)


# --- two learners, under mpirun -------------------------------------------------------------------

class AveragingRunError(RuntimeError):
    """The two-rank run that measures averaging (tools/tune/averaging.py) failed: its launcher and
    what it printed."""


AVERAGING_LAUNCHER = "mpirun -n 2"


def measure_averaging(config_path: str, overrides: tuple[str, ...], seconds: float,
                      launcher: str = AVERAGING_LAUNCHER) -> float:
    """Wall seconds Horovod's averaging adds to a gradient step of 2 learners: tools/tune/averaging.py
    started with `launcher` (2 ranks of this machine)."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(hpcrl.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])))
    if os.geteuid() == 0:  # Open MPI refuses root unless told (containers, CI machines)
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [*shlex.split(launcher), sys.executable, "-m", "hpcrl.tools.tune.averaging", config_path,
           "--seconds", str(seconds), *[arg for kv in overrides for arg in ("--set", kv)]]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300 + 4 * seconds)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AveragingRunError(f"{launcher}: {exc}") from None
    last = proc.stdout.strip().splitlines()[-1:] or [""]
    if proc.returncode or not last[0].startswith("{"):
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        raise AveragingRunError(f"{launcher} ... hpcrl.tools.tune.averaging exited {proc.returncode}:\n{tail}")
    return float(json.loads(last[0])["step_s"])
