"""Worker processes of the live suites, started together: each says when it is ready, then
puts its one result on a queue."""

from __future__ import annotations

import queue as queue_mod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tether.bench._interrupt import interrupt_ignored

__all__ = ["Workers", "start_workers"]


@dataclass(frozen=True, slots=True)
class Workers:
    """Worker processes started together, each putting its one result on ``result_q``."""

    procs: list[Any]
    result_q: Any

    def results(self, timeout: float) -> list[dict[str, Any]]:
        """The workers' results, until none comes for ``timeout`` seconds; then each is
        joined."""
        results = []
        for _ in self.procs:
            try:
                results.append(self.result_q.get(timeout=timeout))
            except queue_mod.Empty:
                break
        for p in self.procs:
            p.join(timeout=5)
        return results


def start_workers(
    ctx: Any,
    target: Callable[..., None],
    args: Sequence[Mapping[str, Any]],
    ready_timeout: float | None = None,
) -> Workers:
    """A process of ``target`` per keyword arguments in ``args``, each also given the
    queue of its result (``result_q``); with a ``ready_timeout``, each is also given a
    ``ready_q`` to say it is ready on (its imports done), and this returns when all are."""
    result_q = ctx.Queue()
    ready_q = ctx.Queue() if ready_timeout is not None else None
    queues = (
        {"result_q": result_q} if ready_q is None else {"result_q": result_q, "ready_q": ready_q}
    )
    procs = [ctx.Process(target=target, kwargs={**a, **queues}, daemon=True) for a in args]
    with interrupt_ignored():  # the parent stops them (bench._interrupt)
        for p in procs:
            p.start()
    if ready_q is not None:
        for _ in procs:
            ready_q.get(timeout=ready_timeout)
    return Workers(procs, result_q)
