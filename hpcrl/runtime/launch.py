"""`hpcrl run`: the whole topology wired in one place.

Every rank runs `run()`. Rank 0 validates the config, probes the env and prepares the run
directory (new, or resumed from its checkpoint); the verdict reaches every rank, so a user mistake
ends the job with one message and status 2 everywhere. Then each rank builds the roles the layout
gives it and polls them until they finish (status 0) or a signal preempts the run (status 3).
"""
from __future__ import annotations

import os
import signal
import sys
import time

from hpcrl.runtime import comm

from hpcrl.io import rundir
from hpcrl.core.config import Config, ConfigError, load_config
from hpcrl.envs import EnvSpaces, probe_spaces
from hpcrl.core.layout import (FRAGMENT_BUFFERS, INLINE, Layout, batch_fragments, batch_share, env_groups,
                               fragments_per_env_rank, plan_layout, sample_slots)
from hpcrl.core.messages import OUTPUT_FAILED, PREEMPTED, fragment_spec, reply_spec, request_spec, weights_spec
from hpcrl.io.rundir import EXIT_CONFIG_ERROR, EXIT_OUTPUT_FAILED, EXIT_PREEMPTED
from hpcrl.core.seeds import seed_for
from hpcrl.runtime.params import ParameterPublisher, build_parameter_stream
from hpcrl.runtime.streams import SampleReceiver, SampleSender
from hpcrl.runtime.watchdog import Watchdog


def _prepare(config_path: str, overrides: tuple[str, ...], overwrite: bool, size: int) -> dict:
    """Rank 0's start-up checks: config, layout fit, env, run directory. Returns state or an error."""
    try:
        cfg, _ = load_config(config_path, overrides)
        # role counts must fit this world size, and algo.batch_frames the role counts
        fragments_per_env_rank(cfg, plan_layout(cfg.roles, size))
        spaces = probe_spaces(cfg.env)
        from hpcrl.models import build_model, num_params  # torch, on rank 0 only
        # the policy's size, once: it sizes the weights messages on every rank, and a model that
        # cannot take the observations is a ConfigError now, not on every rank later
        n_params = num_params(build_model(spaces, cfg.model))
        return {"cfg": cfg, "spaces": spaces, "num_params": n_params, "start": rundir.prepare(cfg, overwrite)}
    except ConfigError as exc:
        return {"error": str(exc)}
    except OSError as exc:  # a full disk or an unwritable output_dir: not a config mistake
        where = f" {exc.filename}" if exc.filename else ""
        return {"error": f"cannot prepare the run directory{where}: {rundir.os_reason(exc)}"
                         f"{rundir.free_space(exc.filename) if exc.filename else ''}; fix that, then run the same "
                         f"command again", "status": EXIT_OUTPUT_FAILED}


