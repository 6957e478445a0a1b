"""Rank-role run configuration: typed dataclasses, YAML loading and validation.

Pure Python (no MPI, no torch): every rank can validate a config, and `hpcrl plan` works on a
laptop. Each field carries its meaning in `metadata["doc"]`; the YAML keys are the field names.
The roles table (config_roles.py), env (config_env.py), model (config_model.py), DQN
(config_dqn.py), self-play (config_selfplay.py) and population (config_population.py) sections
have modules of their own,
with the helpers in config_base.py; this module assembles the whole Config, checks what crosses
sections, and loads it.
"""
from __future__ import annotations

import copy

import dataclasses
import difflib
import sys
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

from hpcrl.core.config_base import (AT_LEAST_ONE, FRACTION, NON_NEGATIVE, POSITIVE, ConfigError, Range, check,
                                    check_ranges, doc, load_yaml, number_as_text_hint, shown)
from hpcrl.core.config_dqn import DQN_ALPHA, DQN_WARMUP, DQNConfig, ReplayConfig, validate_dqn
from hpcrl.core.config_sac import SACConfig, replay_settings, resolve_sac_replay, validate_sac
from hpcrl.core.config_team import TeamConfig, resolve_team_replay, validate_team
# the env and roles sections have modules of their own; every name they had here is re-exported,
# so callers still import any config name from hpcrl.core.config
from hpcrl.core.config_env import (ENV_BACKENDS, ENV_PRESETS, MAX_FRAME_SIZE, MAX_FRAME_STACK,  # noqa: F401
                                   MAX_NUM_ENVS, AtariConfig, EnvConfig, validate_env)
from hpcrl.core.config_roles import (DEFAULT_MAX_ENV_RANKS, DEFAULT_RANKS, DEVICES, REST,  # noqa: F401
                                     ROLE_NAMES, RoleSpec, RolesConfig, validate_roles)
from hpcrl.core.config_wandb import WandbConfig, validate_wandb
from hpcrl.core.config_model import ModelConfig, validate_model
from hpcrl.core.config_population import PopulationConfig, validate_population
from hpcrl.core.config_schedule import validate_schedule
from hpcrl.core.config_selfplay import SelfPlayConfig, validate_selfplay
from hpcrl.core.dataflow import ALGORITHMS, readers
from hpcrl.core.policies import check_table

# Sizes a run allocates from before `hpcrl plan`'s memory estimate can be made (core/sizing.py
# memory_problem bounds their products against run.memory_limit_gib): far above any real run;
# env.num_envs and the Atari frames are bounded in config_env.py
MAX_SEED = 2**63 - 1  # numpy's SeedSequence takes seeds >= 0, torch.manual_seed < 2**64; int64 stores it
MAX_ROLLOUT_LENGTH = 65_536
SECONDS = Range(0, above=True, words="> 0 seconds")
INT64 = 2**63  # config integers fit int64, as numpy and torch take them: no count needs more
ON_POLICY = ("on_policy",)  # algo keys of PPO's loss and batches (core/dataflow.py Algorithm.reads)


@dataclass
class EvalConfig:
    """As SB3's EvalCallback: the learner root plays its policy on an env of its own (metrics.h5: eval_*)."""

    every_frames: int = doc("evaluate each time the run's frames pass a multiple of this; training waits meanwhile "
                            "(0: never)", range=NON_NEGATIVE, default=0)
    episodes: int = doc("whole episodes per evaluation, one after another on one env (seeds of their own)",
                        range=Range(1, 100_000, words="1 to 100,000"), default=5)
    deterministic: bool = doc("play the most likely action (a Q-network's best, a Gaussian's mean); false: sample "
                              "as training does", default=True)


