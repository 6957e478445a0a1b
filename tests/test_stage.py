"""`hpcrl stage` (tools/stage.py): a real virtual environment, with the interpreter install it was
made from, packed once into an archive named by its content, unpacked once per node into
node-local storage and started from there with the originals out of sight; a conda-style
environment (an interpreter install of its own) likewise; a node-local directory that is
read-only, too small or that fills up midway is refused with one message and left without a
partial copy."""
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import hpcrl
from hpcrl.tools.elf import search_path, with_search_path
from hpcrl.tools.stage import COMPLETE, Places, StageError, environment, pack, staged_python, unpack
from tests.conftest import run_hpcrl, tmpfs

BASE = Path(sys.base_prefix)  # the install this test's venv was made from (pyenv's here)
STDLIB = f"python{sys.version_info.major}.{sys.version_info.minor}"
CHECKOUT = Path(hpcrl.__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A real venv (no pip: small) with an editable-install hook of hpcrl, as `pip install -e` leaves."""
    root = tmp_path_factory.mktemp("env") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    (site,) = root.glob("lib/python3*/site-packages")
    (site / "__editable__.hpcrl-0.1.0.pth").write_text("import sys; sys.path.insert(0, '/nowhere')\n")
    return root


def make_package(root: Path) -> Path:
    """A package to stage as hpcrl: it says where it was imported from."""
    pkg = root / "src" / "hpcrl"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("STAGED = True\n")
    (pkg / "tools").mkdir()
    (pkg / "tools" / "__init__.py").write_text("")
    return pkg


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    return make_package(tmp_path_factory.mktemp("pkg"))


@pytest.fixture(scope="module")
def archive(venv, package, tmp_path_factory) -> Path:
    return pack(venv, package, tmp_path_factory.mktemp("stage"))[0]


def run_hidden(python: Path, code: str, hidden: list[Path], cwd: Path) -> str:
    """`python -c code` in a mount namespace of its own, where each of `hidden` is an empty
    directory: what it prints, having read nothing from them."""
    mounts = " && ".join(f"mount -t tmpfs -o size=1m none {str(h)!r}" for h in hidden)
    done = subprocess.run(["unshare", "-m", "sh", "-c", f'{mounts} && exec "$0" -c "$1"', str(python), code],
                          capture_output=True, text=True, cwd=cwd, env={"PATH": os.environ["PATH"]})
    assert done.returncode == 0, done.stderr
    return done.stdout


SHOW = ("import hpcrl, json, ssl, sys; print(json.dumps([hpcrl.__file__, sys.prefix, sys.base_prefix, "
        "sorted({line.split()[-1] for line in open('/proc/self/maps') if 'libpython' in line})]))")


def test_pack_is_reused_until_a_file_changes_and_holds_the_interpreter_but_not_the_editable_hook(
        venv, package, archive, tmp_path):
    assert archive.name.startswith("hpcrl-env-") and archive.suffix == ".tar"
    assert pack(venv, package, archive.parent) == (archive, False)  # nothing changed: the same archive
    members = {m.name: m for m in tarfile.open(archive).getmembers()}
    assert not any("__editable__" in n for n in members)
    assert f"venv/lib/{STDLIB}/site-packages/hpcrl/tools/__init__.py" in members
    assert "venv/pyvenv.cfg" in members and f"python/lib/{STDLIB}/os.py" in members
    assert members["venv/bin/python"].linkname == f"../../python/bin/{STDLIB}"  # the staged interpreter
    assert members[f"python/bin/{STDLIB}"].isreg()
    # not the base's test suite nor its site-packages (the venv does not see them)
    assert not any(n.startswith((f"python/lib/{STDLIB}/test/", f"python/lib/{STDLIB}/site-packages/"))
                   for n in members)
    changed_package = make_package(tmp_path)
    changed, written = pack(venv, changed_package, archive.parent)
    assert written and changed != archive
    assert sorted(p.name for p in archive.parent.iterdir()) == sorted([archive.name, changed.name])
    changed.unlink()


def test_the_staged_copy_runs_with_the_venv_its_interpreter_and_the_checkout_out_of_sight(
        venv, package, archive, tmp_path):
    """Everything a rank imports, down to libpython, comes from the node's copy: with the venv,
    the interpreter install it was made from and the checkout hidden, the staged python starts,
    imports the staged hpcrl and the standard library's extension modules, and maps libpython
    from the copy."""
    target, extracted = unpack(archive, tmp_path / "node")
    assert extracted and (target / COMPLETE).is_file()
    python = staged_python(target)
    assert python == target / "venv" / "bin" / "python"
    shown = run_hidden(python, SHOW, [venv, BASE, CHECKOUT, package.parent], cwd=tmp_path)
    module, prefix, base, libpython = eval(shown)
    assert Path(module) == target / f"venv/lib/{STDLIB}/site-packages/hpcrl/__init__.py"
    assert (Path(prefix), Path(base)) == (target / "venv", target / "python")
    assert [Path(p).parent for p in libpython] == [target / "python" / "lib"]
    assert unpack(archive, tmp_path / "node") == (target, False)  # a second rank of the node: nothing to do
    assert sorted(p.name for p in (tmp_path / "node").iterdir()) == [target.name]


def test_a_conda_style_environment_is_staged_whole(package, tmp_path):
    """An environment that is an interpreter install of its own (conda's: no pyvenv.cfg, its
    libraries found through $ORIGIN) is packed as one, with hpcrl in its site-packages."""
    env = tmp_path / "conda-env"
    (env / "bin").mkdir(parents=True)
    (env / "lib").mkdir()
    shutil.copy2(BASE / "bin" / STDLIB, env / "bin" / STDLIB)
    for lib in (BASE / "lib").glob("libpython3*"):
        shutil.copy2(lib, env / "lib" / lib.name, follow_symlinks=False)
    shutil.copytree(BASE / "lib" / STDLIB, env / "lib" / STDLIB, symlinks=True,
                    ignore=lambda d, names: [n for n in names if Path(d) == BASE / "lib" / STDLIB
                                             and (n in ("test", "site-packages") or n.startswith("config-"))])
    (env / "lib" / STDLIB / "site-packages").mkdir()
    for binary in [env / "bin" / STDLIB, *(env / "lib" / STDLIB / "lib-dynload").glob("*.so")]:
        relocatable = "$ORIGIN/../lib" if binary.parent.name == "bin" else "$ORIGIN/../.."  # as conda builds them
        binary.write_bytes(with_search_path(binary.read_bytes(), relocatable))
    made, _ = pack(env, package, tmp_path / "stage")
    assert not any(n.startswith("venv/") for n in tarfile.open(made).getnames())
    target, _ = unpack(made, tmp_path / "node")
    python = staged_python(target)
    assert python == target / "python" / "bin" / STDLIB
    module, prefix, base, libpython = eval(run_hidden(python, SHOW, [env, BASE, CHECKOUT, package.parent], tmp_path))
    assert Path(module) == target / f"python/lib/{STDLIB}/site-packages/hpcrl/__init__.py"
    assert Path(prefix) == Path(base) == target / "python"
    assert [Path(p).parent for p in libpython] == [target / "python" / "lib"]


def test_the_interpreters_library_path_is_read_and_rewritten_as_readelf_sees_it(tmp_path):
    binary = (BASE / "bin" / STDLIB).read_bytes()
    seen = subprocess.run(["readelf", "-d", str(BASE / "bin" / STDLIB)], capture_output=True, text=True).stdout
    runpath = search_path(binary)
    assert runpath is not None and f"[{runpath}]" in seen
    patched = tmp_path / "python"
    patched.write_bytes(with_search_path(binary, "$ORIGIN/../lib"))
    assert "Library runpath: [$ORIGIN/../lib]" in subprocess.run(["readelf", "-d", str(patched)], capture_output=True,
                                                                 text=True).stdout
    with pytest.raises(ValueError, match="longer than"):
        with_search_path(binary, "/" + "x" * len(runpath))
    assert search_path(b"#!/bin/sh\n") is None


def test_library_search_paths_into_the_packed_trees_become_relative_to_the_file(venv, package):
    """The interpreter and the standard library's modules name the install's lib/ relative to
    themselves; a module built with the interpreter (mpi4py's, hpcrl's kernels) leaves it out
    where the relative path would not fit (only libpython lies there, loaded already); a
    directory inside the venv (Horovod's torch/lib) becomes relative; others stay."""
    places = Places.of(environment(venv), package)
    lib, site = str(BASE.resolve() / "lib"), f"venv/lib/{STDLIB}/site-packages"
    assert places.relocated(lib, f"python/bin/{STDLIB}") == "$ORIGIN/../lib"
    assert places.relocated(lib, f"python/lib/{STDLIB}/lib-dynload/_ssl.so") == "$ORIGIN/../.."
    relative = "$ORIGIN/../../../../../python/lib"
    assert places.relocated(lib, f"{site}/mpi4py/MPI.so") == (relative if len(relative) <= len(lib) else "")
    torch_lib = f"/usr/lib/x86_64-linux-gnu/openmpi/lib:{venv.resolve()}/lib/{STDLIB}/site-packages/torch/lib"
    assert places.relocated(torch_lib, f"{site}/horovod/torch/mpi_lib.so") == \
        "/usr/lib/x86_64-linux-gnu/openmpi/lib:$ORIGIN/../../torch/lib"
    assert places.relocated("/opt/other/lib", f"{site}/x.so") == "/opt/other/lib"


def test_what_is_not_an_environment_to_stage_is_refused_with_one_message(tmp_path):
    with pytest.raises(StageError, match=r"^/usr: the system's Python lies on every node's own disk already; make "
                                         r"a venv from it \(python3 -m venv\) and stage that$"):
        environment(Path("/usr"))
    with pytest.raises(StageError, match=rf"^{tmp_path}: not a Python environment \(no lib/python3.\*/site-packages"):
        environment(tmp_path)


def test_a_read_only_node_directory_is_refused_with_one_message(archive, tmp_path):
    with tmpfs(tmp_path / "ro", "16m", "ro") as node:
        result = run_hpcrl("stage", "unpack", str(archive), "--to", str(node))
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"hpcrl: stage unpack: the node-local directory {node} is not writable; give a " \
                            f"writable one with --to\n"


def test_a_node_directory_without_room_is_refused_and_one_that_fills_up_keeps_no_partial_copy(archive, tmp_path):
    with tmpfs(tmp_path / "small", "4k") as node:  # the archive holds about 110 MB
        with pytest.raises(StageError, match=rf"no room in {node} for the staged environment: it needs "
                                             r"\d+\.\d\d GiB, 0\.00 GiB are free; free some, or give another"):
            unpack(archive, node)
        assert list(node.iterdir()) == []
    with tmpfs(tmp_path / "few_inodes", "512m", "nr_inodes=64") as node:  # room enough, but few files
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
