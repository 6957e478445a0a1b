"""The registry: every algorithm names a worker class for every YAML role, and its declaration is
complete (streams, record and reply layouts, batch source and trainer step that import); a config
that names an algorithm outside the registry is refused with the valid names."""
import pytest

from hpcrl.core.config import ROLE_NAMES, ConfigError, parse_config
from hpcrl.core.dataflow import ALGORITHMS, POLICY_KINDS, STREAM_KINDS, inference_messages
from hpcrl.envs import probe_spaces


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_each_algorithm_has_a_worker_class_for_every_role_that_builds_from_the_wiring(name):
    algorithm = ALGORITHMS[name]
    assert set(algorithm.workers) == set(ROLE_NAMES)
    for role in ROLE_NAMES:
        cls = algorithm.worker_class(role)
        assert cls.name == role and callable(getattr(cls, "build")) and callable(getattr(cls, "poll"))


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_each_algorithm_declares_a_complete_dataflow(name):
    algorithm = ALGORITHMS[name]
    assert algorithm.modes and algorithm.policy in POLICY_KINDS
    kinds = [s.kind for s in algorithm.streams]
    assert set(kinds) <= set(STREAM_KINDS) and len(kinds) == len(set(kinds))
    for stream in algorithm.streams:
        assert stream.source in algorithm.workers and stream.sink in (*algorithm.workers, "*"), stream
    cfg = parse_config(f"algo: {{name: {name}}}")
    spaces = probe_spaces(cfg.env)
    record = algorithm.record(cfg, spaces)
    request, reply = inference_messages(cfg, spaces, groups=2)
    for message in (record, request, reply):
        assert message.header[0] == "policy_id"  # several policies share the streams
    assert reply.field("final_values").shape == (cfg.env.num_envs // 2,)  # the requests' final observations
    step, source = algorithm.load("step"), algorithm.load("batch_source")
    assert callable(step) and callable(getattr(source, "from_config")) and isinstance(step.progress, str)


def test_an_algorithm_outside_the_registry_is_refused_with_the_valid_names():
    with pytest.raises(ConfigError, match=r"algo.name: expected one of 'ppo', 'mappo', 'ippo', 'dqn', got 'sac'"):
        parse_config("algo: {name: sac}")
