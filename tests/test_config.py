"""Config validation: every user mistake gets a message naming the key and what would be valid."""
import pytest

from hpcrl.core.config import ConfigError, load_config, parse_config, to_yaml
from hpcrl.core.layout import resolve_role_counts
from tests.conftest import REPO, mpirun


def error_of(text: str, *overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="job.yaml", overrides=overrides)
    return str(info.value)


def test_defaults_and_shipped_jobs_are_valid():
    cfg = parse_config("")
    assert cfg.env.id == "CartPole-v1" and cfg.roles.env.ranks == "rest"
    for path in sorted((REPO / "jobs").glob("*.yaml")):
        load_config(str(path))


def test_unknown_key_names_the_closest_valid_key():
    msg = error_of("algo:\n  gama: 0.9\n")
    assert "unknown key 'algo.gama'" in msg and "did you mean 'gamma'" in msg and msg.startswith("job.yaml:")


def test_unknown_section_is_named():
    msg = error_of("rnu:\n  name: x\n")
    assert "unknown key 'rnu'" in msg and "did you mean 'run'" in msg


def test_wrong_type_names_key_and_expected_type():
    msg = error_of("run:\n  total_frames: lots\n")
    assert "run.total_frames: expected an integer, got 'lots'" in msg
    assert "expected true/false" in error_of("algo:\n  norm_adv: 3\n")


def test_ranges_and_choices():
    assert "algo.gamma: expected a number in [0, 1], got 1.5" in error_of("algo: {gamma: 1.5}")
    assert "roles.learner.device: expected one of cpu, cuda, got 'tpu'" in error_of(
        "roles: {learner: {ranks: 1, device: tpu}}")
    assert "algo.mode: expected 'sync'" in error_of("algo: {mode: turbo}")
    assert "env.num_envs: expected 1 to 65,536, got 0" in error_of("env: {num_envs: 0}")
    assert "run.total_frames: expected a positive integer" in error_of("run: {total_frames: 0}")
    assert "roles.env.ranks: expected a count >= 0 or 'rest', got -1" in error_of("roles: {env: {ranks: -1}}")
    assert "at least 1 learner rank" in error_of("roles: {learner: {ranks: 0}}")
    assert "only one role may use ranks: rest" in error_of(
        "roles: {inference: {ranks: rest}, env: {ranks: rest}}")
    assert "model.hidden_sizes: expected a list of 1 to 64 widths, each 1 to 65,536" in error_of("model: {hidden_sizes: [64, 0]}")
    assert "cannot be cut from one fragment of 8 frames" in error_of(
        "algo: {rollout_length: 2, num_minibatches: 9}\nenv: {num_envs: 4}")


def test_the_schedule_names_live_keys_and_rising_steps_within_each_keys_range():
    from hpcrl.core.config_schedule import factors, scheduled
    cfg = parse_config("algo: {ent_coef: 0.05, schedule: {ent_coef: [[100, 0.2], [300, 0.04]], lr: [[0, 2.0]]}}")
    assert [factors(cfg.algo.schedule, f)["ent_coef"] for f in (0, 99, 100, 299, 300, 10**9)] == \
        [1.0, 1.0, 0.2, 0.2, 0.04, 0.04]
    now = scheduled(cfg.algo, 150)
    assert now.ent_coef == pytest.approx(0.01) and now.lr == pytest.approx(6e-4) and cfg.algo.ent_coef == 0.05
    plain = parse_config("").algo
    assert scheduled(plain, 150) is plain  # no schedule: no copy
    assert "algo.schedule: 'epochs' is not a hyperparameter algo.name ppo reads live; expected one of lr, " \
           "ent_coef" in error_of("algo: {schedule: {epochs: [[10, 2]]}}")
    assert "'ent_coef' is not a hyperparameter algo.name dqn reads live; expected one of lr, max_grad_norm" in \
        error_of("algo: {name: dqn, schedule: {ent_coef: [[10, 0.5]]}}")
    assert "algo.schedule.ent_coef[1]: expected a whole number of frames above the step before (100), got 100" \
        in error_of("algo: {schedule: {ent_coef: [[100, 0.5], [100, 0.1]]}}")
    assert "algo.schedule.ent_coef[0]: expected a step [frames, factor], e.g. [1200000, 0.2], got 0.5" in error_of(
        "algo: {schedule: {ent_coef: [0.5]}}")
    assert "algo.schedule.ent_coef: expected a list of 1 to 1,000 steps" in error_of(
        "algo: {schedule: {ent_coef: []}}")
    assert "got '2e-1' (YAML reads 2e-1 as text; write it as 2.0e-1)" in error_of(
        "algo: {schedule: {ent_coef: [[10, 2e-1]]}}")
    assert error_of("algo: {schedule: {ent_coef: [[10, lots]]}}").endswith("got 'lots'")
    assert "algo.schedule.lr[0]: algo.lr must stay > 0, so its factor must be > 0, got 0" in error_of(
        "algo: {schedule: {lr: [[10, 0]]}}")
    assert "algo.schedule.gamma[0]: algo.gamma 0.99 x 1.5 = 1.485 is above 1" in error_of(
        "algo: {schedule: {gamma: [[10, 1.5]]}}")