@dataclass
class RunConfig:
    """What the run is called, where it writes, and when it stops."""

    name: str = doc("run name; the run directory is output_dir/name", default="run")
    output_dir: str = doc("directory that holds run directories (relative to the working directory)",
                          default="runs")
    seed: int = doc("base random seed, 0 to 2**63 - 1; each rank and env derives its own from it",
                    range=Range(0, MAX_SEED, words=f"0 to 2**63 - 1 ({MAX_SEED})"), default=1)
    total_frames: int = doc("stop after this many environment steps (summed over all envs)",
                            range=Range(0, above=True, words="a positive integer"), default=100_000)
    target_return: Union[float, None] = doc(
        "stop early once the mean return of the last >= 20 episodes reaches this (null: never)", default=None)
    log_interval_s: float = doc("seconds between progress lines on the learner root", range=SECONDS, default=5.0)
    checkpoint_interval_s: float = doc("seconds between checkpoints (one is always written at the end)",
                                       range=SECONDS, default=300.0)
    hang_timeout_s: float = doc("a rank stuck this long inside one step of its own work (an env step, a "
                                "forward pass, a training minibatch) ends the job with a message naming it; "
                                "a rank that waits twice this long for its peers does too",
                                range=SECONDS, default=300.0)
    peer_timeout_s: float = doc("a rank that hears nothing from a neighbour (its parent or a child on the control "
                                "tree; a heartbeat thread answers even during long steps) for this long takes it "
                                "for lost (its node died, was cut off from the network or is stopped), names it, "
                                "and ends the job on every node it can reach; the ranks of a cut-off node end "
                                "themselves the same way", default=30.0,
                                range=Range(3, words=">= 3 seconds (heartbeats go every peer_timeout_s / 10, at "
                                                     "most every 3 s)"))
    memory_limit_gib: Union[float, None] = doc(
        "the most memory one rank may need for hpcrl's buffers, batch and model, as `hpcrl plan` estimates them "
        "(in GiB); a config that needs more is refused before anything is allocated or written (null: the "
        "physical memory of the node of rank 0, which checks the config)",
        range=Range(0, above=True, words="a number of GiB > 0, or null (the node's memory)"), default=None)
    torch_threads: int = doc("torch intra-op threads on each rank that runs a policy; ranks are the "
                             "parallelism, so 1 unless ranks have spare cores", range=AT_LEAST_ONE, default=1)
    deterministic: bool = doc(
        "policy holders compute each request (one env group's rows) alone, in forward passes of run.inference_block "
        "envs, so an env's actions never depend on which requests arrived together: a sync run with policy servers "
        "repeats bit for bit on the same layout (docs/reproducibility.md), at about 7% of its frames/s "
        "(bench/determinism.py). false: a policy server batches every ready request in one pass; serial runs and "
        "inline policies repeat either way", default=False)
    inference_block: Union[int, None] = doc(
        "with run.deterministic, envs per forward pass on a policy holder (null: a whole request, one env group). "
        "Give layouts with other env-rank counts the same value, a divisor of each one's envs per group, and a "
        "sync run gives the same weights on every one of them", default=None)
    replica_digests: bool = doc("record a digest of every learner's weights and observation-normaliser "
                                "stats after each update in metrics.h5 (checks that learners stay "
                                "bit-identical)", default=False)
    tensorboard: bool = doc("also write every metrics row as TensorBoard scalars (step = frames; groups "
                            "episode/, losses/, perf/, train/, eval/) and the config as text in event files in the "
                            "run directory: tensorboard --logdir runs", default=True)
    eval: EvalConfig = doc("evaluation during training",
                           default_factory=EvalConfig)
    wandb: WandbConfig = doc("Weights & Biases logging (off unless a project is named)", default_factory=WandbConfig)


