"""Threefry-2x32 lowered without a loop on CPU, for jaxrunner's own compiled programs.

JAX lowers its default PRNG's hash (`threefry2x32`, 20 rounds) on CPU as a `while` loop
of 5 iterations, to keep compile times small; every other platform gets it unrolled. In
a rollout the loop is paid at every vector step and at every random call site (the key
split, the policy's sampling, each sub-env's reset draw): about a hundred small kernels
a step (the loop's rotated key schedule is copied at every iteration), more than the
env step of a small batch costs. Unrolled, the hash fuses into its neighbours.

`unrolled_threefry()` lowers the hash unrolled for the programs compiled inside it, and
`jit` is `jax.jit` whose compilations happen inside it. Both lowerings compute the same
32-bit integer operations in the same order, so random bits (and every key, sample and
episode) are bit for bit the ones JAX's default lowering gives; only the program's
shape differs. Programs compiled elsewhere (a user's own `jax.jit`) keep JAX's default
unless they are compiled inside `unrolled_threefry()` too.

One call site stays a loop: a hash of one key over a long 1-D count (the split of the
step's key into a key per sub-env, from `ROLLED_ONE_KEY_MIN_COUNTS` counts on). Unrolled,
XLA fuses it into each per-sub-env hash that consumes those keys (a vmapped env's own
split and reset draw) and recomputes it there: with every call site unrolled, the bare
PureJaxRL-style scan of `jaxrunner.benchmarking` (CartPole, 64x64 MLP, 2-core CPU)
read 1.28-1.48x at 16 sub-envs and 1.07-1.30x at 128 but 0.55-0.68x at 4096-16384;
with that one site a loop, 1.33x / 1.09x / 1.10x at 1024 / 4096 / 16384
(`benchmarks/results/unrolled_rng/`). The runner itself gained at every size up to 1024
sub-envs (CartPole MLP and random actions, both auto-reset modes, Breakout-MinAtar,
Pendulum). At 4096, runners built both ways in one process (alternating rounds) read at
least as fast unrolled in every case (MinAtar 0.96 / 0.92 / 0.90 against 0.97 / 0.87 /
0.85 of the bare scan, Pendulum 0.92 / 0.87 / 0.89 against 0.79 / 0.83 / 0.82, CartPole
0.87 / 0.87 against 0.87 / 0.78, partial auto-reset 2.06x against 1.92x, multi-agent
CartPole 0.84 / 0.88 against 0.70 / 0.73). At 16384 CartPole's MLP runner first read
0.92 against 0.94; measured again after the reset's draws were separated, every case read
faster unrolled or within the noise from 16384 to 262144 sub-envs (see `UNROLL_MAX_ENVS`). Rollouts of more
than `UNROLL_MAX_ENVS` sub-envs (262,144, the largest measured) keep JAX's lowering
(`unroll_for`). One-off programs (module params init) always compile unrolled.

When JAX's lowering registry cannot be reached (a JAX release that moved it), or the
installed jaxlib is newer than the releases this was checked with
(`UNROLLED_THREEFRY_MAX_JAXLIB`), the context does nothing and programs compile with
JAX's default lowering: `UNROLLED_THREEFRY_AVAILABLE` says which. With jaxlib 0.11.2
(Python 3.12) XLA:CPU's LLVM passes did not finish on the unrolled hash: a vmapped gymnax
CartPole reset of 4 sub-envs compiled in 0.5 s with JAX's lowering and not within 100 s
unrolled (0.3 s unrolled with `--xla_backend_optimization_level=0`); with jaxlib 0.10.2
it compiles in 0.5 s both ways.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator

import jax
import numpy as np

# The newest jaxlib (major, minor) whose XLA:CPU compiles the unrolled hash in normal time
# (see the module docstring).
UNROLLED_THREEFRY_MAX_JAXLIB = (0, 10)


def unrolled_threefry_supported(jaxlib_version: str) -> bool:
    """Whether jaxrunner lowers the hash unrolled with this jaxlib version ("0.10.2")."""
    major_minor = tuple(int(part) for part in jaxlib_version.split(".")[:2])
    return major_minor <= UNROLLED_THREEFRY_MAX_JAXLIB


try:  # the primitive and `lower_fun` are public; the registry to restore is not
    import jaxlib.version as _jaxlib_version
    from jax._src.interpreters import mlir as _mlir_internal
    from jax.extend.random import threefry2x32_p as _THREEFRY2X32_P
    from jax.interpreters import mlir as _mlir

    _CPU_RULES = _mlir_internal._platform_specific_lowerings["cpu"]
    UNROLLED_THREEFRY_AVAILABLE = (_THREEFRY2X32_P in _CPU_RULES and
                                   unrolled_threefry_supported(_jaxlib_version.__version__))
except (ImportError, AttributeError, KeyError, TypeError):  # pragma: no cover
    UNROLLED_THREEFRY_AVAILABLE = False

# Threefry-2x32's rotation constants (Salmon et al., "Parallel random numbers: as easy as
# 1, 2, 3", SC 2011): rounds 4g..4g+3 use the group `g % 2`.
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_KEY_SCHEDULE_PARITY = np.uint32(0x1BD11BDA)


def _rotate_left(x: jax.Array, bits: int) -> jax.Array:
    return jax.lax.shift_left(x, np.uint32(bits)) | jax.lax.shift_right_logical(
        x, np.uint32(32 - bits))


def threefry2x32_unrolled(key0: jax.Array, key1: jax.Array, count0: jax.Array,
                          count1: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The Threefry-2x32 hash (20 rounds) of the counter words `(count0, count1)` under
    the key words `(key0, key1)`; all uint32, broadcast together. Returns the two uint32
    output words, as `jax.extend.random.threefry2x32_p` does."""
    schedule = (key0, key1, key0 ^ key1 ^ _KEY_SCHEDULE_PARITY)
    x0, x1 = count0 + schedule[0], count1 + schedule[1]
    for group in range(5):
        for bits in _ROTATIONS[group % 2]:
            x0 = x0 + x1
            x1 = _rotate_left(x1, bits) ^ x0
        # Key injection after every 4 rounds: the schedule's next words and the count.
        x0 = x0 + schedule[(group + 1) % 3]
        x1 = x1 + schedule[(group + 2) % 3] + np.uint32(group + 1)
    return x0, x1


