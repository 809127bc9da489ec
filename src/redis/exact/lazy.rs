//! A Cluster connection made on first use, so that a node can start while the Cluster does not
//! answer ([`RedisLimiterBuilder::connect_cluster_lazy`](super::RedisLimiterBuilder::connect_cluster_lazy)).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use super::RedisConnection;

/// A Redis Cluster connection that connects on first use (see
/// [`RedisLimiterBuilder::connect_cluster_lazy`](super::RedisLimiterBuilder::connect_cluster_lazy)):
/// until the Cluster answers, each call fails with a transient error (a guarded or leased
/// limiter's failure policy decides meanwhile), and one connection attempt at a time runs on a
/// task of its own. Once connected it is the Cluster client's own
/// [`ClusterConnection`], which follows slot migrations and reconnects by itself. Clones share
/// the connection.
///
/// # Examples
/// ```no_run
/// use tollgate::{Quota, redis::{LazyClusterConnection, RedisLimiter, RedisRule}};
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter: RedisLimiter<LazyClusterConnection> = RedisLimiter::builder(RedisRule::gcra(Quota::per_second(100)?)?)
///     .connect_cluster_lazy(&["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])?;
/// # let _ = limiter;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LazyClusterConnection {
    inner: Arc<Inner>,
}

struct Inner {
    client: ClusterClient,
    conn: OnceLock<ClusterConnection>,
    /// Whether a connection attempt is running: at most one at a time, whatever the calls.
    connecting: AtomicBool,
}

impl std::fmt::Debug for LazyClusterConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyClusterConnection")
            .field("connected", &self.inner.conn.get().is_some())
            .finish_non_exhaustive()
    }
}

impl LazyClusterConnection {
    pub(super) fn new(client: ClusterClient) -> Self {
        LazyClusterConnection {
            inner: Arc::new(Inner {
                client,
                conn: OnceLock::new(),
                connecting: AtomicBool::new(false),
            }),
        }
    }

    /// The connection, or a transient error while there is none: the call that finds none
    /// and no attempt running starts one and waits for it; calls during an attempt fail at once.
    async fn connection(&self) -> RedisResult<ClusterConnection> {
        if let Some(conn) = self.inner.conn.get() {
            return Ok(conn.clone());
        }
        // Relaxed: elects the caller that connects; the connection itself is published by
        // the `OnceLock`.
        if self.inner.connecting.swap(true, Ordering::Relaxed) {
            return Err(not_yet());
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // Relaxed: as above.
            self.inner.connecting.store(false, Ordering::Relaxed);
            return Err(RedisError::from((
                ErrorKind::Client,
                "a lazy Cluster connection needs a tokio runtime",
            )));
        };
        let inner = Arc::clone(&self.inner);
        // On a task of its own: a call that gives up (its timeout) does not cancel the attempt,
        // which may take the connect timeout against hosts that do not answer.
        let attempt = runtime.spawn(async move {
            let result = inner.client.get_async_connection().await;
            let result = result.map(|conn| inner.conn.get_or_init(|| conn).clone());
            // Relaxed: as above.
            inner.connecting.store(false, Ordering::Relaxed);
            result
        });
        attempt.await.unwrap_or_else(|_| Err(not_yet()))
    }
}

/// The error of a call made before the Cluster answered: transient (the breaker's business).
fn not_yet() -> RedisError {
    RedisError::from((
        ErrorKind::ClusterConnectionNotFound,
        "the Cluster has not answered yet",
    ))
}

impl ConnectionLike for LazyClusterConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move { self.connection().await?.req_packed_command(cmd).await })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            self.connection()
                .await?
                .req_packed_commands(pipeline, offset, count)
                .await
        })
    }

    fn get_db(&self) -> i64 {
        // A Cluster has database 0 only.
        0
    }
}

impl RedisConnection for LazyClusterConnection {
    const CLUSTERED: bool = true;
}
