"""hpcrl as a library (`import hpcrl`; docs/python-api.md): the same runs, checks and messages as the
command line, which is a thin layer over these (tools/cli.py).

- `hpcrl.Config.from_yaml(path)`, `Config.from_dict({...})`: a checked config, with attribute
  access (`cfg.algo.lr`); a ConfigError says what is wrong and where, as `hpcrl run` does.
- `hpcrl.run(config)`: called on every rank of a script started under `mpirun` or `srun`, as
  `python -m hpcrl run` is; returns the run's exit status (the same on every rank). Several runs
  may follow one another in one script (one allocation, several configs).
- `hpcrl.load_policy(run_dir)`: a run's latest checkpoint as a player of one env's observations.
- `hpcrl.evaluate(run_dir, episodes)`: `hpcrl eval`'s games, as an EvalResult.

`load_policy` and `evaluate` read a run directory as data, as `hpcrl eval` does: no module its
config names is imported without `trust_code=True`, and weights that do not fit are refused.
"""
from __future__ import annotations

from hpcrl.core.config import Config, ConfigError  # noqa: F401 (the API's: no torch, no MPI)


def run(config: str | Config, overrides: tuple[str, ...] = (), overwrite: bool = False) -> int:
    """Run `config` (a Config, or a config file's path) on the MPI job this process is a rank of,
    with `KEY=VALUE` overrides as --set gives them; every rank of the job calls it. Returns the
    exit status `hpcrl run` would exit with: 0 done, 2 a config error (one message, nothing
    written), 3 preempted by a signal (a checkpoint written), 4 an output that could not be
    written. A run of a Config writes it to the run directory's config.yaml as a file's would be."""
    from hpcrl.launch.run import run as run_on_this_rank  # imports mpi4py, which initialises MPI
    return run_on_this_rank(config, tuple(overrides), overwrite)


def load_policy(run_dir: str, deterministic: bool = False, seed: int = 0, trust_code: bool = False):
    """The latest checkpoint of `run_dir` as a player (workers/player.py Player): `act(obs,
    mask=None)` returns the actions for one env's observation (a multi-agent env's rows: one per
    agent; a Dict observation: its leaves as numpy arrays), sampled or, with `deterministic`, the
    most likely; a recurrent policy keeps its state from call to call (`ended(starts)` zeroes it
    for the rows whose episode ended). RunDirError or CheckpointError for what it cannot play."""
    import torch

    from hpcrl.envs import env_spaces
    from hpcrl.tools.evaluate import load_run, policy_of, refuse_untrusted_code
    cfg, checkpoint, found, _ = load_run(run_dir)
    if not trust_code:
        refuse_untrusted_code(cfg, run_dir)
    return policy_of(cfg, checkpoint, found, env_spaces(cfg.env), "greedy" if deterministic else "sample",
                     torch.Generator().manual_seed(seed))


def evaluate(run_dir: str, episodes: int = 10, deterministic: bool = False, seed: int = 0, video: str | None = None,
             opponent: str | None = None, trust_code: bool = False):
    """`hpcrl eval`'s games of the run's latest checkpoint: an EvalResult (tools/evaluate.py: its
    returns, lengths, checkpoint, policy version and frames; `summary()` as `hpcrl eval --json`
    prints it). RunDirError, CheckpointError or ConfigError for what it cannot play."""
    from hpcrl.tools.evaluate import evaluate as play
    return play(run_dir, episodes, deterministic, seed, video, opponent, trust_code)
