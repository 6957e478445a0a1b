"""The registry: every YAML role has a worker class, every algorithm's declaration is complete
(workers, streams, record layout, batch source and trainer step that import), and a config that
names an algorithm outside the registry is refused with the valid names."""
import pytest

from hpcrl.core.config import ROLE_NAMES, ConfigError, parse_config
from hpcrl.core.dataflow import ALGORITHMS, STREAM_KINDS
from hpcrl.envs import probe_spaces
from hpcrl.runtime.wiring import WORKERS, worker_class


def test_every_role_of_the_config_has_a_worker_class_that_builds_from_the_wiring():
    assert set(WORKERS) == set(ROLE_NAMES)
    for role in ROLE_NAMES:
        cls = worker_class(role)
        assert cls.name == role and callable(getattr(cls, "build")) and callable(getattr(cls, "poll"))


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_each_algorithm_declares_a_complete_dataflow(name):
    algorithm = ALGORITHMS[name]
    assert algorithm.modes and set(algorithm.workers) <= set(ROLE_NAMES)
    kinds = [s.kind for s in algorithm.streams]
    assert set(kinds) <= set(STREAM_KINDS) and len(kinds) == len(set(kinds))
    for stream in algorithm.streams:
        assert stream.source in algorithm.workers and stream.sink in (*algorithm.workers, "*"), stream
    cfg = parse_config(f"algo: {{name: {name}}}")
    record = algorithm.record(cfg, probe_spaces(cfg.env))
    assert record.header[0] == "policy_id"  # several policies share the streams
    step, source = algorithm.load("step"), algorithm.load("batch_source")
    assert callable(step) and callable(getattr(source, "from_config"))


def test_an_algorithm_outside_the_registry_is_refused_with_the_valid_names():
    with pytest.raises(ConfigError, match=r"algo.name: expected one of 'ppo', got 'dqn'"):
        parse_config("algo: {name: dqn}")
