"""Multi-node for real: jobs across the emulated cluster of scripts/cluster.sh (network namespaces,
a host name each, TCP between them, shared memory only inside a node), and the faults of a real
cluster: a node that dies, one cut off from the network, one that stops for a while (sync PPO
waits for it, APPO trains on with the other node). A lost peer is noticed within
run.peer_timeout_s: the cuts and the APPO stop set PEER_TIMEOUT_S (10 s, as a cluster that wants a
lost node noticed sooner sets it; the default's 30 s runs through the same code and would cost
each test 20 s more), their bounds and the stop scaled from it. After a dead node and after every
cut (while sampling, averaging or checkpointing) the run resumes on the node left. Each run's
cross-node counts are checked against `hpcrl plan`'s prediction."""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import hpcrl
from hpcrl.io.checkpoint import inspect_latest, load_checkpoint
from hpcrl.io.metrics import read_crossed_nodes, read_metrics
from tests.conftest import mpirun, run_dir, run_hpcrl, small_config, write_config
from tests.test_reproducible import assert_same_weights
from tests.emulated_cluster import Cluster

pytestmark = pytest.mark.multinode
WAITS = pytest.mark.waits  # a fault, and a bound in seconds on what follows it (the others run beside other tests)

JOB = "jobs/cartpole_ppo_multinode.yaml"  # a learner and an inference rank per node: Horovod over TCP
RANKS, PER_NODE = 8, 4
PEER_TIMEOUT_S = 10  # the other such jobs': what a cluster that wants a lost node noticed sooner sets (beats go
# every second), so that the suite waits out 10 s instead of 30 s per fault


def ends_after_cut_s(peer_timeout_s: float) -> float:
    """The job ends on the reachable node within this of a cut: the peer timeout, END_GRACE_S and
    mpirun's abort under load."""
    return peer_timeout_s + 30


def cut_node_ends_s(peer_timeout_s: float) -> float:
    """And the cut-off node's own ranks (and its launcher daemon) within this of the cut."""
    return peer_timeout_s + 60


ENDS_AFTER_KILL_S = 30  # (mpirun notices a killed node's daemon itself, in about 2 s: no peer timeout here)


@pytest.fixture(scope="module")
def cluster():
    emulated = Cluster(f"pt{os.getpid()}", nodes=2, slots=PER_NODE)  # a name of this run's own
    try:
        yield emulated.up()
    finally:
        emulated.down()


@pytest.fixture
def healthy(cluster):
    """The cluster as new, whatever the last test did to it; nothing of a test's job left after it."""
    yield cluster.up()
    leftovers = cluster.processes()
    cluster.up()
    for node in leftovers:
        cluster.sh("kill", node)
    assert not any(leftovers.values()), leftovers


def job(tmp_path, *settings: str) -> tuple[str, ...]:
    sets = ("run.output_dir=" + str(tmp_path / "runs"), "roles.inference.per_node=1", *settings)
    return ("run", JOB, *(a for s in sets for a in ("--set", s)))


def run_path(tmp_path) -> str:
    return str(tmp_path / "runs" / "cartpole_ppo_multinode")


FAMILIES = {  # small configs of each algorithm family (the suite's own, as in their single-node tests)
    "appo": {"algo": {"mode": "async"}},
    "apex_dqn": {"algo": {"name": "dqn", "rollout_length": 8, "lr": 0.001,
                          "dqn": {"batch_size": 32, "target_update_interval": 10},
                          "replay": {"capacity": 20_000, "warmup": 256, "replay_ratio": None}}},
    "mappo": {"env": {"id": "tests.ma_envs:Relay", "num_envs": 4}, "algo": {"name": "mappo", "rollout_length": 6}},
    "recurrent_ppo": {"env": {"id": "hpcrl/CartPolePositions-v1"}, "model": {"core": "lstm", "core_size": 8}},
    "sync_td3": {"env": {"id": "Pendulum-v1", "num_envs": 2},
                 "algo": {"name": "td3", "mode": "sync", "rollout_length": 8,
                          "sac": {"batch_size": 32, "learning_starts": 64},
                          "replay": {"capacity": 4096, "warmup": 64, "replay_ratio": 4}}},
}