def test_env_backend_preset_and_atari_options_are_checked():
    assert "env.backend: expected one of sync, numpy, envpool, got 'gpu'" in error_of("env: {backend: gpu}")
    assert "env.preset: expected null or one of atari, got 'mujoco'" in error_of("env: {preset: mujoco}")
    assert "env.atari.frame_stack: expected 1 to 64, got 0" in error_of(
        "env: {id: ALE/Pong-v5, preset: atari, atari: {frame_stack: 0}}")
    assert "env.atari.repeat_action_probability: expected a number in [0, 1]" in error_of(
        "env: {id: ALE/Pong-v5, preset: atari, atari: {repeat_action_probability: 2}}")
    assert "unknown key 'env.atari.frameskip'; did you mean 'frame_skip'" in error_of(
        "env: {preset: atari, atari: {frameskip: 4}}")


def test_role_counts_per_node_and_fan_in_limits():
    assert "roles.inference: set either ranks (a total) or per_node (on every node), not both" in error_of(
        "roles: {inference: {ranks: 2, per_node: 1}}")
    assert "roles.learner.per_node: expected >= 1, got 0" in error_of("roles: {learner: {per_node: 0}}")
    assert "roles.env.max_env_ranks: only learner and inference ranks serve env ranks" in error_of(
        "roles: {env: {ranks: rest, max_env_ranks: 4}}")
    cfg = parse_config("roles: {learner: {device: cpu}, inference: {per_node: 1}}")
    assert cfg.roles.learner.ranks == 1 and cfg.roles.inference.ranks is None  # defaults resolved
    assert cfg.roles.env.ranks == "rest"


def test_not_yaml_and_not_a_mapping():
    assert "not valid YAML" in error_of("run: [unclosed")
    assert "expected a mapping of sections" in error_of("- a\n- b\n")


def test_overrides_apply_and_are_checked():
    cfg = parse_config("", overrides=("run.total_frames=5000", "env.id=Acrobot-v1"))
    assert cfg.run.total_frames == 5000 and cfg.env.id == "Acrobot-v1"
    assert "expected KEY=VALUE" in error_of("", "run.total_frames")
    assert "unknown key 'run.totl_frames'" in error_of("", "run.totl_frames=3")


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(str(tmp_path / "nope.yaml"))


@pytest.mark.parametrize("text", ["", "\n# only a comment\n", "~\n"])
def test_an_empty_config_file_is_refused_not_trained_as_defaults(tmp_path, text):
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="is empty .* e.g. start from jobs/cartpole_ppo.yaml"):
        load_config(str(path))
    path.write_text("- run\n- env\n")  # a top level that is not a mapping
    with pytest.raises(ConfigError, match="expected a mapping of sections"):
        load_config(str(path))


@pytest.mark.parametrize("text, given", [
    ("run:\n  total_frames: 100\n", "has no env section"),
    ("run:\n  total_frames: 100\nenv:\n", "has an empty env section"),
    ("env:\n  num_envs: 2\n", "has an env section without an id"),
])
def test_a_config_file_that_names_no_env_is_refused_not_trained_on_cartpole(tmp_path, text, given):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert str(info.value).startswith(f"{path}: env.id: the config {given}, so it names no environment")
    assert "e.g. 'env: {id: CartPole-v1}'" in str(info.value)
    assert load_config(str(path), ("env.id=CartPole-v1",))[0].env.id == "CartPole-v1"
    if given == "has no env section":  # the input, run: exit 2, one message, nothing written
        run = mpirun(1, "run", str(path), "--set", f"run.output_dir={tmp_path / 'runs'}")
        assert run.returncode == 2 and run.stdout == "", run.stdout + run.stderr
        assert run.stderr.count("hpcrl: config error:") == 1 and "Traceback" not in run.stderr
        assert not (tmp_path / "runs").exists()


