//! The exact tier: every check is one atomic script on the Redis server.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::io::tcp::socket2::TcpKeepalive;
use redis::io::tcp::TcpSettings;
use redis::{ErrorKind, ServerErrorKind, Value};

use super::error::TierError;
use super::rule::reply::Verdict;
use super::rule::RedisRule;
use super::scripts::ScriptCall;
use crate::decision::Decision;

mod builder;
mod call;
mod coalesce;
mod lazy;
mod multi;
pub(crate) mod units;

use self::coalesce::Lanes;

pub use self::builder::RedisLimiterBuilder;
use self::call::{clock_unit, ours, rows};
pub(crate) use self::call::{join_all, scatter};
pub use self::lazy::LazyClusterConnection;
pub use self::multi::RedisMultiLimiter;

pub(crate) use self::units::{new_token, Algo, LogCharge, Reply, UnitOp, Units};

/// The default timeout of every Redis call.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::redis::DEFAULT_TIMEOUT;
/// // The timeout of a limiter whose builder did not set one.
/// assert_eq!(DEFAULT_TIMEOUT, Duration::from_millis(50));
/// ```
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// The default timeout for establishing the connection in [`RedisLimiterBuilder::connect`].
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::redis::DEFAULT_CONNECT_TIMEOUT;
/// assert_eq!(DEFAULT_CONNECT_TIMEOUT, Duration::from_secs(1));
/// // Start-up may wait for Redis twenty times as long as one check.
/// assert_eq!(DEFAULT_CONNECT_TIMEOUT, 20 * tollgate::redis::DEFAULT_TIMEOUT);
/// ```
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The default largest number of checks sent in one script call.
///
/// # Examples
/// ```
/// use tollgate::redis::DEFAULT_MAX_BATCH;
/// // On a single server, a batch of 1,000 checks goes out as 4 script calls.
/// assert_eq!(1_000usize.div_ceil(DEFAULT_MAX_BATCH), 4);
/// ```
pub const DEFAULT_MAX_BATCH: usize = 256;

/// The shortest TTL given to a key written with an injected time. The server cannot see an
/// injected clock, so the TTL it computes from one could expire a key while the injected time
/// has not yet caught up (a replay running slower than its trace); this floor keeps state for
/// the duration of a test or replay (an hour, in ms: a plain integer for the script). Live
/// checks are unaffected.
const INJECTED_MIN_TTL_MS: u64 = 3_600_000;

/// How long a connection made by [`RedisLimiterBuilder`] stays idle before TCP keepalive
/// probes start (10 s): a peer that vanished without a word (a host gone, a firewall that
/// dropped the flow) is noticed on an idle connection in seconds, not after the kernel's
/// default two hours.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::redis::{TCP_KEEPALIVE_IDLE, TCP_KEEPALIVE_INTERVAL, TCP_KEEPALIVE_RETRIES};
/// // An idle connection to a vanished peer is closed after 10 s + 3 × 5 s.
/// let dead_after = TCP_KEEPALIVE_IDLE + TCP_KEEPALIVE_INTERVAL * TCP_KEEPALIVE_RETRIES;
/// assert_eq!(dead_after, Duration::from_secs(25));
/// ```
pub const TCP_KEEPALIVE_IDLE: Duration = Duration::from_secs(10);

/// The time between two TCP keepalive probes (5 s): short enough that the retries below end
/// within a minute, long enough not to add traffic worth counting.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// assert_eq!(tollgate::redis::TCP_KEEPALIVE_INTERVAL, Duration::from_secs(5));
/// ```
pub const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);

/// How many unanswered keepalive probes close the connection (3; set on Linux, Android and
/// Fuchsia, elsewhere the system's count): one lost probe does not close a healthy connection.
///
/// # Examples
/// ```
/// assert_eq!(tollgate::redis::TCP_KEEPALIVE_RETRIES, 3);
/// ```
pub const TCP_KEEPALIVE_RETRIES: u32 = 3;

