"""Where a `sample()` call's device time goes: a profile of jaxrunner's chunk against the
bare scan, per kernel.

    python benchmarks/gpu_profile.py [--num-envs 4096 1048576] [--trace-dir DIR]
                                     [--output benchmarks/results/gpu_profile.json]

For each size, CartPole-v1 with random actions (the case where the env step itself is
cheapest, so bookkeeping shows most): jaxrunner's runner (fault check on and off) and the
bare PureJaxRL-style scan each run two calls under `jax.profiler.trace` (perfetto
output). The JSON gives, per side, the wall time of a call, the device's kernel time and
kernel count per call, and the kernels that took the most time, by name (XLA fusion
names: dump the optimized HLO with `XLA_FLAGS=--xla_dump_to=DIR --xla_dump_hlo_as_text`
to map them to source lines, whose metadata the HLO keeps). `--trace-dir` keeps the raw
traces. Needs no Ray; runs on CPU too (host-side XLA ops are reported instead).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

from jaxrunner.benchmarking import machine_info, make_bare_scan, make_jaxrunner  # noqa: E402

CALLS = 2
TOP = 30


def kernel_summary(trace_path: str, calls: int) -> dict:
    """Per-call kernel time and count, and the top kernels by total time, from a perfetto
    trace (`traceEvents` complete events of the device processes; on a CPU-only trace,
    of every thread but the Python one)."""
    with gzip.open(trace_path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    processes = {e["pid"]: e["args"]["name"] for e in events
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
    device_pids = {pid for pid, name in processes.items() if "GPU" in name or "gpu" in name}
    kernels = [e for e in events if e.get("ph") == "X" and (
        e.get("pid") in device_pids if device_pids else not e["name"].startswith("$"))]
    by_name: dict[str, list[float]] = collections.defaultdict(list)
    for event in kernels:
        by_name[event["name"]].append(float(event.get("dur", 0.0)))
    total = sum(sum(d) for d in by_name.values())
    top = sorted(by_name.items(), key=lambda item: -sum(item[1]))[:TOP]
    return {"device_events": bool(device_pids),
            "kernel_us_per_call": total / calls,
            "kernels_per_call": len(kernels) / calls,
            "top_kernels": [{"name": name, "count_per_call": len(d) / calls,
                             "us_per_call": sum(d) / calls} for name, d in top]}


def profile_side(run, trace_dir: str) -> dict:
    run()  # warm: compiled, caches filled
    start = time.perf_counter()
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        for _ in range(CALLS):
            run()
    wall = (time.perf_counter() - start) / CALLS
    path = glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)
    return {"wall_us_per_call_traced": wall * 1e6, **kernel_summary(path[0], CALLS)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, nargs="+", default=[4096, 1048576])
    parser.add_argument("--num-steps", type=int, default=256)
    parser.add_argument("--trace-dir", default=None)
    parser.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "results",
                                                         "gpu_profile.json"))
    args = parser.parse_args()
    trace_root = args.trace_dir or tempfile.mkdtemp(prefix="jaxrunner_profile_")
    out = {"machine": machine_info(), "backend": jax.default_backend(),
           "device_kind": getattr(jax.devices()[0], "device_kind", None),
           "env": "CartPole-v1", "policy": "random", "num_steps_per_call": args.num_steps,
           "cases": []}
    for num_envs in args.num_envs:
        sides = {
            "jaxrunner": make_jaxrunner("CartPole-v1", num_envs, args.num_steps, (64, 64),
                                        True)[0],
            "jaxrunner_no_finite_check": make_jaxrunner(
                "CartPole-v1", num_envs, args.num_steps, (64, 64), True,
                check_finite=False)[0],
            "bare_scan": make_bare_scan("CartPole-v1", num_envs, args.num_steps, (64, 64),
                                        True),
        }
        case = {"num_envs": num_envs}
        for name, run in sides.items():
            case[name] = profile_side(run, os.path.join(trace_root, f"{name}_{num_envs}"))
            print(num_envs, name, {k: round(v) for k, v in case[name].items()
                                   if isinstance(v, float)}, flush=True)
        out["cases"].append(case)
        sides.clear()
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", args.output, "traces in", trace_root)


if __name__ == "__main__":
    main()
