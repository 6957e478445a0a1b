"""Recurrent policies (model.core): the hidden states policy holders keep, the state each fragment
carries, and the trainer's replay of fragments as sequences, checked against an independent
step-by-step replay of the same seeded envs and the same network."""
import copy
import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch

from hpcrl.algos.ppo import PPOStep
from hpcrl.core.config import ConfigError, parse_config
from hpcrl.core.dataflow import inference_messages
from hpcrl.core.seeds import env_seeds, seed_for
from hpcrl.envs import env_spaces
from hpcrl.envs.pomdp import CARTPOLE_POSITIONS
from hpcrl.core.messages import weights_spec
from hpcrl.models import build_policy, make_runner, num_params
from hpcrl.runtime import comm
from hpcrl.runtime.params import ParameterPublisher
from hpcrl.workers.policy_holder import PolicySet
from hpcrl.workers.policy_server import InlinePolicy
from hpcrl.launch.solo import solo_actor
from tests.conftest import mpirun_script

T, N, LIMIT = 12, 3, 5  # episodes are cut at 5 steps: every fragment has episode starts inside it


def config(core: str = "gru", mode: str = "sync", env: str = "CartPole-v1"):
    return parse_config(f"env: {{id: {env}, num_envs: {N}, kwargs: {{max_episode_steps: {LIMIT}}}}}\n"
                        f"algo: {{rollout_length: {T}, num_minibatches: {N}, mode: {mode}}}\n"
                        f"model: {{core: {core}, core_size: 8, hidden_sizes: [16]}}\nrun: {{seed: 3}}")


def collect(cfg, fragments: int = 2, init_seed: int = 0, sampler_seed: int = 0):
    """`fragments` fragments of one env rank with an inline recurrent policy (in one process, real
    MPI self-messages), and the network that acted (its weights from torch seed `init_seed`, its
    actions drawn with key `sampler_seed`)."""
    spaces = env_spaces(cfg.env)
    torch.manual_seed(init_seed)
    solo = solo_actor(cfg, spaces, sampler_seed=sampler_seed)
    got = []
    solo.records(fragments, 20 * T * fragments,
                 lambda r: got.append({name: array.copy() for name, array in r.arrays.items()}),
                 version_due=lambda actor: cfg.algo.mode == "sync" and actor.version_fragments == 0)
    solo.close()
    if len(got) < fragments:
        pytest.fail(f"{len(got)} of {fragments} fragments arrived")
    return solo.model, got


@pytest.mark.parametrize("core", ["gru", "lstm"])
def test_fragments_carry_the_states_a_step_by_step_replay_computes_and_reset_them_at_episode_ends(core):
    cfg = config(core)
    model, frags = collect(cfg)
    size = model.state_size
    assert frags[0]["init_state"].shape == (N, size) and not frags[0]["init_state"].any()  # every env starts
    for i in range(N):
        env = gym.make("CartPole-v1", max_episode_steps=LIMIT)
        obs, _ = env.reset(seed=env_seeds(cfg.run.seed, 0, N)[i])  # env rank 0's seeds
        state = torch.zeros(1, size)
        with torch.no_grad():
            for k, f in enumerate(frags):
                np.testing.assert_allclose(f["init_state"][i], state[0].numpy(), atol=1e-6)
                for t in range(T):
                    np.testing.assert_array_equal(f["obs"][t, i], obs)
                    x = torch.as_tensor(obs, dtype=torch.float32)[None]
                    logp, _, raw, after = model.evaluate_sequence(x, torch.as_tensor(f["actions"][t, i])[None], None,
                                                                  state, torch.zeros(1))
                    assert float(logp) == pytest.approx(float(f["logp"][t, i]), abs=1e-5)
                    assert float(raw) == pytest.approx(float(f["values"][t, i]), abs=1e-5)
                    obs, _, terminated, truncated, _ = env.step(int(f["actions"][t, i]))
                    if truncated and not terminated:  # V(final obs) from the state the episode ended in
                        assert float(f["trunc_values"][t, i]) == pytest.approx(float(model.value(
                            torch.as_tensor(obs, dtype=torch.float32)[None], after)), abs=1e-5)
                    state = after
                    if terminated or truncated:
                        state = torch.zeros(1, size)  # a new episode starts from zero
                        obs, _ = env.reset()
                bootstrap = model.value(torch.as_tensor(obs, dtype=torch.float32)[None], state)
                assert float(f["last_values"][i]) == pytest.approx(float(bootstrap), abs=1e-5)
    # the second fragment's sequences start from the states the first one ended in
    assert np.abs(frags[1]["init_state"]).sum() > 0