SYNC_FAMILIES = ("mappo", "recurrent_ppo", "sync_td3")  # repeatable: a function of config, seed and learners


@pytest.mark.parametrize("family", FAMILIES)
def test_every_algorithm_family_trains_with_its_actors_on_another_node(healthy, tmp_path, family):
    """Learner and policy server on n0, both env ranks on n1: every request, reply, record and
    weights version crosses TCP. A sync family's run trains the same weights bit for bit as the
    same layout on one node."""
    cfg = small_config(tmp_path, **FAMILIES[family])
    cfg["run"].update(total_frames={"mappo": 1536, "sync_td3": 832}.get(family, 2048),
                      deterministic=family in SYNC_FAMILIES)
    status, out = healthy.run(4, "run", str(write_config(tmp_path, cfg)), hosts="n0:2,n1:2")
    assert status == 0, out
    assert "[hpcrl] 4 ranks on 2 nodes" in out and "nodes: n0 ranks 0-1; n1 ranks 2-3" in out
    metrics = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    assert metrics["frames"][-1] >= cfg["run"]["total_frames"]
    assert metrics["policy_version"].tolist() == list(range(1, len(metrics["policy_version"]) + 1))
    assert metrics["episodes"].sum() > 0
    predicted = predicted_crossing(str(write_config(tmp_path, cfg)), 4, 2)
    assert predicted[2:] == (2, 2)  # both env ranks' requests and fragments cross; no weights copy does
    check_crossed_nodes(str(run_dir(cfg) / "metrics.h5"), predicted, exact_versions=False)
    if family in SYNC_FAMILIES:
        one_node = dict(cfg, run={**cfg["run"], "name": "one_node"})
        done = mpirun(4, "run", str(write_config(tmp_path, one_node, "one_node.yaml")))
        assert done.returncode == 0, done.stdout + done.stderr
        assert_same_weights(*(load_checkpoint(str(run_dir(c) / "checkpoint.h5")) for c in (cfg, one_node)))


def predicted_crossing(config: str, world: int, per_node: int, *sets: str) -> tuple[int, int, int, int]:
    """`hpcrl plan`'s crossing nodes: (weights copies per version, bytes of one, env ranks whose
    policy server is on another node, env ranks whose learner is)."""
    plan = run_hpcrl("plan", config, "--world-size", str(world), "--ranks-per-node", str(per_node),
                     *(a for s in sets for a in ("--set", s)))
    found = re.search(r"crossing nodes: (\d+) cop\w+ of each weights version \(([\d,]+) bytes.*\n.*requests and "
                      r"replies of ([\d,]+) of [\d,]+ env ranks .*, fragments of ([\d,]+)", plan.stdout)
    assert found, plan.stdout + plan.stderr
    return tuple(int(g.replace(",", "")) for g in found.groups())


def check_crossed_nodes(metrics_path: str, predicted: tuple[int, int, int, int], exact_versions: bool) -> None:
    """The run's measured cross-node counts against the plan's prediction: a stream crosses only
    where the plan says so, every request and reply of a remote env rank crosses, and each weights
    version crosses once to each node but the root's (in sync mode exactly: no version is skipped)."""
    copies, size, remote_inference, remote_learner = predicted
    crossed = read_crossed_nodes(metrics_path)
    assert set(crossed) == {"requests", "replies", "records", "credits", "weights", "control"}, crossed
    if remote_inference:
        assert crossed["requests"][0] == crossed["replies"][0] > 0, crossed
    else:
        assert crossed["requests"] == crossed["replies"] == (0, 0), crossed
    assert (crossed["records"][0] > 0) == (remote_learner > 0) == (crossed["credits"][0] > 0), crossed
    versions = int(read_metrics(metrics_path)["policy_version"][-1]) + 1  # from the initial weights (0) on
    messages, nbytes = crossed["weights"]
    assert nbytes == messages * size, crossed
    assert messages == copies * versions if exact_versions else copies <= messages <= copies * versions, crossed


