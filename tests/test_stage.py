"""`hpcrl stage` (tools/stage.py): a real virtual environment packed once into an archive named by
its content, unpacked once per node into node-local storage and started from there; a
node-local directory that is read-only, too small or that fills up midway is refused with one
message and left without a partial copy."""
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from hpcrl.tools.stage import COMPLETE, StageError, pack, staged_python, unpack
from tests.conftest import run_hpcrl, tmpfs


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A real venv (no pip: small) with an editable-install hook of hpcrl, as `pip install -e` leaves."""
    root = tmp_path_factory.mktemp("env") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    (site,) = root.glob("lib/python3*/site-packages")
    (site / "__editable__.hpcrl-0.1.0.pth").write_text("import sys; sys.path.insert(0, '/nowhere')\n")
    return root


@pytest.fixture
def package(tmp_path) -> Path:
    """A package to stage as hpcrl: it says where it was imported from."""
    pkg = tmp_path / "src" / "hpcrl"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("STAGED = True\n")
    (pkg / "tools").mkdir()
    (pkg / "tools" / "__init__.py").write_text("")
    return pkg


def test_pack_is_reused_until_a_file_changes_and_leaves_out_the_editable_hook(venv, package, tmp_path):
    archive, written = pack(venv, package, tmp_path / "stage")
    assert written and archive.name.startswith("hpcrl-env-") and archive.suffix == ".tar"
    assert pack(venv, package, tmp_path / "stage") == (archive, False)  # nothing changed: the same archive
    names = tarfile.open(archive).getnames()
    assert not any("__editable__" in n for n in names)
    assert any(n.endswith("site-packages/hpcrl/tools/__init__.py") for n in names)
    assert "venv/bin/python" in names and "venv/pyvenv.cfg" in names
    (package / "__init__.py").write_text("STAGED = 2\n")
    changed, written = pack(venv, package, tmp_path / "stage")
    assert written and changed != archive
    assert sorted(p.name for p in (tmp_path / "stage").iterdir()) == sorted([archive.name, changed.name])


def test_the_staged_copy_imports_hpcrl_from_itself_and_is_reused(venv, package, tmp_path):
    archive, _ = pack(venv, package, tmp_path / "stage")
    target, extracted = unpack(archive, tmp_path / "node")
    assert extracted and (target / COMPLETE).is_file()
    python = staged_python(target)
    shown = subprocess.run([str(python), "-c", "import hpcrl, sys; print(hpcrl.__file__); print(sys.prefix)"],
                           capture_output=True, text=True, check=True, cwd=tmp_path, env={"PATH": os.environ["PATH"]})
    module, prefix = shown.stdout.split()
    assert Path(module).is_relative_to(target) and Path(prefix) == target / "venv"
    assert unpack(archive, tmp_path / "node") == (target, False)  # a second rank of the node: nothing to do
    assert sorted(p.name for p in (tmp_path / "node").iterdir()) == [target.name]


def test_a_read_only_node_directory_is_refused_with_one_message(venv, package, tmp_path):
    archive, _ = pack(venv, package, tmp_path / "stage")
    with tmpfs(tmp_path / "ro", "16m", "ro") as node:
        result = run_hpcrl("stage", "unpack", str(archive), "--to", str(node))
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"hpcrl: stage unpack: the node-local directory {node} is not writable; give a " \
                            f"writable one with --to\n"


def test_a_node_directory_without_room_is_refused_and_one_that_fills_up_keeps_no_partial_copy(venv, package,
                                                                                              tmp_path):
    archive, _ = pack(venv, package, tmp_path / "stage")
    with tmpfs(tmp_path / "small", "4k") as node:  # the venv holds about 14 KB
        with pytest.raises(StageError, match=rf"no room in {node} for the staged environment: it needs "
                                             r"\d+\.\d\d GiB, 0\.00 GiB are free; free some, or give another"):
            unpack(archive, node)
        assert list(node.iterdir()) == []
    with tmpfs(tmp_path / "few_inodes", "64m", "nr_inodes=6") as node:  # room enough, but few files
        with pytest.raises(StageError, match=rf"cannot unpack {archive} into {node}: No space left on device"):
            unpack(archive, node)
        assert list(node.iterdir()) == []  # no partial copy left behind


def test_cli_refuses_what_is_not_an_archive_of_pack(tmp_path):
    bogus = tmp_path / "env.tar"
    bogus.write_text("x")
    result = run_hpcrl("stage", "unpack", str(bogus), "--to", str(tmp_path / "node"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr == (f"hpcrl: stage unpack: {bogus}: not an archive of hpcrl stage pack (expected a file "
                             f"named hpcrl-env-KEY.tar)\n")

