"""`hpcrl stage`: the Python environment a job starts from, packed once into one archive and
unpacked once per node into node-local storage, so that its ranks import from there and spare
the shared file system's metadata server (docs/clusters.md, staging).

What is packed: the interpreter's own install (`python/`: its binary, libpython and standard
library; the base of a venv, or a conda environment whole) and, for a venv, the venv (`venv/`),
with hpcrl's package copied into site-packages in place of the editable install that points back
at the checkout. The staged copy needs nothing of the original: the venv's `bin/python` links to
the staged interpreter, the interpreter and its extension modules find libpython through
`$ORIGIN` (tools/elf.py), and `unpack` points the venv's pyvenv.cfg at the staged base. An
interpreter of the node image (`/usr`, on every node's own disk) is not packed: the venv's link
keeps pointing at it.

The archive is one uncompressed tar named by a key of its content (every file's path, size and
modification time): packing again with nothing changed finds it there and reuses it. `unpack`
extracts it into DIR/hpcrl-env-KEY on a node: a copy already complete there is reused, a new one
is extracted under a temporary name and renamed when whole, so no rank ever starts from half a
copy and a failure (no space, a directory that cannot be written) leaves nothing behind.

Standard library only (and hpcrl's `say`): `hpcrl stage unpack` runs once per node before any
rank, and imports nothing from the environment it is about to stage.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import shutil
import sys
import tarfile
from pathlib import Path

from hpcrl.core.say import say
from hpcrl.tools.elf import search_path_at, with_search_path

ARCHIVE_PREFIX = "hpcrl-env-"
COMPLETE = ".hpcrl-staged"  # written last into an unpacked copy: it is whole
EDITABLE_HOOKS = ("__editable__.hpcrl-", "__editable___hpcrl_")  # setuptools' editable install of hpcrl
ROOM_MARGIN = 1.05  # free space asked for beyond the archive's content (directories, block rounding)
NODE_IMAGE = Path("/usr")  # the distribution's own Python: on every node's local disk, never packed


class StageError(Exception):
    """A staging that cannot be done: one message saying what, where, and what would do."""


@dataclasses.dataclass(frozen=True)
class Environment:
    """A Python environment to pack: `prefix` (sys.prefix: a venv, or a conda environment) and
    the interpreter install it runs on (`base`, the prefix itself for a conda environment)."""
    prefix: Path
    base: Path
    name: str  # "python3.11": the interpreter in bin/, and the standard library's directory in lib/
    venv: bool
    system_site: bool  # a venv that also sees the base's site-packages

    @property
    def site(self) -> Path:
        """site-packages, relative to the prefix (and to the base)."""
        return Path("lib") / self.name / "site-packages"

    @property
    def package_dir(self) -> str:
        """Where hpcrl's package goes in the archive: the venv's site-packages, else the install's."""
        return f"{'venv' if self.venv else 'python'}/{self.site}/hpcrl"

    @property
    def stage_base(self) -> bool:
        return not (self.base == NODE_IMAGE or self.base.is_relative_to(NODE_IMAGE))


def _venv_config(prefix: Path) -> dict[str, str]:
    config = {}
    for line in (prefix / "pyvenv.cfg").read_text().splitlines():
        key, equals, value = line.partition("=")
        if equals:
            config[key.strip().lower()] = value.strip()
    return config


def environment(prefix: Path) -> Environment:
    """What `prefix` is: a venv (pyvenv.cfg, whose `home` names its interpreter) or a whole
    interpreter install such as a conda environment. StageError: neither, or the node image's."""
    prefix = prefix.absolute()
    if prefix == NODE_IMAGE or prefix.is_relative_to(NODE_IMAGE):
        raise StageError(f"{prefix}: the system's Python lies on every node's own disk already; make a venv "
                         f"from it (python3 -m venv) and stage that")
    found = sorted(prefix.glob("lib/python3*/site-packages"))
    if not found:
        raise StageError(f"{prefix}: not a Python environment (no lib/python3.*/site-packages in it); name a "
                         f"virtual environment or a conda environment")
    stdlib = found[0].parent.name
    if not (prefix / "pyvenv.cfg").is_file():
        if not (prefix / "bin" / stdlib).is_file():
            raise StageError(f"{prefix}: no interpreter bin/{stdlib} in it; name a virtual environment or a conda "
                             f"environment")
        return Environment(prefix, prefix, stdlib, venv=False, system_site=True)
    config = _venv_config(prefix)
    home = Path(config.get("home", ""))
    # the base install holds lib/pythonX.Y/os.py at or above the interpreter's directory (getpath's search)
    base = next((d for d in (home, *home.parents) if (d / "lib" / stdlib / "os.py").is_file()), None)
    if not home.is_absolute() or base is None or not (home / stdlib).exists():
        raise StageError(f"{prefix}/pyvenv.cfg: its interpreter (home = {config.get('home', '')}) has no "
                         f"{stdlib} with its standard library; recreate the venv from an installed Python")
    return Environment(prefix, base.resolve(), stdlib, venv=True,
                       system_site=config.get("include-system-site-packages", "false").lower() == "true")