/// `TCP_USER_TIMEOUT` of the connections made by [`RedisLimiterBuilder`] (5 s; Linux, Android
/// and Fuchsia): data written but not acknowledged for this long closes the connection, so a
/// black-holed connection under traffic fails (and the client reconnects) in seconds rather
/// than after the kernel's retransmissions (about 15 minutes). Longer than any pause a healthy
/// network shows, far shorter than an outage worth riding out on one socket.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// assert_eq!(tollgate::redis::TCP_USER_TIMEOUT, Duration::from_secs(5));
/// ```
pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection the exact tier can send its scripts over.
///
/// Implemented for the client library's connections that reconnect on their own:
/// [`ConnectionManager`] (the default) and the Cluster client's
/// [`ClusterConnection`](redis::cluster_async::ClusterConnection), and
/// [`LazyClusterConnection`] (a Cluster connection made on first use). Clones share one
/// connection: concurrent checks are pipelined on it, none waits for another's reply. (A
/// plain `MultiplexedConnection` is not offered: once dropped by the server, it fails every
/// call for good, and a guarded limiter would stay degraded.)
///
/// # Examples
/// ```no_run
/// use std::time::Duration;
/// use redis::aio::{ConnectionManager, ConnectionManagerConfig};
/// use tollgate::{Quota, redis::{RedisLimiter, RedisRule}};
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// // A connection manager of one's own, retrying its reconnections a little longer.
/// let client = redis::Client::open("redis://127.0.0.1:6379")?;
/// let config = ConnectionManagerConfig::new().set_number_of_retries(10);
/// let conn = ConnectionManager::new_with_config(client, config).await?;
/// let limiter = RedisLimiter::builder(RedisRule::gcra(Quota::per_second(10)?)?).build(conn);
/// # Ok(()) }
/// ```
pub trait RedisConnection: ConnectionLike + Clone + Send + Sync + 'static {
    /// Whether keys are spread over Cluster slots, so that a batch must be split per slot.
    const CLUSTERED: bool = false;
}

impl RedisConnection for ConnectionManager {}
impl RedisConnection for ClusterConnection {
    const CLUSTERED: bool = true;
}

/// An exact, global rate limiter on Redis: every check is one atomic Lua script on the server,
/// judged by the server's clock, so every node of a fleet shares each key's state and clock.
///
/// Decisions follow the decision rules exactly and match the in-process limiters': the same requests at
/// the same times get the same decisions, with the same figures (tested against
/// [`KeyedLimiter`](crate::KeyedLimiter) with a [`ManualClock`](crate::clock::ManualClock)).
/// With the server's clock, durations are rounded up to its microsecond.
///
/// The limiter is cheap to clone; clones share the connection. Every call has a timeout
/// ([`DEFAULT_TIMEOUT`], 50 ms, unless set otherwise).
///
/// # Examples
/// ```no_run
/// use tollgate::{Quota, redis::{RedisLimiter, RedisRule}};
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let rule = RedisRule::gcra(Quota::per_second(10)?.with_burst(20)?)?;
/// let limiter = RedisLimiter::connect("redis://127.0.0.1:6379", rule).await?;
/// let decision = limiter.check("203.0.113.7").await?;
/// if !decision.allowed() {
///     println!("retry after {:?}", decision.retry_after());
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisLimiter<C = ConnectionManager> {
    conn: Conn<C>,
    rule: RedisRule,
    prefix: Arc<[u8]>,
    timeout: Duration,
    max_batch: usize,
    /// Concurrent counting checks of one slot share a call (`None`: one call per check).
    lanes: Option<Arc<Lanes>>,
    /// Built without a first connection ([`RedisLimiterBuilder::connect_lazy`]): a guarded
    /// limiter on it probes Redis before it trusts it.
    lazy: bool,
}

impl<C> std::fmt::Debug for RedisLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("rule", &self.rule)
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .field("timeout", &self.timeout)
            .field("max_batch", &self.max_batch)
            .field("coalesce", &self.lanes.is_some())
            .finish_non_exhaustive()
    }
}

/// # Construction
impl RedisLimiter {
    /// A builder for a limiter running `rule`.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use tollgate::{Quota, redis::{RedisLimiter, RedisRule}};
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let rule = RedisRule::gcra(Quota::per_second(10)?)?;
    /// let limiter = RedisLimiter::builder(rule)
    ///     .prefix("myapp")
    ///     .timeout(Duration::from_millis(25))
    ///     .connect("redis://127.0.0.1/")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn builder(rule: RedisRule) -> RedisLimiterBuilder {
        RedisLimiterBuilder {
            rule,
            prefix: b"tollgate".to_vec(),
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            max_batch: DEFAULT_MAX_BATCH,
            coalesce: true,
        }
    }

    /// A limiter with the default settings on a [`ConnectionManager`] to `url`
    /// (see [`RedisLimiterBuilder::connect`]).
    ///
    /// # Errors
    /// As for [`RedisLimiterBuilder::connect`].
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use tollgate::{Quota, redis::{RedisLimiter, RedisRule}};
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let rule = RedisRule::gcra(Quota::per_second(10)?)?;
    /// // Every setting at its default: prefix `tollgate`, 50 ms per call, coalescing on.
    /// let limiter = RedisLimiter::connect("redis://127.0.0.1:6379", rule).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str, rule: RedisRule) -> Result<RedisLimiter, TierError> {
        RedisLimiter::builder(rule).connect(url).await
    }
}

