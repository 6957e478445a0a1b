"""`hpcrl run`'s start-up, as a list of phases (PHASES), each run by every rank in the same order:
read the config (rank 0), split a population's job, plan the layout, check the env and the model
(rank 0), check every rank's roles, prepare the run directory. Each ends in `StartUp.settle`, so a
verdict reaches every rank and a refusal is one message and one exit status everywhere; nothing is
written until the last check has passed.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import threading
from dataclasses import dataclass, field

from hpcrl.core.config import Config, ConfigError, load_config
from hpcrl.core.config_model import is_custom
from hpcrl.core.layout import Layout, plan_layout
from hpcrl.core.members import check_members
from hpcrl.core.policies import num_policies, policy_names, policy_spaces
from hpcrl.core.sizing import Sizes, memory_problem
from hpcrl.core.startup import CLOCK
from hpcrl.core.stop import EXIT_CONFIG_ERROR, EXIT_OUTPUT_FAILED
from hpcrl.envs import EnvSpaces, env_spaces
from hpcrl.envs.scripted import anchor_players
from hpcrl.io import rundir
from hpcrl.launch.packed import Packed
from hpcrl.launch.population import Alone, Population, population_launch
from hpcrl.launch.wiring import holds_a_policy
from hpcrl.runtime import comm, traffic


def _load(config_path: str, overrides: tuple[str, ...], given: Config | None = None) -> dict:
    """Rank 0 reads the config, which every rank needs to know its roles (whether the role counts
    fit the world size, every rank then finds from the layout). The config, or an error. `given`:
    a Config built in Python (hpcrl.run), checked again as a file is (its attributes may have
    been set since it was built)."""
    try:
        cfg = (load_config(config_path, overrides)[0] if given is None
               else Config.from_dict(given.to_dict(), overrides, source=config_path))
        try:
            check_members(cfg)
        except ConfigError as exc:
            raise ConfigError(f"{config_path}: {exc}") from None
        return {"cfg": cfg}
    except ConfigError as exc:
        return {"error": str(exc)}


def _preload(layout: Layout, rank: int) -> None:
    """Import torch in a background thread where this rank holds a policy, while it waits for rank
    0's checks (a sleeping wait, which leaves the thread the core): a policy server was ready
    about 1 s after the checks before, and 0.1-0.2 s with this. (Rank 0 imports torch for its
    checks at once.) A failed import is left for the role to raise, in the main thread."""
    if rank == 0 or not holds_a_policy(layout, rank):
        return  # remote-inference actors never import torch

    def load() -> None:
        try:
            importlib.import_module("torch")
        except BaseException:  # noqa: BLE001
            pass

    threading.Thread(target=load, name="hpcrl-preload", daemon=True).start()


def _check(cfg: Config, layout: Layout, sizes: Sizes, config_path: str) -> dict:
    """Rank 0's start-up checks, before anything is written: env, memory, the policies' sizes.
    Returns state, or an error."""
    try:
        spaces = env_spaces(cfg.env)
        _check_anchors(cfg)
        from hpcrl.core.network_shapes import policy_params  # counted, nothing allocated
        custom = None
        if is_custom(cfg.model.encoder):  # the user's own encoder: only building it tells its size (on meta)
            from hpcrl.models.custom import custom_trunk
            custom = custom_trunk(cfg.model)
        problem = memory_problem(cfg, layout, sizes, spaces, policy_params(cfg, spaces, custom))  # before allocating
        if problem:
            raise ConfigError(f"{config_path}: {problem}")
        from hpcrl.models import build_policy, num_params  # torch, on rank 0 only
        # each policy's size, once: it sizes the weights messages on every rank, and a model that
        # cannot take the observations (or a policies table that does not fit the env's agents) is
        # a ConfigError now, not on every rank later
        models = [build_policy(s, cfg) for s in policy_spaces(spaces, cfg.policies)]
        # what a checkpoint to resume must hold (rundir.prepare checks it before it changes anything)
        shapes = {name: {key: tuple(value.shape) for key, value in model.state_dict().items()}
                  for name, model in zip(policy_names(cfg.policies), models)}
        return {"spaces": spaces, "num_params": [num_params(m) for m in models], "shapes": shapes}
    except ConfigError as exc:
        return {"error": str(exc)}


def _check_anchors(cfg: Config) -> None:
    """A self-play run's anchors import, and the learners can rate against them: a ConfigError now,
    not a failure of every env rank later."""
    anchor_players(cfg.algo.selfplay)
    if cfg.algo.selfplay.anchors and importlib.util.find_spec("openskill") is None:
        raise ConfigError("algo.selfplay.anchors: rating against anchors needs the openskill package: "
                          "pip install 'hpcrl[multiagent]' (or openskill), or remove the anchors")


def _prepare(cfg: Config, overwrite: bool, shapes: dict, relaunch: str) -> dict:
    """Rank 0, once every rank's checks have passed: lock, create or resume the run directory."""
    def fits(path: str) -> None:
        from hpcrl.io.checkpoint import check_fits, load_checkpoint
        check_fits(load_checkpoint(path), shapes, path)

    try:
        return {"start": rundir.prepare(cfg, overwrite, relaunch, check_checkpoint=fits)}
    except ConfigError as exc:
        return {"error": str(exc)}
    except OSError as exc:  # a full disk or an unwritable output_dir: not a config mistake
        where = f" {exc.filename}" if exc.filename else ""
        return {"error": f"cannot prepare the run directory{where}: {rundir.os_reason(exc)}"
                         f"{rundir.free_space(exc.filename) if exc.filename else ''}; fix that, then run the same "
                         f"command again", "status": EXIT_OUTPUT_FAILED}


