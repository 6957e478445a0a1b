"""A run directory is data, never code (issue 25): reading its HDF5 files is bounded in time and
memory, a damaged or hostile file is reported (CheckpointError, an OSError naming it) or set
aside, never waited on, and hpcrl never writes through a symbolic link placed there."""
import json
import os
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest
import torch

from hpcrl.io.checkpoint import (CheckpointError, _digest, inspect_latest, load_checkpoint, read_summary,
                                 save_checkpoint)
from hpcrl.io.metrics import MetricsWriter, read_metrics, rebuild_metrics, write_crossed_nodes


def bounded(code: str) -> dict:
    """Run `code` in a fresh interpreter and return the JSON it prints last: a read that hangs
    fails the test (the child is killed) instead of stalling the suite."""
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                              timeout=120)
    except subprocess.TimeoutExpired:
        done = None
    if done is None:
        pytest.fail(f"still waiting after 120 s on:\n{code}")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def model_and_optimizer(hidden: int = 8):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Linear(hidden, 2))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()  # Adam's state exists
    return model, optimizer


def write_checkpoint(path, counters=None, **kwargs) -> None:
    model, optimizer = model_and_optimizer()
    save_checkpoint(str(path), model, optimizer, counters or {"frames": 10, "policy_version": 1, "updates": 1},
                    np.random.default_rng(0), "run: {}\n", **kwargs)


def reseal(path) -> None:
    """Recompute the checksum of an edited file, as anyone can: it is unkeyed."""
    with h5py.File(path, "r+") as f:
        f.attrs["sha256"] = _digest(f)


