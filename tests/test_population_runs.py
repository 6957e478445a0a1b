"""Population-based training as real mpirun jobs: members on their own blocks of ranks, the
population root's lineage, states copied between members over MPI, and the refusals."""
import os
import re
import signal
import subprocess
import sys
from collections import Counter

import numpy as np
import yaml

from hpcrl.io.checkpoint import load_checkpoint
from hpcrl.io.metrics import read_metrics
from hpcrl.workers.ratings import AnchorRating
from hpcrl.core.population import (CANCELLED, EXPLOIT, JUDGED, PAUSED, START, STOPPED, exploits_taken, ranking,
                                   standings)
from tests.conftest import MPIRUN, REPO, job_pids, mpirun, run_dir, run_hpcrl, small_config, write_config
from tests.test_stop_signals import read_until

FACTORS = (0.5, 2.0)


def population_config(tmp_path, members: int, roles: dict, lrs: list[float], **sections) -> dict:
    cfg = small_config(tmp_path, name="pbt", roles=roles, **sections)
    cfg["population"] = {"members": members, "ready_frames": 256, "truncation": 0.25,
                         "explore": {"algo.lr": {"perturb": list(FACTORS)}}, "values": {"algo.lr": lrs}}
    return cfg


def start_until_a_copy(path: str) -> subprocess.Popen:
    """`mpirun -n 4 hpcrl run PATH` in a session of its own, once a member has taken a copy."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(["bash", str(MPIRUN), "-n", "4", sys.executable, "-m", "hpcrl", "run", path], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    read_until(proc, "exploit: took member")
    return proc


def lineage(cfg) -> dict:
    return read_metrics(str(run_dir(cfg) / "metrics.h5"))


def test_a_copy_reaches_every_learner_of_a_member(tmp_path):
    """2 members of 4 ranks (2 learners, averaging with Horovod, and 2 env ranks): after every
    copy both learners of the target hold the same weights and normalisers (their digests after
    each update are equal), and training goes on."""
    cfg = population_config(tmp_path, 2, {"learner": {"ranks": 2}, "inference": {"ranks": 0}}, [1e-3, 3e-3],
                            run={"total_frames": 3072, "replica_digests": True}, model={"obs_norm": True})
    cfg["population"]["truncation"] = 0.5
    result = mpirun(8, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 0, result.stdout + result.stderr
    table = lineage(cfg)
    assert (table["event"] == EXPLOIT).sum() >= 1
    for m in range(2):
        metrics = read_metrics(str(run_dir(cfg) / f"member{m}" / "metrics.h5"))
        digests = metrics["replica_digest"]
        assert digests.shape[1] == 2 and np.all(digests[:, 0] == digests[:, 1])
        assert metrics["frames"][-1] >= 3072


def test_a_population_that_does_not_fit_the_world_is_refused(tmp_path):
    cfg = population_config(tmp_path, 2, {"learner": {"ranks": 1}, "inference": {"ranks": 0}}, [1e-3, 2e-3])
    result = mpirun(1, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "population.members: 2 members need a world size that is a multiple of 2" in result.stderr
    assert not (tmp_path / "runs").exists()  # a refused start writes nothing


def test_a_population_is_not_started_in_the_directory_of_a_single_run(tmp_path):
    single = small_config(tmp_path, name="pbt", roles={"learner": {"ranks": 1}, "inference": {"ranks": 0}},
                          run={"total_frames": 256})
    assert mpirun(1, "run", str(write_config(tmp_path, single, "single.yaml"))).returncode == 0
    cfg = population_config(tmp_path, 2, {"learner": {"ranks": 1}, "inference": {"ranks": 0}}, [1e-3, 2e-3])
    result = mpirun(2, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "holds a run of one policy set, not a population" in result.stderr
    assert not (run_dir(cfg) / "member0").exists()


def test_a_preempted_population_resumes_and_its_members_end_as_the_lineage_says(tmp_path):
    """4 serial members that do not train (algo.train: false), so each keeps the weights it was
    seeded with until it copies another's. SIGTERM to the launcher once copies have happened: every
    member checkpoints and the job exits 3; run again on twice the ranks (each member a learner and
    an env rank instead of one serial rank), each member resumes from its own checkpoint with the
    learning rate its copies left it (its first report says so in the lineage), and the lineage goes
    on. At the end every member's weights are those of the member its lineage leads back to, and its
    learning rate the lineage's last."""
    lrs = [1e-3, 2e-3, 3e-3, 4e-3]
    cfg = population_config(tmp_path, 4, {"learner": {"ranks": 1}, "inference": {"ranks": 0}}, lrs,
                            run={"total_frames": 10**8}, algo={"train": False})
    path = str(write_config(tmp_path, cfg))
    proc = start_until_a_copy(path)
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3 and "Traceback" not in err, out + err
    before = lineage(cfg)
    saved = {m: load_checkpoint(str(run_dir(cfg) / f"member{m}" / "checkpoint.h5")) for m in range(4)}
    assert all(saved[m]["counters"]["stopped_by"] == "preempted" for m in range(4))
    saved_lrs = {m: saved[m]["parts"]["hyperparameters"]["lr"] for m in range(4)}
    assert (before["event"] == EXPLOIT).any()
    for m in range(4):  # each checkpoint holds the rate the lineage last gave its member
        assert saved_lrs[m] == before["algo.lr"][np.flatnonzero(before["member"] == m)[-1]], (m, saved_lrs)

    resumed = mpirun(8, "run", path, "--set", "run.total_frames=" + str(max(
        int(saved[m]["counters"]["frames"]) for m in range(4)) + 2048))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "Traceback" not in resumed.stderr, resumed.stderr
    assert resumed.stdout.count("resuming from") == 4
    assert "population of 4 members, each on 2 ranks as below" in resumed.stdout, resumed.stdout
    table = lineage(cfg)
    rows = len(before["event"])
    assert np.array_equal(table["event"][:rows], before["event"]) and len(table["event"]) > rows
    for m in range(4):  # each member's first update of the new launch trained with the rate its checkpoint held
        metrics = read_metrics(str(run_dir(cfg) / f"member{m}" / "metrics.h5"))
        first = np.flatnonzero(metrics["frames"] > saved[m]["counters"]["frames"])[0]
        assert metrics["lr"][first] == saved_lrs[m], (m, metrics["lr"][first], saved_lrs[m])

    events, members, parents = table["event"], table["member"], table["parent"]
    assert sorted(members[events == START].tolist()) == [0, 1, 2, 3]
    assert Counter(members[events == STOPPED].tolist()) == {m: 2 for m in range(4)}  # preempted, then done
    assert np.all(np.isin(events, (START, JUDGED, EXPLOIT, STOPPED, CANCELLED)))
    # every copy a member announces is one the lineage holds (under load mpirun's output forwarding
    # may merge and drop a line of several ranks writing at once, so the announcements may be fewer)
    announced = Counter(re.findall(r"member(\d)\] exploit: took member (\d)'s", out + resumed.stdout))
    held = Counter((str(members[i]), str(parents[i])) for i in exploits_taken(events, members, parents))
    assert announced and announced <= held, (announced, held)

    origin = list(range(4))  # whose seeded weights each member holds
    lr = dict(enumerate(lrs))
    taken = set(exploits_taken(events, members, parents).tolist())  # not those after the member stopped
    for i in range(len(events)):
        m, p = int(members[i]), int(parents[i])
        if events[i] == EXPLOIT:
            assert p != m
            # explore: the parent's rate (the root's last word of it) times one of the factors
            assert any(np.isclose(table["algo.lr"][i], lr[p] * f) for f in FACTORS), (i, lr, table["algo.lr"][i])
            assert table["parent_fitness"][i] >= table["fitness"][i] or np.isnan(table["fitness"][i])
            if i in taken:
                origin[m] = origin[p]
        if events[i] != CANCELLED:
            lr[m] = table["algo.lr"][i]

    finals = {m: load_checkpoint(str(run_dir(cfg) / f"member{m}" / "checkpoint.h5")) for m in range(4)}
    for m in range(4):
        assert finals[m]["parts"]["hyperparameters"]["lr"] == lr[m]
        assert read_metrics(str(run_dir(cfg) / f"member{m}" / "metrics.h5"))["lr"][-1] == lr[m]
        for k in range(4):  # weights: equal exactly where the lineage leads to the same seeded member
            same = all(np.array_equal(finals[m]["model"][key], finals[k]["model"][key]) for key in finals[m]["model"])
            assert same == (origin[m] == origin[k]), (m, k, origin)

    members_cfg = [yaml.safe_load((run_dir(cfg) / f"member{m}" / "config.yaml").read_text()) for m in range(4)]
    assert [c["run"]["seed"] for c in members_cfg] == [3, 4, 5, 6]
    assert [c["algo"]["lr"] for c in members_cfg] == lrs  # each member's start, runnable alone
    assert all(c["population"]["members"] == 0 for c in members_cfg)
    assert yaml.safe_load((run_dir(cfg) / "config.yaml").read_text())["population"]["members"] == 4

    # hpcrl plot draws the population (its members, exploits, learning rates), alone only
    image = tmp_path / "pbt.png"
    plotted = run_hpcrl("plot", str(run_dir(cfg)), "-o", str(image))
    assert plotted.returncode == 0 and "the 4 members of" in plotted.stdout, plotted.stderr
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    mixed = run_hpcrl("plot", str(run_dir(cfg)), str(run_dir(cfg) / "member0"), "-o", str(image))
    assert mixed.returncode == 2 and "is a population's directory: plot it alone" in mixed.stderr


