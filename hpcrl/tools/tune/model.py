"""The throughput model of `hpcrl tune`: from a few costs measured on one core, the frames per
second a layout will reach, and which role bounds it. Pure (numpy only), so tests drive it with
synthetic measurements.

Every cost is CPU seconds on one core, fitted as a + b x (x: envs, rows, frames or bytes). For a
layout (from `hpcrl plan`'s own `plan_layout`: counts, fan-in, routing) the model charges each
role its CPU per frame, at the busiest rank of the role:
- an env rank: one step of its N envs per N frames, as the actor steps them with an inline policy
  (measured whole: the env, the forward, the actor's own work per step, its records' sends); with
  remote inference the forward is replaced by one request and one reply per env group through the
  inference stream, and with one env group it also idles while its server answers;
- an inference rank: one batched forward of every row its env ranks send per step (all requests
  waiting: the saturated case), and the messages of each request;
- a learner: its share of each update (the algorithm's own step on its part of the batch), the
  receipt of its fragments, and with several learners what averaging the gradient adds to each
  gradient step: as measured with two learners under mpirun (tools/tune/averaging.py: Horovod's wait
  for its thread and the other learner), plus the ring's further messages beyond two.
The run's frames per second is the least of: the cores of the job over the CPU a frame costs in
all roles together (a saturated machine), and each role's ranks over the CPU a frame costs there
(no rank uses more than one core). In sync mode sampling and training alternate, so their times
add, and while sampling the env and inference ranks share the cores among them (they poll between
steps rather than sleep). The role whose term is least is the bound; 'cores' means every core is busy.

DQN, SAC and TD3 (a replay shard in every learner, `Shape.replay`): the env and inference ranks
cost as above; a learner takes each record into its shard (the message and the insert) and takes
gradient_steps steps of its share of the batch size per update (algo.dqn's, or algo.sac's;
`Measured.update` is one gradient step, by rows). With algo.replay.replay_ratio r the learners train r rows per row
inserted and hold their actors back to it (credits), so a learner costs CPU per frame like any role.
Without one (Ape-X) the learners train flat out: each keeps its core (or its share of an
oversubscribed node's cores), the env and inference ranks share the rest, a learner bounds the
frames only by what it can take in, and the model predicts the gradient steps per second and the
replay ratio that follow.
"""
from __future__ import annotations

from dataclasses import dataclass, field

Fit = tuple[float, float]  # seconds = a + b * size
HOROVOD_CYCLE_S = 1e-4  # the trainers' Horovod cycle with several learners (workers/averaging.py)


def cost(fit: Fit, size: float) -> float:
    return fit[0] + fit[1] * size


def fit_line(sizes: list[float], seconds: list[float]) -> Fit:
    """Least-squares a + b x through the measured points, with a and b kept >= 0 (a cost never
    shrinks with size, and a fixed part below 0 is noise)."""
    n = len(sizes)
    mx, my = sum(sizes) / n, sum(seconds) / n
    var = sum((x - mx) ** 2 for x in sizes)
    b = max(0.0, sum((x - mx) * (y - my) for x, y in zip(sizes, seconds)) / var) if var else 0.0
    a = my - b * mx
    if a < 0:  # through the origin instead
        a, b = 0.0, sum(x * y for x, y in zip(sizes, seconds)) / max(sum(x * x for x in sizes), 1e-30)
    return (a, b)


@dataclass(frozen=True)
class Measured:
    """Costs measured on one core of this machine (CPU seconds)."""

    actor_step: Fit  # one step of an env rank with an inline policy (env, forward, bookkeeping), by envs
    forward: Fit  # one policy forward, by rows
    update: Fit  # one trainer update, by frames in the trainer's batch (DQN: one gradient step, by rows)
    message: Fit  # one message through hpcrl's streams, both ends together, by bytes
    rows_per_env: int = 1  # agents per env (PettingZoo): a frame is an env step, a row an agent
    insert: Fit = (0.0, 0.0)  # DQN: one record's rows into a replay shard, by rows
    # the wall seconds Horovod's averaging adds to a gradient step of 2 learners (tools/tune/averaging.py);
    # None: not measured, so only the ring's messages and half of Horovod's cycle are charged
    averaging_step: float | None = None
    # on a GPU (wall seconds, measured there): the forward of an inference rank, a learner's update
    forward_cuda: Fit | None = None
    update_cuda: Fit | None = None


