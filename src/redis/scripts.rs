//! Every Lua script of the Redis tier, in one place.
//!
//! # Why Lua, not `MULTI`/`EXEC`
//! A decision *reads* a key's state, decides, and writes the new state only if the request is
//! admitted. `MULTI`/`EXEC` queues commands whose arguments are fixed before any of them runs,
//! so it cannot branch on what it reads; the optimistic variant (`WATCH` + `MULTI`) needs two
//! round trips per check and retries under contention, exactly when a rate limiter is busiest.
//! A script runs atomically on the server (no other command interleaves), reads the server's
//! own clock, and costs one round trip whatever the contention, so every node of a fleet sees
//! one order of events and one clock per key.
//!
//! # Conventions shared by all scripts
//! - **Batches.** Every script decides a batch: `KEYS[i]` is the state of the i-th check, and
//!   its cost and time are `ARGV[b + 2i − 1]` and `ARGV[b + 2i]` (`b` = the number of fixed
//!   arguments). Items are decided in order, so two checks of one key in a batch see each other
//!   (the decision scripts read a key once and write it once a call, with its last state).
//!   A one-item batch is a single check. In a Redis Cluster every key of one call must hash to
//!   one slot; the caller groups batches by slot.
//! - **All or nothing.** With `ARGV[2] = '2'`, the items are one request's several limits
//!   (distinct keys, in one slot), each with its own rule parameters: every item is decided,
//!   and the admissions are written only if every item is admitted
//!   ([`RedisMultiLimiter`](crate::redis::RedisMultiLimiter)).
//! - **Time.** Times are nanoseconds since the Unix epoch. An empty time argument means "now" on
//!   the server (`TIME`, read once per call, so a whole batch is judged at one instant and every
//!   client of the server shares one clock); a decimal time argument is an *injected* time, for
//!   tests and trace replay only. Each state records the time of its newest admission; a reading
//!   older than that is treated as that time (decision rules: time never goes backwards), which also keeps
//!   a key consistent across a failover to a replica whose clock lags.
//! - **Exact integers.** Lua numbers are IEEE doubles: integers are exact below 2^53. An absolute
//!   time in nanoseconds (~1.8·10^18) is not, so times are stored as decimal strings and handled
//!   as `{seconds, nanoseconds}` pairs; every computed quantity is a *difference* of times or a
//!   count, kept below 2^52 by the limits the Rust side enforces at construction
//!   (`MAX_NANOS = 2^51` for windows and `B·T`, `MAX_LIMIT = 2^51` for `L`). Products that can
//!   exceed 2^53 are compared in 26-bit limbs (`mul`, `less`), never rounded.
//! - **Reply.** One array per item: `{code, …}` with `code` 1 = allowed, 0 = denied,
//!   −1 = the key holds another Redis type (`WRONGTYPE`), −2 = the key holds a value these scripts
//!   did not write. The remaining fields are the facts the decision's figures are computed from
//!   (in Rust, in 128-bit integers); the Rust side recomputes the verdict from them and refuses
//!   a reply that disagrees.
//! - **Writes.** Only an admitted request with `commit = 1` and a positive cost writes, and it
//!   sets a TTL equal to the time until the state is indistinguishable from a fresh key, rounded
//!   up to Redis's millisecond (never shorter, so a key never expires while it still limits),
//!   and at least `ARGV[1]` ms (0 in live use; a floor for injected time, whose clock the
//!   server cannot see). A denial or a peek writes nothing; the sliding log may drop entries
//!   that have expired, which no decision can observe.
//! - **Errors.** States are read with `redis.pcall`, so a key of the wrong type is reported
//!   per item and the rest of the batch is still decided (a script is not rolled back on an
//!   error: aborting half way would leave earlier items counted but unreported).

use std::sync::OnceLock;

use redis::Script;

/// Helpers shared by every script (prepended to each).
macro_rules! prelude {
    () => {
        r#"
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
-- it charged then and changes nothing. A charge sets its token for a day.
local function token_of(op)
  if #op > 1 then return KEYS[tonumber(string.sub(op, 2))] end
end
local function charged_before(token)
  if not token then return nil end
  local v = redis.call('GET', token)
  if v then return tonumber(v) end
end
local function mark_charged(token, n)
  if token then redis.call('SET', token, string.format('%d', n), 'PX', '86400000') end
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
"#
    };
}

