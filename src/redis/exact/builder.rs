//! Configuring a [`RedisLimiter`]: its key prefix, timeouts, batch size, injected-time TTL
//! floor and coalescing, then connecting.

use super::*;

/// Configures a [`RedisLimiter`].
///
/// # Examples
/// ```no_run
/// use std::time::Duration;
/// use tollgate::{Quota, redis::{RedisLimiter, RedisRule}};
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = RedisLimiter::builder(RedisRule::sliding_log(Quota::per_minute(100)?)?)
///     .prefix("api:v2")
///     .timeout(Duration::from_millis(20))
///     .connect("redis://127.0.0.1:6379")
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RedisLimiterBuilder {
    pub(super) rule: RedisRule,
    pub(super) prefix: Vec<u8>,
    pub(super) timeout: Duration,
    pub(super) connect_timeout: Duration,
    pub(super) max_batch: usize,
    pub(super) coalesce: bool,
}

impl RedisLimiterBuilder {
    /// The first segment of every Redis key (default `tollgate`). Limiters that must not share
    /// state, such as two quotas on the same user keys, need different prefixes.
    ///
    /// In it, `{` is written `%7B`, `}` is written `%7D` and `%` is written `%25`, as in the
    /// user key ([`RedisLimiter::redis_key`]): a brace in the prefix would make it the Cluster
    /// hash tag (every key of the limiter in one slot) or, as `{}`, hash a key's state apart
    /// from its charge tokens (`CROSSSLOT`). The user key stays each key's tag.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use tollgate::{Quota, redis::{RedisLimiter, RedisRule}};
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let rule = RedisRule::gcra(Quota::per_second(10)?)?;
    /// // Two quotas on the same user ids: without distinct prefixes they would share state.
    /// let per_second = RedisLimiter::builder(rule).prefix("api:1s").connect("redis://127.0.0.1/").await?;
    /// let per_day = RedisLimiter::builder(RedisRule::fixed_window(Quota::new(10_000, Duration::from_secs(86_400))?)?)
    ///     .prefix("api:1d")
    ///     .connect("redis://127.0.0.1/")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn prefix(mut self, prefix: impl AsRef<[u8]>) -> Self {
        self.prefix = escape_tag(prefix.as_ref());
        self
    }

    /// The timeout of every Redis call ([`DEFAULT_TIMEOUT`] = 50 ms unless set).
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use tollgate::{Quota, redis::{RedisLimiter, RedisRule}};
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let rule = RedisRule::gcra(Quota::per_second(10)?)?;
    /// // A check waits at most 20 ms for Redis; then the caller decides (fail open or closed).
    /// let limiter = RedisLimiter::builder(rule).timeout(Duration::from_millis(20)).connect("redis://127.0.0.1/").await?;
    /// # Ok(()) }
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The timeout for establishing the connection in [`RedisLimiterBuilder::connect`]
    /// ([`DEFAULT_CONNECT_TIMEOUT`] = 1 s unless set).
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use tollgate::{Quota, redis::{RedisLimiter, RedisRule}};
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let rule = RedisRule::gcra(Quota::per_second(10)?)?;
    /// // Start-up may wait longer for Redis than a request ever should.
    /// let limiter = RedisLimiter::builder(rule)
    ///     .connect_timeout(Duration::from_secs(5))
    ///     .connect("redis://127.0.0.1/")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The largest number of checks sent in one script call (at least 1; default
    /// [`DEFAULT_MAX_BATCH`]). A script blocks the server while it runs, so a batch is split
    /// into calls of at most this many checks.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use tollgate::{Quota, redis::{RedisLimiter, RedisRule}};
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let rule = RedisRule::gcra(Quota::per_second(10)?)?;
    /// // Keep each script short on a server that also serves latency-sensitive traffic.
    /// let limiter = RedisLimiter::builder(rule).max_batch(32).connect("redis://127.0.0.1/").await?;
    /// # Ok(()) }
    /// ```
    pub fn max_batch(mut self, max_batch: usize) -> Self {
        self.max_batch = max_batch.max(1);
        self
    }

    /// Whether concurrent checks share script calls (default `true`): a check that finds its
    /// Cluster slot's calls below their limit in flight (two on a single server, one on a
    /// Cluster) is sent at once, alone; checks that arrive while the slot is busy wait for a
    /// call to return and then go together, in one call, in arrival order. No timer is
    /// involved; decisions are exactly those of one call per check, in arrival order per key,
    /// also when the server lost its scripts (the calls in flight are then sent again in the
    /// order they started). Each call runs on a tokio task of its own, so a caller that gives
    /// up (its future dropped) affects no other check: its check is not sent if its call was
    /// not yet formed, else decided and its answer dropped. A check answers within (calls in
    /// flight + 2) × the timeout, or fails with [`TierError::Timeout`]. With `false`, every check
    /// is its own call, on the caller's task.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use tollgate::{Quota, redis::{RedisLimiter, RedisRule}};
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let rule = RedisRule::gcra(Quota::per_second(10)?)?;
    /// // One script call per check, e.g. to measure per-call latency.
    /// let limiter = RedisLimiter::builder(rule).coalesce(false).connect("redis://127.0.0.1/").await?;
    /// # Ok(()) }
    /// ```
    pub fn coalesce(mut self, coalesce: bool) -> Self {
        self.coalesce = coalesce;
        self
    }

    /// A limiter on a [`ConnectionManager`] to `url` (`redis://host:port/db`), which reconnects
    /// by itself after a failure. Loads the rule's script, so that the first check does not
    /// pay for it.
    ///
    /// # Errors
    /// [`TierError::Server`] for a malformed URL; a transient error if Redis cannot be reached
    /// within the connect timeout.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use tollgate::{Quota, redis::{RedisLimiter, RedisRule}};
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let rule = RedisRule::gcra(Quota::per_second(10)?)?;
    /// let limiter = RedisLimiter::builder(rule).connect("redis://127.0.0.1:6379/0").await?;
    /// assert!(limiter.check("alice").await?.allowed());
    /// # Ok(()) }
    /// ```
    pub async fn connect(self, url: &str) -> Result<RedisLimiter<ConnectionManager>, TierError> {
        let client = client(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.timeout))
            .set_max_delay(Duration::from_secs(1));
        let conn = tokio::time::timeout(
            self.connect_timeout,
            ConnectionManager::new_with_config(client.clone(), config),
        )
        .await
        .map_err(|_| TierError::Timeout {
            timeout: self.connect_timeout,
        })??;
        let remake = self.remake(client);
        let limiter = self.build_healing(conn, Some(remake));
        limiter.load_scripts().await?;
        Ok(limiter)
    }

    /// A limiter on a [`ConnectionManager`] to `url` that does not wait for Redis: it returns
    /// at once, even while Redis is down (a node starting during an outage), and connects on
    /// first use, then reconnects by itself (attempts at most 100 ms apart while Redis is
    /// down, so that the limiter is global again soon after Redis answers). Scripts are
    /// loaded by the first check that needs them.
    ///
    /// On its own the limiter's checks fail with transient errors until Redis answers. Behind
    /// a failure policy ([`RedisLimiter::guarded`], [`RedisLimiter::leased`]) it first probes
    /// Redis (within the timeout): if Redis does not answer, the breaker starts open, the
    /// policy decides every check from the first, and the breaker's probe closes it once
    /// Redis answers (within a probe interval, 200 ms by default, and two half-open probes). With
    /// [`FailurePolicy::Local`](crate::redis::FailurePolicy::Local) the node serves its share
    /// for the fleet size it was told ([`FailureHandling::assumed_nodes`](crate::redis::FailureHandling::assumed_nodes));
    /// told none, it denies until a heartbeat counts the fleet, never taking the whole quota.
    ///
    /// # Errors
    /// [`TierError::Server`] for a malformed URL, or if called outside a tokio runtime (the
    /// connection's tasks need one). Never for an unreachable server.
    ///
    /// # Examples
    /// ```no_run
    /// use tollgate::{Quota, redis::{FailureHandling, FailurePolicy, GuardMode, LeaseConfig, RedisLimiter, RedisRule}};
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let rule = RedisRule::gcra(Quota::per_minute(100)?)?;
    /// // Starts whether or not Redis is up; a fleet of 3 nodes.
    /// let limiter = RedisLimiter::builder(rule)
    ///     .connect_lazy("redis://127.0.0.1:6379")
    ///     .await?
    ///     .leased(LeaseConfig::new(), FailureHandling::new(FailurePolicy::Local).assumed_nodes(3))
    ///     .await?;
    /// if limiter.mode() != GuardMode::Global {
    ///     // Redis is down: a third of the quota per key on this node until it answers.
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn connect_lazy(
        self,
        url: &str,
    ) -> Result<RedisLimiter<ConnectionManager>, TierError> {
        let client = client(url)?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(redis::RedisError::from((
                ErrorKind::Client,
                "connect_lazy needs a tokio runtime",
            ))
            .into());
        }
        let config = self.lazy_config();
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), config)?;
        let remake = self.remake(client);
        let mut limiter = self.build_healing(conn, Some(remake));
        limiter.lazy = true;
        Ok(limiter)
    }

    /// A limiter on a Redis Cluster, through the cluster client: `nodes` are the URLs of some
    /// of its nodes (the client discovers the others and follows slot migrations). Batches
    /// are split per slot. Scripts are not loaded here: the first call that finds its node
    /// without one loads it there (an `EVAL` on the key's slot), so a node that does not
    /// answer keeps no other from being used, at start or after a failover. A guarded limiter
    /// cannot replace this connection: after a master that hangs with its connection open is
    /// failed over, its slots' calls keep going to it until the kernel drops the connection
    /// ([`connect_cluster_lazy`](Self::connect_cluster_lazy)'s is replaced; see "On a
    /// Cluster" on [`FailureHandling`](crate::redis::FailureHandling)).
    ///
    /// # Errors
    /// As for [`RedisLimiterBuilder::connect`].
    ///
    /// # Examples
    /// ```no_run
    /// use tollgate::{Quota, redis::{RedisLimiter, RedisRule}};
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RedisLimiter::builder(RedisRule::gcra(Quota::per_second(100)?)?)
    ///     .connect_cluster(&["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_cluster(
        self,
        nodes: &[&str],
    ) -> Result<RedisLimiter<ClusterConnection>, TierError> {
        let client = ClusterClientBuilder::new(nodes.iter().copied())
            .tcp_settings(tcp_settings())
            // Half the wait: a node that does not answer fails its own connection in time for
            // the client to go on without it (it reconnects to that node later).
            .connection_timeout(self.connect_timeout / 2)
            .response_timeout(self.timeout)
            .build()?;
        let conn = tokio::time::timeout(self.connect_timeout, client.get_async_connection())
            .await
            .map_err(|_| TierError::Timeout {
                timeout: self.connect_timeout,
            })??;
        // No `load_scripts`: `SCRIPT LOAD` goes to every node, so one node that does not
        // answer would keep the limiter from starting; a check loads a script where it is
        // missing, on its slot's node alone.
        Ok(self.build(conn))
    }

    /// A limiter on a Redis Cluster that does not wait for it, as
    /// [`RedisLimiterBuilder::connect_lazy`] is for a single server: it returns at once, even
    /// while no node answers, and connects on first use ([`LazyClusterConnection`]: one
    /// attempt at a time, each call failing with a transient error until one succeeds; from
    /// then on the Cluster client's own connection). Guarded and leased limiters on it start
    /// by their failure policy if the Cluster does not answer their first probe, and are
    /// global once a probe finds it.
    ///
    /// # Errors
    /// [`TierError::Server`] for malformed URLs. Never for an unreachable Cluster.
    ///
    /// # Examples
    /// ```no_run
    /// use tollgate::{Quota, redis::{FailureHandling, FailurePolicy, RedisLimiter, RedisRule}};
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RedisLimiter::builder(RedisRule::gcra(Quota::per_second(100)?)?)
    ///     .connect_cluster_lazy(&["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])?
    ///     .guarded(FailureHandling::new(FailurePolicy::Local).assumed_nodes(4))
    ///     .await;
    /// # let _ = limiter;
    /// # Ok(()) }
    /// ```
    pub fn connect_cluster_lazy(
        self,
        nodes: &[&str],
    ) -> Result<RedisLimiter<LazyClusterConnection>, TierError> {
        let client = ClusterClientBuilder::new(nodes.iter().copied())
            .tcp_settings(tcp_settings())
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.timeout)
            .build()?;
        let remake: MakeConnection<LazyClusterConnection> = {
            let client = client.clone();
            Box::new(move || Ok(LazyClusterConnection::new(client.clone())))
        };
        let mut limiter = self.build_healing(LazyClusterConnection::new(client), Some(remake));
        limiter.lazy = true;
        Ok(limiter)
    }

    /// A limiter on a connection of your own (for example a
    /// [`ClusterConnection`](redis::cluster_async::ClusterConnection)). Scripts are loaded on
    /// first use.
    ///
    /// Such a connection is yours to heal: a guarded or leased limiter on it cannot make a new
    /// one, so after a black hole or a demoted master it waits for the connection to recover
    /// by itself (a [`ConnectionManager`] reconnects once the kernel closes the socket; give it
    /// TCP keepalive and `TCP_USER_TIMEOUT` through its client's
    /// [`TcpSettings`](redis::io::tcp::TcpSettings), see [`TCP_USER_TIMEOUT`]). The builder's
    /// own connections ([`connect`](Self::connect), [`connect_lazy`](Self::connect_lazy),
    /// [`connect_cluster_lazy`](Self::connect_cluster_lazy)) are replaced after failed probes.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use tollgate::{Quota, redis::{RedisLimiter, RedisRule}};
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let rule = RedisRule::gcra(Quota::per_second(10)?)?;
    /// // Share one multiplexed connection between several limiters.
    /// let client = redis::Client::open("redis://127.0.0.1/")?;
    /// let conn = redis::aio::ConnectionManager::new(client).await?;
    /// let a = RedisLimiter::builder(rule).prefix("a").build(conn.clone());
    /// let b = RedisLimiter::builder(RedisRule::gcra(Quota::per_minute(100)?)?).prefix("b").build(conn);
    /// # Ok(()) }
    /// ```
    pub fn build<C: RedisConnection>(self, conn: C) -> RedisLimiter<C> {
        self.build_healing(conn, None)
    }

    /// How a limiter on `client` makes a fresh connection to replace a dead or demoted one: a
    /// lazy [`ConnectionManager`] (it connects on its first call, so a replacement made by
    /// the probe task costs nothing until the next probe), retrying its attempts as
    /// [`connect_lazy`](Self::connect_lazy)'s do.
    fn remake(&self, client: redis::Client) -> MakeConnection<ConnectionManager> {
        let config = self.lazy_config();
        Box::new(move || ConnectionManager::new_lazy_with_config(client.clone(), config.clone()))
    }

    fn lazy_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.timeout))
            // While Redis is down, each probe's call drives the next attempt: short delays
            // between attempts put the limiter back to global within a probe or two of Redis
            // answering (a refused attempt costs a loopback round trip, a dead host the
            // connect timeout).
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(100))
    }

    /// [`build`](Self::build), with a way to replace the connection (`remake`) if the
    /// builder made it.
    fn build_healing<C: RedisConnection>(
        self,
        conn: C,
        remake: Option<MakeConnection<C>>,
    ) -> RedisLimiter<C> {
        let heal = remake.map(|make| {
            Arc::new(Heal {
                replaced: AtomicBool::new(false),
                current: parking_lot::RwLock::new(None),
                warming: parking_lot::Mutex::new(None),
                make,
            })
        });
        let mut limiter = RedisLimiter {
            conn: Conn { first: conn, heal },
            rule: self.rule,
            prefix: self.prefix.into(),
            timeout: self.timeout,
            max_batch: self.max_batch,
            lanes: None,
            lazy: false,
        };
        if self.coalesce {
            // A Cluster routes each call on its own: one call in flight a lane keeps order.
            let depth = if C::CLUSTERED { 1 } else { coalesce::PIPELINE };
            let lanes = Arc::new(Lanes::new(depth, self.timeout));
            // The calls' tasks run a copy without lanes: no cycle keeps the lanes alive.
            let sender = limiter.clone();
            lanes.set_spawner(Box::new(move |baton| {
                let sender = sender.clone();
                tokio::spawn(async move { sender.lead(baton).await });
            }));
            limiter.lanes = Some(lanes);
        }
        limiter
    }
}

