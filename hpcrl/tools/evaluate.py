"""`hpcrl eval`: the latest checkpoint of a run played for N episodes in one process (no MPI).

The env is built as env ranks build theirs (a vector of one env) and the model as learners build
theirs, from the config saved in the checkpoint; `--video` renders every step into an MP4. The
policies act through the policy holders' own code (workers/policy_holder.py: a PolicySet of
runners that play, models/runner.py), with no transport: eval never imports MPI.
Multi-agent games can be played against an opponent (`--opponent random`, a uniform player of
valid actions; another run's latest checkpoint, such as an early snapshot or another member of a
population; or a scripted player, `module:function`, such as a fixed anchor to rate against):
the run's policy takes one seat, in turn every seat from game to game, the opponent all the
others, and the result counts the run's wins, draws and losses.

A run directory is data: eval imports no module its config names outside the env
families hpcrl supports (`imports_of_env_id`) unless the caller trusts it (`--trust-env-code`),
refuses weights that do not fit the network or are not finite (`check_fits`), and writes nothing
but the video it was asked for.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Callable

import gymnasium as gym
import numpy as np
import torch

from hpcrl.io.checkpoint import CheckpointError, check_fits, load_latest
from hpcrl.core.config import Config, ConfigError, parse_config
from hpcrl.envs import GAME_OVER, KNOWN_ENV_FAMILIES, RAW_REWARD, imports_of_env_id, make_vector_env, env_spaces
from hpcrl.envs.multiagent import ENV_DONE, episode_starts
from hpcrl.envs.scripted import ScriptedPlayer
from hpcrl.io.rundir import CHECKPOINT_FILE
from hpcrl.core.policies import policy_spaces, row_policies
from hpcrl.models import build_policy, make_runner
from hpcrl.tools.inspect import RunDirError, open_run_dir
from hpcrl.workers.policy_holder import PolicySet, holder_states


@dataclass
class EvalResult:
    returns: list[float]
    lengths: list[int]
    checkpoint: str
    policy_version: int
    frames: int
    deterministic: bool
    seed: int
    video: str | None = None
    video_frames: int = 0
    warnings: list[str] = field(default_factory=list)
    opponent: str | None = None  # against an opponent: the returns are the run's seat's

    def summary(self) -> dict:
        r = np.asarray(self.returns)
        out = {"episodes": len(r), "return_mean": float(r.mean()), "return_std": float(r.std()),
               "return_min": float(r.min()), "return_max": float(r.max()),
               "length_mean": float(np.mean(self.lengths))}
        if self.opponent is not None:  # a game is won by a positive return (zero-sum games: +1 / -1)
            out.update(wins=int((r > 0).sum()), draws=int((r == 0).sum()), losses=int((r < 0).sum()),
                       win_rate=float((r > 0).mean()))
        return {**out, **dataclasses.asdict(self)}


def load_run(run_dir: str) -> tuple[Config, dict, str, list[str]]:
    """(config, checkpoint, checkpoint file, warnings) of a run's newest usable checkpoint."""
    checkpoint, found, problems = load_latest(os.path.join(open_run_dir(run_dir), CHECKPOINT_FILE))
    if checkpoint is None:
        why = f" ({'; '.join(problems)})" if problems else ""
        raise RunDirError(f"{run_dir!r} holds no usable checkpoint{why}; a run writes one every "
                          f"run.checkpoint_interval_s and at its end")
    try:
        cfg = parse_config(checkpoint["config"], source=f"{found} (its config)", strict=False)
    except ConfigError as exc:
        raise RunDirError(f"cannot rebuild the run from its checkpoint: {exc}") from None
    return cfg, checkpoint, found, problems


def refuse_untrusted_env(cfg: Config, run_dir: str) -> None:
    """RunDirError if making the run's env would import a module its config names outside the env
    families hpcrl supports, and call what the config names in it with the config's kwargs."""
    module = imports_of_env_id(cfg.env.id)
    if module is not None:
        name = cfg.env.id.split(":", 1)[1]
        raise RunDirError(f"{run_dir}: env.id {cfg.env.id!r} would import module {module!r} and make the env from "
                          f"its {name!r} with env.kwargs {cfg.env.kwargs}; a run directory is data, so eval "
                          f"imports no module it names beyond {KNOWN_ENV_FAMILIES}. If you trust the run's "
                          f"author, pass --trust-env-code")


def _networks(cfg: Config, spaces) -> dict:
    """The run's networks as its learners build them, untrained: one per policy (an actor-critic,
    or a Q-network), the first one's weights being the checkpoint's 'model'."""
    if len(cfg.policies) <= 1:
        return {next(iter(cfg.policies), "model"): build_policy(spaces, cfg)}
    return {name: build_policy(own, cfg) for name, own in zip(cfg.policies, policy_spaces(spaces, cfg.policies))}


