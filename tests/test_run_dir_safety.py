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