_lock = threading.Lock()
_depth = 0
_saved_rule: Any = None


@contextlib.contextmanager
def unrolled_threefry() -> Iterator[None]:
    """Programs lowered inside this context compute Threefry-2x32 unrolled on CPU (bit
    for bit the same random values; see the module docstring). Re-entrant and
    thread-safe; restores JAX's own lowering on leaving the outermost context. Wrap the
    first call (the compilation) of your own `jax.jit`-ed training loop in it to give it
    the same lowering as jaxrunner's programs."""
    global _depth, _saved_rule
    if not UNROLLED_THREEFRY_AVAILABLE:
        yield
        return
    with _lock:
        if _depth == 0:
            _saved_rule = _CPU_RULES.get(_THREEFRY2X32_P)
            _mlir.register_lowering(_THREEFRY2X32_P, _UNROLLED_RULE, platform="cpu",
                                    inline=False)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                if _saved_rule is None:
                    _CPU_RULES.pop(_THREEFRY2X32_P, None)
                else:
                    _CPU_RULES[_THREEFRY2X32_P] = _saved_rule
                _saved_rule = None


def unrolled_threefry_active() -> bool:
    """Whether a program lowered now gets the unrolled hash: inside `unrolled_threefry()`
    (in any thread, as the lowering rule itself is process-wide) with it available."""
    return UNROLLED_THREEFRY_AVAILABLE and _depth > 0


