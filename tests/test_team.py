"""VDN and QMIX (algo.name vdn, qmix): the mixer's monotonicity, VDN's target by hand, episodes of
whole teams into replay and out with their masks and chunks, a 5-rank run whose actors stay
torch-free and whose two learners stay bit-identical, and an exact serial resume."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from hpcrl.algos.team import team_td_errors
from hpcrl.core.config import parse_config
from hpcrl.core.dataflow import algorithm_of
from hpcrl.envs import EnvSpaces
from hpcrl.envs.multiagent import pettingzoo_vector
from hpcrl.io.metrics import read_metrics
from hpcrl.models.team import QMixer, TeamQNetwork
from hpcrl.workers.replay_source import shard_for
from hpcrl.workers.replay_writer import RecordRows
from hpcrl.workers.team_writer import TeamEpisodes
from tests.conftest import mpirun, run_dir, small_config, write_config
from tests.test_resume import assert_same_models, whole_and_halves

RELAY = "tests.ma_envs:Relay"
AGENTS = ("agent_0", "agent_1")


def team_config(algo: str, **team) -> object:
    return parse_config(repr({"algo": {"name": algo, "team": team}, "model": {"hidden_sizes": [8]}}))


@pytest.mark.parametrize("seed", range(4))
def test_the_qmix_mixer_never_falls_as_an_agents_q_rises(seed):
    """Monotonicity, the property QMIX rests on (each agent's greedy action is the team's): over
    random mixers, states and Q-values, raising any agent's Q never lowers the team's, and every
    gradient of Q_tot by an agent's Q is >= 0."""
    torch.manual_seed(seed)
    mixer = QMixer(agents=3, state_width=7, embed=8, hidden=16)
    for layer in mixer.modules():  # weights far from the default's scale, both signs
        if isinstance(layer, torch.nn.Linear):
            torch.nn.init.normal_(layer.weight, std=2.0)
    state, q = torch.randn(2000, 7) * 3, (torch.randn(2000, 3) * 10).requires_grad_()
    total = mixer(q, state)
    total.sum().backward()
    assert (q.grad >= 0).all()
    for agent in range(3):
        raised = q.detach().clone()
        raised[:, agent] += torch.rand(2000) * 5
        assert (mixer(raised, state) >= total.detach() - 1e-5).all()
    assert q.grad.sum() > 0  # (not a mixer that ignores its agents)


def test_vdns_target_by_hand():
    """y_t = r_t + gamma (1 - terminated_t) sum_i Q_i^target(o_t+1, argmax_a Q_i(o_t+1, a)), the
    team's Q the sum of the agents' Q of their actions, padding steps zero."""
    cfg = team_config("vdn", shared=False)
    spaces = EnvSpaces((3,), "float32", 4, num_agents=2, agents=AGENTS)
    model = TeamQNetwork(spaces, cfg)
    target = copy.deepcopy(model)
    with torch.no_grad():  # a target other than the online network, so the double-Q choice matters
        for p in target.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    g = torch.Generator().manual_seed(0)
    data = {"obs": torch.randn(2, 4, 2, 3, generator=g), "actions": torch.tensor([[[0, 1], [2, 3], [0, 0]],
                                                                                   [[3, 3], [1, 2], [0, 0]]]),
            "rewards": torch.tensor([[1.0, 2.0, 0.0], [-1.0, 0.5, 0.0]]),
            # episode 0 ends by a time limit after 2 steps (obs[2] is its final observation); episode 1 terminates
            "terminated": torch.tensor([[0, 0, 0], [0, 1, 0]], dtype=torch.uint8),
            "filled": torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.uint8)}
    td, q_tot = team_td_errors(model, target, data, gamma=0.9, double=True)
    for b in range(2):
        for t in range(3):
            if not data["filled"][b, t]:
                assert td[b, t] == 0 and q_tot[b, t] == 0
                continue
            with torch.no_grad():
                q = model.q_values(data["obs"][b, t])  # [agents, actions]
                taken = sum(q[i, data["actions"][b, t, i]] for i in range(2))
                choice = model.q_values(data["obs"][b, t + 1]).argmax(-1)
                bootstrap = sum(target.q_values(data["obs"][b, t + 1])[i, choice[i]] for i in range(2))
            y = data["rewards"][b, t] + 0.9 * (1 - float(data["terminated"][b, t])) * bootstrap
            assert q_tot[b, t].item() == pytest.approx(taken.item(), abs=1e-5)
            assert td[b, t].item() == pytest.approx((y - taken).item(), abs=1e-5)


