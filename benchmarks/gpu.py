"""GPU throughput sweep: one prepared script for a machine with an accelerator.

    python benchmarks/gpu.py [--output benchmarks/results/gpu.json]

Needs a JAX build with GPU support (`pip install "jax[cuda12]"` or `jax[cuda13]`), flax,
optax, chex, gymnax and gymnasium; not Ray (neither `import jaxrunner` nor a single runner
imports it), so on a host without network the gymnax and gymnasium wheels can be carried
along and installed with `pip install --no-deps <wheels>`. Exits with an error naming the
backend when no GPU is visible (`--allow-cpu` runs anyway: a smoke test at tiny sizes).
Sweeps CartPole-v1 with random actions and with the 64x64 MLP policy from 1,024 to
1,048,576 sub-envs (jaxrunner with "gymnax" and "partial" auto-reset, and the bare
hand-written scan), alternating rounds, and writes JSON with the device name, the
machine load and each size's first-call (compile) time; a size that runs out of device
memory is recorded as such and the sweep goes on. Goal on one H200: >= 1e9 env steps/s
with random actions, >= 2e8 with the MLP.
"""

import argparse
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

from jaxrunner.benchmarking import (compare, machine_info, make_bare_scan,  # noqa: E402
                                    make_jaxrunner, switched)
from jaxrunner.core import faults  # noqa: E402
from jaxrunner.runners.compiled_runner import ACCELERATOR_STEPS_PER_LOOP_CHECK  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "results",
                                                         "gpu.json"))
    parser.add_argument("--num-envs", type=int, nargs="+",
                        default=[1024, 4096, 16384, 65536, 262144, 1048576])
    parser.add_argument("--num-steps", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--time-budget", type=float, default=None,
                        help="seconds after which no new case is started")
    parser.add_argument("--order", choices=("smallest-first", "largest-first"),
                        default="smallest-first")
    parser.add_argument("--ablations", action="store_true",
                        help="also time the runner with each GPU-specific setting undone: "
                             "the loop test every step (steps_per_loop_check=1) or every 64, "
                             "the fault check's small leaves joined or by columns "
                             "(faults.SMALL_LEAVES_CHECK) or the check off")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="run without a GPU (a smoke test of the script at tiny sizes)")
    args = parser.parse_args()
    if jax.default_backend() != "gpu" and not args.allow_cpu:
        sys.exit(f"no GPU visible to JAX (backend {jax.default_backend()!r}); install a JAX "
                 "build with CUDA support")
    started = time.perf_counter()
    device = jax.devices()[0]
    out = {"machine": machine_info(), "device": str(device),
           "device_kind": getattr(device, "device_kind", None),
           "backend": jax.default_backend(), "load_avg": os.getloadavg(),
           "num_steps_per_call": args.num_steps, "rounds": args.rounds,
           "steps_per_loop_check_auto": (1 if jax.default_backend() == "cpu"
                                         else ACCELERATOR_STEPS_PER_LOOP_CHECK),
           "small_leaves_check": faults.small_leaves_check(),
           "ray_imported": "ray" in sys.modules, "cases": []}
    sizes = sorted(args.num_envs, reverse=args.order == "largest-first")
    for num_envs in sizes:
        for random_actions in (True, False):
            label = {"num_envs": num_envs, "random_actions": random_actions}
            if args.time_budget is not None and time.perf_counter() - started > args.time_budget:
                out["cases"].append({**label, "skipped": "time budget spent"})
                continue
            out["cases"].append(_measure(num_envs, random_actions, args))
            out["elapsed_s"] = time.perf_counter() - started
            _write(out, args.output)
    out["cases"].sort(key=lambda case: (not case["random_actions"], case["num_envs"]))
    out["ray_imported"] = "ray" in sys.modules
    out["elapsed_s"] = time.perf_counter() - started
    _write(out, args.output)
    print("wrote", args.output)


def _measure(num_envs: int, random_actions: bool, args) -> dict:
    """One size and policy: both runners and the bare scan, alternating rounds."""
    label = {"num_envs": num_envs, "random_actions": random_actions}
    policy = "random" if random_actions else "mlp"
    sides, first_call = {}, {}
    try:
        variants = {"jaxrunner": {}, "jaxrunner_partial_reset": {"autoreset_mode": "partial"}}
        if args.ablations:
            variants.update({
                "jaxrunner_loop_test_every_step": {"steps_per_loop_check": 1},
                "jaxrunner_loop_test_every_64": {"steps_per_loop_check": 64},
                "jaxrunner_joined_finite_check": {"small_leaves_check": "joined"},
                "jaxrunner_columns_finite_check": {"small_leaves_check": "columns"},
                "jaxrunner_no_finite_check": {"check_finite": False}})
        for name, kwargs in variants.items():
            kwargs = dict(kwargs)
            layout = kwargs.pop("small_leaves_check", faults.SMALL_LEAVES_CHECK)
            with switched(faults, "SMALL_LEAVES_CHECK", layout):  # read at the first sample
                sides[name], first_call[name] = make_jaxrunner(
                    "CartPole-v1", num_envs, args.num_steps, (64, 64), random_actions,
                    **kwargs)
        start = time.perf_counter()
        sides["bare_scan"] = make_bare_scan("CartPole-v1", num_envs, args.num_steps, (64, 64),
                                            random_actions)
        first_call["bare_scan"] = time.perf_counter() - start
        case = compare(sides, num_envs * args.num_steps, rounds=args.rounds)
    except Exception as error:  # e.g. RESOURCE_EXHAUSTED at the largest sizes
        print(num_envs, policy, "failed:", type(error).__name__, flush=True)
        return {**label, "error": f"{type(error).__name__}: {error}"[:500]}
    finally:
        sides.clear()
        gc.collect()  # the runners' device buffers, before the next size
    print(num_envs, policy, {k: f"{v:,.0f}" for k, v in case["steps_per_s"].items()},
          "first call", {k: round(v, 1) for k, v in first_call.items()}, flush=True)
    return {**label, **case, "first_sample_s": first_call}


def _write(out: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
