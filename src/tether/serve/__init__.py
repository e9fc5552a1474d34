"""``tether serve``: the operator page over the records tether writes.

Runs (filtered by status and stop reason), one run (its steps and tool calls, the stop,
what the customer was told, the handoff), the inbox (calls waiting for approval, then
handoffs, open cases first: claim, resolve), dead letters (replay at most once) and the
breakers of a Redis store (force open, close). Server-rendered HTML (Starlette, Jinja2
with autoescape, uvicorn), no JavaScript build step; extra ``tether[serve]``.

Safety: it binds to loopback unless a token is given; with a token every request must
carry it (``Authorization: Bearer``, or ``?token=`` once, which sets a cookie). Only the
host names it is told of are served (Starlette's ``TrustedHostMiddleware``): the loopback
names without a token, plus each ``allowed_hosts`` name with one, so a DNS-rebound name
never reaches a page. Every state-changing action is a POST from the page's exact origin
(its ``Origin``, or else its ``Referer``: the scheme, host and port it was sent to) with a
CSRF token that is an HMAC of its cookie under a secret of the process (a page on another
port of the same host can set cookies but can neither read nor compute the token); every
value shown is redacted again and escaped. Database reads, rendering and replay handlers run in worker threads,
never on the event loop.
"""

from __future__ import annotations

from tether._errors import require

require("starlette", "serve")
require("jinja2", "serve")

from tether.serve._app import create_app  # noqa: E402 - after the extra check
from tether.serve._site import LOOPBACK_NAMES, is_loopback  # noqa: E402
from tether.serve._site import host_name as host_name  # noqa: E402 - for the command line

__all__ = ["LOOPBACK_NAMES", "create_app", "is_loopback"]
