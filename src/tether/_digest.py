"""SHA-256 without loading OpenSSL in a process that hashes little.

``import hashlib`` loads OpenSSL and lists its digests: about 11 M instructions, a fifth of
what a first guarded run costs over ``import tether``. Python's own SHA-256 (``_sha256``;
``_sha2`` from 3.12) gives the same digest without it, but slower per byte (OpenSSL's uses
the CPU's SHA instructions). tether hashes with Python's until it has hashed
:data:`BUDGET` bytes (about what loading OpenSSL costs at its slower speed), then with
OpenSSL's: a short-lived process never loads OpenSSL, a long one pays for it once.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["BUDGET", "sha256", "spend"]

#: bytes hashed with Python's SHA-256 before switching to OpenSSL's
BUDGET = 64 * 1024


class Hash(Protocol):
    def update(self, data: bytes, /) -> None: ...
    def hexdigest(self) -> str: ...


def _builtin() -> Any:
    try:
        if sys.version_info >= (3, 12):
            from _sha2 import sha256
        else:
            from _sha256 import sha256  # type: ignore[import-not-found]
    except ImportError:  # a Python built without its own hashes
        return None
    return sha256


_own = _builtin()
_left = BUDGET if _own is not None else -1  # none of its own: hashlib's from the start


def _counted(data: bytes = b"") -> Hash:
    """Python's SHA-256 of ``data`` while the budget lasts, then OpenSSL's."""
    spend(len(data))
    return (_own or sha256)(data)


def spend(size: int) -> None:
    """Count ``size`` more bytes given to a hash's ``update``; switch to OpenSSL's
    SHA-256 once the budget is spent."""
    global _left, sha256
    _left -= size
    if _left < 0 and sha256 is _counted:
        import hashlib

        sha256 = hashlib.sha256


#: ``hashlib.sha256`` as it is called (``sha256(data).hexdigest()``; ``update`` more):
#: Python's own until :data:`BUDGET` bytes were hashed, then hashlib's itself; read it
#: from the module (``_digest.sha256``), as it changes
sha256: Callable[[bytes], Hash] = _counted