def test_inspect_and_eval_of_a_population_point_to_its_members(tmp_path):
    population = tmp_path / "runs" / "pbt"
    (population / "member0").mkdir(parents=True)
    (population / "config.yaml").write_text(yaml.safe_dump({"population": {"members": 2}}))
    for command in ("inspect", "eval"):
        result = run_hpcrl(command, str(population))
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert f"is a population's directory (1 member); {command} one member's run directory, e.g. " \
               f"{population / 'member0'}, or draw them all with hpcrl plot" in result.stderr


def test_a_population_in_rounds_resumes_exactly_on_as_many_ranks_or_packed_on_fewer(tmp_path):
    """population.synchronous with 4 serial members: an uninterrupted run, and one preempted once
    copies have happened then resumed, end with every member's weights bit-identical, the same
    metrics row for row, and the same judgements and copies in the lineage. Only member 3 is
    signalled: it stops part-way through a round, the root aborts the round, and the others stop
    where they wait for it, at the round, which they take up again when they resume (the root
    saved its state after each round). Resumed on 2 ranks instead (a node lost), the members take
    turns, 2 to a rank (population.fewer_ranks: pack): the 3 that waited report again without
    training, member 3 trains to the round's end, and every copy goes through the checkpoints;
    they end bit-identical all the same."""

    def config(name: str) -> dict:
        cfg = population_config(tmp_path, 4, {"learner": {"ranks": 1}, "inference": {"ranks": 0}},
                                [1e-3, 2e-3, 3e-3, 4e-3], run={"total_frames": 3072})
        cfg["run"]["name"] = name
        cfg["population"]["synchronous"] = True
        return cfg

    whole = config("whole")
    assert mpirun(4, "run", str(write_config(tmp_path, whole, "whole.yaml"))).returncode == 0
    for name, ranks in (("halves", 4), ("packed", 2)):
        halves = config(name)
        path = str(write_config(tmp_path, halves, f"{name}.yaml"))
        proc = start_until_a_copy(path)
        for pid in job_pids(f"{name}.yaml", rank=3):
            os.kill(pid, signal.SIGUSR1)  # (what SLURM's --signal, forwarded by mpirun, gives every rank)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 3 and "Traceback" not in err, out + err
        saved = [load_checkpoint(str(run_dir(halves) / f"member{m}" / "checkpoint.h5")) for m in range(4)]
        assert max(int(c["counters"]["frames"]) for c in saved) < 3072  # stopped part-way
        waiting = [int(c["parts"]["population"]["waiting_round"]) for c in saved]
        assert waiting[3] == 0 and min(waiting[:3]) > 0, waiting
        resumed = mpirun(ranks, "run", path)
        assert resumed.returncode == 0 and "Traceback" not in resumed.stderr, resumed.stdout + resumed.stderr
        if ranks == 2:
            assert ("resumed 4 members on 2 ranks: 2 per rank, taking turns of 256 frames (population.fewer_ranks: "
                    "pack)") in resumed.stdout, resumed.stdout
            assert "through its checkpoint" in resumed.stdout
        assert_same_population(whole, halves)
        b = lineage(halves)
        assert not (b["event"] == CANCELLED).any() and (b["event"] == STOPPED).sum() == 8, b["event"]  # 4 a launch