class _Player:
    """A run's policies at the table, held as a policy holder holds them: its PolicySet acts for
    the env's rows (with several policies, each for the rows of its agents), and a recurrent
    policy keeps the rows' hidden state, zero at first and zeroed again where an episode ended."""

    def __init__(self, policies: PolicySet, row_policy: np.ndarray | None, states: np.ndarray | None, spaces):
        self.policies, self.row_policy = policies, row_policy
        self.states = None if states is None else states[0]  # one env: one channel of rows
        self.actions = np.zeros((spaces.num_agents, *spaces.action_shape), dtype=spaces.action_dtype)

    def act(self, obs, mask: np.ndarray | None) -> np.ndarray:
        """The rows' actions (a new array): `obs` numpy (Dict observations: their leaves)."""
        self.policies.act(obs, {"actions": self.actions}, mask, self.row_policy, self.states)
        return self.actions.copy()

    def ended(self, starts: np.ndarray) -> None:
        if self.states is not None:
            self.states[starts.astype(bool)] = 0.0


def _policy(cfg: Config, checkpoint: dict, found: str, spaces, play: str, generator: torch.Generator) -> _Player:
    """The run's network with the checkpoint's weights; with several policies, all of them, each
    acting for its own agents. `play`: how its runners act (models/runner.py: "sample" or
    "greedy"); `generator`: what they draw from. CheckpointError for weights that do not fit or
    are not finite."""
    networks = _networks(cfg, spaces)
    check_fits(checkpoint, {name: {key: tuple(value.shape) for key, value in net.state_dict().items()}
                            for name, net in networks.items()}, found)
    for p, (name, net) in enumerate(networks.items()):
        try:
            net.load_state_dict(checkpoint["model"] if p == 0 else checkpoint["policies"][name]["model"])
        except (RuntimeError, KeyError) as exc:  # what check_fits leaves: weights the network has no place for
            raise CheckpointError(f"{found}: its weights do not fit the network of its config: "
                                  f"{' '.join(str(exc).split())}") from None
    runners = [make_runner(net, "cpu", seed=0, play=play) for net in networks.values()]
    for runner in runners:  # every player of a game draws from one stream, in turn: a seed plays the same games
        runner.generator = generator
    # the holders' code (workers/policy_holder.py): no weights stream in, the checkpoint's stay
    policies = PolicySet(runners, [])
    return _Player(policies, row_policies(cfg.policies, spaces.agents, 1) if len(networks) > 1 else None,
                   holder_states(policies, 1, spaces.num_agents), spaces)


class _Scripted:
    """A player written as a function (`--opponent module:function`, envs/scripted.py), with a
    generator of its own."""

    def __init__(self, opponent: str, seed: int):
        try:  # the caller's choice on the command line, never a name read from a run directory
            self.player = ScriptedPlayer(opponent, f"--opponent {opponent}")
        except ConfigError as exc:
            raise RunDirError(f"{exc}; or give a run directory, or 'random'") from None
        self.rng = np.random.default_rng(seed)

    def act(self, obs, mask: np.ndarray | None) -> np.ndarray:
        try:
            return self.player.act(obs, mask, self.rng)
        except ValueError as exc:
            raise RunDirError(str(exc)) from None


def _opponent(opponent: str | None, cfg: Config, spaces, generator: torch.Generator, seed: int = 0):
    """None, 'random', a scripted player (`module:function`), or the policy of another run (its
    latest checkpoint) for the same env."""
    if opponent is None or opponent == "random":
        return opponent
    if ":" in opponent and not os.path.exists(opponent):
        return _Scripted(opponent, seed)
    other, checkpoint, found, _ = load_run(opponent)
    if other.env.id != cfg.env.id:
        raise RunDirError(f"--opponent {opponent}: its env is {other.env.id}, this run's is {cfg.env.id}")
    return _policy(other, checkpoint, found, spaces, "sample", generator)  # an opponent samples, as it trained