def start_and_train(cluster: Cluster, tmp_path, *settings: str, pause: dict | None = None):
    """A long run across both nodes, past its first checkpoint and 3 metrics rows, or (`pause`:
    HPCRL_PAUSE_* variables) until a rank has stopped at the pause point."""
    marker = tmp_path / "paused"
    extra_env = dict(pause, HPCRL_PAUSE_MARKER=str(marker)) if pause else None
    proc = cluster.start(RANKS, *job(tmp_path, "run.total_frames=10000000", "run.target_return=null",
                                     "run.checkpoint_interval_s=1", *settings), extra_env=extra_env)
    checkpoint, metrics = run_path(tmp_path) + "/checkpoint.h5", run_path(tmp_path) + "/metrics.h5"
    deadline = time.monotonic() + 180
    while not (os.path.exists(checkpoint) and (marker.exists() if pause else rows(metrics) >= 3)):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the run did not get going:\n{proc.communicate()[0]}")
        time.sleep(0.2)
    return proc


def rows(metrics_path: str) -> int:
    try:
        return len(read_metrics(metrics_path)["frames"])
    except (OSError, KeyError):
        return 0  # not written yet, or between its creation and the first row


def resume_on_n0(cluster: Cluster, tmp_path) -> str:
    """The run goes on with the node that is left: half the env ranks, one learner."""
    found, _, counters, problems = inspect_latest(run_path(tmp_path) + "/checkpoint.h5")
    assert found is not None, problems
    frames = int(counters["frames"])
    status, out = cluster.run(PER_NODE, *job(tmp_path, f"run.total_frames={frames + 2048}",
                                             "run.target_return=null"), hosts=f"n0:{PER_NODE}")
    assert status == 0, out
    assert "[hpcrl] 4 ranks on 1 node" in out and "resuming from" in out
    metrics = read_metrics(run_path(tmp_path) + "/metrics.h5")
    assert metrics["policy_version"].tolist() == list(range(1, len(metrics["policy_version"]) + 1))
    assert metrics["frames"][-1] >= frames + 2048
    return out


@WAITS
def test_async_trains_on_at_the_other_nodes_pace_while_one_is_stopped(healthy, tmp_path):
    """APPO with its learner and policy server on n0, one env rank there and two on n1; n1 stopped
    for half the peer timeout (PEER_TIMEOUT_S here): the learner trains on n0's fragments meanwhile,
    nothing aborts, and once n1 goes on the run ends normally (preempted here), its versions one series."""
    cfg = small_config(tmp_path, algo={"mode": "async"})
    cfg["run"].update(total_frames=100_000_000, target_return=None, peer_timeout_s=PEER_TIMEOUT_S)
    proc = healthy.start(5, "run", str(write_config(tmp_path, cfg)), hosts="n0:3,n1:2")
    metrics = str(run_dir(cfg) / "metrics.h5")
    deadline = time.monotonic() + 180
    while rows(metrics) < 3:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the run did not get going:\n{proc.communicate()[0]}")
        time.sleep(0.2)
    healthy.fault("stop", "n1")
    before = rows(metrics)
    time.sleep(PEER_TIMEOUT_S / 2)  # n1's beats resume well within the timeout, its thaw under load included
    during = rows(metrics) - before
    healthy.fault("cont", "n1")
    time.sleep(5)
    proc.send_signal(signal.SIGUSR1)  # the Popen is mpirun itself (cluster.sh execs it): it checkpoints
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3, out
    assert "heard nothing" not in out and "[hpcrl] nodes: n0 ranks 0-2; n1 ranks 3-4" in out
    assert during >= 3, f"{during} updates while n1 was stopped"  # n0's env rank alone fed the learner
    series = read_metrics(metrics)
    assert series["policy_version"].tolist() == list(range(1, len(series["policy_version"]) + 1))