@dataclass
class AlgoConfig:
    """The algorithm: PPO's hyperparameters at the top (async mode is APPO), DQN's in dqn and replay."""

    name: str = doc("algorithm, from the registry (hpcrl/core/dataflow.py): 'ppo' (PPO in mode sync, APPO in "
                    "mode async), 'mappo' (PettingZoo envs: PPO with a centralised critic on every agent's "
                    "observations of the env), 'ippo' (PettingZoo envs: PPO with each agent's own critic input), "
                    "'dqn' (Ape-X DQN; R2D2 with model.core), 'sac', 'td3', or 'vdn' and 'qmix' (PettingZoo envs: "
                    "the agents' Q-values summed, or mixed by the env's state, into the team's)", default="ppo")
    mode: Union[str, None] = doc(
        "'sync' (PPO): every sample in an update comes from the current policy, and env ranks wait for each new "
        "version; 'async' (APPO/IMPALA, DQN): inference answers with the newest weights it has, env ranks never "
        "wait for the learner (APPO corrects the policy lag with V-trace). 'sync' with dqn, sac and td3 (needs "
        "algo.replay.replay_ratio): in rounds, each env rank collects rollout_length steps per env with one "
        "version, and the learners take a round's records in env-rank order, train the gradient steps the replay "
        "ratio owes and publish the next version, so a run repeats (docs/reproducibility.md). Default: the "
        "algorithm's first mode (ppo: sync, dqn, sac, td3: async)", default=None)
    max_policy_lag: int = doc("async: a fragment whose oldest step was collected more than this many "
                              "policy versions ago is dropped, not trained on (counted in metrics as "
                              "fragments_dropped)", reads=ON_POLICY, range=Range(0, words=">= 0 policy versions"),
                              default=8)
    vtrace_rho_bar: float = doc("async: V-trace clip of the importance weights in the targets and policy "
                                "gradient (rho-bar, Espeholt et al. 2018)", reads=ON_POLICY, range=POSITIVE,
                                default=1.0)
    vtrace_c_bar: float = doc("async: V-trace clip of the trace-cutting weights (c-bar)", reads=ON_POLICY,
                              range=POSITIVE, default=1.0)
    rollout_length: int = doc("steps per env per fragment (T); a fragment is T x num_envs frames",
                              range=Range(1, MAX_ROLLOUT_LENGTH, words=f"1 to {MAX_ROLLOUT_LENGTH:,}"), default=128)
    batch_frames: Union[int, None] = doc(
        "frames per update, all learners together. Async: each learner's batch is batch_frames / learners, "
        "so a multiple of learners x a fragment's frames; sync: every env rank collects batch_frames / env "
        "ranks with each policy version, so a multiple of env ranks x a fragment's frames. Setting it "
        "keeps the algorithm (batch, minibatch size, updates per frame) unchanged across resumes with other "
        "env-rank counts (default null: one fragment per env rank, so the env-rank count sets the batch)",
        reads=ON_POLICY, range=Range(1, words="a positive number of frames or null"), default=None)
    gamma: float = doc("discount factor", range=FRACTION, default=0.99)
    gae_lambda: float = doc("GAE lambda; in async mode also V-trace's lambda (traces "
                            "c_t = lambda * min(c_bar, rho_t))", reads=ON_POLICY, range=FRACTION, default=0.95)
    lr: float = doc("Adam learning rate (per learner; Horovod averages gradients)", range=POSITIVE, default=3e-4)
    lr_schedule: str = doc("'constant', or 'linear' decay to 0 at total_frames", default="constant")
    schedule: dict = doc(
        "steps in live hyperparameters over the run: key (one the algorithm reads live: lr, ent_coef, clip_coef, "
        "vf_coef, max_grad_norm, gamma, gae_lambda for the PPO family) -> a list of [frames, factor]; from that "
        "many frames on (a population member's own), the key is its value times the factor, and before the "
        "first step its value. E.g. ent_coef: [[1200000, 0.2], [1600000, 0.04]]. Factors scale what a "
        "population's values and explore set, and lr's multiply lr_schedule's decay", default_factory=dict)
    clip_coef: float = doc("PPO ratio clipping epsilon", reads=ON_POLICY, range=POSITIVE, default=0.2)
    clip_vloss: bool = doc("clip the value loss around the old values as PPO2 does", reads=ON_POLICY,
                           default=False)
    vf_coef: float = doc("value loss coefficient", reads=ON_POLICY, range=NON_NEGATIVE, default=0.5)
    ent_coef: float = doc("entropy bonus coefficient", reads=ON_POLICY, range=NON_NEGATIVE, default=0.0)
    epochs: int = doc("passes over each batch", reads=ON_POLICY, range=AT_LEAST_ONE, default=4)
    num_minibatches: int = doc("minibatches per epoch on every learner", reads=ON_POLICY, range=AT_LEAST_ONE, default=4)
    max_grad_norm: float = doc("global gradient-norm clip (after Horovod averaging)",
                               reads=("on_policy", "dqn", "team"),
                               range=POSITIVE, default=0.5)
    norm_adv: bool = doc("normalise advantages per minibatch", reads=ON_POLICY, default=True)
    value_norm: Union[bool, None] = doc(
        "train the critic on returns normalised by their running mean and std (kept in the model, so policy "
        "servers report values in return units); MAPPO's recommendation (Yu et al. 2022). Default: true for "
        "mappo and ippo, false for ppo", reads=ON_POLICY, default=None)
    train: bool = doc("false: learners take fragments and count them but do not train (the weights never "
                      "change); measures a layout's sampling throughput (bench/sampling.py)", reads=ON_POLICY,
                      default=True)
    dqn: DQNConfig = doc("DQN only: the Q-learning step and exploration", reads=("dqn",), default_factory=DQNConfig)
    sac: SACConfig = doc("SAC and TD3 only: the continuous-control step and its exploration",
                         reads=("sac",), default_factory=SACConfig)
    team: TeamConfig = doc("VDN and QMIX only: the agents' networks, their mixing, exploration and episodes",
                           reads=("team",), default_factory=TeamConfig)
    replay: ReplayConfig = doc("DQN, SAC, TD3, VDN and QMIX: the prioritized replay shards", reads=("replay",),
                               default_factory=ReplayConfig)
    selfplay: SelfPlayConfig = doc("multi-agent games: self-play against a pool of frozen past versions",
                                   default_factory=SelfPlayConfig)


