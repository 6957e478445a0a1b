"""Learner rank (trainer): fragments -> GAE -> PPO epochs; Horovod averages gradients across learners.

The only importer of horovod. Every learner trains on the fragments of its own env ranks and all
learners take the same optimizer steps on the same averaged gradients, so their weights stay
bit-identical; the learner root (the lowest learner rank) publishes weights, logs, and writes
checkpoints.
"""
from __future__ import annotations

import os
import pickle
import resource
import sys
import time
from collections import deque
from typing import Callable

import horovod.torch as hvd
import numpy as np
import torch

from hpcrl.runtime import comm
from hpcrl.runtime.params import ParameterPublisher
from hpcrl.workers.batch_source import FragmentQueue
from hpcrl.algos.gae import successor_values
from hpcrl.algos.kernels import gae, vtrace
from hpcrl.algos.ppo import LOSS_KEYS, Batch, train_step
from hpcrl.io.checkpoint import inspect_latest, load_checkpoint, restore_rng_states, save_checkpoint
from hpcrl.core.config import Config
from hpcrl.envs import EnvSpaces
from hpcrl.core.messages import EPISODE_STATS, OUTPUT_FAILED, PREEMPTED, STOP
from hpcrl.io.metrics import MetricsWriter
from hpcrl.models import build_model, copy_params_to, policy_digest
from hpcrl.io.rundir import CHECKPOINT_FILE, EXIT_OUTPUT_FAILED, METRICS_FILE, free_space, os_reason
from hpcrl.core.seeds import seed_for

RETURN_WINDOW_EPISODES = 20  # target_return is judged on the mean of at least this many episodes
# how an update ends the run (0: it goes on), and the flags of the stop word that says so
FRAMES_CODE, TARGET_CODE, PREEMPTED_CODE, OUTPUT_FAILED_CODE = 1, 2, 3, 4
STOP_REASONS = {0: "", FRAMES_CODE: "total_frames", TARGET_CODE: "target_return", PREEMPTED_CODE: "preempted",
                OUTPUT_FAILED_CODE: "output_failed"}
STOP_FLAGS = {0: 0, FRAMES_CODE: STOP, TARGET_CODE: STOP, PREEMPTED_CODE: STOP | PREEMPTED,
              OUTPUT_FAILED_CODE: STOP | OUTPUT_FAILED}


class RunFiles:
    """The learner root's outputs in the run directory."""

    def __init__(self, run_dir: str, config_text: str, resume: bool = False, tensorboard: bool = False):
        """`resume`: continue metrics.h5 (already cut back to the checkpoint by rundir.prepare)."""
        self.run_dir = run_dir
        self.config_text = config_text
        self.metrics = MetricsWriter(os.path.join(run_dir, METRICS_FILE), attrs={"config": config_text},
                                     resume=resume, tensorboard_dir=run_dir if tensorboard else None)
        self.checkpoint_path = os.path.join(run_dir, CHECKPOINT_FILE)
        self.failed = False

    def output_failed(self, what: str, path: str, exc: OSError) -> int:
        """One message for an output that could not be written (a full disk, a quota, a file system
        gone read-only): what, where, why, and the checkpoint that stays valid. Returns the stop code."""
        self.failed = True
        found, _, counters, _ = inspect_latest(self.checkpoint_path)
        valid = (f"the checkpoint {found} (policy version {int(counters.get('policy_version', 0))}, "
                 f"{int(counters.get('frames', 0)):,} frames) stays valid: once there is room again (free space, "
                 f"raise the quota), run the same command again to resume" if found else
                 "no checkpoint was written yet: once there is room again, run the same command again to start "
                 "the run anew")
        path = exc.filename or path  # the TensorBoard events file names itself; h5py's errors do not
        print(f"hpcrl: cannot write {what} to {path}: {os_reason(exc)}{free_space(path)}. Stopping the job "
              f"(exit status {EXIT_OUTPUT_FAILED}); {valid}.", file=sys.stderr, flush=True)
        return OUTPUT_FAILED_CODE

    def close(self) -> None:
        try:
            self.metrics.close()
        except OSError:
            if not self.failed:  # after a failed write, closing fails too; resuming rebuilds the file
                raise


