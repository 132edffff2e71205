#!/usr/bin/python3
"""Regenerates tests/driver/data/validation_golden.json: verl's validation-metric algorithm
(process_validation_metrics with numpy-seeded bootstrap, then _validate's val-core/val-aux
naming), re-stated here in plain numpy as the reference the C++ port is checked against.
Run with a Python that has numpy: /usr/bin/python3 tests/driver/gen_validation_golden.py
"""
import json
import os
from collections import defaultdict

import numpy as np


def bootstrap(data, subset_size, reduce_fns, n_bootstrap=1000, seed=42):
    np.random.seed(seed)
    results = [[] for _ in reduce_fns]
    for _ in range(n_bootstrap):
        idxs = np.random.choice(len(data), size=subset_size, replace=True)
        sample = [data[i] for i in idxs]
        for k, fn in enumerate(reduce_fns):
            results[k].append(fn(sample))
    return [(float(np.mean(r)), float(np.std(r))) for r in results]


def majority(sample):
    votes = {}
    for d in sample:
        votes.setdefault(d["pred"], []).append(d["val"])
    best = max(votes, key=lambda k: len(votes[k]))
    return votes[best][0]


def per_prompt(vals, preds, seed=42):
    m = {}
    n = len(vals)
    m[f"mean@{n}"] = float(np.mean(vals))
    if n > 1:
        m[f"std@{n}"] = float(np.std(vals))
        ns, k = [], 2
        while k < n:
            ns.append(k)
            k *= 2
        ns.append(n)
        for k in ns:
            (bm, bs), (wm, ws) = bootstrap(vals, k, [np.max, np.min], seed=seed)
            m[f"best@{k}/mean"], m[f"best@{k}/std"] = bm, bs
            m[f"worst@{k}/mean"], m[f"worst@{k}/std"] = wm, ws
            if preds is not None:
                data = [{"val": v, "pred": p} for v, p in zip(vals, preds)]
                [(mm, ms)] = bootstrap(data, k, [majority], seed=seed)
                m[f"maj@{k}/mean"], m[f"maj@{k}/std"] = mm, ms
    return m


def process(data_sources, inputs, infos):
    groups = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for i, ds in enumerate(data_sources):
        for var, vals in infos.items():
            groups[ds][inputs[i]][var].append(vals[i])
    out = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for ds, prompts in groups.items():
        for prompt, var2vals in prompts.items():
            for var, vals in var2vals.items():
                if isinstance(vals[0], str):
                    continue
                for name, v in per_prompt(vals, var2vals.get("pred")).items():
                    out[ds][var][name].append(v)
    result = {}
    for ds, var2 in out.items():
        core = "acc" if "acc" in var2 else "reward"
        for var, m in var2.items():
            n_max = max(int(name.split("@")[-1].split("/")[0]) for name in m)
            for name, vals in m.items():
                sec = "val-core" if var == core and name.startswith(("mean", "maj", "best")) and f"@{n_max}" in name else "val-aux"
                result[f"{sec}/{ds}/{var}/{name}"] = float(np.mean(vals))
    return result


def main():
    data_sources = ["arith"] * 8 + ["gsm8k"] * 3
    inputs = ["p0"] * 4 + ["p1"] * 4 + ["q0"] * 3
    reward = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.5, 1.0, 0.0]
    acc = [True, False, True, True, False, False, True, False, False, True, False]
    pred = ["5", "4", "5", "5", "7", "7", "9", "8", "1", "2", "1"]
    infos = {"reward": reward, "acc": acc, "pred": pred}
    case = {"data_sources": data_sources, "sample_inputs": inputs, "infos": infos,
            "expected": process(data_sources, inputs, infos)}
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "data", "validation_golden.json"), "w") as f:
        json.dump(case, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
