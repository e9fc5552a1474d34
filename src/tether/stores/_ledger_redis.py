"""The ledger in Redis: one hash per key, every transition one Lua script."""

from __future__ import annotations

import json
from typing import Any

from tether._effects import Record, State
from tether._errors import StoreUnavailable, require

__all__ = ["RedisLedgerBackend"]

# ARGV: record as JSON, now, key ttl in ms. Returns {claimed, previous-or-current JSON or ''}
CLAIM = """
local k = KEYS[1]
local new = cjson.decode(ARGV[1])
local now = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local raw = redis.call('GET', k)
local function put(rec)
  redis.call('SET', k, cjson.encode(rec), 'PX', ttl)
end
if not raw then put(new); return {1, ''} end
local cur = cjson.decode(raw)
if tonumber(cur.expires_at) <= now then put(new); return {1, ''} end
local reclaimable = cur.state == 'unknown' or (cur.state == 'pending' and tonumber(cur.lease_until) <= now)
local same = cur.payload_hash == cjson.null or cur.payload_hash == nil or new.payload_hash == cjson.null
             or new.payload_hash == nil or cur.payload_hash == new.payload_hash
if reclaimable and same then
  new.attempts = (tonumber(cur.attempts) or 1) + 1
  put(new)
  return {1, raw}
end
return {0, raw}
"""

# ARGV: owner, new state, field JSON, condition ('final' | 'owner_pending'), mode
UPDATE = """
local k = KEYS[1]
local raw = redis.call('GET', k)
if not raw then return 0 end
local cur = cjson.decode(raw)
local mode = ARGV[1]
local owner = ARGV[2]
if mode == 'complete' then
  if cur.state ~= 'pending' and cur.state ~= 'unknown' then return 0 end
  cur.state = ARGV[3]
  local extra = cjson.decode(ARGV[4])
  cur.result = extra.result
  cur.error = extra.error
elseif mode == 'unknown' then
  if cur.state ~= 'pending' or cur.owner ~= owner then return 0 end
  cur.state = 'unknown'
  cur.detail = ARGV[3]
elseif mode == 'release' then
  if cur.state ~= 'pending' or cur.owner ~= owner then return 0 end
  redis.call('DEL', k)
  return 1
end
redis.call('SET', k, cjson.encode(cur), 'KEEPTTL')
return 1
"""


class RedisLedgerBackend:
    def __init__(self, url: str, *, prefix: str = "tether", key_ttl: float = 7 * 86_400.0) -> None:
        redis = require("redis", "redis")
        self.url = url
        self.prefix = prefix
        self._ttl_ms = int(key_ttl * 1000)
        self.client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)  # type: ignore[attr-defined]
        self._errors = (redis.ConnectionError, redis.TimeoutError)  # type: ignore[attr-defined]
        self.round_trips = 0
        self._claim = self.client.register_script(CLAIM)
        self._update = self.client.register_script(UPDATE)

    def _key(self, key: str) -> str:
        return f"{self.prefix}:ledger:{key}"

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.round_trips += 1
        try:
            return fn(*args, **kwargs)
        except self._errors as exc:
            raise StoreUnavailable(
                f"the ledger's Redis at {self.url} is unreachable ({exc}); nothing was executed. "
                "Retry when Redis answers (the effect has not run)"
            ) from exc

    @staticmethod
    def _decode(raw: Any) -> Record | None:
        if not raw:
            return None
        data = json.loads(raw)
        for field in ("payload_hash", "result", "error"):
            if data.get(field) is None:
                data[field] = None
        return Record.from_row(data)

    def claim(self, record: Record, now: float) -> tuple[bool, Record | None]:
        row = record.to_row()
        row["state"] = record.state.value
        claimed, raw = self._call(self._claim, keys=[self._key(record.key)],
                                  args=[json.dumps(row), repr(now), self._ttl_ms])  # fmt: skip
        return bool(int(claimed)), self._decode(raw)

    def get(self, key: str) -> Record | None:
        return self._decode(self._call(self.client.get, self._key(key)))

    def complete(self, key: str, owner: str, state: State, result: str | None,
                 error: str | None, now: float) -> None:  # fmt: skip
        extra = json.dumps({"result": result, "error": error})
        self._call(
            self._update, keys=[self._key(key)], args=["complete", owner, state.value, extra]
        )

    def mark_unknown(self, key: str, owner: str, detail: str) -> None:
        self._call(self._update, keys=[self._key(key)], args=["unknown", owner, detail, "{}"])

    def release(self, key: str, owner: str) -> None:
        self._call(self._update, keys=[self._key(key)], args=["release", owner, "", "{}"])

    def forget(self, key: str) -> None:
        self._call(self.client.delete, self._key(key))

    def records(self, state: State | None = None, limit: int = 100) -> list[Record]:
        out: list[Record] = []
        for k in self._call(lambda: list(self.client.scan_iter(match=f"{self.prefix}:ledger:*"))):
            rec = self._decode(self._call(self.client.get, k))
            if rec is not None and (state is None or rec.state is state):
                out.append(rec)
        return sorted(out, key=lambda r: r.created_at)[:limit]

    def close(self) -> None:
        self.client.close()
