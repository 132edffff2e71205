#!/usr/bin/env python3
"""verl_parity.py: random-input parity cases from verl v0.5.0's OWN Python (pinned), for
tests/workers/algos/verl_parity_test.cpp.

For each seed it draws fresh random inputs (float64 tensors, masks with random valid lengths,
shuffled group uids, ...) and records what verl returns for
  * every advantage estimator of verl.trainer.ppo.core_algos (called directly, and again through
    get_adv_estimator_fn as ray_trainer.compute_advantage calls it),
  * every kl_penalty mode (kl/k1, abs, mse/k2, low_var_kl/k3; "full" raises), compute_rewards and
    the KL controllers,
  * compute_policy_loss (the actor's "vanilla": clip-higher and dual-clip), every registered policy
    loss (gpg, clip_cov, kl_cov), compute_value_loss, compute_entropy_loss, agg_loss in its four
    modes, and the verl_F helpers they use (masked_mean/var/whiten, entropy/logprobs from logits),
  * DataProto op sequences (chunk+concat, concat, union, repeat(interleave), pad_dataproto_to_divisor
    + unpad_dataproto, reorder, make_iterator with and without shuffle) on random DataProtos with
    tensor and non-tensor (numpy object) columns; a "row_id" tensor tracks where each row came from.

Cases use the flat layout of ../shared/golden/core_algos.json: {"fn", "seed", <verl's argument
names>..., <output names>...}, so the C++ side can reuse the golden handlers.

Usage: verl_parity.py --out FILE [--first-seed 1000] [--num-seeds 20]

Dependencies: torch, numpy, pandas, verl==0.5.0 (installed --no-deps), tensordict==0.9.1 (verl 0.5.0
pins tensordict<=0.9.1; --no-deps keeps pip from replacing torch), its imports pyvers and
cloudpickle, omegaconf (verl.utils.config imports it) and transformers (verl.utils.torch_functional
imports PreTrainedTokenizer). One module is STUBBED, see _install_stubs.
"""

import argparse
import copy
import json
import math
import sys
import types

VERL_VERSION = "0.5.0"


def _install_stubs():
    """Stub `ray` before verl is imported.

    verl/protocol.py does `import ray` only for DataProtoFuture (ray.ObjectRef in a dataclass
    annotation, ray.get in DataProtoFuture.get). Nothing exercised here touches DataProtoFuture, and
    core_algos does not use ray at all; the stub raises if anything ever calls into it. Ray itself
    is a ~70 MB wheel with a server runtime, far more than a CPU parity check needs.
    """
    if "ray" in sys.modules:
        return []
    ray = types.ModuleType("ray")

    class ObjectRef:  # only used as a type annotation
        pass

    def _unavailable(*args, **kwargs):
        raise RuntimeError("ray is stubbed in verl_parity.py; DataProtoFuture is not exercised")

    ray.ObjectRef = ObjectRef
    ray.get = _unavailable
    ray.put = _unavailable
    ray.remote = _unavailable
    sys.modules["ray"] = ray
    return ["ray"]


STUBS = _install_stubs()

import numpy as np  # noqa: E402
import tensordict  # noqa: E402
import torch  # noqa: E402

import verl  # noqa: E402
import verl.utils.torch_functional as verl_F  # noqa: E402
from verl.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402

AGG_MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KL_MODES = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"]


# ---- JSON helpers ---------------------------------------------------------------------------------
def tj(t):
    """Tensor (or number) -> nested lists of Python floats (0-dim -> a number)."""
    if isinstance(t, torch.Tensor):
        return t.detach().to(torch.float64).tolist()
    return float(t)


def case(fn, seed, **fields):
    out = {"fn": fn, "seed": seed}
    for k, v in fields.items():
        if isinstance(v, torch.Tensor):
            v = tj(v)
        elif isinstance(v, np.ndarray):
            v = v.tolist()
        out[k] = v
    return out


# ---- random inputs --------------------------------------------------------------------------------
def t64(a):
    return torch.from_numpy(np.asarray(a, dtype=np.float64))


