"""Inference rank (policy server) and inline inference: both run the algorithm's runner (models:
PolicyRunner for PPO, models.q:QRunner for DQN) on fresh weights and fill the reply fields it names.

Sync mode: a request names the policy version it must be answered with. An inference rank holds
requests for a version it does not have yet, and serves them in one batched forward pass once
that version has come down the parameter stream (a tree from the learner root over node leaders
to the holders of each node, runtime/params.py).
Async mode: a request names the oldest version it accepts, and is answered with the newest
weights at hand: inference never waits for the learner.
The stop word comes on the control stream: each actor group's next request is then answered with
STOP (the inference stream's goodbye), and the server leaves once every group has had it and the
parameter stream has closed (END).
"""
from __future__ import annotations

import numpy as np

from hpcrl.runtime.comm import RequestServer
from hpcrl.core.messages import STOP, VALUES_ONLY, Message
from hpcrl.core.observations import apply, assign, take
from hpcrl.core.observations import count_rows
from hpcrl.runtime.params import END
from hpcrl.core.seeds import seed_for
from hpcrl.core.startup import CLOCK
from hpcrl.models import Runner
from hpcrl.runtime.comm import LocalWeightSubscriber
from hpcrl.workers.selfplay import Pool


class PolicySet:
    """The policies a holder runs: a runner per policy id, each fed by that policy's parameter
    stream (one of each in a run of one policy). With several, a batch's rows are split by the
    policy id each row carries (the request's `policy` field), each runner takes its own rows in
    one forward pass, and the results go back in row order. A central critic reads whole envs of
    its own agents: rows keep their order, so a request's rows of one policy are still whole envs.
    With a self-play pool (workers/selfplay.py), ids after the training policies' are its ages."""

    def __init__(self, runners: list[Runner], weights: list, pool: Pool | None = None):
        self.runners, self.weights, self.pool = runners, weights, pool
        self.outputs = runners[0].outputs
        self.ended = False  # a parameter stream has closed: the trainers have stopped

    @property
    def version(self) -> int:
        """The oldest version held (the trainers of all policies update in step, so versions agree
        once every policy's has arrived)."""
        return self.runners[0].version if len(self.runners) == 1 else min(r.version for r in self.runners)

    def act(self, obs: np.ndarray, out: dict[str, np.ndarray], mask: np.ndarray | None,
            policy: np.ndarray | None = None, state: np.ndarray | None = None) -> None:
        """`state`: a recurrent policy's hidden states of the rows, advanced in place."""
        extra = {} if state is None else {"state": state}
        if policy is None:
            self.runners[0].act(obs, out, mask, **extra)
            return
        for p, rows in self._rows(policy):
            part = {name: values[rows] for name, values in out.items()}
            rows_state = {} if state is None else {"state": state[rows]}
            self._runner(p).act(take(obs, rows), part, None if mask is None else mask[rows], **rows_state)
            for name, values in part.items():
                out[name][rows] = values
            if state is not None:
                state[rows] = rows_state["state"]

    def value(self, obs: np.ndarray, out: np.ndarray, policy: np.ndarray | None = None,
              state: np.ndarray | None = None) -> None:
        """`state`: a recurrent policy's hidden states of the rows, left as they are."""
        extra = {} if state is None else {"state": state}
        if policy is None:
            self.runners[0].value(obs, out, **extra)
            return
        for p, rows in self._rows(policy):
            part = out[rows]
            self._runner(p).value(take(obs, rows), part, **({} if state is None else {"state": state[rows]}))
            out[rows] = part

    def _rows(self, policy: np.ndarray):
        for p in np.unique(policy):
            yield int(p), np.flatnonzero(policy == p)

    def _runner(self, p: int) -> Runner:
        return self.runners[p] if p < len(self.runners) else self.pool.runner(p - len(self.runners))

    def poll_weights(self) -> int:
        """Load each policy's newest version that has arrived; the versions taken (END counts)."""
        taken = 0
        for runner, weights in zip(self.runners, self.weights):
            message = weights.poll()
            if message is None:
                continue
            taken += 1
            if message.get("flags") & END:  # the stream closes; why the run stops is on the control stream
                self.ended = True
            else:
                runner.load(message["params"], message.get("version"))
                weights.rearm()
                if self.pool is not None:
                    self.pool.offer(runner, runner.version)
        return taken

    def finished(self) -> bool:
        """Every parameter stream has closed here (a node's leader has passed END on)."""
        return all(w.finished() for w in self.weights)

    def close(self) -> None:
        for w in self.weights:
            w.close()


