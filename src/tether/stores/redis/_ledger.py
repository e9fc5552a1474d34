"""The ledger in Redis: one key per effect, every transition one Lua script.

Leases are measured on the server's clock (``TIME``), so a worker whose own clock is
ahead cannot take a claim over early. Redis keeps the ledger only as long as it
persists its writes: a server without ``appendonly yes`` forgets claims and finished
effects when it restarts, and an effect could then run twice. The backend checks the
server's persistence when it is built and refuses one that does not persist, unless
told otherwise (see :meth:`tether.Ledger.redis`).
"""

from __future__ import annotations

import json
from typing import Any

from tether._errors import StoreUnavailable, require
from tether.redaction._redact import safe_url
from tether.stores._base import redis_client
from tether.stores._ledger_logic import Completion, Record, Settlement, State

__all__ = ["LedgerNotDurable", "RedisLedgerBackend"]

_NOW = """
local now = tonumber(ARGV[2])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
"""

# The Redis key lives as long as the record it holds (its expires_at, on the clock the
# script measures with), plus this grace; the record's own expires_at is what counts.
_PUT = """
local function put(rec)
  local ms = math.ceil((tonumber(rec.expires_at) - now) * 1000) + tonumber(ARGV[3])
  redis.call('SET', k, cjson.encode(rec), 'PX', math.max(1, ms))
end
"""

# KEYS: the record. ARGV: the ledger's key, now or '', grace in ms, owner, payload hash or '',
# lease and lease + ttl (relative to now). The record is built here from its fields, not from
# a JSON text the client encodes (the client's JSON encoding was a tenth of its cost of a
# claim), and stored as the same JSON as before. Returns 1 for a fresh claim, else
# {claimed, previous-or-current JSON}. Twin of decide_claim.
CLAIM = (
    """
local k = KEYS[1]
"""
    + _NOW
    + _PUT
    + """
local hash = ARGV[5]
if hash == '' then hash = cjson.null end
local new = {key = ARGV[1], state = 'pending', payload_hash = hash, owner = ARGV[4],
             lease_until = now + tonumber(ARGV[6]), expires_at = now + tonumber(ARGV[7]),
             created_at = now, result = cjson.null, error = cjson.null, detail = '', attempts = 1}
local raw = redis.call('GET', k)
if not raw then put(new); return 1 end
local cur = cjson.decode(raw)
if tonumber(cur.expires_at) <= now then put(new); return 1 end
if cur.owner == new.owner and cur.state == 'pending' then return 1 end
local live = cur.state == 'pending' or cur.state == 'unknown'
local same = cur.payload_hash == cjson.null or cur.payload_hash == nil or hash == cjson.null
             or cur.payload_hash == hash
if live and tonumber(cur.lease_until) <= now and same then
  new.attempts = (tonumber(cur.attempts) or 1) + 1
  put(new)
  return {1, raw}
end
return {0, raw}
"""
)

