"""`hpcrl eval`: the latest checkpoint of a run played for N episodes in one process (no MPI).

The env is built as env ranks build theirs (a vector of one env) and the model as learners build
theirs, from the config saved in the checkpoint; `--video` renders every step into an MP4. The
policies play as a learner root's evaluation plays them (workers/player.py: the policy holders'
own code, with no transport): eval never imports MPI.
Multi-agent games can be played against an opponent (`--opponent random`, a uniform player of
valid actions; another run's latest checkpoint, such as an early snapshot or another member of a
population; or a scripted player, `module:function`, such as a fixed anchor to rate against):
the run's policy takes one seat, in turn every seat from game to game, the opponent all the
others, and the result counts the run's wins, draws and losses.

A run directory is data: eval imports no module its config names (an env outside the env
families hpcrl supports, `imports_of_env_id`; the user's own model.encoder) unless the caller
trusts it (`--trust-code`),
refuses weights that do not fit the network or are not finite (`check_fits`), and writes nothing
but the video it was asked for.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from hpcrl.io.checkpoint import CheckpointError, check_fits, load_latest
from hpcrl.core.config import Config, ConfigError, parse_config
from hpcrl.core.config_model import is_custom
from hpcrl.envs import KNOWN_ENV_FAMILIES, imports_of_env_id, make_vector_env, env_spaces
from hpcrl.envs.anchors import uniform
from hpcrl.envs.scripted import ScriptedPlayer
from hpcrl.io.rundir import CHECKPOINT_FILE
from hpcrl.tools.inspect import RunDirError, open_run_dir
from hpcrl.workers.player import Player, build_networks, play_episodes


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


def refuse_untrusted_code(cfg: Config, run_dir: str) -> None:
    """RunDirError if playing the run would import a module its config names: making its env (an
    env.id outside the env families hpcrl supports, whose named callable gets the config's kwargs),
    or building its network (the user's own model.encoder, called with model.encoder_kwargs)."""
    module = imports_of_env_id(cfg.env.id)
    if module is not None:
        name = cfg.env.id.split(":", 1)[1]
        raise RunDirError(f"{run_dir}: env.id {cfg.env.id!r} would import module {module!r} and make the env from "
                          f"its {name!r} with env.kwargs {cfg.env.kwargs}; a run directory is data, so eval "
                          f"imports no module it names beyond {KNOWN_ENV_FAMILIES}. If you trust the run's "
                          f"author, pass --trust-code")
    if is_custom(cfg.model.encoder):
        module_name, name = cfg.model.encoder.split(":", 1)
        raise RunDirError(f"{run_dir}: model.encoder {cfg.model.encoder!r} would import module {module_name!r} and "
                          f"build the network with its {name!r} and model.encoder_kwargs {cfg.model.encoder_kwargs}; "
                          f"a run directory is data, so eval imports no module it names. If you trust the run's "
                          f"author, pass --trust-code")


def policy_of(cfg: Config, checkpoint: dict, found: str, spaces, play: str, generator: torch.Generator) -> Player:
    """The run's network with the checkpoint's weights; with several policies, all of them, each
    acting for its own agents (workers/player.py). CheckpointError for weights that do not fit or
    are not finite."""
    networks = build_networks(cfg, spaces)
    check_fits(checkpoint, {name: {key: tuple(value.shape) for key, value in net.state_dict().items()}
                            for name, net in networks.items()}, found)
    for p, (name, net) in enumerate(networks.items()):
        try:
            net.load_state_dict(checkpoint["model"] if p == 0 else checkpoint["policies"][name]["model"])
        except (RuntimeError, KeyError) as exc:  # what check_fits leaves: weights the network has no place for
            raise CheckpointError(f"{found}: its weights do not fit the network of its config: "
                                  f"{' '.join(str(exc).split())}") from None
    return Player(networks, cfg, spaces, play, generator)


class _Random:
    """A uniform player of each row's valid actions."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def act(self, obs, mask: np.ndarray | None) -> np.ndarray:
        if mask is None:
            raise RunDirError("--opponent random: this env gives no action masks, so valid actions are unknown")
        return uniform(obs, mask, self.rng)


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


def _opponent(opponent: str | None, cfg: Config, spaces, generator: torch.Generator, seed: int = 0,
              trust_code: bool = False):
    """None, a uniform player ('random'), a scripted player (`module:function`), or the policy of
    another run (its latest checkpoint) for the same env (its own model.encoder only with
    `trust_code`)."""
    if opponent is None:
        return None
    if opponent == "random":
        return _Random(np.random.default_rng(seed))
    if ":" in opponent and not os.path.exists(opponent):
        return _Scripted(opponent, seed)
    other, checkpoint, found, _ = load_run(opponent)
    if not trust_code and is_custom(other.model.encoder):  # (only its network is built: the env is this run's)
        refuse_untrusted_code(other, opponent)
    if other.env.id != cfg.env.id:
        raise RunDirError(f"--opponent {opponent}: its env is {other.env.id}, this run's is {cfg.env.id}")
    return policy_of(other, checkpoint, found, spaces, "sample", generator)  # an opponent samples, as it trained


def evaluate(run_dir: str, episodes: int, deterministic: bool = False, seed: int = 0,
             video: str | None = None, opponent: str | None = None, trust_code: bool = False,
             watch: Callable | None = None) -> EvalResult:
    """Play the run's latest checkpoint. `trust_code`: make its env even where env.id names a
    module outside the env families hpcrl supports (tests.ma_envs:Relay, mypackage:MyEnv), which is
    imported and called with env.kwargs, and build its network even where model.encoder names the
    user's own class (mypackage.nets:Encoder); without it such a run is refused (RunDirError).
    `watch(game, seat, rows, mask, actions, active)`, if given, sees every step before it is taken:
    the game's number (its index in the result's returns), the run's seat, the rows' observations,
    action masks and actions, and which rows move (None: all); bench/league.py counts a connect
    four player's tactical mistakes with it."""
    if video and not os.path.isdir(os.path.dirname(os.path.abspath(video))):
        raise RunDirError(f"--video {video}: directory {os.path.dirname(video)!r} does not exist")
    cfg, checkpoint, found, problems = load_run(run_dir)
    if not trust_code:
        refuse_untrusted_code(cfg, run_dir)
    env_cfg = dataclasses.replace(cfg.env, num_envs=1,
                                  kwargs={**cfg.env.kwargs, **({"render_mode": "rgb_array"} if video else {})})
    spaces = env_spaces(cfg.env)
    if opponent is not None and not spaces.multiagent:
        raise RunDirError(f"--opponent: {cfg.env.id} has one agent; an opponent needs a multi-agent game")
    generator = torch.Generator().manual_seed(seed)
    model = policy_of(cfg, checkpoint, found, spaces, "greedy" if deterministic else "sample", generator)
    rival = _opponent(opponent, cfg, spaces, generator, seed, trust_code)
    counters = checkpoint["counters"]
    result = EvalResult([], [], found, int(counters.get("policy_version", 0)), int(counters.get("frames", 0)),
                        deterministic, seed, video, warnings=problems, opponent=opponent)
    if video:
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame renders off-screen: no display on a cluster
    envs, obs = make_vector_env(env_cfg, seed=seed)
    writer = _video_writer(video, envs) if video else None
    try:
        if writer:
            result.video_frames += _append_frame(writer, envs)

        def after_step() -> None:
            if writer:
                result.video_frames += _append_frame(writer, envs)

        result.returns, result.lengths = play_episodes(envs, obs, spaces, model, episodes, rival=rival, watch=watch,
                                                       after_step=after_step)
    finally:
        envs.close()
        if writer:
            writer.close()
    return result


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