@WAITS
def test_a_node_that_dies_ends_the_job_in_seconds_and_the_run_resumes_on_the_other(healthy, tmp_path):
    proc = start_and_train(healthy, tmp_path)
    killed = healthy.fault("kill", "n1")
    out, _ = proc.communicate(timeout=ENDS_AFTER_KILL_S)
    assert time.monotonic() - killed < ENDS_AFTER_KILL_S and proc.returncode != 0, out
    assert "n1" in out and "[hpcrl] nodes: n0 ranks 0-3; n1 ranks 4-7" in out  # which ranks that node held
    healthy.wait_empty("n0", 10)
    resume_on_n0(healthy, tmp_path)


@WAITS
@pytest.mark.parametrize("pause", [
    None,  # sampling and training
    {"HPCRL_PAUSE_INSIDE": "update:8", "HPCRL_PAUSE_RANK": "4"},  # n1's learner stops in its update: the
    # learner on n0 waits for it inside the gradient average
    {"HPCRL_PAUSE_INSIDE": "checkpoint:2"},  # the root stops inside its second checkpoint, and the
    # resume on n0 repairs what it left
], ids=["sampling", "averaging", "checkpoint"])
def test_a_node_cut_off_ends_the_job_on_both_sides(healthy, tmp_path, pause):
    timeout = PEER_TIMEOUT_S
    proc = start_and_train(healthy, tmp_path, f"run.peer_timeout_s={timeout}", pause=pause)
    cut = healthy.fault("cut", "n1")
    out, _ = proc.communicate(timeout=ends_after_cut_s(timeout) + 30)
    ended = time.monotonic() - cut
    assert ended < ends_after_cut_s(timeout) and proc.returncode != 0, (ended, out)
    healthy.wait_empty("n0", 5)
    assert time.monotonic() - cut + healthy.wait_empty("n1", cut_node_ends_s(timeout)) < cut_node_ends_s(timeout)
    assert "has heard nothing from rank 4 (env rank on node n1)" in out or \
        "has heard nothing from rank 4 (learner rank on node n1)" in out, out
    assert f"(run.peer_timeout_s = {timeout})" in out
    resumed = resume_on_n0(healthy, tmp_path)  # with n1 still cut off
    if pause and pause["HPCRL_PAUSE_INSIDE"].startswith("checkpoint"):
        assert "a checkpoint a stopped run had not finished writing" in resumed


@WAITS
def test_sync_ppo_across_nodes_averages_over_tcp_and_waits_out_a_stopped_node(healthy, tmp_path):
    """A learner and a policy server per node; n1 stopped for 12 s (less than the peer timeout):
    sync PPO waits for its fragments and gradients, then trains on to the end with the learners
    still bit-identical: no abort, no lost or repeated update."""
    proc = start_and_train(healthy, tmp_path, "run.total_frames=16384", "run.replica_digests=true")
    healthy.fault("stop", "n1")
    rows_before = rows(run_path(tmp_path) + "/metrics.h5")
    time.sleep(12)
    healthy.fault("cont", "n1")
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    assert "heard nothing" not in out
    assert "[hpcrl] 8 ranks on 2 nodes" in out and "[hpcrl] nodes: n0 ranks 0-3; n1 ranks 4-7" in out
    assert "learner ranks 0, 4; inference ranks 1, 5; env ranks 2-3, 6-7" in out
    assert "inference rank on another node" not in out  # every env rank's policy server is on its node
    metrics = read_metrics(run_path(tmp_path) + "/metrics.h5")
    assert len(metrics["frames"]) > rows_before and metrics["frames"][-1] >= 16384
    assert metrics["policy_version"].tolist() == list(range(1, len(metrics["policy_version"]) + 1))
    digests = metrics["replica_digest"]  # the learner on n1 averaged with the one on n0 every step
    assert np.all(digests[:, 0] == digests[:, 1]) and len(set(digests[:, 0])) == len(digests)
    predicted = predicted_crossing(JOB, RANKS, PER_NODE, "roles.inference.per_node=1")
    assert predicted[0] == 1 and predicted[2:] == (0, 0)  # per-node layout: only weights cross
    check_crossed_nodes(run_path(tmp_path) + "/metrics.h5", predicted, exact_versions=True)
    assert "[hpcrl] crossed nodes (messages): requests 0, replies 0, records 0, credits 0, weights" in out


