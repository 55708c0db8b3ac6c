"""The Lua scripts the Redis store runs (EVALSHA, loaded once; loaded again after a restart answers NOSCRIPT).

Each runs atomically in Redis, so the increment and the threshold test are one step: a transition is claimed by
exactly one add, whichever replica sent it. Times come from the Redis server (``TIME``), never from the replicas'
clocks. Keys of one budget share a hash tag (``prefix{id}:...``), so they stay in one slot of a cluster.

A budget is one hash:

    tokens  cumulative tokens          state  0 ok, 1 warning, 2 exhausted (only moves forward)
    calls   messages added             last   server time (ms) of the last add
    owner   instance id of the replica that counts it (its creator)
    tools   digest of the last tools/list

Its TTL is ``budget.idle_timeout`` plus a grace period: a budget idle past the timeout starts afresh at its next
add (``last`` tells), and the grace lets its owner read the final figures before the key expires. Repeated-call
digests are keys of their own that live ``metrics.repeat_window``; the rate window is a sorted set living one
window. Nothing grows without bound.
"""

from __future__ import annotations

#: KEYS: the budget's hash, then one key per call digest to check. ARGV: idle_ms, ttl_ms, warn_at, exhaust_at,
#: owner id, repeat_ms, tools digest ('' none), '1' to report a tools change ('0': set it only), '1' to give up
#: ownership after this add, then the messages' tokens in order (none: a read that refreshes nothing is PEEK).
#: Returns: tokens, state, owner (1: the caller), repeat, tools changed, calls, created (1: a new budget), then
#: per message the states it entered (bit 1 warning, bit 2 exhausted).
ADD = """
local h = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local f = redis.call('HMGET', h, 'last', 'tokens', 'state', 'owner', 'tools', 'calls')
local tokens, state, owner, tools, calls = tonumber(f[2]) or 0, tonumber(f[3]) or 0, f[4], f[5], tonumber(f[6]) or 0
local created = 0
if not f[1] or now - tonumber(f[1]) > tonumber(ARGV[1]) then
  if f[1] then redis.call('DEL', h) end
  tokens, state, owner, tools, calls, created = 0, 0, ARGV[5], false, 0, 1
elseif not owner or owner == '' then
  owner = ARGV[5]
end
local warn, exhaust = tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {0, 0, 0, 0, 0, 0, created}
for i = 10, #ARGV do
  tokens = tokens + tonumber(ARGV[i])
  calls = calls + 1
  local entered = 0
  if state < 1 and tokens >= warn then state = 1; entered = 1 end
  if state < 2 and tokens >= exhaust then state = 2; entered = entered + 2 end
  out[#out + 1] = entered
end
local repeat_ms = tonumber(ARGV[6])
if repeat_ms > 0 then
  for k = 2, #KEYS do
    if redis.call('SET', KEYS[k], '1', 'PX', repeat_ms, 'GET') then out[4] = 1 end
  end
end
if ARGV[7] ~= '' then
  if tools and tools ~= ARGV[7] and ARGV[8] == '1' then out[5] = 1 end
  tools = ARGV[7]
end
local mine = owner == ARGV[5]
if mine and ARGV[9] == '1' then owner = '' end
redis.call('HSET', h, 'last', now, 'tokens', tokens, 'state', state, 'owner', owner, 'calls', calls)
if tools then redis.call('HSET', h, 'tools', tools) end
redis.call('PEXPIRE', h, ARGV[2])
out[1], out[2], out[3], out[6] = tokens, state, mine and 1 or 0, calls
return out
"""

#: KEYS: the budget's hash. ARGV: owner id. Returns: exists (0/1), tokens, state, calls, ms since the last add,
#: owner (1: the caller). Reads only: the budget's TTL and ``last`` are left as they are.
PEEK = """
local f = redis.call('HMGET', KEYS[1], 'last', 'tokens', 'state', 'calls', 'owner')
if not f[1] then return {0, 0, 0, 0, 0, 0} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {1, tonumber(f[2]) or 0, tonumber(f[3]) or 0, tonumber(f[4]) or 0, now - tonumber(f[1]),
        f[5] == ARGV[1] and 1 or 0}
"""

#: KEYS: the rate window (a sorted set of event times in microseconds). ARGV: window_us, limit, '1' to log an
#: event over the limit, a unique member. Returns the events in the window, this one included (a sliding-window
#: log that keeps at most ``limit`` events, as core/guard/limits.RateLimiter).
RATE = """
local k = KEYS[1]
local window, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZREMRANGEBYSCORE', k, '-inf', now - window)
local n = redis.call('ZCARD', k)
if n < limit or ARGV[3] == '1' then
  redis.call('ZADD', k, now, ARGV[4])
  if n + 1 > limit then redis.call('ZREMRANGEBYRANK', k, 0, n - limit) end
  redis.call('PEXPIRE', k, math.ceil(window / 1000))
end
return n + 1
"""