/// The reader of a GCRA state, shared by the GCRA decision, lease and charge scripts (one Lua
/// function, so the state's format is parsed in one place).
macro_rules! gcra_state {
    () => {
        r#"
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
"#
    };
}

/// The reader of a window state (fixed window, sliding window counter), shared by the window
/// decision, lease and charge scripts.
macro_rules! window_state {
    () => {
        r#"
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
"#
    };
}

/// The members of a sliding log, shared by its decision and charge scripts.
macro_rules! log_state {
    () => {
        r#"
local RENUMBER_AT = 4503599627370496 -- 2^52
-- The most expired entries a call removes (see the sliding-log script).
local CLEANUP = 64

-- cum, cost, time string, time pair of a member; nil if it is not one of ours.
local function member(m)
  if type(m) ~= 'string' then return nil end
  local cum, cost, mt = string.match(m, '^(%d+):(%d+):(%d+)$')
  if not cum or #cum > 16 or #cost > 16 or #mt > 20 then return nil end
  cum, cost = tonumber(cum), tonumber(cost)
  if cost < 1 or cost > cum or cum > 2 * RENUMBER_AT then return nil end
  return cum, cost, mt, parse_time(mt)
end

-- Rewrites every member with cum − base, so scores restart near 0.
local function renumber(key, base)
  local all = redis.call('ZRANGE', key, 0, -1)
  redis.call('DEL', key)
  for j = 1, #all do
    local cum, cost, mt = member(all[j])
    if cum then
      local score = string.format('%d', cum - base)
      redis.call('ZADD', key, score, score .. string.format(':%d:', cost) .. mt)
    end
  end
end
"#
    };
}

/// GCRA / token bucket / leaky bucket as a meter, and the leaky bucket as a queue (which
/// differs only in the figures the Rust side derives).
/// The compiled scripts (each hashed once; `EVALSHA` by hash, reloaded on `NOSCRIPT`).
pub(crate) struct Scripts {
    pub gcra: Script,
    pub fixed_window: Script,
    pub sliding_window: Script,
    pub sliding_log: Script,
    pub heartbeat: Script,
    pub lease_gcra: Script,
    pub lease_window: Script,
    pub charge_log: Script,
}

