"""A run directory is data: what hpcrl writes and deletes stays inside it, whatever names and
links it is handed (issue 25's hostile inputs, the run-directory part)."""
import os

import pytest

from hpcrl.core.config import ConfigError, parse_config
from hpcrl.io import rundir
from tests.conftest import run_hpcrl, small_config, write_config


def config(tmp_path, name: str = "run"):
    return parse_config(f"run: {{name: '{name}', output_dir: '{tmp_path / 'runs'}'}}")


@pytest.mark.parametrize("name", ["..", ".", "a/b", "../elsewhere", "/abs"])
def test_run_name_is_one_directory_name(tmp_path, name):
    with pytest.raises(ConfigError, match=r"run.name: expected one directory name such as cartpole_ppo \(not '.', "
                                          r"'..', nor a path\), got"):
        config(tmp_path, name)


def test_overwrite_with_run_name_dotdot_deletes_nothing(tmp_path):
    """`run.name: ..` with --overwrite once deleted output_dir's parent: now one message, exit 2."""
    keep = tmp_path / "unrelated.txt"
    keep.write_text("mine")
    cfg = small_config(tmp_path, run={"name": ".."})
    result = run_hpcrl("run", str(write_config(tmp_path, cfg)), "--overwrite")
    assert result.returncode == 2 and "run.name: expected one directory name" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert keep.read_text() == "mine" and (tmp_path / "config.yaml").exists()


def test_a_run_directory_that_is_a_link_is_neither_written_nor_emptied(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious.txt").write_text("mine")
    (tmp_path / "runs").mkdir()
    os.symlink(elsewhere, tmp_path / "runs" / "run")
    for overwrite in (True, False):
        with pytest.raises(ConfigError, match="is a symbolic link .* hpcrl writes and deletes only inside a real "
                                              "directory under run.output_dir"):
            rundir.prepare(config(tmp_path), overwrite=overwrite)
    assert os.listdir(elsewhere) == ["precious.txt"] and (elsewhere / "precious.txt").read_text() == "mine"


def test_config_yaml_and_recovery_log_are_never_written_through_links(tmp_path):
    run_dir = tmp_path / "runs" / "run"
    run_dir.mkdir(parents=True)
    target = tmp_path / "target.txt"
    target.write_text("mine")
    os.symlink(target, run_dir / "config.yaml")
    start = rundir.prepare(config(tmp_path), overwrite=False)
    assert target.read_text() == "mine"  # the link was replaced by the run's own file
    assert not (run_dir / "config.yaml").is_symlink() and (run_dir / "config.yaml").read_text() == start.config_text
    os.symlink(target, run_dir / "recovery.log")
    with pytest.raises(ConfigError, match=r"recovery.log is a symbolic link .* never through a link: remove the link"):
        rundir.prepare(config(tmp_path), overwrite=False, relaunch="relaunch 1 of at most 3")
    assert target.read_text() == "mine"


def snapshot(directory) -> dict:
    """Every file under `directory`, but the lock (each run that takes it names itself there): its
    bytes and modification time."""
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != "run.lock"}


@pytest.mark.parametrize("damage, says", [
    ("nan", "holds NaN or infinite values (training diverged before this checkpoint was written)"),
    ("shape", "in the checkpoint, the model this run builds has"),
])
def test_a_checkpoint_that_does_not_fit_is_refused_before_anything_is_changed(tmp_path, damage, says):
    """Weights that are NaN, or of another shape than the config's model (with a valid checksum:
    whoever edits a file can recompute it): exit 2, one message, every file of the run as it was
    (config.yaml, metrics.h5, recovery.log untouched; no repair ran)."""
    import h5py
    import numpy as np
    from hpcrl.io.checkpoint import _digest
    from tests.conftest import run_dir
    cfg = small_config(tmp_path, run={"total_frames": 256}, roles={"inference": {"ranks": 0}})
    path = str(write_config(tmp_path, cfg))
    assert run_hpcrl("run", path).returncode == 0
    checkpoint = run_dir(cfg) / "checkpoint.h5"
    with h5py.File(checkpoint, "r+") as f:
        name = next(n for n in f["model"] if isinstance(f["model"][n], h5py.Dataset) and f["model"][n].ndim == 2)
        weights = f["model"][name][()]
        del f["model"][name]
        f["model"].create_dataset(name, data=np.full_like(weights, np.nan) if damage == "nan" else weights[:, :-1])
        f.attrs["sha256"] = _digest(f)
    before = snapshot(run_dir(cfg))
    result = run_hpcrl("run", path, "--set", "run.total_frames=512")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stdout + result.stderr
    assert says in result.stderr and "nothing in the run directory was changed" in result.stderr
    assert snapshot(run_dir(cfg)) == before


def test_a_device_error_writes_nothing(tmp_path):
    """roles.learner.device: cuda on a machine without one is refused before the run directory
    (or output_dir) exists."""
    cfg = small_config(tmp_path, roles={"inference": {"ranks": 0}, "learner": {"ranks": 1, "device": "cuda"}})
    result = run_hpcrl("run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 2 and "device is 'cuda' but rank 0 sees no CUDA device" in result.stderr
    assert not (tmp_path / "runs").exists()
