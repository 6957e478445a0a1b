"""run.eval: a learner root's evaluations during training (workers/evaluator.py), their config,
and the metrics series they add to a resumed run's file. A real run's evaluations are checked in
tests/test_run_tools.py (the shipped CartPole job)."""
import math

import numpy as np
import pytest
import torch
import yaml

from hpcrl.core.config import ConfigError, parse_config
from hpcrl.envs import env_spaces
from hpcrl.io.metrics import MetricsWriter, read_metrics
from hpcrl.io.tensorboard import tag_of
from hpcrl.models import build_policy
from hpcrl.workers.evaluator import SERIES, Evaluator
from tests.conftest import small_config


def _config(tmp_path, **run):
    cfg = small_config(tmp_path, run={"eval": {"every_frames": 1000, "episodes": 3, **run}})
    return parse_config(yaml.safe_dump(cfg))


def test_an_evaluation_comes_once_per_multiple_passed_and_repeats(tmp_path):
    cfg = _config(tmp_path)
    spaces = env_spaces(cfg.env)
    torch.manual_seed(0)
    model = build_policy(spaces, cfg)
    beats = []
    evaluator = Evaluator(cfg, spaces, frames=0, heartbeat=lambda: beats.append(1))
    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()[1].copy()
    rows = {frames: evaluator.after_update(frames, model) for frames in (512, 1024, 1536, 3072)}
    assert set(rows[512]) == set(SERIES) and all(math.isnan(v) for v in rows[512].values())
    assert all(math.isnan(v) for v in rows[1536].values())  # the multiple 1,000 was evaluated at 1,024 already
    for frames in (1024, 3072):  # 3,072 passes 2,000 and 3,000 at once: one evaluation
        assert all(math.isfinite(v) for v in rows[frames].values()), rows
        assert rows[frames]["eval_length_mean"] >= 8  # CartPole: no episode ends sooner
    assert len(beats) == round(3 * rows[1024]["eval_length_mean"] + 3 * rows[3072]["eval_length_mean"])
    # the training's random streams are left as they were
    assert torch.equal(torch.get_rng_state(), torch_state) and np.array_equal(np.random.get_state()[1], numpy_state)

    # a resumed run (another evaluator, its first frames past the checkpoint's 1,024) evaluates as
    # the uninterrupted one did: nothing at 1,536, the same episodes at 3,072
    resumed = Evaluator(cfg, spaces, frames=1024)
    assert all(math.isnan(v) for v in resumed.after_update(1536, model).values())
    assert resumed.after_update(3072, model) == rows[3072]


def test_deterministic_play_takes_the_most_likely_action(tmp_path):
    greedy, sampled = _config(tmp_path), _config(tmp_path, deterministic=False)
    spaces = env_spaces(greedy.env)
    torch.manual_seed(0)
    model = build_policy(spaces, greedy)
    with torch.no_grad():  # a policy that pushes left 73% of the time: greedy play falls within a few steps
        model.actor[-1].bias.copy_(torch.tensor([0.5, -0.5]))
    g = Evaluator(greedy, spaces, 0).play(model, 1)
    s = Evaluator(sampled, spaces, 0).play(model, 1)
    assert g == Evaluator(greedy, spaces, 0).play(model, 1)  # the same seeds, the same episodes
    assert max(g[1]) <= 12 and g != s


@pytest.mark.parametrize("run,message", [
    ({"eval": {"episodes": 0}}, "run.eval.episodes: expected 1 to 100,000, got 0"),
    ({"eval": {"every_frames": -5}}, "run.eval.every_frames: expected"),
    ({"eval": {"every_franes": 5}}, "every_frames"),
])
def test_eval_settings_out_of_range_are_refused(tmp_path, run, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        parse_config(yaml.safe_dump(small_config(tmp_path, run=run)))


def test_eval_of_several_policies_is_refused_with_what_to_do_instead(tmp_path):
    cfg = small_config(tmp_path, run={"eval": {"every_frames": 1000}},
                       env={"id": "pettingzoo.classic.connect_four_v3", "num_envs": 4},
                       algo={"name": "ippo"})
    cfg["policies"] = {"first": "player_0", "second": "player_1"}
    with pytest.raises(ConfigError, match="run.eval: an evaluation plays one policy, and this config trains 2 "
                                          r"\(first, second\).*hpcrl eval --opponent"):
        parse_config(yaml.safe_dump(cfg))


def test_evaluations_are_tensorboard_group_eval():
    assert tag_of("eval_return_mean") == "eval/return_mean"
    assert tag_of("eval_length_mean") == "eval/length_mean"


def test_a_resume_that_adds_or_drops_float_series_keeps_every_row_whole(tmp_path):
    path = str(tmp_path / "metrics.h5")
    w = MetricsWriter(path)
    for i in range(3):
        w.append({"frames": 100 * (i + 1), "policy_version": i + 1, "loss": 0.5})
    w.close()
    w = MetricsWriter(path, resume=True)  # run.eval turned on, loss gone (another algorithm's step)
    w.append({"frames": 400, "policy_version": 4, "eval_return_mean": 9.0})
    w.close()
    m = read_metrics(path)
    assert m["frames"].tolist() == [100, 200, 300, 400]
    assert np.isnan(m["eval_return_mean"][:3]).all() and m["eval_return_mean"][3] == 9.0
    assert m["loss"][:3].tolist() == [0.5] * 3 and np.isnan(m["loss"][3])

    w = MetricsWriter(path, resume=True)  # an integer series cannot be left out: refused, as before
    with pytest.raises(ValueError, match="metrics row keys changed"):
        w.append({"frames": 500, "eval_return_mean": 1.0, "loss": 0.1})
    w.close()