def _files(root: Path, skip) -> list[Path]:
    """Every file and link under `root` whose path relative to it `skip` does not refuse, in a
    fixed order; a refused directory is not entered, a link to a directory is kept as a link."""
    out = []
    for directory, dirs, files in os.walk(root):
        here = Path(directory)
        kept = [name for name in dirs if not skip((here / name).relative_to(root))]
        out += [here / name for name in kept if (here / name).is_symlink()]
        dirs[:] = [name for name in kept if not (here / name).is_symlink()]
        out += [here / name for name in files if not skip((here / name).relative_to(root))]
    return sorted(out)


def _ours(in_site: Path) -> bool:
    """hpcrl's package or editable-install hooks, at `in_site` in a site-packages: left out, the
    package is copied in from where it is imported (`pack`)."""
    return bool(in_site.parts) and (in_site.parts[0] == "hpcrl" or in_site.name.startswith(EDITABLE_HOOKS))


@dataclasses.dataclass(frozen=True)
class Entry:
    """One file of the archive: `source`, named `name` there; written as a link to `link` instead."""
    source: Path
    name: str
    link: str | None = None


def _base_entries(env: Environment) -> list[Entry]:
    """The interpreter install: its binary and lib/ (libpython, the standard library, and for a
    conda environment its libraries and site-packages), under python/."""
    site = env.site

    def skip(rel: Path) -> bool:
        if rel.parts[:2] == ("lib", env.name) and len(rel.parts) == 3:
            # what a running job never reads: the test suite (123 MB here), and the static library
            # and makefiles for building against Python
            if rel.name == "test" or rel.name.startswith("config-"):
                return True
            if rel == site and not env.system_site:
                return True
        return rel.is_relative_to(site) and _ours(rel.relative_to(site))

    entries = [Entry(env.base / "bin" / env.name, f"python/bin/{env.name}")]
    return entries + [Entry(path, f"python/{path.relative_to(env.base)}")
                      for path in _files(env.base / "lib", lambda rel: skip("lib" / rel))]


def _venv_entries(env: Environment) -> list[Entry]:
    """The venv, under venv/; with the base staged, its interpreter names link to the staged one."""
    site = env.site
    entries = []
    for path in _files(env.prefix, lambda rel: rel.is_relative_to(site) and _ours(rel.relative_to(site))):
        rel = path.relative_to(env.prefix)
        interpreter = rel.parent == Path("bin") and rel.name in ("python", "python3", env.name)
        link = f"../../python/bin/{env.name}" if interpreter and env.stage_base else None
        entries.append(Entry(path, f"venv/{rel}", link))
    return entries


def _manifest(env: Environment, package: Path) -> list[Entry]:
    """Every file of the archive: one walk of the trees, which both the key and the archive read."""
    entries = (_base_entries(env) if env.stage_base else []) + (_venv_entries(env) if env.venv else [])
    return entries + [Entry(path, f"{env.package_dir}/{path.relative_to(package)}")
                      for path in _files(package, lambda rel: False)]


