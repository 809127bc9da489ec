//! The one async check a policy makes, and its in-process implementations.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::decision::{Decision, LimitError};

use super::key::Key;

mod in_process;

/// What a backend answered: the decision, and which of its quotas it is about.
///
/// # Examples
/// ```
/// use tollgate::tower::{CheckBackend, Key};
/// use tollgate::{Gcra, MultiLimiter, Quota};
/// // Two quotas: 10 per second, 3 per hour.
/// let backend = MultiLimiter::<Key, _>::new([Gcra::new(Quota::per_second(10)?)?, Gcra::new(Quota::per_hour(3)?)?]);
/// let rt = tokio::runtime::Builder::new_current_thread().build()?;
/// let key = Key::from("alice");
/// let verdict = rt.block_on(CheckBackend::check(&backend, &key, 2))?;
/// // Admitted; the hourly quota (index 1) is the one with the fewest units left: 1.
/// assert!(verdict.decision.allowed());
/// assert_eq!((verdict.quota, verdict.decision.remaining()), (1, 1));
/// // Refused by the hourly quota: 1 unit left, 2 asked.
/// let verdict = rt.block_on(CheckBackend::check(&backend, &key, 2))?;
/// assert_eq!((verdict.decision.allowed(), verdict.quota), (false, 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The decision (for several quotas: the refusing quota's, or when admitted the one with
    /// the fewest units remaining).
    pub decision: Decision,
    /// The index of the quota the decision is about, in `0..backend.quota_count()`.
    pub quota: usize,
}

impl Verdict {
    /// The same verdict about quota `quota + offset` (a backend's quotas among a policy's).
    pub(crate) fn offset_quota(self, offset: usize) -> Verdict {
        Verdict {
            quota: self.quota + offset,
            ..self
        }
    }
}

/// Why a backend could not decide.
///
/// # Examples
/// ```
/// use tollgate::tower::{CheckBackend, CheckError, Key};
/// use tollgate::{Gcra, KeyedLimiter, Quota};
/// let backend = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?);
/// let rt = tokio::runtime::Builder::new_current_thread().build()?;
/// // A cost above the capacity (10) can never be admitted: an error, not a denial.
/// let err = rt.block_on(CheckBackend::check(&backend, &Key::from("k"), 11)).unwrap_err();
/// assert!(matches!(
///     err,
///     CheckError::Limit(tollgate::LimitError::CapacityExceeded { cost: 11, capacity: 10 })
/// ));
/// // A network backend reports its own failures as `Backend`.
/// let err = CheckError::Backend("connection reset".into());
/// assert_eq!(err.to_string(), "rate-limit backend failed: connection reset");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The limiter refused to decide: a cost above the capacity (the request can never be
    /// admitted) or a full key table.
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// The backend failed (for a network backend: a timeout, a dropped connection).
    #[error("rate-limit backend failed: {0}")]
    Backend(Box<dyn std::error::Error + Send + Sync>),
}

/// One quota of a backend, as the IETF `RateLimit-Policy` field shows it.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::tower::{CheckBackend, Key, QuotaInfo};
/// use tollgate::{FixedWindow, KeyedLimiter, Quota};
/// let backend = KeyedLimiter::<Key, _>::new(FixedWindow::new(Quota::per_minute(100)?)?);
/// assert_eq!(backend.quota(0), Some(QuotaInfo { limit: 100, window: Duration::from_secs(60) }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaInfo {
    /// `L`: units per window.
    pub limit: u64,
    /// `W`.
    pub window: Duration,
}

/// The future of [`CheckBackend::check`]: ready at once for an in-process limiter (no
/// allocation), or a boxed future for a network backend.
///
/// # Examples
/// ```
/// use tollgate::tower::{CheckBackend, Key};
/// use tollgate::{Gcra, KeyedLimiter, Quota};
/// let backend = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?);
/// let key = Key::from("k");
/// let future = CheckBackend::check(&backend, &key, 1);
/// // In process: decided already, nothing boxed.
/// assert_eq!(format!("{future:?}"), "CheckFuture::Ready");
/// let rt = tokio::runtime::Builder::new_current_thread().build()?;
/// assert!(rt.block_on(future)?.decision.allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CheckFuture<'a>(State<'a>);

