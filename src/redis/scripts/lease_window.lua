-- Leases on window state (SPEC §4, §5), the leased tier. A grant of g units in window k is g
-- admissions in window k; the node spends them before window k ends (its lease expires at the
-- window's end by its own clock, conservatively), so every unit spent in window k is counted
-- in window k's count, and nothing spent ever escapes the state's limit.
-- KEYS[i]  state of item i, as the fixed-window script keeps it ("<t> <n>") or the sliding
--          window script ("<t> <prev> <cur>")
-- ARGV[1]  minimum TTL in ms        ARGV[2]  'f' fixed window, 's' sliding window counter
-- ARGV[3]  limit L (≤ 2^51)          ARGV[4]  window W in ns (1 ms ≤ W ≤ 2^51)
-- ARGV[1 + 4i] 'g' grant, 'r' return or 'c' charge ('c<k>': with the token KEYS[k])
-- ARGV[2 + 4i] units (≤ L for a grant or a return; < 2^52 for a charge)
-- ARGV[3 + 4i] return: the time of a grant of the lease; charge: the time the units were
--              admitted ('' = now); '' for a grant
-- ARGV[4 + 4i] time in ns ('' = server TIME)
-- grant, fixed:   g = min(units, L − n), then n += g
-- grant, sliding: the largest g ≤ units admitted as one request of cost g (SPEC §5), then
--                 cur += g
-- return: the units leave the count of the grant's window (n, cur, or prev once the stored
--         window is the next one), never below 0; a window already gone is left alone.
-- charge: units a node admitted without a grant are added to the count of the window they
--         were admitted in, if the state still remembers it (n or cur for the current window,
--         prev for the one before it when sliding), never denied: the count may pass L (the
--         key is then denied until that window has slid out), up to 2^52 − 1
-- reply[i] {code, g or units returned or charged, s, ns, e, prev, count after}: (s, ns) = the
--          time judged at, e = its time into the window, count = n or cur

local limit, window = tonumber(ARGV[3]), tonumber(ARGV[4])
local sliding = ARGV[2] == 's'
local MAX_COUNT = 4503599627370495 -- 2^52 − 1, the largest count a state holds
-- Stores a window state stamped `stamp` (the sliding counter keeps both counts).
local function put(key, stamp, p, c, ttl)
  if sliding then
    redis.call('SET', key, stamp .. ' ' .. string.format('%d %d', p, c), 'PX', ttl)
  else
    redis.call('SET', key, stamp .. ' ' .. string.format('%d', c), 'PX', ttl)
  end
end
-- Until a state written `e` into its window is fresh: the end of the next window (sliding) or
-- of this one.
local function fresh_ttl(e, t)
  if sliding then return ttl_ms(2 * window - e, t) end
  return ttl_ms(window - e, t)
end
for i = 1, (#ARGV - 4) / 4 do
  local key = KEYS[i]
  local op, token, units, since, ts, t = lease_item(i, limit)
  local code, prev, cur, e, st, sp, sc
  code, prev, cur, e, ts, t, st, sp, sc = read_window(key, ts, t, window, sliding)
  if type(code) == 'table' then return code end
  code = code or 1
  local n = 0
  local before = op == 'c' and charged_before(token)
  if before then
    n = before
  elseif code == 1 and op == 'c' then
    -- Units admitted in the future by the node's clock (ahead of the server's) count now.
    local age = 0
    if since ~= '' then age = diff(t, parse_time(since)) end
    if age < 0 then age = 0 end
    if age <= e then
      n = math.min(units, MAX_COUNT - cur)
      cur = cur + n
    elseif sliding and age <= e + window then
      n = math.min(units, MAX_COUNT - prev)
      prev = prev + n
    end
    if n > 0 then put(key, ts, prev, cur, fresh_ttl(e, t)) end
    -- Sent again, the charge counts until the state forgets the window of its time: the end
    -- of that window (sliding: of the next one), by the server's windows.
    local atp = t
    if since ~= '' then atp = parse_time(since) end
    local horizon = diff(atp, t) + window - tmod(atp, window)
    if sliding then horizon = horizon + window end
    mark_charged(token, n, horizon, t)
  elseif code == 1 and op == 'g' then
    n = limit - cur
    if n > units then n = units end
    if n < 0 then n = 0 end
    if sliding and prev > 0 then
      -- Admitted iff prev·(W − e) < (L − cur − g + 1)·W, monotone in g: binary search.
      local lo, hi = 0, n
      while lo < hi do
        local mid = floor((lo + hi + 1) / 2)
        if less(prev, window - e, limit - cur - mid + 1, window) then lo = mid else hi = mid - 1 end
      end
      n = lo
    end
    if n > 0 then
      cur = cur + n
      put(key, ts, prev, cur, fresh_ttl(e, t))
    end
  elseif code == 1 and st and since ~= '' then
    -- Which of the stored windows holds the grant: the stored time's own, or the one before.
    local stp = parse_time(st)
    local d = diff(stp, parse_time(since))
    local es = tmod(stp, window)
    local sp2, sc2 = tonumber(sp), tonumber(sc)
    if d <= es then
      n = math.min(units, sc2)
      sc2 = sc2 - n
    elseif sliding and d <= es + window then
      n = math.min(units, sp2)
      sp2 = sp2 - n
    end
    local ttl = redis.call('PTTL', key)
    if n > 0 and ttl > 0 then
      put(key, st, sp2, sc2, ttl)
    else
      n = 0
    end
    -- The view from now, after the return.
    local gap = diff(t, stp)
    if gap <= e then
      prev, cur = sp2, sc2
    elseif sliding and gap <= e + window then
      prev, cur = sc2, 0
    end
  end
  reply[i] = {code, n, t[1], t[2], e, prev, cur}
end
return reply
