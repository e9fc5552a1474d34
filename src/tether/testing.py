"""Helpers for testing code that uses tether: virtual time and captured events."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from tether.clock import VirtualClock
from tether.guards._breaker import breakers
from tether.stores._memory import default_store

__all__ = ["VirtualClock", "capture_events", "capture_logs", "reset", "tether_reset"]


def reset() -> None:
    """Forget all process-wide state: the default store, the breaker registry, the
    warnings already given about unpriced models."""
    from tether.run import _pricing

    breakers.clear()
    default_store.reset()
    with _pricing._warned_lock:
        _pricing._warned.clear()


@contextlib.contextmanager
def capture_events() -> Iterator[list[object]]:
    """Collect the frozen events of the block: RetryEvent, BreakerEvent and Outcome."""
    from tether import telemetry

    events: list[object] = []
    for name in ("retry", "breaker_change", "stop"):
        telemetry.subscribe(name, events.append)
    try:
        yield events
    finally:
        for name in ("retry", "breaker_change", "stop"):
            telemetry.unsubscribe(name, events.append)


@contextlib.contextmanager
def capture_logs(level: int = logging.DEBUG) -> Iterator[list[logging.LogRecord]]:
    """Collect the records of the ``tether`` logger inside the block."""
    records: list[logging.LogRecord] = []

    class _Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("tether")
    handler = _Handler(level)
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def _fixture() -> object:
    try:
        import pytest
    except ImportError:  # pragma: no cover - only for test suites
        return None

    @pytest.fixture
    def tether_reset() -> Iterator[None]:
        """A pytest fixture: tether's process-wide state reset before and after the test.

        Enable it with ``pytest_plugins = ["tether.testing"]`` in your ``conftest.py``.
        """
        reset()
        yield
        reset()

    return tether_reset


tether_reset = _fixture()
