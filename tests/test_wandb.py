"""Weights & Biases (run.wandb): a real wandb in offline mode logs every metrics row, the values of
metrics.h5 under TensorBoard's tags, and the config; a resumed run goes on in the same W&B run;
a W&B that cannot start is one warning and the run goes on. W&B's local files are read back
here: its run record log (LevelDB's log format of protobuf records, what `wandb sync` uploads)."""
import json
import math
import struct
from pathlib import Path

import numpy as np

from hpcrl.io.metrics import read_metrics
from hpcrl.io.tensorboard import tag_of
from hpcrl.io.wandb_log import WANDB_ID_FILE
from tests.conftest import mpirun, run_dir, small_config, write_config

BLOCK, HEADER = 32768, 7  # the log's blocks, and each chunk's header: crc32 (4), length (2), type (1)


def wandb_records(path: Path):
    """Every protobuf Record of a W&B run file: after its 7-byte file header (':W&B', magic,
    version), chunks that never cross a 32 KiB block; a record is one FULL chunk (type 1) or a
    FIRST, MIDDLEs and a LAST (2, 3, 4)."""
    from wandb.proto import wandb_internal_pb2
    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if length == 0 and kind == 0:
            pos += left
            continue
        pending += data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def history(run_dir_path: Path) -> tuple[list[dict], list[dict], set[str]]:
    """Every history row and every run record's config of the run directory's W&B runs, in the
    order they were written, and the W&B run ids of its offline runs."""
    rows, configs, ids = [], [], set()
    for run_file in sorted(run_dir_path.glob("wandb/offline-run-*/run-*.wandb")):
        ids.add(run_file.stem.removeprefix("run-"))
        for record in wandb_records(run_file):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
            elif kind == "run":
                configs.append({u.key: json.loads(u.value_json) for u in record.run.config.update})
    return rows, configs, ids


def test_offline_wandb_logs_every_row_of_metrics_h5_and_goes_on_after_a_resume(tmp_path):
    cfg = small_config(tmp_path, roles={"inference": {"ranks": 0}}, run={"total_frames": 512})
    cfg["run"]["wandb"] = {"project": "hpcrl-test", "mode": "offline", "tags": ["ci"]}
    path = str(write_config(tmp_path, cfg))
    first = mpirun(1, "run", path)
    assert first.returncode == 0 and "warning" not in first.stdout, first.stdout + first.stderr
    again = mpirun(1, "run", path, "--set", "run.total_frames=1024")
    assert again.returncode == 0 and "resuming from" in again.stdout, again.stdout + again.stderr

    rows, configs, ids = history(run_dir(cfg))
    metrics = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    kept = (run_dir(cfg) / WANDB_ID_FILE).read_text().strip()
    assert ids == {kept} and len(configs) >= 2  # two launches, one W&B run
    assert configs[0]["run"]["wandb"]["project"] == "hpcrl-test" and configs[0]["env"]["id"] == "CartPole-v1"
    assert [r["_step"] for r in rows] == metrics["frames"].tolist()
    for i, row in enumerate(rows):
        for key, series in metrics.items():
            tag = tag_of(key)
            if series.ndim != 1 or tag is None:
                continue
            value = float(series[i])
            assert (tag not in row) if math.isnan(value) else row[tag] == value, (i, key, row.get(tag), value)
    assert np.isfinite(metrics["loss_policy"]).all() and "losses/loss_policy" in rows[-1]


def test_a_wandb_that_cannot_start_is_one_warning_and_the_run_goes_on(tmp_path):
    """An entity that W&B refuses in offline mode cannot happen; a project W&B cannot create a
    directory for can: the run directory's wandb/ is a file here."""
    cfg = small_config(tmp_path, roles={"inference": {"ranks": 0}}, run={"total_frames": 256})
    cfg["run"]["wandb"] = {"project": "hpcrl-test", "mode": "offline"}
    run_dir(cfg).mkdir(parents=True)
    (run_dir(cfg) / "wandb").write_text("not a directory\n")
    done = mpirun(1, "run", str(write_config(tmp_path, cfg)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("warning: run.wandb: cannot start Weights & Biases") == 1, done.stdout
    assert read_metrics(str(run_dir(cfg) / "metrics.h5"))["frames"][-1] >= 256


def test_each_member_of_a_population_is_a_wandb_run_grouped_under_the_population(tmp_path):
    cfg = small_config(tmp_path, name="pbt", roles={"inference": {"ranks": 0}}, run={"total_frames": 512})
    cfg["population"] = {"members": 2, "ready_frames": 256}
    cfg["run"]["wandb"] = {"project": "hpcrl-test", "mode": "offline"}
    done = mpirun(2, "run", str(write_config(tmp_path, cfg)))
    assert done.returncode == 0 and "warning: run.wandb" not in done.stdout, done.stdout + done.stderr
    ids, groups, names = set(), set(), []
    for member in ("member0", "member1"):
        (run_file,) = (run_dir(cfg) / member).glob("wandb/offline-run-*/run-*.wandb")
        ids.add(run_file.stem)
        run = next(r.run for r in wandb_records(run_file) if r.WhichOneof("record_type") == "run")
        groups.add(run.run_group)
        names.append(run.display_name)
        rows, _, _ = history(run_dir(cfg) / member)
        metrics = read_metrics(str(run_dir(cfg) / member / "metrics.h5"))
        assert [r["_step"] for r in rows] == metrics["frames"].tolist()
    assert len(ids) == 2 and groups == {"pbt"} and names == ["member0", "member1"]