def assert_same_population(whole: dict, other: dict) -> None:
    """The same judgements and copies in both lineages; every member's weights and metrics rows equal."""
    a, b = lineage(whole), lineage(other)
    decided_a, decided_b = np.isin(a["event"], (JUDGED, EXPLOIT)), np.isin(b["event"], (JUDGED, EXPLOIT))
    assert (a["event"] == EXPLOIT).sum() >= 1
    for key in ("event", "member", "parent", "frames", "fitness", "algo.lr"):
        np.testing.assert_array_equal(a[key][decided_a], b[key][decided_b], err_msg=key)
    for m in range(4):
        ma = read_metrics(str(run_dir(whole) / f"member{m}" / "metrics.h5"))
        mb = read_metrics(str(run_dir(other) / f"member{m}" / "metrics.h5"))
        for key in ("frames", "return_window_mean", "loss_policy", "loss_value", "lr"):
            np.testing.assert_array_equal(ma[key], mb[key], err_msg=f"member {m}: {key}")
        ca = load_checkpoint(str(run_dir(whole) / f"member{m}" / "checkpoint.h5"))
        cb = load_checkpoint(str(run_dir(other) / f"member{m}" / "checkpoint.h5"))
        assert all(np.array_equal(ca["model"][k], cb["model"][k]) for k in ca["model"]), m


