"""`hpcrl tune CONFIG --ranks-per-node C [--nodes N] [-o tuned.yaml] [--budget-s S]`: measure this
machine for the config (env steps, policy forwards, trainer updates, stream messages), then choose
the role counts, envs per env rank, env groups and inline or remote inference that the throughput
model predicts fastest for the target nodes, keeping the algorithm as the config has it: the
frames per update stay the config's own (algo.batch_frames, or what its roles table gives at the
target size), and algo.rollout_length and every other setting are untouched.

One idea per module; `tune` below runs them in order:
- measure.py: the costs measured in this one process (stream messages through runtime/message_costs.py),
  and the start of averaging.py, which measures on two ranks under mpirun what averaging
  gradients between learners adds to a gradient step;
- costs.py: the measurements saved to a file, and read back instead of measuring;
- model.py: the throughput model, from measured costs to a layout's frames per second;
- search.py: the layouts to try, from `hpcrl plan`'s planner and checked as a run would check
  them (nothing is planned twice), and the one chosen;
- report.py: the tuned config's header, and what the command prints.
"""
from __future__ import annotations

from dataclasses import dataclass

from hpcrl.core.config import ConfigError, load_config, to_dict
from hpcrl.core.layout import plan_layout, simulated_nodes
from hpcrl.envs import env_spaces
from hpcrl.core.sizing import DEFAULT_MEMORY_PER_RANK
from hpcrl.tools.tune.costs import load_costs, save_costs
from hpcrl.tools.tune.measure import AVERAGING_LAUNCHER, fitted, measure_all, measure_averaging
from hpcrl.tools.tune.report import header
from hpcrl.tools.tune.search import Choice, candidates, choose, fixed_learners


@dataclass
class Tuned:
    """What `tune` returns: the tuned config and what led to it."""

    text: str  # the tuned config: its header and YAML
    best: Choice
    ranked: list[Choice]  # every candidate, fastest first
    own: Choice | None  # the config's own layout, predicted alike (None: it does not fit)
    points: dict  # the measurements: name -> (sizes, CPU seconds)


def tune(config_path: str, ranks_per_node: int, nodes: int = 1, cores_per_node: float | None = None,
         budget_s: float = 60.0, overrides: tuple[str, ...] = (),
         averaging_launcher: str | None = AVERAGING_LAUNCHER,
         gpus_per_node: int = 0, costs: str | None = None, costs_out: str | None = None,
         memory_per_rank: int = DEFAULT_MEMORY_PER_RANK) -> Tuned:
    """Measure, choose, and return the tuned config with what led to it. `averaging_launcher`: how
    to start the two-rank run that measures averaging between learners (None: not measured; several
    learners are charged the ring's messages). `costs`: a file of costs saved with `costs_out`
    instead of measuring."""
    import torch
    import yaml
    cfg, _ = load_config(config_path, overrides)
    spaces = env_spaces(cfg.env)
    gpu = gpus_per_node > 0 or "cuda" in (cfg.roles.learner.device, cfg.roles.inference.device)
    world = nodes * ranks_per_node
    source = ""  # where the costs were measured, when not here and now
    if costs:
        points, saved_on = load_costs(costs, cfg, spaces)
        source = f" on {saved_on}, from {costs}"
    else:
        if gpu and not torch.cuda.is_available():
            raise ConfigError("GPU costs are measured on a GPU, and this machine has none (torch.cuda.is_available() "
                              "is False): run hpcrl tune --save-costs FILE on a node with a GPU, then --costs FILE "
                              "here")
        points = measure_all(cfg, spaces, budget_s, gpu)
        if averaging_launcher and world >= 4 and fixed_learners(
                cfg, plan_layout(cfg.roles, world, simulated_nodes(world, ranks_per_node))) != 1:
            # layouts of several learners are candidates
            points["averaging"] = ([2], [measure_averaging(config_path, overrides, budget_s / 8, averaging_launcher)])
    if gpu and "update_cuda" not in points:
        raise ConfigError(f"--costs {costs}: measured without a GPU, so GPU layouts cannot be predicted; save them "
                          f"on a node with a GPU")
    if costs_out:
        save_costs(costs_out, cfg, spaces, points)
    measured = fitted(points, spaces.num_agents)
    cores = float(cores_per_node or ranks_per_node) * nodes
    ranked, own = candidates(cfg, spaces, measured, ranks_per_node, nodes, cores, memory_per_rank, gpus_per_node)
    best = choose(ranked, own)
    text = header(config_path, points, best, own.prediction if own else None, nodes, ranks_per_node, cores,
                  gpus_per_node, source)
    return Tuned(text + yaml.safe_dump(to_dict(best.cfg), sort_keys=False), best, ranked, own, points)