# KEYS: the record. ARGV: mode, now or '', grace in ms, owner, ttl, then per mode (complete:
# the state, and the result and the error each as '=' and its text, or '' for none). Twins
# of decide_complete, may_renew, may_release, renewed, settled and unknown_at.
UPDATE = (
    """
local k = KEYS[1]
local mode = ARGV[1]
"""
    + _NOW
    + _PUT
    + """
local owner, ttl = ARGV[4], tonumber(ARGV[5])
local raw = redis.call('GET', k)
if not raw then return 'missing' end
local cur = cjson.decode(raw)
local live = cur.state == 'pending' or cur.state == 'unknown'
local function text(arg)
  if arg == '' then return cjson.null end
  return string.sub(arg, 2)
end
if mode == 'complete' then
  if cur.owner ~= owner then return 'lost' end
  if not live then
    -- a copy of this completion (the client sent it again after a timeout): as the first
    if cur.state == ARGV[6] and cur.result == text(ARGV[7]) then return 'recorded' end
    return 'final'
  end
  cur.state = ARGV[6]
  cur.result = text(ARGV[7])
  cur.error = text(ARGV[8])
  cur.expires_at = now + ttl
elseif mode == 'renew' then
  if not live or cur.owner ~= owner then return 'lost' end
  cur.lease_until = math.max(tonumber(cur.lease_until), now + tonumber(ARGV[6]))
  cur.expires_at = math.max(tonumber(cur.expires_at), cur.lease_until + ttl)
elseif mode == 'unknown' then
  if cur.state ~= 'pending' or cur.owner ~= owner then return 'lost' end
  cur.state = 'unknown'
  cur.detail = ARGV[6]
  if ARGV[7] ~= '1' then cur.lease_until = math.min(tonumber(cur.lease_until), now) end
  cur.expires_at = math.max(tonumber(cur.lease_until), now) + ttl
elseif mode == 'release' then
  if cur.state ~= 'pending' or cur.owner ~= owner then return 'lost' end
  redis.call('DEL', k)
  return 'recorded'
end
put(cur)
return 'recorded'
"""
)

#: the answers of UPDATE, as its reply's bytes (or text, from a client that decodes replies)
_VERDICTS: dict[Any, Completion] = {c.value.encode(): c for c in Completion}
_VERDICTS.update({c.value: c for c in Completion})


def _text(value: str | None) -> str:
    """An optional text as UPDATE reads it: '' for none, else '=' and the text."""
    return "" if value is None else "=" + value


class LedgerNotDurable(StoreUnavailable):
    """The ledger's server does not persist its writes (or cannot say whether it does)."""