def test_a_population_resumes_on_fewer_ranks_with_members_paused_and_spreads_out_again(tmp_path):
    """4 serial members on 4 ranks; resumed on 2 (a node lost): the 2 of the best standing in the
    lineage train on, the other 2 are paused, their checkpoints untouched, each with a PAUSED row
    that keeps its standing; the lineage so far is kept as it was. Launched on 2 again, the 2 that
    finished step aside for the paused ones. Relaunched on 4, every member trains again from its
    own checkpoint."""
    cfg = population_config(tmp_path, 4, {"learner": {"ranks": 1}, "inference": {"ranks": 0}},
                            [1e-3, 2e-3, 3e-3, 4e-3], run={"total_frames": 1024})
    cfg["population"]["fewer_ranks"] = "pause"
    path = str(write_config(tmp_path, cfg))
    assert mpirun(4, "run", path).returncode == 0
    before = lineage(cfg)
    standing = standings(before, 4, ("lr",))
    running = sorted(ranking(standing.fitness)[:2].tolist())
    paused = sorted(set(range(4)) - set(running))

    def checkpoint(m: int) -> dict:
        return load_checkpoint(str(run_dir(cfg) / f"member{m}" / "checkpoint.h5"))

    saved = {m: checkpoint(m) for m in range(4)}
    fewer = mpirun(2, "run", path, "--set", "run.total_frames=2048")
    assert fewer.returncode == 0 and "Traceback" not in fewer.stderr, fewer.stdout + fewer.stderr
    assert (f"resumed 4 members on 2 ranks: 2 running on 1 rank each, 2 paused (members {paused[0]}, {paused[1]}: "
            f"their checkpoints wait for a launch on 4 ranks or more)") in fewer.stdout, fewer.stdout
    assert fewer.stdout.count("resuming from") == 2
    table, rows = lineage(cfg), len(before["event"])
    for key in ("event", "member", "frames", "algo.lr"):
        np.testing.assert_array_equal(table[key][:rows], before[key], err_msg=key)
    pauses = np.flatnonzero(table["event"] == PAUSED)
    assert sorted(table["member"][pauses].tolist()) == paused
    for i in pauses:
        m = int(table["member"][i])
        assert table["frames"][i] == standing.frames[m] and table["algo.lr"][i] == standing.hyper[m, 0]
        np.testing.assert_array_equal(table["fitness"][i], standing.fitness[m])
    for m in range(4):
        now = checkpoint(m)
        if m in paused:
            assert now["counters"]["frames"] == saved[m]["counters"]["frames"]
            assert all(np.array_equal(now["model"][k], saved[m]["model"][k]) for k in now["model"]), m
        else:
            assert now["counters"]["frames"] >= 2048, m

    # again on 2 ranks: the 2 that finished step aside, and the 2 paused ones run and finish
    again = mpirun(2, "run", path, "--set", "run.total_frames=2048")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resumed 4 members on 2 ranks: 2 running on 1 rank each, 2 complete;" in again.stdout, again.stdout
    assert all(checkpoint(m)["counters"]["frames"] >= 2048 for m in range(4))
    table = lineage(cfg)

    spread = mpirun(4, "run", path, "--set", "run.total_frames=3072")
    assert spread.returncode == 0 and "Traceback" not in spread.stderr, spread.stdout + spread.stderr
    assert "population of 4 members, each on 1 rank as below" in spread.stdout, spread.stdout
    assert spread.stdout.count("resuming from") == 4
    assert all(checkpoint(m)["counters"]["frames"] >= 3072 for m in range(4))
    assert not (lineage(cfg)["event"][len(table["event"]):] == PAUSED).any()


