"""PostgreSQL sessions for the store tests: a DSN whose sessions carry a server setting."""

from __future__ import annotations

__all__ = ["with_setting"]


def with_setting(dsn: str, setting: str) -> str:
    """``dsn`` with a server setting for its sessions (``options=-c name=value``)."""
    return f"{dsn}{'&' if '?' in dsn else '?'}options=-c%20{setting.replace('=', '%3D')}"