@dataclass(frozen=True)
class Shape:
    """What a candidate layout is, for the model: counts and the busiest rank's fan-in from
    plan_layout, and the sizes of its messages."""

    learners: int
    inference: int
    envs: int
    num_envs: int  # per env rank
    groups: int
    rollout: int  # algo.rollout_length
    batch_frames: int  # frames per update, all learners together
    envs_per_inference: int  # the largest fan-in (0: inline inference)
    envs_per_learner: int
    request_bytes: int
    reply_bytes: int
    fragment_bytes: int
    sync: bool
    gradient_steps: int = 0  # per update (epochs x minibatches): one allreduce each with several learners
    gradient_bytes: int = 0  # the gradient every learner allreduces per step
    # DQN (replay): each learner's update is gradient_steps steps of step_rows rows of its shard
    replay: bool = False
    replay_ratio: float | None = None  # rows sampled per row inserted (None: learners train flat out, Ape-X)
    step_rows: int = 0  # rows of one gradient step of one learner (the batch size / learners)
    record_rows: int = 0  # rows one record brings to a shard
    record_frames: int = 0  # env steps one record holds
    # on a GPU each (one per rank): the learners, the inference ranks
    learner_cuda: bool = False
    inference_cuda: bool = False


@dataclass
class Prediction:
    frames_per_s: float
    bound: str  # 'env', 'inference', 'learner' or 'cores'
    per_role: dict[str, float] = field(default_factory=dict)  # frames/s each role's ranks could take alone
    cpu_per_frame: dict[str, float] = field(default_factory=dict)  # CPU seconds per frame, all ranks of a role
    gradient_steps_per_s: float = 0.0  # DQN: gradient steps per second of each learner (they step together)
    replay_ratio: float = 0.0  # DQN: rows sampled per row inserted (the config's, or Ape-X's predicted)


def _allreduce(m: Measured, s: Shape) -> float:
    """What averaging the gradient between the learners adds to one gradient step (0 with one
    learner): as measured with 2 learners, and for more the ring's further messages (2(L-1) of
    bytes/L each); not measured, those messages and half of Horovod's cycle."""
    L = s.learners
    if L == 1:
        return 0.0
    ring = 2 * (L - 1) * cost(m.message, s.gradient_bytes / L)
    if m.averaging_step is None:
        return HOROVOD_CYCLE_S / 2 + ring
    return m.averaging_step + max(ring - 2 * cost(m.message, s.gradient_bytes / 2), 0.0)


def _update(m: Measured, s: Shape) -> Fit:
    return m.update_cuda if s.learner_cuda else m.update


def _sampling(m: Measured, s: Shape) -> tuple[dict[str, float], dict[str, float], float]:
    """The env and inference ranks: (CPU per frame of each role's ranks together, frames/s each
    role's ranks could take alone, their CPU per vector step of one env rank)."""
    n, T, G = s.num_envs, s.rollout, s.groups
    remote = s.envs_per_inference > 0
    # sync PPO's extra policy call per fragment, for the last values (async: that call's actions
    # begin the next fragment)
    bootstrap = (T + 1) / T if s.sync else 1.0
    exchange = cost(m.message, s.request_bytes) + cost(m.message, s.reply_bytes)
    # one env rank, per vector step (n frames): measured with an inline policy in async mode (no
    # bootstrap call); remote inference trades the forward for the exchanges, sync mode adds the call
    forward = cost(m.forward, n * m.rows_per_env)
    own = max(cost(m.actor_step, n) - forward, 0.0)  # the env and the actor's own work, without the policy
    env_cpu = own + (G * exchange if remote else forward) * bootstrap
    cpu = {"env": env_cpu / n}
    if not remote:
        return cpu, {"env": s.envs * n / env_cpu}, env_cpu
    # the busiest inference rank, per step of all its env ranks (every request waiting: one batch)
    served = s.envs_per_inference * n * m.rows_per_env
    batch_forward = cost(m.forward_cuda if s.inference_cuda else m.forward, served)
    inf_cpu = (batch_forward + s.envs_per_inference * G * exchange) * bootstrap
    cpu["inference"] = inf_cpu * s.inference / (s.envs * n)
    wait = batch_forward if G == 1 else 0.0  # one env group: its rank idles while served
    # every env rank steps once per batch of its server
    return cpu, {"env": s.envs * n / (env_cpu + wait), "inference": s.envs * n / inf_cpu}, env_cpu