def test_dqn_members_copy_their_target_networks_too(tmp_path):
    """2 serial DQN members (replay in the learner, a replay ratio of 4): a copy carries the trainer
    step's state (the target network and its step count) besides the weights and Adam's state;
    training goes on. In rounds, so that a copy is ordered at every round (the worse of the two
    copies the other): as they come, under load one member once finished before the other's
    first report, and no copy was ordered."""
    cfg = small_config(tmp_path, name="pbt", roles={"learner": {"ranks": 1}, "inference": {"ranks": 0}},
                       run={"total_frames": 3000},
                       algo={"name": "dqn", "rollout_length": 8, "lr": 0.001,
                             "dqn": {"batch_size": 32, "target_update_interval": 10, "eps_schedule": "linear",
                                     "eps_decay_frames": 1000},
                             "replay": {"capacity": 20000, "warmup": 256, "replay_ratio": 4}})
    cfg["population"] = {"members": 2, "ready_frames": 400, "truncation": 0.5, "synchronous": True,
                         "explore": {"algo.lr": {"perturb": [0.5, 2.0]}}}
    result = mpirun(2, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stdout + result.stderr
    table = lineage(cfg)
    assert len(exploits_taken(table["event"], table["member"], table["parent"])) >= 1
    for m in range(2):
        saved = load_checkpoint(str(run_dir(cfg) / f"member{m}" / "checkpoint.h5"))
        assert saved["counters"]["frames"] >= 3000 and "target" in saved["parts"]["step"]
        assert saved["parts"]["hyperparameters"]["lr"] == table["algo.lr"][np.flatnonzero(table["member"] == m)[-1]]


def test_self_play_members_are_judged_on_their_rating_against_the_anchors(tmp_path):
    """2 serial connect four members in self-play with an anchor: each report's fitness is the
    member's rating as its metrics row of that update has it, and a member that copies starts
    its rating again from OpenSkill's prior (so its next judgement is of the copy)."""
    cfg = population_config(tmp_path, 2, {"learner": {"ranks": 1}, "inference": {"ranks": 0}}, [3e-4, 3e-4],
                            env={"id": "pettingzoo:classic/connect_four-v3", "num_envs": 8},
                            algo={"name": "ippo", "rollout_length": 32,
                                  "selfplay": {"latest": 0.5, "anchor_share": 0.5,
                                               "anchors": {"uniform": "hpcrl.envs.anchors:uniform"}}},
                            run={"total_frames": 8192}, model={"encoder": "mlp", "hidden_sizes": [32]})
    cfg["population"].update(ready_frames=2048, truncation=0.5)
    result = mpirun(2, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 0, result.stdout + result.stderr
    table = lineage(cfg)
    judged = np.flatnonzero(np.isin(table["event"], (JUDGED, EXPLOIT)))
    assert len(judged) >= 2
    members = {m: read_metrics(str(run_dir(cfg) / f"member{m}" / "metrics.h5")) for m in range(2)}
    for i in judged:
        m = members[int(table["member"][i])]
        row = np.flatnonzero(m["frames"] == table["frames"][i])
        assert len(row) == 1 and np.isfinite(table["fitness"][i]), (i, table["frames"][i])
        assert table["fitness"][i] == m["rating"][row[0]]
    copies = re.findall(r"\[hpcrl member(\d+)\] exploit: took member \d+'s state at ([\d,]+) frames", result.stdout)
    assert len(copies) == len(exploits_taken(table["event"], table["member"], table["parent"])) >= 1
    for member, frames in copies:
        m = members[int(member)]
        row = int(np.flatnonzero(m["frames"] == int(frames.replace(",", "")))[0])
        if row + 1 < len(m["frames"]):  # the next update's games, rated from the prior, give its next rating
            games = m["anchor.uniform.games"][row + 1]
            wins = round(m["anchor.uniform.win_rate"][row + 1] * games)
            draws = round(m["anchor.uniform.draw_rate"][row + 1] * games)
            fresh = AnchorRating({"uniform": 25.0})
            fresh.add(np.array([[wins, draws, games - wins - draws]]))
            assert fresh.columns()["rating"] == m["rating"][row + 1]
