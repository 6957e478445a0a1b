"""An algorithm's dataflow, declared as data: the streams that join its roles, the record layout
its samples travel in, the facts the code asks of it, and the names of its parts.

The wiring (`hpcrl.launch.wiring.build_workers`) reads the declaration and builds exactly the
streams it names; the layout (ranks per role, per node, devices) comes from the config alone and
never changes an algorithm. PPO and APPO are one algorithm in two modes; Ape-X DQN is another entry
(transition records, a replay batch source, its own record writer and step) on the same streams;
MAPPO and IPPO are two more that reuse PPO's workers (agents are rows of the env vector) and differ
in the network they ask for, with no new wiring. Pure: numpy and the message layouts only (every
rank and `hpcrl plan` read this).
An algorithm names its record writer, batch source and trainer step; launch/registry.py binds
those names to classes, imported only on the ranks that use them (actors never import torch).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from hpcrl.core.messages import (MessageSpec, action_reply_spec, fragment_spec, q_reply_spec, reply_spec,
                                 request_spec, sequence_spec, team_spec, transition_spec)
from hpcrl.core.policies import rows_carry_policy

# The four stream kinds (runtime/): each has its own duplicated communicator.
INFERENCE = "inference"  # request/reply slots between actors and a batching policy server
SAMPLE = "sample"        # many-to-one records, credit flow control (runtime/streams.py)
PARAMETER = "parameter"  # newest-only, hierarchical weights (runtime/params.py)
CONTROL = "control"      # the run's stop word, independent of the weights (runtime/control.py)
STREAM_KINDS = (INFERENCE, SAMPLE, PARAMETER, CONTROL)
# The groups of algo keys an algorithm may read (Algorithm.reads; a config field's `reads`)
READ_GROUPS = ("on_policy", "replay", "dqn", "sac", "team")
# The networks an algorithm may ask for (hpcrl.models.build_policy builds them)
POLICY_KINDS = ("actor_critic", "central_critic", "q", "team_q", "sac", "td3")


@dataclass(frozen=True)
class Stream:
    """One stream of the dataflow: `kind`, from the workers of role `source` to those of `sink`.
    `record` names the layout a sample stream carries."""

    kind: str
    source: str
    sink: str
    record: str = ""


@dataclass(frozen=True)
class Algorithm:
    """What an algorithm is, as the code asks it: its modes, streams, record and reply layouts
    (`record(cfg, spaces)`, `reply(cfg, spaces, num_envs)`), the network it trains (`policy`: one of
    POLICY_KINDS, built by hpcrl.models.build_policy) and the names of its parts, which
    launch/registry.py binds to classes: `writer(cfg)` names the env rank's record writer for the
    config, `batch_source` the learners' batch source and `step` the trainer step. Nothing outside
    this declaration compares an algorithm's name: code asks these facts instead."""

    name: str
    modes: tuple[str, ...]
    streams: tuple[Stream, ...]
    record: Callable[..., MessageSpec]
    reply: Callable[..., MessageSpec]
    writer: Callable[..., str]
    policy: str
    batch_source: str
    step: str
    doc: str
    multiagent: bool = False  # trains PettingZoo envs only (and normalises values by default)
    # algo.* keys the trainer step reads at every update (never the actors), so a population may
    # change them live (population.explore) and algo.schedule may step them: the trainer sets the
    # optimizer's lr, and hands the step the algo section in effect (its `algo` argument)
    live: tuple[str, ...] = ("lr", "max_grad_norm")
    # a replay algorithm's section of algo (its n_step, batch_size and gradient_steps): dqn or sac;
    # empty for the on-policy algorithms, whose keys sit at the top of algo
    replay_section: str = ""
    continuous: bool = False  # Box actions, squashed into [-1, 1] by the policy (SAC, TD3)
    # a deterministic actor: the env ranks add Gaussian exploration noise to its actions (TD3)
    action_noise: bool = False
    # value decomposition (VDN, QMIX): how the agents' Q-values make the team's, 'sum' or 'qmix'
    mixer: str = ""
    # each row ends with the env's state by default (env.global_state; MAPPO's central critic reads it)
    global_state: bool = False

    @property
    def replay(self) -> bool:
        """Whether every learner trains from a replay shard (else: on-policy batches of fragments)."""
        return bool(self.replay_section)

    def reads(self, group: str) -> bool:
        """Whether this algorithm reads the algo keys of `group` (a config field's `reads`):
        'on_policy' (PPO's loss and batches), 'replay' (algo.replay), or a replay section's own
        keys, 'dqn' (algo.dqn), 'sac' (algo.sac) or 'team' (algo.team)."""
        if group not in READ_GROUPS:
            raise ValueError(f"no group of algo keys {group!r}; expected one of {READ_GROUPS}")
        return {"on_policy": not self.replay, "replay": self.replay}.get(group, self.replay_section == group)

    @property
    def reads_state(self) -> bool:
        """Whether something reads the env's state where env.global_state puts it on every row: a
        central critic, or QMIX's mixer (which reads every agent's observation without it, as EPyMARL's
        mixer does for envs with no state of their own)."""
        return self.global_state or self.mixer == "qmix"

    def stream(self, kind: str) -> Stream | None:
        return next((s for s in self.streams if s.kind == kind), None)


