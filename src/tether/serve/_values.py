"""Values on the page: cut to a preview (with a link to the whole), redacted either way.

A record can hold a 5 MB tool result. The page shows a preview of each value (strings cut
at :data:`STRING_CHARS`, lists and objects at :data:`ITEMS` entries, at most
:data:`PREVIEW_CHARS` in all), redacted after it is cut, so that drawing a page never
redacts or renders megabytes. The whole value is served on its own address, redacted
piece by piece (a long string in pieces cut at line breaks or spaces), so that no single
redaction holds the interpreter for long.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from tether.redaction._redact import masks_pii, redact

__all__ = ["Cut", "Preview", "at_path", "preview", "redact_whole", "run_view", "shown"]

STRING_CHARS = 2_000
ITEMS = 50
PREVIEW_CHARS = 20_000
#: a string is cut this much past its preview before redaction, so that a secret that
#: straddles the cut is still whole when redacted (a PEM key is under 4 KB)
MARGIN = 4_096
PIECE = 64 * 1024
#: records larger than this are read (parsed and cut) in a worker process, so that the
#: server's own interpreter never holds its lock for a megabyte of JSON
BIG = 512 * 1024
_CUT = "…"


@dataclass(frozen=True, slots=True)
class Preview:
    """A value as the page shows it: ``text`` (JSON, redacted), whether it was ``cut``,
    and the size of the whole value's JSON (characters)."""

    text: str
    cut: bool
    size: int


class _Cutter:
    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.cut = False

    def walk(self, value: Any, depth: int = 0) -> Any:
        if self.budget <= 0 or depth > 20:
            self.cut = True
            return _CUT
        if isinstance(value, str):
            self.budget -= min(len(value), STRING_CHARS)
            if len(value) > STRING_CHARS:
                self.cut = True
                return value[: STRING_CHARS + MARGIN]
            return value
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            for i, (k, v) in enumerate(value.items()):
                if i >= ITEMS or self.budget <= 0:
                    self.cut = True
                    out[_CUT] = f"{len(value) - i} more"
                    break
                self.budget -= len(str(k)) + 4
                out[str(k)] = self.walk(v, depth + 1)
            return out
        if isinstance(value, list | tuple):
            items: list[Any] = []
            for i, v in enumerate(value):
                if i >= ITEMS or self.budget <= 0:
                    self.cut = True
                    items.append(f"{_CUT} {len(value) - i} more")
                    break
                items.append(self.walk(v, depth + 1))
            return items
        self.budget -= 8
        return value


