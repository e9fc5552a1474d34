"""Secrets out of text that leaves tether."""

from __future__ import annotations

import re

__all__ = ["safe_url"]

_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]*@")


def safe_url(url: str) -> str:
    """A URL (or a text holding URLs) without user and password, for logs, errors, reprs.

    >>> safe_url("redis://:hunter2@cache:6379/0")
    'redis://***@cache:6379/0'
    """
    return _CREDENTIALS.sub("***@", url)
