"""Learner rank (trainer): fragments -> GAE -> PPO epochs; Horovod averages gradients across learners.

The only importer of horovod. Every learner trains on the fragments of its own env ranks and all
learners take the same optimizer steps on the same averaged gradients, so their weights stay
bit-identical; the learner root (world rank 0) publishes weights, logs, and writes checkpoints.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import time
from collections import deque
from typing import Callable

import horovod.torch as hvd
import numpy as np
import torch

from hpcrl import comm
from hpcrl.algos.gae import successor_values
from hpcrl.algos.kernels import gae
from hpcrl.algos.ppo import LOSS_KEYS, Batch, ppo_update
from hpcrl.checkpoint import load_checkpoint, restore_rng_states, save_checkpoint
from hpcrl.config import Config
from hpcrl.envs import EnvSpaces
from hpcrl.messages import EPISODE_STATS
from hpcrl.metrics import MetricsWriter
from hpcrl.models import build_model, copy_params_to
from hpcrl.rundir import CHECKPOINT_FILE, METRICS_FILE

RETURN_WINDOW_EPISODES = 20  # target_return is judged on the mean of at least this many episodes
FRAMES_CODE, TARGET_CODE, PREEMPTED_CODE = 1, 2, 3  # how an update ends the run (0: it goes on)
STOP_REASONS = {0: "", FRAMES_CODE: "total_frames", TARGET_CODE: "target_return", PREEMPTED_CODE: "preempted"}


class RunFiles:
    """The learner root's outputs in the run directory."""

    def __init__(self, run_dir: str, config_text: str, resume_through_version: int | None = None,
                 tensorboard: bool = False):
        self.run_dir = run_dir
        self.config_text = config_text
        self.metrics = MetricsWriter(os.path.join(run_dir, METRICS_FILE), attrs={"config": config_text},
                                     resume_through_version=resume_through_version,
                                     tensorboard_dir=run_dir if tensorboard else None)
        self.checkpoint_path = os.path.join(run_dir, CHECKPOINT_FILE)


