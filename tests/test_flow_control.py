"""The sample stream's credits bound what a learner holds, whatever the fan-in and the MPI eager
limit: 32 fast env ranks with records far below the eager limit, against a deliberately slow
learner (many epochs per update), on 34 oversubscribed ranks (the suite's scale run)."""
import numpy as np

from hpcrl.core.messages import fragment_spec
from hpcrl.io.metrics import read_metrics
from tests.conftest import mpirun, run_dir, small_config, write_config

ACTORS, SLOTS, T, N = 32, 40, 8, 2


def test_a_slow_learner_holds_at_most_its_sample_slots_and_fast_env_ranks_wait_for_credit(tmp_path):
    record = fragment_spec(T, N, (4,), "float32", (), "int64").nbytes
    assert record < 4096  # below Open MPI's shared-memory eager limit: sends complete unreceived
    cfg = small_config(tmp_path, run={"total_frames": 12 * ACTORS * T * N, "log_interval_s": 60},
                       roles={"learner": {"ranks": 1, "sample_slots": SLOTS}, "inference": {"ranks": 1},
                              "env": {"ranks": "rest"}},
                       env={"id": "CartPole-v1", "num_envs": N},
                       algo={"mode": "async", "rollout_length": T, "epochs": 16, "num_minibatches": 8})
    result = mpirun(2 + ACTORS, "run", str(write_config(tmp_path, cfg)), timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    m = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    assert len(m["frames"]) >= 10
    assert np.all(m["sample_slots_max"] <= SLOTS)  # the configured bound, never more in flight or held
    assert m["sample_slots_max"][-1] >= ACTORS  # a whole batch was held at once
    # the env ranks outrun the learner, so they spent most of each fragment waiting for a credit
    assert np.median(m["env_credit_wait_fraction"][2:]) > 0.5, m["env_credit_wait_fraction"]
    # resident memory after warm-up stays flat: no queue grows with the fan-in or the run's length
    assert m["learner_rss_mib"][-1] - m["learner_rss_mib"][2] < 32, m["learner_rss_mib"]