class Refusal(Exception):
    """A start-up phase's verdict that ends the run before anything is written: its one message
    and exit status (2, or 4 for a run directory that cannot be written)."""

    def __init__(self, message: str, status: int = EXIT_CONFIG_ERROR):
        super().__init__(message)
        self.message, self.status = message, status


@dataclass
class StartUp:
    """What the start-up phases find, each phase filling in its part, in order."""

    config_path: str
    overrides: tuple[str, ...]
    overwrite: bool
    member: Alone  # what a population member does around its run (Alone: nothing), and its world
    cfg: Config | None = None
    given: Config | None = None  # a config built in Python (hpcrl.run), instead of config_path's file
    nodes: object = None  # rank -> node index
    hosts: list = field(default_factory=list)
    layout: Layout | None = None
    sizes: Sizes | None = None
    spaces: EnvSpaces | None = None
    num_params: list = field(default_factory=list)
    shapes: dict | None = None  # (rank 0) each policy's weights' shapes, which a checkpoint resumed must fit
    start: rundir.RunStart | None = None

    @property
    def world(self):
        """The run's communicator: the job's, or a population member's block of it."""
        return self.member.world

    @property
    def rank(self) -> int:
        return self.world.Get_rank()

    @property
    def size(self) -> int:
        return self.world.Get_size()

    def settle(self, verdict: dict, agreed: bool = False) -> dict:
        """One verdict for every rank (with a population, every member agrees unless `agreed`
        already: one refusal stops them all; MPI over the job), or a Refusal. Each phase that may
        refuse ends here."""
        if not agreed:
            verdict = self.member.agree(verdict)
        if "error" in verdict:
            raise Refusal(verdict["error"], verdict.get("status", EXIT_CONFIG_ERROR))
        return verdict


def _read_config(s: StartUp) -> None:
    """MPI: rank 0 reads the config and its verdict reaches every rank."""
    s.cfg = s.settle(comm.broadcast_object(s.world, _load(s.config_path, s.overrides, s.given)
                                           if s.rank == 0 else None))["cfg"]


def _split_population(s: StartUp) -> None:
    """With a population section, this member's block of ranks is the run's world from here on."""
    if not s.cfg.population.members:
        return
    launch = s.settle(comm.broadcast_object(s.world, population_launch(s.cfg, s.size, s.overwrite, s.config_path)
                                            if s.rank == 0 else None), agreed=True)
    if "packed" in launch:  # more members still training than ranks: they take turns (launch/packed.py)
        s.member = Packed(s.cfg, launch["packed"], launch["complete"])  # MPI: the job
    else:
        s.member = Population(s.cfg, launch["running"], launch["standing"], launch.get("complete", ()))  # the job
    s.cfg = s.member.cfg


