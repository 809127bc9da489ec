//! The layer's verdict for one policy: a check, and in delay mode the wait for a decision that
//! admits the request within the policy's `max_wait`.

use super::backend::{CheckError, Verdict};
use super::key::Key;
#[cfg(feature = "tokio")]
use super::policy::Mode;
use super::policy::Policy;

/// The policy's verdict on `key`, and how long the request waited for it: one check, or in
/// delay mode the decision that admits the request within `max_wait` (else a refusal).
///
/// Delay mode checks first (most requests pass at once, and a refusal says how long the wait
/// would be, charging nothing). A refusal within `max_wait` takes a place in the queue where
/// the backend keeps one ([`CheckBackend::reserve`]: GCRA, the leaky queue), so waiters are
/// served first come, first served and charged once; a backend without reservations sleeps for
/// the refusal's `retry_after` and checks again.
pub(super) async fn policy_verdict(
    policy: &Policy,
    key: &Key,
    cost: u64,
) -> Result<(Verdict, std::time::Duration), CheckError> {
    let verdict = policy.backend.check(key, cost).await?;
    #[cfg(feature = "tokio")]
    if let Mode::Delay { max_wait } = policy.mode {
        return delay(policy, key, cost, max_wait, verdict).await;
    }
    Ok((verdict, std::time::Duration::ZERO))
}

/// Delay mode after the first check's `verdict` (see [`policy_verdict`]).
#[cfg(feature = "tokio")]
async fn delay(
    policy: &Policy,
    key: &Key,
    cost: u64,
    max_wait: std::time::Duration,
    mut verdict: Verdict,
) -> Result<(Verdict, std::time::Duration), CheckError> {
    let start = tokio::time::Instant::now();
    // A bound too far away to represent is no bound.
    let deadline = start.checked_add(max_wait);
    // (`checked_add`: an instant past the clock's range is past any deadline.)
    let too_long = |wait: std::time::Duration| {
        let wake = tokio::time::Instant::now().checked_add(wait);
        deadline.is_some_and(|d| wake.is_none_or(|wake| wake > d))
    };
    // Zero unless the request slept: only then was it delayed.
    let waited = |slept: bool| {
        if slept {
            start.elapsed()
        } else {
            std::time::Duration::ZERO
        }
    };
    let mut slept = false;
    // A place among the policy's waiters, taken before the first sleep.
    let mut place = None;
    let mut room = || {
        place.is_some() || {
            place = policy.waiters.enter(key);
            place.is_some()
        }
    };
    loop {
        let decision = verdict.decision;
        if decision.allowed() {
            // A reservation: its slot is `delay` away. A client that hangs up before it gives
            // the slot back (where the backend can refund).
            let waits = !decision.delay().is_zero();
            if waits && (too_long(decision.delay()) || !room()) {
                // A queue deeper than `max_wait` (a leaky queue's check reserves), others took
                // the places up to the deadline since the check, or too many wait already:
                // give it back, refuse.
                policy.backend.refund_decided(key, cost, &decision);
                let decision = decision.too_late();
                return Ok((
                    Verdict {
                        decision,
                        ..verdict
                    },
                    waited(slept),
                ));
            }
            if waits {
                let mut guard = RefundOnDrop {
                    policy,
                    key,
                    cost,
                    decided: decision,
                    armed: policy.backend.can_refund(),
                };
                tokio::time::sleep(decision.delay()).await;
                guard.armed = false;
                slept = true;
            }
            return Ok((verdict, waited(slept)));
        }
        if too_long(retry(&verdict)) {
            return Ok((verdict, waited(slept)));
        }
        // Within reach: take a place in the queue where the backend keeps one.
        let refused = match policy.backend.reserve(key, cost).transpose()? {
            Some(reserved) if reserved.decision.allowed() => {
                verdict = reserved; // slept for (or given back) above
                continue;
            }
            // A rule that does not reserve refused again.
            Some(refused) => refused,
            None => verdict,
        };
        let wait = retry(&refused);
        if too_long(wait) || !room() {
            return Ok((refused, waited(slept)));
        }
        // Waiters that recheck spread their wake-ups (up to a quarter more, within the
        // deadline), so that those refused together do not all call the backend together.
        let spread = policy.waiters.spread(wait / 4);
        tokio::time::sleep(if too_long(wait + spread) {
            wait
        } else {
            wait + spread
        })
        .await;
        slept = true;
        verdict = policy.backend.check(key, cost).await?;
    }
}

/// How long a refusal says to wait, at least [`crate::wait::MIN_SLEEP`].
#[cfg(feature = "tokio")]
fn retry(verdict: &Verdict) -> std::time::Duration {
    verdict.decision.retry_after().max(crate::wait::MIN_SLEEP)
}

/// Gives a reservation back if the request waiting for it is dropped (delay mode).
#[cfg(feature = "tokio")]
struct RefundOnDrop<'a> {
    policy: &'a Policy,
    key: &'a Key,
    cost: u64,
    /// The reservation's decision: it names the state the units were charged to.
    decided: crate::Decision,
    armed: bool,
}

#[cfg(feature = "tokio")]
impl Drop for RefundOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            (self.policy.backend).refund_decided(self.key, self.cost, &self.decided);
        }
    }
}
