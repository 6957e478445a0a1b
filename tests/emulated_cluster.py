"""The emulated cluster of scripts/cluster.sh, driven from tests: nodes as network namespaces with
a host name each and TCP between them, faults injected by the script's own verbs."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "cluster.sh"


class Cluster:
    def __init__(self, name: str, nodes: int, slots: int = 4, slurm: bool = False):
        self.name, self.nodes, self.slots, self.slurm = name, nodes, slots, slurm
        self.env = dict(os.environ, HPCRL_CLUSTER=name, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")

    def sh(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(["bash", str(SCRIPT), *args], env=self.env, capture_output=True, text=True,
                                timeout=120)
        if check:
            assert result.returncode == 0, f"cluster.sh {' '.join(args)}: {result.stdout}{result.stderr}"
        return result

    def up(self) -> "Cluster":
        """Up, or back to healthy if it is: every link up, every node thawed and at full speed (and
        with `slurm`, SLURM's daemons running on every node)."""
        self.sh("up", str(self.nodes), "--slots", str(self.slots), *(["--slurm"] if self.slurm else []))
        return self

    def slurm_cmd(self, *args: str, **kw) -> subprocess.CompletedProcess:
        """A SLURM command (sbatch, scontrol, ...) against the cluster's SLURM, from this machine."""
        return subprocess.run(["bash", str(SCRIPT), "slurm", *args], env=dict(self.env, **kw.pop("env", {})),
                              capture_output=True, text=True, timeout=120, **kw)

    def down(self) -> None:
        self.sh("down", check=False)

    def start(self, n: int, *hpcrl_args: str, hosts: str | None = None, extra_env: dict | None = None,
              command: list[str] | None = None) -> subprocess.Popen:
        """`cluster.sh run -n N python -m hpcrl ARGS` (from node n0), in the background; `command`
        instead of `python -m hpcrl` runs another program on every rank."""
        where = ["--host", hosts] if hosts else []
        exported = [a for key in (extra_env or {}) for a in ("-x", key)]  # mpirun passes them to every rank
        program = command or [sys.executable, "-m", "hpcrl"]
        return subprocess.Popen(["bash", str(SCRIPT), "run", "-n", str(n), *where, *exported, *program, *hpcrl_args],
                                env=dict(self.env, **(extra_env or {})), cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def run(self, n: int, *hpcrl_args: str, timeout: float = 300, **kw) -> tuple[int, str]:
        proc = self.start(n, *hpcrl_args, **kw)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            raise AssertionError(f"the job did not end in {timeout} s:\n{out}")
        return proc.returncode, out

    def local_dir(self, node: str) -> Path:
        """The node's own storage, which its commands see at /mnt (scripts/cluster.sh)."""
        return Path("/var/tmp/hpcrl-cluster") / self.name / node

    def pids(self, node: str) -> list[int]:
        return [int(p) for p in self.sh("pids", node).stdout.split()]

    def processes(self) -> dict[str, list[str]]:
        """What still runs on each node: {node: [command lines]} (empty lists when all is gone),
        SLURM's own daemon aside."""
        out = {}
        for node in (f"n{i}" for i in range(self.nodes)):
            out[node] = []
            for pid in self.pids(node):
                try:
                    line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
                except OSError:
                    continue  # gone meanwhile
                if not line.startswith("slurmd "):
                    out[node].append(line)
        return out

    def wait_empty(self, node: str, timeout: float) -> float:
        """Seconds until no process is left on `node`; fails after `timeout`."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if not self.pids(node):
                return time.monotonic() - start
            time.sleep(0.5)
        raise AssertionError(f"processes left on {node} after {timeout} s: {self.processes()[node]}")

    def fault(self, verb: str, node: str, *args: str) -> float:
        """kill, cut, heal, slow F, stop, cont; returns when it was done (time.monotonic())."""
        self.sh(verb, node, *args)
        return time.monotonic()
