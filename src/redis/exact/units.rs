//! Scripts that move units in a key's state without deciding a request: the leased tier's
//! grants and returns, and charges of units a node admitted without asking Redis (after an
//! outage, or before a key's first grant arrived). Many keys go in one script call per Cluster
//! slot (the calls pipelined), as the exact tier's batches do.

use std::time::{SystemTime, UNIX_EPOCH};

use redis::Value;

use super::{join_all, scatter, RedisConnection, RedisLimiter};
use crate::redis::error::TierError;
use crate::redis::rule::{Kind, RedisRule};
use crate::redis::scripts::{scripts, ScriptCall};

/// The wall clock, ns since the Unix epoch (the server's `TIME` on a synchronised fleet).
pub(crate) fn wall_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

const SEC: u64 = 1_000_000_000;

/// The largest debt (ns) or count a state holds, `2^52 − 1`: a charge never pushes a state
/// further (the scripts refuse larger stored values as foreign).
pub(crate) const MAX_STATE: u64 = (1 << 52) - 1;

/// The algorithm whose state units are moved in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algo {
    Gcra { interval: u64, span: u64 },
    Fixed { window: u64 },
    Sliding { window: u64 },
}

impl Algo {
    /// The rule's algorithm if its state counts units: GCRA and the leaky buckets (the queue
    /// shares GCRA's state), and both window counters. Not the sliding log.
    pub(crate) fn of(rule: &RedisRule) -> Option<Algo> {
        match rule.kind {
            Kind::Gcra { interval, span, .. } => Some(Algo::Gcra { interval, span }),
            Kind::FixedWindow { window } => Some(Algo::Fixed { window }),
            Kind::SlidingWindow { window } => Some(Algo::Sliding { window }),
            Kind::SlidingLog { .. } => None,
        }
    }

    pub(crate) fn windowed(self) -> bool {
        !matches!(self, Algo::Gcra { .. })
    }
}

/// What a call does to a key's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnitOp {
    /// Grant up to `units` (a lease), as admissions that cannot exceed the rule.
    Grant,
    /// Give back `units`: for windows, granted at server time `since`; for GCRA, of the grant
    /// that left the bucket's TAT at `since` (ns since the epoch; 0 = unknown: nothing goes
    /// back).
    Return { since: u64 },
    /// Count `units` admitted without a grant, at `at` (ns since the epoch by the node's
    /// wall clock; `None` = now), never denied: the state may pass the limit.
    Charge { at: Option<u64> },
}

/// One item of a call: the full Redis key, the operation and its units.
#[derive(Debug, Clone)]
pub(crate) struct Units {
    pub key: Vec<u8>,
    pub op: UnitOp,
    pub units: u64,
    /// A charge's token ([`new_token`]; 0 = none): the script applies a token once, so a
    /// charge sent again after its reply was lost is not counted twice.
    pub token: u64,
}

/// A token for a charge: unique to this process's charges (a per-process random hash of a
/// counter and the wall clock), never 0.
pub(crate) fn new_token() -> u64 {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static SEED: OnceLock<foldhash::quality::RandomState> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // Relaxed: only the count's uniqueness matters.
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let wall = wall_nanos();
    SEED.get_or_init(Default::default)
        .hash_one((n, wall))
        .max(1)
}

/// The key a charge's token is kept in: next to the state (same Cluster slot), for as long
/// as the charge, sent again, could still count (the scripts' `mark_charged`).
fn token_key(state: &[u8], token: u64) -> Vec<u8> {
    let mut key = state.to_vec();
    key.extend_from_slice(format!(":charge:{token:016x}").as_bytes());
    key
}

/// The op argument of a charge: `c`, or `c<k>` with its token's key at `KEYS[k]` (pushed to
/// `tokens`, which follow the `items` item keys).
fn charge_op(state: &[u8], token: u64, items: usize, tokens: &mut Vec<Vec<u8>>) -> String {
    if token == 0 {
        return "c".into();
    }
    tokens.push(token_key(state, token));
    format!("c{}", items + tokens.len())
}

impl Units {
    /// The units as sent: every number goes out below 2^53 (Lua's exact integers), and a reply
    /// may not move more.
    fn sent(&self) -> u64 {
        self.units.min(MAX_STATE)
    }
}

/// One reply item, checked against the scripts' contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reply {
    /// Units granted, returned or charged.
    pub units: u64,
    /// Server time judged at, ns since the epoch.
    pub time: u64,
    /// GCRA: the debt after (`max(0, TAT − t)`, ns); windows: the time into the window.
    pub fact: u64,
    /// Windows: the previous window's count and the current window's count, after.
    pub prev: u64,
    pub count: u64,
}

