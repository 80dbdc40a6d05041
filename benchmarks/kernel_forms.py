"""What a kernel costs XLA:CPU to compile: equivalent forms of the chunk's flag code, and
the cost of a kernel as such.

    python benchmarks/kernel_forms.py [--rounds 3] [--output benchmarks/results/kernel_forms.json]

Each form is compiled in a fresh process (`jit(...).lower(...).compile()`, no persistent
cache), with its optimised LLVM IR dumped (`--xla_dump_to`) and measured
(`compile_parts.largest_module_ir_bytes`). The flags are a chunk's `(T, B) = (64, 16)`
packed uint8 step flags (bit 4: failed, as `core.carry`); `steps` a () int32 count of
taken steps. Pairs of forms that compute the same values:

- `any_bool` / `count_int32`: is any flag set (a bool OR reduction, against an int32 sum
  of the same flags compared with 0: `core.ring.count_true`);
- `and_broadcast` / `select_broadcast`: the flags masked by the `(T,)` step validity
  (`valid[:, None] & x`, against `jnp.where(valid[:, None], x, False)`), then shifted by
  a step as the PPO's GAE reads them;
- `cast_and` / `select_float`: the GAE's continuation flag as float32 from the episode
  flags and a `(T, B)` bool "next step valid" input (a cast of a bool `&`, against a
  select of the float flag).

And `trivial_kernels_N`: N small elementwise kernels kept apart by
`lax.optimization_barrier`, for the compile cost of a kernel as such.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # compile_parts

T, B = 64, 16
PAIRS = (("any_bool", "count_int32"), ("and_broadcast", "select_broadcast"),
         ("cast_and", "select_float"))
TRIVIAL = (10, 100, 200)
FORMS = tuple(f for pair in PAIRS for f in pair) + tuple(f"trivial_kernels_{n}"
                                                         for n in TRIVIAL)


def _program(form: str) -> tuple[Callable, tuple]:
    """`(fn, argument shapes)` of `form`."""
    import jax
    import jax.numpy as jnp

    flags = jax.ShapeDtypeStruct((T, B), jnp.uint8)
    steps = jax.ShapeDtypeStruct((), jnp.int32)
    failed = lambda f: (f & 4) != 0  # noqa: E731
    done = lambda f: (f & 3) != 0  # noqa: E731
    valid = lambda n: jnp.arange(T) < n  # noqa: E731

    def shifted(x):  # the next step's flag, as compute_gae's valid_next
        return jnp.concatenate([x[1:], jnp.zeros_like(x[:1])], axis=0)

    if form.startswith("trivial_kernels_"):
        count = int(form.rsplit("_", 1)[1])

        def trivial(x):
            return [jax.lax.optimization_barrier(jnp.sin(x * (i + 1)) + i)
                    for i in range(count)]
        return trivial, (jax.ShapeDtypeStruct((B,), jnp.float32),)
    programs = {
        "any_bool": lambda f: jnp.any(failed(f)),
        "count_int32": lambda f: jnp.sum(failed(f), dtype=jnp.int32) > 0,
        "and_broadcast": lambda f, n: shifted(valid(n)[:, None] & ~failed(f)),
        "select_broadcast": lambda f, n: shifted(jnp.where(valid(n)[:, None], ~failed(f),
                                                           False)),
        "cast_and": lambda f, vn: (~done(f) & vn).astype(jnp.float32),
        "select_float": lambda f, vn: jnp.where(vn, (~done(f)).astype(jnp.float32), 0.0),
    }
    second = {"any_bool": (), "count_int32": (), "cast_and": (jax.ShapeDtypeStruct(
        (T, B), jnp.bool_),), "select_float": (jax.ShapeDtypeStruct((T, B), jnp.bool_),)}
    return programs[form], (flags,) + second.get(form, (steps,))


def measure_form(form: str) -> dict[str, Any]:
    """Compile seconds of `form`, in this process."""
    import jax

    fn, args = _program(form)
    lowered = jax.jit(fn).lower(*args)
    start = time.perf_counter()
    lowered.compile()
    return {"form": form, "compile_s": time.perf_counter() - start}


def _fresh(form: str) -> dict[str, Any]:
    """`measure_form` in a fresh process, with its LLVM IR bytes."""
    from compile_parts import largest_module_ir_bytes

    with tempfile.TemporaryDirectory() as dump:
        env = {**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false",
               "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump}".strip()}
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", form],
                             capture_output=True, text=True, env=env)
        if out.returncode != 0:
            raise RuntimeError(f"compiling the form {form!r} failed in its own process "
                               f"(exit {out.returncode}):\n{out.stderr[-2000:]}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
        result["llvm_ir_bytes"] = largest_module_ir_bytes(dump)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--forms", nargs="+", default=list(FORMS), choices=FORMS)
    parser.add_argument("--one", choices=FORMS, help=argparse.SUPPRESS)
    parser.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "results",
                                                         "kernel_forms.json"))
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_form(args.one)))
        return
    from jaxrunner.benchmarking import machine_info

    runs: dict[str, list] = {form: [] for form in args.forms}
    load_before = os.getloadavg()
    for r in range(args.rounds):
        for form in args.forms[r % len(args.forms):] + args.forms[:r % len(args.forms)]:
            runs[form].append(_fresh(form))
            print(f"round {r} {form}: {runs[form][-1]['compile_s'] * 1000:.0f} ms, "
                  f"{runs[form][-1]['llvm_ir_bytes']} bytes of LLVM IR", flush=True)
    forms = {form: {"median_compile_s": statistics.median(x["compile_s"] for x in runs[form]),
                    "compile_s": [x["compile_s"] for x in runs[form]],
                    "llvm_ir_bytes": runs[form][0]["llvm_ir_bytes"]} for form in args.forms}
    trivial = {n: forms[f"trivial_kernels_{n}"]["median_compile_s"] for n in TRIVIAL
               if f"trivial_kernels_{n}" in forms}
    results = {"benchmark": "kernel_forms", "rounds": args.rounds, "shape": [T, B],
               "machine": machine_info(), "load_avg_before": load_before,
               "load_avg_after": os.getloadavg(), "forms": forms}
    if len(trivial) >= 2:
        low, high = min(trivial), max(trivial)
        results["compile_s_per_trivial_kernel"] = (trivial[high] - trivial[low]) / (high - low)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps({form: (round(v["median_compile_s"] * 1000), v["llvm_ir_bytes"])
                      for form, v in forms.items()}))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
