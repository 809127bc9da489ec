//! [`CheckBackend`] for the in-process limiters: a [`KeyedLimiter`] of client keys, and a
//! [`MultiLimiter`] (all or nothing over its quotas).

use std::time::Duration;

use super::{CheckBackend, CheckError, CheckFuture, QuotaInfo, Verdict};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::limiter::Algorithm;
use crate::tower::key::Key;
use crate::{KeyedLimiter, MultiLimiter};

fn info<A: Algorithm>(rule: &A) -> QuotaInfo {
    QuotaInfo {
        limit: rule.limit(),
        window: Duration::from_nanos(rule.window_nanos()),
    }
}

/// Where `key` stands after a refund: the answer of [`CheckBackend::refund`].
fn standing<A, C>(limiter: &KeyedLimiter<Key, A, C>, key: &Key) -> Option<Verdict>
where
    A: Algorithm,
    C: Clock,
{
    let decision = limiter.peek(key, 0).ok()?;
    Some(Verdict { decision, quota: 0 })
}

impl<A, C> CheckBackend for KeyedLimiter<Key, A, C>
where
    A: Algorithm,
    C: Clock + 'static,
{
    fn check<'a>(&'a self, key: &'a Key, cost: u64) -> CheckFuture<'a> {
        CheckFuture::ready(keyed_verdict(self, key, cost))
    }

    fn check_now(&self, key: &Key, cost: u64) -> Option<Result<Verdict, CheckError>> {
        Some(keyed_verdict(self, key, cost))
    }

    fn reserve(&self, key: &Key, cost: u64) -> Option<Result<Verdict, CheckError>> {
        let reserved = self.reserve_n(key, cost);
        Some(
            reserved
                .map(|decision| Verdict { decision, quota: 0 })
                .map_err(CheckError::Limit),
        )
    }

    fn quota_count(&self) -> usize {
        1
    }

    fn quota(&self, index: usize) -> Option<QuotaInfo> {
        (index == 0).then(|| info(&self.rule()))
    }

    fn can_refund(&self) -> bool {
        true
    }

    fn refund(&self, key: &Key, cost: u64) -> Option<Verdict> {
        KeyedLimiter::refund(self, key, cost);
        standing(self, key)
    }

    fn refund_decided(&self, key: &Key, cost: u64, decided: &Decision) -> Option<Verdict> {
        self.refund_decided(key, cost, decided);
        standing(self, key)
    }

    fn keys_held(&self) -> Option<usize> {
        Some(self.len())
    }
}

/// Runs [`MultiLimiter`]'s all-or-nothing protocol over its limits (peek all, charge in order,
/// refund the charged ones if one refuses meanwhile) so that the verdict can name the quota it
/// is about; decisions are the same as [`MultiLimiter::check_n`]'s.
impl<A, C> CheckBackend for MultiLimiter<Key, A, C>
where
    A: Algorithm,
    C: Clock + 'static,
{
    fn check<'a>(&'a self, key: &'a Key, cost: u64) -> CheckFuture<'a> {
        CheckFuture::ready(all_or_nothing(self.limits(), key, cost))
    }

    fn check_now(&self, key: &Key, cost: u64) -> Option<Result<Verdict, CheckError>> {
        Some(all_or_nothing(self.limits(), key, cost))
    }

    fn reserve(&self, key: &Key, cost: u64) -> Option<Result<Verdict, CheckError>> {
        let reserved = self.reserve_n(key, cost);
        Some(
            reserved
                .map(|(decision, quota)| Verdict { decision, quota })
                .map_err(CheckError::Limit),
        )
    }

    fn quota_count(&self) -> usize {
        self.limits().len()
    }

    fn quota(&self, index: usize) -> Option<QuotaInfo> {
        self.limits().get(index).map(|limit| info(&limit.rule()))
    }

    fn can_refund(&self) -> bool {
        true
    }

    /// Refunds every limit, then reports the tightest (least remaining), as a check does.
    fn refund(&self, key: &Key, cost: u64) -> Option<Verdict> {
        let mut tightest: Option<Verdict> = None;
        for (quota, limit) in self.limits().iter().enumerate() {
            limit.refund(key, cost);
            let decision = limit.peek(key, 0).ok()?;
            if tightest.is_none_or(|t| decision.remaining() < t.decision.remaining()) {
                tightest = Some(Verdict { decision, quota });
            }
        }
        tightest
    }

    /// The most keys any of the limits holds.
    fn keys_held(&self) -> Option<usize> {
        self.limits().iter().map(KeyedLimiter::len).max()
    }
}

fn keyed_verdict<A: Algorithm, C: Clock>(
    limiter: &KeyedLimiter<Key, A, C>,
    key: &Key,
    cost: u64,
) -> Result<Verdict, CheckError> {
    limiter
        .check_n(key, cost)
        .map(|decision| Verdict { decision, quota: 0 })
        .map_err(CheckError::Limit)
}

/// [`MultiLimiter`]'s all-or-nothing protocol, as a verdict naming the deciding quota.
fn all_or_nothing<A: Algorithm, C: Clock>(
    limits: &[KeyedLimiter<Key, A, C>],
    key: &Key,
    cost: u64,
) -> Result<Verdict, CheckError> {
    // No limit at all: nothing to refuse, and no quota to report: a failure rather than an
    // invented decision.
    if limits.is_empty() {
        return Err(CheckError::Backend("a MultiLimiter without limits".into()));
    }
    crate::multi::all_or_nothing(limits, key, cost)
        .map(|(decision, quota)| Verdict { decision, quota })
        .map_err(CheckError::Limit)
}
