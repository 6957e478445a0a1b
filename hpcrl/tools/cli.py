"""Command line: `hpcrl run CONFIG.yaml` (under mpirun/srun), `hpcrl plan` and `hpcrl sbatch`; for a
run directory `hpcrl inspect`, `hpcrl plot` and `hpcrl eval`; `hpcrl stage`; `hpcrl config-reference`."""
from __future__ import annotations

import argparse
import os
import sys
from hpcrl.core.say import say


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hpcrl", description="Distributed reinforcement learning over MPI.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train: every MPI rank runs this; the config assigns the roles",
                         description="Run under mpirun/srun, e.g. mpirun -n 4 python -m hpcrl run jobs/cartpole_ppo.yaml")
    run.add_argument("config", help="rank-role YAML config")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config value, e.g. --set run.total_frames=20000 (repeatable)")
    run.add_argument("--overwrite", action="store_true", help="replace an existing run directory of the same name")
    run.add_argument("--verbose", action="store_true",
                     help="each rank prints where its start-up time went (imports, MPI, checks, building its roles, "
                          "up to its first piece of work), once; metrics.h5 keeps them for every rank either way")
    plan = sub.add_parser("plan", help="print the layout a config gets at a world size (no MPI needed)")
    plan.add_argument("config", help="rank-role YAML config")
    plan.add_argument("--world-size", type=int, required=True, help="number of MPI ranks")
    plan.add_argument("--ranks-per-node", type=int, help="MPI ranks per node, placed in blocks (default: one node)")
    plan.add_argument("--env-steps-per-s", type=float, default=1000.0,
                      help="vector steps per second per env rank, for the traffic estimate (default 1000)")
    plan.add_argument("--gpus-per-node", type=int, help="GPUs on every node: roles with device cuda go only where "
                      "there are GPUs (default: not checked)")
    plan.add_argument("--per-rank", action="store_true", help="list every rank (default for up to 64 ranks)")
    plan.add_argument("--memory-per-rank-gib", type=float, default=4.0,
                      help="memory one rank may use; roles whose buffers, batch and model need more are "
                           "warned about (default 4)")
    plan.add_argument("--mds-ops-per-s", type=float, default=None,
                      help="metadata calls per second the shared file system's metadata server serves, for the "
                           "start-up estimate, unstaged and staged (hpcrl stage; default 20,000)")
    plan.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    sb = sub.add_parser("sbatch", help="write a SLURM job script that fits the config's layout (no MPI needed)")
    sb.add_argument("config", help="rank-role YAML config (as the job will find it, relative to the submit dir)")
    sb.add_argument("--nodes", type=int, required=True)
    sb.add_argument("--ntasks-per-node", type=int, required=True, help="MPI ranks per node")
    sb.add_argument("--time", default="01:00:00", help="wall-clock limit, [D-]HH:MM:SS (default 01:00:00)")
    sb.add_argument("--launcher", default="mpirun", help="mpirun (default) or srun")
    sb.add_argument("--partition")
    sb.add_argument("--account")
    sb.add_argument("--no-kill", action="store_true",
                    help="a self-healing script: a lost node does not end the allocation, and the script "
                         "relaunches hpcrl on the nodes still answering, which resumes from its checkpoint")
    sb.add_argument("--max-relaunches", type=int, default=None,
                    help="with --no-kill: relaunches per job at most (default 3; HPCRL_MAX_RELAUNCHES at submit "
                         "time overrides it)")
    sb.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config value for the layout's plan; the script passes it to hpcrl run")
    sb.add_argument("--stage", nargs="?", const="", default=None, metavar="NODE_DIR",
                    help="stage the Python environment: pack it once, unpack it once per node into NODE_DIR "
                         "(default $SLURM_TMPDIR, else /tmp) and start every rank from there (hpcrl stage)")
    sb.add_argument("-o", "--output", help="write the script here (default: print it)")
    ins = sub.add_parser("inspect", help="print a run directory's config, progress and checkpoints (no MPI)")
    ins.add_argument("run_dir", help="run directory (run.output_dir/run.name, e.g. runs/cartpole_ppo)")
    ins.add_argument("--config", action="store_true", help="print the whole resolved config, not a summary")
    ins.add_argument("--json", action="store_true", help="print the report as JSON")
    pl = sub.add_parser("plot", help="plot learning curves of run directories against frames and wall time",
                        description="Runs that differ only in run.seed and run.name are one group: their mean "
                                    "with a band of one standard deviation. A population's directory (population."
                                    "members) is drawn alone: each member's curve with its exploits marked, and "
                                    "the hyperparameters explore gave it.")
    pl.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                    help="run directories; a directory of run directories (e.g. runs) stands for all of them")
    pl.add_argument("-o", "--output", default="curves.png", help="image file; format from the extension (default curves.png)")
    pl.add_argument("--metric", help="series of metrics.h5 to plot (default: rating, for self-play against anchors, "
                                         "else return_window_mean, else return_mean)")
    pl.add_argument("--smooth", type=float, default=0.0,
                    help="exponential moving average weight in [0, 1), as TensorBoard's slider (default 0: none)")
    pl.add_argument("--group-by", choices=("config", "name", "none"), default="config",
                    help="config (default): same config but seed/name; name: same run name once a trailing "
                         "seed suffix (_s1, -seed2, _3) is removed; none: every run alone")
    ev = sub.add_parser("eval", help="play a run's latest checkpoint for some episodes in one process (no MPI)")
    ev.add_argument("run_dir", help="run directory (run.output_dir/run.name, e.g. runs/cartpole_ppo)")
    ev.add_argument("--episodes", type=int, default=10, help="episodes to play (default 10)")
    ev.add_argument("--deterministic", action="store_true", help="take the most likely action instead of sampling")
    ev.add_argument("--seed", type=int, default=0, help="seed of the env and of action sampling (default 0)")
    ev.add_argument("--video", metavar="OUT.mp4", help="render every step of every episode into this video")
    ev.add_argument("--json", action="store_true", help="print the result as JSON (every episode's return too)")
    ev.add_argument("--trust-code", "--trust-env-code", dest="trust_code", action="store_true",
                    help="import the modules the run's config names: its env where env.id names a module outside "
                         "the env families hpcrl supports (mypackage:MyEnv), called with env.kwargs, and its own "
                         "model.encoder (mypackage.nets:Encoder), built with model.encoder_kwargs. A run directory "
                         "is data: pass this only for runs whose author you trust (--trust-env-code: the same)")
    ev.add_argument("--opponent", metavar="random|RUN_DIR|MODULE:FUNCTION",
                    help="multi-agent games: play one seat (each in turn) against a uniform player of valid "
                         "actions, another run's latest checkpoint (another member of a population), or a "
                         "scripted player: a function of an importable module called with the rows' "
                         "observations, action masks and a numpy generator, returning one action per row; "
                         "counts wins, draws and losses")
    tu = sub.add_parser("tune", help="measure this machine for a config and write the layout the throughput "
                        "model predicts fastest for the target nodes (one process, MPI as a singleton; and two learners "
                        "under mpirun to measure gradient averaging)")
    tu.add_argument("config", help="rank-role YAML config")
    tu.add_argument("--ranks-per-node", type=int, required=True, help="MPI ranks per node of the target job")
    tu.add_argument("--nodes", type=int, default=1, help="nodes of the target job (default 1)")
    tu.add_argument("--cores-per-node", type=float, help="cores per node (default: one per rank; on this machine "
                    "set its own core count to tune an oversubscribed local job)")
    tu.add_argument("--budget-s", type=float, default=60.0, help="seconds of measuring (default 60)")
    tu.add_argument("-o", "--output", help="write the tuned config here (default: print it)")
    tu.add_argument("--top", type=int, default=5, help="how many of the best layouts to list (default 5)")
    tu.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    tu.add_argument("--averaging-launcher", default="mpirun -n 2",
                    help="how to start the 2-rank measurement of averaging gradients between learners (default "
                         "'mpirun -n 2'; e.g. 'srun -n 2' in an allocation)")
    # its former name, hidden: users' scripts still pass it
    tu.add_argument("--probe-launcher", dest="averaging_launcher", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    tu.add_argument("--gpus-per-node", type=int, default=0,
                    help="GPUs per node of the target job: learners and inference ranks may go on them (one per "
                         "rank); their costs are measured on this machine's GPU, or come from --costs")
    tu.add_argument("--save-costs", metavar="FILE", help="also write what was measured to FILE (JSON)")
    tu.add_argument("--costs", metavar="FILE", help="plan from costs saved with --save-costs (on a compute node, "
                    "say) instead of measuring here")
    tu.add_argument("--memory-per-rank-gib", type=float, default=4.0,
                    help="memory one rank may use (default 4); layouts that need more are left out")
    tu.add_argument("--no-averaging-measure", action="store_true",
                    help="skip that measurement: several learners are charged only the allreduce's messages")
    # its former name, hidden: users' scripts still pass it
    tu.add_argument("--no-learner-probe", dest="no_averaging_measure", action="store_true",
                    default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    st = sub.add_parser("stage", help="pack this Python environment into one archive, or unpack it once per node "
                        "into node-local storage, so ranks import from there (no MPI needed)",
                        description="hpcrl stage pack -o stage  (prints the archive), then once per node: "
                                    "hpcrl stage unpack ARCHIVE --to /tmp  (prints the staged python to start "
                                    "ranks with); see docs/clusters.md")
    stage_sub = st.add_subparsers(dest="stage_command", required=True)
    st_pack = stage_sub.add_parser("pack", help="write (or reuse) the archive of the environment with hpcrl in it")
    st_pack.add_argument("-o", "--output-dir", default="stage", help="where the archive goes (default: stage)")
    st_pack.add_argument("--env", "--venv", dest="env", help="the venv or conda environment to pack (default: "
                         "the one running this)")
    st_unpack = stage_sub.add_parser("unpack", help="extract (or reuse) the archive on this node")
    st_unpack.add_argument("archive", help="the archive hpcrl stage pack printed")
    st_unpack.add_argument("--to", help="node-local directory (default: $SLURM_TMPDIR, else /tmp)")
    ref = sub.add_parser("config-reference", help="write the config reference (every key, its type, default "
                         "and meaning) as Markdown")
    ref.add_argument("-o", "--output", help="write it here, e.g. docs/config.md (default: print it)")
    return p


def _user_error(message: str) -> int:
    """A user mistake: one line on stderr, no traceback, exit status 2 (as `hpcrl run`'s config errors)."""
    print(message, file=sys.stderr)
    return 2


def _config_reference(args) -> int:
    from hpcrl.tools.docs import config_reference
    text = config_reference()
    if not args.output:
        sys.stdout.write(text)
        return 0
    try:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        return _user_error(f"hpcrl: config-reference: cannot write {args.output!r}: {exc.strerror}")
    say(f"wrote {args.output}")
    return 0


def _eval(args) -> int:
    import json

    from hpcrl.core.config import ConfigError
    if args.episodes < 1:
        return _user_error(f"hpcrl: eval: --episodes: expected at least 1, got {args.episodes}")
    from hpcrl.io.checkpoint import CheckpointError
    from hpcrl.tools.api import evaluate
    from hpcrl.tools.evaluate import format_result
    from hpcrl.tools.inspect import RunDirError
    if refusal := _a_population("eval", args.run_dir):
        return _user_error(refusal)
    try:
        result = evaluate(args.run_dir, args.episodes, args.deterministic, args.seed, args.video, args.opponent,
                          args.trust_code)
    except (RunDirError, ConfigError, CheckpointError) as exc:
        return _user_error(f"hpcrl: eval: {exc}")
    print(json.dumps(result.summary(), indent=2) if args.json else format_result(result, args.run_dir))
    return 0


def _plot(args) -> int:
    from hpcrl.tools.plot import PlotError, plot_runs
    from hpcrl.tools.inspect import RunDirError
    if not 0.0 <= args.smooth < 1.0:
        return _user_error(f"hpcrl: plot: --smooth: expected a weight in [0, 1), got {args.smooth}")
    from hpcrl.tools.plot_population import is_population, plot_population
    try:
        populations = [d for d in args.run_dirs if is_population(d)]
        if populations and len(args.run_dirs) > 1:
            raise PlotError(f"{populations[0]!r} is a population's directory: plot it alone (its members side by "
                            f"side), or name its member directories among other runs")
        if populations:
            members = plot_population(populations[0], args.output, args.metric, args.smooth)
            say(f"wrote {args.output}: the {len(members)} members of {populations[0]}")
            return 0
        groups = plot_runs(args.run_dirs, args.output, args.metric, args.smooth, args.group_by)
    except (RunDirError, PlotError) as exc:
        return _user_error(f"hpcrl: plot: {exc}")
    runs = sum(len(dirs) for _, dirs in groups)
    say(f"wrote {args.output}: {runs} run{'s' * (runs != 1)} in {len(groups)} "
        f"curve{'s' * (len(groups) != 1)} ({', '.join(label for label, _ in groups)})")
    return 0


def _a_population(command: str, path: str) -> str | None:
    """The message for a population's directory given where a member's belongs, or None."""
    from hpcrl.tools.plot_population import is_population, member_dirs
    if not is_population(path):
        return None
    members = member_dirs(path)
    example = members[0] if members else os.path.join(path, "member0")
    return (f"hpcrl: {command}: {path!r} is a population's directory ({len(members)} "
            f"member{'s' * (len(members) != 1)}); {command} one member's run directory, e.g. {example}, or draw "
            f"them all with hpcrl plot {path}")


def _stage(args) -> int:
    from hpcrl.tools.stage import StageError, main_pack, main_unpack
    try:
        if args.stage_command == "pack":
            return main_pack(args.env, args.output_dir)
        return main_unpack(args.archive, args.to)
    except StageError as exc:
        return _user_error(f"hpcrl: stage {args.stage_command}: {exc}")


def _inspect(args) -> int:
    import json

    from hpcrl.tools.inspect import RunDirError, describe, format_report
    if refusal := _a_population("inspect", args.run_dir):
        return _user_error(refusal)
    try:
        info = describe(args.run_dir)
    except RunDirError as exc:
        return _user_error(f"hpcrl: inspect: {exc}")
    # default=str: a config.yaml may hold YAML's dates and other values JSON has no type for
    print(json.dumps(info, indent=2, default=str) if args.json else format_report(info, full_config=args.config))
    return 0


def _sbatch(args) -> int:
    from hpcrl.core.config import ConfigError, load_config
    from hpcrl.tools.sbatch import JobRequest, check, render, write_script
    if args.max_relaunches is not None and not args.no_kill:
        return _user_error("hpcrl: cannot write the job script: --max-relaunches bounds the relaunches of a "
                           "self-healing script; add --no-kill, or leave --max-relaunches out")
    request = JobRequest(args.config, args.nodes, args.ntasks_per_node, args.time, args.launcher,
                         args.partition, args.account, no_kill=args.no_kill,
                         max_relaunches=3 if args.max_relaunches is None else args.max_relaunches,
                         overrides=tuple(args.overrides), stage=args.stage)
    try:
        cfg, _ = load_config(args.config, request.overrides)
        layout = check(request, cfg)
    except ConfigError as exc:
        return _user_error(f"hpcrl: cannot write the job script: {exc}")
    text = render(request, cfg, layout)
    if not args.output:
        sys.stdout.write(text)
        return 0
    try:
        write_script(args.output, text)
    except OSError as exc:
        return _user_error(f"hpcrl: cannot write the job script to {args.output}: {exc.strerror or exc}"
                           f"{_missing_directory(args.output)}")
    return 0


def _missing_directory(path: str) -> str:
    import os
    parent = os.path.dirname(os.path.abspath(path))
    return f" (the directory {os.path.dirname(path) or parent} does not exist: create it first)" \
        if not os.path.isdir(parent) else ""


def _custom_trunk(cfg):
    """The user's own encoder, built on the meta device to be counted (torch, only for such a config)."""
    from hpcrl.core.config_model import is_custom
    if not is_custom(cfg.model.encoder):
        return None
    from hpcrl.models.custom import custom_trunk
    return custom_trunk(cfg.model)


def _plan(args) -> int:
    import numpy as np

    from hpcrl.core.config import ConfigError, load_config
    from hpcrl.envs import env_spaces
    from hpcrl.core.layout import plan_layout, simulated_nodes
    from hpcrl.core.policies import num_policies
    from hpcrl.core.sizing import Sizes, memory, traffic
    from hpcrl.core.network_shapes import policy_params
    from hpcrl.tools.plan import DEFAULT_MDS_OPS_PER_S, format_plan, format_startup
    from hpcrl.core.members import check_members, member_config, population_problem
    from hpcrl.tools.plan import format_population
    mds_rate = DEFAULT_MDS_OPS_PER_S if args.mds_ops_per_s is None else args.mds_ops_per_s
    if not mds_rate > 0:
        return _user_error(f"hpcrl: plan: --mds-ops-per-s: expected a rate > 0, got {args.mds_ops_per_s:g}")
    try:
        whole, _ = load_config(args.config, tuple(args.overrides))
        nodes = simulated_nodes(args.world_size, args.ranks_per_node or max(args.world_size, 1))
        cfg, world, population = whole, args.world_size, whole.population.members
        if population:  # each member runs the roles table on its block: plan member 0's
            if problem := population_problem(whole, args.world_size):
                raise ConfigError(problem)
            check_members(whole)
            cfg, world = member_config(whole, 0), args.world_size // population
        gpus = None if args.gpus_per_node is None else np.full(world, args.gpus_per_node)
        layout = plan_layout(cfg.roles, world, nodes[:world], gpus, num_policies(cfg.policies))
        spaces = env_spaces(cfg.env)
        n_params = policy_params(cfg, spaces, _custom_trunk(cfg))  # counted, not allocated; ConfigError: unfit
        sizes = Sizes.of(cfg, layout)  # ConfigError: a batch that does not fit, slots that cannot hold one
        mem = memory(cfg, layout, sizes, spaces, n_params, whole.population if population else None)
    except ConfigError as exc:
        return _user_error(f"hpcrl: config error: {exc}")
    t = traffic(cfg, layout, sizes, spaces, n_params, args.env_steps_per_s)
    if population:
        frames = args.env_steps_per_s * cfg.env.num_envs * len(layout.envs if len(layout.envs) else [0])
        print("\n".join(format_population(whole, args.world_size, nodes, layout, frames, n_params)))
    print(format_plan(cfg, layout, sizes, t, args.env_steps_per_s, args.per_rank or world <= 64, mem,
                      int(args.memory_per_rank_gib * 2**30), n_params))
    print(format_startup(layout, mds_rate, population or 1))
    return 0


def _tune(args) -> int:
    from hpcrl.core.config import ConfigError
    from hpcrl.tools.tune import tune
    from hpcrl.tools.tune.measure import AveragingRunError
    from hpcrl.tools.tune.report import summary
    for name in ("ranks_per_node", "nodes", "budget_s", "memory_per_rank_gib"):
        if getattr(args, name) <= 0:
            return _user_error(f"hpcrl tune: --{name.replace('_', '-')} must be above 0, got {getattr(args, name)}")
    if args.gpus_per_node < 0:
        return _user_error(f"hpcrl tune: --gpus-per-node must be 0 or more, got {args.gpus_per_node}")
    try:
        tuned = tune(args.config, args.ranks_per_node, args.nodes, args.cores_per_node, args.budget_s,
                     tuple(args.overrides), None if args.no_averaging_measure else args.averaging_launcher,
                     args.gpus_per_node, args.costs, args.save_costs, int(args.memory_per_rank_gib * 2**30))
    except ConfigError as exc:
        return _user_error(f"hpcrl: config error: {exc}")
    except AveragingRunError as exc:
        return _user_error(f"hpcrl tune: the averaging measurement on two learners failed: {exc}\n"
                           f"(--averaging-launcher sets how it starts; --no-averaging-measure skips it)")
    print(summary(tuned.text, tuned.ranked, args.top), end="")
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(tuned.text)
        say(f"wrote {args.output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "plan":
        return _plan(args)
    if args.command == "sbatch":
        return _sbatch(args)
    if args.command == "inspect":
        return _inspect(args)
    if args.command == "plot":
        return _plot(args)
    if args.command == "eval":
        return _eval(args)
    if args.command == "config-reference":
        return _config_reference(args)
    if args.command == "tune":
        return _tune(args)
    if args.command == "stage":
        return _stage(args)
    from hpcrl.core.startup import CLOCK
    CLOCK.verbose = args.verbose
    from hpcrl.tools.api import run
    return run(args.config, tuple(args.overrides), args.overwrite)


def entry() -> None:
    """`python -m hpcrl` and the `hpcrl` console script. A rank whose run is over leaves through
    comm.finish: MPI finalized, without the interpreter's teardown (0.5-0.6 s per rank here)."""
    from hpcrl.core.startup import find_modules_in_working_directory, pause_collection
    find_modules_in_working_directory()
    if sys.argv[1:2] == ["run"]:
        pause_collection()  # until the rank's roles are built (launch/run.py)
    try:
        status = main(sys.argv[1:])
    except BrokenPipeError:  # `hpcrl inspect RUN | head`: the reader has what it wanted
        if sys.argv[1:2] == ["run"]:
            raise  # (a run's status says how the run went, never 0 for a lost output)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (no second error at exit's flush)
        sys.exit(0)
    if sys.argv[1:2] == ["run"]:
        from hpcrl.runtime.comm import finish
        finish(status)
    sys.exit(status)


if __name__ == "__main__":
    entry()
