"""hpcrl's networks and what builds them: actor-critics (networks.py, recurrent.py), Q-networks
(q.py), SAC's and TD3's actor and twin critics (sac.py), Dict observations (structured.py),
their building blocks (layers.py), and the runners that run them for policy holders and pack
their weights (runner.py); the trainers' optimizer (adam.py) and a population member's state as
contiguous arrays (arena.py, member.py). The modules import one another only downward (layers <-
structured <- networks <- recurrent <- q; networks <- sac; runner; arena <- adam <- member), and
this package's builders sit above them all. The user's own encoder (custom.py) is built where an
encoder is, below networks."""
from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from hpcrl.core.config import Config, ModelConfig
from hpcrl.core.network_shapes import check_env_kind
from hpcrl.models.adam import Adam
from hpcrl.models.member import member_arrays, member_layout  # noqa: F401 (a member's state for population copies)
from hpcrl.models.networks import ActorCritic, ObservationInput  # noqa: F401
# the runners and the weights message (models/runner.py), importable from here as before
from hpcrl.models.runner import (PolicyRunner, Runner, copy_params_to, load_params_from,  # noqa: F401
                                 num_params, policy_digest, policy_tensors)

if TYPE_CHECKING:  # not at run time: inference ranks need no gymnasium
    from hpcrl.envs import EnvSpaces


def build_model(spaces: EnvSpaces, cfg: ModelConfig, **kwargs) -> ActorCritic:
    """An actor-critic, recurrent with model.core (models/recurrent.py)."""
    if cfg.core != "none":
        from hpcrl.models.recurrent import RecurrentActorCritic
        return RecurrentActorCritic(spaces, cfg, **kwargs)
    return ActorCritic(spaces, cfg, **kwargs)


def build_optimizer(model: nn.Module, cfg: Config) -> Adam:
    """The trainers' optimizer (and what `hpcrl tune` times): Adam, fused into one kernel for all
    parameters (7x faster than the per-tensor loop on small MLPs here), without torch.optim
    (models/adam.py: its first use imports torch._dynamo, about 1 s)."""
    return Adam(model.parameters(), lr=cfg.algo.lr, eps=1e-5)


def build_policy(spaces: EnvSpaces, cfg: Config) -> ObservationInput:
    """The network of cfg's algorithm (its declaration's `policy`): an actor-critic (with a central
    critic for MAPPO), or a Q-network."""
    from hpcrl.core.dataflow import ALGORITHMS
    algorithm = ALGORITHMS[cfg.algo.name]
    if algorithm.policy == "q":
        from hpcrl.models.q import build_q_network
        return build_q_network(spaces, cfg)
    if algorithm.policy == "team_q":
        from hpcrl.models.team import TeamQNetwork
        return TeamQNetwork(spaces, cfg)
    if algorithm.continuous:
        from hpcrl.models.sac import build_continuous
        return build_continuous(spaces, cfg)
    check_env_kind(cfg, spaces)
    return build_model(spaces, cfg.model, central_critic=algorithm.policy == "central_critic",
                       value_norm=bool(cfg.algo.value_norm))


def make_runner(model: ObservationInput, device: str, seed: int, play: str | None = None,
                draw_key: int | None = None) -> Runner:
    """The runner that answers requests with `model`: PolicyRunner, QRunner or ContinuousRunner;
    with `play` ("sample" or "greedy", hpcrl eval), one that answers with actions alone
    (models/runner.py)."""
    from hpcrl.models.q import QNetwork, QRunner
    from hpcrl.models.sac import ContinuousActorCritics, ContinuousRunner
    from hpcrl.models.team import TeamQNetwork
    cls = (QRunner if isinstance(model, (QNetwork, TeamQNetwork))
           else ContinuousRunner if isinstance(model, ContinuousActorCritics)
           else PolicyRunner)
    return cls(model, device, seed, play=play, draw_key=draw_key)