def rand_mask(rng, bs, T, holes=False):
    """Prefix response mask: row i has 1..T valid tokens; with holes, some inner tokens are 0
    (multi-turn observation tokens) but the first token always stays valid."""
    lens = rng.integers(1, T + 1, size=bs)
    m = (np.arange(T)[None, :] < lens[:, None]).astype(np.float64)
    if holes and T > 2:
        drop = (rng.random((bs, T)) < 0.2) & (np.arange(T)[None, :] > 0)
        m[drop] = 0.0
    return t64(m)


def outcome_rewards(rng, mask, binary):
    """verl's rule-based rewards: the score sits on the last valid token of each row."""
    bs, T = mask.shape
    r = np.zeros((bs, T))
    m = mask.numpy()
    for i in range(bs):
        last = int(np.nonzero(m[i])[0][-1])
        r[i, last] = float(rng.integers(0, 2)) if binary else rng.normal()
    return t64(r)


def group_index(rng, n_groups, sizes_low, sizes_high):
    """Shuffled uids (groups interleaved, not contiguous), as the trainer's repeat+reorder gives."""
    sizes = rng.integers(sizes_low, sizes_high + 1, size=n_groups)
    uids = [f"uid-{rng.integers(0, 10**6)}-{g}" for g in range(n_groups)]
    index = [uids[g] for g in range(n_groups) for _ in range(sizes[g])]
    perm = rng.permutation(len(index))
    return np.array([index[p] for p in perm], dtype=object)


