#!/usr/bin/env python3
"""bench/trace_summary.py on a hand-made trace: kernels are charged to the method whose span
holds the runtime call that launched them (by correlation id), on the call's thread or, for a
thread without spans (autograd's), on the one thread whose span holds it in time; busy time is the
union of kernel intervals (overlaps counted once), and kernels launched outside any span are
listed apart."""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def x(cat, name, ts, dur, tid=1, corr=None):
    e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


events = [
    x("user_annotation", "generate_sequences", 0, 1_000_000),
    x("user_annotation", "update_actor", 2_000_000, 1_000_000),
    x("cuda_runtime", "cudaLaunchKernel", 10, 5, corr=1),
    x("cuda_runtime", "cudaLaunchKernel", 20, 5, corr=2),
    x("cuda_runtime", "cudaStreamSynchronize", 30, 5),
    x("cuda_runtime", "cudaLaunchKernel", 2_000_010, 5, corr=3),
    x("cuda_runtime", "cudaLaunchKernel", 2_500_000, 5, tid=2, corr=4),  # autograd's thread
    x("cuda_runtime", "cudaLaunchKernel", 1_500_000, 5, tid=2, corr=5),  # between the methods
    x("kernel", "gemm", 100, 300_000, tid=7, corr=1),
    x("kernel", "gemm", 200_000, 200_000, tid=7, corr=2),  # overlaps the first by 100 ms
    x("kernel", "adam", 2_000_100, 500_000, tid=7, corr=3),
    x("kernel", "gemm_backward", 2_500_100, 100_000, tid=7, corr=4),
    x("kernel", "copy", 1_500_100, 100_000, tid=7, corr=5),
]
with tempfile.TemporaryDirectory() as d:
    trace = Path(d) / "step_1.pt.trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "trace_summary.py"), str(trace)],
                         check=True, capture_output=True, text=True).stdout
print(out)
assert "2 method spans, 5 kernels/copies/memsets, GPU busy 1.100 s" in out, out
assert "generate_sequences: GPU busy 0.400 s of 1.000 s wall (40%), 2 kernels/copies" in out, out
assert "     0.500 s        2x  gemm" in out, out
assert "runtime calls: 2 cudaLaunchKernel, 1 cudaStreamSynchronize" in out, out
assert "update_actor: GPU busy 0.600 s of 1.000 s wall (60%), 2 kernels/copies" in out, out
assert "(outside a method): GPU busy 0.100 s, 1 kernels/copies" in out, out
print("trace_summary: OK")
