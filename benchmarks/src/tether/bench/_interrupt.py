"""Ctrl-C on ``tether bench``: the parent stops its processes at once, the children stay quiet.

A terminal's Ctrl-C sends SIGINT to the whole process group. The worker processes (the
pools' and the live suites' workers and providers) ignore it: a ``KeyboardInterrupt`` in
each would print its own traceback, and a pool's worker would go on to its next cell, so
the parent waited for every cell (about 90 s of the fleet suite) before it could stop.
The parent terminates them instead (:func:`stop_children`) and says one line.
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ignore_interrupt", "interrupt_ignored", "stop_children"]


def ignore_interrupt() -> None:
    """A pool's ``initializer``: this process ignores SIGINT (its parent stops it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextmanager
def interrupt_ignored() -> Iterator[None]:
    """Processes started inside ignore SIGINT (an ignored signal is inherited, and Python
    started so keeps ignoring it); the parent's own handler is back after."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers are the main thread's to change
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def stop_children(grace: float = 1.0) -> int:
    """Terminate every child process of this one (SIGTERM, then SIGKILL after ``grace``
    seconds); returns how many there were."""
    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(grace)
        if child.is_alive():
            child.kill()
            child.join(grace)
    return len(children)