class PreemptionSignals:
    """SIGTERM (SLURM's time limit, preemption) and SIGUSR1 (sbatch --signal=USR1@...) ask for a
    checkpoint at the next update and a clean exit with EXIT_PREEMPTED, instead of death."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.received: int | None = None
        for sig in self.SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.received = signum

    def requested(self) -> bool:
        return self.received is not None


def run(config_path: str, overrides: tuple[str, ...] = (), overwrite: bool = False) -> int:
    rank, size = comm.world_rank(), comm.world_size()
    roles_here: list = []

    def describe() -> str:  # what this rank is doing, for the abort hook and the watchdog
        return ", ".join(f"{r.name}: {r.status}" for r in roles_here) or "starting up"

    comm.install_abort_hook(describe)
    signals = PreemptionSignals()
    state = _prepare(config_path, overrides, overwrite, size) if rank == 0 else None
    state = comm.broadcast_object(state)  # MPI: rank 0's verdict reaches every rank
    if "error" in state:
        return _refuse(rank, state["error"], state.get("status", EXIT_CONFIG_ERROR))
    cfg: Config = state["cfg"]
    start: rundir.RunStart = state["start"]
    if start.finished:
        if rank == 0:
            print(f"[hpcrl] nothing to do: the run in {start.run_dir} is complete: {start.finished} "
                  f"(or pass --overwrite to start it again)", flush=True)
        return 0
    nodes = comm.node_of_rank()
    try:
        layout = plan_layout(cfg.roles, size, nodes, _gpus_of_rank(cfg, nodes))
        sample_slots(cfg, layout, int(layout.fan_in("learner").max()))  # algo.batch_frames fits; slots hold a batch
    except ConfigError as exc:  # every rank computed the same layout from the same gathered facts
        return _refuse(rank, str(exc))
    problems = [p for p in comm.all_gather_objects(_rank_problem(cfg, layout, rank)) if p]
    if problems:  # MPI: every rank sees the same list, so every rank stops
        more = f" (and {len(problems) - 1} more ranks)" if len(problems) > 1 else ""
        return _refuse(rank, problems[0] + more)
    if rank == 0:
        _announce(cfg, layout, start, state["spaces"], state["num_params"])
    watchdog = Watchdog(cfg.run.hang_timeout_s, describe, comm.abort_job, rank).start()
    roles_here.extend(build_roles(cfg, state["spaces"], state["num_params"], layout, rank, start,
                                  signals.requested, heartbeat=lambda: watchdog.tick(True)))
    poll_until_done(roles_here, watchdog)
    watchdog.stop()
    flags = 0
    for role in roles_here:  # the stop word's flags, as each role received (or, on learners, sent) it
        flags |= role.stop_flags
    if flags & OUTPUT_FAILED:
        return EXIT_OUTPUT_FAILED
    if flags & PREEMPTED:
        return EXIT_PREEMPTED
    if rank == 0:
        print(f"[hpcrl] done: {start.run_dir}", flush=True)
    return 0


def _refuse(rank: int, message: str, status: int = EXIT_CONFIG_ERROR) -> int:
    """A user mistake (or an unwritable run directory) found at start-up: one message (from
    rank 0), the same status on every rank."""
    if rank == 0:
        what = "config error" if status == EXIT_CONFIG_ERROR else "error"
        print(f"hpcrl: {what}: {message}", file=sys.stderr, flush=True)
    return status


def visible_gpus() -> int:
    """NVIDIA GPUs this process may use, without importing torch (env ranks never do): the
    driver's device list, narrowed by CUDA_VISIBLE_DEVICES."""
    try:
        present = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return present
    wanted = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
    return min(present, len(wanted))


def _gpus_of_rank(cfg: Config, nodes):
    """Per rank, the GPUs of its node (the most any rank there sees); None when no role wants cuda."""
    if all(getattr(cfg.roles, role).device == "cpu" for role in ("learner", "inference", "env")):
        return None
    import numpy as np
    seen = np.array(comm.all_gather_objects(visible_gpus()), dtype=np.int64)  # MPI: start-up control message
    per_node = {node: seen[nodes == node].max() for node in np.unique(nodes)}
    return np.array([per_node[node] for node in nodes], dtype=np.int64)


def _rank_problem(cfg: Config, layout: Layout, rank: int) -> str | None:
    """What keeps this rank from its roles, found before any work: a config error on every rank.
    A learner needs MPI_THREAD_MULTIPLE; a rank asked to run its policy on a GPU needs one."""
    roles = layout.roles_of(rank)
    if "learner" in roles and (problem := comm.thread_level_problem(rank)):
        return problem
    if "env" in roles and (problem := comm.group_tag_problem(env_groups(cfg, layout))):
        return problem
    for role in roles:
        device = getattr(cfg.roles, role).device
        if role == "env" and not layout.inline_inference:
            continue  # the env rank's policy lives on its inference rank
        if device == "cuda":
            import torch
            if not torch.cuda.is_available():
                return (f"roles.{role}.device is 'cuda' but rank {rank} sees no CUDA device "
                        f"(torch.cuda.is_available() is False); use device: cpu or run on GPU nodes")
    return None


