"""Fault-tolerant bookkeeping of the remote runner actors (RLlib's
`FaultTolerantActorManager`, reduced to what `EnvRunnerGroup` needs).

Every remote call goes through `call()` / `submit_async()`; their results are sorted into
values and failures here, so the health of each runner is known in one place:

* a dead process (`RayActorError`, a lost node) or an exception raised inside the runner
  marks it unhealthy and drops its requests in flight; results that merely arrive late
  (timeouts) are dropped without marking it unhealthy (RLlib's rule);
* an exception that says the *arguments* were bad (`ValueError`, `TypeError`,
  `KeyError`, `AttributeError`, e.g. `SampleArgumentError`, `StateStructureError`) is
  raised to the caller and leaves the runner healthy: bad input is not a runner failure;
* with `restart_failed_env_runners`, Ray restarts a dead actor with the same arguments
  (same `worker_index`); after an exception inside a healthy process the actor ends
  itself after `delay_between_env_runner_restarts_s` so Ray restarts it too. The group
  then finds it with `probe()` and restores its state before it samples again;
* without restarts, or once a runner has died more than `max_num_env_runner_restarts`
  times, it is lost for good: an `EnvRunnerFailedError` unless
  `ignore_env_runner_failures`, in which case the group carries on without it;
* `num_consecutive_env_runner_failures_tolerance` bounds crash loops: a runner that fails
  more often in a row (no successful call in between) raises `EnvRunnerFailedError`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Iterable

import ray
from ray.exceptions import (
    ActorUnavailableError,
    GetTimeoutError,
    RayActorError,
    RayError,
    RayTaskError,
)

from jaxrunner.distributed.remote_runner import RunnerNotRestoredError

logger = logging.getLogger("jaxrunner.distributed")
_RETRY_S = 0.2  # pause before pinging a restarting runner again

#: Exceptions raised inside a runner that mean "bad arguments": re-raised to the caller,
#: the runner stays healthy.
USER_ERRORS = (ValueError, TypeError, KeyError, AttributeError)


class EnvRunnerFailedError(RuntimeError):
    """A remote env runner failed beyond what `fault_tolerance()` allows."""


@dataclasses.dataclass
class RunnerSlot:
    """What the group knows about one remote runner actor."""

    worker_index: int
    actor: Any  # ray ActorHandle
    healthy: bool = True
    dead: bool = False  # lost for good: no restart will bring it back
    num_restarts: int = 0  # restarts the group saw complete (state restored)
    num_deaths: int = 0  # deaths seen (each costs Ray one of `max_restarts`)
    num_failures: int = 0
    consecutive_failures: int = 0
    last_error: str | None = None
    lifetime_env_steps: int = 0  # last num_env_steps_sampled_lifetime it reported
    in_flight: dict = dataclasses.field(default_factory=dict)  # async ObjectRef -> tag


@dataclasses.dataclass(frozen=True)
class CallResult:
    worker_index: int
    ok: bool
    value: Any  # the result, or the exception


@dataclasses.dataclass(frozen=True)
class FaultPolicy:
    """The `fault_tolerance()` settings the manager acts on."""

    restart: bool
    ignore: bool
    max_restarts: int
    restart_delay_s: float
    consecutive_failures_tolerance: int
    max_in_flight: int

    @classmethod
    def from_config(cls, config) -> "FaultPolicy":
        return cls(restart=config.restart_failed_env_runners,
                   ignore=config.ignore_env_runner_failures,
                   max_restarts=config.max_num_env_runner_restarts,
                   restart_delay_s=config.delay_between_env_runner_restarts_s,
                   consecutive_failures_tolerance=(
                       config.num_consecutive_env_runner_failures_tolerance),
                   max_in_flight=config.max_requests_in_flight_per_env_runner)


def actor_state(actor: Any) -> str | None:
    """Ray's state of `actor` ("ALIVE", "RESTARTING", "DEAD", ...), None if unknown."""
    try:
        from ray._private.state import actors  # what Ray's runtime context uses

        return actors(actor_id=actor._actor_id.hex()).get("State")
    except Exception:  # noqa: BLE001 - an internal API: treat any change as "unknown"
        return None


