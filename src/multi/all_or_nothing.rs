//! The all-or-nothing protocol of [`MultiLimiter`](crate::MultiLimiter), over any list of
//! limits: the library runs it over keyed limiters, and `loom-tests` compiles this same file to
//! model-check it over bare state cells.

use crate::decision::{Decision, LimitError, Remaining};

/// One limit as the protocol sees it, for a key of type `Q`.
pub trait Limit<Q: ?Sized> {
    /// The decision a request of `cost` would get now; changes nothing.
    fn peek(&self, key: &Q, cost: u64) -> Result<Decision, LimitError>;
    /// Decides a request of `cost`, counting it if allowed.
    fn charge(&self, key: &Q, cost: u64) -> Result<Decision, LimitError>;
    /// Gives back `cost` units this call charged a moment ago, to the state `charged` (the
    /// charge's decision) says they went to.
    fn refund(&self, key: &Q, cost: u64, charged: &Decision);
}

/// Admits `cost` on every limit or on none.
///
/// Every limit is first peeked; only if all would admit are they charged, in order. If one now
/// refuses (a concurrent request got in between), the limits already charged are refunded, so
/// a refused request leaves no net consumption and no limit ever admits more than it allows on
/// its own. Meanwhile a concurrent request may see a limit briefly fuller than it ends up: a
/// stricter decision, never a looser one.
///
/// Returns the refusing limit's decision, or, when admitted, the decision of the limit with
/// the fewest units remaining, with that limit's index (0 for no limit at all).
pub fn all_or_nothing<Q: ?Sized, L: Limit<Q>>(
    limits: &[L],
    key: &Q,
    cost: u64,
) -> Result<(Decision, usize), LimitError> {
    // Peek every limit before answering: a cost one limit can never admit is an error (SPEC),
    // whichever limit would have refused first.
    let mut refusal = None;
    for (index, limit) in limits.iter().enumerate() {
        let decision = limit.peek(key, cost)?;
        if !decision.allowed() && refusal.is_none() {
            refusal = Some((decision, index));
        }
    }
    if let Some(refused) = refusal {
        return Ok(refused);
    }
    let mut charges = Charges::default();
    let mut tightest: Option<(Decision, usize)> = None;
    for (index, limit) in limits.iter().enumerate() {
        let refused = match limit.charge(key, cost) {
            Ok(decision) if decision.allowed() => {
                let tighter = match tightest {
                    None => true,
                    Some((t, _)) => decision.remaining() < t.remaining(),
                };
                if tighter {
                    tightest = Some((decision, index));
                }
                charges.push(decision);
                None
            }
            other => Some(other),
        };
        if let Some(outcome) = refused {
            for (earlier, charged) in limits.iter().zip(charges.iter()) {
                earlier.refund(key, cost, charged);
            }
            return outcome.map(|decision| (decision, index));
        }
    }
    Ok(tightest.unwrap_or_else(|| (Decision::free(0, Remaining::Exact(0), 0), 0)))
}

/// The decisions of the limits charged so far, in order: what a refund needs to know (where
/// each charge went). Kept in place for up to 8 limits, so that a check allocates nothing.
#[derive(Default)]
pub struct Charges {
    inline: [Option<Decision>; 8],
    spilled: Vec<Decision>,
}

impl Charges {
    /// Notes the next limit's charge.
    pub fn push(&mut self, decision: Decision) {
        match self.inline.iter_mut().find(|slot| slot.is_none()) {
            Some(slot) => *slot = Some(decision),
            None => self.spilled.push(decision),
        }
    }

    /// The charges, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Decision> {
        self.inline
            .iter()
            .map_while(Option::as_ref)
            .chain(&self.spilled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_keep_their_order_in_place_and_past_it() {
        let mut charges = Charges::default();
        let decisions: Vec<Decision> = (0..11u64)
            .map(|n| Decision::free(n, Remaining::Exact(n), 0))
            .collect();
        for &d in &decisions {
            charges.push(d);
        }
        let kept: Vec<Decision> = charges.iter().copied().collect();
        assert_eq!(kept, decisions);
        assert!(Charges::default().iter().next().is_none());
    }
}
