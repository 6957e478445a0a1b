"""`hpcrl stage`: the Python environment a job starts from, packed once into one archive and
unpacked once per node into node-local storage, so that its ranks import from there and spare
the shared file system's metadata server (docs/clusters.md, staging).

`pack` writes the virtual environment, with hpcrl's package copied into its site-packages in
place of the editable install that points back at the checkout, as one uncompressed tar named by
a key of its content (every file's path, size and modification time): packing again with
nothing changed finds the archive there and reuses it. `unpack` extracts it into
DIR/hpcrl-env-KEY on a node: a copy already complete there is reused, a new one is extracted
under a temporary name and renamed when whole, so no rank ever starts from half a copy and a
failure (no space, a directory that cannot be written) leaves nothing behind. The staged
interpreter is DIR/hpcrl-env-KEY/venv/bin/python: a venv finds its packages from where its
interpreter lies, and the base interpreter it links to must be at the same path on every node
(a system or module-provided Python, as for the venv itself).

Standard library only (and hpcrl's `say`): `hpcrl stage unpack` runs once per node before any
rank, and imports nothing from the environment it is about to stage.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tarfile
from pathlib import Path

from hpcrl.core.say import say

ARCHIVE_PREFIX = "hpcrl-env-"
COMPLETE = ".hpcrl-staged"  # written last into an unpacked copy: it is whole
EDITABLE_HOOKS = ("__editable__.hpcrl-", "__editable___hpcrl_")  # setuptools' editable install of hpcrl
ROOM_MARGIN = 1.05  # free space asked for beyond the archive's content (directories, block rounding)


class StageError(Exception):
    """A staging that cannot be done: one message saying what, where, and what would do."""


def site_packages(venv: Path) -> Path:
    """The venv's site-packages (lib/pythonX.Y/site-packages)."""
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise StageError(f"{venv}: not a virtual environment (no lib/python3.*/site-packages in it)")
    return found[0]


def _files(root: Path, skip) -> list[Path]:
    """Every file and link under `root` whose path relative to it `skip` does not refuse, in a
    fixed order."""
    out = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not skip(rel) and (path.is_symlink() or path.is_file()):
            out.append(path)
    return out


def _editable_hook(rel: Path) -> bool:
    return rel.name.startswith(EDITABLE_HOOKS)


def _manifest(venv: Path, package: Path) -> list[tuple[Path, str]]:
    """(file, its name in the archive) of every file of the venv, its editable hooks of hpcrl left
    out, and of hpcrl's package, placed in the venv's site-packages: one walk of the tree, which
    both the key and the archive read."""
    target_site = site_packages(venv).relative_to(venv)
    return ([(path, f"venv/{path.relative_to(venv)}") for path in _files(venv, _editable_hook)]
            + [(path, f"venv/{target_site}/hpcrl/{path.relative_to(package)}")
               for path in _files(package, lambda rel: False)])


def content_key(manifest: list[tuple[Path, str]]) -> str:
    """16 hex digits over every file of a `_manifest`: its name in the archive, size and
    modification time (a link: its target)."""
    digest = hashlib.sha256()
    for path, name in manifest:
        if path.is_symlink():
            digest.update(f"{name} -> {os.readlink(path)}\n".encode())
        else:
            st = path.stat()
            digest.update(f"{name} {st.st_size} {st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def pack(venv: Path, package: Path, out_dir: Path) -> tuple[Path, bool]:
    """(the archive, whether it was written now) of `venv` with `package` (hpcrl's package
    directory) as a regular package in its site-packages, in `out_dir`."""
    venv, package = venv.resolve(), package.resolve()
    if not (package / "__init__.py").is_file():
        raise StageError(f"{package}: not a Python package (no __init__.py)")
    manifest = _manifest(venv, package)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StageError(f"cannot create the archive directory {out_dir}: {exc.strerror}") from None
    archive = out_dir / f"{ARCHIVE_PREFIX}{content_key(manifest)}.tar"
    if archive.is_file():
        return archive, False
    partial = out_dir / f".{archive.name}.partial.{os.getpid()}"
    try:
        with tarfile.open(partial, "w") as tar:
            for path, name in manifest:
                tar.add(path, arcname=name, recursive=False)
        os.replace(partial, archive)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise StageError(f"cannot write the archive {archive}: {exc.strerror or exc}") from None
    return archive, True


def unpack(archive: Path, node_dir: Path) -> tuple[Path, bool]:
    """(the staged copy's directory, whether it was extracted now) of `archive` in `node_dir`."""
    name = archive.name
    if not (name.startswith(ARCHIVE_PREFIX) and name.endswith(".tar")) or not archive.is_file():
        raise StageError(f"{archive}: not an archive of hpcrl stage pack (expected a file named "
                         f"{ARCHIVE_PREFIX}KEY.tar)")
    target = node_dir / name[:-len(".tar")]
    if (target / COMPLETE).is_file():
        return target, False
    try:
        node_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StageError(f"cannot create the node-local directory {node_dir}: {exc.strerror}; give a writable "
                         f"one with --to") from None
    if not os.access(node_dir, os.W_OK | os.X_OK):
        raise StageError(f"the node-local directory {node_dir} is not writable; give a writable one with --to")
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            needed = int(sum(m.size for m in members) * ROOM_MARGIN)
            free = shutil.disk_usage(node_dir).free
            if free < needed:
                raise StageError(f"no room in {node_dir} for the staged environment: it needs {needed / 2**30:.2f} "
                                 f"GiB, {free / 2**30:.2f} GiB are free; free some, or give another directory "
                                 f"with --to")
            partial = node_dir / f".{target.name}.partial.{os.getpid()}"
            try:
                tar.extractall(partial, members=members, filter="tar")  # no name outside the copy
                (partial / COMPLETE).write_text(f"{name}\n")
                try:
                    os.rename(partial, target)
                except OSError:
                    if not (target / COMPLETE).is_file():  # (another process of this node was first: keep its copy)
                        raise
                    shutil.rmtree(partial, ignore_errors=True)
                    return target, False
            except BaseException:
                shutil.rmtree(partial, ignore_errors=True)  # never half a copy
                raise
    except tarfile.TarError as exc:
        raise StageError(f"{archive}: not a readable archive ({exc})") from None
    except OSError as exc:
        raise StageError(f"cannot unpack {archive} into {node_dir}: {exc.strerror or exc}") from None
    return target, True


def staged_python(target: Path) -> Path:
    return target / "venv" / "bin" / "python"


def main_pack(venv: str | None, out_dir: str) -> int:
    prefix = Path(venv) if venv else Path(sys.prefix)
    if venv is None and sys.prefix == sys.base_prefix:
        raise StageError("this Python is not a virtual environment; name one with --venv")
    import hpcrl
    archive, written = pack(prefix, Path(hpcrl.__file__).parent, Path(out_dir))
    say(f"{'wrote' if written else 'reusing'} {archive} ({archive.stat().st_size / 2**30:.2f} GiB)", stream=sys.stderr)
    print(archive)
    return 0


def main_unpack(archive: str, node_dir: str | None) -> int:
    where = Path(node_dir or os.environ.get("SLURM_TMPDIR") or "/tmp")
    target, extracted = unpack(Path(archive), where)
    say(f"{'unpacked' if extracted else 'reusing'} {target}", stream=sys.stderr)
    print(staged_python(target))
    return 0