def build_policies(w, device: str, purpose: str, index: int) -> PolicySet:
    """A policy holder's runners (one per policy, each from its own spaces) and its parameter-stream
    ends: inference rank number `index`, or the inline policy of env rank `index`."""
    weights = [LocalWeightSubscriber(w.params[0])] if w.layout.serial else w.params
    runners = [build_runner(w.cfg, spaces, device, purpose, index, policy=p) for p, spaces in enumerate(w.policy_spaces)]
    s = w.cfg.algo.selfplay
    pool = (Pool([build_runner(w.cfg, w.policy_spaces[0], device, purpose, index, policy=len(runners) + k)
                  for k in range(s.pool)], s.snapshot_every) if s.pool else None)
    return PolicySet(runners, weights, pool)


class InlinePolicy:
    """The policy inside an env rank (`inference: {ranks: 0}`, and serial mode): same calls as
    RemotePolicy, answered in-process once this rank holds the requested version."""

    def __init__(self, policies: PolicySet, request: Message, reply: Message, sync: bool = True, control=None):
        """`control`: the rank's control stream (None: only the weights' END stops it, as in tests
        that drive an actor alone)."""
        self.policies = policies
        self.sync = sync
        self.control = control
        self.request, self.reply = request, reply
        states = holder_states(policies, 1, count_rows(request["obs"]))
        self.states = None if states is None else states[0]  # a recurrent policy's, of this rank's env rows
        self.batch = RequestBatch(policies, request, reply, 1, state_size(policies))
        self.stopped = False
        self._wanted: int | None = None

    def submit(self, version: int, n_final: int, flags: int = 0) -> None:
        self.request.set(version=version, n_final=n_final, flags=flags)
        self._wanted = version

    @classmethod
    def build(cls, w, index: int) -> "InlinePolicy":
        """The policy of env rank number `index` (inference: {ranks: 0}, and serial mode)."""
        spec = w.inference
        return cls(build_policies(w, w.cfg.roles.env.device, "inline_policy", index), spec.request.allocate(),
                   spec.reply.allocate(), sync=w.cfg.algo.mode == "sync", control=w.control)

    def finished(self) -> bool:
        """Every parameter stream has closed here (a node's leader has passed END on)."""
        if not self.policies.finished():
            self._take_weights()
            return False
        return True

    def close(self) -> None:
        self.policies.close()

    def sampling_state(self):
        """Serial mode (one policy): the action sampler's generator, and a recurrent policy's
        hidden states."""
        generator = self.policies.runners[0].generator.get_state()
        return generator if self.states is None else {"generator": generator, "hidden": self.states.copy()}

    def restore_sampling_state(self, state) -> None:
        if isinstance(state, dict):
            self.states[...] = state["hidden"]
            state = state["generator"]
        self.policies.runners[0].generator.set_state(state)

    def poll(self) -> Message | None:
        if self._wanted is None:
            return None
        if not self.stopped and (not self.sync or self.policies.version < self._wanted):
            self._take_weights()
        if self.control is not None and self.control.stopped:
            self.stopped = True
        if self.stopped:
            self.reply.set(flags=STOP)
            return self.reply
        if not can_answer(self.policies.version, self._wanted, self.sync):
            return None
        self.batch.answer([(self.request, self.reply, self.states)])
        self._wanted = None
        return self.reply

    def _take_weights(self) -> None:
        self.policies.poll_weights()
        if self.policies.ended:
            self.stopped = True  # the last version: the trainers have stopped


def build_runner(cfg, spaces, device: str, purpose: str, index: int, policy: int = 0) -> Runner:
    """Policy number `policy` of an inference rank (or an env rank's inline one); `index`: the
    rank's index in its role."""
    import torch

    from hpcrl.models import build_policy, make_runner
    torch.manual_seed(cfg.run.seed)  # initial weights; the learner root's first version replaces them
    # action sampling: its own stream per rank, repeatable per run seed
    return make_runner(build_policy(spaces, cfg), device, seed=seed_for(cfg.run.seed, purpose, index, group=policy))


def can_answer(have: int, wanted: int, sync: bool) -> bool:
    """Sync: exactly the requested version; async: the requested one or newer."""
    return have == wanted or (not sync and have > wanted)