/// Makes a fresh connection to the same server (see [`Conn`]); no I/O until first used.
pub(crate) type MakeConnection<C> = Box<dyn Fn() -> Result<C, redis::RedisError> + Send + Sync>;

/// The connection a limiter sends over: the one it was built with, until the guarded tier's
/// probes replace it ([`RedisLimiter::replace_connection`]) with one made afresh. Only the
/// builder's own connections can be replaced; one given to
/// [`build`](RedisLimiterBuilder::build) has no `heal`.
///
/// Reading it costs what it did before replacements existed (a clone of `first`, one
/// reference count) plus one `Acquire` load of `replaced`, a plain load on x86 and ARMv8;
/// only after a replacement does a call take the read lock (uncontended but for the rare
/// replacement itself; it is one more atomic update next to the clone's).
#[derive(Clone)]
struct Conn<C> {
    first: C,
    heal: Option<Arc<Heal<C>>>,
}

struct Heal<C> {
    /// Whether `current` holds a replacement (then it, not `first`, is the connection).
    replaced: AtomicBool,
    current: parking_lot::RwLock<Option<C>>,
    /// A replacement made but not in use until it answers (see `replace_when_warm`).
    warming: parking_lot::Mutex<Option<C>>,
    make: MakeConnection<C>,
}

impl<C: Clone> Conn<C> {
    #[inline]
    fn get(&self) -> C {
        if let Some(heal) = &self.heal {
            // Acquire: pairs with the Release store in `replace`, so that the read lock
            // below is taken after the replacement was written.
            if heal.replaced.load(Ordering::Acquire) {
                if let Some(conn) = &*heal.current.read() {
                    return conn.clone();
                }
            }
        }
        self.first.clone()
    }

    /// Replaces the connection with a fresh one; whether it could.
    fn replace(&self) -> Result<bool, redis::RedisError> {
        let Some(heal) = &self.heal else {
            return Ok(false);
        };
        let fresh = (heal.make)()?;
        *heal.current.write() = Some(fresh);
        // Release: see `get`.
        heal.replaced.store(true, Ordering::Release);
        Ok(true)
    }
}

/// One check of a batch: the full Redis key, the cost and the injected time, if any.
#[derive(Clone)]
struct Item {
    key: Vec<u8>,
    cost: u64,
    at: Option<u64>,
}

/// # Checking
impl<C: RedisConnection> RedisLimiter<C> {
    /// Decides a request of cost 1 for `key` now, and counts it if allowed.
    ///
    /// # Errors
    /// A transient or fatal [`TierError`]; see its classes.
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::RedisLimiter;
    /// # async fn demo(limiter: RedisLimiter) -> Result<(), tollgate::redis::TierError> {
    /// let d = limiter.check("203.0.113.7").await?;
    /// println!("allowed={} remaining={} reset={:?}", d.allowed(), d.remaining(), d.reset_after());
    /// # Ok(()) }
    /// ```
    pub async fn check(&self, key: impl AsRef<[u8]>) -> Result<Decision, TierError> {
        self.check_n(key, 1).await
    }

    /// Decides a request of cost `cost` for `key` now, and counts it if allowed.
    ///
    /// # Errors
    /// [`TierError::Capacity`] when the cost can never be admitted (nothing is sent); otherwise a
    /// transient or fatal [`TierError`].
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::RedisLimiter;
    /// # async fn demo(limiter: RedisLimiter) -> Result<(), tollgate::redis::TierError> {
    /// // An upload of 5 MiB against a byte budget counted in MiB.
    /// if limiter.check_n("tenant-7", 5).await?.allowed() {
    ///     // accept the upload
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn check_n(&self, key: impl AsRef<[u8]>, cost: u64) -> Result<Decision, TierError> {
        self.one(key.as_ref(), cost, None, true).await
    }