def content_key(manifest: list[Entry]) -> str:
    """16 hex digits over every file of a `_manifest`: its name in the archive, size and
    modification time (a link: its target)."""
    digest = hashlib.sha256()
    for entry in manifest:
        if entry.link is not None or entry.source.is_symlink():
            digest.update(f"{entry.name} -> {entry.link or os.readlink(entry.source)}\n".encode())
        else:
            st = entry.source.stat()
            digest.update(f"{entry.name} {st.st_size} {st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class Places:
    """Where the packed trees lie, and where in the archive: an ELF file's library search path
    names directories by their absolute paths, which `relocated` translates."""
    trees: tuple[tuple[Path, str], ...]  # (a packed tree, its place in the archive), the deepest first
    base_lib: Path | None  # the staged interpreter install's lib/
    interpreter: str  # the staged interpreter's name in the archive

    @classmethod
    def of(cls, env: Environment, package: Path) -> "Places":
        trees = [(package, env.package_dir)] + ([(env.prefix.resolve(), "venv")] if env.venv else []) \
            + ([(env.base, "python")] if env.stage_base else [])
        return cls(tuple(sorted(trees, key=lambda tree: -len(tree[0].parts))),
                   env.base / "lib" if env.stage_base else None, f"python/bin/{env.name}")

    def relocated(self, search_path: str, name: str) -> str:
        """`search_path` of the file named `name` in the archive, each directory inside a packed
        tree made relative to the file ($ORIGIN/...). pyenv's and modules' Pythons name their
        lib/ by its absolute path, in the interpreter, its extension modules and the modules
        built with it (mpi4py, hpcrl's kernels), which would load libpython and look for every
        other library on the shared file system. Where that does not fit in the file, a
        directory naming the install's lib/ is left out, but in the interpreter: all that lies
        there is libpython, which the interpreter has loaded already. Else it stays as it was."""
        parts = []  # (the new directory, whether it names the install's lib/)
        for part in search_path.split(":"):
            real = Path(os.path.realpath(part)) if part.startswith("/") else None
            tree = next(((src, at) for src, at in self.trees if real is not None and real.is_relative_to(src)), None)
            if tree is not None:
                relative = os.path.relpath(os.path.normpath(f"{tree[1]}/{real.relative_to(tree[0])}"),
                                           os.path.dirname(name))
                part = "$ORIGIN" if relative == "." else f"$ORIGIN/{relative}"
            parts.append((part, real is not None and real == self.base_lib))
        fits = len(search_path.encode())
        for candidate in (parts, [] if name == self.interpreter else [p for p in parts if not p[1]]):
            joined = ":".join(part for part, _ in candidate)
            if len(joined.encode()) <= fits:
                return joined
        return search_path


def _add(tar: tarfile.TarFile, entry: Entry, places: Places) -> None:
    info = tar.gettarinfo(entry.source, arcname=entry.name)
    if entry.link is not None:
        info.type, info.linkname, info.size = tarfile.SYMTYPE, entry.link, 0
        tar.addfile(info)
        return
    if info.isreg() and (entry.name == places.interpreter or entry.name.endswith(".so") or ".so." in entry.name):
        with open(entry.source, "rb") as f:
            at = search_path_at(f)  # (its headers only)
            new = at and places.relocated(at[1], entry.name)
            if at and new != at[1]:
                f.seek(0)
                image = with_search_path(f.read(), new)
                info.size = len(image)
                tar.addfile(info, io.BytesIO(image))
                return
    tar.add(entry.source, arcname=entry.name, recursive=False)


def pack(prefix: Path, package: Path, out_dir: Path) -> tuple[Path, bool]:
    """(the archive, whether it was written now) of the environment at `prefix` (a venv or a
    conda environment) with `package` (hpcrl's package directory) as a regular package in its
    site-packages, in `out_dir`."""
    env, package = environment(prefix), package.resolve()
    if not (package / "__init__.py").is_file():
        raise StageError(f"{package}: not a Python package (no __init__.py)")
    manifest, places = _manifest(env, package), Places.of(env, package)
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
            for entry in manifest:
                _add(tar, entry, places)
        os.replace(partial, archive)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise StageError(f"cannot write the archive {archive}: {exc.strerror or exc}") from None
    return archive, True


def _point_venv_at_staged_base(copy: Path, target: Path) -> None:
    """A venv finds its base install through pyvenv.cfg's absolute `home`: in the copy at `copy`,
    to be renamed `target`, make it the staged base's, when the archive holds one."""
    config = copy / "venv" / "pyvenv.cfg"
    binaries = sorted((copy / "python" / "bin").glob("python3*"))
    if not config.is_file() or not binaries:
        return
    lines = []
    for line in config.read_text().splitlines():
        key = line.partition("=")[0].strip().lower()
        if key == "home":
            line = f"home = {target}/python/bin"
        elif key == "executable":
            line = f"executable = {target}/python/bin/{binaries[0].name}"
        elif key == "command":
            continue  # how the original was made: not true of the copy
        lines.append(line)
    config.write_text("\n".join(lines) + "\n")


def unpack(archive: Path, node_dir: Path) -> tuple[Path, bool]:
    """(the staged copy's directory, whether it was extracted now) of `archive` in `node_dir`."""
    name = archive.name
    if not (name.startswith(ARCHIVE_PREFIX) and name.endswith(".tar")) or not archive.is_file():
        raise StageError(f"{archive}: not an archive of hpcrl stage pack (expected a file named "
                         f"{ARCHIVE_PREFIX}KEY.tar)")
    node_dir = node_dir.absolute()
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
                _point_venv_at_staged_base(partial, target)
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
    """The interpreter to start ranks with from the staged copy `target`: the venv's, else (a
    conda environment) the staged install's own."""
    if (target / "venv").is_dir():
        return target / "venv" / "bin" / "python"
    return sorted((target / "python" / "bin").glob("python3*"))[0]


def main_pack(prefix: str | None, out_dir: str) -> int:
    import hpcrl
    archive, written = pack(Path(prefix or sys.prefix), Path(hpcrl.__file__).parent, Path(out_dir))
    say(f"{'wrote' if written else 'reusing'} {archive} ({archive.stat().st_size / 2**30:.2f} GiB)", stream=sys.stderr)
    print(archive)
    return 0


def main_unpack(archive: str, node_dir: str | None) -> int:
    where = Path(node_dir or os.environ.get("SLURM_TMPDIR") or "/tmp")
    target, extracted = unpack(Path(archive), where)
    say(f"{'unpacked' if extracted else 'reusing'} {target}", stream=sys.stderr)
    print(staged_python(target))
    return 0
