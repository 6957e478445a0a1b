"""The registry: every YAML role has a worker class, every algorithm's declaration is complete
(streams, record and reply layouts, and names of a record writer, batch source and trainer step that
launch/registry.py binds to classes that import and meet their contracts); a config that names an
algorithm outside the registry is refused with the valid names."""
import inspect

import pytest

from hpcrl.core.config import ROLE_NAMES, ConfigError, parse_config
from hpcrl.core.contracts import BatchSource, TrainerStep, Worker
from hpcrl.core.dataflow import ALGORITHMS, POLICY_KINDS, STREAM_KINDS, inference_messages
from hpcrl.envs import env_spaces
from hpcrl.launch.registry import BATCH_SOURCES, RECORD_WRITERS, STEPS, WORKERS, Parts


def test_every_role_has_a_worker_class_that_builds_from_the_wiring():
    assert set(WORKERS) == set(ROLE_NAMES)
    for role in ROLE_NAMES:
        cls = Parts(ALGORITHMS["ppo"]).worker(role)
        assert cls.name == role and callable(getattr(cls, "build")) and callable(getattr(cls, "poll"))


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_each_algorithm_declares_a_complete_dataflow(name):
    algorithm = ALGORITHMS[name]
    assert algorithm.modes and algorithm.policy in POLICY_KINDS
    kinds = [s.kind for s in algorithm.streams]
    assert set(kinds) <= set(STREAM_KINDS) and len(kinds) == len(set(kinds))
    for stream in algorithm.streams:
        assert stream.source in ROLE_NAMES and stream.sink in (*ROLE_NAMES, "*"), stream
    cfg = parse_config(f"algo: {{name: {name}}}")
    spaces = env_spaces(cfg.env)
    record = algorithm.record(cfg, spaces)
    request, reply = inference_messages(cfg, spaces, groups=2)
    for message in (record, request, reply):
        assert message.header[0] == "policy_id"  # several policies share the streams
    assert reply.field("final_values").shape == (cfg.env.num_envs // 2,)  # the requests' final observations
    assert algorithm.step in STEPS and algorithm.batch_source in BATCH_SOURCES
    assert algorithm.writer(cfg) in RECORD_WRITERS
    step, source = Parts(algorithm).step(), Parts(algorithm).batch_source()
    assert callable(step) and callable(getattr(source, "from_config")) and isinstance(step.progress, str)


def unmet(cls: type, protocol: type) -> list[str]:
    """What `cls` lacks of `protocol` (core/contracts.py): a method, a parameter a caller passes by
    name, or an attribute (class-level, or assigned in the source of the class or a base)."""
    problems = []
    source = "".join(inspect.getsource(c) for c in cls.__mro__ if c is not object)
    for name, member in vars(protocol).items():
        if name.startswith("_") and name != "__call__" or name in ("_is_protocol",):
            continue
        wanted = getattr(member, "__func__", member)
        if not callable(wanted):
            continue
        if not callable(getattr(cls, name, None)):
            problems.append(f"{cls.__name__} has no method {name}")
            continue
        have = inspect.signature(getattr(cls, name)).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in have.values())
        asked = list(inspect.signature(wanted).parameters.values())[1:]  # past self / cls
        positional = [p for p in asked if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD]
        bound = isinstance(inspect.getattr_static(cls, name), (classmethod, staticmethod))
        slots = len([p for p in have.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)])
        if slots - (0 if bound else 1) < len(positional):  # (an instance method's self takes a slot)
            problems.append(f"{cls.__name__}.{name} takes fewer than {len(positional)} positional arguments")
        required = [p.name for p in list(have.values())[(0 if bound else 1) + len(positional):]
                    if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                    and p.name not in {a.name for a in asked}]
        if required:
            problems.append(f"{cls.__name__}.{name} requires {required}, which its callers do not pass")
        for param in asked[len(positional):]:  # those passed by name
            if param.kind is param.VAR_KEYWORD:
                continue
            if param.name not in have and not takes_any:
                problems.append(f"{cls.__name__}.{name} takes no {param.name!r}")
    for name in getattr(protocol, "__annotations__", {}):
        if not hasattr(cls, name) and f"self.{name} =" not in source and f"self.{name}, " not in source:
            problems.append(f"{cls.__name__} sets no {name}")
    return problems


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_declared_class_meets_its_contract(name):
    """Worker, BatchSource and TrainerStep (core/contracts.py): what the wiring, the poll loop and
    the trainer call, checked member by member on every class an algorithm declares."""
    parts = Parts(ALGORITHMS[name])
    problems = [p for role in ROLE_NAMES for p in unmet(parts.worker(role), Worker)]
    problems += unmet(parts.batch_source(), BatchSource) + unmet(parts.step(), TrainerStep)
    assert not problems, problems


def test_the_contract_check_finds_what_a_class_lacks():
    class Half:
        name = "env"

        def poll(self, budget):  # a parameter the poll loop never passes
            self.done = False
            return 0

        def __call__(self):  # no batch
            return {}
    assert unmet(Half, Worker) == ["Half has no method build", "Half.poll requires ['budget'], which its callers "
                                   "do not pass", "Half sets no status"]
    assert "Half.__call__ takes fewer than 1 positional arguments" in unmet(Half, TrainerStep)
    assert unmet(Half, BatchSource)[0] == "Half has no method from_config"


def test_an_algorithm_outside_the_registry_is_refused_with_the_valid_names():
    with pytest.raises(ConfigError, match=r"algo.name: expected one of 'ppo', 'mappo', 'ippo', 'dqn', 'sac', 'td3', "
                                          r"'vdn', 'qmix', got 'a2c'"):
        parse_config("algo: {name: a2c}")