@dataclass
class Config:
    """A whole hpcrl run: the rank-role table plus what each role needs."""

    run: RunConfig = doc("run name, budget, output", default_factory=RunConfig)
    roles: RolesConfig = doc("which ranks do what", default_factory=RolesConfig)
    env: EnvConfig = doc("environments", default_factory=EnvConfig)
    algo: AlgoConfig = doc("algorithm", default_factory=AlgoConfig)
    model: ModelConfig = doc("policy network", default_factory=ModelConfig)
    policies: dict = doc(
        "multi-agent: policy name -> regular expression on agent names, in order; an agent is acted for and "
        "trained by the first policy whose expression matches its whole name, each policy by its own block of "
        "roles.learner ranks (their count a multiple of the policies'). Empty: one policy for every agent",
        default_factory=dict)
    population: PopulationConfig = doc("population-based training: members side by side, the worst copying "
                                       "the best", default_factory=PopulationConfig)

    @classmethod
    def from_yaml(cls, path: str, overrides: tuple[str, ...] = ()) -> Config:
        """A config file, read and checked as `hpcrl run` reads it, with `KEY=VALUE` overrides as
        --set gives them; a ConfigError says what is wrong and where."""
        return load_config(path, tuple(overrides))[0]

    @classmethod
    def from_dict(cls, data: dict, overrides: tuple[str, ...] = (), source: str = "<dict>") -> Config:
        """A config from a mapping of sections (as the YAML file would hold), checked as a file is."""
        return _config_of(copy.deepcopy(data), source, tuple(overrides))

    def to_dict(self) -> dict:
        """Every key, defaults filled in: what `from_dict` takes back (and config.yaml holds)."""
        return to_dict(self)


# --- building dataclasses from plain YAML data, with errors that name the key --------------------

def _type_name(tp: Any) -> str:
    if get_origin(tp) is Union:
        return " or ".join("null" if a is type(None) else _type_name(a) for a in get_args(tp))
    return {int: "an integer", float: "a finite number", str: "a string", bool: "true/false",
            list: "a list", dict: "a mapping"}.get(tp, getattr(tp, "__name__", str(tp)))


def _as_text_hint(value: Any, tp: Any) -> str:
    """The YAML-number hint for a key of numbers (`3e-4` is text to YAML 1.1); empty for others."""
    options = get_args(tp) if get_origin(tp) is Union else (tp,)
    if float in options:
        return number_as_text_hint(value)
    return number_as_text_hint(value, integer=True) if int in options else ""


def _coerce(value: Any, tp: Any, where: str) -> Any:
    if get_origin(tp) is Union:
        for option in get_args(tp):
            if option is type(None) and value is None:
                return None
            try:
                return _coerce(value, option, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {shown(value)}{_as_text_hint(value, tp)}")
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where)
    ok = (isinstance(value, bool) if tp is bool
          else isinstance(value, int) and not isinstance(value, bool) if tp is int
          else isinstance(value, (int, float)) and not isinstance(value, bool) if tp is float
          else isinstance(value, tp))
    if not ok:
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {shown(value)}{_as_text_hint(value, tp)}")
    # no config number means NaN (every comparison with it is false, so range checks pass it) or inf
    # (it breaks timers and sums); nor an integer beyond a double's range, which float() refuses
    if tp is float and not abs(value) <= sys.float_info.max:
        raise ConfigError(f"{where}: expected a finite number, got {shown(value)}")
    if tp is int and not -INT64 <= value < INT64:
        raise ConfigError(f"{where}: expected an integer from -2**63 to 2**63 - 1, got {shown(value)}")
    return float(value) if tp is float else value