def _announce(cfg: Config, layout: Layout, start: rundir.RunStart, spaces: EnvSpaces, n_params: int) -> None:
    if layout.serial:
        print("[hpcrl] world size 1: serial mode (learner, env and inline inference in one process)", flush=True)
    else:
        n_nodes = len(set(layout.node_of_rank.tolist()))
        print(f"[hpcrl] {layout.world_size} ranks on {n_nodes} node{'s' if n_nodes > 1 else ''}: "
              f"{len(layout.learners)} learner, {len(layout.inference)} "
              f"inference{' (inline on env ranks)' if layout.inline_inference else ''}, {len(layout.envs)} env "
              f"x {cfg.env.num_envs} {cfg.env.id}", flush=True)
    if not layout.serial:  # which rank is what: Open MPI names dead ranks by number only
        print("[hpcrl] roles: " + "; ".join(f"{name} ranks {_ranges(ranks)}" for name, ranks in (
            ("learner", layout.learners), ("inference", layout.inference), ("env", layout.envs)) if len(ranks)),
              flush=True)
    print(f"[hpcrl] run directory: {start.run_dir}", flush=True)
    for warning in start.warnings:
        print(f"[hpcrl] warning: {warning}", flush=True)
    if start.resume_file:
        print(f"[hpcrl] resuming from {start.resume_file}: policy version {start.start_version}, "
              f"{start.start_frames:,} frames", flush=True)
    from hpcrl.tools.plan import memory, warnings
    for warning in warnings(cfg, layout, memory(cfg, layout, spaces, n_params)):
        print(f"[hpcrl] warning: {warning}", flush=True)


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


