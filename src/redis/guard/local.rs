//! The `Local` policy's in-process limiter: this node's share of the quota, following the
//! global state while Redis answers and deciding alone while it does not.

use super::super::rule::RedisRule;
use crate::clock::QuantaClock;
use crate::decision::Decision;
use crate::limiter::any::AnyKeyed;

/// The in-process limiter of the `Local` policy, holding this node's share of the quota.
pub(super) struct Local(AnyKeyed<Vec<u8>, QuantaClock>);

impl Local {
    /// `None` if the share cannot be built in-process (then the policy fails closed).
    pub(super) fn new(rule: &RedisRule, nodes: u64) -> Option<Local> {
        let quota = rule.share(nodes).ok()?;
        AnyKeyed::new(rule.algorithm(), quota, QuantaClock::default())
            .ok()
            .map(Local)
    }

    pub(super) fn rescale(&self, rule: &RedisRule, nodes: u64) {
        let Ok(quota) = rule.share(nodes) else {
            return;
        };
        // The precise clock serves every quota: `set_quota` cannot fail for lack of
        // resolution, and a rule that cannot be built keeps the previous share.
        let _ = self.0.set_quota(quota);
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
        self.0.peek(key, 0).map_or(0, |d| d.remaining())
    }

    pub(super) fn refund(&self, key: &[u8], units: u64) {
        self.0.refund(key, units);
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
        self.0.check_n(key, cost)
    }
}
