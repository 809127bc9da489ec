//! The decision a script's reply stands for: the verdict checked against the facts the script
//! returned, and the figures (`remaining`, `retry_after`, `reset_after`, `delay`) computed from
//! them in 128-bit integers (Lua's doubles cannot hold the products).

use crate::decision::{Decision, Remaining};

use super::super::error::TierError;
use super::{Kind, RedisRule};

/// What one item of a script's reply says, before its figures are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Decided { allowed: bool },
    WrongType,
    CorruptState,
}

/// Every value a script returns is an integer below 2^53 (or −1 for "none").
const REPLY_MAX: i64 = 1 << 53;

fn field(reply: &[i64], i: usize) -> Result<u64, TierError> {
    match reply.get(i) {
        Some(&v) if (0..REPLY_MAX).contains(&v) => Ok(v as u64),
        Some(&v) => Err(TierError::bad_reply(format!(
            "field {i} is {v}, out of range"
        ))),
        None => Err(TierError::bad_reply(format!("field {i} is missing"))),
    }
}

/// `-1` (none) or a value in range.
fn optional(reply: &[i64], i: usize) -> Result<Option<u64>, TierError> {
    match reply.get(i) {
        Some(-1) => Ok(None),
        _ => field(reply, i).map(Some),
    }
}

impl RedisRule {
    /// The verdict code of one reply item, and the number of fields the item must have.
    pub(crate) fn verdict(&self, reply: &[i64]) -> Result<Verdict, TierError> {
        let fields = match self.kind {
            Kind::Gcra { .. } => 2,
            Kind::FixedWindow { .. } => 3,
            Kind::SlidingWindow { .. } | Kind::SlidingLog { .. } => 4,
        };
        if reply.len() != fields {
            return Err(TierError::bad_reply(format!(
                "an item of {} fields, expected {fields}",
                reply.len()
            )));
        }
        match reply[0] {
            1 => Ok(Verdict::Decided { allowed: true }),
            0 => Ok(Verdict::Decided { allowed: false }),
            -1 => Ok(Verdict::WrongType),
            -2 => Ok(Verdict::CorruptState),
            code => Err(TierError::bad_reply(format!("verdict code {code}"))),
        }
    }

    /// The decision for a request of `cost ≤ capacity()` from a script's reply item, with the
    /// durations rounded up to a multiple of `unit` ns (the clock's unit: 1 µs for the server's
    /// `TIME`, 1 ns for injected time).
    pub(crate) fn decision(
        &self,
        cost: u64,
        reply: &[i64],
        unit: u64,
    ) -> Result<Decision, TierError> {
        let allowed = match self.verdict(reply)? {
            Verdict::Decided { allowed } => allowed,
            // Handled by the caller, which knows the key.
            Verdict::WrongType | Verdict::CorruptState => {
                return Err(TierError::bad_reply("not a decision".into()))
            }
        };
        let figures = match self.kind {
            Kind::Gcra {
                interval,
                span,
                queue,
                ..
            } => gcra(interval, span, queue, cost, field(reply, 1)?),
            Kind::FixedWindow { window } => {
                fixed_window(self.limit, window, cost, field(reply, 1)?, field(reply, 2)?)?
            }
            Kind::SlidingWindow { window } => sliding_window(
                self.limit,
                window,
                cost,
                field(reply, 1)?,
                field(reply, 2)?,
                field(reply, 3)?,
            )?,
            Kind::SlidingLog { window } => sliding_log(
                self.limit,
                window,
                cost,
                field(reply, 1)?,
                optional(reply, 2)?,
                optional(reply, 3)?,
            )?,
        };
        if figures.allowed != allowed {
            return Err(TierError::bad_reply(format!(
                "the script {} a request the state it returned {}",
                if allowed { "allowed" } else { "denied" },
                if allowed { "denies" } else { "allows" }
            )));
        }
        let round = |ns: u64| ns.div_ceil(unit).saturating_mul(unit);
        Ok(Decision {
            allowed: allowed.into(),
            limit: self.limit,
            retry_after: round(figures.retry_after),
            reset_after: round(figures.reset_after),
            delay: round(figures.delay),
            remaining: Remaining::Exact(figures.remaining),
        })
    }
}

/// A decision's figures, exact, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Figures {
    allowed: bool,
    remaining: u64,
    retry_after: u64,
    reset_after: u64,
    delay: u64,
}

/// decision rules §1–3 from `debt = max(0, TAT − t)`. Values stay below 2^54 (`debt < 2^53`,
/// `c·T ≤ B·T ≤ 2^51`).
fn gcra(interval: u64, span: u64, queue: bool, cost: u64, debt: u64) -> Figures {
    // Saturating only as a guard: the caller passes `cost ≤ B`.
    let increment = cost.saturating_mul(interval);
    let allowed = cost == 0 || debt.saturating_add(increment) <= span;
    let debt_after = if allowed { debt + increment } else { debt };
    Figures {
        allowed,
        remaining: span.saturating_sub(debt_after) / interval.max(1),
        retry_after: if allowed {
            0
        } else {
            debt.saturating_add(increment) - span
        },
        reset_after: debt_after,
        // SPEC §3: an admitted request proceeds at max(TAT, t), `debt` from now.
        delay: if queue && allowed { debt } else { 0 },
    }
}

