"""An env rank writing fragments end to end in one process (the serial-mode plumbing, real MPI self-messages), checked
against an independent replay of the same seeded environments."""
import gymnasium as gym
import numpy as np
import pytest
import torch

from hpcrl.runtime import comm
from hpcrl.runtime.params import ParameterPublisher
from hpcrl.runtime.streams import SampleReceiver, SampleSender
from hpcrl.core.config import parse_config
from hpcrl.envs import env_spaces
from hpcrl.core.messages import EPISODE_STATS, fragment_spec, reply_spec, request_spec, weights_spec
from hpcrl.models import PolicyRunner, build_model, copy_params_to, num_params
from hpcrl.workers.env_rank import EnvRank
from hpcrl.workers.fragment_writer import FragmentWriter
from hpcrl.workers.policy_holder import PolicySet
from hpcrl.workers.policy_server import InlinePolicy
from hpcrl.core.seeds import env_seeds

T, N, LIMIT = 16, 3, 8  # episodes are cut at 8 steps, so truncation falls on t=7 and t=T-1=15


def collect_fragment(env: str = f"{{id: CartPole-v1, num_envs: {N}, kwargs: {{max_episode_steps: {LIMIT}}}}}"):
    cfg = parse_config(f"env: {env}\nalgo: {{rollout_length: {T}, num_minibatches: 1}}\nrun: {{seed: 5}}")
    spaces = env_spaces(cfg.env)
    torch.manual_seed(0)
    model = build_model(spaces, cfg.model)
    publisher = ParameterPublisher(None, weights_spec(num_params(model)))
    publisher.publish(0, lambda flat: copy_params_to(model, flat))
    runner = PolicyRunner(build_model(spaces, cfg.model), "cpu", seed=0)
    req = request_spec(N, spaces.obs_shape, spaces.obs_dtype)
    rep = reply_spec(N, spaces.action_shape, spaces.action_dtype)
    policy = InlinePolicy(PolicySet([runner], [comm.LocalWeightSubscriber(publisher)]), req.allocate(), rep.allocate())
    frag = fragment_spec(T, N, spaces.obs_shape, spaces.obs_dtype, spaces.action_shape, spaces.action_dtype)
    me = comm.JOB.Get_rank()
    stream = comm.stream_communicator(comm.JOB)
    receiver = SampleReceiver(stream, [me], [frag.allocate()])
    role = EnvRank(cfg, rank=me, index=0, policies=[policy],
                   senders=[SampleSender(stream, me, [frag.allocate(), frag.allocate()])], writer=FragmentWriter(cfg))
    for _ in range(10 * T):
        role.poll()
        if (ready := receiver.ready()):
            break
    else:
        pytest.fail("no fragment arrived")
    fragment = receiver.slots[ready[0]]
    receiver.close()  # cancels the receive of the second credit the env rank holds
    return cfg, model, fragment


def test_fragment_matches_a_replay_and_truncation_bootstraps_from_the_final_obs():
    cfg, model, f = collect_fragment()
    assert (f.get("version"), f.get("index"), f.get("frames")) == (0, 0, T * N)

    @torch.no_grad()
    def value(obs):
        return float(model.value(torch.as_tensor(obs, dtype=torch.float32)[None])[0])

    truncated_at_end, episodes, returns = 0, 0, []
    for i in range(N):
        env = gym.make("CartPole-v1", max_episode_steps=LIMIT)
        obs, _ = env.reset(seed=env_seeds(cfg.run.seed, 0, N)[i])  # the seeds EnvRank gives env rank 0
        ep_return = 0.0
        for t in range(T):
            np.testing.assert_array_equal(f["obs"][t, i], obs)
            obs, reward, terminated, truncated, _ = env.step(int(f["actions"][t, i]))
            ep_return += reward
            assert f["rewards"][t, i] == reward and f["dones"][t, i] == (terminated or truncated)
            if truncated and not terminated:
                assert f["trunc_values"][t, i] == pytest.approx(value(obs), abs=1e-5)  # V(final obs)
                truncated_at_end += t == T - 1
            else:
                assert f["trunc_values"][t, i] == 0.0
            if terminated or truncated:
                episodes += 1
                returns.append(ep_return)
                ep_return = 0.0
                obs, _ = env.reset()
        assert f["last_values"][i] == pytest.approx(value(obs), abs=1e-5)  # V(obs after the last step)
    assert truncated_at_end >= 1  # the t = T-1 case (value from the extra end-of-rollout request) ran
    stats = dict(zip(EPISODE_STATS, f["episode_stats"]))
    assert stats["episodes"] == episodes and stats["return_sum"] == pytest.approx(sum(returns))
    assert stats["return_min"] == min(returns) and stats["return_max"] == max(returns)


def test_with_normalize_reward_a_fragment_carries_raw_rewards_and_the_moments_of_its_returns():
    cfg, _, f = collect_fragment(f"{{id: CartPole-v1, num_envs: {N}, normalize_reward: true, "
                                 f"kwargs: {{max_episode_steps: {LIMIT}}}}}")
    stats = dict(zip(EPISODE_STATS, f["episode_stats"]))
    assert np.all(f["rewards"] == 1.0)  # the trainers scale them, with every env rank's statistics
    assert stats["episodes"] >= N and stats["return_max"] <= LIMIT
    assert stats["return_sum"] == stats["length_sum"]  # metrics: CartPole's raw reward, 1 a step
    returns, seen = np.zeros(N), []
    for t in range(T):  # the discounted return of every env at every step of the fragment
        returns = returns * cfg.algo.gamma + f["rewards"][t]
        seen.extend(returns)
        returns[f["dones"][t].astype(bool)] = 0.0
    count, mean, m2 = f["return_moments"]
    assert count == T * N and mean == pytest.approx(np.mean(seen)) and m2 == pytest.approx(np.var(seen) * T * N)


def test_metrics_count_whole_games_of_raw_score_across_life_losses():
    """tests.custom_envs:ThreeLives loses a life every 4 steps (terminal for training) and ends the
    game with the third; step k of a game has raw reward k. A fragment of 16 steps holds one whole
    game of 12 steps per env: return 1 + ... + 12 = 78."""
    _, _, f = collect_fragment(f"{{id: 'tests.custom_envs:ThreeLives', num_envs: {N}}}")
    np.testing.assert_array_equal(f["dones"][:, 0], [(t + 1) % 4 == 0 for t in range(T)])
    assert (f["rewards"] == 1.0).all()
    stats = dict(zip(EPISODE_STATS, f["episode_stats"]))
    assert stats["episodes"] == N and stats["return_sum"] == N * 78 and stats["length_sum"] == N * 12
