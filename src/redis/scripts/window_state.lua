-- The reader of a window state (fixed window, sliding window counter), shared by the window
-- decision, lease and charge scripts.
-- Reads the window state of `key` at the time (ts, t): fixed window "<t> <n>", sliding window
-- counter "<t> <prev> <cur>" (n, cur = units admitted in t's window, prev = in the one before).
-- Returns: nil or the error code (as read_gcra); prev and cur as seen from the window of the
-- later of t and the stored time; e = that time's offset into its window; that time (string,
-- pair); and the stored fields st, sp, sc as strings (nil when the key is absent; sp = '0' for
-- a fixed window).
local function read_window(key, ts, t, window, sliding)
  local v, err = read_string(key)
  if err then return err, 0, 0, 0, ts, t end
  if not v then return nil, 0, 0, tmod(t, window), ts, t end
  local st, sp, sc
  if sliding then
    st, sp, sc = string.match(v, '^(%d+) (%d+) (%d+)$')
  else
    st, sc = string.match(v, '^(%d+) (%d+)$')
    sp = '0'
  end
  if not st or #st > 20 or #sp > 16 or #sc > 16
    or tonumber(sp) >= 4503599627370496 or tonumber(sc) >= 4503599627370496 then
    return -2, 0, 0, 0, ts, t
  end
  local gap
  ts, t, gap = clamp(ts, t, st)
  local e = tmod(t, window)
  local prev, cur = 0, 0
  if gap <= e then
    prev, cur = tonumber(sp), tonumber(sc) -- the stored window is the current one
  elseif sliding and gap <= e + window then
    prev = tonumber(sc) -- the stored window is the previous one
  end
  return nil, prev, cur, e, ts, t, st, sp, sc
end
