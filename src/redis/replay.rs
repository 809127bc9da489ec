//! `tollgate replay --redis URL`: a trace decided through Redis in the trace's own time.
//!
//! Two entry points:
//! - [`replay_trace`] (blocking, streaming) reads a [`TraceReader`] and emits one
//!   [`TraceOutcome`] per request — the very values the in-process [`Replayer`](crate::replay::Replayer)
//!   returns, so the CLI prints them the same way.
//! - [`replay`] (async) decides already-parsed requests and returns the full decisions.
//!
//! Both decide each request at the injected time `t_ms` ms since the trace's origin (windows
//! aligned to `t = 0`, as in-process), under a key prefix of their own
//! (`tollgate:replay:<pid>:<nanos>:<n>`), so a replay starts from empty state and never touches
//! live keys. The keys are deleted at the end (a `SCAN` of that prefix); if a replay is
//! interrupted they expire within the injected-time TTL floor (1 h).

use std::io::BufRead;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionManager;

use super::error::TierError;
use super::exact::RedisLimiter;
use super::rule::RedisRule;
use crate::decision::Decision;
use crate::replay::{TraceCost, TraceError, TraceOutcome, TraceReader};

/// Requests sent per script call during a replay.
const REPLAY_BATCH: usize = 512;

/// The timeout of each call during a replay (batches are large; a replay is not latency-bound).
const REPLAY_TIMEOUT: Duration = Duration::from_secs(5);

/// Why [`replay_trace`] stopped before the end of its input.
///
/// # Examples
/// The two causes, told apart as `tollgate replay --redis` does (a bad trace is the input's
/// fault, exit status 2). Both built here without a server:
/// ```
/// use std::time::Duration;
/// use tollgate::{redis::{TierError, ReplayError}, replay::TraceReader};
/// // A time that is not a number: the reader's error, at line 1.
/// let bad = TraceReader::new("soon,alice\n".as_bytes()).next_request().unwrap().unwrap_err();
/// let stop = ReplayError::from(bad);
/// assert!(matches!(stop, ReplayError::Trace(_)));
/// let stop = ReplayError::from(TierError::Timeout { timeout: Duration::from_secs(5) });
/// assert!(matches!(stop, ReplayError::Redis(e) if e.is_transient()));
/// ```
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReplayError {
    /// A malformed line or a time going backwards: the outcomes of every request before it
    /// were emitted (decision rules: decisions already printed stay valid; exit status 2).
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// Redis failed; outcomes already emitted stay valid, later requests were not decided.
    #[error(transparent)]
    Redis(#[from] TierError),
}

/// Decides the trace `reader` yields through the Redis server at `url` and calls `emit` with
/// each request's [`TraceOutcome`], in order: exactly what the in-process
/// [`Replayer`](crate::replay::Replayer) returns for the same trace and rule
/// (`allow`, `allow DELAY_MS` for `leaky-queue`, `deny`, `error`). Blocks the calling thread
/// (it runs a current-thread tokio runtime of its own; do not call it from async code).
///
/// Requests go to Redis in batches of 512, so outcomes are emitted a batch at a time (and all
/// of them at the end of the input or before a trace error). Returns the number of requests
/// decided.
///
/// # Errors
/// [`ReplayError::Trace`] at the first bad line, after emitting the outcomes of the lines
/// before it; [`ReplayError::Redis`] if Redis fails.
///
/// # Examples
/// ```no_run
/// use std::time::Duration;
/// use tollgate::{AlgorithmName, Quota, redis::{replay_trace, RedisRule}, replay::TraceReader};
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let quota = Quota::new(1, Duration::from_secs(1))?;
/// let rule = RedisRule::for_algorithm(AlgorithmName::FixedWindow, quota)?;
/// let mut reader = TraceReader::new("0,alice\n0,alice\n1000,alice\n".as_bytes());
/// let mut lines = Vec::new();
/// replay_trace("redis://127.0.0.1:6379", rule, &mut reader, |o| lines.push(o.to_string()))?;
/// assert_eq!(lines, ["allow", "deny", "allow"]);
/// # Ok(()) }
/// ```
pub fn replay_trace<R: BufRead>(
    url: &str,
    rule: RedisRule,
    reader: &mut TraceReader<R>,
    mut emit: impl FnMut(TraceOutcome),
) -> Result<u64, ReplayError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| TierError::Server {
            source: redis::RedisError::from(e),
        })?;
    runtime.block_on(async {
        let (limiter, prefix) = replay_limiter(url, rule).await?;
        let shaper = rule.algorithm() == crate::AlgorithmName::LeakyQueue;
        let mut decided = 0u64;
        let result = loop {
            // The next batch: owned copies, since the reader lends each line.
            let mut batch: Vec<(Vec<u8>, TraceCost, u64)> = Vec::with_capacity(REPLAY_BATCH);
            let mut stop = None;
            while batch.len() < REPLAY_BATCH {
                match reader.next_request() {
                    None => {
                        stop = Some(Ok(()));
                        break;
                    }
                    Some(Err(e)) => {
                        stop = Some(Err(ReplayError::Trace(e)));
                        break;
                    }
                    // As in-process: a time past 2^64 ns is judged at the end of time.
                    Some(Ok(r)) => batch.push((
                        r.key.as_bytes().to_vec(),
                        r.units(),
                        r.t_ms.saturating_mul(1_000_000),
                    )),
                }
            }
            let decidable = batch.iter().filter_map(|(key, cost, at)| match cost {
                TraceCost::Units(cost) => Some((key, *cost, *at)),
                TraceCost::Unbounded => None,
            });
            let mut results = limiter.check_batch_at(decidable).await.into_iter();
            for (_, cost, _) in &batch {
                let result = match cost {
                    TraceCost::Unbounded => Ok(TraceOutcome::Error),
                    TraceCost::Units(_) => match results.next() {
                        Some(Ok(d)) if d.allowed() => Ok(TraceOutcome::Allow {
                            delay_nanos: shaper.then(|| d.delay_nanos()),
                        }),
                        Some(Ok(_)) => Ok(TraceOutcome::Deny),
                        Some(Err(e)) if e.as_capacity_exceeded().is_some() => {
                            Ok(TraceOutcome::Error)
                        }
                        Some(Err(e)) => Err(e),
                        None => Err(TierError::bad_reply("a request got no outcome".into())),
                    },
                };
                match result {
                    Ok(outcome) => {
                        emit(outcome);
                        decided += 1;
                    }
                    // Outcomes after a failed one would be out of order: stop here.
                    Err(e) => {
                        stop = Some(Err(ReplayError::Redis(e)));
                        break;
                    }
                }
            }
            if let Some(stop) = stop {
                break stop;
            }
        };
        remove_keys(&limiter, &prefix).await;
        result.map(|()| decided)
    })
}