# ---- core_algos cases -----------------------------------------------------------------------------
def advantage_cases(seed, rng):
    out = []
    T = int(rng.integers(1, 13))
    holes = bool(rng.random() < 0.3)
    binary = bool(rng.random() < 0.5)
    gamma = float(rng.choice([1.0, 0.99, 0.9]))
    lam = float(rng.choice([1.0, 0.95, 0.8]))

    # GAE: dense rewards and critic values.
    bs = int(rng.integers(2, 9))
    mask = rand_mask(rng, bs, T, holes)
    rewards = t64(rng.normal(size=(bs, T))) * mask
    values = t64(rng.normal(size=(bs, T)))
    adv, ret = core_algos.compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    out.append(case("compute_gae_advantage_return", seed, token_level_rewards=rewards, values=values,
                    response_mask=mask, gamma=gamma, lam=lam, advantages=adv, returns=ret))
    adv, ret = core_algos.get_adv_estimator_fn("gae")(token_level_rewards=rewards, values=values,
                                                      response_mask=mask, gamma=gamma, lam=lam)
    out.append(case("get_adv_estimator_fn", seed, adv_estimator="gae", token_level_rewards=rewards,
                    values=values, response_mask=mask, gamma=gamma, lam=lam, advantages=adv, returns=ret))

    # Grouped outcome estimators: groups of 1..4 (singletons included), shuffled uids.
    index = group_index(rng, int(rng.integers(1, 5)), 1, 4)
    if len(index) < 2:
        index = np.array(list(index) * 2, dtype=object)
    bs = len(index)
    mask = rand_mask(rng, bs, T, holes)
    rewards = outcome_rewards(rng, mask, binary)
    uids = [str(u) for u in index]
    for norm in (True, False):
        adv, ret = core_algos.compute_grpo_outcome_advantage(rewards.clone(), mask, index, epsilon=1e-6,
                                                             norm_adv_by_std_in_grpo=norm)
        out.append(case("compute_grpo_outcome_advantage", seed, token_level_rewards=rewards, response_mask=mask,
                        index=uids, epsilon=1e-6, norm_adv_by_std_in_grpo=norm, advantages=adv, returns=ret))
    for fn in ("compute_rloo_outcome_advantage", "compute_opo_outcome_advantage",
               "compute_reinforce_plus_plus_baseline_outcome_advantage", "compute_gpg_outcome_advantage"):
        adv, ret = getattr(core_algos, fn)(rewards.clone(), mask, index, epsilon=1e-6)
        out.append(case(fn, seed, token_level_rewards=rewards, response_mask=mask, index=uids, epsilon=1e-6,
                        advantages=adv, returns=ret))

    # Pass@k needs >= 2 samples per group.
    pindex = group_index(rng, int(rng.integers(1, 4)), 2, 4)
    pmask = rand_mask(rng, len(pindex), T, holes)
    prewards = outcome_rewards(rng, pmask, binary)
    puids = [str(u) for u in pindex]
    for norm in (True, False):
        cfg = AlgoConfig(norm_adv_by_std_in_grpo=norm)
        adv, ret = core_algos.compute_grpo_passk_outcome_advantage(prewards.clone(), pmask, pindex, epsilon=1e-6,
                                                                   config=cfg)
        out.append(case("compute_grpo_passk_outcome_advantage", seed, token_level_rewards=prewards,
                        response_mask=pmask, index=puids, epsilon=1e-6, norm_adv_by_std_in_grpo=norm,
                        advantages=adv, returns=ret))

    # REINFORCE++ (dense rewards, gamma) and ReMax (baselines).
    bs = int(rng.integers(2, 9))
    dmask = rand_mask(rng, bs, T, holes)
    drewards = t64(rng.normal(size=(bs, T))) * dmask
    adv, ret = core_algos.compute_reinforce_plus_plus_outcome_advantage(drewards.clone(), dmask,
                                                                        config=AlgoConfig(gamma=gamma))
    out.append(case("compute_reinforce_plus_plus_outcome_advantage", seed, token_level_rewards=drewards,
                    response_mask=dmask, gamma=gamma, advantages=adv, returns=ret))
    baselines = t64(rng.normal(size=(bs,)))
    adv, ret = core_algos.compute_remax_outcome_advantage(drewards.clone(), baselines, dmask)
    out.append(case("compute_remax_outcome_advantage", seed, token_level_rewards=drewards, reward_baselines=baselines,
                    response_mask=dmask, advantages=adv, returns=ret))

    # Through the registry, with the kwargs ray_trainer.compute_advantage passes (grpo is called
    # directly there with norm_adv_by_std_in_grpo; the registry path ignores config for grpo).
    cfg_norm = bool(rng.random() < 0.5)
    cfg = AlgoConfig(gamma=gamma, lam=lam, norm_adv_by_std_in_grpo=cfg_norm)
    for name in ("grpo", "grpo_passk", "rloo", "opo", "reinforce_plus_plus_baseline", "gpg",
                 "reinforce_plus_plus", "remax"):
        if name == "grpo_passk":
            kw = dict(token_level_rewards=prewards.clone(), response_mask=pmask, index=pindex)
        elif name in ("reinforce_plus_plus", "remax"):
            kw = dict(token_level_rewards=drewards.clone(), response_mask=dmask)
            if name == "remax":
                kw["reward_baselines"] = baselines
        else:
            kw = dict(token_level_rewards=rewards.clone(), response_mask=mask, index=index)
        if name == "grpo":
            kw["norm_adv_by_std_in_grpo"] = cfg_norm
        adv, ret = core_algos.get_adv_estimator_fn(name)(config=cfg, **kw)
        fields = {k: (list(map(str, v)) if k == "index" else v) for k, v in kw.items() if k != "norm_adv_by_std_in_grpo"}
        fields["token_level_rewards"] = (prewards if name == "grpo_passk"
                                         else drewards if name in ("reinforce_plus_plus", "remax") else rewards)
        out.append(case("get_adv_estimator_fn", seed, adv_estimator=name, gamma=gamma, lam=lam,
                        norm_adv_by_std_in_grpo=cfg_norm, advantages=adv, returns=ret, **fields))
    return out


def policy_inputs(rng, bs, T, spread):
    mask = rand_mask(rng, bs, T, holes=bool(rng.random() < 0.3))
    old = t64(-np.abs(rng.normal(scale=1.5, size=(bs, T))))
    logp = old + t64(rng.normal(scale=spread, size=(bs, T)))
    adv = t64(rng.normal(scale=float(rng.choice([0.5, 1.0, 2.0])), size=(bs, T)))
    return old, logp, adv, mask