def test_a_truncated_metrics_file_is_reported_and_set_aside_at_once(tmp_path):
    """An SWMR reader retried the damaged metadata of a cut metrics.h5 for hours: resume,
    `hpcrl inspect` and `hpcrl plot` hung. Now reading fails with an OSError naming the file, and
    the resume's rebuild moves the file aside."""
    path = tmp_path / "metrics.h5"
    writer = MetricsWriter(str(path), attrs={"config": "run: {}"})
    for v in range(600):
        writer.append({"frames": 10 * v, "policy_version": v, "loss": 0.5})
    writer.close()
    with open(path, "r+b") as fh:  # a copy cut short
        fh.truncate(os.path.getsize(path) // 3)
    seen = bounded(f"""
        import json
        from hpcrl.io.metrics import read_metrics, rebuild_metrics
        try:
            read_metrics({str(path)!r})
            error = ""
        except OSError as exc:
            error = str(exc)
        rebuilt = rebuild_metrics({str(path)!r}, through_version=5)
        print(json.dumps({{"error": error, "rows": rebuilt.rows, "damaged_copy": rebuilt.damaged_copy}}))
    """)
    assert seen["error"].startswith(f"{path}: unreadable HDF5 file (")
    assert seen["rows"] == 0 and os.path.basename(seen["damaged_copy"]).startswith("metrics.damaged.")
    assert read_metrics(str(path)) == {}  # the resumed run starts a new, readable file


@pytest.mark.parametrize("link", [False, True], ids=["fifo", "link-to-fifo"])
def test_a_named_pipe_in_place_of_a_run_file_is_refused_without_opening_it(tmp_path, link):
    """open() of a FIFO waits for a writer: `hpcrl inspect` hung on one named checkpoint.h5."""
    fifo = tmp_path / ("elsewhere.fifo" if link else "checkpoint.h5")
    os.mkfifo(fifo)
    if link:
        os.symlink(fifo, tmp_path / "checkpoint.h5")
    os.symlink(tmp_path / "checkpoint.h5", tmp_path / "metrics.h5")
    seen = bounded(f"""
        import json
        from hpcrl.io.checkpoint import CheckpointError, inspect_latest, load_checkpoint, read_summary
        from hpcrl.io.metrics import read_metrics
        checkpoint, metrics = {str(tmp_path / "checkpoint.h5")!r}, {str(tmp_path / "metrics.h5")!r}
        errors = []
        for read, path, error in ((read_summary, checkpoint, CheckpointError),
                                  (load_checkpoint, checkpoint, CheckpointError), (read_metrics, metrics, OSError)):
            try:
                read(path)
                errors.append("")
            except error as exc:
                errors.append(str(exc))
        print(json.dumps({{"errors": errors, "latest": inspect_latest(checkpoint)}}))
    """)
    assert len(seen["errors"]) == 3
    for error in seen["errors"]:
        assert "is a named pipe (FIFO), not a regular file" in error, error
    found, _, counters, problems = seen["latest"]
    assert found is None and counters == {} and "named pipe" in problems[0]


def test_a_link_out_of_a_checkpoint_is_refused_even_with_a_valid_checksum(tmp_path):
    """An external link opened another file when read (here a FIFO: a hang); the checksum does
    not cover links, so it still held."""
    path = tmp_path / "checkpoint.h5"
    write_checkpoint(path)
    os.mkfifo(tmp_path / "pipe")
    with h5py.File(path, "r+") as f:
        del f["model/0000"]
        f["model/0000"] = h5py.ExternalLink(str(tmp_path / "pipe"), "/data")
    reseal(path)
    seen = bounded(f"""
        import json
        from hpcrl.io.checkpoint import CheckpointError, load_checkpoint
        try:
            load_checkpoint({str(path)!r})
            print(json.dumps(""))
        except CheckpointError as exc:
            print(json.dumps(str(exc)))
    """)
    assert seen == f"{path}: not a usable checkpoint: /model/0000 is an external link; hpcrl writes only hard " \
                   f"links, and a link could lead outside the file"


def add_declared_dataset(path, shape: tuple[int, ...]) -> None:
    """A dataset under parts/ that declares `shape` float64 and stores nothing (HDF5 reads its
    missing data as zeros)."""
    with h5py.File(path, "r+") as f:
        f["parts"].create_dataset("0000", shape=shape, dtype=np.float64)
        f["parts"].attrs["_keys"] = json.dumps([["str", "blob"]])


def test_a_dataset_larger_than_its_file_is_refused_before_it_is_read(tmp_path):
    """A 20 KiB checkpoint declaring a 256 GiB dataset ended in MemoryError while hashing; one
    declaring 64 MiB, its checksum recomputed, was read whole (inspect read 2 GiB for a 2 GiB one)."""
    huge, sealed = tmp_path / "huge.h5", tmp_path / "sealed.h5"
    for path in (huge, sealed):
        write_checkpoint(path)
    add_declared_dataset(huge, (1 << 35,))
    with pytest.raises(CheckpointError, match=r"huge.h5: not a usable checkpoint: dataset /parts/0000 declares "
                                              r"274,877,906,944 bytes \(\(34359738368,\) of float64\) but the file "
                                              r"stores 0 bytes of it and holds [\d,]+ bytes in all: the file is "
                                              r"damaged"):
        read_summary(str(huge))
    add_declared_dataset(sealed, (1 << 23,))
    reseal(sealed)
    for read in (read_summary, load_checkpoint):
        with pytest.raises(CheckpointError, match=r"dataset /parts/0000 declares 67,108,864 bytes"):
            read(str(sealed))

    metrics = tmp_path / "metrics.h5"
    with h5py.File(metrics, "w") as f:
        f.create_dataset("frames", shape=(1 << 35,), dtype=np.int64)
    with pytest.raises(OSError, match=r"dataset /frames declares 274,877,906,944 bytes"):
        read_metrics(str(metrics))


def test_counters_that_are_not_whole_numbers_make_a_checkpoint_unusable(tmp_path):
    """frames stored as a string passed the checksum and failed later in int() as a ValueError."""
    path = tmp_path / "checkpoint.h5"
    write_checkpoint(path, counters={"frames": "12", "policy_version": 1})
    message = f"{path}: counter 'frames' is '12', not a whole number >= 0"
    with pytest.raises(CheckpointError, match=message):
        read_summary(str(path))
    found, _, _, problems = inspect_latest(str(path))
    assert found is None and problems == [f"skipping {message} (the file was written by something else, or edited)"]
    write_checkpoint(path, counters={"frames": 12, "policy_version": 2.5})
    with pytest.raises(CheckpointError, match="counter 'policy_version' is 2.5"):
        load_checkpoint(str(path))


def shapes_of(model) -> dict[str, tuple[int, ...]]:
    return {key: tuple(value.shape) for key, value in model.state_dict().items()}


def test_check_fits_names_the_first_thing_that_does_not_fit(tmp_path):
    from hpcrl.io.checkpoint import check_fits
    path = str(tmp_path / "checkpoint.h5")
    model, optimizer = model_and_optimizer()
    other, other_optimizer = model_and_optimizer(hidden=16)
    policies = {"b": {"model": other.state_dict(), "optimizer": other_optimizer.state_dict(), "step": {}}}
    save_checkpoint(path, model, optimizer, {"frames": 1}, np.random.default_rng(0), "c", policies=policies)
    checkpoint = load_checkpoint(path)
    check_fits(checkpoint, {"a": shapes_of(model), "b": shapes_of(other)}, path)  # fits: nothing raised

    with pytest.raises(CheckpointError, match=r"policy 'b': 0.weight is \(16, 4\) in the checkpoint, the model "
                                              r"this run builds has \(8, 4\); resume with the model settings"):
        check_fits(checkpoint, {"a": shapes_of(model), "b": shapes_of(model)}, path)
    with pytest.raises(CheckpointError, match=r"policy 'a': the saved model is not the one this run builds: it "
                                              r"lacks \['2.weight'\]; resume with"):
        check_fits(checkpoint, {"a": {**shapes_of(model), "2.weight": (2, 2)}, "b": shapes_of(other)}, path)
    with pytest.raises(CheckpointError, match=r"holds the policies \['a', 'b'\], the run has \['a'\]"):
        check_fits(checkpoint, {"a": shapes_of(model)}, path)

    checkpoint["policies"]["b"]["optimizer"]["state"][1]["exp_avg_sq"][0] = float("nan")
    with pytest.raises(CheckpointError, match=r"policy 'b': optimizer.state.1.exp_avg_sq holds NaN or infinite "
                                              r"values \(training diverged"):
        check_fits(checkpoint, {"a": shapes_of(model), "b": shapes_of(other)}, path)
    checkpoint["model"]["0.bias"][1] = float("inf")
    with pytest.raises(CheckpointError, match=r"policy 'a': model.0.bias holds NaN"):
        check_fits(checkpoint, {"a": shapes_of(model), "b": shapes_of(other)}, path)
    checkpoint["counters"]["frames"] = "1"
    with pytest.raises(CheckpointError, match=r"counter 'frames' is '1'"):
        check_fits(checkpoint, {"a": shapes_of(model), "b": shapes_of(other)}, path)


def test_run_files_are_never_written_through_links(tmp_path):
    """A link placed in the run directory once let hpcrl overwrite its target."""
    target = tmp_path / "precious.h5"
    target.write_bytes(b"mine")
    metrics = tmp_path / "metrics.h5"
    os.symlink(target, metrics)
    writer = MetricsWriter(str(metrics))
    writer.append({"frames": 1, "policy_version": 1})
    writer.close()
    assert target.read_bytes() == b"mine" and not metrics.is_symlink()
    assert read_metrics(str(metrics))["frames"].tolist() == [1]
    kept = tmp_path / "kept.h5"
    os.replace(metrics, kept)
    os.symlink(kept, metrics)
    with pytest.raises(OSError, match="metrics.h5 is a symbolic link .* hpcrl writes only the run's own file"):
        write_crossed_nodes(str(metrics), ("a",), np.ones((1, 2)))
    with h5py.File(kept) as f:
        assert not f.attrs  # nothing appended through the link
    assert rebuild_metrics(str(metrics), through_version=1).rows == 1  # read through the link, rewritten beside
    assert not metrics.is_symlink() and h5py.is_hdf5(kept)

    checkpoint = tmp_path / "checkpoint.h5"
    os.symlink(target, f"{checkpoint}.tmp.{os.getpid()}")  # where the writer puts its temporary file
    write_checkpoint(checkpoint)
    assert target.read_bytes() == b"mine" and read_summary(str(checkpoint))[1]["frames"] == 10


def test_a_metrics_file_without_a_series_reads_what_is_there_and_says_what_is_missing(tmp_path):
    from hpcrl.io.metrics import missing_series
    path = str(tmp_path / "metrics.h5")
    writer = MetricsWriter(path)
    writer.append({"policy_version": 1, "wall_time": 0.5})
    writer.close()
    metrics = read_metrics(path)
    assert sorted(metrics) == ["policy_version", "wall_time"]
    assert missing_series(metrics) == ["frames"]
