"""Inference rank (policy server) and inline inference: the policy holders of a run. Both hold
their policies through workers/policy_holder.py (a PolicySet: the algorithm's runner per policy,
models:PolicyRunner for PPO, models.q:QRunner for DQN) on fresh weights, answer requests through
its RequestBatch, and fill the reply fields the runners name; this module adds the transport.

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

from hpcrl.core.messages import STOP, Message
from hpcrl.core.observations import count_rows
from hpcrl.core.seeds import seed_for
from hpcrl.core.startup import CLOCK
from hpcrl.models import Runner
from hpcrl.runtime.comm import LocalWeightSubscriber, RequestServer
from hpcrl.workers.policy_holder import PolicySet, RequestBatch, holder_states, state_size
from hpcrl.workers.selfplay import LeaguePool, Pool


def build_policies(w, device: str, purpose: str, index: int) -> PolicySet:
    """A policy holder's runners (one per policy, each from its own spaces) and its parameter-stream
    ends: inference rank number `index`, or the inline policy of env rank `index`."""
    weights = [LocalWeightSubscriber(w.params[0])] if w.layout.serial else w.params
    runners = [build_runner(w.cfg, spaces, device, purpose, index, policy=p) for p, spaces in enumerate(w.policy_spaces)]
    s = w.cfg.algo.selfplay
    pool_runners = [build_runner(w.cfg, w.policy_spaces[0], device, purpose, index, policy=len(runners) + k)
                    for k in range(s.pool)]
    # a league member's slots are filled by the population root; else the holder snapshots its own
    pool = (LeaguePool(pool_runners) if w.league else Pool(pool_runners, s.snapshot_every)) if s.pool else None
    return PolicySet(runners, weights, pool)


class InlinePolicy:
    """The policy inside an env rank (`inference: {ranks: 0}`, and serial mode): same calls as
    RemotePolicy, answered in-process once this rank holds the requested version."""

    def __init__(self, policies: PolicySet, request: Message, reply: Message, sync: bool = True, control=None,
                 block: int | None = None):
        """`control`: the rank's control stream (None: only the weights' END stops it, as in tests
        that drive an actor alone). `block`: rows per forward pass (forward_block)."""
        self.policies = policies
        self.sync = sync
        self.control = control
        self.request, self.reply = request, reply
        states = holder_states(policies, 1, count_rows(request["obs"]))
        self.states = None if states is None else states[0]  # a recurrent policy's, of this rank's env rows
        self.batch = RequestBatch(policies, request, reply, 1, state_size(policies), block=block)
        self.stopped = False
        self._wanted: int | None = None

    def submit(self, version: int, n_final: int, flags: int = 0) -> None:
        self.request.set(version=version, n_final=n_final, flags=flags)
        self._wanted = version

    @classmethod
    def build(cls, w, index: int) -> "InlinePolicy":
        """The policy of env rank number `index` (inference: {ranks: 0}, and serial mode)."""
        spec = w.inference
        request = spec.request.allocate()
        return cls(build_policies(w, w.cfg.roles.env.device, "inline_policy", index), request,
                   spec.reply.allocate(), sync=w.cfg.algo.mode == "sync", control=w.control,
                   block=forward_block(w, request))

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

    def row_state(self) -> dict:
        """What it keeps per env row, as live arrays (a recurrent policy's hidden states), for an env
        rank's state split env by env (workers/env_deal.py); its generator draws nothing in a run
        whose draws are keyed (run.deterministic)."""
        return {} if self.states is None else {"hidden": self.states}

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
    # action sampling: keyed by (policy, env row, step), the same on every holder of every layout; the
    # generator (per rank) serves only calls without keys
    return make_runner(build_policy(spaces, cfg), device, seed=seed_for(cfg.run.seed, purpose, index, group=policy),
                       draw_key=seed_for(cfg.run.seed, "action", 0, group=policy))


def forward_block(w, request: Message) -> int | None:
    """Rows per forward pass of a holder of `request`-shaped requests: run.inference_block envs, or
    a whole request, each request alone (run.deterministic); None: every ready request in one pass."""
    run = w.cfg.run
    if not run.deterministic:
        return None
    return count_rows(request["obs"]) if run.inference_block is None else run.inference_block * w.spaces.num_agents


def can_answer(have: int, wanted: int, sync: bool) -> bool:
    """Sync: exactly the requested version; async: the requested one or newer."""
    return have == wanted or (not sync and have > wanted)


# Async mode: poll passes between looks for new weights. A version comes every few milliseconds and a
# pass takes microseconds, while each look is an MPI test, and under oversubscription Open MPI
# yields the core in every test that finds nothing (in bench/sampling.py's remote layout a third
# of the server's samples sat in that test). Sync mode looks on every pass: requests wait for it.
WEIGHTS_POLL_EVERY = 8


class InferenceRole:
    """Serves several env ranks; every forward pass covers all requests that are ready."""

    name = "inference"

    def __init__(self, rank: int, policies: PolicySet, server: RequestServer, control, sync: bool = True,
                 block: int | None = None):
        """`block`: rows per forward pass (forward_block)."""
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
                                  state_size(policies), block=block)

    @classmethod
    def build(cls, w) -> "InferenceRole":
        """From the wiring (hpcrl.launch.wiring.Wiring): a request channel per (actor, env group)
        it serves, its parameter-stream subscription and its policy."""
        clients = [(env, g) for env in w.layout.envs_of_inference(w.rank) for g in range(w.groups)]
        policies = build_policies(w, w.cfg.roles.inference.device, "inference", w.layout.index_in("inference", w.rank))
        server = w.inference.server(clients)
        return cls(w.rank, policies, server, w.control, sync=w.cfg.algo.mode == "sync",
                   block=forward_block(w, server.requests[0]))

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