def test_role_counts_that_do_not_fit_name_a_size_that_would():
    fixed = parse_config("roles: {learner: {ranks: 1}, inference: {ranks: 1}, env: {ranks: 2}}").roles
    with pytest.raises(ConfigError, match="exactly 4, but the job has 3 ranks; run with mpirun -n 4"):
        resolve_role_counts(fixed, 3)
    rest = parse_config("roles: {learner: {ranks: 2}, inference: {ranks: 2}, env: {ranks: rest}}").roles
    with pytest.raises(ConfigError, match="at least 5, but the job has 4 ranks"):
        resolve_role_counts(rest, 4)
    assert resolve_role_counts(rest, 9) == {"learner": 2, "inference": 2, "env": 5}


def test_resolved_config_round_trips():
    cfg = parse_config("algo: {lr: 0.01}\nrun: {target_return: 400}")
    assert parse_config(to_yaml(cfg)) == cfg


@pytest.mark.parametrize("text, said, read_by", [
    ("algo: {name: dqn, clip_coef: 0.1}", "algo.clip_coef: set to 0.1, but algo.name dqn does not read it (only ppo, "
                                          "mappo, ippo); remove it, or set algo.name to one of those", "ppo"),
    ("algo: {name: ppo, dqn: {n_step: 5}}", "algo.dqn: set, but algo.name ppo does not read it (only dqn)", "dqn"),
    ("env: {id: Pendulum-v1}\nalgo: {name: td3, max_grad_norm: 1.0}",
     "algo.max_grad_norm: set to 1.0, but algo.name td3 does not read it (only ppo, mappo, ippo, dqn, vdn, qmix)",
     None),
    ("algo: {name: ppo, replay: {capacity: 100000}}", "algo.replay: set, but algo.name ppo does not read it (only dqn, "
                                                      "sac, td3, vdn, qmix)", "dqn"),
    ("algo: {name: dqn, team: {shared: false}}", "algo.team: set, but algo.name dqn does not read it (only vdn, qmix)",
     "qmix"),
])
def test_a_key_the_algorithm_does_not_read_is_refused_with_one_message(text, said, read_by):
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "job.yaml")
    assert str(caught.value).startswith(f"job.yaml: {said}")
    if read_by:  # the same key is taken by an algorithm that reads it
        name = text.split("name: ")[1].split(",")[0]
        assert parse_config(text.replace(f"name: {name},", f"name: {read_by},")).algo.name == read_by


def test_configs_runs_stored_resolved_still_parse_and_new_ones_hold_only_what_is_read():
    """A checkpoint's config from an older version holds every algo key, resolved (value_norm false
    for dqn): stored configs are read leniently, and a default passes anywhere."""
    old = "algo: {name: dqn, value_norm: false, clip_coef: 0.2, epochs: 4, sac: {tau: 0.005}}"
    assert parse_config(old, strict=False).algo.name == "dqn"
    with pytest.raises(ConfigError, match="algo.value_norm: set to False, but algo.name dqn does not read it"):
        parse_config(old)
    cfg = parse_config("algo: {name: dqn, dqn: {n_step: 5}}")
    text = to_yaml(cfg)
    assert "clip_coef" not in text and "epochs" not in text and "sac:" not in text and "n_step: 5" in text
    assert parse_config(text) == cfg


