"""Metrics rows in Weights & Biases (run.wandb), as TensorBoard gets them (io/tensorboard.py): the
same scalars under the same tags (episode/, losses/, perf/, train/, eval/, ...), step = frames, a
NaN no point, and the run's resolved config.

One W&B run per run directory: its id is kept in the run directory (WANDB_ID_FILE, plain text),
so a resumed run goes on in the same W&B run; --overwrite empties the directory and so starts a
new one. W&B's own files go to the run directory's wandb/ (with mode 'offline' all there is, for a
later `wandb sync`). A population's members are one W&B run each, grouped under the population's
name unless run.wandb.group says otherwise.

W&B is a report, never a reason to stop: the wandb package is imported only here, only where a
project is named, and any failure (no package, no network, no login, a full disk) is one warning,
after which the run goes on without it. wandb.log hands the rows to W&B's own service process,
so the learner does not wait for the network.
"""
from __future__ import annotations

import math
import os
import re
import secrets

import numpy as np

from hpcrl.core.say import say
from hpcrl.io.tensorboard import tag_of

WANDB_ID_FILE = "wandb-id.txt"
WANDB_ID = re.compile(r"[a-z0-9]{8,64}")  # what we write; anything else in the file is not ours
INIT_TIMEOUT_S = 60  # a server that does not answer in this long: a warning, and no W&B


class WandbScalars:
    def __init__(self, run_dir: str, settings, name: str, config: dict, group: str | None = None,
                 label: str = ""):
        """A W&B run for the run directory `run_dir` (run.wandb `settings`), named `name`, with
        the run's resolved `config`; `group`: where run.wandb.group is null (a population's name
        for its members). `label`: the run's label on its lines (' member03')."""
        self.label, self.run = label, None
        try:
            import wandb
            run_id = _kept_id(run_dir) or secrets.token_hex(6)  # (W&B's own ids: 8 letters and digits)
            self.run = wandb.init(project=settings.project, entity=settings.entity, group=settings.group or group,
                                  tags=list(settings.tags) or None, mode=settings.mode, dir=run_dir, id=run_id,
                                  name=name, resume="allow", config=config,
                                  settings=wandb.Settings(silent=True, init_timeout=INIT_TIMEOUT_S,
                                                          console="off"))
            _keep_id(run_dir, run_id)
        except Exception as exc:  # (no package, no network, no login: the run goes on without W&B)
            self._failed("cannot start", exc)

    def append(self, rows: list[dict[str, np.ndarray]]) -> None:
        if self.run is None:
            return
        try:
            for row in rows:
                values = {tag: float(value) for key, value in row.items()
                          if np.ndim(value) == 0 and (tag := tag_of(key)) and not math.isnan(float(value))}
                self.run.log(values, step=int(row["frames"]))
        except Exception as exc:
            self._failed("cannot log to", exc)

    def close(self) -> None:
        if self.run is None:
            return
        try:
            self.run.finish()
        except Exception as exc:
            self._failed("cannot finish", exc)

    def _failed(self, what: str, exc: Exception) -> None:
        hint = "; pip install 'hpcrl[wandb]'" if isinstance(exc, ImportError) else ""
        say(f"warning: run.wandb: {what} Weights & Biases ({type(exc).__name__}: {exc}){hint}; the run goes on "
            f"without it (metrics.h5 and TensorBoard have every row)", label=self.label)
        self.run = None


def _kept_id(run_dir: str) -> str | None:
    """The W&B run id this run directory logged to before (data: read bounded, used only if it is
    what we write)."""
    try:
        fd = os.open(os.path.join(run_dir, WANDB_ID_FILE), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        text = fh.read(80).decode("ascii", "replace").strip()
    return text if WANDB_ID.fullmatch(text) else None


def _keep_id(run_dir: str, run_id: str) -> None:
    from hpcrl.io.rundir import replace_text
    replace_text(os.path.join(run_dir, WANDB_ID_FILE), run_id + "\n")
