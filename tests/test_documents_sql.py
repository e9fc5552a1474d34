"""The document stores of SQLite and PostgreSQL run the statements built in one place
(stores/_sql.py) and answer alike."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tether.stores._documents import PostgresDocuments, SqliteDocuments
from tether.stores._sql import POSTGRES, SQLITE, DocumentSql


@pytest.fixture(params=["sqlite", "postgres"])
def docs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "sqlite":
        store: Any = SqliteDocuments(str(tmp_path / "docs.db"))
    else:
        table = f"t_docs_{uuid.uuid4().hex[:8]}"
        store = PostgresDocuments(request.getfixturevalue("pg_dsn"), table)
    yield store
    if isinstance(store, PostgresDocuments):
        with store.sql(write=True) as sql:
            sql.run(f"DROP TABLE {store.table}")
    store.close()


def test_put_get_list_delete(docs: Any) -> None:
    """The same operations give the same answers on both databases."""
    for i in range(5):
        docs.put("note", f"n{i}", {"i": i}, 100.0 + i)
    docs.put("other", "n0", {"other": True}, 50.0)
    assert docs.get("note", "n3") == '{"i": 3}'
    assert docs.get("note", "missing") is None
    assert docs.list("note", 3) == [("n2", '{"i": 2}'), ("n3", '{"i": 3}'), ("n4", '{"i": 4}')]
    docs.put("note", "n3", {"i": "again"}, 103.0)  # replaces the body
    assert docs.get("note", "n3") == '{"i": "again"}'
    docs.delete("note", "n3")
    assert docs.get("note", "n3") is None
    assert [i for i, _ in docs.list("note", 10)] == ["n0", "n1", "n2", "n4"]
    assert docs.list("other", 10) == [("n0", '{"other": true}')]


def test_the_statements_differ_only_by_the_dialect() -> None:
    """One text per statement: SQLite's and PostgreSQL's differ in placeholders, the type
    of a time and the upsert, nothing else."""
    lite, pg = DocumentSql("t", SQLITE), DocumentSql("t", POSTGRES)
    for name in ("get", "list", "delete"):
        assert getattr(pg, name) == getattr(lite, name).replace("?", "%s")
    assert pg.create == lite.create.replace("REAL", "DOUBLE PRECISION")
    assert lite.put == "INSERT OR REPLACE INTO t VALUES (?, ?, ?, ?)"
    assert pg.put.startswith("INSERT INTO t VALUES (%s, %s, %s, %s) ON CONFLICT (kind, id)")
