//! The `Local` policy's in-process limiter: this node's share of the quota, following the
//! global state while Redis answers and deciding alone while it does not.

use super::super::rule::RedisRule;
use crate::decision::Decision;
use crate::{FixedWindow, Gcra, KeyedLimiter, LeakyQueue, SlidingLog, SlidingWindow};

/// The in-process limiter of the `Local` policy, holding this node's share of the quota.
pub(super) enum Local {
    Gcra(KeyedLimiter<Vec<u8>, Gcra>),
    Queue(KeyedLimiter<Vec<u8>, LeakyQueue>),
    Fixed(KeyedLimiter<Vec<u8>, FixedWindow>),
    Sliding(KeyedLimiter<Vec<u8>, SlidingWindow>),
    Log(KeyedLimiter<Vec<u8>, SlidingLog>),
}

impl Local {
    /// `None` if the share cannot be built in-process (then the policy fails closed).
    pub(super) fn new(rule: &RedisRule, nodes: u64) -> Option<Local> {
        let quota = rule.share(nodes).ok()?;
        Some(match rule.name() {
            "gcra" => Local::Gcra(KeyedLimiter::new(Gcra::new(quota).ok()?)),
            "leaky-queue" => Local::Queue(KeyedLimiter::new(LeakyQueue::new(quota).ok()?)),
            "fixed-window" => Local::Fixed(KeyedLimiter::new(FixedWindow::new(quota).ok()?)),
            "sliding-window" => Local::Sliding(KeyedLimiter::new(SlidingWindow::new(quota).ok()?)),
            _ => Local::Log(KeyedLimiter::new(SlidingLog::new(quota).ok()?)),
        })
    }

    pub(super) fn rescale(&self, rule: &RedisRule, nodes: u64) {
        let Ok(quota) = rule.share(nodes) else {
            return;
        };
        // The precise clock serves every quota: `set_quota` cannot fail for lack of
        // resolution, and a rule that cannot be built keeps the previous share.
        let _ = match self {
            Local::Gcra(l) => Gcra::new(quota).map(|r| l.set_quota(r)),
            Local::Queue(l) => LeakyQueue::new(quota).map(|r| l.set_quota(r)),
            Local::Fixed(l) => FixedWindow::new(quota).map(|r| l.set_quota(r)),
            Local::Sliding(l) => SlidingWindow::new(quota).map(|r| l.set_quota(r)),
            Local::Log(l) => SlidingLog::new(quota).map(|r| l.set_quota(r)),
        };
    }

    /// Makes `key` hold `units` (at most the share's capacity): the state the share starts an
    /// outage from, following the global state's last reply.
    pub(super) fn follow(&self, key: &[u8], units: u64) {
        let holds = self.holds(key);
        if holds > units {
            // Within the share's capacity (`holds` is at most that): never an error.
            let _ = self.check(key, holds - units);
        } else if holds < units {
            self.refund(key, units - holds);
        }
    }

    /// What `key` holds now (`remaining` of a peek; the capacity for a key not held).
    pub(super) fn holds(&self, key: &[u8]) -> u64 {
        match self {
            Local::Gcra(l) => l.peek(key, 0),
            Local::Queue(l) => l.peek(key, 0),
            Local::Fixed(l) => l.peek(key, 0),
            Local::Sliding(l) => l.peek(key, 0),
            Local::Log(l) => l.peek(key, 0),
        }
        .map_or(0, |d| d.remaining())
    }

    pub(super) fn refund(&self, key: &[u8], units: u64) {
        match self {
            Local::Gcra(l) => l.refund(key, units),
            Local::Queue(l) => l.refund(key, units),
            Local::Fixed(l) => l.refund(key, units),
            Local::Sliding(l) => l.refund(key, units),
            Local::Log(l) => l.refund(key, units),
        }
    }

    /// Makes `key` hold at most `units` (what it holds now if that is less): the share's
    /// state, not a fresh bucket or window, is where the outage starts for a key the node knew.
    pub(super) fn start_from(&self, key: &[u8], units: u64) {
        let holds = self.holds(key);
        if holds > units {
            // Within the share's capacity (`holds` is at most that): never an error.
            let _ = self.check(key, holds - units);
        }
    }

    #[inline]
    pub(super) fn check(&self, key: &[u8], cost: u64) -> Result<Decision, crate::LimitError> {
        match self {
            Local::Gcra(l) => l.check_n(key, cost),
            Local::Queue(l) => l.check_n(key, cost),
            Local::Fixed(l) => l.check_n(key, cost),
            Local::Sliding(l) => l.check_n(key, cost),
            Local::Log(l) => l.check_n(key, cost),
        }
    }
}
