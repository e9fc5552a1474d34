"""What ``--db`` names, checked before a command opens it.

``--db`` is a SQLite file's path or a PostgreSQL DSN (``postgresql://``, ``postgres://``, or
keywords ``host=... dbname=...``; SQLAlchemy's ``postgresql+psycopg://`` is read as
``postgresql://``). Any other URL is refused, naming the schemes taken. A DSN is tried with
one connection before the command opens its pool; a path must be a file. The read-only
commands (``dlq list|show``, ``records list|show``) look for tether's tables without
writing: a file or database without them is not a tether database, and nothing is created.
Whatever is printed of ``--db`` has its password masked.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

__all__ = [
    "READ_ONLY",
    "checked",
    "missing_tables",
    "one_line",
    "runs_filed",
    "scopes_filed",
    "shown_db",
]

#: a URL's scheme (``mysql://``, ``postgresql+psycopg://``)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
#: the schemes libpq reads, and SQLAlchemy's driver suffix on them (``+psycopg``)
_POSTGRES = re.compile(r"^(postgresql|postgres)(\+[A-Za-z0-9_]+)?$", re.IGNORECASE)
#: the commands that only read: they never create a table
READ_ONLY = frozenset(
    {("dlq", "list"), ("dlq", "show"), ("records", "list"), ("records", "show"), ("scopes", "list")}
)
#: the budget scopes' tables in a records database (``Records.scopes()``)
SCOPES_TABLES = frozenset({"tether_scopes", "tether_scope_calls", "tether_scope_waiting"})
#: the schemes ``--db`` takes, as the refusal names them
TAKEN = "postgresql://, postgres:// or postgresql+psycopg:// (read as postgresql://)"


def shown_db(where: str) -> str:
    """``where`` as the CLI prints it: any URL's password, and a ``password=`` keyword,
    masked."""
    from tether.stores._sqlfailures import safe_dsn

    return scrubbed(safe_dsn(where), where)


def checked(args: argparse.Namespace, store: str) -> tuple[int, str] | None:
    """Check ``args.db`` before the command opens it: None when it may go on (a SQLAlchemy
    URL rewritten in ``args.db`` as libpq reads it), else the exit code and the line to
    print (2: what was given is wrong; 1: the server did not answer). ``store`` names
    what ``--db`` holds (``the records``)."""
    where = getattr(args, "db", None)
    if not isinstance(where, str):
        return None
    scheme = _SCHEME.match(where)
    if scheme is not None:
        driver = _POSTGRES.match(scheme.group(1))
        if driver is None:
            return 2, (
                f"{shown_db(where)}: tether cannot read a {scheme.group(1)}:// URL; --db takes "
                f"a SQLite file's path or a PostgreSQL DSN: {TAKEN}"
            )
        where = args.db = f"{driver.group(1).lower()}://{where[scheme.end() :]}"
    # scopes in a table of another name (--table): its own tables, not looked for here
    reads_only = (args.command, action_of(args)) in READ_ONLY and (
        getattr(args, "table", "tether_documents") == "tether_documents"
    )
    from tether.records._records import Records

    if Records.is_dsn(where):
        return _postgres(where, store, reads_only)
    if os.path.isdir(where):
        return 2, f"{shown_db(where)} is a directory, not a file ({_GIVE})"
    if not os.path.isfile(where):
        return 2, f"{shown_db(where)}: no such file ({_GIVE})"
    if not reads_only:
        return None
    import sqlite3

    try:
        tables = _sqlite_tables(where)
    except sqlite3.DatabaseError as exc:
        if "not a database" not in str(exc):  # e.g. unreadable: the command says why
            return None
        return 2, f"{shown_db(where)}: not a tether database (file is not a database)"
    return _not_tether(where, tables)


#: what ``--db`` should be, as a refusal ends
_GIVE = "give the SQLite file your Records.sqlite(...) writes, or a PostgreSQL DSN"


def action_of(args: argparse.Namespace) -> str:
    """The command's action (``list`` of ``tether dlq list``), or ""."""
    for name in ("dlq_command", "records_command", "scopes_command"):
        value = getattr(args, name, None)
        if isinstance(value, str):
            return value
    return ""


def _not_tether(where: str, tables: set[str], what: str = "") -> tuple[int, str] | None:
    if "tether_documents" in tables:
        return None
    what = what or ("an empty database" if not tables else "a database without tether's tables")
    return 2, (
        f"{shown_db(where)}: not a tether database ({what}; nothing was created there: a "
        "guard given Records.sqlite(path) or Records.postgres(dsn) files its records)"
    )


def _sqlite_tables(path: str) -> set[str]:
    """The tables of the SQLite file at ``path``, read without writing (``mode=ro``)."""
    import sqlite3
    from urllib.parse import quote

    db = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    finally:
        db.close()
    return {str(name) for (name,) in rows}


def _records_tables() -> set[str]:
    """The tables ``Records`` creates when it opens a database that lacks them."""
    from types import SimpleNamespace

    from tether.records._runs import Tables

    tables = Tables.of(SimpleNamespace(table="tether_documents", dialect="sqlite"))
    made = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+)")
    return {tables.docs} | {m.group(1) for s in tables.schema() if (m := made.match(s))}


