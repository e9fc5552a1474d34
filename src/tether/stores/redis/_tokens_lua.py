"""The Lua source of the token budget's script (see :mod:`tether.stores.redis._tokens`).

Its own module so that the script registry (:mod:`tether.stores.redis._scripts`) and the
store's token part can both read it without importing each other.
"""

from __future__ import annotations

from tether.stores._tokens import MEMBER_TTL, PROBE_WAIT

__all__ = ["TOKENS"]

# ARGV: now ("": the server's clock, TIME), mode ('reserve' | 'settle'), ttl_ms,
# probe_timeout, horizon, the 4 configured limits, the 4 needs, then the settlement's 15
# numbers (Settlement.args), its seen_at and pause_until as seconds before and after now,
# then the process's id and whether to count the processes (1: say how many used the name
# within MEMBER_TTL seconds, as a 4th answer; 0: the 4th answer is 0).
TOKENS = """
local function fmt(x) return string.format('%.17g', x) end
local k = KEYS[1]
local now, mode, ttl = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
if not now then  -- the server's clock: one clock for every host of the fleet
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) + tonumber(tm[2]) / 1000000
end
local probe_timeout, horizon = tonumber(ARGV[4]), tonumber(ARGV[5])
local v = redis.call('HMGET', k, 't', 'known', 'probe_until', 'paused_until',
                     'cap0', 'cap1', 'cap2', 'cap3', 'lvl0', 'lvl1', 'lvl2', 'lvl3')
local t, known, probe_until, paused_until
local cap, lvl = {}, {}
if v[1] then
  t, known, probe_until, paused_until = tonumber(v[1]), tonumber(v[2]), tonumber(v[3]), tonumber(v[4])
  for i = 1, 4 do cap[i] = tonumber(v[4 + i]); lvl[i] = tonumber(v[8 + i]) end
  local dt = math.max(0, now - t)
  for i = 1, 4 do
    if cap[i] > 0 then lvl[i] = math.min(cap[i], lvl[i] + cap[i] * dt / 60.0) end
  end
  t = math.max(t, now)
else
  t, known, probe_until, paused_until = now, 0, 0, 0
  for i = 1, 4 do cap[i] = tonumber(ARGV[5 + i]); lvl[i] = cap[i] end
end
-- the settlement: refunds, the headers' limits and levels, a pause
local s = 13
local seen_at, pause, answered = tonumber(ARGV[s + 13]), tonumber(ARGV[s + 14]), tonumber(ARGV[s + 15])
seen_at = now - seen_at  -- an age
if pause > 0 then pause = now + pause end  -- a duration
for i = 1, 4 do
  local refund, limit, remaining = tonumber(ARGV[s + i]), tonumber(ARGV[s + 4 + i]), tonumber(ARGV[s + 8 + i])
  if limit > 0 and limit ~= cap[i] then
    if cap[i] <= 0 then lvl[i] = limit else lvl[i] = math.min(lvl[i], limit) end
    cap[i] = limit
  end
  if cap[i] > 0 then
    local level = math.min(cap[i], lvl[i] + refund)
    if remaining >= 0 then
      local said = math.min(cap[i], remaining + cap[i] * math.max(0, t - seen_at) / 60.0)
      if answered > 0 and known == 0 then level = said else level = math.min(level, said) end
    end
    lvl[i] = level
  end
end
if answered > 0 then known = 1; probe_until = 0 end
paused_until = math.max(paused_until, pause)
-- the processes that share the name (each says it is here when it asks for the count)
local members = 0
if ARGV[30] == '1' then
  redis.call('HSET', k, 'm:' .. ARGV[29], fmt(now))
  local all = redis.call('HGETALL', k)
  for j = 1, #all, 2 do
    if string.sub(all[j], 1, 2) == 'm:' then
      if tonumber(all[j + 1]) >= now - MEMBER_TTL then members = members + 1
      else redis.call('HDEL', k, all[j]) end
    end
  end
end
local function save()
  redis.call('HSET', k, 't', fmt(t), 'known', known, 'probe_until', fmt(probe_until),
             'paused_until', fmt(paused_until), 'cap0', fmt(cap[1]), 'cap1', fmt(cap[2]),
             'cap2', fmt(cap[3]), 'cap3', fmt(cap[4]), 'lvl0', fmt(lvl[1]), 'lvl1', fmt(lvl[2]),
             'lvl2', fmt(lvl[3]), 'lvl3', fmt(lvl[4]))
  redis.call('PEXPIRE', k, ttl)
end
if mode ~= 'reserve' then save(); return {0, '0', '0', members} end
if known == 0 and probe_until > now then
  save()
  local out_for = now - (probe_until - probe_timeout)
  return {0, '-1', fmt(math.min(math.max(PROBE_WAIT, out_for / 2.0), probe_until - now)), members}
end
-- the call goes out after the line (t) and the pause, once every bucket holds its need;
-- the buckets are brought to then (a full bucket gains nothing more), the need taken then
local start = math.max(t, paused_until)
local go = start
for i = 1, 4 do
  if cap[i] > 0 then
    local level = math.min(cap[i], lvl[i] + cap[i] * (start - t) / 60.0)
    go = math.max(go, start + (math.min(tonumber(ARGV[9 + i]), cap[i]) - level) * 60.0 / cap[i])
  end
end
local wait = go - now
if wait > horizon then save(); return {0, fmt(wait), fmt(wait - horizon), members} end
for i = 1, 4 do
  if cap[i] > 0 then
    lvl[i] = math.min(cap[i], lvl[i] + cap[i] * math.max(0, go - t) / 60.0)
    lvl[i] = lvl[i] - math.min(tonumber(ARGV[9 + i]), cap[i])
  end
end
t = math.max(t, go)
if known == 0 then probe_until = now + probe_timeout end
save()
return {1, fmt(wait), '0', members}
""".replace("PROBE_WAIT", repr(PROBE_WAIT)).replace("MEMBER_TTL", repr(MEMBER_TTL))
