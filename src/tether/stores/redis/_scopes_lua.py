"""The Lua source of the budget scopes' script (see :mod:`tether.stores.redis._scopes`): the
twin of :mod:`tether.stores._scopes`, its constants written in from there."""

from __future__ import annotations

from tether.stores._scopes import EPSILON, SLICES

__all__ = ["SCOPES"]

# KEYS: the calls' hash, the calls' times (a sorted set), the scope names (a set), then one
# hash per scope. ARGV: mode, now ("": the server's clock), lease, retention, call id, then
# per mode: reserve: cost ("": unpriced), input, output, calls, the scope names;
# settle: cost, input, output, calls; release: -; limit: max_cost, max_tokens, max_calls,
# window ("": none), the name; view: the name.
SCOPES = """
local function fmt(x) return string.format('%.17g', x) end
local SLICES, EPS = @SLICES@, @EPSILON@
local mode, now = ARGV[1], tonumber(ARGV[2])
if not now then
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) + tonumber(tm[2]) / 1000000
end
local lease, retention, id = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local calls, calls_t, names = KEYS[1], KEYS[2], KEYS[3]
local DIMS = {'cost', 'input', 'output', 'calls'}

local function four(s)
  local t = {}
  for x in string.gmatch(s, '%S+') do t[#t + 1] = tonumber(x) end
  return t
end
local function text(t)
  local o = {}
  for i = 1, #t do o[i] = fmt(t[i]) end
  return table.concat(o, ' ')
end
local function load(k)
  local raw, f = redis.call('HGETALL', k), {}
  for i = 1, #raw, 2 do f[raw[i]] = raw[i + 1] end
  return f
end
local function slice(f) return math.floor(now / (tonumber(f['window']) / SLICES)) end
local function spend(k, f, used)
  for i = 1, 4 do
    f[DIMS[i]] = fmt((tonumber(f[DIMS[i]]) or 0) + used[i])
    redis.call('HSET', k, DIMS[i], f[DIMS[i]])
  end
  if f['window'] then
    local key = 's:' .. slice(f)
    local old = {0, 0, 0, 0}
    if f[key] then old = four(f[key]) end
    for i = 1, 4 do old[i] = old[i] + used[i] end
    f[key] = text(old)
    redis.call('HSET', k, key, f[key])
  end
end
local function done(cid)
  redis.call('HSET', calls, cid, 'd ' .. fmt(now))
  redis.call('ZADD', calls_t, now, cid)
end
local function expire(k, f)
  local cur = nil
  if f['window'] then cur = slice(f) end
  local dead, old = {}, {}
  for key, value in pairs(f) do
    local p = string.sub(key, 1, 2)
    if p == 'h:' then
      local h = four(value)
      if now - h[1] > lease then dead[#dead + 1] = {key, h} end
    elseif p == 's:' then
      if cur == nil or tonumber(string.sub(key, 3)) < cur - SLICES then old[#old + 1] = key end
    end
  end
  for _, key in ipairs(old) do f[key] = nil; redis.call('HDEL', k, key) end
  for _, d in ipairs(dead) do
    f[d[1]] = nil
    redis.call('HDEL', k, d[1])
    spend(k, f, {d[2][2], d[2][3], d[2][4], d[2][5]})
    done(string.sub(d[1], 3))
  end
end
local function spent(f)
  if not f['window'] then
    local t = {}
    for i = 1, 4 do t[i] = tonumber(f[DIMS[i]]) or 0 end
    return t
  end
  local t, oldest = {0, 0, 0, 0}, slice(f) - SLICES
  for key, value in pairs(f) do
    if string.sub(key, 1, 2) == 's:' and tonumber(string.sub(key, 3)) >= oldest then
      local s = four(value)
      for i = 1, 4 do t[i] = t[i] + s[i] end
    end
  end
  return t
end
local function held(f)
  local t, n = {0, 0, 0, 0}, 0
  for key, value in pairs(f) do
    if string.sub(key, 1, 2) == 'h:' then
      local h = four(value)
      for i = 1, 4 do t[i] = t[i] + h[i + 1] end
      n = n + 1
    end
  end
  return t, n
end

if mode == 'reserve' then
  if redis.call('HEXISTS', calls, id) == 1 then return {'again', '', '', '0', '0'} end
  local cost = ARGV[6]
  local want = {tonumber(cost) or 0, tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])}
  local fs = {}
  for j = 4, #KEYS do
    local f = load(KEYS[j])
    expire(KEYS[j], f)
    fs[j] = f
    if cost == '' and f['max_cost'] then
      return {'unpriced', ARGV[6 + j], 'max_cost', '0', f['max_cost']}
    end
  end
  local near = {'ok', '', '', '0', '0'}
  local near_share = 0
  for j = 4, #KEYS do
    local f = fs[j]
    local sp, hd = spent(f), held(f)
    local u = {sp[1] + hd[1], sp[2] + hd[2], sp[3] + hd[3], sp[4] + hd[4]}
    local checks = {{'max_cost', u[1], want[1]}, {'max_tokens', u[2] + u[3], want[2] + want[3]},
                    {'max_calls', u[4], want[4]}}
    for _, c in ipairs(checks) do
      if f[c[1]] then
        local cap = tonumber(f[c[1]])
        if c[2] >= cap or c[2] + c[3] > cap + EPS then
          return {'spent', ARGV[6 + j], c[1], fmt(c[2]), fmt(cap)}
        end
        if cap > 0 and (c[2] + c[3]) / cap > near_share then
          near_share = (c[2] + c[3]) / cap
          near = {'ok', ARGV[6 + j], c[1], fmt(c[2] + c[3]), fmt(cap)}
        end
      end
    end
  end
  local h = text({now, want[1], want[2], want[3], want[4]})
  for j = 4, #KEYS do
    redis.call('HSET', KEYS[j], 'h:' .. id, h)
    redis.call('SADD', names, ARGV[6 + j])
  end
  redis.call('HSET', calls, id, 'h ' .. fmt(now))
  redis.call('ZADD', calls_t, now, id)
  return near
elseif mode == 'settle' then
  local st = redis.call('HGET', calls, id)
  if st and string.sub(st, 1, 1) == 'd' then return 0 end
  local used = {tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])}
  for j = 4, #KEYS do
    local f = load(KEYS[j])
    f['h:' .. id] = nil
    redis.call('HDEL', KEYS[j], 'h:' .. id)
    spend(KEYS[j], f, used)
  end
  done(id)
  local stale = redis.call('ZRANGEBYSCORE', calls_t, '-inf', now - retention, 'LIMIT', 0, 100)
  for _, cid in ipairs(stale) do
    redis.call('HDEL', calls, cid)
    redis.call('ZREM', calls_t, cid)
  end
  return 1
elseif mode == 'release' then
  local st = redis.call('HGET', calls, id)
  if not st or string.sub(st, 1, 1) ~= 'h' then return 0 end
  for j = 4, #KEYS do redis.call('HDEL', KEYS[j], 'h:' .. id) end
  redis.call('HDEL', calls, id)
  redis.call('ZREM', calls_t, id)
  return 1
elseif mode == 'limit' then
  local k = KEYS[4]
  local f = load(k)
  local new_window = tonumber(ARGV[9])
  if f['window'] and new_window ~= tonumber(f['window']) then
    local carried = spent(f)
    for key, _ in pairs(f) do
      if string.sub(key, 1, 2) == 's:' then redis.call('HDEL', k, key) end
    end
    if new_window then
      f['window'] = fmt(new_window)
      redis.call('HSET', k, 's:' .. slice(f), text(carried))
    end
  end
  local fields = {'max_cost', 'max_tokens', 'max_calls', 'window'}
  for i = 1, 4 do
    local v = tonumber(ARGV[5 + i])
    if v then redis.call('HSET', k, fields[i], fmt(v)) else redis.call('HDEL', k, fields[i]) end
  end
  redis.call('SADD', names, ARGV[10])
  return 1
end
-- view
local k = KEYS[4]
local f = load(k)
expire(k, f)
local sp = spent(f)
local hd, n = held(f)
return {fmt(sp[1]), fmt(sp[2]), fmt(sp[3]), fmt(sp[4]), fmt(hd[1]), fmt(hd[2]), fmt(hd[3]),
        fmt(hd[4]), n, f['max_cost'] or '', f['max_tokens'] or '', f['max_calls'] or '',
        f['window'] or ''}
""".replace("@SLICES@", repr(SLICES)).replace("@EPSILON@", repr(EPSILON))