def loss_cases(seed, rng):
    out = []
    bs, T = int(rng.integers(1, 7)), int(rng.integers(1, 13))
    spread = float(rng.choice([0.1, 0.4, 1.5]))  # 1.5 reaches the dual clip (ratio > c) often

    # Vanilla PPO (compute_policy_loss; the actor's loss_mode "vanilla"), each agg mode.
    for mode in AGG_MODES:
        old, logp, adv, mask = policy_inputs(rng, bs, T, spread)
        clip = float(rng.choice([0.1, 0.2, 0.3]))
        low = None if rng.random() < 0.5 else float(rng.choice([0.1, 0.2]))
        high = None if rng.random() < 0.5 else float(rng.choice([0.2, 0.28, 0.4]))
        c = float(rng.choice([3.0, 1.5, 10.0]))
        res = core_algos.compute_policy_loss(old, logp, adv, mask, cliprange=clip, cliprange_low=low,
                                             cliprange_high=high, clip_ratio_c=c, loss_agg_mode=mode)
        fields = dict(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask, cliprange=clip,
                      clip_ratio_c=c, loss_agg_mode=mode)
        if low is not None:
            fields["cliprange_low"] = low
        if high is not None:
            fields["cliprange_high"] = high
        out.append(case("compute_policy_loss", seed, **fields, pg_loss=res[0], pg_clipfrac=res[1], ppo_kl=res[2],
                        pg_clipfrac_lower=res[3]))

        # GPG policy loss.
        res = core_algos.get_policy_loss_fn("gpg")(old, logp, adv, mask, loss_agg_mode=mode, config=None)
        out.append(case("compute_policy_loss_gpg", seed, old_log_prob=old, log_prob=logp, advantages=adv,
                        response_mask=mask, loss_agg_mode=mode, pg_loss=res[0], pg_clipfrac=res[1], ppo_kl=res[2],
                        pg_clipfrac_lower=res[3]))

        # Clip-Cov. Its token choice is random (torch.randperm on the global CPU generator):
        # "all" takes clip_cov_ratio=1 so every candidate is chosen (order-free); "seeded" takes a
        # small ratio after torch.manual_seed(torch_seed), which LibTorch reproduces with the same seed.
        for variant in ("all", "seeded"):
            old, logp, adv, mask = policy_inputs(rng, bs, T, spread)
            ratio = 1.0 if variant == "all" else float(rng.choice([0.1, 0.3]))
            lb = float(rng.choice([-0.5, 0.0, 0.2, 1.0]))
            ub = float(rng.choice([1.0, 2.0, 5.0]))
            if ub <= lb:
                ub = lb + 1.0
            cfg = types.SimpleNamespace(
                clip_ratio=float(rng.choice([0.2, 0.3])), clip_ratio_low=None, clip_ratio_high=None,
                policy_loss=types.SimpleNamespace(clip_cov_ratio=ratio, clip_cov_lb=lb, clip_cov_ub=ub))
            if rng.random() < 0.5:
                cfg.clip_ratio_low, cfg.clip_ratio_high = 0.2, 0.28
            torch_seed = int(rng.integers(0, 2**31))
            torch.manual_seed(torch_seed)
            res = core_algos.get_policy_loss_fn("clip_cov")(old, logp, adv, mask, loss_agg_mode=mode, config=cfg)
            fields = dict(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask, loss_agg_mode=mode,
                          clip_ratio=cfg.clip_ratio, clip_cov_ratio=ratio, clip_cov_lb=lb, clip_cov_ub=ub,
                          variant=variant)
            if cfg.clip_ratio_low is not None:
                fields.update(clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high)
            if variant == "seeded":
                fields["torch_seed"] = torch_seed
            out.append(case("compute_policy_loss_clip_cov", seed, **fields, pg_loss=res[0], pg_clipfrac=res[1],
                            ppo_kl=res[2], pg_clipfrac_lower=res[3]))

        # KL-Cov (deterministic: top-k by covariance).
        old, logp, adv, mask = policy_inputs(rng, bs, T, spread)
        kl_ratio = float(rng.choice([0.0002, 0.1, 0.3, 0.6]))
        coef = float(rng.choice([0.1, 1.0]))
        cfg = types.SimpleNamespace(policy_loss=types.SimpleNamespace(kl_cov_ratio=kl_ratio, ppo_kl_coef=coef))
        res = core_algos.get_policy_loss_fn("kl_cov")(old, logp, adv, mask, loss_agg_mode=mode, config=cfg)
        out.append(case("compute_policy_loss_kl_cov", seed, old_log_prob=old, log_prob=logp, advantages=adv,
                        response_mask=mask, loss_agg_mode=mode, kl_cov_ratio=kl_ratio, ppo_kl_coef=coef,
                        pg_loss=res[0], pg_clipfrac=res[1], ppo_kl=res[2], pg_clipfrac_lower=res[3]))

        # Value loss.
        mask = rand_mask(rng, bs, T)
        vpreds, returns, values = (t64(rng.normal(size=(bs, T))) for _ in range(3))
        cv = float(rng.choice([0.2, 0.5, 1.0]))
        vf_loss, vf_clipfrac = core_algos.compute_value_loss(vpreds, returns, values, mask, cv, loss_agg_mode=mode)
        out.append(case("compute_value_loss", seed, vpreds=vpreds, returns=returns, values=values, response_mask=mask,
                        cliprange_value=cv, loss_agg_mode=mode, vf_loss=vf_loss, vf_clipfrac=vf_clipfrac))

        # Entropy loss.
        V = int(rng.integers(2, 17))
        logits = t64(rng.normal(scale=float(rng.choice([0.5, 3.0])), size=(bs, T, V)))
        mask = rand_mask(rng, bs, T)
        ent = core_algos.compute_entropy_loss(logits, mask, loss_agg_mode=mode)
        out.append(case("compute_entropy_loss", seed, logits=logits, response_mask=mask, loss_agg_mode=mode,
                        entropy_loss=ent))

        # agg_loss itself (every row keeps >= 1 valid token: seq-mean-token-mean is NaN otherwise).
        loss_mat = t64(rng.normal(size=(bs, T)))
        mask = rand_mask(rng, bs, T, holes=True)
        out.append(case("agg_loss", seed, loss_mat=loss_mat, loss_mask=mask, loss_agg_mode=mode,
                        loss=core_algos.agg_loss(loss_mat, mask, mode)))
    return out