class RedisLedgerBackend:
    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        client: Any = None,
        prefix: str = "tether",
        grace: float = 3600.0,
        assume_durable: bool = False,
        allow_lost_records: bool = False,
    ) -> None:
        redis = require("redis", "redis")
        if client is not None and type(client).__module__.startswith("redis.asyncio"):
            raise TypeError(
                "Ledger.redis needs a sync client (redis.Redis or redis.cluster.RedisCluster); "
                "its async path (Ledger.aonce) runs that client's calls in a worker thread"
            )
        self.url = safe_url(url) if client is None else repr(client)
        self.prefix = prefix
        self._grace_ms = int(grace * 1000)  # how long a key outlives its record
        self.client = client or redis_client(url, socket_timeout=5, socket_connect_timeout=5)
        self._errors = (redis.RedisError,)  # type: ignore[attr-defined]
        self.round_trips = 0
        # the scripts' SHA and text; they are sent as EVALSHA through execute_command, not
        # through redis-py's Script objects (a layer less per call, see _eval)
        self._claim = self.client.register_script(CLAIM)
        self._update = self.client.register_script(UPDATE)
        self._execute = self.client.execute_command
        self._no_script = redis.exceptions.NoScriptError  # type: ignore[attr-defined]
        self._grace = str(self._grace_ms).encode()
        if not (assume_durable or allow_lost_records):
            self._check_durable()

    def __repr__(self) -> str:
        return f"RedisLedgerBackend({self.url!r}, prefix={self.prefix!r})"

    def _check_durable(self) -> None:
        try:
            settings = self._call(self.client.config_get, "appendonly")
        except StoreUnavailable as exc:
            if (
                isinstance(exc.__cause__, self._errors[0])
                and "CONFIG" in str(exc.__cause__).upper()
            ):
                raise LedgerNotDurable(
                    f"cannot read the persistence settings of the ledger's Redis at {self.url} "
                    f"({exc.__cause__}). If it persists every write (appendonly yes, or a managed "
                    "Redis with durable storage), pass assume_durable=True"
                ) from exc
            raise
        values = settings.values() if isinstance(settings, dict) else []
        if not any(str(v.decode() if isinstance(v, bytes) else v) == "yes" for v in values):
            raise LedgerNotDurable(
                f"the ledger's Redis at {self.url} does not persist its writes (appendonly is "
                "off): a restart would forget claims and finished effects, and an effect could "
                "run twice. Turn it on (CONFIG SET appendonly yes, and in redis.conf), or pass "
                "allow_lost_records=True to accept that risk"
            )

    def _key(self, key: str) -> str:
        return f"{self.prefix}:ledger:{{{key}}}"

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.round_trips += 1
        try:
            return fn(*args, **kwargs)
        except self._errors as exc:
            raise self._unavailable(exc) from exc

    def _eval(self, script: Any, key: str, *args: Any) -> Any:
        """One script on the record ``key`` (one round trip): EVALSHA, and once the server
        does not know the script (restarted, or flushed), SCRIPT LOAD and EVALSHA again."""
        self.round_trips += 1
        try:
            try:
                return self._execute("EVALSHA", script.sha, 1, key, *args)
            except self._no_script:
                self.round_trips += 2
                script.sha = self.client.script_load(script.script)
                return self._execute("EVALSHA", script.sha, 1, key, *args)
        except self._errors as exc:
            raise self._unavailable(exc) from exc

    def _unavailable(self, exc: BaseException) -> StoreUnavailable:
        return StoreUnavailable(
            f"the ledger's Redis at {self.url} did not answer ({type(exc).__name__}: "
            f"{safe_url(str(exc))})"
        )

    @staticmethod
    def _decode(raw: Any) -> Record | None:
        if not raw:
            return None
        data = json.loads(raw)
        for field in ("payload_hash", "result", "error"):
            if data.get(field) is None:
                data[field] = None
        return Record.from_row(data)

    @staticmethod
    def _now(now: float | None) -> str:
        return "" if now is None else repr(now)

    def claim(self, record: Record, now: float | None) -> tuple[bool, Record | None]:
        answer = self._eval(
            self._claim,
            self._key(record.key),
            record.key,
            self._now(now),
            self._grace,
            record.owner,
            record.payload_hash or "",
            record.lease_until,
            record.expires_at,
        )
        if answer == 1:  # a fresh claim (or a repeat of our own)
            return True, None
        claimed, raw = answer
        return bool(int(claimed)), self._decode(raw)

    def get(self, key: str) -> Record | None:
        return self._decode(self._call(self.client.get, self._key(key)))

    def _run(
        self, key: str, mode: str, now: float | None, owner: str, ttl: float, *rest: Any
    ) -> Completion:
        args = (mode, self._now(now), self._grace, owner, float(ttl), *rest)
        return _VERDICTS[self._eval(self._update, self._key(key), *args)]

    def renew(self, key: str, owner: str, lease: float, now: float | None, ttl: float) -> bool:
        return self._run(key, "renew", now, owner, ttl, float(lease)) is Completion.RECORDED

    def complete(self, s: Settlement) -> Completion:
        result, error = _text(s.result), _text(s.error)
        return self._run(s.key, "complete", s.now, s.owner, s.ttl, s.state.value, result, error)

    def mark_unknown(self, s: Settlement) -> None:
        keep = "1" if s.keep_lease else "0"
        self._run(s.key, "unknown", s.now, s.owner, s.ttl, s.detail, keep)

    def release(self, key: str, owner: str) -> None:
        self._run(key, "release", None, owner, 0.0)

    def forget(self, key: str) -> None:
        self._call(self.client.delete, self._key(key))

    def records(self, state: State | None = None, limit: int = 100) -> list[Record]:
        out: list[Record] = []
        pattern = f"{self.prefix}:ledger:*"
        for k in self._call(lambda: list(self.client.scan_iter(match=pattern))):
            rec = self._decode(self._call(self.client.get, k))
            if rec is not None and (state is None or rec.state is state):
                out.append(rec)
        return sorted(out, key=lambda r: r.created_at)[:limit]

    def close(self) -> None:
        self.client.close()
