"""R2D2-style DQN (algo.name dqn with model.core): sequence targets and priorities against a plain
step-by-step computation, the sequences actors store (overlap, stored states, initial priorities)
against a replay of the same network, burn-in without gradients, and the trainer's TD errors."""
import numpy as np
import pytest
import torch

from hpcrl.algos.dqn import sequence_td_errors
from hpcrl.algos.sequences import rescale, sequence_priorities, sequence_targets, unrescale
from hpcrl.core.config import ConfigError, parse_config
from hpcrl.core.messages import replay_fields
from hpcrl.envs import env_spaces
from hpcrl.models import build_policy
from hpcrl.models.q import RecurrentQNetwork
from hpcrl.io.checkpoint import load_checkpoint
from hpcrl.launch.solo import solo_actor
from tests.conftest import mpirun, run_dir, small_config, write_config
from tests.test_mpi_runs import check_finished

L, BURN_IN, PERIOD, N_STEP, GAMMA, ENVS, LIMIT = 8, 2, 3, 3, 0.9, 3, 5


def plain_target(rewards, terminated, truncated, finals, values, t, n, gamma):
    """Step t's n-step target of one sequence, one step at a time (values: of observations 0..L)."""
    ret, discount = 0.0, 1.0
    for s in range(t, min(t + n, len(rewards))):
        ret += discount * rewards[s]
        discount *= gamma
        if terminated[s]:
            return ret
        if truncated[s]:
            return ret + discount * finals[s]
    return ret + discount * values[min(t + n, len(rewards))]


@pytest.mark.parametrize("value_rescale", [False, True], ids=["raw", "rescaled"])
def test_sequence_targets_cut_returns_at_episode_ends_and_at_the_sequence_end(value_rescale):
    rng = np.random.default_rng(1)
    B = 64
    rewards = rng.normal(size=(L, B)).astype(np.float32)
    terminated = rng.random((L, B)) < 0.15
    truncated = ~terminated & (rng.random((L, B)) < 0.15)
    finals = rng.normal(size=(L, B)).astype(np.float32) * 5
    values = rng.normal(size=(L + 1, B)).astype(np.float32) * 5
    got = sequence_targets(rewards, terminated, truncated, finals, values[BURN_IN:], GAMMA, N_STEP, BURN_IN,
                           value_rescale)
    assert got.shape == (L - BURN_IN, B)
    plain = unrescale if value_rescale else (lambda v: v)
    for b in range(B):
        for t in range(BURN_IN, L):
            want = plain_target(rewards[:, b], terminated[:, b], truncated[:, b], plain(finals[:, b].astype(float)),
                                plain(values[:, b].astype(float)), t, N_STEP, GAMMA)
            want = rescale(want) if value_rescale else want
            assert got[t - BURN_IN, b] == pytest.approx(want, rel=1e-5, abs=1e-5), (t, b)
    assert terminated[BURN_IN:].any() and truncated[BURN_IN:].any()  # both kinds of end were met


def test_value_rescaling_inverts_and_priorities_mix_max_and_mean():
    x = np.array([-1e4, -3.5, -1e-3, 0.0, 0.5, 7.0, 2e5])
    np.testing.assert_allclose(unrescale(rescale(x)), x, rtol=1e-9, atol=1e-9)
    assert rescale(np.array([99.0]))[0] == pytest.approx(9.0 + 0.099)
    t = torch.as_tensor(x)  # the trainer's tensors take the same functions
    np.testing.assert_allclose(rescale(t).numpy(), rescale(x))
    np.testing.assert_allclose(unrescale(t).numpy(), unrescale(x))
    td = np.array([[1.0, 0.0], [3.0, 0.0], [2.0, 4.0]])  # [T, B]
    np.testing.assert_allclose(sequence_priorities(td, 0.9), [0.9 * 3 + 0.1 * 2, 0.9 * 4 + 0.1 * 4 / 3], rtol=1e-6)


def config(core: str = "lstm", **dqn):
    settings = {"sequence_length": L, "burn_in": BURN_IN, "sequence_period": PERIOD, "n_step": N_STEP,
                "batch_size": 4, **dqn}
    text = ", ".join(f"{k}: {v}" for k, v in settings.items())
    return parse_config(f"env: {{id: CartPole-v1, num_envs: {ENVS}, kwargs: {{max_episode_steps: {LIMIT}}}}}\n"
                        f"algo: {{name: dqn, gamma: {GAMMA}, rollout_length: 4, dqn: {{{text}, eps: 0.5}}, "
                        f"replay: {{warmup: 8}}}}\n"
                        f"model: {{core: {core}, core_size: 8, hidden_sizes: [16]}}\nrun: {{seed: 3}}")


