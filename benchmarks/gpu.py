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
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

from jaxrunner.benchmarking import compare, machine_info, make_bare_scan, make_jaxrunner  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "results",
                                                         "gpu.json"))
    parser.add_argument("--num-envs", type=int, nargs="+",
                        default=[1024, 4096, 16384, 65536, 262144, 1048576])
    parser.add_argument("--num-steps", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--allow-cpu", action="store_true",
                        help="run without a GPU (a smoke test of the script at tiny sizes)")
    args = parser.parse_args()
    if jax.default_backend() != "gpu" and not args.allow_cpu:
        sys.exit(f"no GPU visible to JAX (backend {jax.default_backend()!r}); install a JAX "
                 "build with CUDA support")
    out = {"machine": machine_info(), "device": str(jax.devices()[0]),
           "backend": jax.default_backend(), "load_avg": os.getloadavg(),
           "ray_imported": "ray" in sys.modules, "cases": []}
    for random_actions in (True, False):
        for num_envs in args.num_envs:
            sides, first_call = {}, {}
            try:
                sides["jaxrunner"], first_call["jaxrunner"] = make_jaxrunner(
                    "CartPole-v1", num_envs, args.num_steps, (64, 64), random_actions)
                sides["jaxrunner_partial_reset"], first_call["jaxrunner_partial_reset"] = (
                    make_jaxrunner("CartPole-v1", num_envs, args.num_steps, (64, 64),
                                   random_actions, autoreset_mode="partial"))
                sides["bare_scan"] = make_bare_scan("CartPole-v1", num_envs, args.num_steps,
                                                    (64, 64), random_actions)
                case = compare(sides, num_envs * args.num_steps, rounds=args.rounds)
            except Exception as error:  # e.g. RESOURCE_EXHAUSTED at the largest sizes
                out["cases"].append({"num_envs": num_envs, "random_actions": random_actions,
                                     "error": f"{type(error).__name__}: {error}"[:500]})
                print(num_envs, "failed:", type(error).__name__, flush=True)
                sides.clear()
                continue
            case.update({"num_envs": num_envs, "random_actions": random_actions,
                         "first_sample_s": first_call})
            out["cases"].append(case)
            print(num_envs, "random" if random_actions else "mlp",
                  {k: f"{v:,.0f}" for k, v in case["steps_per_s"].items()}, flush=True)
    out["ray_imported"] = "ray" in sys.modules
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", args.output)


if __name__ == "__main__":
    main()