# A hash of one key over a long 1-D count (`jax.random.split(key, n)`, a 1-D draw) keeps
# JAX's loop above this many counts: unrolled, XLA fuses it into every per-key hash that
# consumes its keys (a vmapped env's split and reset draw) and recomputes it there.
ROLLED_ONE_KEY_MIN_COUNTS = 129

if UNROLLED_THREEFRY_AVAILABLE:
    _JAX_CPU_RULE = _CPU_RULES[_THREEFRY2X32_P].rule
    _unrolled_rule = _mlir.lower_fun(threefry2x32_unrolled, multiple_results=True)

    def _UNROLLED_RULE(ctx, *args):
        key, count = ctx.avals_in[0], ctx.avals_in[2]
        if (key.shape == () and len(count.shape) == 1
                and count.shape[0] >= ROLLED_ONE_KEY_MIN_COUNTS):
            return _JAX_CPU_RULE(ctx, *args)
        return _unrolled_rule(ctx, *args)


# Up to 4096 sub-envs every measured case ran at least as fast unrolled (same-process
# A/B of the two runners at 4096: CartPole, MinAtar, Pendulum, partial auto-reset,
# multi-agent CartPole). Above it, measured again once the long one-key split stayed a
# loop and the resets and their draws were separated (same process,
# `benchmarks/unroll_limit.py`, `benchmarks/results/unrolled_rng/unroll_limit*.json`,
# two runs; ratios to the bare scan, unrolled against JAX's lowering): CartPole's MLP
# runner 1.01 / 1.09 against 0.93 / 0.89 at 16384 sub-envs, 1.10 / 1.17 against 1.00 /
# 1.04 at 65536, 1.01 against 0.85 at 262144 (one run); multi-agent CartPole 1.00 / 0.95
# against 0.71 / 0.67 at 16384; partial auto-reset 1.58 / 1.48 against 1.46 / 1.49 at
# 16384 and 1.67 / 1.71 against 1.47 / 1.65 at 65536; Pendulum and Breakout-MinAtar at
# 16384 within the run-to-run noise (1.00 / 1.05 and 1.19 / 1.46 against 1.02 / 0.97 and
# 1.23 / 1.42). Larger rollouts (not measured) keep JAX's lowering.
UNROLL_MAX_ENVS = 262144


def unroll_for(num_envs: int) -> bool:
    """Whether a rollout of `num_envs` sub-envs (in one program) compiles with the
    unrolled hash: up to `UNROLL_MAX_ENVS`."""
    return int(num_envs) <= UNROLL_MAX_ENVS


# The lowering of a fused training program (`PPOLearner.fused_train`). Measured on the
# 2-core CPU (jaxlib 0.10.2, fused PPO of 16 sub-envs, compile-only A/B in 4-6 fresh
# processes, rotated order, plus one same-process per-iteration A/B a case):
# - one seed (no vmap): JAX's lowering compiled faster (CartPole median 6.95 s against
#   7.8 s unrolled; Pendulum 6.3 against 6.55 s) and the unrolled hash won per iteration
#   only for CartPole (0.96 against 1.05 of the bare PPO; Pendulum 1.02 against 0.97):
#   CartPole's 0.66 ms an iteration pays back its 0.9 s of compile after ~1,400 iterations,
#   more than such a run takes to solve;
# - 8 vmapped seeds: the unrolled hash compiled faster (CartPole 8.2-9.5 s against
#   9.9-11.6 s) and ran faster (0.96 against 1.01 of the bare PPO per iteration).
# Again on an AVX-512 machine of the same kind (`benchmarks/compile_parts.py --pieces
# bare_ppo fused_ppo_jax_rng fused_ppo_unrolled_rng`, 3 rotated rounds,
# `benchmarks/results/compile_parts/one_seed_rng_lowering_*_2026-12-07.json`), one seed:
# XLA's compile 5.36 against 6.06 s median (CartPole) and 3.92 against 4.56 s (Pendulum)
# for JAX's lowering, though the unrolled program has 343 kernels against 540: its
# straight-line hash kernels are large.
FUSED_UNROLL_MIN_SEEDS = 2