def readers(groups: tuple[str, ...]) -> list[str]:
    """The algorithms that read algo keys of any of `groups` (a config field's `reads`)."""
    return [name for name, a in ALGORITHMS.items() if any(a.reads(g) for g in groups)]


def algorithm_of(cfg) -> Algorithm:
    """The declaration of `cfg`'s algorithm (a validated config names one of ALGORITHMS)."""
    return ALGORITHMS[cfg.algo.name]


def state_size(model_cfg) -> int:
    """Floats of recurrent state per env row (model.core): 0 (none), h (GRU) or h and c side by side (LSTM)."""
    return {"none": 0, "gru": model_cfg.core_size, "lstm": 2 * model_cfg.core_size}[model_cfg.core]


def env_rows(cfg, spaces, envs: int | None = None) -> int:
    """Rows of `envs` envs (default: an env rank's): one per env, or per agent of a PettingZoo env."""
    return (cfg.env.num_envs if envs is None else envs) * spaces.num_agents


def inference_messages(cfg, spaces, groups: int) -> tuple[MessageSpec, MessageSpec]:
    """The inference stream's request and reply layouts: one channel per env group, so each
    carries num_envs / groups envs (core/messages.py), a row per agent (with several policies or
    a self-play pool, each row's policy id); the reply is the algorithm's."""
    n = env_rows(cfg, spaces, cfg.env.num_envs // groups)
    return (request_spec(n, spaces.observation, None, mask_actions(spaces), policies=rows_carry_policy(cfg),
                         recurrent=bool(state_size(cfg.model))),
            algorithm_of(cfg).reply(cfg, spaces, n))


def mask_actions(spaces) -> int:
    """The width of the action masks messages carry: the action count for envs that give masks, else 0."""
    return spaces.num_actions if spaces.action_mask else 0


def fragment_record(cfg, spaces) -> MessageSpec:
    """PPO/APPO's (and MAPPO's) record: a fragment of T steps x N env rows (core/messages.py), with
    the agents' active mask for PettingZoo envs."""
    return fragment_spec(cfg.algo.rollout_length, env_rows(cfg, spaces), spaces.observation, None,
                         spaces.action_shape, spaces.action_dtype, active=spaces.multiagent,
                         mask_actions=mask_actions(spaces), state_size=state_size(cfg.model),
                         selfplay_opponents=cfg.algo.selfplay.opponents_count)


def policy_reply(cfg, spaces, n: int) -> MessageSpec:
    """PPO/APPO's reply: sampled actions, their log-probabilities and the state values (and, with a
    recurrent core, the hidden state they were taken from)."""
    return reply_spec(n, spaces.action_shape, spaces.action_dtype, state_size(cfg.model))


def fragment_writer(cfg) -> str:
    """PPO/APPO's (and MAPPO's, IPPO's) record writer: fragments."""
    return "fragments"


def replay_record(cfg, spaces) -> MessageSpec:
    """DQN's record: rollout_length x num_envs n-step transitions (one per env step on average; in
    sync mode a record is exactly rollout_length steps of every env, which complete at most
    rollout_length + n_step transitions per env); with a recurrent Q-network (R2D2), sequences of
    algo.dqn.sequence_length steps, as many per env as start in rollout_length steps (one every
    sequence_period steps; at least one)."""
    if not state_size(cfg.model):
        section = getattr(cfg.algo, algorithm_of(cfg).replay_section)
        extra = section.n_step if cfg.algo.mode == "sync" else 0
        return transition_spec((cfg.algo.rollout_length + extra) * cfg.env.num_envs, spaces.observation, None,
                               spaces.action_shape, spaces.action_dtype)
    return sequence_spec(sequences_per_env(cfg) * cfg.env.num_envs, cfg.algo.dqn.sequence_length,
                         spaces.observation, None, spaces.action_shape, spaces.action_dtype, state_size(cfg.model))


def sequences_per_env(cfg) -> int:
    """R2D2: the sequences of each env a record carries: those that start in rollout_length steps."""
    return max(1, -(-cfg.algo.rollout_length // cfg.algo.dqn.sequence_period))


def replay_writer(cfg) -> str:
    """DQN's record writer: n-step transitions; with a recurrent Q-network (R2D2), sequences."""
    return "sequences" if state_size(cfg.model) else "transitions"


def action_reply(cfg, spaces, n: int) -> MessageSpec:
    """SAC's and TD3's reply: the policy's actions, squashed into [-1, 1] (the actor explores,
    rescales them to the env's bounds and stores them as they are)."""
    return action_reply_spec(n, spaces.action_shape)


def action_writer(cfg) -> str:
    """SAC's and TD3's record writer: n-step transitions of continuous actions."""
    return "actions"


def q_reply(cfg, spaces, n: int) -> MessageSpec:
    """DQN's reply: every action's Q-value (the actor explores and computes priorities), and with a
    recurrent Q-network the hidden state they came from."""
    return q_reply_spec(n, spaces.num_actions, state_size(cfg.model))


def team_record(cfg, spaces) -> MessageSpec:
    """VDN's and QMIX's record: episodes of whole teams (core/messages.py team_spec), as many as the
    envs can end in a record's steps: one per env and rollout_length steps in sync mode (episodes
    may last one step), one per env and episode_length steps (at least one) in async mode, where a
    record ships once another step might not fit."""
    t, T = cfg.algo.team, cfg.algo.rollout_length
    per_env = T if cfg.algo.mode == "sync" else max(1, -(-T // t.episode_length))
    return team_spec(per_env * cfg.env.num_envs, t.episode_length, spaces.num_agents, spaces.observation, None,
                     spaces.action_shape, spaces.action_dtype, state_size(cfg.model))


def team_writer(cfg) -> str:
    """VDN's and QMIX's record writer: episodes of whole teams."""
    return "teams"


# The streams of an actor -> policy server -> trainer dataflow (PPO and DQN alike).
ACTOR_LEARNER_STREAMS = (
    # actors ask a policy server (or, with inference ranks: 0, their inline policy) for actions
    Stream(INFERENCE, source="env", sink="inference"),
    # actors ship their records to their trainer; it grants credits
    Stream(SAMPLE, source="env", sink="learner", record="record"),
    # the trainer root publishes each policy version to the policy holders
    Stream(PARAMETER, source="learner", sink="inference"),
    # the trainer root (the controller) stops every rank
    Stream(CONTROL, source="learner", sink="*"),
)

# the loss's coefficients, and the advantages' discount and lambda (computed by the learner; env
# ranks that normalise rewards keep the discount they started with)
PPO_LIVE = ("lr", "ent_coef", "clip_coef", "vf_coef", "max_grad_norm", "gamma", "gae_lambda")

PPO = Algorithm(
    name="ppo",
    modes=("sync", "async"),
    streams=ACTOR_LEARNER_STREAMS,
    record=fragment_record,
    reply=policy_reply,
    writer=fragment_writer,
    policy="actor_critic",
    batch_source="fragments",
    step="ppo",
    live=PPO_LIVE,
    doc="PPO (mode sync: GAE, on-policy batches) and APPO (mode async: V-trace, the newest weights)",
)

# Multi-agent PPO on PettingZoo envs: each agent is a row of the actor's vector (envs/multiagent.py),
# the agents share one policy (parameter sharing) unless the policies table (core/policies.py) gives
# several; inactive agents are masked out of the loss.
# The two differ only in what the critic reads (Yu et al. 2022; de Witt et al. 2020 for IPPO).
MAPPO = Algorithm(
    name="mappo", modes=PPO.modes, streams=ACTOR_LEARNER_STREAMS, record=fragment_record,
    reply=policy_reply, writer=fragment_writer, policy="central_critic", batch_source=PPO.batch_source, step=PPO.step,
    multiagent=True, live=PPO_LIVE, global_state=True,
    doc="MAPPO: PPO whose critic reads the observations of every agent of the env (and the agent's index), "
        "with value normalisation; one policy shared by all agents, or one per entry of the policies table")

IPPO = Algorithm(
    name="ippo", modes=PPO.modes, streams=ACTOR_LEARNER_STREAMS, record=fragment_record,
    reply=policy_reply, writer=fragment_writer, policy="actor_critic", batch_source=PPO.batch_source, step=PPO.step,
    multiagent=True, live=PPO_LIVE,
    doc="IPPO: PPO on every agent's own observations (decentralised critic), with value normalisation; one "
        "policy shared by all agents, or one per entry of the policies table")

DQN = Algorithm(
    name="dqn",
    modes=("async", "sync"),  # sync: rounds tied to records by the replay ratio, which repeat
    streams=ACTOR_LEARNER_STREAMS,
    record=replay_record,
    reply=q_reply,
    writer=replay_writer,
    policy="q",
    batch_source="replay",
    step="dqn",
    replay_section="dqn",
    doc="Ape-X DQN: double DQN with a dueling head, n-step transitions from the actors with their initial "
        "priorities, a prioritized replay shard in every learner; with model.core, R2D2: sequences with their "
        "stored recurrent states, burn-in, priorities mixing max and mean TD error",
)

# Continuous control on DQN's dataflow: the same streams, records (n-step transitions of Box
# actions) and replay batch source; the actors' writer, the network and the step differ.
SAC = Algorithm(
    name="sac", modes=DQN.modes, streams=ACTOR_LEARNER_STREAMS, record=replay_record,
    reply=action_reply, writer=action_writer, policy="sac", batch_source=DQN.batch_source,
    step="sac", live=("lr",), replay_section="sac", continuous=True,
    doc="SAC: a squashed Gaussian actor, twin Q critics with Polyak-averaged targets, the entropy coefficient "
        "tuned towards a target entropy; n-step transitions from the actors into the learners' replay shards")

# Value decomposition on DQN's dataflow: the actors act per agent row on their agents' Q-values
# (a shared network that reads each agent's one-hot index, or one per agent), store episodes of
# the whole team, and the learners train the agents through a mixer of their Q-values.
VDN = Algorithm(
    name="vdn", modes=DQN.modes, streams=ACTOR_LEARNER_STREAMS, record=team_record, reply=q_reply,
    writer=team_writer, policy="team_q", batch_source=DQN.batch_source, step="team", replay_section="team",
    multiagent=True, mixer="sum",
    doc="VDN: every agent's Q-network (shared, or one per agent; feed-forward or recurrent), the team's Q the sum "
        "of its agents' (Sunehag et al. 2018), trained on whole episodes of the team with a target network and "
        "double-Q targets")

QMIX = dataclasses.replace(
    VDN, name="qmix", mixer="qmix",
    doc="QMIX: VDN's agents, the team's Q a monotonic mix of its agents' by a network whose non-negative weights "
        "hypernetworks make from the env's state (Rashid et al. 2018)")

TD3 = dataclasses.replace(
    SAC, name="td3", policy="td3", step="td3", action_noise=True,
    doc="TD3: a deterministic actor with Gaussian exploration noise per env, twin Q critics, target policy "
        "smoothing and delayed actor and target updates")

ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (PPO, MAPPO, IPPO, DQN, SAC, TD3, VDN, QMIX)}