def collect(cfg, records: int = 6):
    """`records` records of one env rank with an inline recurrent Q-network (in one process, real MPI
    self-messages), and that network."""
    spaces = env_spaces(cfg.env)
    torch.manual_seed(0)
    solo = solo_actor(cfg, spaces)
    names = [*replay_fields(solo.receiver.slots[0].spec), "priorities"]
    got = []
    solo.records(records, 200 * records,
                 lambda r: got.append({name: r[name][:r.get("count")].copy() for name in names}))
    solo.close()
    if len(got) < records:
        pytest.fail(f"{len(got)} of {records} records arrived")
    return solo.model, {name: np.concatenate([g[name] for g in got]) for name in got[0]}


def unroll(model, seq, length):
    """Q-values [length, A] and the states before each of `length` steps of one stored sequence,
    stepping the network from the sequence's stored state and zeroing it where an episode begins."""
    state = torch.as_tensor(seq["state0"][None])
    qs, states = [], []
    with torch.no_grad():
        for t in range(length):
            if t and (seq["terminated"][t - 1] or seq["truncated"][t - 1]):
                state = torch.zeros_like(state)
            states.append(state[0].numpy().copy())
            q, state = model.q_step(torch.as_tensor(seq["obs"][t][None]), state)
            qs.append(q[0].numpy())
    return np.array(qs), np.array(states)


@pytest.mark.parametrize("core", ["lstm", "gru"])
def test_stored_sequences_overlap_and_carry_the_states_and_priorities_the_network_gives(core):
    cfg = config(core, value_rescale="true")
    model, seqs = collect(cfg)
    assert len(seqs["priorities"]) >= 4 * ENVS
    # each record holds the sequences of every env in order: env e's k-th sequence is row k*ENVS + e
    by_env = [{name: values[e::ENVS] for name, values in seqs.items()} for e in range(ENVS)]
    ended = 0
    for env in by_env:
        assert not env["state0"][0].any()  # the first sequence starts an episode: a zero state
        for k in range(len(env["priorities"])):
            seq = {name: values[k] for name, values in env.items()}
            q, states = unroll(model, seq, L + 1)
            # the stored state is the one the policy holder acted from: stepping the network from it
            # gives the behaviour Q-values, and so the actor's initial priority
            b = BURN_IN
            taken = q[np.arange(L), seq["actions"]]
            targets = sequence_targets(seq["rewards"][:, None], seq["terminated"][:, None], seq["truncated"][:, None],
                                       seq["final_values"][:, None], q[b:].max(1)[:, None], GAMMA, N_STEP, b, True)
            want = sequence_priorities(np.abs(targets[:, 0] - taken[b:])[:, None], cfg.algo.dqn.priority_eta)[0]
            assert seq["priorities"] == pytest.approx(want, rel=1e-4, abs=1e-5)
            # a time limit's final observation has a value; other steps none
            assert not seq["final_values"][~seq["truncated"].astype(bool)].any()
            ended += int(seq["terminated"].sum() + seq["truncated"].sum())
            if k + 1 < len(env["priorities"]):  # the next sequence starts `PERIOD` steps later
                nxt = {name: values[k + 1] for name, values in env.items()}
                np.testing.assert_array_equal(nxt["obs"][:L + 1 - PERIOD], seq["obs"][PERIOD:])
                np.testing.assert_array_equal(nxt["actions"][:L - PERIOD], seq["actions"][PERIOD:])
                np.testing.assert_allclose(nxt["state0"], states[PERIOD], rtol=1e-5, atol=1e-6)
    assert ended >= 2 * ENVS  # episodes (of at most 5 steps) end inside the sequences
    assert by_env[0]["truncated"].any() and by_env[0]["final_values"][by_env[0]["truncated"].astype(bool)].all()


def test_burn_in_steps_warm_the_state_up_without_gradients():
    cfg = config()
    spaces = env_spaces(cfg.env)
    model = build_policy(spaces, cfg)
    assert isinstance(model, RecurrentQNetwork)
    B = 2
    obs = torch.randn((L + 1) * B, 4, requires_grad=True)
    starts = torch.zeros((L + 1) * B)
    q = model.q_sequence(obs, torch.zeros(B, model.state_size), starts, BURN_IN)
    assert q.shape == (L + 1 - BURN_IN, B, 2)
    q.sum().backward()
    grad = obs.grad.abs().sum(-1).reshape(L + 1, B)
    assert not grad[:BURN_IN].any() and grad[BURN_IN:].all()
    # but the burn-in steps shape the state the trained steps start from
    with torch.no_grad():
        other = obs.detach().clone()
        other[:B] += 1.0
        assert not torch.allclose(model.q_sequence(other, torch.zeros(B, model.state_size), starts, BURN_IN), q)