    /// The decision a request of cost `cost` for `key` would get now; counts nothing.
    ///
    /// # Errors
    /// As for [`RedisLimiter::check_n`].
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::RedisLimiter;
    /// # async fn demo(limiter: RedisLimiter) -> Result<(), tollgate::redis::TierError> {
    /// // Render `RateLimit-Remaining` without spending anything.
    /// let remaining = limiter.peek("alice", 0).await?.remaining();
    /// # Ok(()) }
    /// ```
    pub async fn peek(&self, key: impl AsRef<[u8]>, cost: u64) -> Result<Decision, TierError> {
        self.one(key.as_ref(), cost, None, false).await
    }

    /// Decides many requests `(key, cost)` now, in order, in as few script calls as the
    /// connection allows: one per [`max_batch`](RedisLimiterBuilder::max_batch) checks on a
    /// single server, one per Cluster slot (and `max_batch`) on a Cluster; the calls are
    /// pipelined on the shared connection. Each check is decided as by
    /// [`RedisLimiter::check_n`]; checks of one key see each other in order.
    ///
    /// Returns one result per request, in order. Each script call is atomic; the batch as a
    /// whole is not (its calls may run between other clients' checks), and a failed call fails
    /// only its own checks.
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::RedisLimiter;
    /// # async fn demo(limiter: RedisLimiter) {
    /// let results = limiter.check_batch([("alice", 1), ("bob", 3), ("alice", 1)]).await;
    /// assert_eq!(results.len(), 3);
    /// # }
    /// ```
    pub async fn check_batch<I, K>(&self, requests: I) -> Vec<Result<Decision, TierError>>
    where
        I: IntoIterator<Item = (K, u64)>,
        K: AsRef<[u8]>,
    {
        let items: Vec<Item> = requests
            .into_iter()
            .map(|(key, cost)| self.item(key.as_ref(), cost, None))
            .collect();
        self.call_items(&items, true, true).await
    }

    /// Whether this limiter was built without a first connection (see
    /// [`RedisLimiterBuilder::connect_lazy`]).
    pub(crate) fn is_lazy(&self) -> bool {
        self.lazy
    }

    /// Loads the rule's script into the server's script cache (done by
    /// [`RedisLimiterBuilder::connect`]; otherwise the first check loads it on its node). On a
    /// Cluster this is `SCRIPT LOAD` on every node, and fails while one does not answer.
    ///
    /// # Errors
    /// A transient or fatal [`TierError`].
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::RedisLimiter;
    /// # async fn demo(limiter: RedisLimiter) -> Result<(), tollgate::redis::TierError> {
    /// // After a `SCRIPT FLUSH` or a failover, warm the cache before traffic arrives.
    /// limiter.load_scripts().await?;
    /// # Ok(()) }
    /// ```
    pub async fn load_scripts(&self) -> Result<(), TierError> {
        let mut conn = self.conn.get();
        let load = self.rule.script().script.load_async(&mut conn);
        match tokio::time::timeout(self.timeout, load).await {
            Err(_) => Err(self.timed_out()),
            Ok(result) => result.map(drop).map_err(|e| self.failure(e)),
        }
    }

    /// Whether Redis takes this limiter's writes now, as a check of `at` needs: one `SET`
    /// of a key of its own next to `at`'s state, on its Cluster slot (`<state key>:probe`; with
    /// no `at`, `<prefix>:<algorithm>:probe`), a 10 s TTL, within the timeout. A server that
    /// does not answer, a replica (`READONLY`), or one refusing writes (`OOM`, `MISCONF`)
    /// fails it; a Cluster node other than the slot's master plays no part. (A lost script
    /// cache needs no probe: a check loads the script again.)
    pub(crate) async fn probe(&self, at: Option<&[u8]>) -> Result<(), TierError> {
        self.probe_on(self.conn.get(), at).await
    }