def kl_cases(seed, rng):
    out = []
    bs, T = int(rng.integers(1, 7)), int(rng.integers(1, 13))
    scale = float(rng.choice([0.3, 3.0, 30.0]))  # 30 reaches low_var_kl's clamps
    logprob = t64(-np.abs(rng.normal(scale=scale, size=(bs, T))))
    ref = t64(-np.abs(rng.normal(scale=scale, size=(bs, T))))
    for mode in KL_MODES:
        out.append(case("kl_penalty", seed, logprob=logprob, ref_logprob=ref, kl_penalty=mode,
                        kl=core_algos.kl_penalty(logprob, ref, mode)))
    try:
        core_algos.kl_penalty(logprob, ref, "full")
        raise SystemExit("verl_parity.py: kl_penalty('full') did not raise in this verl")
    except NotImplementedError:
        out.append(case("kl_penalty", seed, logprob=logprob, ref_logprob=ref, kl_penalty="full",
                        raises="NotImplementedError"))

    scores = t64(rng.normal(size=(bs, T)))
    kl_ratio = float(rng.choice([0.001, 0.1, 1.0]))
    out.append(case("compute_rewards", seed, token_level_scores=scores, old_log_prob=logprob, ref_log_prob=ref,
                    kl_ratio=kl_ratio, rewards=core_algos.compute_rewards(scores, logprob, ref, kl_ratio)))

    init, target, horizon = float(rng.uniform(0.001, 0.5)), float(rng.uniform(0.01, 1.0)), int(rng.integers(1, 20000))
    ctrl = core_algos.AdaptiveKLController(init, target, horizon)
    updates = []
    for _ in range(int(rng.integers(3, 12))):
        kl, n = float(rng.uniform(0, 2 * target)), int(rng.integers(1, 4096))
        ctrl.update(kl, n)
        updates.append({"current_kl": kl, "n_steps": n, "value": float(ctrl.value)})
    out.append(case("AdaptiveKLController", seed, init_kl_coef=init, target_kl=target, horizon=horizon,
                    updates=updates))
    ctrl = core_algos.FixedKLController(init)
    updates = []
    for _ in range(3):
        kl, n = float(rng.uniform(0, 1)), int(rng.integers(1, 4096))
        ctrl.update(kl, n)
        updates.append({"current_kl": kl, "n_steps": n, "value": float(ctrl.value)})
    out.append(case("FixedKLController", seed, kl_coef=init, updates=updates))
    return out