def _cause(error: BaseException) -> BaseException | None:
    return getattr(error, "cause", None) if isinstance(error, RayTaskError) else None


def classify(error: BaseException) -> str:
    """"user" (bad arguments), "restarted" (a restarted runner not restored yet),
    "app" (an exception inside a live runner) or "died" (the process or node is gone)."""
    if isinstance(error, RayTaskError):
        cause = _cause(error)
        if isinstance(cause, RunnerNotRestoredError):
            return "restarted"
        if isinstance(cause, USER_ERRORS):
            return "user"
        return "app"
    return "died"


def _short(error: BaseException) -> str:
    cause = _cause(error)
    shown = cause if cause is not None else error
    text = str(shown).strip().splitlines()
    return f"{type(shown).__name__}: {text[-1] if text else ''}"


class FaultTolerantActorManager:
    """Health, restarts and requests in flight of the remote runners (module docstring)."""

    def __init__(self, slots: Iterable[RunnerSlot], policy: FaultPolicy):
        self.slots: dict[int, RunnerSlot] = {slot.worker_index: slot for slot in slots}
        self.policy = policy
        self.num_failures = 0
        self.num_restarts = 0
        self.num_dropped = 0  # responses dropped after a timeout (RLlib's counter)
        self._pending: list[tuple[int, Any]] = []  # fire-and-forget calls to check later
        self._errors_to_raise: list[EnvRunnerFailedError] = []

    # ------------------------------------------------------------------ queries
    def ids(self) -> list[int]:
        return sorted(self.slots)

    def healthy_ids(self) -> list[int]:
        return [i for i in self.ids() if self.slots[i].healthy]

    def restorable_ids(self) -> list[int]:
        """Unhealthy runners that may still come back."""
        return [i for i in self.ids() if not self.slots[i].healthy and not self.slots[i].dead]

    def num_in_flight(self, tag: str | None = None) -> int:
        return sum(1 for slot in self.slots.values() for t in slot.in_flight.values()
                   if tag is None or t == tag)

    def check_ids(self, ids: Iterable[int] | None, what: str) -> list[int] | None:
        if ids is None:
            return None
        ids = list(ids)
        unknown = [i for i in ids if i not in self.slots]
        if unknown:
            raise ValueError(f"{what}: unknown remote worker ids {unknown}; the group's remote "
                             f"runners are {self.ids()} (0 is the local runner).")
        return ids

    # ------------------------------------------------------------------ results
    def _on_success(self, worker_index: int) -> None:
        self.slots[worker_index].consecutive_failures = 0

    def book_failure(self, worker_index: int, error: BaseException, kind: str | None = None
                     ) -> None:
        """Marks a runner unhealthy after `error` and acts on the fault policy; errors the
        policy does not tolerate are raised by the next `raise_booked_errors()`."""
        kind = classify(error) if kind is None else kind
        slot = self.slots[worker_index]
        if not slot.healthy:
            return  # another symptom of a failure already booked
        slot.healthy = False
        slot.in_flight.clear()
        slot.num_failures += 1
        slot.consecutive_failures += 1
        slot.num_deaths += 1
        slot.last_error = _short(error)
        self.num_failures += 1
        policy = self.policy
        logger.warning("EnvRunner %d failed (%s).", worker_index, slot.last_error)
        if not policy.restart:
            slot.dead = True
            ray.kill(slot.actor, no_restart=True)
        elif slot.num_deaths > policy.max_restarts:
            slot.dead = True
            ray.kill(slot.actor, no_restart=True)
        elif kind == "app":
            # The process is alive; end it so Ray restarts it (after the delay).
            slot.actor.exit_after.remote(policy.restart_delay_s)
        if slot.dead and not policy.ignore:
            reason = ("fault_tolerance(restart_failed_env_runners=False)" if not policy.restart
                      else f"it has used all max_num_env_runner_restarts="
                           f"{policy.max_restarts} restarts")
            self._errors_to_raise.append(EnvRunnerFailedError(
                f"EnvRunner {worker_index} failed ({slot.last_error}) and is lost: {reason}. "
                "Set fault_tolerance(restart_failed_env_runners=True) to restart failed "
                "runners, or ignore_env_runner_failures=True to carry on without them."))
        elif slot.consecutive_failures > policy.consecutive_failures_tolerance:
            self._errors_to_raise.append(EnvRunnerFailedError(
                f"EnvRunner {worker_index} failed {slot.consecutive_failures} times in a row "
                f"(last: {slot.last_error}), more than "
                f"num_consecutive_env_runner_failures_tolerance="
                f"{policy.consecutive_failures_tolerance}."))

    def raise_booked_errors(self) -> None:
        """Raises the first `EnvRunnerFailedError` booked since the last call."""
        if self._errors_to_raise:
            error, self._errors_to_raise = self._errors_to_raise[0], []
            raise error

    def _get(self, worker_index: int, ref: Any, user_errors: list) -> CallResult:
        try:
            value = ray.get(ref)
        except RayError as error:
            kind = classify(error)
            if kind == "user":
                user_errors.append(_cause(error))
            else:
                self.book_failure(worker_index, error, kind)
            return CallResult(worker_index, False, error)
        self._on_success(worker_index)
        return CallResult(worker_index, True, value)

    def _finish(self, user_errors: list) -> None:
        self.raise_booked_errors()
        if user_errors:
            raise user_errors[0]

    # ------------------------------------------------------------------ calls
    def call(self, ids: Iterable[int], submit: Callable[[RunnerSlot], Any], *,
             timeout_s: float | None, return_refs: bool = False
             ) -> tuple[list[CallResult], list[int]]:
        """Submits `submit(slot)` (an ObjectRef) on each runner in `ids` and waits up to
        `timeout_s` (None: no limit). Returns `(results in id order, ids that timed out)`.
        With `return_refs`, returns the references at once, unchecked."""
        self.drain_pending()
        refs = {}
        for worker_index in ids:
            try:
                refs[worker_index] = submit(self.slots[worker_index])
            except RayActorError as error:  # the handle knows the actor is dead
                self.book_failure(worker_index, error, "died")
        if return_refs:
            self.raise_booked_errors()
            return [CallResult(i, True, ref) for i, ref in sorted(refs.items())], []
        by_ref = {ref: i for i, ref in refs.items()}
        ready, not_ready = (ray.wait(list(by_ref), num_returns=len(by_ref), timeout=timeout_s)
                            if by_ref else ([], []))
        user_errors: list = []
        results = [self._get(by_ref[ref], ref, user_errors) for ref in ready]
        timed_out = sorted(by_ref[ref] for ref in not_ready)
        self.num_dropped += len(timed_out)
        self._finish(user_errors)
        return sorted(results, key=lambda r: r.worker_index), timed_out

    def submit_later(self, worker_index: int, ref: Any) -> None:
        """Remembers a fire-and-forget call so its failure is noticed later."""
        self._pending.append((worker_index, ref))

    def drain_pending(self) -> None:
        """Books the outcome of finished fire-and-forget calls."""
        if not self._pending:
            return
        refs = [ref for _, ref in self._pending]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        ready = set(ready)
        user_errors: list = []
        still = []
        for worker_index, ref in self._pending:
            if ref in ready:
                if self.slots[worker_index].healthy:
                    self._get(worker_index, ref, user_errors)
            else:
                still.append((worker_index, ref))
        self._pending = still
        self._finish(user_errors)

    def submit_async(self, ids: Iterable[int], submit: Callable[[RunnerSlot], Any],
                     tag: str | None) -> int:
        """Submits on each healthy runner in `ids` with fewer than `max_in_flight`
        requests in flight; returns how many were submitted (the rest are dropped)."""
        self.drain_pending()
        launched = 0
        for worker_index in ids:
            slot = self.slots[worker_index]
            if not slot.healthy or len(slot.in_flight) >= self.policy.max_in_flight:
                continue
            try:
                slot.in_flight[submit(slot)] = tag
            except RayActorError as error:
                self.book_failure(worker_index, error, "died")
                continue
            launched += 1
        self.raise_booked_errors()
        return launched

    def fetch_ready(self, tags: Iterable[str] | None, timeout_s: float | None,
                    return_refs: bool = False) -> list[CallResult]:
        """Results of async requests (with one of `tags`, or all) ready within
        `timeout_s`."""
        tags = None if tags is None else set(tags)
        owner = {ref: i for i, slot in self.slots.items() for ref, tag in slot.in_flight.items()
                 if tags is None or tag in tags}
        if not owner:
            return []
        ready, _ = ray.wait(list(owner), num_returns=len(owner), timeout=timeout_s)
        user_errors: list = []
        results = []
        for ref in ready:
            worker_index = owner[ref]
            slot = self.slots[worker_index]
            if ref not in slot.in_flight:
                continue  # dropped because the runner failed meanwhile
            del slot.in_flight[ref]
            if return_refs:
                results.append(CallResult(worker_index, True, ref))
            else:
                results.append(self._get(worker_index, ref, user_errors))
        self._finish(user_errors)
        return results

    # ------------------------------------------------------------------ restarts
    def probe(self, timeout_s: float | None) -> list[int]:
        """Pings the unhealthy runners that may come back until they answer or
        `timeout_s` passes; returns the ids that answered (restarted processes). They stay
        unhealthy until `mark_restored`. A runner Ray reports dead for good is lost."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        outstanding: dict[Any, RunnerSlot] = {}

        def send(slot: RunnerSlot) -> None:
            try:
                outstanding[slot.actor.ping.remote()] = slot
            except RayActorError as error:
                slot.last_error = _short(error)

        for worker_index in self.restorable_ids():
            send(self.slots[worker_index])
        answered = []
        while outstanding:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            ready, _ = ray.wait(list(outstanding), num_returns=1, timeout=remaining)
            for ref in ready:
                slot = outstanding.pop(ref)
                try:
                    ray.get(ref)
                except RayError as error:
                    slot.last_error = _short(error)
                    if isinstance(error, ActorUnavailableError) or not self._gone(slot):
                        time.sleep(_RETRY_S)  # still restarting: ask again
                        send(slot)
                    else:
                        self._lose(slot)
                    continue
                answered.append(slot.worker_index)
        self.raise_booked_errors()
        return sorted(answered)

    def _gone(self, slot: RunnerSlot) -> bool:
        """Whether Ray will not bring the runner back (its actor is DEAD)."""
        if not self.policy.restart:
            return True
        state = actor_state(slot.actor)
        return state is None or state == "DEAD"

    def _lose(self, slot: RunnerSlot) -> None:
        slot.dead = True
        if not self.policy.ignore:
            self._errors_to_raise.append(EnvRunnerFailedError(
                f"EnvRunner {slot.worker_index} did not come back after failing "
                f"({slot.last_error}): Ray gave up restarting it (max_num_env_runner_restarts="
                f"{self.policy.max_restarts}). Set ignore_env_runner_failures=True to carry on "
                "without it."))

    def mark_restored(self, worker_index: int) -> None:
        slot = self.slots[worker_index]
        slot.healthy = True
        slot.num_restarts += 1
        self.num_restarts += 1

    def book_restore_failure(self, worker_index: int, error: BaseException) -> None:
        """A restore call failed: the runner stays unhealthy (probed again later)."""
        slot = self.slots[worker_index]
        slot.last_error = _short(error)
        if isinstance(error, GetTimeoutError):
            return
        if classify(error) in ("user", "app"):
            # The state does not fit the restarted runner: restarting again cannot help.
            slot.dead = True
            ray.kill(slot.actor, no_restart=True)
            raise EnvRunnerFailedError(
                f"EnvRunner {worker_index} restarted but its state could not be restored "
                f"({slot.last_error}).") from error
        slot.num_deaths += 1

    def kill_all(self) -> None:
        for slot in self.slots.values():
            try:
                ray.kill(slot.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone, or Ray is shut down
                pass
            slot.healthy = False
            slot.dead = True
            slot.in_flight.clear()
        self._pending = []


__all__ = ["CallResult", "EnvRunnerFailedError", "FaultPolicy", "FaultTolerantActorManager",
           "RunnerSlot", "USER_ERRORS", "classify"]
