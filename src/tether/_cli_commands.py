"""Subcommands of the ``tether`` command line; each adds itself here."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add every subcommand to the parser's subparsers."""
    _ = argparse  # subcommands arrive with their features