class RequestBatch:
    """Requests answered together: their rows gathered into one batch, one forward pass per
    policy, the outputs scattered back into each reply. A policy server batches every ready
    request; an inline policy is a batch of one, through the same code. Before the actions, each
    request's final observations get their values and a recurrent policy's rows their start
    states; after them, the states of requests that advance move on."""

    def __init__(self, policies: PolicySet, request: Message, reply: Message, capacity: int, state_size: int = 0):
        """Room for `capacity` requests shaped like `request` and `reply`."""
        self.policies = policies
        self.per_request = count_rows(request["obs"])
        rows = capacity * self.per_request
        self.obs = apply(lambda leaf: np.zeros((rows, *leaf.shape[1:]), dtype=leaf.dtype), request["obs"])
        self.mask = (np.zeros((rows, *request["action_mask"].shape[1:]), dtype=np.uint8)
                     if "action_mask" in request.arrays else None)  # envs that give action masks
        self.policy = (np.zeros(rows, dtype=np.int16)
                       if "policy" in request.arrays else None)  # the policy of each row (several policies)
        self.state = np.zeros((rows, state_size), np.float32) if state_size else None
        self.out = {name: np.zeros((rows, *reply[name].shape[1:]), dtype=reply[name].dtype)
                    for name in policies.outputs}

    def answer(self, items: list[tuple[Message, Message, np.ndarray | None]]) -> None:
        """Fill the reply of each (request, reply, the request's hidden states or None). One
        request is its own batch: its arrays are acted on in place, with no gather or scatter
        (a copy per step cost an inline policy 4% of its frames in bench/sampling.py)."""
        for request, reply, states in items:
            final_values(self.policies, request, reply, states)
            if states is not None:
                begin_states(request, reply, states)
        if len(items) == 1:
            request, reply, states = items[0]
            obs, mask, policy = request["obs"], request.arrays.get("action_mask"), request.arrays.get("policy")
            state = None if states is None else states if advances(request) else states.copy()
            out = {name: reply[name] for name in self.policies.outputs}
        else:
            obs, mask, policy, state, out = self._gather(items)
        self.policies.act(obs, out, mask, policy, state)
        if len(items) > 1:
            self._scatter(items)
        for _, reply, _ in items:
            reply.set(version=self.policies.version, flags=0)

    def _gather(self, items: list) -> tuple:
        """The requests' rows, in order, in the batch arrays: (obs, mask, policy, state, outputs)."""
        n = len(items) * self.per_request
        for k, (request, _, states) in enumerate(items):
            rows = slice(k * self.per_request, (k + 1) * self.per_request)
            assign(self.obs, request["obs"], rows)
            if self.mask is not None:
                self.mask[rows] = request["action_mask"]
            if self.policy is not None:
                self.policy[rows] = request["policy"]
            if states is not None:
                self.state[rows] = states
        return (take(self.obs, slice(0, n)), None if self.mask is None else self.mask[:n],
                None if self.policy is None else self.policy[:n], None if self.state is None else self.state[:n],
                {name: out[:n] for name, out in self.out.items()})

    def _scatter(self, items: list) -> None:
        """Each request's rows of the outputs into its reply; the states of those that advance."""
        for k, (request, reply, states) in enumerate(items):
            rows = slice(k * self.per_request, (k + 1) * self.per_request)
            for name, out in self.out.items():
                reply[name][...] = out[rows]
            if states is not None and advances(request):
                states[...] = self.state[rows]


def final_values(policies: PolicySet, request: Message, reply: Message, states: np.ndarray | None) -> None:
    """Before the actions: the values of the request's final observations (episodes truncated in
    the last step), a recurrent policy's from the state each of those episodes ended in."""
    n_final = request.get("n_final")
    if n_final:  # most requests carry none: skip the forward call and its inference-mode switch
        final_policy = request.arrays.get("final_policy")
        policies.value(take(request["final_obs"], slice(0, n_final)), reply["final_values"][:n_final],
                       None if final_policy is None else final_policy[:n_final],
                       None if states is None else states[request["final_rows"][:n_final]])


def begin_states(request: Message, reply: Message, states: np.ndarray) -> None:
    """A recurrent policy's states before a request's actions: rows whose episode starts are
    zeroed, and the reply carries the states the actions are taken from (the actor keeps those
    that start its fragment)."""
    states[request["starts"].astype(bool)] = 0.0
    reply["state"][...] = states


def advances(request: Message) -> bool:
    """Whether a recurrent policy's states move on with this request's actions: not when it wants
    values only (sync mode's bootstrap: the same observations come again as the next step)."""
    return not request.get("flags") & VALUES_ONLY