def test_every_declared_range_is_enforced_with_its_own_message():
    """Each key's range sits in its field declaration (core/config_base.py Range), and one checker
    reads them all: a value just outside any declared range is refused, naming the key."""
    import dataclasses
    from hpcrl.core.config import AlgoConfig, RunConfig
    from hpcrl.core.config_dqn import DQNConfig, ReplayConfig
    from hpcrl.core.config_sac import SACConfig
    checked = 0
    for where, cls, around in (("run", RunConfig, "{}"), ("algo", AlgoConfig, "{}"),
                               ("algo.dqn", DQNConfig, "algo: {{name: dqn, dqn: {}}}"),
                               ("algo.replay", ReplayConfig, "algo: {{name: dqn, replay: {}}}"),
                               ("algo.sac", SACConfig, "env: {{id: Pendulum-v1}}\nalgo: {{name: sac, sac: {}}}")):
        for f in dataclasses.fields(cls):
            wanted = f.metadata.get("range")
            if wanted is None:
                continue
            low = wanted.low if wanted.above else wanted.low - 1
            text = (f"{where}: {{{f.name}: {low}}}" if around == "{}" else
                    around.format(f"{{{f.name}: {low}}}"))
            with pytest.raises(ConfigError) as caught:
                parse_config(text, "c.yaml")
            assert str(caught.value).startswith(f"c.yaml: {where}.{f.name}: expected {wanted.expected()}, got"), \
                str(caught.value)
            checked += 1
    assert checked >= 45


@pytest.mark.parametrize("text", ["{}", "algo: {name: dqn}", "env: {id: Pendulum-v1}\nalgo: {name: sac}",
                                  "env: {id: 'mpe2:simple_spread_v3'}\nalgo: {name: mappo}",
                                  "roles: {learner: {per_node: 1}, env: {ranks: rest}}"])
def test_resolve_fills_the_defaults_and_validate_changes_nothing(text):
    import copy
    from hpcrl.core.config import Config, _build, resolve, validate
    from hpcrl.core.config_base import load_yaml
    cfg = _build(Config, load_yaml(text, "c.yaml"), "")
    resolve(cfg)
    assert cfg.algo.mode is not None and cfg.env.groups is not None and cfg.env.global_state is not None
    before = copy.deepcopy(cfg)
    validate(cfg)
    assert cfg == before and cfg == parse_config(text)


@pytest.mark.parametrize("section, key, value, message", [
    ("algo", "lr", "3e-4",
     "job.yaml: algo.lr: expected a finite number, got '3e-4' (YAML reads 3e-4 as text; write it as 3.0e-4)"),
    ("run", "target_return", "4E2", "got '4E2' (YAML reads 4E2 as text; write it as 4.0e+2)"),
    ("run", "total_frames", "1e6", "run.total_frames: expected an integer, got '1e6' (YAML reads 1e6 as text; "
                                   "write it as 1000000)"),
    ("run", "seed", "1.5e0", "got '1.5e0' (YAML reads 1.5e0 as text; an integer is expected here)"),
])
def test_a_number_yaml_reads_as_text_gets_the_spelling_it_reads_as_a_number(section, key, value, message):
    """YAML 1.1 wants a dot in the mantissa and a sign in the exponent: `3e-4` is the string '3e-4'.
    Every numeric key's message says so and gives the spelling that works, which then parses."""
    error = error_of(f"{section}:\n  {key}: {value}\n")
    assert message in error
    if "write it as " in error:
        fixed = error.rsplit("write it as ", 1)[1].rstrip(")")
        parsed = getattr(getattr(parse_config(f"{section}:\n  {key}: {fixed}\n"), section), key)
        assert parsed == float(value)


def test_set_errors_name_the_override_at_fault_in_one_line():
    """Issue 46, item 8: a --set value that is no YAML is one line naming where it breaks (not
    PyYAML's dump of '<unicode string>' with carets); an override that turned a section into a
    value is blamed, not the innocent one after it."""
    bad = error_of("", "algo.lr=[0.1")
    assert bad == ("--set 'algo.lr=[0.1': the value: not valid YAML: line 1, column 5: expected ',' or ']', but got "
                   "'<stream end>' (in a flow sequence that starts at line 1, column 1)")
    assert "\n" not in error_of("algo:\n  lr: [0.1\n") and "<unicode string>" not in error_of("algo: {lr: [0.1")
    blamed = error_of("", "run=5", "run.output_dir=/tmp/x")
    assert blamed.startswith("--set 'run=5': 'run' is a section, a mapping of keys; set one of them instead, "
                             "e.g. --set run.KEY=VALUE (got 5)"), blamed
    assert error_of("env: {id: CartPole-v1}", "env.id.x=1") == \
        "--set env.id.x: 'env.id' is 'CartPole-v1' in the config, not a section of keys"
    assert parse_config("env:\n", overrides=("env.id=Acrobot-v1",)).env.id == "Acrobot-v1"  # an empty section
