"""The on-device metric ring: the last `W` finished episodes' return, length and end step.

Written once per chunk, after the scan, from the chunk's done flags (no per-step work in
the scan body). Every layout writes its rings through `write_ring`: the single-agent
layout gives the rewards and the chunk-start counters (episode returns and lengths are
derived for the `W` written episodes only), the multi-agent layout gives per-step episode
returns and lengths it derives anyway.

Shapes: `T` chunk length, `B` sub-envs, `W` window.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner.core.carry import MetricRegisters

NO_EPISODE_LIMIT = np.int32(2**31 - 1)


class RingInput(NamedTuple):
    """What `write_ring` reads of a chunk (`(T, B)` arrays unless noted).

    Either `episode_return` and `episode_len` (per step: of the episode up to and
    including step `t`) are given, or `rewards` and the chunk-start counters passed to
    `write_ring` are, from which the written episodes' stats are derived.

    `done` and `failed` are False at the steps not taken (a chunk's records past its last
    step are zeros), so they are read without a mask: a `(T, B)` flag array masked by a
    broadcast `(T,)` `valid` compiles into LLVM code several times the size of the
    unmasked one (`benchmarks/compile_parts.py`)."""

    done: jax.Array  # bool: an episode ended (and counts) at step t; False if not taken
    failed: jax.Array | None  # bool: the sub-env failed at step t (discarded); same
    valid: jax.Array  # (T,) bool: step t was taken
    rewards: jax.Array | None = None  # float32
    episode_return: jax.Array | None = None  # float32
    episode_len: jax.Array | None = None  # int32


class RingUpdate(NamedTuple):
    """What `write_ring` returns."""

    registers: MetricRegisters
    counted_len: jax.Array  # () int32: the counted episodes' summed lengths
    discarded: jax.Array  # () int32: summed (capped) lengths of failed steps' episodes
    writes: "RingWrites"  # where the ring's writes came from (reused by other rings)

    @property
    def num_counted(self) -> jax.Array:
        """() int32: episodes written (at most the limit)."""
        return self.writes.num_new

    @property
    def last_counted(self) -> jax.Array:
        """() int32: flat (t, b) index of the last counted end, or -1."""
        return self.writes.last_counted


class RingWrites(NamedTuple):
    """Which of a chunk's episode ends a ring of `W` slots writes (`locate_writes`)."""

    total: jax.Array  # () int32: episode ends at taken steps
    num_new: jax.Array  # () int32: of those, the ones that count (at most the limit)
    rank: jax.Array  # (W,) int32: 1-based rank of each write, oldest first (< 1: none)
    position: jax.Array  # (W,) int32: flat (t, b) index of each write (clamped if none)
    last_counted: jax.Array  # () int32: flat index of the last counted end, or -1


def count_true(flags: jax.Array) -> jax.Array:
    """() int32: the True entries of a bool array. Also the way to test for any: XLA:CPU
    compiles a bool OR reduction over a `(T, B)` array into several times the LLVM code
    of this integer sum."""
    return jnp.sum(flags, dtype=jnp.int32)


def locate_writes(done: jax.Array, window: int, episodes_limit: jax.Array) -> RingWrites:
    """The writes of a `window`-slot ring from a chunk's `(T, B)` bool episode ends at
    taken steps, counted in (t, b) order up to `episodes_limit`: only the last `window`
    counted ends survive, so one `rank_positions` search finds them and the last one."""
    total = count_true(done)
    num_new = jnp.minimum(total, episodes_limit)
    rank = num_new - window + 1 + jnp.arange(window, dtype=jnp.int32)
    found = rank_positions(done, jnp.concatenate([rank, num_new[None]]))
    return RingWrites(total, num_new, rank, found[:window],
                      jnp.where(num_new > 0, found[window], -1))


def _block_size(num_items: int, num_queries: int) -> int:
    """Power-of-two block for `rank_positions`: balances the per-block pass (N / S) against
    the per-query block scans (W * S)."""
    best = math.sqrt(max(1, num_items) / max(1, num_queries))
    return int(min(4096, max(8, 2 ** round(math.log2(max(best, 1.0))))))