    /// [`probe`](Self::probe) over `conn`.
    async fn probe_on(&self, mut conn: C, at: Option<&[u8]>) -> Result<(), TierError> {
        let mut key = match at {
            // The key's hash tag picks the slot; the suffix keeps it apart from the state.
            Some(key) if !key.is_empty() => self.redis_key(key),
            _ => key_head(&self.prefix, self.rule.key_segment(), b":probe".len()),
        };
        key.extend_from_slice(b":probe");
        let mut set = redis::cmd("SET");
        set.arg(key).arg(1).arg("PX").arg(10_000);
        let write = set.query_async::<()>(&mut conn);
        match tokio::time::timeout(self.timeout, write).await {
            Err(_) => Err(self.timed_out()),
            // A single server that refuses writes as a replica was demoted without its clients
            // being cut: the client library keeps the connection (and so this replica) for
            // good, while a new one to the same address (a virtual IP, a DNS name, a proxy)
            // reaches the new master. (A Cluster client follows its slots by itself.)
            Ok(Err(e))
                if !C::CLUSTERED && e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly) =>
            {
                self.replace_connection("the server is a replica (READONLY)");
                Err(self.failure(e))
            }
            Ok(result) => result.map_err(|e| self.failure(e)),
        }
    }

    /// Replaces the connection with a fresh one once that one answers a probe of `at`, if the
    /// builder made it; whether it did. Until then calls stay on the current connection, which
    /// still serves them where it can (other Cluster masters); the fresh one is kept, and
    /// connecting, across calls.
    pub(crate) async fn replace_when_warm(&self, at: Option<&[u8]>, why: &str) -> bool {
        let Some(heal) = &self.conn.heal else {
            return false;
        };
        let fresh = {
            let mut warming = heal.warming.lock();
            match &*warming {
                Some(conn) => conn.clone(),
                None => match (heal.make)() {
                    Ok(conn) => warming.insert(conn).clone(),
                    Err(error) => {
                        tracing::warn!(%error, why, "could not make a new Redis connection");
                        return false;
                    }
                },
            }
        };
        if let Err(error) = self.probe_on(fresh.clone(), at).await {
            tracing::debug!(%error, why, "the new Redis connection does not answer yet");
            return false;
        }
        *heal.warming.lock() = None;
        *heal.current.write() = Some(fresh);
        // Release: see `Conn::get`.
        heal.replaced.store(true, Ordering::Release);
        tracing::info!(why, "replaced the Redis connection with a new one");
        true
    }

    /// Replaces the connection with a fresh one to the same server, if the builder made it
    /// (see `Conn`); whether it did. Calls in flight finish (or time out) on the old one.
    pub(crate) fn replace_connection(&self, why: &str) -> bool {
        match self.conn.replace() {
            Ok(replaced) => {
                if replaced {
                    tracing::info!(why, "replaced the Redis connection with a new one");
                }
                replaced
            }
            Err(error) => {
                tracing::warn!(%error, why, "could not replace the Redis connection");
                false
            }
        }
    }
}

/// Injected time, for trace replay and the tests: these take the time of each request as
/// nanoseconds since the Unix epoch instead of reading the server's clock. Windows are aligned
/// to that epoch, so a trace whose times start at 0 is decided exactly as `tollgate replay`
/// decides it in-process. Injected and live checks must not meet on one key (a state records
/// the newest time it has seen, and an injected time far from the server's would hold it
/// there): replay runs under a prefix of its own.
impl<C: RedisConnection> RedisLimiter<C> {
    /// [`RedisLimiter::check_n`] at the injected time `at_nanos`.
    ///
    /// # Errors
    /// As for [`RedisLimiter::check_n`].
    #[cfg(test)]
    pub(crate) async fn check_n_at(
        &self,
        key: impl AsRef<[u8]>,
        cost: u64,
        at_nanos: u64,
    ) -> Result<Decision, TierError> {
        self.one(key.as_ref(), cost, Some(at_nanos), true).await
    }

    /// [`RedisLimiter::peek`] at the injected time `at_nanos`.
    ///
    /// # Errors
    /// As for [`RedisLimiter::check_n`].
    #[cfg(test)]
    pub(crate) async fn peek_at(
        &self,
        key: impl AsRef<[u8]>,
        cost: u64,
        at_nanos: u64,
    ) -> Result<Decision, TierError> {
        self.one(key.as_ref(), cost, Some(at_nanos), false).await
    }

    /// [`RedisLimiter::check_batch`] with an injected time per request: `(key, cost,
    /// at_nanos)`.
    pub(crate) async fn check_batch_at<I, K>(&self, requests: I) -> Vec<Result<Decision, TierError>>
    where
        I: IntoIterator<Item = (K, u64, u64)>,
        K: AsRef<[u8]>,
    {
        let items: Vec<Item> = requests
            .into_iter()
            .map(|(key, cost, at)| self.item(key.as_ref(), cost, Some(at)))
            .collect();
        self.call_items(&items, true, true).await
    }
}

