#!/usr/bin/env python3
"""Where the time of a profiled step went: a `trainer.profile_steps` trace, summarised by worker
method.

  bench/trace_summary.py RUN_DIR/profile/step_N.pt.trace.json [--top 12]

For each worker method (the named spans Tessera records: generate_sequences, compute_log_prob,
update_actor, ...) it prints the span's wall time, how long the GPU was busy with the kernels that
method launched (the union of their intervals), the kernels that took longest, and the CUDA
runtime calls made (launches, copies, synchronisations: many launches and little busy time
means the phase is launch-bound). A call on a thread with no span of its own at that moment
(autograd's backward thread, for one) is charged to the method whose spans on other threads hold
it in time, when they all name one method; the rest are listed under "(outside a method)". Reads the
Chrome trace that LibTorch's profiler writes; needs only the standard library.
"""
import argparse
import bisect
import collections
import json


def busy_seconds(spans):
    total, end = 0.0, None
    start = None
    for s, e in sorted(spans):
        if end is not None and s <= end:
            end = max(end, e)
            continue
        if end is not None:
            total += end - start
        start, end = s, e
    if end is not None:
        total += end - start
    return total / 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("--top", type=int, default=12)
    a = p.parse_args()
    with open(a.trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    spans = sorted((e for e in events if e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    device = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]

    by_thread = collections.defaultdict(list)
    for s in spans:
        by_thread[s["tid"]].append(s)
    starts = {tid: [s["ts"] for s in ss] for tid, ss in by_thread.items()}

    def on_own_thread(e):
        ss = by_thread.get(e["tid"])
        if not ss:
            return None
        i = bisect.bisect_right(starts[e["tid"]], e["ts"]) - 1
        while i >= 0:
            if ss[i]["ts"] <= e["ts"] <= ss[i]["ts"] + ss[i]["dur"]:
                return ss[i]["name"]
            i -= 1
        return None

    def method_of(e):
        own = on_own_thread(e)
        if own is not None:
            return own
        holders = {s["name"] for s in spans if s["ts"] <= e["ts"] <= s["ts"] + s["dur"]}
        return holders.pop() if len(holders) == 1 else "(outside a method)"

    calls = collections.defaultdict(collections.Counter)
    method_by_correlation = {}
    for r in runtime:
        m = method_of(r)
        calls[m][r["name"]] += 1
        if "correlation" in r.get("args", {}):
            method_by_correlation[r["args"]["correlation"]] = m
    kernels = collections.defaultdict(list)
    for d in device:
        kernels[method_by_correlation.get(d.get("args", {}).get("correlation"), "(outside a method)")].append(d)

    wall = collections.defaultdict(float)
    for s in spans:
        wall[s["name"]] += s["dur"] / 1e6
    print(f"{a.trace}: {len(spans)} method spans, {len(device)} kernels/copies/memsets, "
          f"GPU busy {busy_seconds([(d['ts'], d['ts'] + d['dur']) for d in device]):.3f} s")
    if not device:
        for name, t in sorted(wall.items(), key=lambda kv: -kv[1]):
            print(f"  {t:8.3f} s  {name}")
        print("no device activity (a CPU run): open the trace in https://ui.perfetto.dev for the ops")
    for m, ds in sorted(kernels.items(), key=lambda kv: -sum(d["dur"] for d in kv[1])):
        busy = busy_seconds([(d["ts"], d["ts"] + d["dur"]) for d in ds])
        head = f"\n{m}: GPU busy {busy:.3f} s"
        if m in wall:
            head += f" of {wall[m]:.3f} s wall ({100 * busy / wall[m]:.0f}%)"
        print(head + f", {len(ds)} kernels/copies")
        per = collections.defaultdict(lambda: [0.0, 0])
        for d in ds:
            per[d["name"]][0] += d["dur"] / 1e6
            per[d["name"]][1] += 1
        for name, (t, n) in sorted(per.items(), key=lambda kv: -kv[1][0])[:a.top]:
            print(f"  {t:8.3f} s {n:8d}x  {name[:110]}")
        print("  runtime calls: " + ", ".join(f"{c} {n}" for n, c in calls[m].most_common(8)))


if __name__ == "__main__":
    main()