def _build(cls: type, data: Any, where: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping of keys, got {shown(data)}")
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            full = f"{where}.{key}" if where else str(key)
            raise ConfigError(f"unknown key '{full}'{hint} (valid keys here: {', '.join(names)})")
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}" if where else k) for k, v in data.items()}
    return cls(**kwargs)


def unread_keys(name: str) -> list[str]:
    """The algo keys algo.name `name` does not read, as the fields' `reads` say."""
    return [f.name for f in dataclasses.fields(AlgoConfig)
            if f.metadata["reads"] and name not in readers(f.metadata["reads"])]


def refuse_unread_keys(algo: AlgoConfig, given: Any) -> None:
    """A ConfigError for the first key of `given` (the algo mapping a user wrote) that algo.name
    does not read, set away from its default: PPO's clip_coef in a DQN config is a mistake (a
    copied file, the wrong algo.name), never a setting to carry silently. (A default passes: a
    config.yaml an older version resolved holds every key.)"""
    if algo.name not in ALGORITHMS or not isinstance(given, dict):
        return  # validate names the valid algorithms
    defaults = AlgoConfig()
    for key in unread_keys(algo.name):
        value = getattr(algo, key)
        if key in given and value != getattr(defaults, key):
            said = "set" if dataclasses.is_dataclass(value) else f"set to {shown(value)}"
            who = readers(AlgoConfig.__dataclass_fields__[key].metadata["reads"])
            raise ConfigError(f"algo.{key}: {said}, but algo.name {algo.name} does not read it (only "
                              f"{', '.join(who)}); remove it, or set algo.name to one of those")


def resolve(cfg: Config) -> None:
    """Fill in the defaults that depend on other keys (null in the YAML), in one place, before
    `validate`, which changes nothing: the run directory's config.yaml then says what ran."""
    for role in ROLE_NAMES:
        spec = getattr(cfg.roles, role)
        if spec.ranks is None and spec.per_node is None:
            spec.ranks = DEFAULT_RANKS[role]
    e, a = cfg.env, cfg.algo
    if e.groups is None and isinstance(e.num_envs, int):
        e.groups = 2 if e.num_envs % 2 == 0 else 1  # two groups hide the inference round trip
    algorithm = ALGORITHMS.get(a.name)
    if algorithm is None:
        return  # validate names the valid algorithms
    if a.mode is None:
        a.mode = algorithm.modes[0]
    if a.value_norm is None:
        a.value_norm = algorithm.multiagent and not algorithm.replay
    if e.global_state is None:
        e.global_state = algorithm.global_state
    if algorithm.replay_section == "dqn":
        a.replay.warmup = DQN_WARMUP if a.replay.warmup is None else a.replay.warmup
        a.replay.alpha = DQN_ALPHA if a.replay.alpha is None else a.replay.alpha
    elif algorithm.replay_section == "sac":
        resolve_sac_replay(a.sac, a.replay)
    elif algorithm.replay_section == "team":
        resolve_team_replay(a.replay)


