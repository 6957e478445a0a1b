"""The environments' config sections (env, env.atari): what every env rank steps, and how.

hpcrl.core.config re-exports these names.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from hpcrl.core.config_base import (AT_LEAST_ONE, FRACTION, NON_NEGATIVE, OneOf, Range, check, check_ranges, doc,
                                     shown)

# Sizes an env rank allocates from before `hpcrl plan`'s memory estimate can be made (see the
# bounds in config.py): far above any real run
MAX_NUM_ENVS = 65_536
MAX_FRAME_SIZE, MAX_FRAME_STACK = 1024, 64  # one Atari env's frame stack is made to read its spaces
ENV_BACKENDS = ("sync", "numpy", "envpool")
ENV_PRESETS = ("atari",)


@dataclass
class AtariConfig:
    """DeepMind-style Atari preprocessing, used when env.preset is 'atari' (ids such as ALE/Breakout-v5)."""

    noop_max: int = doc("at most this many no-op actions after each reset (a random number in [1, noop_max]; "
                        "0 = none)", range=NON_NEGATIVE, default=30)
    frame_skip: int = doc("emulator frames per agent step (the action repeats; the observation is the max "
                          "of the last two frames)", range=AT_LEAST_ONE, default=4)
    frame_size: int = doc("observations are frame_size x frame_size grey frames",
                          range=Range(1, MAX_FRAME_SIZE, words=f"1 to {MAX_FRAME_SIZE:,}"), default=84)
    frame_stack: int = doc("the observation stacks this many most recent frames: uint8 [frame_stack, "
                           "frame_size, frame_size]",
                           range=Range(1, MAX_FRAME_STACK, words=f"1 to {MAX_FRAME_STACK:,}"), default=4)
    terminal_on_life_loss: bool = doc("a lost life ends the episode for training (the game goes on; "
                                      "metrics count whole games)", default=True)
    fire_reset: bool = doc("press FIRE after each reset, in games that have a FIRE action", default=True)
    clip_rewards: bool = doc("train on the sign of each reward (metrics report the raw game score)",
                             default=True)
    repeat_action_probability: float = doc(
        "sticky actions: chance the emulator repeats the previous action (ALE v5: 0.25; the "
        "NoFrameskip-v4 setting of SB3/CleanRL results: 0.0)", range=FRACTION, default=0.25)


@dataclass
class EnvConfig:
    """The environments every env rank steps."""

    id: str = doc("gymnasium environment id (e.g. CartPole-v1, ALE/Breakout-v5), 'module:EnvId' to import a "
                  "module that registers EnvId first, or 'module:Name' for a gymnasium.Env subclass (or a "
                  "function returning an Env) defined in that module. Required in a config file: a file "
                  "without it is refused rather than trained on CartPole-v1", default="CartPole-v1")
    num_envs: int = doc("environments per env rank", range=Range(1, MAX_NUM_ENVS, words=f"1 to {MAX_NUM_ENVS:,}"),
                        default=8)
    groups: Union[int, None] = doc(
        "with remote inference, the env rank's envs are split into this many groups (vectors) that take "
        "turns: one steps while the others wait for actions, hiding the inference round trip; must divide "
        "num_envs (default: 2, or 1 for an odd num_envs; inline inference always uses 1)", default=None)
    kwargs: dict = doc("keyword arguments passed to gymnasium.make (or to the class / function of a "
                       "'module:Name' id; max_episode_steps adds a time limit in both cases)",
                       default_factory=dict)
    backend: str = doc("how an env rank steps its vector: 'sync' (gymnasium envs one after the other, any "
                       "env), 'numpy' (gymnasium's numpy-vectorised env where the env has one, e.g. "
                       "CartPole-v1), 'envpool' (envpool's C++ thread pool; pip install hpcrl[envpool])",
                       range=OneOf(ENV_BACKENDS), default="sync")
    preset: Union[str, None] = doc("a standard wrapper stack: null (none) or 'atari' (see env.atari)",
                                   range=OneOf(ENV_PRESETS, null=True), default=None)
    atari: AtariConfig = doc("Atari preprocessing options (used with preset: atari)", default_factory=AtariConfig)
    normalize_reward: bool = doc("train on rewards divided by a running std of the discounted return "
                                 "(gamma = algo.gamma, clipped to +-10, as SB3's VecNormalize): env ranks send "
                                 "their returns' moments with each fragment, the learners merge them over every "
                                 "env rank and keep them in the checkpoint (metrics: reward_return_std); metrics "
                                 "report raw returns", default=False)
    global_state: Union[bool, None] = doc(
        "PettingZoo envs with a global state (the env's state()): append it to every agent's row for MAPPO's "
        "centralised critic, which then reads it (and the agent's index) instead of every agent's observations; "
        "the policy never sees it. Envs without state() keep the observations. Default: true for mappo",
        default=None)


def validate_env(e: EnvConfig) -> None:
    """Range and choice checks of env and env.atari."""
    check(bool(e.id), "env.id: expected a gymnasium environment id such as CartPole-v1")
    check_ranges(e, "env")
    check(e.groups >= 1 and e.num_envs % e.groups == 0,
          f"env.groups: expected a divisor of env.num_envs ({e.num_envs}) such as "
          f"{', '.join(str(d) for d in range(1, min(e.num_envs, 4) + 1) if e.num_envs % d == 0)}, got {e.groups}")
    check(all(isinstance(k, str) for k in e.kwargs),
          lambda: f"env.kwargs: expected names as keys, got {shown(e.kwargs)}")
    steps = e.kwargs.get("max_episode_steps")
    # gymnasium reads -1 as "no time limit" but fails on other values < 1 when it makes the env
    check(steps is None or (isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1),
          lambda: f"env.kwargs.max_episode_steps: expected a positive number of steps, or null (the env's own "
                  f"limit), got {shown(steps)}")
    if e.preset != "atari":
        return
    check_ranges(e.atari, "env.atari")
    owned = {"frameskip": "env.atari.frame_skip", "repeat_action_probability": "env.atari.repeat_action_probability",
             "obs_type": "env.atari.frame_size (the preset makes grey frames)"}
    for key, instead in owned.items():
        check(key not in e.kwargs, f"env.kwargs.{key}: the atari preset sets it; use {instead} instead")
