"""Population-based training as real mpirun jobs: members on their own blocks of ranks, the
population root's lineage, states copied between members over MPI, and the refusals."""

import numpy as np
import yaml

from hpcrl.io.checkpoint import load_checkpoint
from hpcrl.io.metrics import read_metrics
from hpcrl.core.population import EXPLOIT, JUDGED, START, STOPPED
from tests.conftest import mpirun, run_dir, small_config, write_config

FACTORS = (0.5, 2.0)


def population_config(tmp_path, members: int, roles: dict, lrs: list[float], **sections) -> dict:
    cfg = small_config(tmp_path, name="pbt", roles=roles, **sections)
    cfg["population"] = {"members": members, "ready_frames": 256, "truncation": 0.25,
                         "explore": {"algo.lr": {"perturb": list(FACTORS)}}, "values": {"algo.lr": lrs}}
    return cfg


def lineage(cfg) -> dict:
    return read_metrics(str(run_dir(cfg) / "metrics.h5"))


def test_members_copy_states_and_hyperparameters_as_the_lineage_says(tmp_path):
    """4 serial members that do not train (algo.train: false), so each keeps the weights it was
    seeded with until it copies another's: every member's final weights must be those of the
    member its lineage leads back to, and its learning rate the lineage's last."""
    lrs = [1e-3, 2e-3, 3e-3, 4e-3]
    cfg = population_config(tmp_path, 4, {"learner": {"ranks": 1}, "inference": {"ranks": 0}}, lrs,
                            run={"total_frames": 4096}, algo={"train": False})
    result = mpirun(4, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    table = lineage(cfg)
    events, members, parents = table["event"], table["member"], table["parent"]
    assert sorted(members[events == START].tolist()) == [0, 1, 2, 3]
    assert sorted(members[events == STOPPED].tolist()) == [0, 1, 2, 3]
    exploits = np.flatnonzero(events == EXPLOIT)
    assert len(exploits) >= 1 and np.all(events[np.isin(events, (JUDGED, EXPLOIT))] >= 0)
    assert result.stdout.count("exploit: took member") == len(exploits)

    origin = list(range(4))  # whose seeded weights each member holds
    lr = dict(enumerate(lrs))
    for i in range(len(events)):
        m, p = int(members[i]), int(parents[i])
        if events[i] == EXPLOIT:
            assert p != m
            # explore: the parent's rate (its last word) times one of the factors
            assert any(np.isclose(table["algo.lr"][i], lr[p] * f) for f in FACTORS), (i, lr, table["algo.lr"][i])
            assert table["parent_fitness"][i] >= table["fitness"][i] or np.isnan(table["fitness"][i])
            origin[m] = origin[p]
        lr[m] = table["algo.lr"][i]

    finals = {m: load_checkpoint(str(run_dir(cfg) / f"member{m}" / "checkpoint.h5")) for m in range(4)}
    for m in range(4):
        assert finals[m]["extra"]["hyperparameters"]["lr"] == lr[m]
        assert read_metrics(str(run_dir(cfg) / f"member{m}" / "metrics.h5"))["lr"][-1] == lr[m]
        for k in range(4):  # weights: equal exactly where the lineage leads to the same seeded member
            same = all(np.array_equal(finals[m]["model"][key], finals[k]["model"][key]) for key in finals[m]["model"])
            assert same == (origin[m] == origin[k]), (m, k, origin)

    members_cfg = [yaml.safe_load((run_dir(cfg) / f"member{m}" / "config.yaml").read_text()) for m in range(4)]
    assert [c["run"]["seed"] for c in members_cfg] == [3, 4, 5, 6]
    assert [c["algo"]["lr"] for c in members_cfg] == lrs  # each member's start, runnable alone
    assert all(c["population"]["members"] == 0 for c in members_cfg)
    assert yaml.safe_load((run_dir(cfg) / "config.yaml").read_text())["population"]["members"] == 4


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