def validate(cfg: Config) -> None:
    """Range and choice checks that types alone cannot express, of a resolved config (`resolve`);
    a ConfigError for the first that fails, and nothing changed."""
    validate_roles(cfg.roles)
    r, e, a, m = cfg.run, cfg.env, cfg.algo, cfg.model
    # one path component: the run directory is output_dir/name, and --overwrite empties it
    check(bool(r.name) and r.name not in (".", "..") and "/" not in r.name and "\0" not in r.name,
           lambda: f"run.name: expected one directory name such as cartpole_ppo (not '.', '..', nor a path), "
                   f"got {shown(r.name)}")
    check_ranges(r, "run")
    check_ranges(r.eval, "run.eval")
    validate_wandb(r.wandb)
    validate_env(e)
    per_group = e.num_envs // e.groups  # a request's envs (an inline policy's request: a multiple of them)
    check(r.inference_block is None or r.deterministic,
           f"run.inference_block: sets the forward passes of run.deterministic; set run.deterministic: true, or "
           f"null here, got {r.inference_block}")
    check(r.inference_block is None or (r.inference_block >= 1 and per_group % r.inference_block == 0),
           lambda: f"run.inference_block: expected null or a divisor of the envs per group (env.num_envs "
                   f"{e.num_envs} / env.groups {e.groups} = {per_group}) such as "
                   f"{', '.join(str(d) for d in range(1, per_group + 1) if per_group % d == 0)}, got {r.inference_block}")
    check(a.name in ALGORITHMS, f"algo.name: expected one of {', '.join(map(repr, ALGORITHMS))}, got {a.name!r}")
    algorithm = ALGORITHMS[a.name]
    modes = algorithm.modes
    check(a.mode in modes, f"algo.mode: expected {' or '.join(map(repr, modes))} (the modes of algo.name "
                            f"{a.name}), got {a.mode!r}")
    check(algorithm.reads_state or not e.global_state,
           f"env.global_state: the env's state is read by a centralised critic (algo.name mappo) or QMIX's mixer "
           f"(algo.name qmix); algo.name {a.name} has neither, so use false or null")
    check_table(cfg.policies)
    check(not r.eval.every_frames or len(cfg.policies) <= 1,
          lambda: f"run.eval: an evaluation plays one policy, and this config trains {len(cfg.policies)} "
                  f"({', '.join(cfg.policies)}); set run.eval.every_frames: 0, and play them against each other "
                  f"with hpcrl eval --opponent")
    validate_selfplay(a.selfplay, algorithm.multiagent, len(cfg.policies))
    validate_population(cfg.population, algorithm.live, a.name)
    validate_schedule(a, algorithm.live, a.name)
    if cfg.population.members:
        check(not cfg.policies, "population: members train one policy each; remove the policies table")
        check(cfg.roles.learner.device == "cpu", "population: a member's state is copied from host memory; use "
                                                  "roles.learner.device: cpu")
        if cfg.population.league.members:
            check(algorithm.multiagent, f"population.league: a league plays games of several agents "
                                                  f"(algo.name mappo or ippo), not algo.name {a.name}")
            check(a.selfplay.pool >= 1, "population.league: each member's policy holders hold algo.selfplay.pool "
                                         "league snapshots to play against; set algo.selfplay.pool >= 1")
    multiagent = [n for n, alg in ALGORITHMS.items() if alg.multiagent]
    check(not cfg.policies or algorithm.multiagent,
           f"policies: maps the agents of PettingZoo envs to policies, for the multi-agent algorithms "
           f"({', '.join(multiagent)}); algo.name {a.name} trains one policy, so remove the policies table")
    if algorithm.replay_section == "dqn":
        validate_dqn(a.dqn, a.replay, recurrent=m.core != "none")
    if algorithm.replay_section == "team":
        validate_team(a.team, a.replay)
        check(not cfg.policies, f"policies: algo.name {a.name} trains one team, its agents' networks mixed into "
                                f"one; set algo.team.shared: false for a network per agent, and remove the table")
    if algorithm.replay_section == "sac":
        validate_sac(a.sac, a.replay)
        check(m.core == "none", f"model.core: algo.name {a.name} has no recurrent version; use none")
    if algorithm.replay:
        settings, section = replay_settings(a)
        n_step = getattr(settings, "n_step", 0)  # (algo.team's episodes are whole: no n-step windows)
        check(a.mode == "async" or a.replay.replay_ratio is not None,
               f"algo.mode: sync {a.name} trains the gradient steps algo.replay.replay_ratio owes after each round of "
               f"records; set algo.replay.replay_ratio (e.g. 8: each transition sampled 8 times), or use algo.mode "
               f"async")
        check(m.core != "none" or a.mode == "sync" or a.rollout_length > n_step,
               f"algo.rollout_length: a {a.name.upper()} record holds rollout_length x env.num_envs transitions and "
               f"one env step may complete n_step + 1 of them per env; expected more than {section}.n_step "
               f"({n_step}), got {a.rollout_length}")
        check(not e.normalize_reward, f"env.normalize_reward: not supported with algo.name {a.name} (replayed "
                                       f"rewards would be scaled by statistics of another time); use false")
        check(not m.obs_norm, f"model.obs_norm: not supported with algo.name {a.name} yet; use false")
    # every declared range (whether batch_frames is a whole number of fragments per learner or env
    # rank depends on the layout: hpcrl.core.sizing.Sizes.of checks that)
    check_ranges(a, "algo")
    check(a.lr_schedule in ("constant", "linear"),
           f"algo.lr_schedule: expected 'constant' or 'linear', got {a.lr_schedule!r}")
    batch_per_env_rank = a.rollout_length * e.num_envs
    check(a.num_minibatches <= batch_per_env_rank,
           f"algo.num_minibatches: {a.num_minibatches} minibatches cannot be cut from one fragment of "
           f"{batch_per_env_rank} frames (rollout_length x env.num_envs); use at most {batch_per_env_rank}")
    validate_model(m, a.name, algorithm.policy)
    check(m.core == "none" or algorithm.replay or a.num_minibatches <= e.num_envs,
           f"algo.num_minibatches: a recurrent core's minibatches are whole sequences of whole envs (a fragment's "
           f"columns of one env: its agents, for PettingZoo envs), so at most env.num_envs ({e.num_envs}) of "
           f"them, got {a.num_minibatches}")