type BoxedCheck<'a> = Pin<Box<dyn Future<Output = Result<Verdict, CheckError>> + Send + 'a>>;

enum State<'a> {
    Ready(Option<Result<Verdict, CheckError>>),
    Boxed(BoxedCheck<'a>),
}

impl<'a> CheckFuture<'a> {
    /// An answer known now.
    ///
    /// # Examples
    /// A backend that admits everything, as a stand-in in tests:
    /// ```
    /// use tollgate::tower::{CheckBackend, CheckFuture, Key, QuotaInfo, Verdict};
    /// use tollgate::{Decision, Gcra, Quota};
    /// struct Always(Decision);
    /// impl CheckBackend for Always {
    ///     fn check<'a>(&'a self, _key: &'a Key, _cost: u64) -> CheckFuture<'a> {
    ///         CheckFuture::ready(Ok(Verdict { decision: self.0, quota: 0 }))
    ///     }
    ///     fn quota_count(&self) -> usize { 1 }
    ///     fn quota(&self, _index: usize) -> Option<QuotaInfo> { None }
    /// }
    /// // Any allowed decision will do: a fresh limiter's first one.
    /// let decision = tollgate::Limiter::new(Gcra::new(Quota::per_second(1)?)?).check();
    /// let backend = Always(decision);
    /// let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// assert!(rt.block_on(backend.check(&Key::from("k"), 5))?.decision.allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ready(result: Result<Verdict, CheckError>) -> Self {
        CheckFuture(State::Ready(Some(result)))
    }

    /// An answer `future` will give.
    ///
    /// # Examples
    /// A backend that asks another service (here a `tokio` task standing in for the network):
    /// ```
    /// use tollgate::tower::{CheckBackend, CheckError, CheckFuture, Key, QuotaInfo};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// struct Remote(std::sync::Arc<KeyedLimiter<Key, Gcra>>);
    /// impl CheckBackend for Remote {
    ///     fn check<'a>(&'a self, key: &'a Key, cost: u64) -> CheckFuture<'a> {
    ///         let (limiter, key) = (self.0.clone(), key.clone());
    ///         CheckFuture::boxed(async move {
    ///             let answer = tokio::spawn(async move { CheckBackend::check(&*limiter, &key, cost).await }).await;
    ///             answer.map_err(|e| CheckError::Backend(e.into()))?
    ///         })
    ///     }
    ///     fn quota_count(&self) -> usize { 1 }
    ///     fn quota(&self, index: usize) -> Option<QuotaInfo> { self.0.quota(index) }
    /// }
    /// let backend = Remote(std::sync::Arc::new(KeyedLimiter::new(Gcra::new(Quota::per_second(1)?)?)));
    /// let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// let key = Key::from("k");
    /// assert!(rt.block_on(backend.check(&key, 1))?.decision.allowed());
    /// assert!(!rt.block_on(backend.check(&key, 1))?.decision.allowed()); // 1 per second
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn boxed(future: impl Future<Output = Result<Verdict, CheckError>> + Send + 'a) -> Self {
        CheckFuture(State::Boxed(Box::pin(future)))
    }

    /// The same answer with its quota index moved by `offset` (a ready answer stays ready:
    /// no allocation).
    pub(crate) fn offset_quota(self, offset: usize) -> Self {
        let shift = move |v: Verdict| v.offset_quota(offset);
        match self.0 {
            State::Ready(result) => CheckFuture(State::Ready(result.map(|r| r.map(shift)))),
            State::Boxed(future) => CheckFuture::boxed(async move { future.await.map(shift) }),
        }
    }
}