def functional_cases(seed, rng):
    out = []
    bs, T = int(rng.integers(1, 7)), int(rng.integers(2, 13))
    values = t64(rng.normal(scale=2.0, size=(bs, T)))
    mask = rand_mask(rng, bs, T, holes=True)
    if mask.sum() < 2:
        mask[0, :2] = 1.0
    for axis in (None, 0, 1):
        out.append(case("masked_mean", seed, values=values, mask=mask, axis=axis,
                        result=verl_F.masked_mean(values, mask, axis=axis)))
        out.append(case("masked_sum", seed, values=values, mask=mask, axis=axis,
                        result=verl_F.masked_sum(values, mask, axis=axis)))
    for unbiased in (True, False):
        out.append(case("masked_var", seed, values=values, mask=mask, unbiased=unbiased,
                        result=verl_F.masked_var(values, mask, unbiased=unbiased)))
    for shift in (True, False):
        out.append(case("masked_whiten", seed, values=values, mask=mask, shift_mean=shift,
                        result=verl_F.masked_whiten(values, mask, shift_mean=shift)))
    V = int(rng.integers(2, 33))
    logits = t64(rng.normal(scale=float(rng.choice([0.5, 4.0])), size=(bs, T, V)))
    labels = torch.from_numpy(rng.integers(0, V, size=(bs, T)))
    out.append(case("entropy_from_logits", seed, logits=logits, result=verl_F.entropy_from_logits(logits)))
    out.append(case("logprobs_from_logits", seed, logits=logits, labels=labels.tolist(),
                    result=verl_F.logprobs_from_logits(logits, labels)))
    lo = t64(rng.normal(size=(bs, T)))
    hi = lo + t64(np.abs(rng.normal(size=(bs, T))))
    out.append(case("clip_by_value", seed, x=values, tensor_min=lo, tensor_max=hi,
                    result=verl_F.clip_by_value(values, lo, hi)))
    return out


# ---- DataProto sequences --------------------------------------------------------------------------
TENSOR_DTYPES = {torch.float64: "float64", torch.float32: "float32", torch.int64: "int64", torch.bool: "bool"}


def dp_json(dp):
    """A DataProto as JSON: tensors flattened with shape and dtype, columns with their type."""
    batch = {}
    if dp.batch is not None:
        for k, t in dp.batch.items():
            batch[k] = {"dtype": TENSOR_DTYPES[t.dtype], "shape": list(t.shape),
                        "data": t.reshape(-1).to(torch.float64).tolist()}
    non_tensor = {}
    for k, arr in dp.non_tensor_batch.items():
        vals = arr.tolist()
        first = vals[0] if vals else ""
        kind = ("string" if isinstance(first, str) else "int64" if isinstance(first, int)
                else "float64" if isinstance(first, float) else "json")
        non_tensor[k] = {"type": kind, "values": vals}
    return {"size": len(dp), "batch": batch, "non_tensor_batch": non_tensor, "meta_info": copy.deepcopy(dp.meta_info)}


