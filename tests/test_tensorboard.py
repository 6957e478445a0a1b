"""TensorBoard event files beside metrics.h5: the same scalars under the groups SB3 and CleanRL
users know (episode/, losses/, perf/, train/), step = frames, the config as text, no repeated
steps after a resume. Read back with TensorBoard's own EventAccumulator."""
import numpy as np
import yaml
from tensorboard.backend.event_processing.event_accumulator import SCALARS, TENSORS, EventAccumulator

from hpcrl.io.metrics import MetricsWriter, read_metrics, rebuild_metrics
from hpcrl.io.tensorboard import tag_of
from tests.conftest import mpirun, run_dir, small_config, write_config


def scalars(log_dir) -> dict[str, tuple[list[int], np.ndarray]]:
    acc = EventAccumulator(str(log_dir), size_guidance={SCALARS: 0})  # 0: keep every event
    acc.Reload()
    return {tag: ([e.step for e in acc.Scalars(tag)], np.array([e.value for e in acc.Scalars(tag)]))
            for tag in acc.Tags()["scalars"]}


def assert_same_as_metrics(log_dir, metrics: dict) -> None:
    seen = scalars(log_dir)
    expected = {tag_of(key): key for key, series in metrics.items()
                if series.ndim == 1 and tag_of(key) and np.isfinite(series.astype(np.float64)).any()}
    assert set(seen) == set(expected)
    for tag, key in expected.items():
        steps, values = seen[tag]
        # NaN is no value (an update without finished episodes): no point there
        has_value = ~np.isnan(metrics[key].astype(np.float64))
        assert steps == metrics["frames"][has_value].tolist(), key
        # TensorBoard keeps float32
        np.testing.assert_array_equal(values, metrics[key][has_value].astype(np.float32), err_msg=key)


def test_a_resumed_writer_replaces_the_rows_cut_after_the_checkpoint(tmp_path):
    path = str(tmp_path / "metrics.h5")
    first = MetricsWriter(path, tensorboard_dir=str(tmp_path))
    for v in (1, 2, 3, 4):  # the run wrote versions 3 and 4 after its checkpoint at 2, then died
        first.append({"frames": 100 * v, "policy_version": v, "return_mean": float(v)})
    first.close()
    rebuild_metrics(path, through_version=2)
    resumed = MetricsWriter(path, resume=True, tensorboard_dir=str(tmp_path))
    for v in (3, 4, 5):  # the resumed run's own versions 3-5 (different returns)
        resumed.append({"frames": 100 * v, "policy_version": v, "return_mean": 10.0 * v})
    resumed.close()
    steps, values = scalars(tmp_path)["episode/return_mean"]
    assert steps == [100, 200, 300, 400, 500]
    assert values.tolist() == [1.0, 2.0, 30.0, 40.0, 50.0]
    assert_same_as_metrics(tmp_path, read_metrics(path))


def test_a_real_run_and_its_resume_write_the_metrics_rows_as_scalars(tmp_path):
    cfg = small_config(tmp_path, run={"total_frames": 640})
    path = str(write_config(tmp_path, cfg))
    assert mpirun(1, "run", path).returncode == 0
    resumed = mpirun(1, "run", path, "--set", "run.total_frames=1280")
    assert resumed.returncode == 0, resumed.stderr
    directory = run_dir(cfg)
    assert len(list(directory.glob("events.out.tfevents.*"))) == 2  # one file per session
    metrics = read_metrics(str(directory / "metrics.h5"))
    assert metrics["frames"][-1] == 1280 and len(metrics["frames"]) == 20
    assert_same_as_metrics(directory, metrics)
    tags = set(scalars(directory))  # issue 46, item 10: groups, and no frames or wall_time of their own
    assert {"episode/return_window_mean", "losses/loss_policy", "losses/approx_kl", "perf/fps", "train/lr",
            "train/policy_version"} <= tags and not {"frames", "wall_time", "train/frames", "train/wall_time"} & tags
    assert {tag.split("/")[0] for tag in tags} == {"episode", "losses", "perf", "train"}
    acc = EventAccumulator(str(directory), size_guidance={TENSORS: 0})
    acc.Reload()
    texts = [e.tensor_proto.string_val[0].decode() for e in acc.Tensors("config")]
    assert len(texts) == 2  # one per session, its own config
    written = yaml.safe_load("\n".join(line[4:] for line in texts[-1].splitlines()))  # a Markdown code block
    assert written == yaml.safe_load((directory / "config.yaml").read_text()) and written["run"]["total_frames"] == 1280


def test_run_tensorboard_false_writes_no_event_files(tmp_path):
    cfg = small_config(tmp_path, run={"total_frames": 128, "tensorboard": False})
    assert mpirun(1, "run", str(write_config(tmp_path, cfg))).returncode == 0
    directory = run_dir(cfg)
    assert (directory / "metrics.h5").exists() and not list(directory.glob("events.out.tfevents.*"))


def test_every_metrics_key_has_its_group():
    assert [tag_of(k) for k in ("return_window_mean", "loss_value", "td_error", "fps", "replay_size", "lr", "eps_min",
                                "selfplay.games", "anchor.one_step.win_rate", "rating", "frames", "wall_time")] == [
        "episode/return_window_mean", "losses/loss_value", "losses/td_error", "perf/fps", "perf/replay_size",
        "train/lr", "train/eps_min", "selfplay/games", "anchors/one_step/win_rate", "train/rating", None, None]