@pytest.mark.parametrize("bootstraps", [False, True], ids=["time-limit-ends", "time-limit-bootstraps"])
def test_episodes_go_into_replay_whole_with_their_masks_and_chunks(bootstraps):
    """Relay episodes of 6 steps (3 agents, agent i rewarded for action i % 2), cut off by a time
    limit, stored in chunks of 4: the first chunk holds steps 0-3 and the next chunk's first
    observation, the second steps 4-5, the episode's final observation and padding, its last step
    a termination unless the time limit bootstraps; each starts from the states its agents were at;
    the reward is the team's sum; the replay gives them back as they went in."""
    cfg = parse_config(repr({"algo": {"name": "vdn", "team": {"episode_length": 4,
                                                                "time_limit_bootstraps": bootstraps}},
                             "model": {"core": "gru", "core_size": 2}}))
    envs, agents = 2, 3
    vector = pettingzoo_vector(RELAY)({"num_agents": agents, "length": 6, "leave_at": 100}, envs)
    spaces = EnvSpaces((3,), "float32", 2, num_agents=agents, agents=("agent_0", "agent_1", "agent_2"))
    record = algorithm_of(cfg).record(cfg, spaces).allocate()
    out = RecordRows(record)
    obs, _ = vector.reset(seed=0)
    episodes = TeamEpisodes(cfg, envs, agents, obs, np.int64, state_size=2)
    good = np.tile([0, 1, 0], envs)  # every agent's rewarded action
    for step in range(8):
        episodes.observe(obs, np.full((envs * agents, 2), step, dtype=np.float32))
        actions = good if step % 2 == 0 else 1 - good  # every other step, every agent misses
        episodes.acted(actions)
        obs, rewards, terminated, truncated, info = vector.step(actions)
        episodes.stepped(rewards, terminated, info, obs, out)
    assert out.rows == 2 * envs  # each env: the cut chunk (after step 3) and the episode's end (after step 5)
    shard = shard_for(algorithm_of(cfg).record(cfg, spaces), capacity=8, alpha=0.0)
    shard.add({name: record[name][:out.rows] for name in shard.fields}, None)
    indices, weights, sampled = shard.sample(16, beta=1.0, rng=np.random.default_rng(0))
    for name, rows in sampled.items():  # what a batch draws is what went in
        np.testing.assert_array_equal(rows, record[name][indices], err_msg=name)
    data = {name: record[name][:out.rows] for name in shard.fields}
    steps = data["obs"][:, :, 0, 0]  # Relay's observation starts with the env's step count
    for e in range(envs):
        first, second = e, envs + e  # rows in the order the chunks ended
        assert steps[first].tolist() == [0, 1, 2, 3, 4] and steps[second].tolist() == [4, 5, 6, 0, 0]
        assert data["filled"][first].tolist() == [1, 1, 1, 1] and data["filled"][second].tolist() == [1, 1, 0, 0]
        assert data["terminated"][first].tolist() == [0] * 4  # (a chunk's cut ends nothing)
        assert data["terminated"][second].tolist() == [0, 0 if bootstraps else 1, 0, 0]
        assert data["rewards"][first].tolist() == [3, 0, 3, 0] and data["rewards"][second].tolist() == [3, 0, 0, 0]
        assert data["state0"][first].tolist() == [0.0] * 6 and data["state0"][second].tolist() == [4.0] * 6
        assert data["actions"][first, 0].tolist() == [0, 1, 0] and data["actions"][second, 1].tolist() == [1, 0, 1]
    assert shard.raw_priorities[:out.rows].tolist() == [1.0] * out.rows  # the shard's largest: none known yet
    assert episodes.t.tolist() == [2, 2]  # the next episode's first 2 steps, in progress


