"""The SQL of the document stores, for SQLite and PostgreSQL from one place.

Every statement is written once, with ``?`` placeholders; a :class:`Dialect` holds the few
differences between the two databases, each named: the placeholder, the type of a time,
the upsert, how a document's JSON field is read, the UTC day of a time, a case-blind
``LIKE``, how to ask whether a table exists, the database's own clock.
:class:`DocumentSql` builds the documents table's statements for one table in one dialect;
the queries of :class:`tether.Records` use the same dialects (``records/_runs.py``'s
``Tables``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DIALECTS", "POSTGRES", "SQLITE", "Dialect", "DocumentSql"]


@dataclass(frozen=True, slots=True)
class Dialect:
    """What differs between the SQL of SQLite and PostgreSQL, and nothing else."""

    name: str
    placeholder: str  # what a ``?`` is written as
    real: str  # the column type of a time or an amount
    #: how INSERT replaces a document of the same kind and id. They differ in one point:
    #: SQLite replaces the row (its created_at too), PostgreSQL only the body (kept as it
    #: was: a decided approval keeps its time of request there)
    upsert: str
    like: str  # a LIKE that ignores case
    has_table: str  # one row, true when the table named by the parameter exists
    #: the database's own clock, in seconds since the epoch (one clock for every host)
    clock: str

    def __call__(self, sql: str) -> str:
        """``sql`` (written with ``?``) in this dialect's placeholders."""
        return sql if self.placeholder == "?" else sql.replace("?", self.placeholder)

    def field(self, name: str) -> str:
        """A document's top-level JSON field, as text (``name`` is one of ours, never input)."""
        if self.name == "postgres":
            return f"((body::jsonb) ->> '{name}')"
        return f"json_extract(body, '$.{name}')"

    def day(self, column: str) -> str:
        """The UTC day (days since the epoch) of a time column."""
        if self.name == "postgres":
            return f"CAST(FLOOR({column} / 86400) AS BIGINT)"
        return f"CAST({column} / 86400 AS INTEGER)"


SQLITE = Dialect(
    name="sqlite",
    placeholder="?",
    real="REAL",
    upsert="INSERT OR REPLACE INTO {table} VALUES (?, ?, ?, ?)",
    like="LIKE",  # SQLite's LIKE ignores case (of ASCII letters)
    has_table="SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?)",
    clock="SELECT (julianday('now') - 2440587.5) * 86400.0",
)
POSTGRES = Dialect(
    name="postgres",
    placeholder="%s",
    real="DOUBLE PRECISION",
    upsert=(
        "INSERT INTO {table} VALUES (?, ?, ?, ?) ON CONFLICT (kind, id) "
        "DO UPDATE SET body = EXCLUDED.body"
    ),
    like="ILIKE",
    has_table="SELECT to_regclass(?) IS NOT NULL",
    clock="SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)",
)
DIALECTS = {d.name: d for d in (SQLITE, POSTGRES)}


class DocumentSql:
    """The statements of one documents table (kind, id, created_at, body) in one dialect,
    built once."""

    __slots__ = ("create", "delete", "dialect", "get", "list", "put", "table")

    def __init__(self, table: str, dialect: Dialect) -> None:
        self.table, self.dialect = table, dialect
        self.create = dialect(
            f"CREATE TABLE IF NOT EXISTS {table} (kind TEXT NOT NULL, id TEXT NOT NULL, "
            f"created_at {dialect.real} NOT NULL, body TEXT NOT NULL, PRIMARY KEY (kind, id))"
        )
        #: parameters: kind, id, created_at, body
        self.put = dialect(dialect.upsert.format(table=table))
        #: parameters: kind, id
        self.get = dialect(f"SELECT body FROM {table} WHERE kind = ? AND id = ?")
        #: parameters: kind, limit; the newest first
        self.list = dialect(
            f"SELECT id, body FROM {table} WHERE kind = ? ORDER BY created_at DESC LIMIT ?"
        )
        #: parameters: kind, id
        self.delete = dialect(f"DELETE FROM {table} WHERE kind = ? AND id = ?")