/// # Inspection
impl<C> RedisLimiter<C> {
    /// The rule this limiter runs.
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::RedisLimiter;
    /// # fn demo(limiter: RedisLimiter) {
    /// println!("{} with L = {}", limiter.rule().name(), limiter.rule().limit());
    /// # }
    /// ```
    pub fn rule(&self) -> RedisRule {
        self.rule
    }

    /// The timeout of every call.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use tollgate::{Quota, redis::{RedisLimiter, RedisRule, DEFAULT_TIMEOUT}};
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let rule = RedisRule::gcra(Quota::per_second(10)?)?;
    /// let limiter = RedisLimiter::connect("redis://127.0.0.1/", rule).await?;
    /// // Not set on the builder: the default.
    /// assert_eq!(limiter.timeout(), DEFAULT_TIMEOUT);
    /// # Ok(()) }
    /// ```
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The connection in use now, shared (a clone of it). That is the one the limiter was
    /// built with, unless a guarded or leased limiter on it replaced it after failed probes
    /// (see [`GuardedLimiter`](crate::redis::GuardedLimiter)).
    ///
    /// # Examples
    /// ```no_run
    /// use tollgate::redis::RedisLimiter;
    /// # async fn demo(limiter: RedisLimiter) -> Result<(), Box<dyn std::error::Error>> {
    /// // Run other commands over the limiter's own connection (the default reconnects by itself).
    /// let mut conn = limiter.connection();
    /// let pong: String = redis::cmd("PING").query_async(&mut conn).await?;
    /// assert_eq!(pong, "PONG");
    /// # Ok(()) }
    /// ```
    pub fn connection(&self) -> C
    where
        C: Clone,
    {
        self.conn.get()
    }

    /// The Redis key holding `key`'s state: `<prefix>:<algorithm>:{<key>}`. The user key is
    /// the Cluster hash tag, so every state kept for one user key (by any algorithm) lives in
    /// one slot. In it, `}` is written `%7D` and `%` is written `%25`: a `}` would end the tag
    /// early and let a key's text (a client's header, say) choose the slot, and the escape
    /// keeps distinct keys distinct. An empty user key has no tag of its own and is placed by
    /// the whole name; every state is still one Redis key.
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::RedisLimiter;
    /// # fn demo(limiter: RedisLimiter) {
    /// assert_eq!(limiter.redis_key("alice"), b"tollgate:gcra:{alice}".to_vec());
    /// assert_eq!(limiter.redis_key("a}b%"), b"tollgate:gcra:{a%7Db%25}".to_vec());
    /// # }
    /// ```
    pub fn redis_key(&self, key: impl AsRef<[u8]>) -> Vec<u8> {
        state_key(&self.prefix, self.rule.key_segment(), key.as_ref())
    }
}

/// `<prefix>:<segment>:{<key>}`, the key's `}` and `%` escaped (`%7D`, `%25`) so that a
/// client's bytes can neither close the hash tag early (and pick another Cluster slot) nor
/// make two keys one.
pub(crate) fn state_key(prefix: &[u8], segment: &str, key: &[u8]) -> Vec<u8> {
    let mut out = key_head(prefix, segment, key.len() + 3);
    out.extend_from_slice(b":{");
    for &b in key {
        match b {
            b'}' => out.extend_from_slice(b"%7D"),
            b'%' => out.extend_from_slice(b"%25"),
            _ => out.push(b),
        }
    }
    out.push(b'}');
    out
}

/// `<prefix>:<segment>`, the head of every key a rule writes, with room for `more` bytes after.
fn key_head(prefix: &[u8], segment: &str, more: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + 1 + segment.len() + more);
    out.extend_from_slice(prefix);
    out.push(b':');
    out.extend_from_slice(segment.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_replies_are_errors() {
        let cases = [
            Value::Nil,
            Value::Int(3),
            Value::Okay,
            Value::Array(vec![Value::Nil]),
            Value::Array(vec![Value::Array(vec![Value::BulkString(b"1".to_vec())])]),
            Value::Array(vec![
                Value::Array(vec![Value::Int(1)]),
                Value::Array(vec![]),
            ]),
        ];
        for case in cases {
            assert!(matches!(rows(case, 1), Err(TierError::BadReply { .. })));
        }
        let ok = Value::Array(vec![Value::Array(vec![Value::Int(1), Value::Int(0)])]);
        assert_eq!(rows(ok, 1).unwrap(), vec![vec![1, 0]]);
    }
}