/// A client for `url` whose connections use [`tcp_settings`].
fn client(url: &str) -> Result<redis::Client, TierError> {
    let info = redis::IntoConnectionInfo::into_connection_info(url)?;
    Ok(redis::Client::open(info.set_tcp_settings(tcp_settings()))?)
}

/// The TCP settings of every connection the builder makes (see [`TCP_KEEPALIVE_IDLE`] and the
/// constants next to it for each one's reason).
pub(crate) fn tcp_settings() -> TcpSettings {
    let keepalive = TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE_IDLE)
        .with_interval(TCP_KEEPALIVE_INTERVAL);
    #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
    let keepalive = keepalive.with_retries(TCP_KEEPALIVE_RETRIES);
    // Nodelay: a check is one small write awaited for its reply; Nagle's algorithm would hold
    // it back behind an unacknowledged one (up to a delayed ACK, 40 ms on Linux).
    let settings = TcpSettings::default()
        .set_nodelay(true)
        .set_keepalive(keepalive);
    #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
    let settings = settings.set_user_timeout(TCP_USER_TIMEOUT);
    settings
}

/// `text` with the bytes that delimit a Cluster hash tag (`{`, `}`) and the escape itself
/// (`%`) written as `%7B`, `%7D`, `%25`.
fn escape_tag(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for &b in text {
        match b {
            b'{' => out.extend_from_slice(b"%7B"),
            b'}' => out.extend_from_slice(b"%7D"),
            b'%' => out.extend_from_slice(b"%25"),
            _ => out.push(b),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::RedisRule;
    use crate::Quota;

    /// The clients `connect` and `connect_lazy` open carry the TCP settings. (That the kernel
    /// gets them is redis-rs's part: it applies a `TcpSettings` to every socket it opens.)
    #[test]
    fn clients_carry_the_tcp_settings() {
        let client = client("redis://127.0.0.1:6379/0").unwrap();
        let settings = client.get_connection_info().tcp_settings();
        assert!(settings.nodelay());
        let keepalive = format!("{:?}", settings.keepalive());
        assert!(keepalive.contains("10s"), "{keepalive}");
        assert!(keepalive.contains("5s"), "{keepalive}");
        #[cfg(target_os = "linux")]
        assert_eq!(settings.user_timeout(), Some(TCP_USER_TIMEOUT));
    }

    /// A prefix's braces never become a hash tag: the user key stays each key's only tag.
    #[test]
    fn a_prefix_cannot_choose_the_hash_tag() {
        let rule = RedisRule::gcra(Quota::per_second(10).unwrap()).unwrap();
        for (prefix, escaped) in [
            ("api", "api"),
            ("tollgate:{login}", "tollgate:%7Blogin%7D"),
            ("{}", "%7B%7D"),
            ("100%", "100%25"),
        ] {
            let builder = RedisLimiter::builder(rule).prefix(prefix);
            assert_eq!(builder.prefix, escaped.as_bytes(), "{prefix}");
        }
        // Distinct prefixes stay distinct.
        let a = RedisLimiter::builder(rule).prefix("{").prefix;
        let b = RedisLimiter::builder(rule).prefix("%7B").prefix;
        assert_ne!(a, b);
    }
}
