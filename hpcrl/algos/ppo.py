"""PPO: the clipped-objective loss, the minibatch-epoch update, and the trainer step that turns a
batch of fragments into an update (one place for each). Sync mode is PPO with GAE; async mode is
APPO, with V-trace targets and advantages against the current policy."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import nn

from hpcrl.algos.gae import OwnSteps, successor_values
from hpcrl.algos.kernels import gae, vtrace
from hpcrl.core.moments import ReturnScaler
from hpcrl.core.config import AlgoConfig, Config
from hpcrl.core.observations import apply, combine, take

LOSS_KEYS = ("loss_policy", "loss_value", "entropy", "approx_kl", "clip_frac")


@dataclass
class Batch:
    """Flat [B, ...] tensors for one learner's update. Multi-agent: `active` (float 0/1) marks the
    rows whose agent acted, and rows come in whole envs of `rows_together` (the agents per env), which
    minibatches keep together for the centralised critic."""

    obs: torch.Tensor  # or, for Dict and Tuple observations, a dict of leaf tensors
    actions: torch.Tensor
    logp: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    active: torch.Tensor | None = None
    action_mask: torch.Tensor | None = None  # bool [B, actions]: the valid actions each row was sampled under
    rows_together: int = 1
    # A recurrent policy: rows are [seq_len, columns] in time-major order (row t*C + c is step t of
    # column c, one env's fragment), `state0` [C, S] each column's state before step 0, `starts`
    # [B] 1 where the state is zeroed before the row's step (an episode began after step t-1).
    state0: torch.Tensor | None = None
    starts: torch.Tensor | None = None
    seq_len: int = 1

    def __len__(self) -> int:
        return len(self.actions)

    def take(self, idx: torch.Tensor) -> "Batch":
        """The rows `idx` (for sequences: `minibatches`' whole columns, whose first block of
        indices, step 0's, are the column numbers)."""
        # index_select, not x[idx]: the same rows, without advanced indexing's argument parsing
        # (5x the copy's time at 256 rows); the index moves to the batch's device once, not per field
        idx = idx.to(self.actions.device)
        columns = idx[:len(idx) // self.seq_len]

        def part(name: str):
            value = getattr(self, name)
            if name == "state0" and value is not None:
                return value.index_select(0, columns)
            return apply(lambda x: x.index_select(0, idx), value) if isinstance(value, (torch.Tensor, dict)) else value
        return Batch(*(part(f) for f in self.__dataclass_fields__))

    def minibatches(self, rng: np.random.Generator, count: int) -> list[torch.Tensor]:
        """`count` random index sets covering the batch once, whole envs at a time (sequences:
        whole columns, every step of each in time-major order)."""
        k = self.rows_together
        if self.state0 is not None:  # the columns of whole envs (a central critic reads every agent's)
            columns = len(self) // self.seq_len
            envs = torch.from_numpy(rng.permutation(columns // k))
            return [(torch.arange(self.seq_len)[:, None] * columns + (part[:, None] * k + torch.arange(k)).reshape(-1))
                    .reshape(-1) for part in torch.tensor_split(envs, count)]
        envs = torch.from_numpy(rng.permutation(len(self) // k))
        rows = envs if k == 1 else (envs[:, None] * k + torch.arange(k)).reshape(-1)
        per, extra = divmod(len(envs), count)  # torch.tensor_split's parts of the envs, in rows
        return list(rows.split([(per + (i < extra)) * k for i in range(count)]))

    def sequences(self) -> dict:
        """What a recurrent policy's `evaluate` needs besides the rows (nothing for a feed-forward one)."""
        return {} if self.state0 is None else {"state0": self.state0, "starts": self.starts}


def _mean(x: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """The mean over the active rows (all rows without a mask)."""
    return x.mean() if weights is None else (x * weights).sum() / weights.sum().clamp_min(1.0)


def ppo_loss(model: nn.Module, mb: Batch, cfg: AlgoConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate + value loss - entropy bonus, over the active rows; returns the loss and
    detached statistics. Values and returns enter the value loss in the critic's own units
    (normalised under algo.value_norm)."""
    new_logp, entropy, new_values = model.evaluate(mb.obs, mb.actions, mb.action_mask, **mb.sequences())
    w = mb.active
    log_ratio = new_logp - mb.logp
    ratio = log_ratio.exp()
    adv = mb.advantages
    if cfg.norm_adv and len(adv) > 1:
        if w is None:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        else:  # mean and std over the active rows
            mean = _mean(adv, w)
            adv = (adv - mean) / (_mean((adv - mean) ** 2, w).sqrt() + 1e-8)
    neg_adv = -adv
    pg_loss = _mean(torch.max(neg_adv * ratio, neg_adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)), w)
    old_values, returns = model.raw_of(mb.values), model.raw_of(mb.returns)
    if cfg.clip_vloss:
        clipped = old_values + (new_values - old_values).clamp(-cfg.clip_coef, cfg.clip_coef)
        v_loss = 0.5 * _mean(torch.max((new_values - returns) ** 2, (clipped - returns) ** 2), w)
    else:
        v_loss = 0.5 * _mean((new_values - returns) ** 2, w)
    ent = _mean(entropy, w)
    loss = pg_loss + cfg.vf_coef * v_loss
    if cfg.ent_coef:  # else the term is exactly 0 (entropies are finite) and backward need not walk its graph
        loss = loss - cfg.ent_coef * ent
    with torch.no_grad():
        ratio_1 = ratio - 1
        stats = {"loss_policy": pg_loss.detach(), "loss_value": v_loss.detach(), "entropy": ent.detach(),
                 # k3 estimator of KL(old || new), low variance (Schulman's note on KL approximation)
                 "approx_kl": _mean(ratio_1 - log_ratio, w),
                 "clip_frac": _mean((ratio_1.abs() > cfg.clip_coef).float(), w)}
    return loss, stats


@torch.no_grad()
def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> None:
    """torch.nn.utils.clip_grad_norm_ (2-norm, foreach) on the gradients of `params`, in its own
    arithmetic, so the same numbers: without its grouping by device and dtype and its argument
    handling, which at the CartPole MLP's 12 small tensors cost more than the norm itself. One
    device and dtype, as every model here has."""
    grads = [p.grad for p in params if p.grad is not None]
    if grads:
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
        torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))


def ppo_update(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, cfg: AlgoConfig,
               rng: np.random.Generator, average_gradients: Callable[[], None] = lambda: None,
               apply_step: Callable[[], None] | None = None, loss_scale: float = 1.0) -> dict[str, float]:
    """`epochs` passes of `num_minibatches` minibatches. `average_gradients` runs between backward
    and clipping (Horovod's synchronize), so the norm is clipped on the averaged gradient.
    `loss_scale` weights this learner's gradient by its share of the global batch, so that an
    equal-weight average over learners with unequal batches is still the mean over all samples."""
    apply_step = apply_step or optimizer.step
    params = list(model.parameters())  # once per update: walking the modules costs as much as the clip
    totals = {k: 0.0 for k in LOSS_KEYS}
    steps = 0
    for _ in range(cfg.epochs):
        for idx in batch.minibatches(rng, cfg.num_minibatches):
            loss, stats = ppo_loss(model, batch.take(idx), cfg)
            optimizer.zero_grad()
            (loss if loss_scale == 1.0 else loss * loss_scale).backward()  # x1.0: the same gradient
            average_gradients()
            clip_grad_norm(params, cfg.max_grad_norm)
            apply_step()
            for k in LOSS_KEYS:
                totals[k] += float(stats[k])
            steps += 1
    return {k: v / steps for k, v in totals.items()}


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, cfg: AlgoConfig,
               rng: np.random.Generator, reduce_moments: Callable[[np.ndarray], np.ndarray] = lambda m: m,
               **update_kwargs) -> dict[str, float]:
    """One PPO/APPO trainer step: the value normaliser folds in the batch's returns (algo.value_norm,
    MAPPO's order: the targets are normalised by statistics that include them), the update (unless
    algo.train is false), then the observation normaliser folds in the batch. In that order the
    update trains with the observation statistics the batch was collected with, so in sync mode the
    first minibatch's ratios are exactly 1. `reduce_moments` sums the normalisers' moments over all
    learners (an allreduce). Inactive agents' rows count in neither."""
    active = batch.active.bool() if batch.active is not None else slice(None)
    if cfg.train:
        model.update_value_norm(batch.returns[active], reduce=reduce_moments)
    losses = ppo_update(model, optimizer, batch, cfg, rng, **update_kwargs) if cfg.train \
        else dict.fromkeys(LOSS_KEYS, 0.0)
    model.update_obs_norm(take(batch.obs, active), reduce=reduce_moments)
    return losses


class PPOStep:
    """The trainer step of PPO (sync) and APPO (async), read top to bottom: the fragments side by
    side as [T, K*N] arrays -> advantages and value targets (GAE; or V-trace with the current
    critic and policy) -> `train_step`. The trainer worker owns the model, the optimizer and the
    communication; it passes the hooks that average gradients and sum moments over trainers."""

    metric_keys = LOSS_KEYS
    progress = "pg {loss_policy:+.3f} v {loss_value:.3f} ent {entropy:.3f} kl {approx_kl:.4f}"  # the progress line's

    def __init__(self, cfg: Config, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
                 rng: np.random.Generator, obs_dtype: str, action_dtype: str):
        self.cfg, self.model, self.optimizer, self.device, self.rng = cfg, model, optimizer, device, rng
        self.sync = cfg.algo.mode == "sync"
        self.rewards = ReturnScaler() if cfg.env.normalize_reward else None
        # actions as the env takes them (int64 or float32); uint8 frames stay bytes (the model scales them)
        self.dtypes = {"actions": getattr(torch, action_dtype),
                       "obs": torch.uint8 if obs_dtype == "uint8" else torch.float32, "action_mask": torch.bool}


    def __call__(self, fragments: list, reduce_moments: Callable[[np.ndarray], np.ndarray] = lambda m: m,
                 algo: AlgoConfig | None = None, **update_kwargs) -> dict[str, float]:
        """One update on `fragments` (Messages of fragment_spec). `reduce_moments` sums statistics
        over trainers (reward and observation normalisers); `algo` is the algo section in effect
        (algo.schedule's steps applied; default the config's); `update_kwargs` go to train_step
        (average_gradients, apply_step, loss_scale)."""
        algo = algo or self.cfg.algo
        losses = train_step(self.model, self.optimizer, self.assemble(fragments, reduce_moments, algo), algo,
                            self.rng, reduce_moments=reduce_moments, **update_kwargs)
        if self.rewards is not None:  # the std rewards are divided by (metrics: reward_return_std)
            losses["reward_return_std"] = float(np.sqrt(self.rewards.var + self.rewards.EPS))
        return losses

    def state(self) -> dict:
        """What a resume needs besides the model and optimizer: the reward scale's statistics."""
        return self.rewards.state() if self.rewards is not None else {}

    def restore(self, state: dict) -> None:
        if self.rewards is not None:
            self.rewards.restore(state)

    def assemble(self, fragments: list, reduce_moments: Callable[[np.ndarray], np.ndarray] = lambda m: m,
                 algo: AlgoConfig | None = None) -> Batch:
        """The fragments as one Batch, advantages and value targets estimated with the discount and
        lambda of `algo`, the algo section in effect (default the config's)."""
        algo = algo or self.cfg.algo

        def cat(key: str, axis: int = 1):  # an array, or a dict of them (Dict observations)
            return combine(lambda parts: np.concatenate(parts, axis=axis), [f[key] for f in fragments])

        obs, actions, behaviour_logp = cat("obs"), cat("actions"), cat("logp")
        mask = cat("action_mask").astype(bool) if "action_mask" in fragments[0].arrays else None
        rewards, dones = cat("rewards"), cat("dones")
        if self.rewards is not None:  # env.normalize_reward: statistics of every env rank's returns
            self.rewards.fold([f["return_moments"] for f in fragments], reduce_moments)
            rewards = self.rewards.scale(rewards)
        active = cat("active").astype(bool) if "active" in fragments[0].arrays else None
        # a recurrent policy replays each column from the state it started in, zeroed where its
        # holder zeroed it (an episode began: after a done, or where an env restarted)
        state0 = cat("init_state", 0) if "init_state" in fragments[0].arrays else None
        starts = cat("starts") if state0 is not None else None
        # PettingZoo envs whose agents sit out steps: advantages over each agent's own steps
        own = OwnSteps(active) if active is not None and not active.all() else None
        if self.sync:
            values, last_values, log_rhos = cat("values"), cat("last_values", 0), None
        else:
            # Truncated episodes bootstrap from the behaviour policy's V(final obs), the only
            # value the env rank could ask for then; everything else uses the current critic.
            values, last_values, logp_now = self._evaluate_now(obs, actions, cat("last_obs", 0), mask,
                                                               state0, starts, dones)
            log_rhos = logp_now - behaviour_logp
        trunc_values = cat("trunc_values")
        if own is None:
            advantages, returns = self._estimate(algo, rewards, values, successor_values(values, last_values, dones,
                                                                                         trunc_values), dones, log_rhos)
        else:
            rc, vc, nxt, dc = own.compact(rewards, values, last_values, dones, trunc_values)
            adv_c, ret_c = self._estimate(algo, rc, vc, nxt, dc, None if log_rhos is None else own.gather(log_rhos))
            advantages, returns = own.scatter(adv_c, np.zeros_like(values)), own.scatter(ret_c, values)
        parts = {"obs": obs, "actions": actions, "logp": behaviour_logp, "values": values,
                 "advantages": advantages, "returns": returns}
        if active is not None:  # PettingZoo envs: inactive agents' rows are masked out
            parts["active"] = active.astype(np.uint8)
        if mask is not None:
            parts["action_mask"] = mask
        if starts is not None:
            parts["starts"] = starts
        sequences = {} if state0 is None else {"state0": torch.as_tensor(state0, device=self.device),
                                               "seq_len": actions.shape[0]}
        return Batch(**{k: self._rows(k, v) for k, v in parts.items()},
                     rows_together=self.model.num_agents, **sequences)  # whole envs of agent rows

    def _rows(self, key: str, value):
        """[T, B, ...] numpy -> [T*B, ...] tensors on the device (Dict observations: per leaf, in
        their own dtypes; the model casts them)."""
        if isinstance(value, dict):
            return {k: torch.as_tensor(v.reshape(-1, *v.shape[2:]), device=self.device) for k, v in value.items()}
        return torch.as_tensor(value.reshape(-1, *value.shape[2:]), device=self.device,
                               dtype=self.dtypes.get(key, torch.float32))

    def _estimate(self, a: AlgoConfig, rewards, values, next_values, dones, log_rhos) -> tuple[np.ndarray, np.ndarray]:
        """Advantages and value targets: GAE (sync), or V-trace with these log-ratios (async), with
        the discount and lambda of `a`, the algo section in effect."""
        if log_rhos is None:
            return gae(rewards, values, next_values, dones, a.gamma, a.gae_lambda)
        returns, advantages = vtrace(log_rhos, rewards, values, next_values, dones, a.gamma, a.vtrace_rho_bar,
                                     a.vtrace_c_bar, a.gae_lambda)
        return advantages, returns

    @torch.no_grad()
    def _evaluate_now(self, obs: np.ndarray, actions: np.ndarray, last_obs: np.ndarray, mask: np.ndarray | None,
                      state0: np.ndarray | None = None, starts: np.ndarray | None = None,
                      dones: np.ndarray | None = None):
        """Async: V(s_t), V(s_T) and log pi(a_t|s_t) under the weights about to be trained (a
        recurrent policy's over each column as a sequence from `state0`, and V(s_T) from the state
        after step T-1, zeroed where that step ended an episode)."""
        T, B = actions.shape[:2]
        as_tensor = lambda x, **kw: torch.as_tensor(x, device=self.device, **kw)  # noqa: E731
        rows = (self._rows("obs", obs), as_tensor(actions.reshape(T * B, *actions.shape[2:])),
                None if mask is None else as_tensor(mask.reshape(T * B, -1)))
        last_obs = (apply(as_tensor, last_obs) if isinstance(last_obs, dict)
                    else as_tensor(last_obs, dtype=self.dtypes["obs"]))
        if state0 is None:
            logp, _, raw = self.model.evaluate(*rows)
            last = self.model.value(last_obs)
        else:
            logp, _, raw, state = self.model.evaluate_sequence(*rows, as_tensor(state0), as_tensor(starts.reshape(-1)))
            last = self.model.value(last_obs, state * (1.0 - as_tensor(dones[-1], dtype=torch.float32))[:, None])
        values = self.model.returns_of(raw)
        return values.cpu().numpy().reshape(T, B), last.cpu().numpy(), logp.cpu().numpy().reshape(T, B)
