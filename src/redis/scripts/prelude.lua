-- Helpers shared by every script (prepended to each).
-- Redis < 5 needs this before a script that reads TIME may write; a no-op since Redis 7.
if redis.replicate_commands then redis.replicate_commands() end

local floor = math.floor
local min_ttl = tonumber(ARGV[1])
-- ARGV[2]: '0' peek, '1' commit, '2' all or nothing (below).
local commit = ARGV[2] == '1' or ARGV[2] == '2'
local all = ARGV[2] == '2'

-- Item i's cost, time argument and the rule's two parameters. A batch shares one rule
-- (ARGV[3], ARGV[4]; items at ARGV[3 + 2i], ARGV[4 + 2i]); an all-or-nothing call gives each
-- item its own (ARGV[4i + 1 .. 4i + 4]: cost, time, first, second).
local function item(i)
  if all then
    local j = 4 * i
    return tonumber(ARGV[j + 1]), ARGV[j + 2], tonumber(ARGV[j + 3]), tonumber(ARGV[j + 4])
  end
  return tonumber(ARGV[3 + 2 * i]), ARGV[4 + 2 * i], tonumber(ARGV[3]), tonumber(ARGV[4])
end

-- The string states of a decision call of several items (GCRA and the window counters), by
-- key: what it read or will write (false = absent). Items of a batch on one key read it once,
-- see each other's admissions here, and the key is written once, by `finish`, with its last
-- state and that state's TTL: what one SET per admission would leave, at one GET and one SET
-- per key and call. The decision scripts set `defer` (a single check writes at once, and an
-- all-or-nothing call always waits); the lease scripts read and write Redis directly.
local defer = false
local states, ttls, pending = {}, {}, {}
local function set_state(key, state, ttl)
  if not defer then
    redis.call('SET', key, state, 'PX', ttl)
    return
  end
  if not ttls[key] then pending[#pending + 1] = key end
  states[key], ttls[key] = state, ttl
end
-- A key written more than once in a call (a hot key) keeps its state as the script's own
-- fields from its second write on, formatted once, when written, by the script's
-- `format_state` (which returns the string and its TTL): its batch then neither parses nor
-- formats the state item by item. `fields[key]` supersedes `states[key]`. (Both made at a
-- call's first hot key: a single check makes neither.)
local format_state, fields

-- The sliding log's writes: done at once, or in an all-or-nothing call held back until every
-- item is known to be admitted (its items are distinct keys, so none reads another's write).
local held = {}
local function write(f)
  if all then held[#held + 1] = f else f() end
end

-- floor(a / b) for integers 0 <= a < 2^53, b >= 1. IEEE division is correctly rounded and
-- its error stays below the distance 1/b to the next integer, so the floor is exact; the
-- loops only make that argument visible.
local function idiv(a, b)
  local q = floor(a / b)
  while q * b > a do q = q - 1 end
  while (q + 1) * b <= a do q = q + 1 end
  return q
end

-- A time given as a decimal string of at most 20 digits, as {seconds, nanoseconds}.
local function parse_time(s)
  local n = #s
  if n <= 9 then return {0, tonumber(s)} end
  return {tonumber(string.sub(s, 1, n - 9)), tonumber(string.sub(s, n - 8))}
end

-- a − b in nanoseconds: exact when |a − b| < 2^53 (104 days), otherwise of the right sign and
-- larger than 2^52 in magnitude, which is all the comparisons below need (every bound they
-- compare with is below 2^52).
local function diff(a, b)
  return (a[1] - b[1]) * 1000000000 + (a[2] - b[2])
end

-- 10^9 in binary, most significant bit first.
local BILLION_BITS = '111011100110101100101000000000'

-- t mod w for a time t = {s, n} and 1 <= w <= 2^51, exactly: ((s mod w)·10^9 + n) mod w with the
-- product reduced bit by bit (double and add), so no intermediate value reaches 2^52.
local function tmod(t, w)
  -- Whole seconds (1 s, 1 min, 1 h, ...) or a divisor of one (1 ms, 100 ms, ...): exact in
  -- one step, since t = s·10^9 + n with 0 <= n < 10^9.
  if w % 1000000000 == 0 then return (t[1] % (w / 1000000000)) * 1000000000 + t[2] end
  if 1000000000 % w == 0 then return t[2] % w end
  local a = t[1] % w
  local r = 0
  for i = 1, #BILLION_BITS do
    r = r + r
    if r >= w then r = r - w end
    if string.byte(BILLION_BITS, i) == 49 then
      r = r + a
      if r >= w then r = r - w end
    end
  end
  r = r + t[2] % w
  if r >= w then r = r - w end
  return r
end

-- x·y for integers 0 <= x, y < 2^52, as (high, d1, d0) with x·y = high·2^52 + d1·2^26 + d0.
local LIMB = 67108864 -- 2^26
local function mul(x, y)
  local xh, xl = floor(x / LIMB), x % LIMB
  local yh, yl = floor(y / LIMB), y % LIMB
  local low, mid = xl * yl, xh * yl + xl * yh -- < 2^52 and < 2^53
  local d0 = low % LIMB
  local mid_low = mid % LIMB
  local s1 = (low - d0) / LIMB + mid_low
  local d1 = s1 % LIMB
  return xh * yh + (mid - mid_low) / LIMB + (s1 - d1) / LIMB, d1, d0
end

-- x1·y1 < x2·y2, exactly, for integers in [0, 2^52).
local function less(x1, y1, x2, y2)
  local a1, b1, c1 = mul(x1, y1)
  local a2, b2, c2 = mul(x2, y2)
  if a1 ~= a2 then return a1 < a2 end
  if b1 ~= b2 then return b1 < b2 end
  return c1 < c2
end

-- The server's clock, read once per call: (decimal string, pair).
local server_time
local function server_now()
  if not server_time then
    local t = redis.call('TIME')
    local s, us = tonumber(t[1]), tonumber(t[2])
    server_time = {string.format('%d%06d000', s, us), {s, us * 1000}}
  end
  return server_time[2]
end

-- The time of item i: (decimal string, pair). '' = the server's clock.
local function now_of(arg)
  if arg == '' then
    server_now()
    return server_time[1], server_time[2]
  end
  return arg, parse_time(arg)
end

-- The TTL in ms for a state of time `t` (a pair) that becomes fresh `ns` nanoseconds after
-- it (rounded up), from the server's clock (a state ahead of it, after the clock stepped
-- back, lives that much longer), as a decimal string: numbers passed to redis.call are
-- formatted by the server in ways that differ between versions, so every large number goes
-- out as a string formatted here.
local function ttl_ms(ns, t)
  local ahead = diff(t, server_now())
  if ahead > 0 then ns = ns + ahead end
  local ms = idiv(ns + 999999, 1000000)
  if ms < min_ttl then ms = min_ttl end
  if ms < 1 then ms = 1 end
  return string.format('%d', ms)
end

-- Charges are applied once. A charge may carry a token: a key of its own next to the state
-- (same slot), declared in KEYS after the items' keys, whose index follows its op ('c7'). A
-- token already set means the charge ran before (its reply was lost): it answers the units
-- it charged then and changes nothing. A charge that charged units sets its token for `ns`
-- nanoseconds, its horizon: until the server's clock passes the last time the same charge,
-- sent again, could still change the state (its script computes it from the charge's own
-- time). A charge of no units sets none: sent again, it charges what it would have.
local function token_of(op)
  if #op > 1 then return KEYS[tonumber(string.sub(op, 2))] end
end
-- Item i of a lease script (ARGV[4i+1 .. 4i+4]: op and token, units, a time or '', the time
-- judged at): its op letter, its charge token's key (if any), its units (at most `most`, but
-- for a charge), its third argument as given, and the time it is judged at.
local function lease_item(i, most)
  local op, units = ARGV[4 * i + 1], tonumber(ARGV[4 * i + 2])
  if string.sub(op, 1, 1) ~= 'c' and units > most then units = most end
  local ts, t = now_of(ARGV[4 * i + 4])
  return string.sub(op, 1, 1), token_of(op), units, ARGV[4 * i + 3], ts, t
end
local function charged_before(token)
  if not token then return nil end
  local v = redis.call('GET', token)
  if v then return tonumber(v) end
end
local function mark_charged(token, n, ns, t)
  if token and n > 0 then
    if ns > 4503599627370495 then ns = 4503599627370495 end -- 2^52 − 1 ns: 52 days at most
    redis.call('SET', token, string.format('%d', n), 'PX', ttl_ms(ns, t))
  end
end

-- Reads a string state with pcall: (value or false) or nil, code on a type error.
local function read_string(key)
  if defer then
    local v = states[key]
    if v ~= nil then return v end
  end
  local v = redis.pcall('GET', key)
  if type(v) == 'table' and v.err then
    if string.sub(v.err, 1, 9) == 'WRONGTYPE' then return nil, -1 end
    return nil, redis.error_reply(v.err)
  end
  if defer then states[key] = v end
  return v
end

-- A stored admission time (string, at most 20 digits; `st` its pair, if already parsed) and
-- the later of it and now: returns the time string, its pair and the gap now − stored (0 if
-- stored is later).
local function clamp(ts, t, stored, st)
  st = st or parse_time(stored)
  local gap = diff(t, st)
  if gap < 0 then return stored, st, 0 end
  return ts, t, gap
end

local reply = {}

-- The reply, after the call's writes: the string states' (one SET a key), the log's held
-- ones. An all-or-nothing call writes only if every item was admitted. (A call that returns
-- a server error instead writes nothing: its callers learn no decision.)
local function finish()
  if all then
    for i = 1, #reply do
      if reply[i][1] ~= 1 then return reply end
    end
  end
  for i = 1, #pending do
    local key = pending[i]
    local state, ttl = states[key], ttls[key]
    if fields and fields[key] then state, ttl = format_state(fields[key]) end
    redis.call('SET', key, state, 'PX', ttl)
  end
  for i = 1, #held do held[i]() end
  return reply
end
