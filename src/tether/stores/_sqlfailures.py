"""What a SQL store's failure means, for every store on PostgreSQL or SQLite (the ledger, the
documents: checkpoints, dead letters, handoffs, approvals, run records; the budget scopes).

Two kinds, and nothing in between:

- the database cannot be used *now*: it did not answer (a connection refused or broken, the
  pool empty), or it refused the statement for a reason of the moment (a read-only standby
  after a failover, ``lock_timeout`` or ``statement_timeout`` ran out, the server shutting
  down, too many connections, a full disk, a file locked by another process). That is
  :class:`tether.StoreUnavailable`, transient, naming the store, where it is (the DSN
  without its password) and the cause (its SQLSTATE); what it guarded does not run.
- the statement itself is wrong (a programming or schema error: a missing table or column,
  a right the role lacks, bad data): trying again changes nothing. The driver's own error is
  raised as it was (classified permanent), with a note naming the store and the cause.

A transaction the server rolled back to keep transactions serialisable (SQLSTATE ``40001``
``serialization_failure``, ``40P01`` ``deadlock_detected``) is safe to run again:
:data:`TX_ATTEMPTS` attempts in all (:func:`tx_backoff` apart), then StoreUnavailable.
"""

from __future__ import annotations

import re

from tether._errors import StoreUnavailable
from tether.redaction._redact import safe_url

__all__ = [
    "RETRIED_STATES",
    "TX_ATTEMPTS",
    "pg_unavailable",
    "retried",
    "safe_dsn",
    "sqlite_unavailable",
    "tx_backoff",
]

#: SQLSTATEs of a transaction the server rolled back whole, safe to run again
RETRIED_STATES = frozenset({"40001", "40P01"})
#: attempts of such a transaction, the first included
TX_ATTEMPTS = 3

#: SQLSTATE classes of a database that cannot be used now: connection exception, transaction
#: rollback, insufficient resources, object not in prerequisite state (a lock not
#: available), operator intervention (shutdown, a cancelled statement), system error
_TRANSIENT_CLASSES = frozenset({"08", "40", "53", "55", "57", "58"})
#: and single states of other classes: a read-only transaction (a standby), the idle and
#: transaction timeouts
_TRANSIENT_STATES = frozenset({"25006", "25P03", "25P04"})
_WHY = {
    "25006": "the database is read-only (a standby after a failover?)",
    "55P03": "lock_timeout ran out while another session held a lock",
    "57014": "statement_timeout ran out, or the statement was cancelled",
    "57P01": "the server is shutting down, or an administrator ended the session",
    "57P03": "the server is not accepting connections yet",
    "53300": "the server has too many connections",
    "40001": "a serialization failure: the transaction was rolled back",
    "40P01": "a deadlock: the transaction was rolled back",
}
_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)", re.IGNORECASE)

# SQLite's primary result codes of a file that cannot be used now: busy, locked, out of
# memory, read-only, interrupted, an I/O error, full, cannot be opened, a lock protocol error
_SQLITE_TRANSIENT = frozenset({5, 6, 7, 8, 9, 10, 13, 14, 15})


def safe_dsn(dsn: str) -> str:
    """A DSN without its password, as a URL (``postgresql://user:pw@host``) or as keywords
    (``host=... password=...``)."""
    return _PASSWORD.sub(r"\1***", safe_url(dsn))


def retried(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what it was raised from) is a transaction the server rolled back
    whole (serialization failure, deadlock): safe to run again."""
    while exc is not None:
        if getattr(exc, "sqlstate", None) in RETRIED_STATES:
            return True
        exc = exc.__cause__
    return False


def tx_backoff(attempt: int) -> float:
    """Seconds to wait before attempt ``attempt + 1`` of a rolled-back transaction: a few
    milliseconds, doubling, jittered (two transactions that collided do not collide again)."""
    import random

    return random.uniform(0.0, 0.005 * 2**attempt)


def _said(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {safe_dsn(text[0])}" if text else type(exc).__name__


def pg_unavailable(
    exc: BaseException, who: str, dsn: str, *, attempts: int = 1
) -> StoreUnavailable | None:
    """:class:`StoreUnavailable` for ``exc``, raised by psycopg or its pool while ``who``
    (``"the ledger"``, ``"the documents (table t)"``) used PostgreSQL at ``dsn``, when the
    database cannot be used now; None for a programming or schema error, after adding a note
    to ``exc`` naming the store (the caller raises ``exc`` itself). ``attempts``: how many
    times the statement was sent (said when more than once)."""
    import psycopg

    where = safe_dsn(dsn)
    state = getattr(exc, "sqlstate", None)
    if state is None:
        if isinstance(exc, psycopg.Error) and not isinstance(
            exc, psycopg.OperationalError | psycopg.InterfaceError
        ):  # refused by the driver itself: a wrong statement or parameters
            exc.add_note(f"{who}'s PostgreSQL at {where}: the statement is wrong; not retried")
            return None
        return StoreUnavailable(f"{who}'s PostgreSQL at {where} did not answer ({_said(exc)})")
    if state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_STATES:
        why = _WHY.get(state)
        return StoreUnavailable(
            f"{who}'s PostgreSQL at {where} refused the statement (SQLSTATE {state}, "
            f"{_said(exc)}{'; ' + why if why else ''}"
            f"{f'; {attempts} attempts' if attempts > 1 else ''})"
        )
    exc.add_note(
        f"{who}'s PostgreSQL at {where} (SQLSTATE {state}): a programming or schema error "
        "(a missing table or column, a right the role lacks, bad data); trying again "
        "cannot help, so it was not retried"
    )
    return None


def sqlite_unavailable(exc: BaseException, who: str, path: str) -> StoreUnavailable | None:
    """The same for ``exc``, raised by sqlite3 while ``who`` used the SQLite file ``path``:
    :class:`StoreUnavailable` for a file locked past the timeout, read-only, full or out of
    reach; None (and a note on ``exc``) for a wrong statement, a closed connection, a file
    that is not a database."""
    import sqlite3

    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(exc, sqlite3.OperationalError) and (
        code is None or code & 0xFF in _SQLITE_TRANSIENT
    ):
        name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
        return StoreUnavailable(
            f"{who}'s SQLite file {path!r} could not be used ({name}: {str(exc).strip()}; "
            "another process holding it past the timeout, a read-only or full disk?)"
        )
    exc.add_note(
        f"{who}'s SQLite file {path!r}: the statement or the file is wrong (not a database, "
        "a missing table, a closed store); trying again cannot help, so it was not retried"
    )
    return None