def test_a_policy_server_on_3_ranks_gives_the_hidden_states_and_actions_of_an_in_process_rollout(tmp_path):
    """The same seeded envs and initial weights (algo.train: false keeps them), one env group so the
    server answers one request at a time: the fragments a real 3-rank run trains on equal an
    in-process rollout's whose actions are drawn with the server's key (the same rows and steps)."""
    cfg_text = (f"run: {{name: r, output_dir: {tmp_path}/runs, seed: 3, total_frames: {3 * T * N}}}\n"
                "roles: {learner: {ranks: 1}, inference: {ranks: 1}, env: {ranks: 1}}\n"
                f"env: {{id: CartPole-v1, num_envs: {N}, groups: 1, kwargs: {{max_episode_steps: {LIMIT}}}}}\n"
                f"algo: {{rollout_length: {T}, num_minibatches: {N}, mode: sync, train: false}}\n"
                "model: {core: lstm, core_size: 8, hidden_sizes: [16]}\n")
    (tmp_path / "r.yaml").write_text(cfg_text)
    result = mpirun_script(3, "mpi_recurrent_run.py", str(tmp_path), str(tmp_path / "r.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr
    saved = np.load(tmp_path / "fragments.npz")
    remote = [{name.split("/")[1]: saved[name] for name in saved.files if name.startswith(f"{i}/")} for i in range(3)]
    cfg = parse_config(cfg_text)
    _, local = collect(cfg, fragments=3, init_seed=cfg.run.seed, sampler_seed=seed_for(cfg.run.seed, "action", 0))
    assert remote[1]["init_state"].any()  # states carried over from the first fragment
    for k in range(3):
        for name in ("obs", "actions", "dones", "init_state", "logp", "values", "trunc_values", "last_values"):
            np.testing.assert_allclose(remote[k][name], local[k][name], atol=1e-6, err_msg=f"fragment {k}: {name}")


class _Fragment:
    """A received fragment's arrays, as PPOStep reads them."""

    def __init__(self, arrays: dict):
        self.arrays = arrays

    def __getitem__(self, name):
        return self.arrays[name]


def replay(cfg, model, frag):
    """The trainer's step and batch for one fragment, and its sequences' log-probs and critic output
    under `model`, checked to give back the behaviour log-probs (the holder's states, resets included)."""
    step = PPOStep(cfg, model, torch.optim.Adam(model.parameters()), torch.device("cpu"), np.random.default_rng(0),
                   "float32", "int64")
    batch = step.assemble([frag])
    with torch.no_grad():
        logp, _, raw = model.evaluate(batch.obs, batch.actions, None, **batch.sequences())
    np.testing.assert_allclose(logp.numpy(), frag["logp"].reshape(-1), atol=1e-5)
    return step, batch, raw


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_trainer_replays_whole_fragments_as_sequences_split_at_episode_boundaries(mode):
    """Sync: the first update's ratios are exactly the behaviour policy's (the sequences replay the
    holder's states, resets included). Async: V-trace's re-evaluation under the same weights gives
    back the behaviour log-probs and values. Minibatches are whole columns."""
    cfg = config("lstm", mode)
    model, frags = collect(cfg, fragments=1)
    frag = _Fragment(frags[0])
    assert frag["dones"][:-1].any()  # episodes end inside the fragment: the replay must reset there
    step, batch, raw = replay(cfg, model, frag)
    assert batch.seq_len == T and batch.state0.shape == (N, model.state_size)
    np.testing.assert_array_equal(batch.starts.reshape(T, N)[1:].numpy(), frag["dones"][:-1])
    np.testing.assert_allclose(model.returns_of(raw).numpy(), frag["values"].reshape(-1), atol=1e-5)
    for idx in batch.minibatches(np.random.default_rng(1), N):  # one column each
        mb = batch.take(idx)
        column = int(idx[0])
        np.testing.assert_array_equal(idx.numpy(), np.arange(T) * N + column)
        np.testing.assert_array_equal(mb.state0.numpy(), frag["init_state"][[column]])
        with torch.no_grad():
            part, _, _ = model.evaluate(mb.obs, mb.actions, None, **mb.sequences())
        np.testing.assert_allclose(part.numpy(), frag["logp"][:, column], atol=1e-5)
    losses = step([frag])
    assert losses["approx_kl"] >= 0 and np.isfinite(losses["loss_value"])


def test_hidden_states_reset_only_where_an_episode_starts():
    """A policy holder zeroes the state of rows that start an episode and keeps the others'."""
    cfg = config("gru")
    spaces = env_spaces(cfg.env)
    runner = make_runner(build_policy(spaces, cfg), "cpu", seed=0)
    request, reply = inference_messages(cfg, spaces, groups=1)
    policy = InlinePolicy(PolicySet([runner], [comm.LocalWeightSubscriber(
        ParameterPublisher(None, weights_spec(num_params(runner.model))))]), request.allocate(), reply.allocate(),
        sync=False)
    policy.policies.runners[0].version = 0
    rng = np.random.default_rng(0)
    for starts in ([1, 1, 1], [0, 0, 0], [0, 1, 0]):
        before = policy.states.copy()
        policy.request["obs"][...] = rng.normal(size=policy.request["obs"].shape)
        policy.request["starts"][...] = starts
        policy.submit(0, 0)
        out = policy.poll()
        keep = ~np.array(starts, dtype=bool)
        np.testing.assert_array_equal(out["state"][keep], before[keep])  # the state each action was taken from
        assert not out["state"][~keep].any()
        assert not np.array_equal(policy.states, out["state"])  # and the holder advanced it


def test_recurrent_cores_refuse_what_they_cannot_train():
    with pytest.raises(ConfigError, match="model.core: expected one of none, lstm, gru"):
        parse_config("model: {core: transformer}")
    with pytest.raises(ConfigError, match="at most env.num_envs \\(2\\)"):
        parse_config("env: {num_envs: 2}\nalgo: {num_minibatches: 4}\nmodel: {core: gru}")


def test_cartpole_positions_hides_the_velocities():
    env = gym.make(CARTPOLE_POSITIONS)
    full = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=4)
    whole, _ = full.reset(seed=4)
    np.testing.assert_array_equal(obs, whole[[0, 2]])
    assert env.observation_space.shape == (2,)
    assert env_spaces(parse_config(f"env: {{id: {CARTPOLE_POSITIONS}}}").env).obs_shape == (2,)


@pytest.mark.parametrize("global_state", [True, False], ids=["env-state-critic", "agents-memory-critic"])
def test_recurrent_mappo_replays_its_sequences_in_whole_envs_and_its_critic_reads_every_agent(global_state):
    """MAPPO with an LSTM on simple_spread (3 agents per env, episodes of 4 steps inside a fragment):
    the trainer's sequences give back the behaviour log-probs and the central critic's values;
    minibatches hold whole envs of columns; the critic reads the env's state, or every agent's cell
    output, while each agent's policy reads only its own observation."""
    cfg = parse_config(f"env: {{id: 'mpe2:simple_spread_v3', num_envs: {N}, kwargs: {{max_cycles: 4}}, "
                       f"global_state: {str(global_state).lower()}}}\n"
                       f"algo: {{name: mappo, rollout_length: {T}, num_minibatches: {N}, mode: sync}}\n"
                       "model: {core: lstm, core_size: 8, hidden_sizes: [16]}\nrun: {seed: 3}")
    model, frags = collect(cfg, fragments=1)
    frag = _Fragment(frags[0])
    A = model.num_agents
    assert A == 3 and bool(model.state_dim) == global_state and frag["dones"][:-1].any()
    _, batch, raw = replay(cfg, model, frag)
    np.testing.assert_allclose(model.returns_of(raw).numpy(), frag["values"].reshape(-1), atol=1e-4)
    for idx in batch.minibatches(np.random.default_rng(1), N):  # one env's 3 agent columns each
        columns = idx[:A].numpy()
        assert columns[0] % A == 0 and np.array_equal(columns, columns[0] + np.arange(A))
        np.testing.assert_array_equal(idx.numpy(), (np.arange(T)[:, None] * N * A + columns).reshape(-1))
        with torch.no_grad():
            part, _, part_raw = model.evaluate(*(batch.take(idx).obs, batch.take(idx).actions, None),
                                               **batch.take(idx).sequences())
        np.testing.assert_allclose(part.numpy(), frag["logp"][:, columns].reshape(-1), atol=1e-5)
        np.testing.assert_allclose(model.returns_of(part_raw).numpy(), frag["values"][:, columns].reshape(-1),
                                   atol=1e-4)
    # agent 1's observation moves agent 0's value (through the critic) but not agent 0's policy
    obs = batch.obs[:A].clone()
    other = obs.clone()
    other[1, :-model.state_dim or None] += 1.0
    with torch.no_grad():
        zero = torch.zeros(A, model.state_size)
        a0 = model.sample(obs, None, None, zero)
        b0 = model.sample(other, None, None, zero)
        logits = [model.actor(model._step(model._encoded(o)[1], zero)[0]) for o in (obs, other)]
    torch.testing.assert_close(logits[0][0], logits[1][0])
    assert global_state or not torch.allclose(a0[2][0], b0[2][0])


def test_an_agent_that_left_early_starts_the_next_episode_from_a_zero_state():
    """tests.ma_envs:Relay: agent 2 leaves after 2 steps, the others play 6. When the env restarts
    the leaver is not done again, yet its row begins an episode: the holder zeroes its state there,
    the fragment says so in `starts`, and the trainer's replay zeroes the same rows (it gives back
    the behaviour log-probs)."""
    cfg = parse_config(f"env: {{id: 'tests.ma_envs:Relay', num_envs: {N}}}\n"
                       f"algo: {{name: ippo, rollout_length: {T}, num_minibatches: {N}, mode: sync}}\n"
                       "model: {core: gru, core_size: 8, hidden_sizes: [16]}\nrun: {seed: 3}")
    model, frags = collect(cfg, fragments=1)
    frag = _Fragment(frags[0])
    leaver = np.arange(N) * 3 + 2  # agent 2 of every env
    dones, starts = frag["dones"].astype(bool), frag["starts"].astype(bool)
    restart = np.flatnonzero(dones[:-1, 0])  # agent 0's episode ends with its env's, every 6 steps
    assert len(restart) and not dones[restart][:, leaver].any()  # the leaver is not done again there
    assert starts[restart + 1][:, leaver].all()  # but its next step begins an episode
    np.testing.assert_array_equal(starts[1:] & ~dones[:-1], np.isin(np.arange(3 * N), leaver)[None]
                                  & np.isin(np.arange(1, T), restart + 1)[:, None])
    replay(cfg, model, frag)


def test_the_step_estimates_with_the_algo_section_in_effect_not_the_configs():
    """algo.schedule: the trainer hands the step the algo section in effect. A discount of 0 in
    effect makes every value target the step's own reward (CartPole's: 1), where the config's 0.99
    bootstraps from the next state's value; the config itself is left as it was."""
    cfg = config()
    model, frags = collect(cfg, fragments=1)
    step, batch, _ = replay(cfg, model, _Fragment(frags[0]))
    assert not np.allclose(batch.returns.numpy(), 1.0)
    myopic = step.assemble([_Fragment(frags[0])], algo=dataclasses.replace(cfg.algo, gamma=0.0))
    np.testing.assert_allclose(myopic.returns.numpy(), 1.0, rtol=1e-6)
    assert cfg.algo.gamma == 0.99
    twin, _, _ = replay(cfg, copy.deepcopy(model), _Fragment(frags[0]))  # the same weights, its own optimizer
    losses = step([_Fragment(frags[0])])
    twin_losses = twin([_Fragment(frags[0])], algo=dataclasses.replace(cfg.algo, gamma=0.0))
    assert twin_losses["loss_value"] != losses["loss_value"]  # the update trains on the targets in effect