@WAITS
def test_a_population_of_8_loses_a_node_trains_on_packed_on_the_4_ranks_left_and_spreads_out_again(healthy,
                                                                                                   tmp_path):
    """8 serial PBT members on n0:4 and n1:4; n1 dies. Resumed on n0's 4 ranks, every member
    trains on, 2 to a rank in turns (population.fewer_ranks: pack, the default), each from its own
    checkpoint: the lineage keeps every row it had and goes on for all 8, none paused. Relaunched
    on both nodes, each member has its own rank again."""
    from hpcrl.core.population import EXPLOIT, JUDGED, PAUSED
    cfg = small_config(tmp_path, name="pbt", roles={"inference": {"ranks": 0}},
                       run={"total_frames": 10_000_000, "target_return": None, "checkpoint_interval_s": 1})
    cfg["population"] = {"members": 8, "ready_frames": 256, "truncation": 0.25,
                         "explore": {"algo.lr": {"perturb": [0.8, 1.25]}}}
    config, population = str(write_config(tmp_path, cfg)), run_dir(cfg)
    members = [population / f"member{m}" for m in range(8)]

    def lineage() -> dict:
        return read_metrics(str(population / "metrics.h5"))

    def frames(m: int) -> int:
        return int(inspect_latest(str(members[m] / "checkpoint.h5"))[2]["frames"])

    proc = healthy.start(RANKS, "run", config, hosts=f"n0:{PER_NODE},n1:{PER_NODE}")
    deadline = time.monotonic() + 180
    while not all((m / "checkpoint.h5").exists() for m in members) or rows(str(population / "metrics.h5")) < 24:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0] if proc.poll() else ""
        time.sleep(0.2)
    before = lineage()
    healthy.fault("kill", "n1")
    out, _ = proc.communicate(timeout=ENDS_AFTER_KILL_S)
    assert proc.returncode != 0, out
    healthy.wait_empty("n0", 10)
    at_loss = [frames(m) for m in range(8)]

    goal = max(at_loss) + 1024
    status, out = healthy.run(PER_NODE, "run", config, "--set", f"run.total_frames={goal}", hosts=f"n0:{PER_NODE}")
    assert status == 0 and "Traceback" not in out, out
    assert "resumed 8 members on 4 ranks: 2 per rank, taking turns of 256 frames" in out, out
    table = lineage()
    for key in ("event", "member", "parent", "frames"):  # every row it had, as it was
        np.testing.assert_array_equal(table[key][:len(before["event"])], before[key], err_msg=key)
    assert not (table["event"] == PAUSED).any()
    for m in range(8):  # each judged again after the loss, and trained to the goal
        judged = np.isin(table["event"], (JUDGED, EXPLOIT)) & (table["member"] == m)
        assert (table["frames"][judged] > at_loss[m]).any() and frames(m) >= goal, m

    status, out = healthy.run(RANKS, "run", config, "--set", f"run.total_frames={goal + 512}",
                              hosts=f"n0:{PER_NODE},n1:{PER_NODE}")
    assert status == 0 and "population of 8 members, each on 1 rank as below" in out, out
    assert out.count("resuming from") == 8 and all(frames(m) >= goal + 512 for m in range(8))