def holder_states(policies: PolicySet, channels: int, rows: int) -> np.ndarray | None:
    """The hidden states a holder of a recurrent policy keeps: [channels, rows, state_size], zero at
    first (every row starts an episode); None for a feed-forward policy."""
    size = state_size(policies)
    return np.zeros((channels, rows, size), dtype=np.float32) if size else None


def state_size(policies: PolicySet) -> int:
    """A recurrent policy's hidden state width (0: feed-forward)."""
    return policies.runners[0].model.state_size


# Async mode: poll passes between looks for new weights. A version comes every few milliseconds and a
# pass takes microseconds, while each look is an MPI test, and under oversubscription Open MPI
# yields the core in every test that finds nothing (in bench/sampling.py's remote layout a third
# of the server's samples sat in that test). Sync mode looks on every pass: requests wait for it.
WEIGHTS_POLL_EVERY = 8


class InferenceRole:
    """Serves several env ranks; every forward pass covers all requests that are ready."""

    name = "inference"

    def __init__(self, rank: int, policies: PolicySet, server: RequestServer, control, sync: bool = True):
        self.rank = rank
        self.sync = sync
        self.policies, self.server = policies, server
        self.control = control
        self.pending: list[int] = []
        self.passes = 0
        self.stopping = False
        self.stopped_envs: set[int] = set()
        self.done = False
        self.status = "waiting for the first weights"
        # a recurrent policy's hidden states: every served row's
        self.states = holder_states(policies, len(server.requests), count_rows(server.requests[0]["obs"]))
        self.batch = RequestBatch(policies, server.requests[0], server.replies[0], len(server.requests),
                                  state_size(policies))

    @classmethod
    def build(cls, w) -> "InferenceRole":
        """From the wiring (hpcrl.launch.wiring.Wiring): a request channel per (actor, env group)
        it serves, its parameter-stream subscription and its policy."""
        clients = [(env, g) for env in w.layout.envs_of_inference(w.rank) for g in range(w.groups)]
        policies = build_policies(w, w.cfg.roles.inference.device, "inference", w.layout.index_in("inference", w.rank))
        return cls(w.rank, policies, w.inference.server(clients), w.control, sync=w.cfg.algo.mode == "sync")

    def poll(self) -> int:
        self.passes += 1
        work = self._poll_weights() if self.sync or self.passes % WEIGHTS_POLL_EVERY == 0 else 0
        ready = self.server.ready()
        self.pending.extend(ready)
        work += len(ready)
        if self.control.stopped and not self.stopping:
            self.stopping = True
            self.status = "stopping: telling env ranks"
        if self.stopping:
            return work + self._stop_pending()
        serve = []
        for i in self.pending:
            wanted = self.server.requests[i].get("version")
            if self.sync and wanted < self.policies.version:
                raise RuntimeError(f"inference rank {self.rank}: env rank {self.server.env_ranks[i]} asked for "
                                   f"policy version {wanted}, older than the current {self.policies.version} (sync mode)")
            if can_answer(self.policies.version, wanted, self.sync):
                serve.append(i)
        if serve:
            self._serve(serve)
            if len(serve) == len(self.pending):
                self.pending = []
            else:  # sync mode: some ask for a version still on its way
                served = set(serve)
                self.pending = [i for i in self.pending if i not in served]
            work += 1
        return work

    def _poll_weights(self) -> int:
        taken = self.policies.poll_weights()
        if taken:
            self.status = f"serving policy version {self.policies.version}"
        return taken

    def _serve(self, serve: list[int]) -> None:
        states = self.states
        self.batch.answer([(self.server.requests[i], self.server.reply_buffer(i), None if states is None else states[i])
                           for i in serve])
        for i in serve:
            self.server.reply(i)
            self.server.rearm(i)
        CLOCK.mark("first_batch")

    def _stop_pending(self) -> int:
        """After the stop word: answer each env group's next request with STOP; close once every
        group has had it and the parameter stream has closed (END)."""
        work = 0
        for i in self.pending:
            self.server.reply_buffer(i).set(flags=STOP)
            self.server.reply(i)
            self.stopped_envs.add(i)
            work += 1
        self.pending = []
        if len(self.stopped_envs) < len(self.server.env_ranks):
            return work
        if not self.policies.finished():
            self.status = "stopping: waiting for the parameter streams' last versions"
            return work
        self.server.close(armed=[])
        self.policies.close()
        self.done = True
        self.status = "finished"
        return work + 1