class LearnerRole:
    name = "learner"

    def __init__(self, cfg: Config, spaces: EnvSpaces, learner_comm, receiver: comm.FragmentReceiver,
                 publisher: comm.WeightPublisher | None, files: RunFiles | None, batch_share: float = 1.0,
                 resume_path: str | None = None, preempt_requested: Callable[[], bool] = lambda: False,
                 heartbeat: Callable[[], None] = lambda: None):
        """`batch_share`: this learner's fraction of the global batch times the number of learners
        (1.0 when every learner has as many env ranks as the others). `resume_path`: the checkpoint
        to continue from (every learner is told; the root reads it). `preempt_requested`: polled by
        the root after every update; True stops the run with a checkpoint, marked preempted."""
        self.cfg = cfg
        self.comm = learner_comm
        self.receiver = receiver
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
        self.model = build_model(spaces.obs_shape, spaces.num_actions, cfg.model).to(self.device)
        # fused: one kernel for all parameters; 7x faster than the per-tensor loop on small MLPs here
        optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.algo.lr, eps=1e-5, fused=True)
        self.rng = np.random.default_rng(cfg.run.seed * 7_919 + hvd.rank())
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
        self.preempted = False
        self.stopped_by = ""
        self.windows: deque = deque()  # (episodes, return_sum) of recent updates, all learners
        self.have = [False] * len(receiver.buffers)
        self.done = False
        self._set_waiting_status()
        self._last_log = self._last_ckpt = time.perf_counter()
        self._last_log_frames = self.frames
        self._publish(stop=False)

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
        ready = self.receiver.ready()
        for i in ready:
            fragment = self.receiver.buffers[i]
            if fragment.get("version") != self.version:  # sync mode: on-policy or a bug
                raise RuntimeError(f"learner: fragment from env rank {fragment.get('env_rank')} was collected "
                                   f"with policy version {fragment.get('version')}, expected {self.version}")
            self.have[i] = True
        if not all(self.have):
            if ready:
                self._set_waiting_status()
            return len(ready)
        self._update()
        return 1

    def _update(self) -> None:
        self.status = f"training policy version {self.version}"
        a = self.cfg.algo
        if a.lr_schedule == "linear":
            for group in self.optimizer.param_groups:
                group["lr"] = a.lr * max(0.0, 1.0 - self.frames / self.cfg.run.total_frames)
        batch = self._assemble()
        local = self._local_stats()  # read the headers now: the buffers are re-armed below
        losses = ppo_update(self.model, self.optimizer, batch, a, self.rng,
                            average_gradients=self.optimizer.synchronize, apply_step=self._step,
                            loss_scale=self.batch_share)
        self.version += 1
        self.updates += 1
        for i in range(len(self.have)):
            self.have[i] = False
            self.receiver.rearm(i)
        row = self._reduce_stats(local, losses)
        code = 0
        if self.root and self.preempt_requested():
            code = PREEMPTED_CODE
        elif row["frames"] >= self.cfg.run.total_frames:
            code = FRAMES_CODE
        elif self._target_reached():
            code = TARGET_CODE
        code = comm.broadcast_int(self.comm, code)  # MPI: all learners stop after the same update, the same way
        stop, self.preempted = code != 0, code == PREEMPTED_CODE
        self.stopped_by = STOP_REASONS[code]
        if self.root:
            self._report(row, stop)
        self._publish(stop=stop)
        if stop:
            self._finish()
        else:
            self._set_waiting_status()

    def _set_waiting_status(self) -> None:
        """Name the env ranks whose fragments are missing: the watchdog's message, if it fires."""
        missing = [self.receiver.env_ranks[i] for i, have in enumerate(self.have) if not have]
        shown = ", ".join(str(r) for r in missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        self.status = f"waiting for fragments of policy version {self.version} from env ranks {shown}"

    def _step(self) -> None:
        with self.optimizer.skip_synchronize():  # Horovod: gradients were averaged before clipping
            self.optimizer.step()
        self.heartbeat()

    def _assemble(self) -> Batch:
        """This learner's fragments, advantages computed per fragment, as one flat batch."""
        a = self.cfg.algo
        parts = {k: [] for k in ("obs", "actions", "logp", "values", "advantages", "returns")}
        for frag in self.receiver.buffers:
            nxt = successor_values(frag["values"], frag["last_values"], frag["dones"], frag["trunc_values"])
            adv, ret = gae(frag["rewards"], frag["values"], nxt, frag["dones"], a.gamma, a.gae_lambda)
            for key in ("obs", "actions", "logp", "values"):
                parts[key].append(frag[key].reshape(-1, *frag[key].shape[2:]))
            parts["advantages"].append(adv.reshape(-1))
            parts["returns"].append(ret.reshape(-1))
        dtype = {"actions": torch.int64}
        return Batch(**{k: torch.as_tensor(np.concatenate(v), dtype=dtype.get(k, torch.float32), device=self.device)
                        for k, v in parts.items()})

    def _local_stats(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """From this learner's fragment headers: sums (frames, episodes, return sum, return sum of
        squares, length sum), lows (return min, version min) and highs (return max, version max)."""
        frags = self.receiver.buffers
        ep = {name: np.array([f["episode_stats"][i] for f in frags]) for i, name in enumerate(EPISODE_STATS)}
        versions = [f.get("version") for f in frags]
        sums = np.array([sum(f.get("frames") for f in frags), ep["episodes"].sum(), ep["return_sum"].sum(),
                         ep["return_sqsum"].sum(), ep["length_sum"].sum()], dtype=np.float64)
        lows = np.array([ep["return_min"].min(), min(versions)], dtype=np.float64)
        highs = np.array([ep["return_max"].max(), max(versions)], dtype=np.float64)
        return sums, lows, highs

    def _reduce_stats(self, local: tuple[np.ndarray, np.ndarray, np.ndarray], losses: dict[str, float]) -> dict:
        sums, lows, highs = local
        sums = comm.allreduce_sum(self.comm, np.concatenate([sums, [losses[k] for k in LOSS_KEYS]]))
        lo, hi = comm.allreduce_min_max(self.comm, lows, highs)
        frames_now, episodes, ret_sum, ret_sq, len_sum = sums[:5]
        self.frames += int(frames_now)
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
               "policy_lag_max": int(self.version - 1 - lo[1])}
        row.update({k: float(v) / n for k, v in zip(LOSS_KEYS, sums[5:])})
        if self.cfg.run.replica_digests:
            row["replica_digest"] = comm.gather_to_root(self.comm, np.array([self._digest()], dtype=np.int64))
        return row

    def _window_mean(self) -> float:
        episodes = sum(e for e, _ in self.windows)
        return sum(s for _, s in self.windows) / episodes if episodes else float("nan")

    def _target_reached(self) -> bool:
        target = self.cfg.run.target_return
        episodes = sum(e for e, _ in self.windows)
        return target is not None and episodes >= RETURN_WINDOW_EPISODES and self._window_mean() >= target

    def _digest(self) -> int:
        h = hashlib.blake2b(digest_size=8)
        for p in self.model.parameters():
            h.update(p.detach().cpu().numpy().tobytes())
        return int(np.frombuffer(h.digest(), dtype=np.int64)[0])

    # --- learner root only --------------------------------------------------------------------------
    def _publish(self, stop: bool) -> None:
        if self.publisher is not None:
            self.publisher.publish(self.version, lambda flat: copy_params_to(self.model, flat), stop=stop,
                                   preempted=self.preempted)

    def _report(self, row: dict, stop: bool) -> None:
        if row.get("replica_digest") is not None:
            row["replica_digest"] = row["replica_digest"].reshape(-1)
        self.files.metrics.append(row)
        now = time.perf_counter()
        if stop or now - self._last_log >= self.cfg.run.log_interval_s:
            fps = (row["frames"] - self._last_log_frames) / max(now - self._last_log, 1e-9)
            print(f"[hpcrl] frames {row['frames']:>10,} | {fps:8,.0f} fps | return {row['return_window_mean']:7.1f}"
                  f" | version {self.version:5d} | pg {row['loss_policy']:+.3f} v {row['loss_value']:.3f}"
                  f" ent {row['entropy']:.3f} kl {row['approx_kl']:.4f}", flush=True)
            self._last_log, self._last_log_frames = now, row["frames"]
        if stop or now - self._last_ckpt >= self.cfg.run.checkpoint_interval_s:
            self.save()
            self._last_ckpt = now
        if self.preempted:
            print(f"[hpcrl] preempted: checkpoint of policy version {self.version} at {row['frames']:,} frames "
                  f"written; run the same command again to resume", flush=True)

    def save(self) -> None:
        counters = {"frames": self.frames, "updates": self.updates, "policy_version": self.version,
                    "wall_time": time.perf_counter() - self.start, "stopped_by": self.stopped_by,
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
        self.receiver.close()
        if self.publisher is not None:
            self.publisher.wait()
        if self.files is not None:
            self.files.metrics.close()
        self.done = True
        self.status = "finished"