def test_a_population_copies_members_between_nodes(healthy, tmp_path):
    """Two members of 2 ranks, member 0 on n0 and member 1 on n1: reports, orders and every copy
    cross TCP. Neither trains (algo.train: false), so each keeps its seeded weights until it copies
    the other's: at the end their weights are equal exactly when the lineage says a copy happened."""
    from hpcrl.core.population import exploits_taken
    from hpcrl.io.checkpoint import load_checkpoint
    cfg = small_config(tmp_path, name="pbt", roles={"inference": {"ranks": 0}}, algo={"train": False},
                       run={"total_frames": 2048})
    # in rounds: judged together, so the worse copies the better at the first round, however the nodes'
    # speeds differ (judged as reports come, a member that finished first could never be copied onto)
    cfg["population"] = {"members": 2, "ready_frames": 256, "truncation": 0.5, "synchronous": True,
                         "explore": {"algo.lr": {"perturb": [0.5, 2.0]}}}
    status, out = healthy.run(4, "run", str(write_config(tmp_path, cfg)), hosts="n0:2,n1:2")
    assert status == 0, out
    assert "population of 2 members, each on 2 ranks" in out and "[hpcrl] population done" in out
    lineage = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    copies = len(exploits_taken(lineage["event"], lineage["member"], lineage["parent"]))
    assert copies >= 1 and out.count("exploit: took member") == copies
    models = [load_checkpoint(str(run_dir(cfg) / f"member{m}" / "checkpoint.h5"))["model"] for m in range(2)]
    assert all(np.array_equal(models[0][k], models[1][k]) for k in models[0])  # the last copy made them one


def test_staging_without_slurm_unpacks_once_per_node_and_ranks_import_from_their_nodes_copy(healthy, tmp_path):
    """docs/clusters.md's staging without SLURM: one process per node (mpirun, one slot on each)
    unpacks the archive into its node's own storage (/mnt), then every rank of a job, two per
    node, imports hpcrl from its node's copy. The archive is a small venv of this interpreter with
    hpcrl's package (the real venv's 2.5 GB are staged by tests/test_multinode_slurm.py)."""
    from hpcrl.tools.stage import COMPLETE, pack
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    archive, _ = pack(venv, Path(hpcrl.__file__).parent, tmp_path / "stage")
    key = archive.name.removesuffix(".tar")
    status, out = healthy.run(2, "stage", "unpack", str(archive), "--to", "/mnt", hosts="n0:1,n1:1")
    assert status == 0 and out.count(f"[hpcrl] unpacked /mnt/{key}") == 2, out
    # each prints its interpreter's path (mpirun's output forwarding may merge lines written at once)
    assert re.findall(r"/mnt/[\w.-]+/venv/bin/python", out) == [f"/mnt/{key}/venv/bin/python"] * 2, out
    assert all((healthy.local_dir(node) / key / COMPLETE).is_file() for node in ("n0", "n1"))
    shown = tmp_path / "shown"  # a file a rank (mpirun's output forwarding may merge lines written at once)
    shown.mkdir()
    show = (f"import hpcrl, os, socket; open('{shown}/' + os.environ['OMPI_COMM_WORLD_RANK'], 'w')"
            f".write(socket.gethostname() + ' ' + hpcrl.__file__)")
    status, out = healthy.run(4, "-P", "-c", show, hosts="n0:2,n1:2", command=[f"/mnt/{key}/venv/bin/python"],
                              extra_env={"PYTHONPATH": ""})
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    module = f"/mnt/{key}/venv/lib/python{version}/site-packages/hpcrl/__init__.py"
    assert status == 0, out
    assert [(shown / str(r)).read_text() for r in range(4)] == [f"n0 {module}"] * 2 + [f"n1 {module}"] * 2
