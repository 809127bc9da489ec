-- The reader of a GCRA state, shared by the GCRA decision, lease and charge scripts (one Lua
-- function, so the state's format is parsed in one place).
-- Reads the GCRA state "<t> <debt>" of `key` at the time (ts, t). Returns: nil, or the error
-- code (−1 another Redis type, −2 a value these scripts did not write, or a server error
-- table); the debt max(0, TAT − t) at the later of t and the stored time; that time (string,
-- pair); and whether the key holds a state.
local function read_gcra(key, ts, t)
  local v, err = read_string(key)
  if err then return err, 0, ts, t, false end
  if not v then return nil, 0, ts, t, false end
  local st, sd = string.match(v, '^(%d+) (%d+)$')
  if not st or #st > 20 or #sd > 16 or tonumber(sd) >= 4503599627370496 then
    return -2, 0, ts, t, true
  end
  local gap
  ts, t, gap = clamp(ts, t, st)
  local debt = tonumber(sd) - gap
  if debt < 0 then debt = 0 end
  return nil, debt, ts, t, true
end
