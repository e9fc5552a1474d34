"""tether's own exceptions."""

from __future__ import annotations

from typing import Any

__all__ = [
    "CheckpointError",
    "CircuitOpenError",
    "ControlSignal",
    "DeadlineExceeded",
    "Declined",
    "EffectInProgress",
    "EffectNotRecorded",
    "IdempotencyConflict",
    "LedgerNotShared",
    "LimiterTimeout",
    "MissingExtraError",
    "Picklable",
    "RunDocumentError",
    "StoreUnavailable",
    "TetherError",
    "TransientError",
    "UnknownOutcome",
]


def _rebuilt(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    """An exception as it was pickled: its class, its ``args``, its attributes (its
    ``__init__`` is not called again, so no constructor signature has to match ``args``)."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class Picklable:
    """An exception that survives pickle (DBOS, multiprocessing, Celery): unpickled, it is
    the same class with the same message and attributes. Python rebuilds an exception by
    calling its class with ``args`` (its message), which fails or changes its meaning for
    a class whose ``__init__`` takes other arguments (``Stopped(reason, detail)``)."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        assert isinstance(self, BaseException)
        return (_rebuilt, (type(self), self.args, dict(vars(self))))


class TetherError(Picklable, Exception):
    """Base class of the errors tether raises itself."""


class CheckpointError(TetherError, ValueError):
    """A checkpoint that cannot be used: missing, corrupt, or not tether's."""


class RunDocumentError(CheckpointError):
    """A run document (``run.snapshot()``, a checkpoint, a record, what a framework's state
    holds of a run) that cannot be read or trusted: of an unknown version, the wrong type,
    corrupt, unsigned where a signing key is set, altered, forged, or made for another run or
    request. Nothing runs on it: a run is never continued, or started anew, in its place."""


class ControlSignal(Picklable, BaseException):
    """A framework's control flow (LangGraph's ``interrupt()``) carried through a tool call:
    the call did not happen. Not retried, not recorded; a ledger gives its claim back.
    ``signal`` is the framework's own exception, raised again as it is."""

    def __init__(self, signal: BaseException) -> None:
        super().__init__(type(signal).__name__)
        self.signal = signal


class LedgerNotShared(UserWarning):
    """A run was restored (``guard.restore``, ``guard.resume``, a framework's checkpoint) in
    a process whose ledger cannot see the effects the run made elsewhere: this process's
    in-memory ledger has no record of them, so an effect the restored run asks for again
    runs again. The fix: one ledger for every worker (``Ledger.postgres``, ``.redis``;
    ``.sqlite`` on one machine)."""


class Declined(TetherError):
    """Raise it (or return it) from a side-effect tool whose person said no, or whose business
    rule refused: nothing was done.

    ``raise tether.Declined("the customer did not confirm the booking")``: the run ends
    ``StopReason.DECLINED`` (status ``"failed"``, or ``"partial"`` when other work was done),
    never "done"; the ledger keeps no result for the call, so that a later approved call
    may run. ``reason`` is for the people reading the run, never the customer.
    """

    def __init__(self, reason: str = "") -> None:
        self.reason = reason
        super().__init__(reason or "declined")


class TransientError(Picklable, Exception):
    """Raise it (or a subclass) from your own code to say: this failure may clear, retry it.

    For example a tool whose output failed validation in a way a second call may not.
    """


class DeadlineExceeded(TetherError, TimeoutError):
    """The whole call's deadline would pass before the next attempt could start."""


class CircuitOpenError(TetherError):
    """The breaker is open: the dependency was not called."""

    def __init__(
        self, name: str, retry_at: float, now: float | None = None, *, retry_in: float | None = None
    ) -> None:
        self.name = name
        #: the wall-clock time of the next probe (for people and logs)
        self.retry_at = retry_at
        #: seconds until the next probe, measured on the breaker's own clock: wait this long
        self.retry_in = (
            max(0.0, retry_at - now) if retry_in is None and now is not None else retry_in or 0.0
        )
        wait = "" if now is None and retry_in is None else f"; next probe in {self.retry_in:.1f} s"
        super().__init__(f"circuit {name!r} is open{wait}")


class LimiterTimeout(TetherError):
    """The adaptive limiter could not admit the call before the caller's deadline."""

    def __init__(self, name: str, wait: float) -> None:
        self.name = name
        self.wait = wait
        super().__init__(
            f"limiter {name!r} would admit this call only in {wait:.2f} s, past the deadline"
        )


class UnknownOutcome(TetherError):
    """An earlier attempt of this effect may or may not have happened.

    Raised by :meth:`tether.Ledger.once` when a record is unknown (a timeout, a
    connection reset after sending, a crashed worker) and no ``lookup`` was given, or
    ``lookup`` could not settle it. tether never re-executes such an effect blindly:
    check the provider's records and settle it with ``ledger.resolve(key, result)`` or
    ``ledger.forget(key)``.
    """

    def __init__(self, key: str, detail: str = "") -> None:
        self.key = key
        msg = (
            f"effect {key[:16]}… may already have happened and nothing could confirm it; "
            "pass lookup= to read the provider's records, or settle it with "
            "ledger.resolve(key, result) / ledger.forget(key)"
        )
        super().__init__(f"{msg} ({detail})" if detail else msg)


class EffectNotRecorded(UnknownOutcome):
    """The effect ran, but the ledger could not record its result.

    The store failed, forgot the record (a Redis restarted without persistence), or
    another worker took the claim over. ``result`` holds what the effect returned; the
    ledger's record stays unknown, so no later attempt runs the effect again without
    asking ``lookup`` first.
    """

    def __init__(self, key: str, result: object, why: str) -> None:
        self.key = key
        self.result = result
        self.why = why
        TetherError.__init__(
            self,
            f"effect {key[:16]}… ran, but its result could not be recorded: {why}. The outcome "
            "is unknown to the ledger: check the provider's records, then settle it with "
            "ledger.resolve(key, result) or ledger.forget(key)",
        )


class EffectInProgress(TetherError):
    """Another worker holds this effect's claim and its lease has not expired."""

    def __init__(self, key: str, lease_until: float) -> None:
        self.key = key
        self.lease_until = lease_until
        super().__init__(f"effect {key[:16]}… is being executed by another worker")


class IdempotencyConflict(TetherError, ValueError):
    """The same intent key was used with different arguments."""


class StoreUnavailable(TetherError):
    """A shared store (Redis, PostgreSQL) could not be reached."""


class MissingExtraError(TetherError, ImportError):
    """An optional dependency is not installed."""

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(
            f"{module} is not installed; install it with: pip install 'tether[{extra}]'"
        )


def require(module: str, extra: str) -> object:
    """Import an optional dependency or say which extra brings it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(module, extra) from exc