def rank_positions(flags: jax.Array, ranks: jax.Array) -> jax.Array:
    """Flat index of the `rank`-th (1-based) True of `flags` (any shape, row-major order)
    for each entry of `ranks` (W,) int32; ranks outside `[1, count]` give a clamped index.

    Two-level search instead of a cumulative sum over all `N` flags: one pass counts the
    flags per block of `S`, a cumulative sum over the `N / S` block counts locates each
    rank's block, then a scan inside `W` blocks of `S` finds it. Work `O(N + W * S)`,
    temporaries `O(N / S + W * S)`, no `N`-sized scan (which costs as much as the rollout's
    post-processing itself at 4096 sub-envs)."""
    flat = flags.reshape(-1).astype(jnp.bool_)  # bool: no 4-byte copy of all N flags
    num_items = flat.shape[0]
    block = _block_size(num_items, ranks.shape[0])
    num_blocks = -(-num_items // block)
    if num_blocks * block != num_items:
        flat = jnp.pad(flat, (0, num_blocks * block - num_items))
    blocks = flat.reshape(num_blocks, block)
    block_cum = jnp.cumsum(jnp.sum(blocks, axis=1, dtype=jnp.int32))  # (N / S,)
    ranks = jnp.maximum(ranks, 1)
    index = jnp.minimum(jnp.searchsorted(block_cum, ranks, side="left"), num_blocks - 1)
    within = ranks - jnp.where(index > 0, block_cum[jnp.maximum(index - 1, 0)], 0)
    in_block = jnp.cumsum(blocks[index].astype(jnp.int32), axis=1)  # (W, S)
    offset = jnp.sum((in_block < within[:, None]).astype(jnp.int32), axis=1)
    return jnp.minimum(index * block + offset, num_items - 1).astype(jnp.int32)


def _ends(ring: RingInput) -> jax.Array:
    """(T, B) bool: an episode ended (done or failed) at a taken step."""
    return ring.done if ring.failed is None else ring.done | ring.failed


def _episode_stats_at(ring: RingInput, flat_positions: jax.Array,
                      start_episode_len: jax.Array, start_episode_return: jax.Array):
    """Length and return of the episodes ending at `flat_positions` (into `(T, B)`).

    For each position, the steps of its episode in this chunk are those after the last
    end (done or failure) before it in the same sub-env column; earlier steps come from
    the carry at chunk start. Only `(T, len(flat_positions))` work: no per-step outputs."""
    chunk_len, num_envs = ring.rewards.shape
    t_end = flat_positions // num_envs
    column = flat_positions % num_envs
    ended_cols = _ends(ring)[:, column]  # (T, W)
    steps = jnp.arange(chunk_len, dtype=jnp.int32)[:, None]
    before = ended_cols & (steps < t_end[None, :])
    prev_end = jnp.max(jnp.where(before, steps, -1), axis=0)  # (W,)
    in_episode = (steps > prev_end[None, :]) & (steps <= t_end[None, :])
    rewards = jnp.sum(jnp.where(in_episode, ring.rewards[:, column], 0.0), axis=0)
    from_start = prev_end < 0
    length = t_end - prev_end + jnp.where(from_start, start_episode_len[column], 0)
    ret = rewards + jnp.where(from_start, start_episode_return[column], 0.0)
    return length.astype(jnp.int32), ret.astype(jnp.float32)


def _ended_lengths_slow(ring: RingInput, start_episode_len: jax.Array, last_counted: jax.Array,
                        steps_in_call: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Exact `(counted_len, discarded)` by one scan over the `T` rows (no `(T, B)`
    temporaries): summed length of the counted episode ends (flat index `<= last_counted`)
    and of the failed steps' episodes, each capped by `steps_in_call[t]`."""
    chunk_len, num_envs = ring.done.shape
    flat_row = jnp.arange(num_envs, dtype=jnp.int32)
    failed_rows = ring.failed if ring.failed is not None else jnp.zeros_like(ring.done)

    def row(loop, xs):
        running, counted_len, discarded = loop
        t, done, failed, valid, cap = xs
        length = running + 1
        done = done & valid
        failed = failed & valid
        counted = done & (t * num_envs + flat_row <= last_counted)
        counted_len = counted_len + jnp.sum(jnp.where(counted, length, 0))
        discarded = discarded + jnp.sum(jnp.where(failed, jnp.minimum(length, cap), 0))
        running = jnp.where(valid, jnp.where(done | failed, 0, length), running)
        return (running, counted_len, discarded), None

    zero = jnp.zeros((), jnp.int32)
    (_, counted_len, discarded), _ = jax.lax.scan(
        row, (start_episode_len.astype(jnp.int32), zero, zero),
        (jnp.arange(chunk_len, dtype=jnp.int32), ring.done, failed_rows, ring.valid,
         steps_in_call))
    return counted_len, discarded


def write_ring(registers: MetricRegisters, ring: RingInput, start_step: jax.Array,
               episodes_limit: jax.Array, *, start_episode_len: jax.Array | None = None,
               start_episode_return: jax.Array | None = None,
               end_episode_len: jax.Array | None = None,
               steps_in_call: jax.Array | None = None) -> RingUpdate:
    """Writes the episodes finished in `ring` (in (t, b) order, at most `episodes_limit`)
    into `registers`; returns a `RingUpdate`: the new registers, the number of episodes
    written, their summed lengths, the summed lengths of the failed steps' episodes (each
    capped by `steps_in_call[t]`, `(T,)`; 0 without it) and where the counted episode ends
    stop (the ends at flat indices `<= last_counted` count).

    Only the last `W` counted episodes can survive in the ring, so they are located with
    `rank_positions` (no scan over all `T * B` flags) and only `W` slots are written.
    Their lengths and returns come from `ring.episode_len` / `ring.episode_return` when
    given, else from the rewards and the chunk-start counters (`start_episode_len`,
    `start_episode_return`, `(B,)`). The summed length of the counted episodes then comes
    from the chunk-end counters `end_episode_len` (`(B,)`; each sub-env's ended episodes
    hold `start + steps - end` steps) unless a sub-env failed or the limit cut the chunk's
    episodes, when one exact scan over the rows runs.
    """
    chunk_len, num_envs = ring.done.shape
    window = registers.window_return.shape[0]
    done = ring.done  # (T, B), False at the steps not taken
    writes = locate_writes(done, window, episodes_limit)
    total, num_new, rank, position, last_counted = writes
    written = rank >= 1
    slot = jnp.where(written, (registers.window_next + rank - 1) % window, window)
    end_step = start_step + (position // num_envs).astype(jnp.uint32) + jnp.uint32(1)
    zero = jnp.zeros((), jnp.int32)
    if ring.episode_return is not None:
        lengths = ring.episode_len.reshape(-1)[position]
        returns = ring.episode_return.reshape(-1)[position]
        flat_index = jnp.arange(chunk_len * num_envs, dtype=jnp.int32).reshape(chunk_len,
                                                                               num_envs)
        counted = done & (flat_index <= last_counted)
        counted_len = jnp.sum(jnp.where(counted, ring.episode_len, 0))
        discarded = zero if steps_in_call is None or ring.failed is None else jnp.sum(
            jnp.where(ring.failed, jnp.minimum(ring.episode_len, steps_in_call[:, None]), 0))
    else:
        lengths, returns = _episode_stats_at(ring, position, start_episode_len,
                                             start_episode_return)
        steps_taken = jnp.sum(ring.valid.astype(jnp.int32))
        if steps_in_call is None:
            steps_in_call = jnp.full((chunk_len,), 2**31 - 1, jnp.int32)

        def identity(_):
            return jnp.sum(start_episode_len + steps_taken - end_episode_len), zero

        exact = total > num_new
        if ring.failed is not None:
            exact = exact | (count_true(ring.failed) > 0)
        counted_len, discarded = jax.lax.cond(
            exact, lambda _: _ended_lengths_slow(ring, start_episode_len, last_counted,
                                                 steps_in_call),
            identity, None)
    new = registers.replace(
        window_return=registers.window_return.at[slot].set(returns, mode="drop"),
        window_len=registers.window_len.at[slot].set(lengths, mode="drop"),
        window_end_step=registers.window_end_step.at[slot].set(end_step, mode="drop"),
        window_next=(registers.window_next + num_new) % window,
        window_size=jnp.minimum(registers.window_size + num_new, window),
        episodes=registers.episodes + num_new.astype(jnp.uint32),
    )
    return RingUpdate(new, counted_len, discarded, writes)


def write_episodes(registers: MetricRegisters, done: jax.Array, episode_return: jax.Array,
                   episode_len: jax.Array, start_step: jax.Array) -> MetricRegisters:
    """Writes every episode marked in `done` (T, B) with its per-step return and length
    into a ring (no episode limit): the per-agent and per-module rings."""
    ring = RingInput(done=done, failed=None, valid=jnp.ones(done.shape[:1], jnp.bool_),
                     episode_return=episode_return, episode_len=episode_len)
    return write_ring(registers, ring, start_step, NO_EPISODE_LIMIT).registers


def stacked_registers(window: int, count: int) -> MetricRegisters:
    """`count` empty rings of `window` slots, stacked on a leading axis."""
    one = MetricRegisters.create(window)
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (count,) + x.shape), one)


__all__ = ["NO_EPISODE_LIMIT", "RingInput", "RingUpdate", "RingWrites", "count_true",
           "locate_writes",
           "rank_positions", "stacked_registers", "write_episodes", "write_ring"]