def random_dp(rng, n, schema, row_base, meta):
    """A DataProto of n rows with the schema's keys: tensors of several dtypes and ranks, and
    string / int / float / dict object columns. row_id = row_base + arange(n)."""
    tensors = {"row_id": torch.arange(row_base, row_base + n, dtype=torch.int64)}
    for key, (kind, width) in schema["tensors"].items():
        if kind == "float64":
            tensors[key] = t64(rng.normal(size=(n, width)))
        elif kind == "float32":
            tensors[key] = torch.from_numpy(rng.normal(size=(n, width)).astype(np.float32))
        elif kind == "int64":
            tensors[key] = torch.from_numpy(rng.integers(-1000, 1000, size=(n, width)))
        elif kind == "bool":
            tensors[key] = torch.from_numpy(rng.random((n, width)) < 0.5)
        elif kind == "float64_3d":
            tensors[key] = t64(rng.normal(size=(n, width, 2)))
    non_tensors = {}
    for key, kind in schema["non_tensors"].items():
        if kind == "string":
            vals = [f"s{row_base + i}-{rng.integers(0, 100)}" for i in range(n)]
        elif kind == "int64":
            vals = [int(rng.integers(-10**6, 10**6)) for _ in range(n)]
        elif kind == "float64":
            vals = [float(rng.normal()) for _ in range(n)]
        else:
            vals = [{"id": row_base + i, "tags": [int(rng.integers(0, 9))], "w": float(rng.random())}
                    for i in range(n)]
        non_tensors[key] = np.array(vals, dtype=object)
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=copy.deepcopy(meta))


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def iterate(dp, mbs, epochs, seed, shuffle):
    return [dp_json(b) for b in dp.make_iterator(mini_batch_size=mbs, epochs=epochs, seed=seed,
                                                 dataloader_kwargs={"shuffle": shuffle})]