impl<C: RedisConnection> RedisLimiter<C> {
    /// Runs `items` on the states of `algo` (the rule's): one script call per Cluster slot
    /// (and per `max_batch` items), pipelined. One result per item, in order; a failed call
    /// fails only its own items. Items of one key are applied in order. Also returns the
    /// number of script calls sent.
    pub(crate) async fn move_units(
        &self,
        algo: Algo,
        items: &[Units],
    ) -> (Vec<Result<Reply, TierError>>, u64) {
        let all: Vec<usize> = (0..items.len()).collect();
        let calls = self.plan_calls(&all, |i| &items[i].key);
        let replies = join_all(
            calls
                .iter()
                .map(|chunk| self.units_call(algo, items, chunk))
                .collect(),
        )
        .await;
        let results = scatter(vec![None; items.len()], &calls, replies);
        (results, calls.len() as u64)
    }

    /// One script call for the items at `chunk` (all in one slot).
    async fn units_call(
        &self,
        algo: Algo,
        items: &[Units],
        chunk: &[usize],
    ) -> Result<Vec<Result<Reply, TierError>>, TierError> {
        let (gcra_script, window_script) = (&scripts().lease_gcra, &scripts().lease_window);
        let [first, second] = self.rule().script_params();
        let (script, mode) = match algo {
            Algo::Gcra { .. } => (gcra_script, "1"),
            Algo::Fixed { .. } => (window_script, "f"),
            Algo::Sliding { .. } => (window_script, "s"),
        };
        let mut invocation = ScriptCall::new(script);
        invocation.arg(0).arg(mode).arg(first).arg(second);
        let mut tokens = Vec::new();
        for &i in chunk {
            let item = &items[i];
            invocation.key(&item.key[..]);
            let units = item.sent();
            match item.op {
                UnitOp::Grant => invocation.arg("g").arg(units).arg(""),
                UnitOp::Return { since: 0 } => invocation.arg("r").arg(units).arg(""),
                UnitOp::Return { since } => invocation.arg("r").arg(units).arg(since),
                UnitOp::Charge { at } => {
                    let op = charge_op(&item.key, item.token, chunk.len(), &mut tokens);
                    invocation.arg(op).arg(units);
                    match at {
                        Some(at) => invocation.arg(at),
                        None => invocation.arg(""),
                    }
                }
            };
            invocation.arg("");
        }
        for token in &tokens {
            invocation.key(&token[..]);
        }
        let reply = self.invoke(&invocation, true).await?;
        let Value::Array(replies) = reply else {
            return Err(TierError::bad_reply(format!(
                "expected an array, got {reply:?}"
            )));
        };
        if replies.len() != chunk.len() {
            return Err(TierError::bad_reply(format!(
                "{} results for {} items",
                replies.len(),
                chunk.len()
            )));
        }
        Ok(chunk
            .iter()
            .zip(replies)
            .map(|(&i, reply)| {
                let item = &items[i];
                parse(algo, &item.key, reply, item.sent())
            })
            .collect())
    }
}

/// One charge to a sliding log: the full Redis key, the units, and the time they were admitted
/// (ns since the epoch, by the node's wall clock).
#[derive(Debug, Clone)]
pub(crate) struct LogCharge {
    pub key: Vec<u8>,
    pub units: u64,
    pub at: u64,
    /// As [`Units::token`].
    pub token: u64,
}

impl LogCharge {
    /// The units as sent: at least 1 and below 2^51 (the script's contract); a reply may not
    /// charge more.
    fn sent(&self) -> u64 {
        self.units.clamp(1, 1 << 50)
    }
}

impl<C: RedisConnection> RedisLimiter<C> {
    /// Charges `items` to sliding logs (the rule's), never denied: one script call per Cluster
    /// slot, pipelined. One result per item, in order: the units charged (0 when they had
    /// expired already). Also returns the number of script calls sent.
    pub(crate) async fn charge_log(
        &self,
        items: &[LogCharge],
    ) -> (Vec<Result<u64, TierError>>, u64) {
        let all: Vec<usize> = (0..items.len()).collect();
        let calls = self.plan_calls(&all, |i| &items[i].key);
        let replies = join_all(
            calls
                .iter()
                .map(|chunk| self.log_call(items, chunk))
                .collect(),
        )
        .await;
        let results = scatter(vec![None; items.len()], &calls, replies);
        (results, calls.len() as u64)
    }

    async fn log_call(
        &self,
        items: &[LogCharge],
        chunk: &[usize],
    ) -> Result<Vec<Result<u64, TierError>>, TierError> {
        let script = &scripts().charge_log;
        let [limit, window] = self.rule().script_params();
        let mut invocation = ScriptCall::new(script);
        invocation.arg(0).arg("0").arg(limit).arg(window);
        let mut tokens = Vec::new();
        for &i in chunk {
            let item = &items[i];
            let op = charge_op(&item.key, item.token, chunk.len(), &mut tokens);
            invocation
                .key(&item.key[..])
                .arg(item.sent())
                .arg(item.at)
                .arg(op);
        }
        for token in &tokens {
            invocation.key(&token[..]);
        }
        let reply = self.invoke(&invocation, true).await?;
        let rows = super::rows(reply, chunk.len())?;
        Ok(chunk
            .iter()
            .zip(rows)
            .map(|(&i, row)| {
                let item = &items[i];
                let key = || String::from_utf8_lossy(&item.key).into_owned();
                match row[..] {
                    [1, n] => u64::try_from(n)
                        .ok()
                        .filter(|n| *n <= item.sent())
                        .ok_or_else(|| TierError::bad_reply(format!("charged {n} units"))),
                    [-1, _] => Err(TierError::WrongType { key: key() }),
                    [-2, _] => Err(TierError::CorruptState { key: key() }),
                    _ => Err(TierError::bad_reply(format!("log charge reply {row:?}"))),
                }
            })
            .collect())
    }
}