def build_roles(cfg: Config, spaces: EnvSpaces, n_params: int, layout: Layout, rank: int,
                start: rundir.RunStart, preempt_requested=lambda: False, heartbeat=lambda: None) -> list:
    """Create this rank's roles and the channels between them. Collective over WORLD: every rank
    takes part in creating the learner and weight communicators, in the same order."""
    learners = [int(r) for r in layout.learners]
    root = layout.learner_root
    is_learner = rank in learners
    learner_comm = comm.sub_communicator(is_learner)
    # weights: learner root -> one leader per node -> that node's holders (newest only)
    params = (build_parameter_stream(comm.WORLD, rank, root, layout.weight_subscribers(), layout.node_of_rank,
                                     weights_spec(n_params))
              if not layout.serial else None)
    sample_comm = comm.stream_communicator()  # env ranks -> their learner, credit flow control

    obs_shape, obs_dtype = spaces.obs_shape, spaces.obs_dtype
    T, N = cfg.algo.rollout_length, cfg.env.num_envs
    G = env_groups(cfg, layout)
    req = request_spec(N // G, obs_shape, obs_dtype)  # one request/reply channel per env group
    rep = reply_spec(N // G, spaces.action_shape, spaces.action_dtype)
    frag = fragment_spec(T, N, obs_shape, obs_dtype, spaces.action_shape, spaces.action_dtype)

    roles: list = []
    publisher = None
    if is_learner or rank in layout.inference or (rank in layout.envs and layout.inline_inference):
        import torch  # only ranks that hold a policy; remote-inference env ranks never import torch
        torch.set_num_threads(cfg.run.torch_threads)
    if is_learner:
        from hpcrl.workers.batch_source import FragmentQueue
        from hpcrl.workers.trainer import LearnerRole, RunFiles
        envs = layout.envs_of_learner(rank)
        stream = SampleReceiver(sample_comm, envs, [frag.allocate() for _ in range(sample_slots(cfg, layout, len(envs)))],
                                per_sender=FRAGMENT_BUFFERS)
        source = FragmentQueue(stream, envs, sync=cfg.algo.mode == "sync", max_policy_lag=cfg.algo.max_policy_lag,
                               batch_fragments=batch_fragments(cfg, layout, len(envs)))
        if rank == root:
            publisher = params if params is not None else ParameterPublisher(None, weights_spec(n_params))
        files = (RunFiles(start.run_dir, start.config_text,
                          resume=start.resume_file is not None,
                          tensorboard=cfg.run.tensorboard)
                 if rank == root else None)
        share = batch_share(cfg, layout, len(envs))  # unequal batches (fan-in): weight by batch size
        roles.append(LearnerRole(cfg, spaces, learner_comm, source, publisher, files, batch_share=share,
                                 resume_path=start.resume_file, preempt_requested=preempt_requested,
                                 heartbeat=heartbeat))

    if rank in layout.inference:
        from hpcrl.workers.policy_server import InferenceRole
        slots = [(int(env), g) for env in layout.envs_of_inference(rank) for g in range(G)]
        server = comm.RequestServer([e for e, _ in slots], [g for _, g in slots], [req.allocate() for _ in slots],
                                    [rep.allocate() for _ in slots])
        weights = params
        runner = _runner(cfg, spaces, cfg.roles.inference.device, "inference", layout.index_in("inference", rank))
        roles.append(InferenceRole(rank, runner, weights, server,
                                   sync=cfg.algo.mode == "sync"))

    if rank in layout.envs:
        from hpcrl.workers.actor import EnvRole, RemotePolicy
        index = layout.index_in("env", rank)
        inference_rank = int(layout.env_inference[index])
        if inference_rank == INLINE:
            from hpcrl.workers.policy_server import InlinePolicy
            weights = comm.LocalWeightSubscriber(publisher) if layout.serial else params
            policies = [InlinePolicy(_runner(cfg, spaces, cfg.roles.env.device, "inline_policy", index), weights,
                                     req.allocate(), rep.allocate(), sync=cfg.algo.mode == "sync")]
        else:
            policies = [RemotePolicy(comm.RequestClient(inference_rank, req.allocate(), rep.allocate(), group=g))
                        for g in range(G)]
        sender = SampleSender(sample_comm, int(layout.env_learner[index]),
                              [frag.allocate() for _ in range(FRAGMENT_BUFFERS)])
        roles.append(EnvRole(cfg, rank, index, policies, sender, start_version=start.start_version,
                             fragments_per_version=fragments_per_env_rank(cfg, layout)))
    # Serial sync mode: the learner's checkpoints carry the env's state, for exact resumes. (Async
    # mode steps on while the learner trains, so there is no exact point to save it at.)
    if layout.serial and cfg.algo.mode == "sync":
        learner, env = roles
        learner.local_env = env
        if learner.env_state is not None:
            env.restore(learner.env_state.tobytes())
    return roles


def _runner(cfg: Config, spaces: EnvSpaces, device: str, purpose: str, index: int):
    """The policy of an inference rank (or an env rank's inline one); `index`: the rank's index in its role."""
    import torch

    from hpcrl.models import PolicyRunner, build_model
    torch.manual_seed(cfg.run.seed)  # initial weights; the learner root's broadcast replaces them
    # action sampling: its own stream per rank, repeatable per run seed
    return PolicyRunner(build_model(spaces, cfg.model), device, seed=seed_for(cfg.run.seed, purpose, index))


def poll_until_done(roles: list, watchdog: Watchdog | None = None) -> None:
    """SRL-style poll loop. Idle ranks back off to sleeping, so oversubscribed nodes (more ranks
    than cores) give their cores to ranks that have work instead of spinning."""
    idle = 0
    while True:
        active = [r for r in roles if not r.done]
        if not active:
            return
        work = sum(r.poll() for r in active)
        if watchdog is not None:
            watchdog.tick(work > 0)
        if work:
            idle = 0
        else:
            idle += 1
            if idle > 50:
                time.sleep(min(1e-3, 2e-6 * idle))