def _trim(value: Any) -> Any:
    """Strings back to their preview length, once redacted."""
    if isinstance(value, str):
        if len(value) > STRING_CHARS:
            return value[:STRING_CHARS] + f"{_CUT} ({len(value) - STRING_CHARS} more characters)"
        return value
    if isinstance(value, dict):
        return {k: _trim(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_trim(v) for v in value]
    return value


def _size(value: Any) -> int:
    """The length of ``value``'s JSON, without making it for a large string."""
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, dict):
        return 2 + sum(len(str(k)) + 4 + _size(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return 2 + sum(_size(v) + 2 for v in value)
    return len(json.dumps(value, default=str))


@dataclass(frozen=True, slots=True)
class Cut:
    """A value cut for a preview, not yet redacted (what a worker process hands back)."""

    value: Any
    cut: bool
    size: int


def cut(value: Any, budget: int = PREVIEW_CHARS) -> Cut:
    cutter = _Cutter(budget)
    small = cutter.walk(value)
    return Cut(small, cutter.cut, _size(value) if cutter.cut else 0)


def shown(c: Cut) -> Preview:
    """A cut value redacted, as indented JSON."""
    text = json.dumps(_trim(redact(c.value)), indent=2, ensure_ascii=False, default=str)
    return Preview(text, c.cut, c.size if c.cut else len(text))


def preview(value: Any, budget: int = PREVIEW_CHARS) -> Preview:
    """``value`` cut, then redacted, as indented JSON."""
    return shown(cut(value, budget))


def short(value: Any, chars: int = STRING_CHARS) -> Any:
    """Every string of ``value`` at most ``chars`` long (the fields a page shows as text)."""
    if isinstance(value, str):
        return value if len(value) <= chars else value[:chars] + _CUT
    if isinstance(value, dict):
        return {k: short(v, chars) for k, v in value.items()}
    if isinstance(value, list):
        if len(value) > 1000:
            value = value[-1000:]
        return [short(v, chars) for v in value]
    return value


def at_path(doc: Any, path: str) -> Any:
    """The value at ``path`` (``partial.3.result``: keys and list indexes, by dots)."""
    value = doc
    for part in path.split(".") if path else ():
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            raise LookupError(f"this record has no value at {path!r}")
    return value


def _pieces(text: str) -> list[str]:
    """``text`` in pieces of about :data:`PIECE`, cut after a line break (or a space)."""
    out, start = [], 0
    while len(text) - start > PIECE:
        end = start + PIECE
        window = text[end - MARGIN : end]
        cut = max(window.rfind("\n"), window.rfind(" "))
        end = end - MARGIN + cut + 1 if cut >= 0 else end
        out.append(text[start:end])
        start = end
    out.append(text[start:])
    return out


def redact_whole(value: Any) -> Any:
    """``value`` redacted whole: fields by name, and each long string in pieces."""
    long: list[str] = []

    def out(v: Any) -> Any:
        if isinstance(v, str) and len(v) > PIECE:
            long.append(v)
            return f"\x00{len(long) - 1}\x00"
        if isinstance(v, dict):
            return {k: out(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [out(x) for x in v]
        return v

    def back(v: Any) -> Any:
        if isinstance(v, str) and v.startswith("\x00") and v.endswith("\x00"):
            return "".join(redact(piece, pii=pii) for piece in _pieces(long[int(v[1:-1])]))
        if isinstance(v, dict):
            return {k: back(x) for k, x in v.items()}
        if isinstance(v, list):
            return [back(x) for x in v]
        return v

    pii = masks_pii()  # the page masks personal data (register_secrets(mask_pii=False))
    return back(redact(out(value), pii=pii))


def _run_view(text: str) -> dict[str, Any]:
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("this run record is not an object")
    partial = [
        {
            "at": f"partial.{i}",
            "step": p.get("step"),
            "tool": short(p.get("tool")),
            "args": cut(p.get("args")),
            "result": cut(p.get("result")),
        }
        for i, p in enumerate(doc.get("partial") or ())
        if isinstance(p, dict)
    ]
    pending = doc.get("pending_approval")
    heavy = ("partial", "result", "pending_approval", "messages")
    run = short({k: v for k, v in doc.items() if k not in heavy})
    run["pending_approval"] = short(pending) if isinstance(pending, dict) else None
    return {
        "run": run,
        "partial": partial,
        "result": cut(doc.get("result")),
        "pending": cut(pending.get("args")) if isinstance(pending, dict) else None,
        "conversation": [_turn(i, m) for i, m in enumerate(doc.get("messages") or ())],
    }


def _turn(i: int, message: Any) -> dict[str, Any]:
    """One message of a run's conversation as its page shows it: who spoke, and what (its
    text, or its content cut), whatever the provider's format (a role and a content, or a
    framework's type and content)."""
    if not isinstance(message, dict):
        return {"at": f"messages.{i}", "role": "", "text": "", "value": cut(message)}
    role = message.get("role") or message.get("type") or ""
    content = message.get("content", message.get("parts"))
    text = content if isinstance(content, str) else ""
    if isinstance(content, list):  # blocks: their text, the rest shown as values
        text = "\n".join(
            str(b.get("text"))
            for b in content
            if isinstance(b, dict) and isinstance(b.get("text"), str)
        )
    others = {k: v for k, v in message.items() if k not in ("role", "type", "content")}
    if isinstance(content, list) and not text:
        others["content"] = content
    return {
        "at": f"messages.{i}",
        "role": short(str(role)),
        "text": short(text, 2000),
        "value": cut(others) if others else None,
    }


_pool: list[Any] = []
_pool_lock = threading.Lock()


def run_view(text: str) -> dict[str, Any]:
    """A run record's JSON read for its page: every large value cut (not yet redacted);
    a large record is read in a worker process."""
    if len(text) < BIG:
        return _run_view(text)
    with _pool_lock:
        if not _pool:
            import atexit
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            context = multiprocessing.get_context("spawn")
            _pool.append(ProcessPoolExecutor(max_workers=1, mp_context=context))
            atexit.register(_pool[0].shutdown)
    view: dict[str, Any] = _pool[0].submit(_run_view, text).result(timeout=120)
    return view
