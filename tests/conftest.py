"""Shared helpers: real mpirun jobs of hpcrl, and small configs written to a temp dir."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from hpcrl.core.dataflow import ALGORITHMS

REPO = Path(__file__).resolve().parents[1]
MPIRUN = REPO / "scripts" / "mpirun.sh"


def small_config(tmp_path: Path, name: str = "t", **sections) -> dict:
    """A fast CartPole config; `sections` update it, e.g. roles={...}, run={...}."""
    cfg = {
        "run": {"name": name, "output_dir": str(tmp_path / "runs"), "seed": 3, "total_frames": 2048,
                "log_interval_s": 0.5},
        "roles": {"learner": {"ranks": 1}, "inference": {"ranks": 1}, "env": {"ranks": "rest"}},
        "env": {"id": "CartPole-v1", "num_envs": 4},
        "algo": {"rollout_length": 16, "epochs": 2, "num_minibatches": 2, "lr": 0.001},
        "model": {"hidden_sizes": [32, 32]},
    }
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    if not ALGORITHMS[cfg["algo"].get("name", "ppo")].reads("on_policy"):  # PPO's keys: refused elsewhere
        for key in ("epochs", "num_minibatches"):
            if key not in sections.get("algo", {}):
                del cfg["algo"][key]
    return cfg


def write_config(tmp_path: Path, cfg: dict, filename: str = "config.yaml") -> Path:
    path = tmp_path / filename
    path.write_text(yaml.safe_dump(cfg))
    return path


def mpirun(n: int, *args: str, timeout: float = 240, cwd: Path | None = None,
           extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """`mpirun -n N python -m hpcrl ARGS` through the project's wrapper, as a user runs it."""
    _refuse_in_fast_tier()
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", **(extra_env or {}))
    cmd = ["bash", str(MPIRUN), "-n", str(n), sys.executable, "-m", "hpcrl", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd or REPO, env=env)


def run_hpcrl(*args: str, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m hpcrl ARGS` in one process, without mpirun (plan, sbatch, inspect, eval, tune), in
    the repository's root unless `cwd` says otherwise."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "hpcrl", *args], capture_output=True, text=True, cwd=cwd or REPO,
                          env=env, timeout=timeout)


def mpirun_script(n: int, script: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """`mpirun -n N python tests/SCRIPT ARGS`: a script (tests/mpi_*.py) that drives one piece of the
    runtime under real MPI."""
    _refuse_in_fast_tier()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = ["bash", str(MPIRUN), "-n", str(n), sys.executable, str(REPO / "tests" / script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def job_pids(fragment: str, rank: int | None = None) -> list[int]:
    """PIDs of processes whose command line names `fragment` (a test's own config file or temp
    directory) and, with `rank`, that Open MPI started as that rank. Matching the test's own path
    keeps other jobs on the machine (a concurrent test session, a leftover) out."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes().split(b"\0") if rank is not None else []
        except OSError:
            continue
        if fragment.encode() in cmdline and (rank is None or f"OMPI_COMM_WORLD_RANK={rank}".encode() in environ):
            pids.append(int(entry.name))
    return pids


@pytest.fixture(autouse=True)
def no_job_outlives_its_test(tmp_path):
    """A test that fails while its run is going (most start runs of 10**7 frames and stop them)
    must not leave the job training on: end whatever still runs from its temp directory."""
    yield
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = job_pids(str(tmp_path))
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if pids:
            time.sleep(1.0)


def pids_named(name: str) -> list[int]:
    """PIDs of the processes whose command name is `name` (as pgrep -x finds them)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == name:
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


@pytest.fixture(scope="session")
def munged_as_found():
    """The SLURM tests start munged (scripts/slurm.sh prepare), which the daemons of every emulated
    node share, so no test's teardown stops it: the session does, if it was not running before.
    Only the SLURM modules use it: under pytest-xdist (make test-fast) a worker that ran none never
    stops it under one that runs them."""
    running_before = bool(pids_named("munged"))
    yield
    if running_before:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids_named("munged"):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while pids_named("munged") and time.monotonic() < deadline:
            time.sleep(0.1)


def run_dir(cfg: dict) -> Path:
    return Path(cfg["run"]["output_dir"]) / cfg["run"]["name"]


@pytest.fixture
def tmp_cfg(tmp_path):
    return lambda **sections: small_config(tmp_path, **sections)


# --- tiers: `make test-fast` runs the tests that launch no MPI job, on no emulated node, that train
# no agent to a return (-m "not mpi and not multinode and not slurm and not learning") -------------

# what starts an MPI job: mpirun, the emulated cluster's nodes (which run mpirun in turn), and a
# process the test holds while it runs (a job it signals or kills)
LAUNCHERS = frozenset({"mpirun", "mpirun_script", "MPIRUN", "Cluster", "Popen"})


def _launches(fn, seen: set) -> bool:
    """Whether `fn` names a launcher, itself or through the test helpers it calls (followed through
    the globals of their modules, and the functions and lambdas defined inside them)."""
    code = getattr(fn, "__code__", None)
    if code is None or code in seen:
        return False
    seen.add(code)
    codes, names = [code], set()
    while codes:
        c = codes.pop()
        names.update(c.co_names)
        codes += [k for k in c.co_consts if hasattr(k, "co_names")]
    if names & LAUNCHERS:
        return True
    scope = getattr(fn, "__globals__", {})
    return any(_launches(scope[name], seen) for name in names
               if name in scope and getattr(scope[name], "__module__", "").startswith("tests."))


FAST_TIER = {"on": False}  # a session that deselects `mpi` (make test-fast)


def pytest_configure(config):
    FAST_TIER["on"] = "not mpi" in (config.option.markexpr or "")


def _refuse_in_fast_tier() -> None:
    """A launch in the fast tier means the `mpi` marking below missed a test: say so, loudly."""
    if FAST_TIER["on"]:
        raise AssertionError("this test launches mpirun but was not marked `mpi`: tests/conftest.py's LAUNCHERS "
                             "misses the helper it calls")


def pytest_collection_modifyitems(config, items):
    """Mark `mpi` every test that launches an MPI job, through its own code or its fixtures'."""
    for item in items:
        functions = [getattr(item, "function", None)]
        for name in getattr(item, "fixturenames", ()):
            defs = item._fixtureinfo.name2fixturedefs.get(name) or ()
            functions += [d.func for d in defs]
        seen: set = set()
        if any(_launches(fn, seen) for fn in functions if fn is not None):
            item.add_marker(pytest.mark.mpi)


@contextlib.contextmanager
def tmpfs(path: Path, size: str, options: str = ""):
    """A tmpfs of `size` at `path` (`options`: more of mount's, e.g. 'ro' or 'nr_inodes=8'): a file
    system that really fills up or refuses writes (the tests run as root); unmounted however the
    test ends."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(filter(None, [f"size={size}", options])), "tmpfs",
                              str(path)], capture_output=True, text=True)
    assert mounted.returncode == 0, f"mounting a tmpfs needs root: {mounted.stderr}"
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)
