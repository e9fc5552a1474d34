"""Run documents signed and checked: HMAC-SHA256 over a document's canonical form.

``Guard(signing_key=...)`` (default ``$TETHER_SIGNING_KEY``) signs every run document it
writes with its first key and accepts one signed with any of its keys (a list rotates keys:
put the new key first, drop the old one once no document signed with it is in flight). With
a key, a document that is unsigned, altered or forged is refused
(:class:`tether.RunDocumentError`) before anything runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from tether._errors import RunDocumentError

__all__ = ["ENV", "SIGNATURE", "sign", "signing_keys", "verify"]

#: the environment variable a guard reads its signing key from when given none
ENV = "TETHER_SIGNING_KEY"
#: the field of a run document that holds its signature
SIGNATURE = "signature"
#: what a signature starts with: the scheme, so that another one can follow
_SCHEME = "hmac-sha256:"


def signing_keys(value: Any) -> tuple[bytes, ...]:
    """The keys of ``Guard(signing_key=value)``: one key (bytes or str), a list of them
    (the first signs, any verifies), or None for ``$TETHER_SIGNING_KEY`` (unset or empty:
    no key, documents are not signed)."""
    if value is None:
        found = os.environ.get(ENV, "")
        return (found.encode(),) if found else ()
    given = [value] if isinstance(value, (str, bytes)) else value
    try:
        keys = list(given)
    except TypeError:
        raise TypeError(
            f"signing_key must be bytes, a str, a list of them or None, got {value!r:.40}"
        ) from None
    out = []
    for key in keys:
        if not isinstance(key, (str, bytes)) or not key:
            raise ValueError(
                "signing_key must be non-empty bytes or str (or a list of them, the first "
                f"signing), got {type(key).__name__}"
            )
        out.append(key.encode() if isinstance(key, str) else bytes(key))
    if not out:
        raise ValueError("signing_key is an empty list: give at least one key, or None")
    return tuple(out)


def _canonical(doc: Mapping[str, Any], bound: str) -> bytes:
    """The text a signature covers: the document without its signature (keys sorted, no
    spaces, UTF-8) and what it is bound to (the request a framework serves it for)."""
    body = {k: v for k, v in doc.items() if k != SIGNATURE}
    try:
        text = json.dumps(
            body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise RunDocumentError(f"run document is not plain JSON data ({exc})") from None
    return f"{bound}\n{text}".encode()


def sign(doc: Mapping[str, Any], keys: tuple[bytes, ...], bound: str = "") -> str:
    """The signature of ``doc`` with the first of ``keys``."""
    import hashlib  # only a guard with a signing key signs
    import hmac

    return _SCHEME + hmac.new(keys[0], _canonical(doc, bound), hashlib.sha256).hexdigest()


def verify(doc: Mapping[str, Any], keys: tuple[bytes, ...], bound: str = "") -> None:
    """Check ``doc``'s signature against ``keys`` (none: nothing to check); raise
    :class:`tether.RunDocumentError` for a document unsigned, altered or forged."""
    if not keys:
        return
    said = doc.get(SIGNATURE)
    if not isinstance(said, str) or not said.startswith(_SCHEME):
        raise RunDocumentError(
            "run document is not signed, and this guard signs its documents (signing_key / "
            f"${ENV}): refused; nothing ran (a document written before the key was set, or "
            "by a deployment without it, cannot be continued)"
        )
    import hashlib  # only a guard with a signing key checks
    import hmac

    text = _canonical(doc, bound)
    for key in keys:
        mine = _SCHEME + hmac.new(key, text, hashlib.sha256).hexdigest()
        if hmac.compare_digest(mine, said):
            return
    raise RunDocumentError(
        "run document's signature does not match (altered, forged, made for another request, "
        "or signed with a key this guard does not hold): refused; nothing ran"
    )
