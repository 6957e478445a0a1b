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
  receipt of its fragments, and with several learners a ring allreduce of the gradient per
  gradient step (messages at the measured per-byte cost, and half of Horovod's cycle).
The run's frames per second is the least of: the cores of the job over the CPU a frame costs in
all roles together (a saturated machine), and each role's ranks over the CPU a frame costs there
(no rank uses more than one core). In sync mode sampling and training alternate, so their times
add, and while sampling the env and inference ranks share the cores among them (they poll between
steps rather than sleep). The role whose term is least is the bound; 'cores' means every core is busy.
"""
from __future__ import annotations

from dataclasses import dataclass, field

Fit = tuple[float, float]  # seconds = a + b * size
HOROVOD_CYCLE_S = 1e-4  # the trainers' Horovod cycle with several learners (workers/trainer.py)


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
    update: Fit  # one trainer update, by frames in the trainer's batch
    message: Fit  # one message through hpcrl's streams, both ends together, by bytes
    rows_per_env: int = 1  # agents per env (PettingZoo): a frame is an env step, a row an agent


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


@dataclass
class Prediction:
    frames_per_s: float
    bound: str  # 'env', 'inference', 'learner' or 'cores'
    per_role: dict[str, float] = field(default_factory=dict)  # frames/s each role's ranks could take alone
    cpu_per_frame: dict[str, float] = field(default_factory=dict)  # CPU seconds per frame, all ranks of a role


def predict(m: Measured, s: Shape, cores: float) -> Prediction:
    """Frames per second of layout `s` on `cores` cores (see the module's docstring)."""
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
    # the busiest inference rank, per step of all its env ranks (every request waiting: one batch)
    served = s.envs_per_inference * n * m.rows_per_env
    inf_cpu = (cost(m.forward, served) + s.envs_per_inference * G * exchange) * bootstrap if remote else 0.0
    # the busiest learner, per update: its share of the batch and the receipt of its fragments
    share = s.batch_frames * s.envs_per_learner / s.envs
    learn_cpu = cost(m.update, share) + share / (T * n) * cost(m.message, s.fragment_bytes)
    if s.learners > 1:  # a ring allreduce of the gradient per step: 2(L-1) messages of bytes/L each
        L = s.learners
        learn_cpu += s.gradient_steps * (HOROVOD_CYCLE_S / 2 + 2 * (L - 1) * cost(m.message, s.gradient_bytes / L))
    cpu = {"env": env_cpu / n, "learner": learn_cpu * s.learners / s.batch_frames}  # all ranks of a role, per frame
    if remote:
        cpu["inference"] = inf_cpu * s.inference / (s.envs * n)
    wait = cost(m.forward, served) if remote and G == 1 else 0.0  # one env group: its rank idles while served
    per_role = {"env": s.envs * n / (env_cpu + wait), "learner": s.batch_frames / learn_cpu}
    if remote:  # every env rank steps once per batch of its server
        per_role["inference"] = s.envs * n / inf_cpu
    if not s.sync:
        terms = dict(per_role, cores=cores / sum(cpu.values()))
        bound = min(terms, key=terms.get)
        return Prediction(terms[bound], bound, per_role, cpu)
    # sync: sampling, then training; their times add. While sampling, every env and inference rank
    # is latency-bound and polls between its steps (the learners sleep), so where those ranks
    # outnumber the cores each gets its share of them; while training, only the learners run.
    sampling_ranks = s.envs + (s.inference if remote else 0)
    sampling_terms = {r: per_role[r] * min(1.0, cores / sampling_ranks) for r in ("env", "inference") if r in per_role}
    sampling_terms["cores"] = cores / (cpu["env"] + cpu.get("inference", 0.0))
    sampling_bound = min(sampling_terms, key=sampling_terms.get)
    training = min(per_role["learner"] * min(1.0, cores / s.learners), cores / cpu["learner"])
    frames = 1.0 / (1.0 / sampling_terms[sampling_bound] + 1.0 / training)
    return Prediction(frames, "learner" if training < sampling_terms[sampling_bound] else sampling_bound, per_role, cpu)