def _plan(s: StartUp) -> None:
    """Every rank plans the same layout from the same gathered facts, and the sizes it implies."""
    s.nodes, s.hosts = comm.node_of_rank(s.world), comm.host_names(s.world)
    traffic.locate(s.world, s.nodes)
    try:
        s.layout = plan_layout(s.cfg.roles, s.size, s.nodes, _gpus_of_rank(s.world, s.cfg, s.nodes),
                               num_policies(s.cfg.policies))
        s.sizes = Sizes.of(s.cfg, s.layout)  # once, for every worker: algo.batch_frames fits, slots hold a batch
        verdict = {}
    except ConfigError as exc:
        verdict = {"error": str(exc)}
    s.settle(verdict)
    _preload(s.layout, s.rank)


def _check_env_and_model(s: StartUp) -> None:
    """MPI: rank 0 checks the env, the memory and the policies; every rank learns their sizes."""
    checked = _check(s.cfg, s.layout, s.sizes, s.config_path) if s.rank == 0 else None
    s.shapes = checked.pop("shapes", None) if checked else None
    state = s.settle(comm.broadcast_object(s.world, checked))
    s.spaces, s.num_params = state["spaces"], state["num_params"]


def _check_every_rank(s: StartUp) -> None:
    """MPI: what keeps any rank from its roles (threads, devices); every rank sees the same list."""
    problems = [p for p in comm.all_gather_objects(s.world, _rank_problem(s.cfg, s.layout, s.sizes, s.rank)) if p]
    more = f" (and {len(problems) - 1} more ranks)" if len(problems) > 1 else ""
    s.settle({"error": problems[0] + more} if problems else {})
    CLOCK.mark("checks")


def _prepare_run_dir(s: StartUp) -> None:
    """Only now is anything written: rank 0 locks and prepares the run directory (a population's
    directory first)."""
    s.settle(s.member.prepare(s.overwrite), agreed=True)  # a population's directory: one verdict for the job
    prepared = _prepare(s.cfg, s.overwrite, s.shapes, s.member.relaunch()) if s.rank == 0 else None
    s.start = s.settle(comm.broadcast_object(s.world, prepared))["start"]
    CLOCK.mark("run_dir")


# Nothing is written until every check has passed on every rank: the config (rank 0), every rank's
# layout, rank 0's env, memory and model checks, then every rank's devices; only then does rank 0
# prepare the run directory.
MEMBER_PHASES = (_plan, _check_env_and_model, _check_every_rank, _prepare_run_dir)  # a run whose config is read
PHASES = (_read_config, _split_population, *MEMBER_PHASES)


def visible_gpus() -> int:
    """NVIDIA GPUs this process may use, without importing torch (env ranks never do): the
    driver's device list, narrowed by CUDA_VISIBLE_DEVICES."""
    try:
        present = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return present
    wanted = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
    return min(present, len(wanted))


def _gpus_of_rank(world, cfg: Config, nodes):
    """Per rank, the GPUs of its node (the most any rank there sees); None when no role wants cuda."""
    if all(getattr(cfg.roles, role).device == "cpu" for role in ("learner", "inference", "env")):
        return None
    import numpy as np
    seen = np.array(comm.all_gather_objects(world, visible_gpus()), dtype=np.int64)  # MPI: start-up control message
    per_node = {node: seen[nodes == node].max() for node in np.unique(nodes)}
    return np.array([per_node[node] for node in nodes], dtype=np.int64)


def _rank_problem(cfg: Config, layout: Layout, sizes: Sizes, rank: int) -> str | None:
    """What keeps this rank from its roles, found before any work: a config error on every rank.
    A learner needs MPI_THREAD_MULTIPLE; a rank asked to run its policy on a GPU needs one."""
    roles = layout.roles_of(rank)
    if "learner" in roles and (problem := comm.thread_level_problem(rank)):
        return problem
    if "env" in roles and (problem := comm.group_tag_problem(sizes.env_groups)):
        return problem
    for role in roles:
        device = getattr(cfg.roles, role).device
        if role == "env" and not layout.inline_inference:
            continue  # the env rank's policy lives on its inference rank
        if device == "cuda":
            import torch
            if not torch.cuda.is_available():
                return (f"roles.{role}.device is 'cuda' but rank {rank} sees no CUDA device "
                        f"(torch.cuda.is_available() is False); use device: cpu or run on GPU nodes")
    return None