def unroll_for_training(num_envs: int, num_seeds: int) -> bool:
    """Whether a fused training program (`PPOLearner.fused_train`: `num_seeds` vmapped
    seeds of `num_envs` sub-envs each) compiles with the unrolled hash: with at least
    `FUSED_UNROLL_MIN_SEEDS` seeds and up to `UNROLL_MAX_ENVS` sub-envs in all; one seed
    keeps JAX's lowering, which compiles faster (see `FUSED_UNROLL_MIN_SEEDS`)."""
    return int(num_seeds) >= FUSED_UNROLL_MIN_SEEDS and unroll_for(int(num_envs) *
                                                                    int(num_seeds))


RNG_LOWERINGS = ("auto", "unrolled", "jax")


def choose_unrolled(rng_lowering: str, auto: bool) -> bool:
    """`rng_lowering` ("auto": `auto`; "unrolled"; "jax": JAX's own) as a bool: whether
    to compile with the unrolled hash. Raises ValueError for any other value."""
    if rng_lowering not in RNG_LOWERINGS:
        raise ValueError(f"rng_lowering must be one of {RNG_LOWERINGS}, got "
                         f"{rng_lowering!r}: 'auto' lets jaxrunner pick, 'unrolled' forces the "
                         "unrolled Threefry hash, 'jax' keeps JAX's own lowering.")
    return auto if rng_lowering == "auto" else rng_lowering == "unrolled"


class UnrolledRngJit:
    """`jax.jit(fun, **kwargs)` whose lowerings (first calls, new shapes, `.lower`) run
    inside `unrolled_threefry()`. Calls go to the jitted function (its C++ dispatch);
    other attributes are the jitted function's."""

    def __init__(self, fun: Callable, **jit_kwargs: Any):
        self._jitted = jax.jit(fun, **jit_kwargs)
        functools.update_wrapper(self, fun)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with unrolled_threefry():
            return self._jitted(*args, **kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        with unrolled_threefry():
            return self._jitted.lower(*args, **kwargs)

    def trace(self, *args: Any, **kwargs: Any) -> "UnrolledRngTraced":
        """`jax.jit(...).trace(...)` inside `unrolled_threefry()` (a program's trace may
        depend on the lowering: jaxrunner's chunk separates resets only under the
        unrolled one), whose `lower()` runs inside it too."""
        with unrolled_threefry():
            return UnrolledRngTraced(self._jitted.trace(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._jitted, name)


class UnrolledRngTraced:
    """A `jax.stages.Traced` whose `lower()` runs inside `unrolled_threefry()`; other
    attributes (`jaxpr`, `out_info`, ...) are the traced program's."""

    def __init__(self, traced: Any):
        self._traced = traced

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        with unrolled_threefry():
            return self._traced.lower(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._traced, name)


def jit(fun: Callable, *, unrolled: bool = True, **jit_kwargs: Any) -> Callable:
    """`jax.jit(fun, **jit_kwargs)` compiled with the unrolled Threefry-2x32 lowering
    (`unrolled=False`: plain `jax.jit`, JAX's own lowering)."""
    return UnrolledRngJit(fun, **jit_kwargs) if unrolled else jax.jit(fun, **jit_kwargs)


__all__ = ["FUSED_UNROLL_MIN_SEEDS", "RNG_LOWERINGS", "ROLLED_ONE_KEY_MIN_COUNTS",
           "UNROLLED_THREEFRY_AVAILABLE",
           "UNROLLED_THREEFRY_MAX_JAXLIB", "UNROLL_MAX_ENVS", "unrolled_threefry_supported",
           "UnrolledRngJit", "UnrolledRngTraced", "jit", "threefry2x32_unrolled",
           "choose_unrolled", "unroll_for", "unroll_for_training",
           "unrolled_threefry", "unrolled_threefry_active"]