def predict(m: Measured, s: Shape, cores: float) -> Prediction:
    """Frames per second of layout `s` on `cores` cores (see the module's docstring)."""
    if s.replay:
        return _predict_replay(m, s, cores)
    T, n = s.rollout, s.num_envs
    cpu, per_role, _ = _sampling(m, s)
    # the busiest learner, per update: its share of the batch and the receipt of its fragments
    share = s.batch_frames * s.envs_per_learner / s.envs
    learn_cpu = cost(_update(m, s), share) + share / (T * n) * cost(m.message, s.fragment_bytes) + \
        s.gradient_steps * _allreduce(m, s)
    cpu["learner"] = learn_cpu * s.learners / s.batch_frames  # all learners, per frame
    per_role["learner"] = s.batch_frames / learn_cpu
    if not s.sync:
        return _least(per_role, cores / sum(cpu.values()), cpu)
    # sync: sampling, then training; their times add. While sampling, every env and inference rank
    # is latency-bound and polls between its steps (the learners sleep), so where those ranks
    # outnumber the cores each gets its share of them; while training, only the learners run.
    sampling_ranks = s.envs + (s.inference if "inference" in cpu else 0)
    sampling_terms = {r: per_role[r] * min(1.0, cores / sampling_ranks) for r in ("env", "inference") if r in per_role}
    sampling_terms["cores"] = cores / (cpu["env"] + cpu.get("inference", 0.0))
    sampling_bound = min(sampling_terms, key=sampling_terms.get)
    training = min(per_role["learner"] * min(1.0, cores / s.learners), cores / cpu["learner"])
    frames = 1.0 / (1.0 / sampling_terms[sampling_bound] + 1.0 / training)
    return Prediction(frames, "learner" if training < sampling_terms[sampling_bound] else sampling_bound, per_role, cpu)


def _least(per_role: dict[str, float], cores_term: float, cpu: dict[str, float]) -> Prediction:
    terms = dict(per_role, cores=cores_term)
    bound = min(terms, key=terms.get)
    return Prediction(terms[bound], bound, per_role, cpu)


def _predict_replay(m: Measured, s: Shape, cores: float) -> Prediction:
    """DQN (see the module's docstring)."""
    cpu, per_role, _ = _sampling(m, s)
    frames_per_record = s.record_frames
    rows_per_frame = s.record_rows / frames_per_record
    # a learner, per frame it takes in: the record's message and its rows into the shard
    ingest = (cost(m.message, s.fragment_bytes) + cost(m.insert, s.record_rows)) / frames_per_record
    step_cpu = cost(_update(m, s), s.step_rows) + _allreduce(m, s)  # one gradient step of one learner
    to_learners = s.envs / s.envs_per_learner  # frames of the run per frame of the busiest learner
    if s.replay_ratio is not None:  # r rows sampled per row inserted: step_rows per step
        steps_per_frame = s.replay_ratio * rows_per_frame / s.step_rows  # of one learner, per frame it takes in
        learn = ingest + steps_per_frame * step_cpu
        cpu["learner"] = learn
        per_role["learner"] = to_learners / learn
        p = _least(per_role, cores / sum(cpu.values()), cpu)
        p.gradient_steps_per_s = p.frames_per_s / to_learners * steps_per_frame
        p.replay_ratio = s.replay_ratio
        return p
    # Ape-X: every learner is always busy, so it holds a core, or its share of an oversubscribed node
    ranks = s.learners + s.envs + s.inference
    learner_core = min(1.0, cores / ranks)
    per_role["learner"] = to_learners * learner_core / ingest  # taking records in and nothing else
    p = _least(per_role, max(cores - s.learners, cores * (ranks - s.learners) / ranks) / sum(cpu.values()), cpu)
    taken_in = p.frames_per_s / to_learners  # frames/s of the busiest learner
    p.gradient_steps_per_s = max(learner_core - taken_in * ingest, 0.0) / step_cpu
    p.replay_ratio = p.gradient_steps_per_s * s.step_rows / max(taken_in * rows_per_frame, 1e-12)
    p.cpu_per_frame["learner"] = ingest
    return p
