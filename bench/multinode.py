"""Multi-node over TCP, on the emulated cluster of scripts/cluster.sh (root), as JSON:
- frames/s of the same 8-rank job on 1 node x 8 ranks, 2 x 4 and 4 x 2, relative to the 1-node
  run of the same layout in the same session. All nodes share this machine's cores, so the ratio
  is what TCP between nodes costs against shared memory inside one, not more hardware. Two layouts:
  `cartpole_ppo` as shipped (one policy server: the env ranks off its node send every step's
  observations over TCP), and the same with inline inference (only records and weights cross);
  with each run's bytes per frame that crossed nodes, per stream (as the run counted them on the
  wire: metrics.h5's crossed_nodes attributes);
- the streams between two nodes: `bench/comm.py` (the inference stream's round trip and the sample
  stream's bandwidth against raw mpi4py on the same bytes) run with one rank on n0 and one on n1,
  so every message crosses TCP;
- what a lost node costs: seconds from a node killed, or cut off from the network, to the end of
  the job on every node (the reachable ones and the lost one), with the default run.peer_timeout_s.

    .venv/bin/python bench/multinode.py [--out FILE] [--seconds S]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from report import emit, run_rate  # noqa: E402

from hpcrl.io.metrics import read_crossed_nodes, read_metrics  # noqa: E402
from tests.emulated_cluster import SCRIPT, Cluster  # noqa: E402

SHAPES = {"1x8": "n0:8", "2x4": "n0:4,n1:4", "4x2": "n0:2,n1:2,n2:2,n3:2"}
LAYOUTS = {"shipped (1 policy server)": [], "inline inference": ["roles.inference.ranks=0"]}


def rates(cluster: Cluster, seconds: float, out_dir: str) -> list[dict]:
    results = []
    for layout, overrides in LAYOUTS.items():
        base = None
        for shape, hosts in SHAPES.items():
            launcher = ["env", f"HPCRL_CLUSTER={cluster.name}", "bash", str(SCRIPT), "run", "-n", "8", "--host", hosts]
            name = f"mn{len(results)}"
            rate = run_rate("jobs/cartpole_ppo.yaml", 8, seconds, out_dir, name, overrides, launcher)
            base = base or rate["frames_per_s"]
            results.append({"layout": layout, "nodes_x_ranks": shape, "frames_per_s": round(rate["frames_per_s"]),
                            "relative_to_1_node": round(rate["frames_per_s"] / base, 2),
                            "crossing_bytes_per_frame": crossing_per_frame(os.path.join(out_dir, name, "metrics.h5"))})
            print(results[-1], file=sys.stderr, flush=True)
    return results


def crossing_per_frame(metrics: str) -> dict:
    """Bytes per trained frame that crossed nodes, per stream that carried any."""
    frames = int(read_metrics(metrics)["frames"][-1])
    return {stream: round(nbytes / frames, 2) for stream, (_, nbytes) in read_crossed_nodes(metrics).items() if nbytes}


def streams_over_tcp(cluster: Cluster) -> list[dict]:
    """bench/comm.py with its two ranks on two nodes."""
    status, out = cluster.run(2, timeout=600, hosts="n0:1,n1:1", command=[sys.executable, str(REPO / "bench/comm.py")])
    if status != 0:
        raise RuntimeError(out)
    return json.loads(out[out.index("{"):])["results"]


def fault_cost(cluster: Cluster, fault: str, out_dir: str) -> dict:
    """Seconds from the fault on n1 to the job's end on n0 (the launcher returns) and on n1, for
    a job of 2 nodes x 4 ranks with a learner and a policy server on each."""
    cluster.up()
    proc = cluster.start(8, "run", "jobs/cartpole_ppo_multinode.yaml", "--set", "roles.inference.per_node=1",
                         "--set", f"run.output_dir={out_dir}", "--set", f"run.name=fault_{fault}",
                         "--set", "run.target_return=null", "--set", "run.total_frames=100000000",
                         hosts=SHAPES["2x4"])
    metrics = Path(out_dir) / f"fault_{fault}" / "metrics.h5"
    while not metrics.exists():  # training has begun
        if proc.poll() is not None:
            raise RuntimeError(proc.communicate()[0])
        time.sleep(0.5)
    time.sleep(5)
    at = cluster.fault(fault, "n1")
    proc.communicate(timeout=300)
    launcher_s = time.monotonic() - at
    lost_node_s = launcher_s + cluster.wait_empty("n1", 300)
    cluster.wait_empty("n0", 60)
    return {"fault": fault, "job_ended_on_reachable_node_s": round(launcher_s, 1),
            "lost_node_empty_s": round(lost_node_s, 1), "launcher_status": proc.returncode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per run")
    args = parser.parse_args()
    cluster = Cluster(f"bench{os.getpid()}", nodes=4, slots=8).up()
    try:
        with tempfile.TemporaryDirectory() as out_dir:
            streams = streams_over_tcp(cluster)
            results = rates(cluster, args.seconds, out_dir)
            faults = [fault_cost(cluster, fault, out_dir) for fault in ("kill", "cut")]
    finally:
        cluster.down()
    emit({"benchmark": "multinode: the same 8-rank job on 1, 2 and 4 emulated nodes over TCP, and the cost of a "
                       "lost node (scripts/cluster.sh on one machine)", "results": results, "streams_over_tcp": streams, "faults": faults},
         args.out)


if __name__ == "__main__":
    main()