/// One item of a units script's reply, checked against the scripts' contract: anything else
/// is an error, never a panic.
pub(crate) fn parse(algo: Algo, key: &[u8], item: Value, asked: u64) -> Result<Reply, TierError> {
    let bad = |detail: String| Err(TierError::bad_reply(detail));
    let fields: Vec<i64> = match item {
        Value::Array(fields) if fields.len() == 7 => fields
            .into_iter()
            .map(|f| match f {
                Value::Int(v) => Ok(v),
                other => Err(TierError::bad_reply(format!(
                    "expected an integer, got {other:?}"
                ))),
            })
            .collect::<Result<_, _>>()?,
        other => return bad(format!("expected 7 integers, got {other:?}")),
    };
    let key = || String::from_utf8_lossy(key).into_owned();
    match fields[0] {
        1 => {}
        -1 => return Err(TierError::WrongType { key: key() }),
        -2 => return Err(TierError::CorruptState { key: key() }),
        code => return bad(format!("units code {code}")),
    }
    let in_range = |v: i64, max: u64| u64::try_from(v).ok().filter(|v| *v <= max);
    let fact_max = match algo {
        // A charge may push the debt past B·T, up to the largest a state holds.
        Algo::Gcra { .. } => MAX_STATE,
        Algo::Fixed { window } | Algo::Sliding { window } => window - 1,
    };
    let (Some(units), Some(secs), Some(nanos), Some(fact), Some(prev), Some(count)) = (
        in_range(fields[1], asked),
        in_range(fields[2], u64::MAX / SEC - 1),
        in_range(fields[3], SEC - 1),
        in_range(fields[4], fact_max),
        in_range(fields[5], MAX_STATE),
        in_range(fields[6], MAX_STATE),
    ) else {
        return bad(format!("units reply out of range: {fields:?}"));
    };
    let time = secs * SEC + nanos;
    if algo.windowed() && time < fact {
        return bad(format!("units reply out of range: {fields:?}"));
    }
    Ok(Reply {
        units,
        time,
        fact,
        prev,
        count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_out_of_contract_are_errors_not_panics() {
        let algos = [
            Algo::Gcra {
                interval: 1_000,
                span: 10_000,
            },
            Algo::Fixed { window: SEC },
            Algo::Sliding { window: SEC },
        ];
        let edges = [
            i64::MIN,
            -3,
            -2,
            -1,
            0,
            1,
            2,
            999_999_999,
            1 << 52,
            1 << 53,
            i64::MAX,
        ];
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..100_000 {
            let fields = (next() % 9) as usize;
            let mut item: Vec<Value> = (0..fields)
                .map(|i| match next() % 4 {
                    _ if i == 0 && next() % 3 != 0 => Value::Int(1),
                    0 => Value::Int((next() % (1 << 40)) as i64),
                    1 => Value::Nil,
                    _ => Value::Int(edges[(next() % edges.len() as u64) as usize]),
                })
                .collect();
            if next() % 2 == 0 {
                item.truncate(7);
            }
            let item = match next() % 4 {
                0 => Value::Array(vec![Value::Array(item)]),
                1 => Value::Int(7),
                _ => Value::Array(item),
            };
            let algo = algos[(next() % 3) as usize];
            if let Ok(r) = parse(algo, b"k", item, 100) {
                assert!(r.units <= 100);
                assert!(r.prev <= MAX_STATE && r.count <= MAX_STATE);
            }
        }
        let good = Value::Array([1, 7, 1_700_000_000, 5, 250, 3, 9].map(Value::Int).to_vec());
        let r = parse(algos[1], b"k", good, 10).unwrap();
        assert_eq!(
            (r.units, r.time, r.fact, r.prev, r.count),
            (7, 1_700_000_000 * SEC + 5, 250, 3, 9)
        );
        // A GCRA debt past the span (after a charge) is a valid state.
        let charged = Value::Array(
            [1, 7, 1_700_000_000, 5, 1 << 40, 0, 0]
                .map(Value::Int)
                .to_vec(),
        );
        assert_eq!(parse(algos[0], b"k", charged, 10).unwrap().fact, 1 << 40);
        let wrong = Value::Array([-1, 0, 0, 0, 0, 0, 0].map(Value::Int).to_vec());
        assert!(matches!(
            parse(algos[0], b"k", wrong, 10),
            Err(TierError::WrongType { .. })
        ));
    }
}
