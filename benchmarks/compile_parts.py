"""Where the pure sampler's compile time goes: its pieces compiled alone, in fresh processes.

    python benchmarks/compile_parts.py [--env CartPole-v1] [--rounds 3] [--seeds 8]
        [--llvm-ir] [--share-step-trace false] [--batched-from-start false]
        [--output benchmarks/results/compile_parts.json]

The fused PPO's time to solve (issue 17) is mostly compile on a 2-core CPU, and the
sampler's chunk compiles longer than the bare PureJaxRL-style rollout scan. This script
compiles, each in a fresh process (rotated order, `--rounds` times), with the fused PPO's
sizes (`time_to_solve.HYPER`: 16 sub-envs, the env's rollout length, 64x64 tanh MLP,
100-episode metric window, JAX's own Threefry lowering):

- `bare_scan`: the bare rollout scan (`chunk_lean.bare_scan_lowered`);
- `sampler_sample`: `Sampler.sample` (the chunk, the restart on failures, the counters);
- `chunk`: the chunk alone (`ChunkFns.chunk`);
- `metric_ring`: the chunk's metric-ring update alone (`jaxrunner.core.ring.write_ring`
  on the chunk's `(T, B)` done / failed / reward arrays);
- `restart_reset`: the reset of every sub-env `sample()` runs when sub-envs failed
  beyond the tolerance (`ChunkFns.reset_carry`);
- `fused_ppo`, `bare_ppo`: the whole solve-until-target programs
  `time_to_solve.py --fused` compiles (`make_fused_train`, `make_bare_train`), each with
  the lowering it uses there;
- `fused_ppo_jax_rng`, `fused_ppo_unrolled_rng` (not run by default): the fused program
  forced to JAX's Threefry lowering or to the unrolled hash, whatever
  `lowering.unroll_for_training` would pick (the A/B behind `FUSED_UNROLL_MIN_SEEDS`).

`--seeds N`: every piece `jax.vmap`-ed over `N` seeds (states, and the bare scan's
carries, from `N` keys; shared params), as the fused PPO vmapped over seeds compiles it.

Per piece: the seconds JAX takes to trace the program and lower it to StableHLO
(`jit(...).lower(...)`; building the sampler or the trains not included), XLA's compile
seconds (`lowered.compile()`; wall and the process's CPU seconds, which a busy machine
disturbs less) and
the fusions (kernels) of the compiled program, and for the pieces with a
time loop (bare scan, sampler, chunk) the fusions of the loop's body
(`chunk_lean.kernel_counts`). With `--llvm-ir`, also the bytes of optimised LLVM IR
XLA:CPU generates for the piece (one more fresh process per piece, dumping with
`--xla_dump_to`): XLA:CPU compiles every fusion as its own LLVM module, and LLVM
unrolls and vectorises small fixed-size loops, so a kernel's code size, and its compile
time, depends on its shape and element type as well as on the kernel count (a bool OR
reduction over `(64, 16)`, or a `(T, B)` flag array masked by a broadcast `(T,)` one,
compiles to several times the LLVM code of an int32 sum of the same flags).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # chunk_lean, time_to_solve

DEFAULT_PIECES = ("bare_scan", "sampler_sample", "chunk", "metric_ring", "restart_reset",
                  "fused_ppo", "bare_ppo")
PIECES = DEFAULT_PIECES + ("fused_ppo_jax_rng", "fused_ppo_unrolled_rng")
TIME_LOOP_PIECES = ("bare_scan", "sampler_sample", "chunk")


def _lowering(piece: str, env_id: str, seeds: int = 0) -> Callable[[], Any]:
    """A function that traces and lowers the program of `piece` (see the module
    docstring), vmapped over `seeds` seeds when `seeds > 0`; what it is built from (the
    sampler, the trains) is built before it is returned."""
    import jax
    import jax.numpy as jnp

    import jaxrunner
    from jaxrunner.core.ring import NO_EPISODE_LIMIT, RingInput, write_ring
    from time_to_solve import HYPER, _runner_config

    hp = HYPER[env_id]
    if piece.startswith(("fused_ppo", "bare_ppo")):
        return _ppo_lowering(piece, env_id, seeds)
    if piece == "bare_scan":
        from chunk_lean import bare_scan_lowered

        if env_id != "CartPole-v1":
            raise ValueError("the bare_scan piece is CartPole-v1's (chunk_lean's bare scan).")
        return lambda: bare_scan_lowered(hp.num_envs, hp.num_steps, num_seeds=seeds)
    sampler = jaxrunner.make_sampler(_runner_config(env_id, 0, hp))
    params = sampler.params
    keys = jax.random.split(sampler.default_key, seeds) if seeds else sampler.default_key
    state = jax.eval_shape(jax.vmap(sampler.init) if seeds else sampler.init, keys)
    fns = sampler.chunk_fns("explore")
    int32 = jnp.int32

    def lower(fn, *args, shared_params=False):  # args per seed; `params` last if shared
        if seeds:
            axes = (0,) * (len(args) - shared_params) + (None,) * shared_params
            fn = jax.vmap(fn, in_axes=axes)
        return lambda: jax.jit(fn).lower(*args)

    if piece == "sampler_sample":
        return lower(lambda s, p: sampler.sample(s, p), state, params, shared_params=True)
    if piece == "chunk":
        def chunk(s, p):
            return fns.chunk(s.carry, s.lookback, p, sampler.env_params,
                             int32(sampler.num_steps), NO_EPISODE_LIMIT, NO_EPISODE_LIMIT,
                             jnp.zeros((), int32))
        return lower(chunk, state, params, shared_params=True)
    if piece == "restart_reset":
        return lower(lambda c: fns.reset_carry(c, sampler.env_params), state.carry)
    if piece == "metric_ring":
        lead = (seeds,) if seeds else ()
        shape = lead + (sampler.num_steps, sampler.num_envs)
        flags = jax.ShapeDtypeStruct(shape, jnp.bool_)
        ring = RingInput(done=flags, failed=flags,
                         valid=jax.ShapeDtypeStruct(shape[:-1], jnp.bool_),
                         rewards=jax.ShapeDtypeStruct(shape, jnp.float32))
        per_env = jax.ShapeDtypeStruct(lead + (sampler.num_envs,), int32)

        def update(registers, ring, start_step, start_len, start_return, end_len):
            return write_ring(registers, ring, start_step, NO_EPISODE_LIMIT,
                              start_episode_len=start_len, start_episode_return=start_return,
                              end_episode_len=end_len,
                              steps_in_call=1 + jnp.arange(sampler.num_steps, dtype=int32))
        carry = state.carry
        return lower(update, carry.metrics, ring, carry.vector_step, per_env,
                     jax.ShapeDtypeStruct(per_env.shape, jnp.float32), per_env)
    raise ValueError(f"piece must be one of {PIECES}, got {piece!r}.")


def _ppo_lowering(piece: str, env_id: str, seeds: int) -> Callable[[], Any]:
    """`_lowering` of the fused or bare PPO program of
    `time_to_solve.run_fused_comparison`, lowered as it compiles it there
    (`time_to_solve.solve_programs`; one seed unvmapped for `seeds <= 1`), or, for the
    `fused_ppo_*_rng` pieces, the fused program with that Threefry lowering."""
    from jaxrunner import lowering
    from time_to_solve import HYPER, solve_programs

    fused_lowering = {"fused_ppo_jax_rng": "jax", "fused_ppo_unrolled_rng": "unrolled"}
    programs = solve_programs(env_id, max(seeds, 1), HYPER[env_id], max_updates=1000,
                              fused_lowering=fused_lowering.get(piece, "auto"))
    _, fn, arg, unrolled_rng = programs["bare" if piece == "bare_ppo" else "fused"]
    return lambda: lowering.jit(fn, unrolled=unrolled_rng).lower(arg)


def measure_piece(piece: str, env_id: str, seeds: int = 0) -> dict[str, Any]:
    """Trace-and-lower and compile seconds and fusion counts of `piece` (vmapped over
    `seeds` seeds when `seeds > 0`), in this process."""
    from chunk_lean import kernel_counts

    lower = _lowering(piece, env_id, seeds)
    start = time.perf_counter()
    lowered = lower()
    lower_s = time.perf_counter() - start
    cpu_start, start = time.process_time(), time.perf_counter()
    compiled = lowered.compile()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    counts = kernel_counts(compiled.as_text())
    result = {"piece": piece, "trace_lower_s": lower_s, "compile_s": seconds,
              "compile_cpu_s": cpu,
              "fusions": counts["program_fusions"]}
    if piece in TIME_LOOP_PIECES:
        result["time_loop_fusions"] = counts["loop_body_fusions"]
    return result


def _fresh(piece: str, env_id: str, seeds: int = 0, dump_to: str | None = None,
           share_step_trace: bool = True, batched_from_start: bool = True) -> dict[str, Any]:
    """`measure_piece` in a fresh Python process (dumping XLA's programs, LLVM IR
    included, to `dump_to` when given; with `core.chunk.SHARE_STEP_TRACE` set to
    `share_step_trace` and `core.chunk.BATCHED_FROM_START` to `batched_from_start`)."""
    # Compiled, never loaded: no persistent compilation cache (a caller's, or a test run's).
    env = {**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false"}
    if dump_to is not None:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_dump_to={dump_to}".strip()
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", piece,
                          "--env", env_id, "--seeds", str(seeds),
                          "--share-step-trace", str(share_step_trace).lower(),
                          "--batched-from-start", str(batched_from_start).lower()],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"compiling the piece {piece!r} of {env_id} failed in its own "
                           f"process (exit {out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def largest_module_ir_bytes(dump: str) -> int:
    """Bytes of optimised LLVM IR of the largest program XLA:CPU dumped into `dump`
    (`--xla_dump_to`): the measured program, not the small ones that build its inputs."""
    per_module: collections.Counter = collections.Counter()
    for name in os.listdir(dump):
        if name.endswith(".ir-with-opt.ll"):
            per_module[name.split(".")[0]] += os.path.getsize(os.path.join(dump, name))
    if not per_module:
        raise RuntimeError(f"XLA dumped no LLVM IR into {dump}.")
    return per_module.most_common(1)[0][1]


def llvm_ir_bytes(piece: str, env_id: str, seeds: int = 0) -> int:
    """Bytes of the optimised LLVM IR XLA:CPU generates for `piece`."""
    with tempfile.TemporaryDirectory() as dump:
        _fresh(piece, env_id, seeds, dump_to=dump)
        return largest_module_ir_bytes(dump)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1", choices=["CartPole-v1", "Pendulum-v1"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pieces", nargs="+", default=list(DEFAULT_PIECES), choices=PIECES)
    parser.add_argument("--seeds", type=int, default=0,
                        help="vmap every piece over this many seeds (default 0: one)")
    parser.add_argument("--llvm-ir", action="store_true",
                        help="also record each piece's optimised LLVM IR bytes")
    parser.add_argument("--share-step-trace", choices=("true", "false"), default="true",
                        help="core.chunk.SHARE_STEP_TRACE: the chunk's loop body evaluates "
                             "the step's trace made for its shapes (true, the default) or "
                             "traces the step again (false)")
    parser.add_argument("--batched-from-start", choices=("true", "false"), default="true",
                        help="core.chunk.BATCHED_FROM_START: vmapped loops' carries start "
                             "batched, so JAX batches their bodies once (true, the "
                             "default), or as they come (false)")
    parser.add_argument("--one", choices=PIECES, help=argparse.SUPPRESS)
    parser.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "results",
                                                         "compile_parts.json"))
    args = parser.parse_args()
    share_step_trace = args.share_step_trace == "true"
    batched_from_start = args.batched_from_start == "true"
    if args.one:
        import jaxrunner.core.chunk

        jaxrunner.core.chunk.SHARE_STEP_TRACE = share_step_trace
        jaxrunner.core.chunk.BATCHED_FROM_START = batched_from_start
        print(json.dumps(measure_piece(args.one, args.env, args.seeds)))
        return
    from jaxrunner.benchmarking import machine_info

    pieces = [p for p in args.pieces if not (p == "bare_scan" and args.env != "CartPole-v1")]
    runs: dict[str, list] = {p: [] for p in pieces}
    load_before = os.getloadavg()
    for r in range(args.rounds):
        for piece in pieces[r % len(pieces):] + pieces[:r % len(pieces)]:
            result = _fresh(piece, args.env, args.seeds, share_step_trace=share_step_trace,
                            batched_from_start=batched_from_start)
            runs[piece].append(result)
            print(f"round {r} {piece}: traced and lowered in "
                  f"{result['trace_lower_s']:.2f} s, compiled in {result['compile_s']:.2f} s "
                  f"({result['compile_cpu_s']:.2f} s CPU), "
                  f"{result['fusions']} fusions", flush=True)
    summary = {p: {"median_trace_lower_s": statistics.median(x["trace_lower_s"]
                                                             for x in runs[p]),
                   "trace_lower_s": [x["trace_lower_s"] for x in runs[p]],
                   "median_compile_s": statistics.median(x["compile_s"] for x in runs[p]),
                   "compile_s": [x["compile_s"] for x in runs[p]],
                   "median_compile_cpu_s": statistics.median(x["compile_cpu_s"]
                                                             for x in runs[p]),
                   "compile_cpu_s": [x["compile_cpu_s"] for x in runs[p]],
                   **{k: runs[p][0][k] for k in ("fusions", "time_loop_fusions")
                      if k in runs[p][0]}} for p in pieces}
    if args.llvm_ir:
        for p in pieces:
            summary[p]["llvm_ir_bytes"] = llvm_ir_bytes(p, args.env, args.seeds)
            print(f"{p}: {summary[p]['llvm_ir_bytes']} bytes of LLVM IR", flush=True)
    results = {"benchmark": "compile_parts", "env": args.env, "rounds": args.rounds,
               "seeds": args.seeds, "share_step_trace": share_step_trace,
               "batched_from_start": batched_from_start,
               "machine": machine_info(), "load_avg_before": load_before,
               "load_avg_after": os.getloadavg(), "pieces": summary}
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps({p: (round(s["median_trace_lower_s"], 2),
                          round(s["median_compile_s"], 2), s["fusions"])
                      for p, s in summary.items()}))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
