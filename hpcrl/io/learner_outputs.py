"""The learner root's outputs in the run directory: a metrics row per update, the progress line,
and checkpoints when one is due; a write that fails (a full disk, a quota, a file system gone
read-only) becomes one message and a stop code instead of a traceback."""
from __future__ import annotations

import math
import os
import sys
import time
from typing import Callable

from hpcrl.io.checkpoint import inspect_latest
from hpcrl.io.metrics import MetricsWriter
from hpcrl.core.stop import EXIT_OUTPUT_FAILED, StopReason
from hpcrl.io.rundir import CHECKPOINT_FILE, METRICS_FILE, RunStart, free_space, os_reason
from hpcrl.core.say import duration, say

# Metrics rows reach metrics.h5 (and TensorBoard) within this long, and before every checkpoint:
# written one by one, they cost small-batch async learners a large share of their core.
METRICS_FLUSH_S = 1.0


class LearnerOutputs:
    def __init__(self, start: RunStart, run, progress: str = "loss {loss:.3f}", label: str = "",
                 provenance: dict | None = None, turns: bool = False):
        """`start`: the run directory as rundir.prepare left it (a resume continues metrics.h5,
        already cut back to the checkpoint, from the checkpoint's frames); `run`: the config's run
        section (its log and checkpoint intervals, TensorBoard). `progress`: the algorithm's part of
        the progress line, a format string over the row (its step's `progress`). `label`: after
        '[hpcrl' on its lines (' member03' in a population). `provenance`: what checkpoints record
        of the packages and the layout (core/reproducible.py). `turns`: a packed member's turn
        (launch/packed.py), whose stop at its turn's end is no preemption to say (its launch says one)."""
        run_dir, config_text, start_frames = start.run_dir, start.config_text, start.start_frames
        self.provenance = provenance or {}
        self.progress, self.label, self.turns = progress, label, turns
        self.saved = False  # whether the last report wrote a checkpoint
        self.run_dir = run_dir
        self.config_text = config_text
        self.log_interval_s, self.checkpoint_interval_s = run.log_interval_s, run.checkpoint_interval_s
        self.metrics = MetricsWriter(os.path.join(run_dir, METRICS_FILE), attrs={"config": config_text},
                                     resume=start.resume_file is not None,
                                     tensorboard_dir=run_dir if run.tensorboard else None,
                                     flush_interval_s=METRICS_FLUSH_S, mirrors=_wandb(run, run_dir, config_text, label))
        self.checkpoint_path = os.path.join(run_dir, CHECKPOINT_FILE)
        self.failed = False
        self.total_frames = run.total_frames
        self.eval = run.eval
        self._last_log = self._last_ckpt = time.perf_counter()
        self._last_log_frames = start_frames
        self._logged = turns  # the first update's line comes at once, not after log_interval_s (a turn: at its end)

    def checkpoint_due(self, code: int) -> bool:
        """A checkpoint is written with this update: the run stops, or the interval has passed."""
        return bool(code) or time.perf_counter() - self._last_ckpt >= self.checkpoint_interval_s

    def report(self, row: dict, code: int, save: Callable[[str], None], checkpoint: bool | None = None) -> int:
        """Add the metrics row (written within METRICS_FLUSH_S), write a checkpoint via `save(path)`
        when one is due (`checkpoint`, when the caller decided already) or the run stops, and print
        the progress line; returns `code`, or StopReason.OUTPUT_FAILED when an output could not be
        written: the run then stops on every rank with one message."""
        if row.get("replica_digest") is not None:
            row["replica_digest"] = row["replica_digest"].reshape(-1)
        try:
            self.metrics.append(row)
        except OSError as exc:
            return self.output_failed("the metrics rows of the last updates", self.metrics.path, exc)
        now = time.perf_counter()
        if code or not self._logged or now - self._last_log >= self.log_interval_s:
            fps = (row["frames"] - self._last_log_frames) / max(now - self._last_log, 1e-9)
            rating = f" | rating {row['rating']:6.1f}" if "rating" in row else ""  # against the anchors
            say(f"frames {row['frames']:>10,} {progress_of(row['frames'], self.total_frames, fps)} | return "
                f"{row['return_window_mean']:7.1f}{rating} | version {row['policy_version']:5d} | "
                f"{self.progress.format(**row)}", label=self.label)
            self._last_log, self._last_log_frames, self._logged = now, row["frames"], True
        if not math.isnan(row.get("eval_return_mean", math.nan)):  # an evaluation's, always
            say(f"eval at {row['frames']:,} frames (version {row['policy_version']}): return "
                f"{row['eval_return_mean']:.1f} +- {row['eval_return_std']:.1f} over {self.eval.episodes} episodes "
                f"({'deterministic' if self.eval.deterministic else 'sampled actions'}), length "
                f"{row['eval_length_mean']:.1f}", label=self.label)
        self.saved = False
        if self.checkpoint_due(code) if checkpoint is None else checkpoint:
            try:  # the checkpoint's rows first: a resume keeps the rows up to its checkpoint
                self.metrics.flush()
            except OSError as exc:
                return self.output_failed("the metrics rows before this checkpoint", self.metrics.path, exc)
            try:
                save(self.checkpoint_path)
            except OSError as exc:
                return self.output_failed("the checkpoint", self.checkpoint_path, exc)
            self._last_ckpt = now
            self.saved = True  # the trainers save what they hold beside it (replay shards)
        if code == StopReason.PREEMPTED and not self.turns:
            say(f"preempted: checkpoint of policy version {row['policy_version']} at "
                f"{row['frames']:,} frames written; run the same command again to resume", label=self.label)
        return code

    def output_failed(self, what: str, path: str, exc: OSError) -> int:
        """One message for an output that could not be written: what, where, why, and the
        checkpoint that stays valid. Returns the stop code."""
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
        return StopReason.OUTPUT_FAILED

    def close(self) -> None:
        try:
            self.metrics.close()
        except OSError:
            if not self.failed:  # after a failed write, closing fails too; resuming rebuilds the file
                raise


def progress_of(frames: int, total: int, fps: float) -> str:
    """' 46% | 3,857 fps | ETA 7s': the share of run.total_frames done, the speed since the last
    line, and the time the rest of the budget takes at that speed (a target return may end the run
    sooner)."""
    left = max(total - frames, 0)
    eta = f" | ETA {duration(left / fps)}" if fps > 0 and left else ""
    return f"{min(100 * frames / total, 100):3.0f}% | {fps:8,.0f} fps{eta}"


def _wandb(run, run_dir: str, config_text: str, label: str) -> tuple:
    """Weights & Biases, where run.wandb names a project: (its sink,) or ()."""
    if run.wandb.project is None or run.wandb.mode == "disabled":
        return ()
    import yaml
    from hpcrl.io.wandb_log import WandbScalars
    # a population's members (a label): grouped under the population's name, their output_dir's
    group = os.path.basename(os.path.normpath(run.output_dir)) if label else None
    return (WandbScalars(run_dir, run.wandb, run.name, yaml.safe_load(config_text), group=group, label=label),)