def test_the_trainers_td_errors_are_the_step_by_step_double_q_targets():
    cfg = config()
    spaces = env_spaces(cfg.env)
    torch.manual_seed(1)
    online, target = build_policy(spaces, cfg), build_policy(spaces, cfg)
    _, seqs = collect(cfg, records=2)
    data = {name: torch.as_tensor(values[:5]) for name, values in seqs.items() if name != "priorities"}
    td, q = sequence_td_errors(online, target, data, cfg.algo.dqn, GAMMA)
    assert td.shape == q.shape == (L - BURN_IN, 5)
    for b in range(5):
        seq = {name: values[b].numpy() for name, values in data.items()}
        q_online, _ = unroll(online, seq, L + 1)
        q_target, _ = unroll(target, seq, L + 1)
        values = q_target[np.arange(L + 1), q_online.argmax(1)]  # double Q: the online network chooses
        for t in range(BURN_IN, L):
            want = plain_target(seq["rewards"], seq["terminated"], seq["truncated"], seq["final_values"], values,
                                t, N_STEP, GAMMA)
            assert q[t - BURN_IN, b].item() == pytest.approx(q_online[t, seq["actions"][t]], rel=1e-4, abs=1e-5)
            assert (td[t - BURN_IN, b] + q[t - BURN_IN, b]).item() == pytest.approx(want, rel=1e-4, abs=1e-4)


def test_r2d2_config_mistakes_are_named():
    assert parse_config("algo: {name: dqn}\nmodel: {core: gru}").algo.dqn.burn_in == 40
    for text, match in [
        ("algo: {name: dqn, dqn: {sequence_length: 10, burn_in: 10}}\nmodel: {core: lstm}",
         r"algo.dqn.burn_in: expected 0 to sequence_length - 1 \(9\) steps, got 10"),
        ("algo: {name: dqn, dqn: {sequence_length: 10, burn_in: 4, sequence_period: 7}}\nmodel: {core: lstm}",
         r"algo.dqn.sequence_period: expected 1 to sequence_length - burn_in \(6\) steps"),
        ("algo: {name: dqn, dqn: {priority_eta: 1.5}}\nmodel: {core: lstm}", r"algo.dqn.priority_eta"),
    ]:
        with pytest.raises(ConfigError, match=match):
            parse_config(text)


def test_r2d2_trains_through_a_policy_server_and_plays_in_eval(tmp_path):
    """4 ranks (learner, policy server, 2 env ranks): the server keeps every env's hidden state,
    the replay fills with sequences, the learner trains on them and `hpcrl eval` plays the result."""
    envs, frames = 2 * 4, 4096
    cfg = small_config(tmp_path, run={"total_frames": frames}, env={"id": "hpcrl/CartPolePositions-v1"},
                       roles={"learner": {"ranks": 1}, "inference": {"ranks": 1}, "env": {"ranks": "rest"}},
                       model={"core": "lstm", "core_size": 16, "hidden_sizes": [16]})
    cfg["algo"] = {"name": "dqn", "rollout_length": 8, "lr": 0.001,
                   "dqn": {"batch_size": 8, "gradient_steps": 2, "target_update_interval": 10, "sequence_length": 12,
                           "burn_in": 4, "sequence_period": 6, "value_rescale": True, "eps_schedule": "linear",
                           "eps_decay_frames": 2000},
                   "replay": {"capacity": 10_000, "warmup": 32, "replay_ratio": 2}}
    metrics = check_finished(mpirun(4, "run", str(write_config(tmp_path, cfg))), cfg, frames, sync=False)
    # an env emits its first sequence after 12 steps, then one every 6: the replay holds them all
    steps = metrics["frames"] / envs
    assert np.all(metrics["replay_size"] <= envs * np.maximum(steps - 12 + 6, 0) / 6)
    assert metrics["replay_size"][-1] >= envs * ((steps[-1] - 12) // 6 + 1) - 2 * envs * 2  # records in flight
    assert metrics["replay_size"][0] >= 32  # nobody trains before the warm-up is in
    assert 1.0 < metrics["replay_ratio"][-1] <= 2.0 + 1e-9
    ck = load_checkpoint(str(run_dir(cfg) / "checkpoint.h5"))
    assert set(ck["parts"]["step"]["target"]) == set(ck["model"]) and any("core" in k for k in ck["model"])
    played = mpirun(1, "eval", str(run_dir(cfg)), "--episodes", "2")
    assert played.returncode == 0 and "2 episodes" in played.stdout, played.stdout + played.stderr