def missing_tables(where: str) -> set[str]:
    """Which of the tables ``Records`` needs ``where`` lacks (read, never written)."""
    wanted = _records_tables()
    from tether.records._records import Records

    if not Records.is_dsn(where):
        return wanted - _sqlite_tables(where)
    import psycopg

    with psycopg.connect(where, connect_timeout=3) as conn:
        return wanted - _pg_tables(conn, wanted)


def scopes_filed(where: str) -> bool:
    """Whether the tether database at ``where`` has budget scopes' tables that ``Records``
    can open without creating one. Read, never written."""
    wanted = set(SCOPES_TABLES)
    from tether.records._records import Records

    if Records.is_dsn(where):
        import psycopg

        with psycopg.connect(where, connect_timeout=3) as conn:
            return not missing_tables(where) and _pg_tables(conn, wanted) == wanted
    return not missing_tables(where) and wanted <= _sqlite_tables(where)


def runs_filed(where: str) -> bool:
    """Whether the tether database at ``where`` may hold runs: ``Records`` can open it
    without creating a table, or run records wait there to be indexed (a database an older
    tether filed, which ``Records`` brings up to date once). Read, never written."""
    if not missing_tables(where):
        return True
    query = "SELECT 1 FROM tether_documents WHERE kind = 'run' LIMIT 1"
    from tether.records._records import Records

    if Records.is_dsn(where):
        import psycopg

        with psycopg.connect(where, connect_timeout=3) as conn:
            return conn.execute(query).fetchone() is not None
    import sqlite3
    from urllib.parse import quote

    db = sqlite3.connect(f"file:{quote(os.path.abspath(where))}?mode=ro", uri=True)
    try:
        return db.execute(query).fetchone() is not None
    finally:
        db.close()


def _pg_tables(conn: Any, names: set[str]) -> set[str]:
    """Which of ``names`` the connection's search path finds."""
    rows = conn.execute(
        "SELECT name FROM unnest(%s::text[]) AS name WHERE to_regclass(name) IS NOT NULL",
        (sorted(names),),
    ).fetchall()
    return {str(name) for (name,) in rows}


def _postgres(dsn: str, store: str, reads_only: bool) -> tuple[int, str] | None:
    """One connection, given 3 seconds, before the command opens its pool (which waits
    10 s for a server that is not there): None when it connects (or psycopg is not
    installed: the store says so) and, for a read-only command, tether's tables are there;
    else the exit code (2: what was given is wrong, a DSN libpq cannot read or the server
    refused, e.g. no such database or role; 1: it did not answer) and the line."""
    try:
        import psycopg
    except ImportError:
        return None
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            if not reads_only:
                return None
            tables = _pg_tables(conn, {"tether_documents"})
    except psycopg.Error as exc:
        text = one_line(exc)
        # "connection is bad: invalid sslmode value": libpq read the DSN and tried no server
        malformed = isinstance(exc, psycopg.ProgrammingError) or text.startswith(
            "connection is bad:"
        )
        reason = text.removeprefix("connection is bad:").rsplit(" failed: ", 1)[-1]
        refused = reason.startswith("FATAL:")
        reason = " ".join(reason.removeprefix("FATAL:").split())
        cannot = f"cannot use {store} at {shown_db(dsn)}: {shown_db(reason)}"
        if malformed:
            return 2, scrubbed(f"{cannot} (a malformed DSN)", dsn)
        if refused:
            return 2, scrubbed(cannot, dsn)
        return 1, scrubbed(f"{cannot} (is the server up and the address right?)", dsn)
    return _not_tether(dsn, tables, "no tether_documents table on its search_path")


def scrubbed(text: str, dsn: str) -> str:
    """``text`` without the DSN's password, however the driver quoted it: libpq repeats the
    part of a malformed URL it could not read (``invalid percent-encoded token: "pw"``) and
    splits a password holding ``@`` at the wrong place (``failed to resolve host
    'rest@host'``), so each piece of the password is masked where it appears."""
    from urllib.parse import unquote

    password = ""
    _, sep, rest = dsn.partition("://")
    if sep:
        authority = rest.split("/", 1)[0].split("?", 1)[0]
        userinfo = authority.rpartition("@")[0]
        password = userinfo.partition(":")[2]
    else:  # keywords: password=... (quoted or not)
        found = re.search(r"password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", dsn, re.IGNORECASE)
        password = found.group(1).strip("'") if found else ""
    pieces = {password, unquote(password)}
    for piece in list(pieces):
        pieces.update(piece.replace(":", "@").split("@"))
    for piece in sorted(pieces, key=len, reverse=True):
        if len(piece) >= 3:
            text = text.replace(piece, "***")
    return text


def one_line(exc: BaseException) -> str:
    """The first line of an error's text (its type's name when it has none)."""
    lines = str(exc).strip().splitlines()
    return lines[0].strip() if lines else type(exc).__name__