class LearnerRole:
    name = "learner"

    def __init__(self, cfg: Config, spaces: EnvSpaces, learner_comm, source: FragmentQueue,
                 publisher: ParameterPublisher | None, files: RunFiles | None, batch_share: float = 1.0,
                 resume_path: str | None = None, preempt_requested: Callable[[], bool] = lambda: False,
                 heartbeat: Callable[[], None] = lambda: None):
        """`batch_share`: this learner's fraction of the global batch times the number of learners
        (1.0 when every learner has as many env ranks as the others). `resume_path`: the checkpoint
        to continue from (every learner is told; the root reads it). `preempt_requested`: polled by
        the root after every update; True stops the run with a checkpoint, marked preempted."""
        self.cfg = cfg
        self.comm = learner_comm
        self.source = source
        self.publisher = publisher
        self.files = files
        self.batch_share = batch_share
        self.preempt_requested = preempt_requested
        self.heartbeat = heartbeat  # called per minibatch: a long update is work, not a hang
        self.local_env = None  # serial mode: the env role in this process, saved with the checkpoint
        self._warned_env_state = False
        self.root = learner_comm.Get_rank() == 0
        # Horovod: each minibatch's allreduce waits for the background thread's next cycle; with
        # 0.1 ms instead of 1 ms a 2-learner CartPole job took 14.0/17.4 s instead of 17.2/21.7 s
        # (seeds 1/3, same frames). A user's HOROVOD_CYCLE_TIME wins.
        os.environ.setdefault("HOROVOD_CYCLE_TIME", "0.1")
        hvd.init(comm=learner_comm)  # Horovod: only the learners, never the whole world
        device = cfg.roles.learner.device
        if device == "cuda":
            torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())  # Horovod: pin by local rank
        self.device = torch.device(device)
        torch.manual_seed(cfg.run.seed)  # the root's initial weights (Horovod copies them) repeat per seed
        self.model = build_model(spaces, cfg.model).to(self.device)
        # actions as the env takes them (int64 or float32); uint8 frames stay bytes (the model scales them)
        self.batch_dtypes = {"actions": getattr(torch, spaces.action_dtype),
                             "obs": torch.uint8 if spaces.obs_dtype == "uint8" else torch.float32}
        # fused: one kernel for all parameters; 7x faster than the per-tensor loop on small MLPs here
        optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.algo.lr, eps=1e-5, fused=True)
        self.rng = np.random.default_rng(seed_for(cfg.run.seed, "learner", hvd.rank()))  # minibatch order
        # Horovod: one group holding every parameter, so the whole gradient goes out as one fused
        # allreduce once backward has produced all of it, instead of one per tensor as each becomes
        # ready (bench/allreduce.py). The wrapper is a new optimizer over the same parameter
        # groups, so saved state is loaded into it, after wrapping.
        self.optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=self.model.named_parameters(),
                                                  groups=[list(self.model.parameters())])
        counters = self._start_from(resume_path)
        self.version = int(counters.get("policy_version", 0))
        self.frames = int(counters.get("frames", 0))
        self.updates = int(counters.get("updates", 0))
        self.start = time.perf_counter() - float(counters.get("wall_time", 0.0))  # wall time continues
        self.stop_flags = 0  # the stop word's flags once the run stops (they decide the exit status)
        self.stopped_by = ""
        self.windows: deque = deque()  # (episodes, return_sum) of recent updates, all learners
        self.fragments_dropped = int(counters.get("fragments_dropped", 0))
        self.sync = cfg.algo.mode == "sync"
        self.dropped_since: list = []  # (frames, episode stats) of fragments dropped before this update
        self.draining = False
        self.done = False
        self._set_waiting_status()
        self._last_log = self._last_ckpt = time.perf_counter()
        self._last_log_frames = self.frames
        self._publish()

    def _start_from(self, resume_path: str | None) -> dict:
        """Same weights (and, resuming, optimizer state and counters) on every learner; returns the
        counters. The root reads the checkpoint; the others receive it."""
        checkpoint = load_checkpoint(resume_path) if resume_path and self.root else None
        if checkpoint is not None:
            self.model.load_state_dict(checkpoint["model"])
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)  # Horovod: same start everywhere
        self.env_state = checkpoint["extra"].get("env_state") if checkpoint else None
        if not resume_path:
            # A fresh optimizer is identical everywhere already; hvd.broadcast_optimizer_state would
            # take a zero-gradient step to create Adam's state, putting bias correction one step off.
            return {}
        # MPI: the root's optimizer state and counters, pickled once at start, loaded as saved
        state, counters = comm.broadcast_object_on(
            self.comm, (checkpoint["optimizer"], checkpoint["counters"]) if self.root else None)
        self.optimizer.load_state_dict(state)
        if checkpoint is not None:
            restore_rng_states(checkpoint["rng"], self.rng)
        return counters

    # --- the poll loop ----------------------------------------------------------------------------
    def poll(self) -> int:
        if self.publisher is not None:
            self.publisher.poll()
        if self.draining:
            work = self.source.drain()
            if self.source.all_gone():
                self._finish()
            return work
        arrived, batch = self.source.poll(self.version)
        if batch is None:
            if arrived:
                self._set_waiting_status()
            return arrived
        self._update(batch)
        self.source.release_batch()  # the slots go back to the actors as credits
        self._after_update()
        return arrived + 1

    def _update(self, frags: list) -> None:
        self.status = f"training policy version {self.version}"
        a = self.cfg.algo
        if a.lr_schedule == "linear":
            for group in self.optimizer.param_groups:
                group["lr"] = a.lr * max(0.0, 1.0 - self.frames / self.cfg.run.total_frames)
        batch = self._assemble(frags)
        self.dropped_since = self.source.take_dropped()
        self._local = self._local_stats(frags)  # read the headers now: the slots are released next
        # MPI: after the update, every learner folds the moments of all learners' batches into its
        # observation normaliser (a no-op without model.obs_norm), so all hold identical stats
        self._losses = train_step(self.model, self.optimizer, batch, a, self.rng,
                                  reduce_moments=lambda moments: comm.allreduce_sum(self.comm, moments),
                                  average_gradients=self.optimizer.synchronize, apply_step=self._step,
                                  loss_scale=self.batch_share)
        self.version += 1
        self.updates += 1

    def _after_update(self) -> None:
        """Statistics, the stop decision, the report, and the new weights (or the stop word)."""
        row = self._reduce_stats(self._local, self._losses)
        code = 0
        if self.root:
            if self.preempt_requested():
                code = PREEMPTED_CODE
            elif row["frames"] >= self.cfg.run.total_frames:
                code = FRAMES_CODE
            elif self._target_reached():
                code = TARGET_CODE
            self.stopped_by = STOP_REASONS[code]
            code = self._report(row, code)
        code = comm.broadcast_int(self.comm, code)  # MPI: all learners stop after the same update, the same way
        self.stopped_by = STOP_REASONS[code]
        self.stop_flags = STOP_FLAGS[code]
        self._publish()
        if code:
            self._start_draining()
        else:
            self._set_waiting_status()

    def _start_draining(self) -> None:
        """After the stop word: take (and discard) fragments until every env rank's goodbye is in,
        so no env rank is left waiting on a send nobody receives."""
        self.draining = True
        self.status = "stopping: waiting for the env ranks' last messages"

    def _set_waiting_status(self) -> None:
        """From now on the status names what is missing (the watchdog's message, if it fires). It
        is worked out only when read: a scan of every env rank on each arrival would cost
        O(fan-in) per fragment."""
        self._status = None

    @property
    def status(self) -> str:
        return self._status if self._status is not None else self.source.waiting_for(self.version)

    @status.setter
    def status(self, text: str) -> None:
        self._status = text

    def _step(self) -> None:
        with self.optimizer.skip_synchronize():  # Horovod: gradients were averaged before clipping
            self.optimizer.step()
        self.heartbeat()

    def _assemble(self, frags: list) -> Batch:
        """The fragments side by side as [T, K*N] arrays, advantages and value targets computed
        over them (GAE in sync mode; V-trace with the current critic and policy in async mode),
        flattened into one batch."""
        a = self.cfg.algo

        def cat(key: str, axis: int = 1) -> np.ndarray:
            return np.concatenate([f[key] for f in frags], axis=axis)

        obs, actions, behaviour_logp = cat("obs"), cat("actions"), cat("logp")
        rewards, dones = cat("rewards"), cat("dones")
        if self.sync:
            values = cat("values")
            nxt = successor_values(values, cat("last_values", 0), dones, cat("trunc_values"))
            advantages, returns = gae(rewards, values, nxt, dones, a.gamma, a.gae_lambda)
        else:
            # Truncated episodes bootstrap from the behaviour policy's V(final obs), the only
            # value the env rank could ask for then; everything else uses the current critic.
            values, last_values, logp_now = self._evaluate_now(obs, actions, cat("last_obs", 0))
            nxt = successor_values(values, last_values, dones, cat("trunc_values"))
            returns, advantages = vtrace(logp_now - behaviour_logp, rewards, values, nxt, dones, a.gamma,
                                         a.vtrace_rho_bar, a.vtrace_c_bar, a.gae_lambda)
        parts = {"obs": obs, "actions": actions, "logp": behaviour_logp, "values": values,
                 "advantages": advantages, "returns": returns}
        return Batch(**{k: torch.as_tensor(v.reshape(-1, *v.shape[2:]), device=self.device,
                                           dtype=self.batch_dtypes.get(k, torch.float32))
                        for k, v in parts.items()})

    @torch.no_grad()
    def _evaluate_now(self, obs: np.ndarray, actions: np.ndarray, last_obs: np.ndarray):
        """Async: V(s_t), V(s_T) and log pi(a_t|s_t) under the weights about to be trained."""
        T, B = obs.shape[:2]
        logp, _, values = self.model.evaluate(
            torch.as_tensor(obs.reshape(T * B, *obs.shape[2:]), dtype=self.batch_dtypes["obs"], device=self.device),
            torch.as_tensor(actions.reshape(T * B, *actions.shape[2:]), device=self.device))
        last = self.model.value(torch.as_tensor(last_obs, dtype=self.batch_dtypes["obs"], device=self.device))
        return (values.cpu().numpy().reshape(T, B), last.cpu().numpy(), logp.cpu().numpy().reshape(T, B))

    def _local_stats(self, frags: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """From this learner's fragment headers (trained, and dropped since the last update): sums
        (frames, episodes, return sum, return sum of squares, length sum, fragments dropped, env
        rollout, wait and credit-wait microseconds of the trained fragments), lows (return min,
        version min) and highs (return max, version max) of the trained fragments, with this
        learner's sample-slot peak and resident-memory peak (MiB)."""
        counted = [(f.get("frames"), f["episode_stats"]) for f in frags] + self.dropped_since
        ep = {name: np.array([st[i] for _, st in counted]) for i, name in enumerate(EPISODE_STATS)}
        versions = [f.get("version") for f in frags]
        sums = np.array([sum(frames for frames, _ in counted), ep["episodes"].sum(), ep["return_sum"].sum(),
                         ep["return_sqsum"].sum(), ep["length_sum"].sum(), len(self.dropped_since),
                         sum(f.get("rollout_us") for f in frags), sum(f.get("wait_us") for f in frags),
                         sum(f.get("credit_wait_us") for f in frags)], dtype=np.float64)
        lows = np.array([ep["return_min"].min(), min(versions)], dtype=np.float64)
        highs = np.array([ep["return_max"].max(), max(versions), self.source.stream.held_max,
                          resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024], dtype=np.float64)
        return sums, lows, highs

    def _reduce_stats(self, local: tuple[np.ndarray, np.ndarray, np.ndarray], losses: dict[str, float]) -> dict:
        sums, lows, highs = local
        sums = comm.allreduce_sum(self.comm, np.concatenate([sums, [losses[k] for k in LOSS_KEYS]]))
        lo, hi = comm.allreduce_min_max(self.comm, lows, highs)
        frames_now, episodes, ret_sum, ret_sq, len_sum, dropped, rollout_us, wait_us, credit_us = sums[:9]
        self.frames += int(frames_now)
        self.fragments_dropped += int(dropped)
        self.windows.append((episodes, ret_sum))
        while len(self.windows) > 1 and sum(e for e, _ in list(self.windows)[1:]) >= RETURN_WINDOW_EPISODES:
            self.windows.popleft()
        n = self.comm.Get_size()
        elapsed = time.perf_counter() - self.start
        mean = ret_sum / episodes if episodes else np.nan
        row = {"frames": self.frames, "wall_time": elapsed, "fps": self.frames / max(elapsed, 1e-9),
               "policy_version": self.version, "episodes": int(episodes), "return_mean": mean,
               "return_std": np.sqrt(max(ret_sq / episodes - mean ** 2, 0.0)) if episodes else np.nan,
               "return_min": lo[0] if episodes else np.nan, "return_max": hi[0] if episodes else np.nan,
               "length_mean": len_sum / episodes if episodes else np.nan,
               "return_window_mean": self._window_mean(),
               "lr": self.optimizer.param_groups[0]["lr"],
               # the version trained on is self.version - 1; in sync mode every sample must carry it
               "sample_version_min": int(lo[1]), "sample_version_max": int(hi[1]),
               "policy_lag_max": int(self.version - 1 - lo[1]), "fragments_dropped": self.fragments_dropped,
               # share of the env ranks' rollout time in which no env group could step
               "env_wait_fraction": wait_us / rollout_us if rollout_us else 0.0,
               # share in which a finished fragment waited for a credit: the learner is the bottleneck
               "env_credit_wait_fraction": credit_us / rollout_us if rollout_us else 0.0,
               # the sample stream's bound in use: slots in flight or held, at most roles.learner.sample_slots
               "sample_slots_max": int(hi[2]), "learner_rss_mib": float(hi[3])}
        row.update({k: float(v) / n for k, v in zip(LOSS_KEYS, sums[9:])})
        if self.cfg.run.replica_digests:
            row["replica_digest"] = comm.gather_to_root(self.comm, np.array([policy_digest(self.model)], dtype=np.int64))
        return row

    def _window_mean(self) -> float:
        episodes = sum(e for e, _ in self.windows)
        return sum(s for _, s in self.windows) / episodes if episodes else float("nan")

    def _target_reached(self) -> bool:
        target = self.cfg.run.target_return
        episodes = sum(e for e, _ in self.windows)
        return target is not None and episodes >= RETURN_WINDOW_EPISODES and self._window_mean() >= target

    # --- learner root only --------------------------------------------------------------------------
    def _publish(self) -> None:
        if self.publisher is not None:
            self.publisher.publish(self.version, lambda flat: copy_params_to(self.model, flat),
                                   flags=self.stop_flags)

    def _report(self, row: dict, code: int) -> int:
        """Write the metrics row (and a checkpoint when one is due or the run stops) and print the
        progress line; returns `code`, or OUTPUT_FAILED_CODE when an output could not be written
        (a full disk): the run then stops on every rank with one message instead of a traceback."""
        if row.get("replica_digest") is not None:
            row["replica_digest"] = row["replica_digest"].reshape(-1)
        try:
            self.files.metrics.append(row)
        except OSError as exc:
            return self.files.output_failed("the metrics row of this update", self.files.metrics.path, exc)
        now = time.perf_counter()
        if code or now - self._last_log >= self.cfg.run.log_interval_s:
            fps = (row["frames"] - self._last_log_frames) / max(now - self._last_log, 1e-9)
            print(f"[hpcrl] frames {row['frames']:>10,} | {fps:8,.0f} fps | return {row['return_window_mean']:7.1f}"
                  f" | version {self.version:5d} | pg {row['loss_policy']:+.3f} v {row['loss_value']:.3f}"
                  f" ent {row['entropy']:.3f} kl {row['approx_kl']:.4f}", flush=True)
            self._last_log, self._last_log_frames = now, row["frames"]
        if code or now - self._last_ckpt >= self.cfg.run.checkpoint_interval_s:
            try:
                self.save()
            except OSError as exc:
                return self.files.output_failed("the checkpoint", self.files.checkpoint_path, exc)
            self._last_ckpt = now
        if code == PREEMPTED_CODE:
            print(f"[hpcrl] preempted: checkpoint of policy version {self.version} at {row['frames']:,} frames "
                  f"written; run the same command again to resume", flush=True)
        return code

    def save(self) -> None:
        counters = {"frames": self.frames, "updates": self.updates, "policy_version": self.version,
                    "wall_time": time.perf_counter() - self.start, "stopped_by": self.stopped_by,
                    "fragments_dropped": self.fragments_dropped,
                    "target_return": self.cfg.run.target_return}
        extra = {}
        if self.local_env is not None:  # serial mode: the env's state too, for an exact continuation
            try:
                extra["env_state"] = np.frombuffer(self.local_env.snapshot(), dtype=np.uint8)
            except (pickle.PicklingError, AttributeError, TypeError) as exc:
                if not self._warned_env_state:
                    print(f"[hpcrl] warning: {self.cfg.env.id} cannot be pickled ({exc}); checkpoints hold no "
                          f"env state, so a resumed serial run starts new episodes", flush=True)
                    self._warned_env_state = True
        save_checkpoint(self.files.checkpoint_path, self.model, self.optimizer, counters, self.rng,
                        self.files.config_text, extra=extra)

    def _finish(self) -> None:
        self.source.stream.close()
        if self.publisher is not None:
            self.publisher.wait()
        if self.files is not None:
            self.files.close()
        self.done = True
        self.status = "finished"
