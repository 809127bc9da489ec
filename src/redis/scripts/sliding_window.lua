-- Sliding window counter (SPEC §5), windows aligned to the Unix epoch.
-- KEYS[i]  state of item i: the string "<t> <prev> <cur>", t = time of the newest admission,
--          cur = units admitted in t's window, prev = in the window before it.
-- ARGV[1]  minimum TTL in ms        ARGV[2]  commit: '1' / '0' / '2' (all or nothing)
-- ARGV[3]  limit L (≤ 2^51)          ARGV[4]  window W in ns (1 ms ≤ W ≤ 2^51)
-- ARGV[3 + 2i], ARGV[4 + 2i]: cost of item i (≤ L), its time in ns ('' = server TIME)
-- reply[i] {code, e, prev, cur}: as seen from the current window, before the decision
-- Admission, exactly: cost = 0, or (cur + c − 1)·W + prev·(W − e) < L·W, which is
-- prev·(W − e) < a·W with a = L − cur − c + 1 (false if a ≤ 0); both products may pass 2^53.

defer = all or #KEYS > 1
for i = 1, #KEYS do
  local key = KEYS[i]
  local cost, at, limit, window = item(i)
  local ts, t = now_of(at)
  local code, prev, cur, e
  code, prev, cur, e, ts, t = read_window(key, ts, t, window, true)
  if type(code) == 'table' then return code end
  if not code then
    local allowed = cost == 0
    if not allowed then
      local a = limit - cur - cost + 1
      allowed = a > 0 and (prev == 0 or less(prev, window - e, a, window))
    end
    if allowed then
      code = 1
      if commit and cost > 0 then
        local state = ts .. ' ' .. string.format('%d %d', prev, cur + cost)
        set_state(key, state, ttl_ms(2 * window - e, t))
      end
    else
      code = 0
    end
  end
  reply[i] = {code, e, prev, cur}
end
return finish()