/// One script call: `EVALSHA` with the script's keys and arguments. (redis-rs's
/// `ScriptInvocation` reloads a lost script by itself; the coalescer must see the `NOSCRIPT`
/// first, to re-send its calls in their order.)
pub(crate) struct ScriptCall {
    pub script: &'static Script,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl ScriptCall {
    pub fn new(script: &'static Script) -> ScriptCall {
        ScriptCall {
            script,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    /// Adds `KEYS[i]`.
    pub fn key(&mut self, key: &[u8]) -> &mut ScriptCall {
        self.keys.push(key.to_vec());
        self
    }

    /// Adds the next `ARGV` entries (one for each value `arg` writes).
    pub fn arg<T: redis::ToRedisArgs>(&mut self, arg: T) -> &mut ScriptCall {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// The `EVALSHA` command.
    pub fn evalsha(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash())
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        cmd
    }
}

pub(crate) fn scripts() -> &'static Scripts {
    static SCRIPTS: OnceLock<Scripts> = OnceLock::new();
    SCRIPTS.get_or_init(|| Scripts {
        gcra: Script::new(GCRA),
        fixed_window: Script::new(FIXED_WINDOW),
        sliding_window: Script::new(SLIDING_WINDOW),
        sliding_log: Script::new(SLIDING_LOG),
        heartbeat: Script::new(HEARTBEAT),
        lease_gcra: Script::new(LEASE_GCRA),
        lease_window: Script::new(LEASE_WINDOW),
        charge_log: Script::new(CHARGE_LOG),
    })
}

pub(crate) const GCRA: &str = concat!(
    r#"
-- GCRA (SPEC §1–3).
-- KEYS[i]  state of item i: the string "<t> <debt>", t = time of the newest admission (ns since
--          the epoch), debt = TAT − t in ns (0 < debt ≤ 2^52). Absent = a full bucket.
-- ARGV[1]  minimum TTL in ms        ARGV[2]  commit: '1' to count an admitted request, '0' to
--          peek, '2' all or nothing (each item its own ARGV[3], ARGV[4]: see `item` above)
-- ARGV[3]  span B·T in ns (≤ 2^51)  ARGV[4]  emission interval T in ns (≥ 1)
-- ARGV[3 + 2i], ARGV[4 + 2i]: cost of item i (≤ B), its time in ns ('' = server TIME)
-- reply[i] {code, debt}: debt = max(0, TAT − t) before the decision
"#,
    prelude!(),
    gcra_state!(),
    r#"
defer = all or #KEYS > 1
for i = 1, #KEYS do
  local key = KEYS[i]
  local cost, at, span, interval = item(i)
  local ts, t = now_of(at)
  local code, debt
  local f = fields and fields[key]
  if f then
    -- This call's own newest state of the key, read as read_gcra reads its string.
    local gap
    ts, t, gap = clamp(ts, t, f[1], f[2])
    debt = f[3] - gap
    if debt < 0 then debt = 0 end
  else
    code, debt, ts, t = read_gcra(key, ts, t)
    if type(code) == 'table' then return code end
  end
  if not code then
    local increment = cost * interval
    if cost == 0 or debt + increment <= span then
      code = 1
      if commit and cost > 0 then
        local after = debt + increment
        if ttls[key] then
          -- Written before in this call (so `defer` is on): a hot key, kept as fields
          -- {time string, time pair, debt}, whose state is "<t> <debt>".
          if not fields then
            fields = {}
            format_state = function(v)
              return v[1] .. ' ' .. string.format('%d', v[3]), ttl_ms(v[3], v[2])
            end
          end
          fields[key] = {ts, t, after}
        else
          set_state(key, ts .. ' ' .. string.format('%d', after), ttl_ms(after, t))
        end
      end
    else
      code = 0
    end
  end
  reply[i] = {code, debt}
end
return finish()
"#
);

/// Fixed window counter.
pub(crate) const FIXED_WINDOW: &str = concat!(
    r#"
-- Fixed window (SPEC §4), windows [k·W, (k+1)·W) aligned to the Unix epoch.
-- KEYS[i]  state of item i: the string "<t> <n>", t = time of the newest admission, n = units
--          admitted in t's window. Absent = nothing admitted.
-- ARGV[1]  minimum TTL in ms        ARGV[2]  commit: '1' / '0' / '2' (all or nothing)
-- ARGV[3]  limit L (≤ 2^51)          ARGV[4]  window W in ns (1 ms ≤ W ≤ 2^51)
-- ARGV[3 + 2i], ARGV[4 + 2i]: cost of item i (≤ L), its time in ns ('' = server TIME)
-- reply[i] {code, e, n}: e = t − k·W (time into the window), n = units admitted in it before
"#,
    prelude!(),
    window_state!(),
    r#"
defer = all or #KEYS > 1
for i = 1, #KEYS do
  local key = KEYS[i]
  local cost, at, limit, window = item(i)
  local ts, t = now_of(at)
  local code, _, n, e
  code, _, n, e, ts, t = read_window(key, ts, t, window, false)
  if type(code) == 'table' then return code end
  if not code then
    if cost == 0 or n + cost <= limit then
      code = 1
      if commit and cost > 0 then
        set_state(key, ts .. ' ' .. string.format('%d', n + cost), ttl_ms(window - e, t))
      end
    else
      code = 0
    end
  end
  reply[i] = {code, e, n}
end
return finish()
"#
);

/// Sliding window counter.
pub(crate) const SLIDING_WINDOW: &str = concat!(
    r#"
-- Sliding window counter (SPEC §5), windows aligned to the Unix epoch.
-- KEYS[i]  state of item i: the string "<t> <prev> <cur>", t = time of the newest admission,
--          cur = units admitted in t's window, prev = in the window before it.
-- ARGV[1]  minimum TTL in ms        ARGV[2]  commit: '1' / '0' / '2' (all or nothing)
-- ARGV[3]  limit L (≤ 2^51)          ARGV[4]  window W in ns (1 ms ≤ W ≤ 2^51)
-- ARGV[3 + 2i], ARGV[4 + 2i]: cost of item i (≤ L), its time in ns ('' = server TIME)
-- reply[i] {code, e, prev, cur}: as seen from the current window, before the decision
-- Admission, exactly: cost = 0, or (cur + c − 1)·W + prev·(W − e) < L·W, which is
-- prev·(W − e) < a·W with a = L − cur − c + 1 (false if a ≤ 0); both products may pass 2^53.
"#,
    prelude!(),
    window_state!(),
    r#"
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
"#
);

/// Sliding window log.
pub(crate) const SLIDING_LOG: &str = concat!(
    r#"
-- Sliding window log (SPEC §6): units with time > t − W count.
-- KEYS[i]  log of item i: a sorted set with one member per admitted request,
--          member "<cum>:<cost>:<t>", score cum = units admitted to this log up to and including
--          this request. Scores grow with time, so unit number u belongs to the first member
--          with score ≥ u: the k-th oldest live unit is found in O(log n), and a request of any
--          cost is one member. Renumbered from 0 before cum would pass 2^52.
-- ARGV[1]  minimum TTL in ms        ARGV[2]  commit: '1' / '0' / '2' (all or nothing)
-- ARGV[3]  limit L (≤ 2^51)          ARGV[4]  window W in ns (1 ms ≤ W ≤ 2^51)
-- ARGV[3 + 2i], ARGV[4 + 2i]: cost of item i (≤ L), its time in ns ('' = server TIME)
-- reply[i] {code, count, age_retry, age_newest}: count = live units before the decision;
--          age_retry = t − time of the (count + c − L)-th oldest live unit when denied, else −1;
--          age_newest = t − time of the newest live entry, −1 if none.
"#,
    prelude!(),
    log_state!(),
    r#"
for i = 1, #KEYS do
  local key = KEYS[i]
  local cost, at, limit, window = item(i)
  local ts, t = now_of(at)
  local newest = redis.pcall('ZRANGE', key, -1, -1)
  local code
  local count, base, cum_newest, age_newest, age_retry = 0, 0, 0, -1, -1
  if type(newest) == 'table' and newest.err then
    if string.sub(newest.err, 1, 9) ~= 'WRONGTYPE' then return redis.error_reply(newest.err) end
    code = -1
  elseif newest[1] then
    local ncum, ncost, nts = member(newest[1])
    if not ncum then
      code = -2
    else
      local gap
      ts, t, gap = clamp(ts, t, nts)
      if gap >= window then
        -- Every entry has expired: freed in the background (UNLINK), whatever their number.
        redis.call('UNLINK', key)
      else
        -- Binary search for the first live rank (the newest is live), then drop at most
        -- CLEANUP of the expired entries before it: a call's work stays bounded however many
        -- expired at once, and the rest go in the next calls (each adds at most one).
        local lo, hi = 0, redis.call('ZCARD', key) - 1
        while lo < hi do
          local mid = floor((lo + hi) / 2)
          local _, _, _, mt = member(redis.call('ZRANGE', key, mid, mid)[1])
          if mt and diff(t, mt) >= window then lo = mid + 1 else hi = mid end
        end
        local dropped = math.min(lo, CLEANUP)
        if dropped > 0 then redis.call('ZREMRANGEBYRANK', key, 0, dropped - 1) end
        local first = lo - dropped
        local fcum, fcost = member(redis.call('ZRANGE', key, first, first)[1])
        if not fcum or fcum - fcost > ncum then
          code = -2
        else
          base, cum_newest, age_newest = fcum - fcost, ncum, gap
          count = ncum - base
        end
      end
    end
  end
  if not code then
    if cost == 0 or count + cost <= limit then
      code = 1
      if commit and cost > 0 then
        write(function()
          if cum_newest + cost > RENUMBER_AT then
            renumber(key, base)
            cum_newest = cum_newest - base
          end
          local cum = cum_newest + cost
          local score = string.format('%d', cum)
          redis.call('ZADD', key, score, score .. string.format(':%d:', cost) .. ts)
          redis.call('PEXPIRE', key, ttl_ms(window, t))
        end)
      end
    else
      code = 0
      -- Unit number base + (count + cost − L) must expire first.
      local unit = string.format('%d', base + count + cost - limit)
      local hit = redis.call('ZRANGEBYSCORE', key, unit, '+inf', 'LIMIT', 0, 1)
      local _, _, _, mt = member(hit[1])
      if mt then age_retry = diff(t, mt) else code = -2 end
    end
  end
  reply[i] = {code, count, age_retry, age_newest}
end
return finish()
"#
);

/// Charges to a sliding log: units a node admitted without Redis (during an outage).
pub(crate) const CHARGE_LOG: &str = concat!(
    r#"
-- Charges to a sliding log (SPEC §6), for reconciliation after an outage: units admitted
-- without Redis are added as one entry, never denied (the log may then hold more than L units
-- for a while).
-- KEYS[i]  log of item i, as the sliding-log script keeps it
-- ARGV[1]  minimum TTL in ms        ARGV[2]  unused
-- ARGV[3]  limit L (unused)          ARGV[4]  window W in ns (1 ms ≤ W ≤ 2^51)
-- ARGV[2 + 3i], ARGV[3 + 3i], ARGV[4 + 3i]: units of item i (≥ 1, < 2^51), the time they were
--          admitted (ns since the epoch, by the node's clock), and 'c' or 'c<k>' (with the
--          token KEYS[k])
-- An entry of units admitted W or more ago has expired: nothing to charge. Otherwise the units
-- are appended at the later of their time and the newest entry's (entries stay in time
-- order; a later time only keeps them a little longer).
-- reply[i] {code, units charged}
"#,
    prelude!(),
    log_state!(),
    r#"
local window = tonumber(ARGV[4])
for i = 1, (#ARGV - 4) / 3 do
  local key = KEYS[i]
  local units = tonumber(ARGV[2 + 3 * i])
  local token = token_of(ARGV[4 + 3 * i])
  local ts, t = now_of('')
  local code, n = 1, 0
  local before = charged_before(token)
  if before then code, n = 0, before end
  local newest = redis.pcall('ZRANGE', key, -1, -1)
  local cum_newest, nts, npair = 0, nil, nil
  if type(newest) == 'table' and newest.err then
    if string.sub(newest.err, 1, 9) ~= 'WRONGTYPE' then return redis.error_reply(newest.err) end
    code = -1
  elseif newest[1] then
    local ncum, _, nmt, nmp = member(newest[1])
    if ncum then cum_newest, nts, npair = ncum, nmt, nmp else code = -2 end
  end
  if code == 1 then
    local ats, atp = ARGV[3 + 3 * i], parse_time(ARGV[3 + 3 * i])
    if diff(t, atp) < 0 then ats, atp = ts, t end
    if nts and diff(atp, npair) < 0 then ats, atp = nts, npair end
    local age = diff(t, atp)
    if age < 0 then age = 0 end
    if age < window then
      n = units
      if cum_newest + n > RENUMBER_AT then
        local first = redis.call('ZRANGE', key, 0, 0)[1]
        local fcum, fcost = member(first)
        if fcum then
          renumber(key, fcum - fcost)
          cum_newest = cum_newest - (fcum - fcost)
        end
        if cum_newest + n > RENUMBER_AT then n = 0 end
      end
      if n > 0 then
        local score = string.format('%d', cum_newest + n)
        redis.call('ZADD', key, score, score .. string.format(':%d:', n) .. ats)
        redis.call('PEXPIRE', key, ttl_ms(window - age, t))
      end
    end
    mark_charged(token, n)
  end
  if before then code = 1 end
  reply[i] = {code, n}
end
return reply
"#
);

/// Heartbeats of the nodes that share a limiter, for the `Local` failure policy's share.
pub(crate) const HEARTBEAT: &str = r#"
-- Node heartbeats (not a decision: no prelude).
-- KEYS[1]  a sorted set: member = a node's id, score = when its heartbeat stops counting, in ms
--          since the epoch (the server's TIME, so every node is judged by one clock), by the
--          node's own expiry: nodes with different heartbeat intervals never prune each other
-- ARGV[1]  this node's id            ARGV[2]  expiry in ms: this node, silent this long, is gone
-- ARGV[3]  '1' to beat, '0' to leave
-- reply    the number of live nodes (this one included when beating)
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = tonumber(ARGV[2])
if ARGV[3] == '1' then
  redis.call('ZADD', KEYS[1], string.format('%d', now + expiry), ARGV[1])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('(%d', now))
-- The set lives as long as its last heartbeat counts: no node left, no key left.
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then redis.call('PEXPIREAT', KEYS[1], last[2]) end
return redis.call('ZCARD', KEYS[1])
"#;

/// Leases on GCRA state: the leased tier's grants and returns, in the very state the GCRA
/// script keeps, so that exact and leased nodes spend one budget.
pub(crate) const LEASE_GCRA: &str = concat!(
    r#"
-- Leases on GCRA state (SPEC §1), the leased tier. A grant of g units is g admissions of cost 1
-- at once: the units leave the bucket now (the last g slots of its debt), and the node spends
-- them later, each before its slot is more than the horizon and one T in the past (the node's
-- lease decays), so the fleet's admissions over any interval [a, b] stay within
-- B + 1 + (b − a + horizon)/T (the bound on LeasedLimiter).
-- KEYS[i]  state of item i, as the GCRA script keeps it: "<t> <debt>"
-- ARGV[1]  minimum TTL in ms        ARGV[2]  unused ('1')
-- ARGV[3]  span B·T in ns (≤ 2^51)  ARGV[4]  emission interval T in ns (≥ 1)
-- ARGV[1 + 4i] 'g' grant, 'r' return or 'c' charge ('c<k>': with the token KEYS[k])
-- ARGV[2 + 4i] units (≤ B for a grant or a return; < 2^52 for a charge)
-- ARGV[3 + 4i] return: the TAT (t + debt, ns since the epoch) right after the grant whose units
--              go back; '' otherwise                ARGV[4 + 4i] time in ns ('' = server TIME)
-- grant:  g = min(units, ⌊(B·T − debt)/T⌋), then debt += g·T
-- return: only while the TAT is still the one right after the grant (nothing admitted behind
--         its units since): debt := max(0, debt − units·T), the units go back to the bucket,
--         never beyond B. Units that others' admissions sit behind are not taken back: that
--         would move those admissions earlier, past the lives their leases were given.
-- charge: debt += c·T with c = min(units, ⌊(2^52 − 1 − debt)/T⌋): units a node admitted
--         without a grant (during an outage, or before its first grant arrived) are counted,
--         never denied; the debt may pass B·T, and the key is denied until it drains
-- reply[i] {code, g or units or c, s, ns, debt after, 0, 0}: (s, ns) = the time judged at
"#,
    prelude!(),
    gcra_state!(),
    r#"
local span, interval = tonumber(ARGV[3]), tonumber(ARGV[4])
local most = idiv(span, interval)
local MAX_DEBT = 4503599627370495 -- 2^52 − 1, the largest debt a state holds
for i = 1, (#ARGV - 4) / 4 do
  local key = KEYS[i]
  local op, units, tat = ARGV[4 * i + 1], tonumber(ARGV[4 * i + 2]), ARGV[4 * i + 3]
  local token = token_of(op)
  op = string.sub(op, 1, 1)
  if op ~= 'c' and units > most then units = most end
  local ts, t = now_of(ARGV[4 * i + 4])
  local code, debt, present
  code, debt, ts, t, present = read_gcra(key, ts, t)
  if type(code) == 'table' then return code end
  code = code or 1
  local n = 0
  local before = op == 'c' and charged_before(token)
  if before then
    n = before
  elseif code == 1 then
    if op == 'g' or op == 'c' then
      -- A grant stops at the bucket's span, a charge at the largest debt a state holds.
      local top = span
      if op == 'c' then top = MAX_DEBT end
      if debt < top then n = idiv(top - debt, interval) end
      if n > units then n = units end
      if n > 0 then
        debt = debt + n * interval
        redis.call('SET', key, ts .. ' ' .. string.format('%d', debt), 'PX', ttl_ms(debt, t))
      end
      if op == 'c' then mark_charged(token, n) end
    elseif present and debt > 0 and tat ~= '' and diff(t, parse_time(tat)) + debt == 0 then
      n = units
      debt = debt - units * interval
      if debt <= 0 then
        debt = 0
        redis.call('DEL', key)
      else
        redis.call('SET', key, ts .. ' ' .. string.format('%d', debt), 'PX', ttl_ms(debt, t))
      end
    end
  end
  reply[i] = {code, n, t[1], t[2], debt, 0, 0}
end
return reply
"#
);

/// Leases on fixed-window and sliding-window-counter state (the leased tier).
pub(crate) const LEASE_WINDOW: &str = concat!(
    r#"
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
"#,
    prelude!(),
    window_state!(),
    r#"
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
  local op, units, since = ARGV[4 * i + 1], tonumber(ARGV[4 * i + 2]), ARGV[4 * i + 3]
  local token = token_of(op)
  op = string.sub(op, 1, 1)
  if op ~= 'c' and units > limit then units = limit end
  local ts, t = now_of(ARGV[4 * i + 4])
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
    mark_charged(token, n)
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
"#
);
