"""`hpcrl plan` (no MPI) and the console entry point."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl.io.metrics import read_metrics
from tests.conftest import MPIRUN, REPO, run_dir, run_hpcrl as hpcrl, small_config, write_config


def test_plan_prints_every_rank_and_its_peers():
    result = hpcrl("plan", "jobs/cartpole_ppo_2learners.yaml", "--world-size", "7")
    assert result.returncode == 0, result.stderr
    assert "world size 7 on 1 node" in result.stdout
    assert "rank      6  env        inference rank 2, learner rank 0" in result.stdout
    assert "rank      0  learner    fragments from 2 env ranks" in result.stdout
    # 3 env ranks over 2 learners: one learner trains on twice the data, and the plan says so
    assert "warning: learner fan-in is uneven (1 to 2 env ranks): learner rank 0 will be the bottleneck" in result.stdout
    assert "batch: 768 frames per update: 1 fragment of 256 frames per env rank, 1-2 per learner" in result.stdout
    assert "every sync update waits for it" in result.stdout
    lockstep = hpcrl("plan", "jobs/cartpole_ppo_2learners.yaml", "--world-size", "7", "--set", "algo.mode=async")
    assert "the learners average gradients in lockstep, so every update waits for its batch" in lockstep.stdout


def test_plan_of_a_multi_node_job_shows_per_node_counts_traffic_and_limits():
    result = hpcrl("plan", "jobs/cartpole_ppo.yaml", "--world-size", "512", "--ranks-per-node", "128",
                   "--set", "roles.inference={per_node: 2, max_env_ranks: 32}", "--set", "roles.learner.ranks=4")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "world size 512 on 4 nodes" in out
    assert "  inference          8          2  cpu" in out and "  env              500    122-126  cpu" in out
    assert "each inference rank serves 61-63 env ranks" in out
    # 2 env groups x 33 requests per 32-step rollout, each 48 header bytes + 4 envs x 4 float32 = 112 bytes
    assert "observations 231.0 kB/s" in out and "learner root    broadcasts" in out
    assert "warning: 8 inference ranks serve more than roles.inference.max_env_ranks = 32 env ranks" in out
    assert "ranks:" not in out  # no per-rank listing for large jobs unless asked


def test_plan_at_a_hundred_thousand_ranks():
    result = hpcrl("plan", "jobs/cartpole_ppo.yaml", "--world-size", "100000", "--ranks-per-node", "128",
                   "--set", "roles.inference={per_node: 2}", "--set", "roles.learner.ranks=64")
    assert result.returncode == 0, result.stderr
    assert "world size 100,000 on 782 nodes" in result.stdout
    assert "  env           98,372     30-126  cpu" in result.stdout
    assert "each learner trains on 1537-1538 env ranks' fragments" in result.stdout
    # the default fan-in limit (256 env ranks per learner) speaks up; inference (61 each) does not
    assert "warning: 64 learner ranks serve more than roles.learner.max_env_ranks = 256" in result.stdout
    assert "inference ranks serve more" not in result.stdout


def test_plan_lays_out_a_thousand_members_on_a_hundred_thousand_ranks():
    result = hpcrl("plan", "jobs/cartpole_pbt.yaml", "--world-size", "100000", "--ranks-per-node", "128",
                   "--set", "population.members=1000", "--set", "population.values={}",
                   "--set", "roles.learner.ranks=2", "--set", "roles.inference.ranks=4")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "population: 1,000 members x 100 ranks (ranks 100i to 100i + 99 are member i)" in out
    assert "world size 100 on 1 node" in out and "  env               94         94  cpu" in out
    assert "  nodes per member: 1-2" in out
    # 100-rank members on 128-rank nodes: 3 of every 4 straddle two nodes, and the reports swamp the root
    assert "warning: 750 of 1,000 members span two or more nodes" in out
    assert "population.ready_frames >= 752,000 keeps it under 1,000 a second" in out
    assert "memory for buffers, batch and model" in out
    fits = hpcrl("plan", "jobs/cartpole_pbt.yaml", "--world-size", "102400", "--ranks-per-node", "128",
                 "--set", "population.members=800", "--set", "population.values={}",
                 "--set", "population.ready_frames=2000000", "--set", "roles.learner.ranks=2")
    assert fits.returncode == 0 and "  nodes per member: 1\n" in fits.stdout and "warning:" not in fits.stdout, fits.stdout
    wrong = hpcrl("plan", "jobs/cartpole_pbt.yaml", "--world-size", "12")
    assert wrong.returncode == 2 and "8 members need a world size that is a multiple of 8" in wrong.stderr
    assert "run on 8 or 16 ranks" in wrong.stderr
    small = hpcrl("plan", "jobs/cartpole_pbt.yaml", "--world-size", "4")  # fewer ranks than members
    assert small.returncode == 2 and "got 4; run on 8 ranks, or change" in small.stderr, small.stderr


def test_plan_sizes_a_league_of_a_thousand_members_with_its_snapshots_and_payoff_matrix():
    """The league's lines: roles, the snapshots each learner root holds (its ring of 16 kept + 1 +
    20,000 / 100,000 + 1 early (the exploiters' win-rate rule) = 18 and 8 slots), the moves and the payoff matrix, warned about at 16M
    win rates; the learner's memory counts the snapshots."""
    args = ("plan", "jobs/connect_four_league.yaml", "--world-size", "100000", "--ranks-per-node", "100",
            "--set", "population.members=1000", "--set", "population.league.main=500",
            "--set", "population.league.main_exploiters=250", "--set", "population.league.league_exploiters=250")
    result = hpcrl(*args)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "league: 500 main agents, 250 main exploiters, 250 league exploiters; a snapshot every 100,000 " \
           "frames of each main agent, every 200,000 of each exploiter (sooner once it wins 70% of its games), " \
           "16,000 kept in the league (16 per member)" in out
    assert "each learner root holds 18 of its own snapshots and 8 slots" in out  # 16 + 1 + 1 early
    assert "payoff matrix holds up to 16,000,000 win rates" in out
    assert "warning: a payoff matrix of 16,000,000 win rates" in out and "population.league.keep <= 1 keeps" in out
    assert "a copy (exploit)" not in out  # a league copies no member onto another
    small = hpcrl(*args, "--set", "population.league.keep=1")
    assert small.returncode == 0 and "warning: a payoff matrix" not in small.stdout
    assert "each learner root holds 3 of its own snapshots and 8 slots" in small.stdout
    quick = hpcrl(*args, "--set", "population.league.exploiter_snapshot_frames=5000")
    assert "a snapshot every 100,000 frames of each main agent, every 5,000 of each exploiter (sooner once it " \
           "wins 70% of its games)" in quick.stdout
    assert "each learner root holds 22 of its own snapshots" in quick.stdout  # 16 + 1 + 20,000 / 5,000 + 1
    # 15 snapshots fewer on the learner root: 15 x 787,220 bytes (196,805 float32 parameters)
    mib = [float(re.search(r"  learner ([\d.]+) MiB", r.stdout).group(1)) for r in (result, small)]
    assert mib[0] - mib[1] == pytest.approx(15 * 787_220 / 2**20, abs=0.1)


def test_plan_prints_memory_per_role_and_warns_above_the_memory_per_rank():
    args = ("plan", "jobs/cartpole_ppo.yaml", "--world-size", "1002", "--set", "roles.learner.ranks=1",
            "--set", "roles.inference.ranks=1", "--set", "roles.learner.max_env_ranks=0",
            "--set", "roles.inference.max_env_ranks=0")
    out = hpcrl(*args).stdout
    assert "memory for buffers, batch and model (busiest rank of each role):" in out
    assert "learner 31.1 MiB (2000 sample slots)" in out and "no warnings" in out
    tight = hpcrl(*args, "--memory-per-rank-gib", "0.01").stdout
    assert "warning: each learner rank needs about 31.1 MiB for its buffers, batch and model, more than the " \
           "10.2 MiB per rank assumed" in tight and "lower roles.learner.sample_slots" in tight
    fewer = hpcrl(*args, "--set", "roles.learner.sample_slots=1000").stdout
    assert "(1000 sample slots)" in fewer
    refused = hpcrl(*args, "--set", "roles.learner.sample_slots=999")
    assert refused.returncode == 2 and "999 slots cannot hold a batch of one fragment from each of the 1000" \
        in refused.stderr


def test_plan_prints_the_batch_of_algo_batch_frames_and_sizes_the_learner_by_it():
    job = ("plan", "jobs/cartpole_ppo_2learners.yaml", "--world-size", "8")  # 2 learners, 4 env ranks
    sync = hpcrl(*job, "--set", "algo.batch_frames=3072").stdout
    assert "batch: 3,072 frames per update (algo.batch_frames): 3 fragments of 256 frames per env rank, 6 per " \
           "learner" in sync
    assert "(8 sample slots)" in sync  # a batch and one per env rank
    tight = hpcrl(*job, "--set", "algo.batch_frames=3072", "--memory-per-rank-gib", "0.0001").stdout
    assert "warning: each learner rank needs about" in tight and "lower roles.learner.sample_slots or " \
        "algo.batch_frames" in tight  # num_envs and rollout_length no longer set the batch
    asynchronous = hpcrl(*job, "--set", "algo.mode=async", "--set", "algo.batch_frames=2560").stdout
    assert "batch: 2,560 frames per update (algo.batch_frames): 5 fragments of 256 frames per learner" in asynchronous
    refused = hpcrl(*job, "--set", "algo.batch_frames=2000")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "algo.batch_frames: 2,000 frames are not a whole number of fragments per env rank" in refused.stderr
    assert "a multiple of 4 x 256 = 1,024 (nearest: 1,024 or 2,048" in refused.stderr


def test_plan_memory_counts_the_batch_of_algo_batch_frames():
    from hpcrl.core.config import parse_config
    from hpcrl.core.layout import plan_layout
    from hpcrl.core.messages import fragment_spec
    from hpcrl.envs import env_spaces
    from hpcrl.core.sizing import Sizes, memory

    def learner_bytes(batch_frames):
        cfg = parse_config(f"algo: {{rollout_length: 32, batch_frames: {batch_frames}}}\nenv: {{num_envs: 8}}")
        layout = plan_layout(cfg.roles, 5)
        return memory(cfg, layout, Sizes.of(cfg, layout), env_spaces(cfg.env), 1000).learner

    spaces = env_spaces(parse_config("").env)
    frag = fragment_spec(32, 8, spaces.obs_shape, spaces.obs_dtype, spaces.action_shape, spaces.action_dtype).nbytes
    # 1 learner, 4 env ranks: by default 8 slots and a batch of 4 fragments; with 4 fragments per env rank
    # (sync), 16 + 2 x 3 slots (a batch, and the credits of the other env ranks once done) and 16
    assert learner_bytes("null") == learner_bytes(4 * 256)
    assert learner_bytes(16 * 256) - learner_bytes("null") == ((22 + 16) - (8 + 4)) * frag


def test_plan_memory_counts_every_policy_and_the_self_play_pool_on_policy_holders():
    from hpcrl.core.config import parse_config
    from hpcrl.core.layout import plan_layout
    from hpcrl.core.messages import weights_spec
    from hpcrl.core.policies import num_policies
    from hpcrl.core.dataflow import ALGORITHMS, inference_messages
    from hpcrl.core.sizing import FRAGMENT_BUFFERS, MODEL_COPIES, Sizes, memory, memory_problem
    from hpcrl.envs import env_spaces

    def mem(text: str, ranks: int = 4, inference: int = 1, learners: int = 1):
        cfg = parse_config(f"env: {{id: 'pettingzoo:classic/connect_four-v3', num_envs: 4}}\n"
                           f"roles: {{learner: {{ranks: {learners}}}, inference: {{ranks: {inference}}}}}\n{text}")
        layout = plan_layout(cfg.roles, ranks, policies=num_policies(cfg.policies))
        return cfg, layout, memory(cfg, layout, Sizes.of(cfg, layout), env_spaces(cfg.env), 1000)

    n = 1000
    _, _, two_kept = mem("algo: {name: ippo, selfplay: {pool: 2}}")
    _, _, six_kept = mem("algo: {name: ippo, selfplay: {pool: 6}}")
    # four frozen copies more of 1000 float32 parameters on the policy server (its messages stay the same)
    assert six_kept.inference - two_kept.inference == 4 * 4 * n
    # the actors hold no policy with remote inference: only their fragments' per-age game counts grow
    cfg2, _, _ = mem("algo: {name: ippo, selfplay: {pool: 2}}")
    cfg6, _, _ = mem("algo: {name: ippo, selfplay: {pool: 6}}")
    spaces = env_spaces(cfg2.env)
    grown = ALGORITHMS["ippo"].record(cfg6, spaces).nbytes - ALGORITHMS["ippo"].record(cfg2, spaces).nbytes
    assert six_kept.env - two_kept.env == FRAGMENT_BUFFERS * grown
    _, _, inline_two = mem("algo: {name: ippo, selfplay: {pool: 2}}", ranks=3, inference=0)
    _, _, inline_six = mem("algo: {name: ippo, selfplay: {pool: 6}}", ranks=3, inference=0)
    assert inline_six.env - inline_two.env == 4 * 4 * n + FRAGMENT_BUFFERS * grown and inline_six.inference == 0
    cfg_one, layout, one = mem("algo: {name: ippo}\npolicies: {all: 'player_.*'}", ranks=5, learners=2)
    cfg_two, _, two = mem("algo: {name: ippo}\npolicies: {first: 'player_0', second: 'player_1'}", ranks=5,
                          learners=2)
    # the second policy's model copies and weights message, beside the requests' policy ids
    messages = [sum(2 * m.nbytes for m in inference_messages(c, spaces, 2)) for c in (cfg_one, cfg_two)]
    fan = int(layout.fan_in("inference").max())
    assert two.inference - one.inference == (MODEL_COPIES["inference"] * 4 * n + weights_spec(n).nbytes
                                             + fan * 2 * (messages[1] - messages[0]))
    cfg, layout, _ = mem("algo: {name: ippo, selfplay: {pool: 64}}\nrun: {memory_limit_gib: 0.01}")
    problem = memory_problem(cfg, layout, Sizes.of(cfg, layout), env_spaces(cfg.env), 100_000)
    assert problem.startswith("algo.selfplay.pool: each inference rank would need") and "fewer past versions" in problem


def test_plan_reports_a_layout_that_does_not_fit():
    result = hpcrl("plan", "jobs/cartpole_ppo_2learners.yaml", "--world-size", "4")
    assert result.returncode == 2 and "need a world size of at least 5" in result.stderr
    assert "Traceback" not in result.stderr


def test_console_script_is_installed():
    exe = Path(sys.executable).parent / "hpcrl"  # installed beside the interpreter running the tests
    result = subprocess.run([str(exe), "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "run" in result.stdout and "plan" in result.stdout


CORRIDOR = """import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), float(action), self.t >= 8, False, {}
"""


def test_the_console_script_finds_an_env_module_in_the_working_directory(tmp_path):
    """`mpirun -n 1 hpcrl run` (the console script, not `python -m hpcrl`) from the directory that
    holds the user's env module, with no PYTHONPATH: the run imports it and trains."""
    (tmp_path / "my_corridor.py").write_text(CORRIDOR)
    cfg = small_config(tmp_path, name="corridor", env={"id": "my_corridor:Corridor"}, run={"total_frames": 256},
                       roles={"inference": {"ranks": 0}})
    exe = Path(sys.executable).parent / "hpcrl"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(["bash", str(MPIRUN), "-n", "1", str(exe), "run", str(write_config(tmp_path, cfg))],
                            capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert read_metrics(str(run_dir(cfg) / "metrics.h5"))["frames"][-1] >= 256


def test_sbatch_of_a_population_checks_each_members_block(tmp_path):
    out = tmp_path / "pbt.sbatch"
    result = hpcrl("sbatch", "jobs/cartpole_pbt.yaml", "--nodes", "2", "--ntasks-per-node", "4", "--time",
                   "01:00:00", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "= 8 (8 population members of 1: 1 learner, 0 inference, 1 env each)" in out.read_text()
    wrong = hpcrl("sbatch", "jobs/cartpole_pbt.yaml", "--nodes", "3", "--ntasks-per-node", "4", "--time",
                  "01:00:00", "-o", str(out))
    assert wrong.returncode == 2 and "8 members need a world size that is a multiple of 8" in wrong.stderr


def test_output_cut_short_by_its_reader_is_no_error():
    """`hpcrl config-reference | head -1`: the reader closes the pipe; no traceback, status 0."""
    exe = Path(sys.executable).parent / "hpcrl"
    result = subprocess.run(["bash", "-o", "pipefail", "-c", f"{exe} config-reference | head -1"],
                            capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout == "# Config reference\n", result
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr


def test_sbatch_writes_a_script_for_the_layout_and_refuses_one_that_cannot_fit(tmp_path):
    out = tmp_path / "job.sbatch"
    result = hpcrl("sbatch", "jobs/cartpole_ppo_multinode.yaml", "--nodes", "2", "--ntasks-per-node", "8",
                   "--time", "02:00:00", "--partition", "gpu", "-o", str(out))
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert "2 nodes x 8 MPI ranks = 16 (2 learner, 4 inference, 10 env)" in text
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=8", "#SBATCH --time=02:00:00",
                 "#SBATCH --partition=gpu", "#SBATCH --requeue", "#SBATCH --signal=B:USR1@120",
                 "CONFIG=${CONFIG:-jobs/cartpole_ppo_multinode.yaml}", 'scontrol requeue "${SLURM_JOB_ID}"',
                 "export MPICH_MAX_THREAD_SAFETY=multiple"):
        assert line in text, line
    assert subprocess.run(["bash", "-n", str(out)]).returncode == 0
    # a learner and two inference ranks per node leave no room for env ranks on 2-rank nodes
    refused = hpcrl("sbatch", "jobs/cartpole_ppo_multinode.yaml", "--nodes", "2", "--ntasks-per-node", "2")
    assert refused.returncode == 2 and "cannot write the job script" in refused.stderr
    assert "need a world size of at least" in refused.stderr
    assert "--time" in hpcrl("sbatch", "jobs/cartpole_ppo.yaml", "--nodes", "1", "--ntasks-per-node", "4",
                             "--time", "two hours").stderr


def test_sbatch_no_kill_writes_a_self_healing_script(tmp_path):
    out = tmp_path / "job.sbatch"
    result = hpcrl("sbatch", "jobs/cartpole_ppo.yaml", "--nodes", "3", "--ntasks-per-node", "4", "--no-kill",
                   "--max-relaunches", "2", "-o", str(out))
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    for line in ("#SBATCH --no-kill", "MAX_RELAUNCHES=${HPCRL_MAX_RELAUNCHES:-2}", "export SLURM_OVERLAP=1",
                 '--host "${nodes//,/:${SLURM_NTASKS_PER_NODE},}:${SLURM_NTASKS_PER_NODE}"',
                 "[[ $status =~ ^(0|2|3|4)$ ]] && break", 'scontrol requeue "${SLURM_JOB_ID}"'):
        assert line in text, line
    assert subprocess.run(["bash", "-n", str(out)]).returncode == 0
    refused = hpcrl("sbatch", "jobs/cartpole_ppo.yaml", "--nodes", "3", "--ntasks-per-node", "4", "--no-kill",
                    "--max-relaunches", "-1")
    assert refused.returncode == 2 and "--max-relaunches: expected >= 0, got -1" in refused.stderr


def test_committed_job_scripts_are_what_hpcrl_sbatch_writes():
    """jobs/*.sbatch come from the generator; edit the generator (hpcrl/sbatch.py), then re-run
    the commands in each script's 'Written by' line."""
    for script in sorted((REPO / "jobs").glob("*.sbatch")):
        written_by = next(line for line in script.read_text().splitlines() if line.startswith("# Written by: "))
        args = written_by.removeprefix("# Written by: hpcrl ").split()
        regenerated = hpcrl(*args)
        assert regenerated.returncode == 0, regenerated.stderr
        assert regenerated.stdout == script.read_text(), f"{script.name} is stale: {written_by}"


def test_plan_counts_each_dqn_learners_replay_shard_and_says_what_to_lower():
    out = hpcrl("plan", "jobs/breakout_apex.yaml", "--world-size", "4").stdout
    assert "replay shard per learner: 50,000 transitions, warm-up 20,000" in out
    assert "learner 2.7 GiB" in out and "no warnings" in out  # two uint8 frame stacks per transition
    two = hpcrl("plan", "jobs/breakout_apex.yaml", "--world-size", "5", "--set", "roles.learner.ranks=2").stdout
    assert "replay shard per learner: 25,000 transitions" in two and "learner 1.4 GiB" in two
    big = hpcrl("plan", "jobs/breakout_apex.yaml", "--world-size", "4", "--set", "algo.replay.capacity=200000").stdout
    assert "add learners or lower algo.replay.capacity" in big


@pytest.mark.parametrize("args, message", [
    (("-o", "nodir/x.sbatch"), "cannot write the job script to nodir/x.sbatch: No such file or directory (the "
                               "directory nodir does not exist: create it first)"),
    (("--time", "25:99:00"), "--time: expected SLURM's minutes, minutes:seconds, hours:minutes:seconds, days-hours, "
                             "days-hours:minutes or days-hours:minutes:seconds, e.g. 02:00:00 or 1-12:00:00; got "
                             "'25:99:00': minutes 99 is above 59"),
    (("--partition", "gpu; rm -rf /"), "--partition: expected a SLURM name (letters, digits, '_', '.', '+', '-'; "
                                       "several partitions comma-separated), got 'gpu; rm -rf /'"),
    (("--account", "lab\n#SBATCH --qos=top"), "--account: expected a SLURM name"),
    (("--max-relaunches", "5"), "--max-relaunches bounds the relaunches of a self-healing script; add --no-kill"),
    (("--stage", "scratch"), "--stage: expected an absolute node-local directory such as /tmp or /dev/shm, got "
                             "'scratch'"),
])
def test_sbatch_refuses_what_it_cannot_write_faithfully_in_one_line(tmp_path, args, message):
    """Issue 46, item 7: each was a traceback, or written verbatim into an #SBATCH line, or ignored."""
    result = hpcrl("sbatch", str(REPO / "jobs/cartpole_ppo.yaml"), "--nodes", "1", "--ntasks-per-node", "4", *args,
                   cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "", result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and message in result.stderr and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_sbatch_plans_with_set_and_passes_it_to_the_run(tmp_path):
    """--set, as hpcrl plan takes it: the layout is planned with the override, and the script's run
    line passes it on (quoted for the shell), beside the submit-time arguments ("$@")."""
    out = tmp_path / "job.sbatch"
    refused = hpcrl("sbatch", "jobs/cartpole_ppo.yaml", "--nodes", "1", "--ntasks-per-node", "4",
                    "--set", "roles.learner.ranks=4")
    assert refused.returncode == 2 and "roles" in refused.stderr  # planned with it: 4 learners leave no env rank
    made = hpcrl("sbatch", "jobs/cartpole_ppo.yaml", "--nodes", "1", "--ntasks-per-node", "4", "--time", "90",
                 "--set", "run.output_dir=runs of mine", "--set", "algo.lr=1.0e-4", "--partition", "gpu,debug",
                 "-o", str(out))
    assert made.returncode == 0, made.stderr
    text = out.read_text()
    assert """python -m hpcrl run "$CONFIG" --set 'run.output_dir=runs of mine' --set algo.lr=1.0e-4 "$@" &""" in text
    assert "#SBATCH --partition=gpu,debug\n" in text and "#SBATCH --time=90 " in text
    assert "--partition gpu,debug --set 'run.output_dir=runs of mine' --set algo.lr=1.0e-4" in text.splitlines()[2]


def test_sbatch_stage_starts_every_rank_from_its_nodes_copy(tmp_path):
    """--stage (hpcrl stage, issue 47): the script packs the environment once, unpacks it once per
    node (one task a node) into the node-local directory, and both launchers, in the plain and the
    self-healing script, start the staged interpreter; a relaunch runs the same lines again, which
    reuse the copies (tests/test_stage.py)."""
    for extra in ((), ("--no-kill",)):
        out = tmp_path / "job.sbatch"
        made = hpcrl("sbatch", "jobs/cartpole_ppo.yaml", "--nodes", "3", "--ntasks-per-node", "4", "--stage",
                     "/local/scratch space", *extra, "-o", str(out))
        assert made.returncode == 0, made.stderr
        text = out.read_text()
        assert "STAGE_DIR=${HPCRL_STAGE_DIR:-'/local/scratch space'}" in text
        assert 'ARCHIVE=$(python -m hpcrl stage pack -o "${HPCRL_STAGE_ARCHIVES:-stage}") || exit 2' in text
        assert ('PYTHON=$(srun --nodes="$SLURM_NNODES" --ntasks="$SLURM_NNODES" --ntasks-per-node=1 \\\n    '
                'python -m hpcrl stage unpack "$ARCHIVE" --to "$STAGE_DIR" | sort -u) || exit 2') in text
        launch, other = [line for line in text.splitlines() if '-m hpcrl run "$CONFIG"' in line]
        assert '"$PYTHON" -P -m hpcrl run' in launch and '"$PYTHON" -P -m hpcrl run' in other
        assert text.index("PYTHON=$(srun") < text.index(launch)
        assert "--stage '/local/scratch space'" in text.splitlines()[2]
        assert subprocess.run(["bash", "-n", str(out)]).returncode == 0
    default = hpcrl("sbatch", "jobs/cartpole_ppo.yaml", "--nodes", "1", "--ntasks-per-node", "4", "--stage").stdout
    assert "STAGE_DIR=${HPCRL_STAGE_DIR:-${SLURM_TMPDIR:-/tmp}}" in default
    assert "--stage" in default.splitlines()[2] and "hpcrl stage" not in hpcrl(
        "sbatch", "jobs/cartpole_ppo.yaml", "--nodes", "1", "--ntasks-per-node", "4").stdout


def test_plan_predicts_the_start_up_load_on_the_shared_file_system_unstaged_and_staged():
    """Per role, the metadata calls bench/startup.py counted (tools/plan.py STARTUP_CALLS), times the
    ranks of each role, over --mds-ops-per-s; staged, the node-local copies' few, plus the unpack
    once per node. 1,000 ranks on 10 nodes: 1 learner, 1 policy server, 998 env ranks."""
    from hpcrl.tools.plan import STARTUP_CALLS, UNPACK_CALLS_PER_NODE
    (learner, learner_staged), (server, server_staged), (env, env_staged) = (
        STARTUP_CALLS[role] for role in ("learner", "inference", "env"))
    unstaged = learner + server + 998 * env
    staged = learner_staged + server_staged + 998 * env_staged + 10 * UNPACK_CALLS_PER_NODE
    out = hpcrl("plan", "jobs/cartpole_ppo.yaml", "--world-size", "1000", "--ranks-per-node", "100",
                "--mds-ops-per-s", "10000").stdout
    assert (f"start-up on the shared file system: {unstaged:,} metadata calls from the venv (about "
            f"{unstaged / 10_000:,.0f} s at --mds-ops-per-s 10,000), {staged:,} staged (hpcrl stage: about "
            f"{staged / 10_000:.1f} s)") in out
    inline = hpcrl("plan", "jobs/cartpole_ppo.yaml", "--world-size", "4", "--set", "roles.inference.ranks=0").stdout
    torch_envs = learner + 3 * server  # env ranks with an inline policy import torch as a policy server does
    assert f"start-up on the shared file system: {torch_envs:,} metadata calls from the venv" in inline
    refused = hpcrl("plan", "jobs/cartpole_ppo.yaml", "--world-size", "4", "--mds-ops-per-s", "0")
    assert refused.returncode == 2 and refused.stderr == "hpcrl: plan: --mds-ops-per-s: expected a rate > 0, got 0\n"
