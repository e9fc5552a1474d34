"""The Lua source of the token budget's script (see :mod:`tether.stores.redis._tokens`).

Its own module so that the script registry (:mod:`tether.stores.redis._scripts`) and the
store's token part can both read it without importing each other.
"""

from __future__ import annotations

from tether.stores._tokens import FLY_TAU, MEMBER_TTL, PROBE_WAIT

__all__ = ["TOKENS"]

# ARGV: now ("": the server's clock, TIME), mode ('reserve' | 'settle'), ttl_ms,
# probe_timeout, horizon, the 4 configured limits, the 4 needs, then the settlement's 15
# numbers (Settlement.args), its seen_at and pause_until as seconds before and after now,
# then the process's id and whether to count the processes (1: say how many used the name
# within MEMBER_TTL seconds, as a 4th answer; 0: the 4th answer is 0), then the ask's
# number (increasing per process) and the 4 refunds the process has asked for in all (net
# of what it took from its memory while Redis was away). The 5th answer is the line: how
# long the calls admitted take to go out (seconds).
#
# An ask may arrive twice (the client retried after a timeout, a stalled connection
# delivered it late) or after a newer one: the process's last number, its refunds in all
# and its answer are kept (field q:<id>). A copy of the last ask gets that answer again
# and changes nothing; an older one (a copy, or an ask that crossed a newer one) reserves
# nothing and adds no refund, but what else its settlement says (the headers' limits and
# levels, the first answer, a pause) is applied: it was dropped, and a pause or the
# probe's answer with it; a newer one applies the refunds it adds to the kept total. So a
# refund counts once however often it travels. (A process whose field is gone, unheard of
# for MEMBER_TTL seconds, applies the refunds of its ask: those since its last answer.)
# ARGV[36]: the numbers of the process's reservations whose answers it never got (it went
# on without them): the script keeps the needs of the last reservations it admitted per
# process (field r:<id>) and gives back those it finds there, so a reservation nobody
# waits for does not hold its tokens (nor the probe's place, before the first answer); one
# not found never ran, and will not (its number is below the one this ask leaves).
# ARGV[37..40]: the margin of the need (its padding), added to the margins in flight (fields
# fly0..fly3, fading with FLY_TAU) when admitted; ARGV[41..44]: the margins the settlement's
# reservations release (a remaining header's level is less those still in flight).
TOKENS = (
    """
local function fmt(x) return string.format('%.17g', x) end
local k = KEYS[1]
local now, mode, ttl = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
if not now then  -- the server's clock: one clock for every host of the fleet
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) + tonumber(tm[2]) / 1000000
end
local probe_timeout, horizon = tonumber(ARGV[4]), tonumber(ARGV[5])
local v = redis.call('HMGET', k, 't', 'known', 'probe_until', 'paused_until',
                     'cap0', 'cap1', 'cap2', 'cap3', 'lvl0', 'lvl1', 'lvl2', 'lvl3',
                     'ft', 'fly0', 'fly1', 'fly2', 'fly3')
local t, known, probe_until, paused_until
local cap, lvl, fly = {}, {}, {}
local ft = tonumber(v[13]) or now
local fade = math.exp(-math.max(0, now - ft) / FLY_TAU)
for i = 1, 4 do fly[i] = (tonumber(v[13 + i]) or 0) * fade end
ft = math.max(ft, now)
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
-- the ask's number: a copy of the last answers the same, an older one changes nothing
local qk, seq = 'q:' .. ARGV[29], tonumber(ARGV[31])
local q, refund, older = redis.call('HGET', k, qk), {}, false
if q then
  local prev = {}
  for x in string.gmatch(q, '%S+') do prev[#prev + 1] = x end
  if seq < tonumber(prev[1]) then
    -- an older ask (it crossed a newer one of the process): its refunds are in the newer
    -- one's total, but what else it says (the headers, the first answer, a pause) counts
    older = true
    for i = 1, 4 do refund[i] = 0 end
  elseif seq == tonumber(prev[1]) then
    return {tonumber(prev[6]), prev[7], prev[8], 0, fmt(math.max(0, t - now))}
  else
    for i = 1, 4 do refund[i] = tonumber(ARGV[31 + i]) - tonumber(prev[1 + i]) end
  end
else
  for i = 1, 4 do refund[i] = tonumber(ARGV[13 + i]) end
end
-- the reservations whose answers the process lost: what they took goes back
local rk = 'r:' .. ARGV[29]
local held = {}
for x in string.gmatch(redis.call('HGET', k, rk) or '', '%S+') do held[#held + 1] = x end
if ARGV[36] ~= '' then
  local lost = {}
  for x in string.gmatch(ARGV[36], '%S+') do lost[x] = true end
  local kept = {}
  for _, entry in ipairs(held) do
    local parts = {}
    for y in string.gmatch(entry, '[^,]+') do parts[#parts + 1] = y end
    if lost[parts[1]] then
      for i = 1, 4 do refund[i] = refund[i] + tonumber(parts[1 + i]) end
      -- the family's first call (the probe) never went out: another caller may probe now
      if known == 0 then probe_until = 0 end
    else
      kept[#kept + 1] = entry
    end
  end
  held = kept
end
-- the settlement: the margins it releases, refunds, the headers' limits and levels, a pause
if not older then
  for i = 1, 4 do fly[i] = math.max(0, fly[i] - tonumber(ARGV[40 + i])) end
end
local s = 13
local seen_at, pause, answered = tonumber(ARGV[s + 13]), tonumber(ARGV[s + 14]), tonumber(ARGV[s + 15])
seen_at = now - seen_at  -- an age
if pause > 0 then pause = now + pause end  -- a duration
for i = 1, 4 do
  local limit, remaining = tonumber(ARGV[s + 4 + i]), tonumber(ARGV[s + 8 + i])
  if limit > 0 and limit ~= cap[i] then
    if cap[i] <= 0 then lvl[i] = limit else lvl[i] = math.min(lvl[i], limit) end
    cap[i] = limit
  end
  if cap[i] > 0 then
    local level = math.min(cap[i], lvl[i] + refund[i])
    if remaining >= 0 then
      local said = math.min(cap[i], remaining + cap[i] * math.max(0, t - seen_at) / 60.0)
      said = said - fly[i]
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
      else
        local id = string.sub(all[j], 3)
        redis.call('HDEL', k, all[j], 'q:' .. id, 'r:' .. id)
      end
    end
  end
end
local function save()
  redis.call('HSET', k, 't', fmt(t), 'known', known, 'probe_until', fmt(probe_until),
             'paused_until', fmt(paused_until), 'cap0', fmt(cap[1]), 'cap1', fmt(cap[2]),
             'cap2', fmt(cap[3]), 'cap3', fmt(cap[4]), 'lvl0', fmt(lvl[1]), 'lvl1', fmt(lvl[2]),
             'lvl2', fmt(lvl[3]), 'lvl3', fmt(lvl[4]), 'ft', fmt(ft), 'fly0', fmt(fly[1]),
             'fly1', fmt(fly[2]), 'fly2', fmt(fly[3]), 'fly3', fmt(fly[4]))
  redis.call('PEXPIRE', k, ttl)
end
-- save, keep the ask's number, its refunds in all and its answer, and answer
local function answer(admitted, wait, retry_in)
  save()
  if not older then
    redis.call('HSET', k, qk, table.concat({ARGV[31], ARGV[32], ARGV[33], ARGV[34], ARGV[35],
                                            admitted, wait, retry_in}, ' '))
  end
  if admitted == 1 then  -- kept, the last HELD of them, in case its answer is lost
    local n = {}
    for i = 1, 4 do n[i] = fmt(math.min(tonumber(ARGV[9 + i]), math.max(cap[i], 0))) end
    held[#held + 1] = ARGV[31] .. ',' .. table.concat(n, ',')
    while #held > HELD do table.remove(held, 1) end
  end
  if #held > 0 then redis.call('HSET', k, rk, table.concat(held, ' '))
  else redis.call('HDEL', k, rk) end
  return {admitted, wait, retry_in, members, fmt(math.max(0, t - now))}
end
if mode ~= 'reserve' or older then return answer(0, '0', '0') end
if known == 0 and probe_until > now then
  local out_for = now - (probe_until - probe_timeout)
  return answer(0, '-1', fmt(math.min(math.max(PROBE_WAIT, out_for / 2.0), probe_until - now)))
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
if wait > horizon then return answer(0, fmt(wait), fmt(wait - horizon)) end
for i = 1, 4 do
  if cap[i] > 0 then
    lvl[i] = math.min(cap[i], lvl[i] + cap[i] * math.max(0, go - t) / 60.0)
    lvl[i] = lvl[i] - math.min(tonumber(ARGV[9 + i]), cap[i])
    fly[i] = fly[i] + math.min(tonumber(ARGV[36 + i]), cap[i])
  end
end
t = math.max(t, go)
if known == 0 then probe_until = now + probe_timeout end
return answer(1, fmt(wait), '0')
""".replace("PROBE_WAIT", repr(PROBE_WAIT))
    .replace("MEMBER_TTL", repr(MEMBER_TTL))
    .replace("FLY_TAU", repr(FLY_TAU))
    .replace("HELD", "32")
)
