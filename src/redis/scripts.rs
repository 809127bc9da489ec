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
//! # Where they are
//! Each script is Lua in `src/redis/scripts/`, read as Lua: `prelude.lua` (the helpers every
//! script shares), the reader of its algorithm's state (`gcra_state.lua`, `window_state.lua`,
//! `log_state.lua`) and its own file, concatenated at compile time (`include_str!`).
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

/// The compiled scripts (each hashed once; `EVALSHA` by hash, sent again as `EVAL` on
/// `NOSCRIPT`).
pub(crate) struct Scripts {
    pub gcra: Lua,
    pub fixed_window: Lua,
    pub sliding_window: Lua,
    pub sliding_log: Lua,
    pub heartbeat: Lua,
    pub lease_gcra: Lua,
    pub lease_window: Lua,
    pub charge_log: Lua,
}

/// A script and its source, kept together: `EVALSHA` sends the hash, `EVAL` (reloading a lost
/// script) the source, so every script that can be called can be reloaded.
pub(crate) struct Lua {
    pub script: Script,
    source: &'static str,
}

impl Lua {
    fn new(source: &'static str) -> Lua {
        Lua {
            script: Script::new(source),
            source,
        }
    }
}

/// One script call: `EVALSHA` with the script's keys and arguments. (redis-rs's
/// `ScriptInvocation` reloads a lost script by itself; the coalescer must see the `NOSCRIPT`
/// first, to re-send its calls in their order.)
pub(crate) struct ScriptCall {
    pub script: &'static Lua,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl ScriptCall {
    pub fn new(script: &'static Lua) -> ScriptCall {
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

    /// The `EVAL` command, which also caches the script: routed by its keys as any call, so on
    /// a Cluster it reloads a lost script on the one node that lost it (`SCRIPT LOAD` goes to
    /// every node, and fails while one does not answer).
    pub fn eval(&self) -> redis::Cmd {
        self.command("EVAL", self.script.source)
    }

    /// The `EVALSHA` command.
    pub fn evalsha(&self) -> redis::Cmd {
        self.command("EVALSHA", self.script.script.get_hash())
    }

    /// `name script numkeys key… arg…`.
    fn command(&self, name: &str, script: &str) -> redis::Cmd {
        let mut cmd = redis::cmd(name);
        cmd.arg(script)
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        cmd
    }
}

pub(crate) fn scripts() -> &'static Scripts {
    static SCRIPTS: OnceLock<Scripts> = OnceLock::new();
    SCRIPTS.get_or_init(|| Scripts {
        gcra: Lua::new(GCRA),
        fixed_window: Lua::new(FIXED_WINDOW),
        sliding_window: Lua::new(SLIDING_WINDOW),
        sliding_log: Lua::new(SLIDING_LOG),
        heartbeat: Lua::new(HEARTBEAT),
        lease_gcra: Lua::new(LEASE_GCRA),
        lease_window: Lua::new(LEASE_WINDOW),
        charge_log: Lua::new(CHARGE_LOG),
    })
}

/// GCRA / token bucket / leaky bucket as a meter, and the leaky bucket as a queue (which
/// differs only in the figures the Rust side derives).
pub(crate) const GCRA: &str = concat!(
    include_str!("scripts/prelude.lua"),
    include_str!("scripts/gcra_state.lua"),
    include_str!("scripts/gcra.lua"),
);

/// Fixed window counter.
pub(crate) const FIXED_WINDOW: &str = concat!(
    include_str!("scripts/prelude.lua"),
    include_str!("scripts/window_state.lua"),
    include_str!("scripts/fixed_window.lua"),
);

/// Sliding window counter.
pub(crate) const SLIDING_WINDOW: &str = concat!(
    include_str!("scripts/prelude.lua"),
    include_str!("scripts/window_state.lua"),
    include_str!("scripts/sliding_window.lua"),
);

/// Sliding window log.
pub(crate) const SLIDING_LOG: &str = concat!(
    include_str!("scripts/prelude.lua"),
    include_str!("scripts/log_state.lua"),
    include_str!("scripts/sliding_log.lua"),
);

/// Charges to a sliding log: units a node admitted without Redis (during an outage).
pub(crate) const CHARGE_LOG: &str = concat!(
    include_str!("scripts/prelude.lua"),
    include_str!("scripts/log_state.lua"),
    include_str!("scripts/charge_log.lua"),
);

/// Heartbeats of the nodes that share a limiter, for the `Local` failure policy's share.
pub(crate) const HEARTBEAT: &str = include_str!("scripts/heartbeat.lua");

/// Leases on GCRA state: the leased tier's grants and returns, in the very state the GCRA
/// script keeps, so that exact and leased nodes spend one budget.
pub(crate) const LEASE_GCRA: &str = concat!(
    include_str!("scripts/prelude.lua"),
    include_str!("scripts/gcra_state.lua"),
    include_str!("scripts/lease_gcra.lua"),
);

/// Leases on fixed-window and sliding-window-counter state (the leased tier).
pub(crate) const LEASE_WINDOW: &str = concat!(
    include_str!("scripts/prelude.lua"),
    include_str!("scripts/window_state.lua"),
    include_str!("scripts/lease_window.lua"),
);