def _set_dotted(data: dict, dotted: str, value: Any, set_by: dict[str, str]) -> None:
    """data[a][b][c] = value for dotted 'a.b.c' (an empty section, `env:` in a file, counts as one
    with no keys). `set_by`: the overrides applied so far, by their dotted key, so a key that an
    earlier override turned into a plain value is blamed on that override, not on this one."""
    node = data
    parts = dotted.split(".")
    for depth, part in enumerate(parts[:-1]):
        if node.get(part) is None:
            node[part] = {}
        child = node[part]
        if not isinstance(child, dict):
            where = ".".join(parts[:depth + 1])
            if where in set_by:
                raise ConfigError(f"--set {set_by[where]!r}: '{where}' is a section, a mapping of keys; set one of "
                                  f"them instead, e.g. --set {where}.KEY=VALUE (got {shown(child)})")
            raise ConfigError(f"--set {dotted}: '{where}' is {shown(child)} in the config, not a section of keys")
        node = child
    node[parts[-1]] = value


def parse_config(text: str, source: str = "<config>", overrides: tuple[str, ...] = (), strict: bool = True) -> Config:
    """YAML text (+ `KEY=VALUE` overrides, values in YAML syntax) -> a validated Config.
    `strict`: refuse algo keys the algorithm does not read (a user's config); false for a config a
    run stored (a checkpoint's, a run directory's), which older versions wrote with every key."""
    return _config_of(load_yaml(text, source), source, overrides, strict)


def _config_of(data: Any, source: str, overrides: tuple[str, ...], strict: bool = True) -> Config:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of sections (run, roles, env, algo, model)")
    set_by: dict[str, str] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. run.total_frames=20000")
        _set_dotted(data, key.strip(), load_yaml(raw, f"--set {item!r}: the value"), set_by)
        set_by[key.strip()] = item
    try:
        cfg = _build(Config, data, "")
        if strict:
            refuse_unread_keys(cfg.algo, data.get("algo"))
        resolve(cfg)
        validate(cfg)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return cfg


def load_config(path: str, overrides: tuple[str, ...] = ()) -> tuple[Config, str]:
    """Read and validate a config file; returns the config and the file's text."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path!r}: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # newlines as open() reads them
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"config file {path!r} is not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset "
                          f"{exc.start} (line {line}); save it as UTF-8") from None
    data = load_yaml(text, path)
    if data is None:  # most likely the wrong file, or one not written yet: never train a default run quietly
        raise ConfigError(f"config file {path!r} is empty (or only comments); it needs at least the sections "
                          f"it changes (run, roles, env, algo, model), e.g. start from jobs/cartpole_ppo.yaml")
    cfg = _config_of(data, path, overrides)  # (the overrides are in `data` now)
    if not (isinstance(data.get("env"), dict) and "id" in data["env"]):
        given = ("has no env section" if "env" not in data else "has an empty env section" if data["env"] is None
                 else "has an env section without an id")
        raise ConfigError(f"{path}: env.id: the config {given}, so it names no environment to train on; add one, "
                          f"e.g. 'env: {{id: CartPole-v1}}' (a gymnasium id, 'pettingzoo:classic/connect_four-v3' "
                          f"or 'mypackage.envs:MyEnv'), or pass --set env.id=...")
    return cfg, text


def to_dict(cfg: Config) -> dict:
    """The config as plain data, without the algo keys its algorithm does not read."""
    data = dataclasses.asdict(cfg)
    for key in unread_keys(cfg.algo.name):
        del data["algo"][key]
    return data


def to_yaml(cfg: Config) -> str:
    """The resolved config (every default filled in), as written into the run directory."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
