"""Hostile or careless config files (issue 25): each is one clear ConfigError naming the key
and what would be valid, before anything is allocated or written, never a traceback."""
import subprocess
import sys
import textwrap

import pytest

from hpcrl.core.config import ConfigError, load_config, parse_config
from hpcrl.envs import env_spaces
from tests.conftest import REPO, mpirun, run_dir, small_config, write_config


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="job.yaml")
    return str(info.value)


def test_bytes_that_are_not_utf8_name_the_file_and_the_offset(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_bytes(b"run:\n  name: caf\xe9\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert f"config file '{path}' is not UTF-8 text: byte 0xe9 at offset 16 (line 2)" in str(info.value)


# nine levels of ten aliases: 10**9 strings (over 8 GB of list slots) when anything walks it whole
BOMB = "env:\n  kwargs:\n    l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 9))


def test_a_billion_laughs_alias_bomb_is_refused_not_expanded():
    # under a 1 GiB address-space limit, so code that expands the bomb fails fast instead of
    # taking the machine's memory
    script = textwrap.dedent(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))
        from hpcrl.core.config import ConfigError, parse_config
        try:
            parse_config({BOMB!r}, source="job.yaml")
        except ConfigError as exc:
            print(exc)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "job.yaml: line 7: env.kwargs.l4: holds more than 100,000 values once its aliases (*name) are expanded" \
        in result.stdout


def test_an_alias_inside_its_own_value_is_refused():
    assert "job.yaml: line 1: model.hidden_sizes[1]: holds an alias (*name) of itself" in error_of(
        "model: {hidden_sizes: &h [64, *h]}")


def test_aliases_that_expand_a_little_still_work():
    cfg = parse_config("env: {kwargs: {sizes: &s [32, 32]}}\nmodel: {hidden_sizes: *s}")
    assert cfg.model.hidden_sizes == [32, 32]


def test_an_error_shows_a_big_value_cut_short():
    message = error_of("model: {hidden_sizes: [" + ", ".join(["64"] * 5000) + ", 0]}")
    assert "model.hidden_sizes: expected a list of 1 to 64 widths, each 1 to 65,536, got [64, 64" in message
    assert len(message) < 500


@pytest.mark.parametrize("text, message", [
    ("env: {num_envs: 1000000000}", "env.num_envs: expected 1 to 65,536, got 1000000000"),
    ("algo: {rollout_length: 1000000000}", "algo.rollout_length: expected 1 to 65,536, got 1000000000"),
    ("model: {hidden_sizes: [64, 1000000000]}",
     "model.hidden_sizes: expected a list of 1 to 64 widths, each 1 to 65,536, got [64, 1000000000]"),
    ("model: {core: lstm, core_size: 1000000000}", "model.core_size: expected 1 to 65,536, got 1000000000"),
    ("run: {seed: -1}", "run.seed: expected 0 to 2**63 - 1 (9223372036854775807), got -1"),
    ("run: {seed: 1180591620717411303424}",
     "run.seed: expected an integer from -2**63 to 2**63 - 1, got 1180591620717411303424"),
    ("run: {seed: 1" + "0" * 5000 + "}", "job.yaml: line 1: run.seed: an integer of 5,001 characters"),
    ("env: {kwargs: {max_episode_steps: -1}}",
     "env.kwargs.max_episode_steps: expected a positive number of steps, or null (the env's own limit), got -1"),
    ("env: {kwargs: {max_episode_steps: 0}}", "env.kwargs.max_episode_steps: expected a positive number"),
    ("run: {target_return: .nan}", "run.target_return: expected a finite number or null, got nan"),
    ("run: {target_return: -.inf}", "run.target_return: expected a finite number or null, got -inf"),
    ("algo: {clip_coef: .nan}", "algo.clip_coef: expected a finite number, got nan"),
    ("algo: {dqn: {eps_alpha: .inf}}", "algo.dqn.eps_alpha: expected a finite number, got inf"),
    ("run: {log_interval_s: .inf}", "run.log_interval_s: expected a finite number, got inf"),
])
def test_sizes_seeds_and_numbers_out_of_range(text, message):
    assert message in error_of(text)


def test_the_seed_range_is_one_every_consumer_takes():
    import torch
    from hpcrl.core.seeds import seed_for
    cfg = parse_config("run: {seed: 9223372036854775807}")
    torch.manual_seed(cfg.run.seed)  # the learner's and the policy servers' initial weights
    assert 0 <= seed_for(cfg.run.seed, "env", 10**6, 7, 10**4) < 2**64


@pytest.mark.parametrize("text, message", [
    ("run: {name: a}\nenv: {num_envs: 2}\nrun: {name: b}\n", "job.yaml: run: given twice, at lines 1 and 3"),
    ("algo:\n  lr: 0.1\n  gamma: 0.9\n  lr: 0.2\n", "job.yaml: algo.lr: given twice, at lines 2 and 4"),
    ("env:\n  kwargs:\n    x: 1\n    x: 2\n", "job.yaml: env.kwargs.x: given twice, at lines 3 and 4"),
])
def test_a_key_given_twice_names_both_lines(text, message):
    assert message + " (YAML would quietly keep the last); keep one" in error_of(text)


def test_merged_keys_may_still_be_overridden():
    cfg = parse_config("env: {kwargs: {shared: &base {lr: 0.1, gamma: 0.9}}}\nalgo: {<<: *base, lr: 0.2}")
    assert (cfg.algo.lr, cfg.algo.gamma) == (0.2, 0.9)


def test_memory_beyond_the_limit_names_the_key_that_drives_it():
    from hpcrl.core.layout import plan_layout
    from hpcrl.core.sizing import Sizes, memory_problem
    from hpcrl.core.network_shapes import policy_params

    def problem_of(cfg):
        spaces, layout = env_spaces(cfg.env), plan_layout(cfg.roles, 4)
        return memory_problem(cfg, layout, Sizes.of(cfg, layout), spaces, policy_params(cfg, spaces))
    cfg = parse_config("run: {memory_limit_gib: 1}\nmodel: {hidden_sizes: [65536, 65536]}")
    problem = problem_of(cfg)
    assert problem.startswith("model.hidden_sizes: each learner rank would need about 192.0 GiB")
    assert "(8,590,917,635 parameters), more than the 1.0 GiB one rank may use (run.memory_limit_gib)" in problem
    cfg = parse_config("run: {memory_limit_gib: 1}\nenv: {num_envs: 4096}\nalgo: {rollout_length: 4096}")
    assert problem_of(cfg).startswith(
        "env.num_envs x algo.rollout_length: each learner rank would need about")
    cfg = parse_config("run: {memory_limit_gib: 1}")
    assert problem_of(cfg) is None


@pytest.mark.parametrize("how", ["layer of 10**9", "not utf-8"])
def test_run_refuses_before_writing_anything(tmp_path, how):
    cfg = small_config(tmp_path, roles={"inference": {"ranks": 0}})
    path = tmp_path / "job.yaml"
    if how == "not utf-8":
        write_config(tmp_path, cfg, "job.yaml")
        path.write_bytes(path.read_bytes().replace(b"CartPole", b"Cart\xffPole"))
        expected = "is not UTF-8 text: byte 0xff at offset"
    else:
        cfg["model"]["hidden_sizes"] = [10**9]
        write_config(tmp_path, cfg, "job.yaml")
        expected = "model.hidden_sizes: expected a list of 1 to 64 widths, each 1 to 65,536, got [1000000000]"
    result = mpirun(1, "run", str(path))
    assert result.returncode == 2 and expected in result.stderr, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert not run_dir(cfg).exists() and not (tmp_path / "runs").exists()