def team_run(tmp_path, algo: str, name: str, **sections) -> dict:
    """A sync VDN or QMIX run on Relay (3 agents, 6 steps, which end the episode: its values are
    the discounted rewards to come), recurrent agents: learnable in a few thousand frames (a
    perfect team earns 6 per agent)."""
    cfg = small_config(tmp_path, name=name, env={"id": RELAY, "num_envs": 4,
                                                 "kwargs": {"length": 6, "leave_at": 100, "terminal_end": True}},
                       algo={"name": algo, "mode": "sync", "rollout_length": 6, "lr": 0.001, "max_grad_norm": 10.0,
                             "team": {"episode_length": 6, "batch_size": 16, "eps_decay_frames": 1500,
                                      "target_update_interval": 50},
                             "replay": {"capacity": 500, "warmup": 16, "replay_ratio": 8}},
                       model={"hidden_sizes": [32], "core": "gru", "core_size": 32, "activation": "relu"})
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    return cfg


def test_qmix_on_5_ranks_keeps_actors_torch_free_and_two_learners_bit_identical(tmp_path):
    """2 learners, a policy server and 2 env ranks: the env ranks never import torch or horovod,
    the learners' weights stay bit-identical after every update, and the team learns."""
    report = tmp_path / "modules"
    report.mkdir()
    cfg = team_run(tmp_path, "qmix", "ranks5", run={"total_frames": 4800, "replica_digests": True},
                   roles={"learner": {"ranks": 2}, "inference": {"ranks": 1}, "env": {"ranks": "rest"}})
    cfg["algo"]["team"]["standardize_rewards"] = False  # Q_tot in reward units
    cfg["env"]["kwargs"]["report_dir"] = str(report)
    result = mpirun(5, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 0, result.stdout + result.stderr
    loaded = {path.name.split("-")[0]: path.read_text() for path in report.iterdir()}
    assert loaded["rank3"] == "" and loaded["rank4"] == ""  # env ranks: neither torch nor horovod
    m = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    digests = m["replica_digest"]
    assert np.all(digests[:, 0] == digests[:, 1])
    assert len(set(digests[1:, 0])) == len(digests) - 1  # every update trains, but the first round's (warm-up)
    # a round: 6 steps of 8 envs, whose episodes all end in it
    assert m["frames"].tolist() == [48 * k for k in range(1, len(m["frames"]) + 1)]
    assert m["replay_size"].tolist() == [min(8 * k, 500) for k in range(1, len(m["frames"]) + 1)]
    assert m["return_mean"][-1] >= 5.0 > m["return_mean"][0]  # random play earns 3 per agent
    # a near-perfect team's mean Q_tot over an episode's steps: 3 a step to come, discounted (about 10.2)
    true = np.mean([sum(3 * 0.99 ** k for k in range(6 - t)) for t in range(6)])
    assert abs(m["q_mean"][-1] - true) < 0.15 * true, (m["q_mean"][-1], true)


def test_serial_vdn_resumes_exactly(tmp_path):
    """A serial VDN run of 1,440 frames, and one stopped at 720 and resumed (the checkpoint holds
    the replay, the episodes in progress, the target network and the rewards' running moments):
    the same metrics rows and weights."""
    def config(name: str, run: dict) -> dict:
        cfg = team_run(tmp_path, "vdn", name, run={**run, "checkpoint_interval_s": 0.3},
                       roles={"inference": {"ranks": 0}})
        cfg["algo"]["replay"].update(checkpoint=True, beta=1.0)  # beta anneals over run.total_frames, which differ
        return cfg
    a, b = whole_and_halves(tmp_path, config, 1440)
    ma, mb = a["metrics"], b["metrics"]
    for key in set(ma) - {"wall_time", "fps", "learner_rss_mib"}:
        np.testing.assert_array_equal(ma[key], mb[key], err_msg=key)  # bit-identical, row for row
    assert_same_models(a["checkpoint"], b["checkpoint"])
    moments = b["checkpoint"]["parts"]["step"]["reward_moments"]  # (mean, var, count) of the rewards trained on
    assert moments[2] > 500 and 0 < moments[0] < 3
    assert np.isfinite(ma["td_error"][-1]) and ma["replay_size"][-1] == 240  # it trained; every episode is in