/// decision rules §4 from `e` (time into the window) and `n` (units admitted in it).
fn fixed_window(limit: u64, window: u64, cost: u64, e: u64, n: u64) -> Result<Figures, TierError> {
    if e >= window {
        return Err(TierError::bad_reply(format!(
            "{e} ns into a window of {window}"
        )));
    }
    let allowed = cost == 0 || n.saturating_add(cost) <= limit;
    let n_after = if allowed { n + cost } else { n };
    let to_end = window - e;
    Ok(Figures {
        allowed,
        remaining: limit.saturating_sub(n_after),
        retry_after: if allowed { 0 } else { to_end },
        reset_after: if n_after > 0 { to_end } else { 0 },
        delay: 0,
    })
}

/// decision rules §5 from `e`, `prev` and `cur`, in 128-bit integers.
fn sliding_window(
    limit: u64,
    window: u64,
    cost: u64,
    e: u64,
    prev: u64,
    cur: u64,
) -> Result<Figures, TierError> {
    if e >= window {
        return Err(TierError::bad_reply(format!(
            "{e} ns into a window of {window}"
        )));
    }
    let (l, w, e, prev, cur, c) = (
        limit as i128,
        window as i128,
        e as i128,
        prev as i128,
        cur as i128,
        cost as i128,
    );
    let weighted_prev = prev * (w - e);
    let allowed = c == 0 || (cur + c - 1) * w + weighted_prev < l * w;
    let cur_after = if allowed { cur + c } else { cur };
    let headroom = l * w - cur_after * w - weighted_prev; // (L − est)·W
    let remaining = if headroom <= 0 {
        0
    } else {
        (headroom + w - 1) / w
    };
    let reset_after = if cur_after > 0 {
        2 * w - e
    } else if prev > 0 {
        w - e
    } else {
        0
    };
    let retry_after = if allowed {
        0
    } else {
        sliding_retry_after(l, w, e, prev, cur, c)
    };
    // Every value is below 2^53 · 2^52; the casts to u64 saturate rather than wrap.
    let to_u64 = |v: i128| u64::try_from(v.max(0)).unwrap_or(u64::MAX);
    Ok(Figures {
        allowed,
        remaining: to_u64(remaining),
        retry_after: to_u64(retry_after),
        reset_after: to_u64(reset_after),
        delay: 0,
    })
}

/// The first instant at which `c` units would be allowed, as a wait from `e` (decision rules §5: it may
/// lie in a later window). Times relative to the current window's start.
fn sliding_retry_after(l: i128, w: i128, e: i128, prev: i128, cur: i128, c: i128) -> i128 {
    let ceil_div = |a: i128, b: i128| (a + b - 1) / b;
    // Still in this window: need prev·(W − e') < R, R = (L − cur − c + 1)·W.
    let r = (l - cur - c + 1) * w;
    if r > 0 && prev > 0 {
        let at = w + 1 - ceil_div(r, prev);
        if at < w {
            return (at.max(0) - e).max(0);
        }
    }
    // Next window: prev' = cur, cur' = 0; need cur·(W − e') < (L − c + 1)·W.
    let r = (l - c + 1) * w;
    let at = if cur == 0 {
        0
    } else {
        (w + 1 - ceil_div(r, cur)).max(0)
    };
    if at < w {
        return (w + at - e).max(0);
    }
    // The window after: both counts have slid out.
    2 * w - e
}

/// decision rules §6 from the live count and the ages of the entries that matter.
fn sliding_log(
    limit: u64,
    window: u64,
    cost: u64,
    count: u64,
    age_retry: Option<u64>,
    age_newest: Option<u64>,
) -> Result<Figures, TierError> {
    let live = |age: Option<u64>| match age {
        Some(age) if age >= window => Err(TierError::bad_reply(format!(
            "a live entry {age} ns old in a window of {window}"
        ))),
        _ => Ok(age),
    };
    let (age_retry, age_newest) = (live(age_retry)?, live(age_newest)?);
    let allowed = cost == 0 || count.saturating_add(cost) <= limit;
    let count_after = if allowed { count + cost } else { count };
    let retry_after = match (allowed, age_retry) {
        (true, _) => 0,
        (false, Some(age)) => window - age,
        (false, None) => return Err(TierError::bad_reply("a denial without its entry".into())),
    };
    let reset_after = match (count_after, allowed && cost > 0, age_newest) {
        (0, _, _) => 0,
        // The request's own entries are (or, for a peek, would be) the newest.
        (_, true, _) => window,
        (_, false, Some(age)) => window - age,
        (_, false, None) => return Err(TierError::bad_reply("units without an entry".into())),
    };
    Ok(Figures {
        allowed,
        remaining: limit.saturating_sub(count_after),
        retry_after,
        reset_after,
        delay: 0,
    })
}