/// Decides a parsed trace through the Redis server at `url`, as `tollgate replay` does
/// in-process: `trace` yields `(t_ms, key, cost)` with non-decreasing `t_ms`; the result holds
/// one outcome per request, in order: the [`Decision`], or the error of the decision rules for a cost above the
/// capacity.
///
/// # Errors
/// Any Redis failure ends the replay (a replay is all or nothing).
///
/// # Examples
/// ```no_run
/// use tollgate::{Quota, redis::{replay, RedisRule}};
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let rule = RedisRule::named("fixed-window", Quota::per_second(2)?)?;
/// let trace = [(0, "a", 1), (10, "a", 1), (20, "a", 1), (1000, "a", 1), (1000, "a", 5)];
/// let outcomes = replay("redis://127.0.0.1:6379", rule, trace).await?;
/// let allowed: Vec<_> = outcomes.iter().map(|o| o.map(|d| d.allowed())).collect();
/// assert_eq!(allowed[..4], [Ok(true), Ok(true), Ok(false), Ok(true)]);
/// assert!(allowed[4].is_err()); // cost 5 > limit 2: an error, not a denial
/// # Ok(()) }
/// ```
pub async fn replay<I, K>(
    url: &str,
    rule: RedisRule,
    trace: I,
) -> Result<Vec<Result<Decision, crate::LimitError>>, TierError>
where
    I: IntoIterator<Item = (u64, K, u64)>,
    K: AsRef<[u8]>,
{
    let (limiter, prefix) = replay_limiter(url, rule).await?;
    let requests: Vec<(Vec<u8>, u64, u64)> = trace
        .into_iter()
        .map(|(t_ms, key, cost)| (key.as_ref().to_vec(), cost, t_ms.saturating_mul(1_000_000)))
        .collect();
    let mut outcomes = Vec::with_capacity(requests.len());
    let mut failure = None;
    // Batches in order, one at a time: a later request may depend on an earlier one.
    'batches: for batch in requests.chunks(REPLAY_BATCH) {
        let results = limiter
            .check_batch_at(batch.iter().map(|(key, cost, at)| (key, *cost, *at)))
            .await;
        for result in results {
            match result {
                Ok(decision) => outcomes.push(Ok(decision)),
                Err(error) => match error.as_capacity_exceeded() {
                    Some(spec_error) => outcomes.push(Err(spec_error)),
                    None => {
                        failure = Some(error);
                        break 'batches;
                    }
                },
            }
        }
    }
    remove_keys(&limiter, &prefix).await;
    match failure {
        Some(error) => Err(error),
        None => Ok(outcomes),
    }
}

/// A limiter under a prefix no other replay uses, and that prefix.
async fn replay_limiter(url: &str, rule: RedisRule) -> Result<(RedisLimiter, String), TierError> {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    // Relaxed: only uniqueness within this process matters.
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    let prefix = format!("tollgate:replay:{}:{nanos}:{run}", std::process::id());
    let limiter = RedisLimiter::builder(rule)
        .prefix(&prefix)
        .timeout(REPLAY_TIMEOUT)
        .connect_timeout(REPLAY_TIMEOUT)
        .max_batch(REPLAY_BATCH)
        .connect(url)
        .await?;
    Ok((limiter, prefix))
}

/// Best effort, for at most 10 s: deletes every key under the replay's `prefix` (they would
/// expire within the injected-time TTL floor anyway). The prefix has no glob characters.
async fn remove_keys(limiter: &RedisLimiter, prefix: &str) {
    let pattern = format!("{prefix}:*");
    let mut conn: ConnectionManager = limiter.connection();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut cursor: u64 = 0;
    while Instant::now() < deadline {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000);
        let reply = scan.query_async::<(u64, Vec<Vec<u8>>)>(&mut conn);
        let Ok(Ok((next, keys))) = tokio::time::timeout(REPLAY_TIMEOUT, reply).await else {
            return;
        };
        if !keys.is_empty() {
            let mut unlink = redis::cmd("UNLINK");
            unlink.arg(keys);
            let reply = unlink.query_async::<()>(&mut conn);
            let _ = tokio::time::timeout(REPLAY_TIMEOUT, reply).await;
        }
        if next == 0 {
            return;
        }
        cursor = next;
    }
}
