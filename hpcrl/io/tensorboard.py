"""Metrics rows as TensorBoard scalars in event files beside metrics.h5 (`tensorboard --logdir
runs` shows every run), grouped as SB3 and CleanRL users know them, and the run's config as text.

Tags: `episode/` (returns, lengths, episode counts), `losses/` (the losses, entropy, KL, clip
fraction, TD error), `perf/` (speed, waits, slots, lag, memory, the replay's fill and ratio),
`selfplay/` and `anchors/` (a self-play run's games and its rating), `eval/` (run.eval's
evaluations), and `train/` for the rest
(the learning rate and other scheduled values, the policy version, Q-values, epsilons). The step
is `frames`; `frames` and `wall_time` are not scalars of their own (TensorBoard keeps every
event's wall time). A NaN (an update in which no episode ended, or without an evaluation) is
no point. Records go through the tensorboard package's record format (no torch
needed), written synchronously by the learner's own thread, so a failed write (a full disk)
raises here, naming the events file, instead of in a background thread. TensorBoard stores
scalars as float32.
"""
from __future__ import annotations

import itertools
import os
import socket
import time

import numpy as np

EPISODE = frozenset({"return_mean", "return_std", "return_min", "return_max", "return_window_mean", "length_mean",
                     "episodes"})
LOSSES = frozenset({"entropy", "approx_kl", "clip_frac", "td_error"})
PERF = frozenset({"fps", "env_wait_fraction", "env_credit_wait_fraction", "sample_slots_max", "learner_rss_mib",
                  "policy_lag_max", "fragments_dropped", "sample_version_min", "sample_version_max", "replay_size",
                  "replay_ratio"})
NOT_SCALARS = frozenset({"frames", "wall_time"})  # the step, and each event's own time


def tag_of(key: str) -> str | None:
    """The TensorBoard tag of a metrics key ('return_mean' -> 'episode/return_mean'); None for a
    key that is not written as a scalar of its own."""
    if key in NOT_SCALARS:
        return None
    if key.startswith("eval_"):
        return f"eval/{key[len('eval_'):]}"
    if key.startswith(("selfplay.", "anchor.")):
        group, _, rest = key.partition(".")
        return f"{'selfplay' if group == 'selfplay' else 'anchors'}/{rest.replace('.', '/')}"
    if key in EPISODE:
        return f"episode/{key}"
    if key.startswith("loss") or key in LOSSES:
        return f"losses/{key}"
    return f"perf/{key}" if key in PERF else f"train/{key}"


_event_files = itertools.count()  # several writers in one process (and second) get their own files


class TensorBoardScalars:
    def __init__(self, log_dir: str, purge_from_step: int = 0, config_text: str | None = None):
        """A new event file in `log_dir`. `purge_from_step`: TensorBoard drops what earlier files
        wrote from this step on (a resumed run's rows after its checkpoint). `config_text`: the
        run's resolved config, written as the text 'config' (TensorBoard's Text tab)."""
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.record_writer import RecordWriter
        self._event, self._summary = Event, Summary
        self.path = os.path.join(log_dir, f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
                                          f"{os.getpid()}.{next(_event_files)}")
        self.writer = RecordWriter(open(self.path, "wb"))
        self._write(Event(wall_time=time.time(), file_version="brain.Event:2"))
        # A session start at step s makes TensorBoard discard every event of earlier files with a
        # step >= s (what torch's SummaryWriter(purge_step=s) writes): a resumed run's cut rows.
        self._write(Event(step=purge_from_step, wall_time=time.time(),
                          session_log=SessionLog(status=SessionLog.START)))
        if config_text:
            self._write(Event(step=purge_from_step, wall_time=time.time(),
                              summary=Summary(value=[_text("config", config_text)])))

    def _write(self, event, flush: bool = True) -> None:
        try:
            self.writer.write(event.SerializeToString())
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, self.path) from None
        if flush:
            self._flush()

    def _flush(self) -> None:
        """Readers see the rows as soon as metrics.h5 has them."""
        try:
            self.writer.flush()
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, self.path) from None

    def append(self, rows: list[dict[str, np.ndarray]]) -> None:
        for row in rows:
            # vectors (replica digests) stay in HDF5; NaN is no value (no episode ended yet, no evaluation)
            values = [self._summary.Value(tag=tag, simple_value=float(value)) for key, value in row.items()
                      if np.ndim(value) == 0 and not np.isnan(value) and (tag := tag_of(key))]
            self._write(self._event(step=int(row["frames"]), wall_time=time.time(),
                                    summary=self._summary(value=values)), flush=False)
        self._flush()

    def close(self) -> None:
        self.writer.close()


def _text(tag: str, text: str):
    """A summary value TensorBoard's Text tab shows: Markdown, here the YAML as a code block."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
    from tensorboard.compat.proto.types_pb2 import DT_STRING
    markdown = "\n".join("    " + line for line in text.splitlines())
    return Summary.Value(tag=tag, metadata=SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text")),
                         tensor=TensorProto(dtype=DT_STRING, string_val=[markdown.encode("utf-8")],
                                            tensor_shape=TensorShapeProto(dim=[])))