def dataproto_sequence(seed, rng):
    kinds = ["float64", "float32", "int64", "bool", "float64_3d"]
    schema = {
        "tensors": {f"t{i}": (kinds[int(rng.integers(0, len(kinds)))], int(rng.integers(1, 5)))
                    for i in range(int(rng.integers(1, 4)))},
        "non_tensors": {f"n{i}": ["string", "int64", "float64", "json"][int(rng.integers(0, 4))]
                        for i in range(int(rng.integers(0, 4)))},
    }
    meta = {"temperature": float(rng.choice([0.7, 1.0])), "seed": seed}
    n = int(rng.integers(2, 9))
    row_base = 0
    state = random_dp(rng, n, schema, row_base, meta)
    row_base += n
    seq = {"seed": seed, "initial": dp_json(state), "steps": []}
    ops = ["chunk_concat", "concat", "union", "repeat", "pad_unpad", "reorder", "make_iterator"]
    for step_i in range(int(rng.integers(6, 11))):
        op = ops[int(rng.integers(0, len(ops)))]
        n = len(state)
        step = {"op": op}
        if op == "chunk_concat":
            k = int(rng.choice(divisors(n)))
            chunks = state.chunk(k)
            order = [int(i) for i in rng.permutation(k)]
            state = DataProto.concat([chunks[i] for i in order])
            step.update(chunks=k, order=order, chunk_results=[dp_json(c) for c in chunks])
        elif op == "concat":
            m = int(rng.integers(1, 5))
            other = random_dp(rng, m, schema, row_base, state.meta_info)
            row_base += m
            step.update(other=dp_json(other))
            state = DataProto.concat([state, other])
        elif op == "union":
            other = random_dp(rng, n, {"tensors": {}, "non_tensors": {}}, 0, {})
            other.batch["row_id"] = state.batch["row_id"].clone()  # a shared key with equal values
            new_t, new_n, new_m = f"u{step_i}", f"v{step_i}", f"m{step_i}"
            other.batch[new_t] = t64(rng.normal(size=(n, 2)))
            other.non_tensor_batch[new_n] = np.array([f"x{int(rng.integers(0, 99))}" for _ in range(n)], dtype=object)
            other.meta_info[new_m] = int(rng.integers(0, 99))
            schema["tensors"][new_t] = ("float64", 2)
            schema["non_tensors"][new_n] = "string"
            step.update(other=dp_json(other))
            state = state.union(other)
        elif op == "repeat":
            times = int(rng.integers(1, 4)) if n <= 12 else 1
            interleave = bool(rng.random() < 0.5)
            state = state.repeat(repeat_times=times, interleave=interleave)
            step.update(times=times, interleave=interleave)
        elif op == "pad_unpad":
            d = int(rng.integers(1, 6))
            padded, pad_size = pad_dataproto_to_divisor(state, d)
            unpadded = unpad_dataproto(padded, pad_size)
            keep = "padded" if (rng.random() < 0.5 and len(padded) <= 24) else "unpadded"
            step.update(divisor=d, pad_size=pad_size, padded=dp_json(padded), unpadded=dp_json(unpadded), keep=keep)
            state = padded if keep == "padded" else unpadded
        elif op == "reorder":
            if rng.random() < 0.7:
                idx = [int(i) for i in rng.permutation(n)]
            else:
                idx = [int(i) for i in rng.integers(0, n, size=n)]
            state.reorder(torch.tensor(idx, dtype=torch.int64))
            step.update(indices=idx)
        elif op == "make_iterator":
            mbs = int(rng.choice(divisors(n)))
            epochs = int(rng.integers(1, 4))
            it_seed = int(rng.integers(0, 2**31))
            shuffle = bool(rng.random() < 0.6)
            step.update(mini_batch_size=mbs, epochs=epochs, iter_seed=it_seed, shuffle=shuffle,
                        batches=iterate(state, mbs, epochs, it_seed, shuffle))
        step["result"] = dp_json(state)
        seq["steps"].append(step)
    # Always end on a shuffled make_iterator (the order Tessera's DataProtoIterator must match).
    n = len(state)
    mbs = int(rng.choice(divisors(n)))
    it_seed = int(rng.integers(0, 2**31))
    seq["steps"].append({"op": "make_iterator", "mini_batch_size": mbs, "epochs": 2, "iter_seed": it_seed,
                         "shuffle": True, "batches": iterate(state, mbs, 2, it_seed, True), "result": dp_json(state)})
    return seq


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--first-seed", type=int, default=1000, help="first seed (the golden fixtures use seed 1)")
    ap.add_argument("--num-seeds", type=int, default=20)
    args = ap.parse_args()

    if verl.__version__ != VERL_VERSION:
        sys.exit(f"verl_parity.py: verl {verl.__version__} is installed; the harness is pinned to {VERL_VERSION}")
    torch.set_default_dtype(torch.float32)  # verl's own torch.tensor(0.0) constants stay as in training

    cases, sequences = [], []
    seeds = list(range(args.first_seed, args.first_seed + args.num_seeds))
    for seed in seeds:
        rng = np.random.default_rng(seed)
        cases += advantage_cases(seed, rng)
        cases += loss_cases(seed, rng)
        cases += kl_cases(seed, rng)
        cases += functional_cases(seed, rng)
        sequences.append(dataproto_sequence(seed, rng))

    doc = {
        "source": "verl.trainer.ppo.core_algos / verl.utils.torch_functional / verl.protocol, random inputs",
        "verl_version": verl.__version__,
        "torch_version": torch.__version__,
        "tensordict_version": tensordict.__version__,
        "numpy_version": np.__version__,
        "stubbed_modules": STUBS,
        "dtype": "float64",
        "seeds": seeds,
        "cases": cases,
        "dataproto": sequences,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, allow_nan=False)
    print(f"verl_parity.py: verl {verl.__version__} (tensordict {tensordict.__version__}, torch {torch.__version__}): "
          f"{len(cases)} cases and {len(sequences)} DataProto sequences over seeds {seeds[0]}..{seeds[-1]} -> {args.out}")


if __name__ == "__main__":
    main()