def evaluate(run_dir: str, episodes: int, deterministic: bool = False, seed: int = 0,
             video: str | None = None, opponent: str | None = None, trust_env_code: bool = False,
             watch: Callable | None = None) -> EvalResult:
    """Play the run's latest checkpoint. `trust_env_code`: make its env even where env.id names a
    module outside the env families hpcrl supports (tests.ma_envs:Relay, mypackage:MyEnv), which is
    imported and called with env.kwargs; without it such a run is refused (RunDirError).
    `watch(game, seat, rows, mask, actions, active)`, if given, sees every step before it is taken:
    the game's number (its index in the result's returns), the run's seat, the rows' observations,
    action masks and actions, and which rows move (None: all); bench/league.py counts a connect
    four player's tactical mistakes with it."""
    if video and not os.path.isdir(os.path.dirname(os.path.abspath(video))):
        raise RunDirError(f"--video {video}: directory {os.path.dirname(video)!r} does not exist")
    cfg, checkpoint, found, problems = load_run(run_dir)
    if not trust_env_code:
        refuse_untrusted_env(cfg, run_dir)
    env_cfg = dataclasses.replace(cfg.env, num_envs=1,
                                  kwargs={**cfg.env.kwargs, **({"render_mode": "rgb_array"} if video else {})})
    spaces = env_spaces(cfg.env)
    if opponent is not None and not spaces.multiagent:
        raise RunDirError(f"--opponent: {cfg.env.id} has one agent; an opponent needs a multi-agent game")
    generator = torch.Generator().manual_seed(seed)
    model = _policy(cfg, checkpoint, found, spaces, "greedy" if deterministic else "sample", generator)
    rival = _opponent(opponent, cfg, spaces, generator, seed)
    counters = checkpoint["counters"]
    result = EvalResult([], [], found, int(counters.get("policy_version", 0)), int(counters.get("frames", 0)),
                        deterministic, seed, video, warnings=problems, opponent=opponent)
    rng = np.random.default_rng(seed)
    # One env, episodes one after another: taking the first N to finish of several parallel envs
    # would favour short episodes. SAME_STEP autoreset: a finished env comes back reset at once.
    if video:
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame renders off-screen: no display on a cluster
    envs, obs = make_vector_env(env_cfg, seed=seed)
    space = envs.single_action_space
    writer = _video_writer(video, envs) if video else None
    try:
        ret, length = 0.0, 0
        if writer:
            result.video_frames += _append_frame(writer, envs)
        # PettingZoo envs: one env of several agent rows; a return is the mean over the agents, or
        # against an opponent the return of the run's seat
        mask = getattr(envs.unwrapped, "action_mask", None)
        while len(result.returns) < episodes:
            rows = obs if spaces.obs_leaves is None else spaces.obs_leaves.flatten(obs)  # Dict observations' leaves
            actions = model.act(rows, mask)
            seat = len(result.returns) % spaces.num_agents
            if rival is not None:
                others = np.arange(len(actions)) != seat
                actions[others] = (_random_actions(mask, rng) if rival == "random" else rival.act(rows, mask))[others]
            if isinstance(space, gym.spaces.Box):  # Gaussian policies: keep actions inside the bounds
                actions = np.clip(actions, space.low, space.high)
            if watch is not None:
                watch(len(result.returns), seat, rows, mask, actions, getattr(envs.unwrapped, "active", None))
            obs, reward, terminated, truncated, info = envs.step(actions)
            starts = episode_starts(terminated | truncated, info)  # as training saw them (an Atari life loss too)
            for player in (model, rival):
                if isinstance(player, _Player):  # a recurrent policy zeroes the state of those rows
                    player.ended(starts)
            mask = info.get("action_mask", mask)
            # as the metrics count them: raw rewards of whole games (Atari: all lives, unclipped)
            reward = info.get(RAW_REWARD, reward)
            ret, length = ret + float(reward[seat] if rival is not None else np.mean(reward)), length + 1
            if writer:
                result.video_frames += _append_frame(writer, envs)
            if info.get(ENV_DONE, info.get(GAME_OVER, terminated | truncated))[0]:
                result.returns.append(ret)
                result.lengths.append(length)
                ret, length = 0.0, 0
    finally:
        envs.close()
        if writer:
            writer.close()
    return result


def _random_actions(mask: np.ndarray | None, rng: np.random.Generator) -> np.ndarray:
    """A uniform choice among each row's valid actions."""
    if mask is None:
        raise RunDirError("--opponent random: this env gives no action masks, so valid actions are unknown")
    return np.array([rng.choice(np.flatnonzero(row)) if row.any() else 0 for row in mask], dtype=np.int64)


def _video_writer(path: str, envs):
    import imageio.v2 as imageio
    fps = envs.metadata.get("render_fps") or 30
    try:
        # macro_block_size 2: H.264 needs even sizes; imageio pads odd ones instead of rescaling to 16
        return imageio.get_writer(path, fps=fps, codec="libx264", macro_block_size=2)
    except (OSError, ValueError) as exc:
        raise RunDirError(f"--video {path}: cannot write a video there: {exc}") from None


def _append_frame(writer, envs) -> int:
    frames = envs.render()  # one frame per env of the vector
    if frames is None or not len(frames):
        raise RunDirError("the env rendered no frame (render_mode='rgb_array' is not supported by it)")
    writer.append_data(np.asarray(frames[0]))
    return 1


def format_result(result: EvalResult, run_dir: str) -> str:
    s = result.summary()
    mode = "deterministic (most likely action)" if result.deterministic else "sampled actions"
    lines = [*(f"[hpcrl] warning: {w}" for w in result.warnings),
             f"[hpcrl] {os.path.relpath(result.checkpoint, run_dir)}: policy version {result.policy_version}, "
             f"{result.frames:,} frames; {s['episodes']} episodes, {mode}, seed {result.seed}",
             f"return {s['return_mean']:.2f} +- {s['return_std']:.2f} (min {s['return_min']:.1f}, "
             f"max {s['return_max']:.1f}), length {s['length_mean']:.1f}"]
    if result.opponent is not None:
        lines.append(f"against {result.opponent}: {s['wins']} wins, {s['draws']} draws, {s['losses']} losses "
                     f"(win rate {s['win_rate']:.2f}; the run's policy took every seat in turn)")
    if result.video:
        lines.append(f"[hpcrl] wrote {result.video}: {result.video_frames} frames")
    return "\n".join(lines)