impl Future for CheckFuture<'_> {
    type Output = Result<Verdict, CheckError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.0 {
            State::Ready(result) => match result.take() {
                Some(result) => Poll::Ready(result),
                // Polled again after completion: a caller bug; stay pending rather than panic.
                None => Poll::Pending,
            },
            State::Boxed(future) => future.as_mut().poll(cx),
        }
    }
}

impl std::fmt::Debug for CheckFuture<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            State::Ready(_) => "CheckFuture::Ready",
            State::Boxed(_) => "CheckFuture::Boxed",
        })
    }
}

/// What a policy checks its requests against: one async call, so an in-process limiter and a
/// network one are interchangeable (switching a policy's backend is the one argument of
/// [`Policy::new`](super::Policy::new)).
///
/// Implemented for [`KeyedLimiter`](crate::KeyedLimiter) and [`MultiLimiter`](crate::MultiLimiter) keyed by [`Key`] (on their default
/// store, any clock), for `Arc` of any backend (keep a handle to change quotas at run time),
/// and (feature `redis`) for the Redis tier's limiters wrapped in `RedisBackend`.
///
/// # Examples
/// A backend of your own:
/// ```
/// use tollgate::tower::{CheckBackend, CheckFuture, Key, QuotaInfo, Verdict};
/// use tollgate::{Gcra, KeyedLimiter, Quota};
///
/// /// Logs each key, then asks an in-process limiter.
/// struct Logged(KeyedLimiter<Key, Gcra>);
///
/// impl CheckBackend for Logged {
///     fn check<'a>(&'a self, key: &'a Key, cost: u64) -> CheckFuture<'a> {
///         println!("checking {key}");
///         CheckBackend::check(&self.0, key, cost)
///     }
///     fn quota_count(&self) -> usize {
///         1
///     }
///     fn quota(&self, index: usize) -> Option<QuotaInfo> {
///         CheckBackend::quota(&self.0, index)
///     }
/// }
/// ```
// A policy over a quick start's `KeyedLimiter<String, _>` failed with a bare E0277: say what
// a policy's limiter is keyed by, and the shortcut that needs no key type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a backend a tower `Policy` can check",
    note = "a policy's in-process limiter is keyed by the layer's client key: `KeyedLimiter<tollgate::tower::Key, _>` or `MultiLimiter<tollgate::tower::Key, _>`",
    note = "`Policy::gcra(name, quota)` or `Policy::keyed(name, rule)` builds that limiter for you"
)]
pub trait CheckBackend: Send + Sync + 'static {
    /// Decides a request of `cost` units for `key`, and counts it if allowed.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{CheckBackend, Key};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let backend = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?);
    /// let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// let verdict = rt.block_on(CheckBackend::check(&backend, &Key::from("k"), 4))?;
    /// // Capacity 10, 4 spent.
    /// assert_eq!(verdict.decision.remaining(), 6);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn check<'a>(&'a self, key: &'a Key, cost: u64) -> CheckFuture<'a>;

    /// Decides as [`CheckBackend::check`] does, when the backend can without waiting (an
    /// in-process limiter); `None` if it cannot, and then it did nothing: no unit is charged
    /// and the caller uses `check`. The default returns `None`. A backend that answers here
    /// lets the tower layer serve a request without allocating a future for it.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{CheckBackend, Key};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let backend = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_hour(1)?)?);
    /// let key = Key::from("k");
    /// // In process: decided at once, and counted.
    /// assert!(backend.check_now(&key, 1).unwrap()?.decision.allowed());
    /// assert!(!backend.check_now(&key, 1).unwrap()?.decision.allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn check_now(&self, key: &Key, cost: u64) -> Option<Result<Verdict, CheckError>> {
        let _ = (key, cost);
        None
    }

    /// Reserves `cost` units for `key`, for the layer's delay mode: as a check, except that a
    /// rule that can take units ahead (GCRA, the leaky queue) admits the request at once with a
    /// [`Decision::delay`](crate::Decision::delay) until its slot, and the next reservation
    /// queues after it, so that waiters are served first come, first served, each charged
    /// once. `None` (the default): the backend cannot, and did nothing; delay mode then sleeps
    /// for each refusal's `retry_after` and checks again. A backend that reserves must also
    /// [`refund`](CheckBackend::refund): a waiter that gives up hands its slot back.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::clock::ManualClock;
    /// use tollgate::tower::{CheckBackend, Key};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let backend = KeyedLimiter::<Key, _, _>::with_clock(Gcra::new(Quota::per_second(10)?)?, ManualClock::new())?;
    /// let key = Key::from("k");
    /// backend.check_n(&key, 10)?; // the burst
    /// // (The trait's method: `KeyedLimiter::reserve` answers a `Decision` directly.)
    /// let first = CheckBackend::reserve(&backend, &key, 1).unwrap()?.decision;
    /// let second = CheckBackend::reserve(&backend, &key, 1).unwrap()?.decision;
    /// assert!(first.allowed() && second.allowed());
    /// assert_eq!((first.delay(), second.delay()), (Duration::from_millis(100), Duration::from_millis(200)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn reserve(&self, key: &Key, cost: u64) -> Option<Result<Verdict, CheckError>> {
        let _ = (key, cost);
        None
    }

    /// How many quotas this backend enforces (all or nothing).
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{CheckBackend, Key};
    /// use tollgate::{Gcra, KeyedLimiter, MultiLimiter, Quota};
    /// let one = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?);
    /// let two = MultiLimiter::<Key, _>::new([Gcra::new(Quota::per_second(10)?)?, Gcra::new(Quota::per_hour(1_000)?)?]);
    /// assert_eq!((one.quota_count(), two.quota_count()), (1, 2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn quota_count(&self) -> usize;

    /// Quota `index` (for the `RateLimit-Policy` header), or `None` if out of range.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::tower::{CheckBackend, Key};
    /// use tollgate::{Gcra, MultiLimiter, Quota};
    /// let backend = MultiLimiter::<Key, _>::new([Gcra::new(Quota::per_second(10)?)?, Gcra::new(Quota::per_hour(1_000)?)?]);
    /// let hourly = backend.quota(1).unwrap();
    /// assert_eq!((hourly.limit, hourly.window), (1_000, Duration::from_secs(3_600)));
    /// assert_eq!(backend.quota(2), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn quota(&self, index: usize) -> Option<QuotaInfo>;

    /// Whether [`CheckBackend::refund`] gives units back (default `false`). A policy that
    /// refunds by response status ([`Policy::refund_when`](super::Policy::refund_when)) is
    /// refused at build time on a backend that cannot.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{CheckBackend, Key};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_hour(1)?)?);
    /// let key = Key::from("k");
    /// assert!(limiter.check(&key)?.allowed());
    /// assert!(limiter.can_refund());
    /// CheckBackend::refund(&limiter, &key, 1);
    /// assert!(limiter.check(&key)?.allowed()); // the unit came back
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn can_refund(&self) -> bool {
        false
    }

    /// Gives back `cost` units admitted to `key` (a refund by response status), and returns the
    /// key's state after it, as a decision of cost 0 sees it, so that the response's headers
    /// show the units given back (`None`: unknown, the headers keep the first decision). The
    /// default does nothing and returns `None`.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{CheckBackend, Key};
    /// use tollgate::{FixedWindow, KeyedLimiter, Quota};
    /// let backend = KeyedLimiter::<Key, _>::new(FixedWindow::new(Quota::per_hour(3)?)?);
    /// let key = Key::from("k");
    /// assert_eq!(backend.check_n(&key, 3)?.remaining(), 0);
    /// // The request failed with a 5xx: its units were not really used.
    /// let after = CheckBackend::refund(&backend, &key, 3).expect("an in-process limiter knows");
    /// assert_eq!(after.decision.remaining(), 3); // what the response's headers now say
    /// assert_eq!(backend.check(&key)?.remaining(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn refund(&self, key: &Key, cost: u64) -> Option<Verdict> {
        let _ = (key, cost);
        None
    }

    /// [`refund`](CheckBackend::refund) of the units a decision of this backend admitted
    /// (`decided`: a reservation whose waiter gave up, or a request refunded by its
    /// response), to the state it charged, whatever became of `key` since. On a keyed limiter
    /// at `max_keys` with [`OverflowPolicy::Shared`](crate::OverflowPolicy::Shared), a new key's
    /// units may have been charged to the state such keys share: they go back there, not to
    /// the key's own state should it have found room meanwhile. The default refunds by key.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{CheckBackend, Key};
    /// use tollgate::{FixedWindow, KeyedLimiter, OverflowPolicy, Quota};
    /// let backend = KeyedLimiter::<Key, _>::builder(FixedWindow::new(Quota::per_hour(2)?)?)
    ///     .max_keys(1, OverflowPolicy::Shared)
    ///     .build()?;
    /// let (a, b) = (Key::from("a"), Key::from("b"));
    /// backend.check(&a)?;
    /// let shared = backend.check_n(&b, 2)?; // no room for "b": the shared state pays
    /// assert!(shared.allowed());
    /// CheckBackend::refund_decided(&backend, &b, 2, &shared);
    /// assert!(backend.check_n(&Key::from("c"), 2)?.allowed(), "the shared state got its units back");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn refund_decided(&self, key: &Key, cost: u64, decided: &Decision) -> Option<Verdict> {
        let _ = decided;
        self.refund(key, cost)
    }

    /// How many keys this backend holds state for, if it knows (the in-process limiters do);
    /// reported as a gauge by [`RateLimitLayer::record_gauges`](super::RateLimitLayer::record_gauges).
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{CheckBackend, Key};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_hour(1)?)?);
    /// limiter.check(&Key::from("a"))?;
    /// assert_eq!(limiter.keys_held(), Some(1));
    /// assert_eq!(limiter.degraded(), None); // in process: no degraded mode
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn keys_held(&self) -> Option<usize> {
        None
    }

    /// Whether the backend is degraded (a Redis limiter deciding by its failure policy while
    /// Redis is unreachable; on a Cluster, while any master's breaker is open, though the
    /// other masters' keys are still decided by Redis), if it can be; `None` for a backend
    /// that has no such mode.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{CheckBackend, Key};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let backend = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?);
    /// // An in-process limiter never depends on a server.
    /// assert_eq!(backend.degraded(), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn degraded(&self) -> Option<bool> {
        None
    }
}

impl<T: CheckBackend + ?Sized> CheckBackend for Arc<T> {
    fn check<'a>(&'a self, key: &'a Key, cost: u64) -> CheckFuture<'a> {
        (**self).check(key, cost)
    }

    fn check_now(&self, key: &Key, cost: u64) -> Option<Result<Verdict, CheckError>> {
        (**self).check_now(key, cost)
    }

    fn reserve(&self, key: &Key, cost: u64) -> Option<Result<Verdict, CheckError>> {
        (**self).reserve(key, cost)
    }

    fn quota_count(&self) -> usize {
        (**self).quota_count()
    }

    fn quota(&self, index: usize) -> Option<QuotaInfo> {
        (**self).quota(index)
    }

    fn can_refund(&self) -> bool {
        (**self).can_refund()
    }

    fn refund(&self, key: &Key, cost: u64) -> Option<Verdict> {
        (**self).refund(key, cost)
    }

    fn refund_decided(&self, key: &Key, cost: u64, decided: &Decision) -> Option<Verdict> {
        (**self).refund_decided(key, cost, decided)
    }

    fn keys_held(&self) -> Option<usize> {
        (**self).keys_held()
    }

    fn degraded(&self) -> Option<bool> {
        (**self).degraded()
    }
}
