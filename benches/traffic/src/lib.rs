//! The traffic regimes of tollgate's benches, written once for their users: the criterion
//! group `traffic` (`benches/limiters/traffic.rs`), the latency bench (`benches/latency.rs`),
//! the `traffic` example (`cargo run --release --example traffic -- --regime returning`,
//! tollgate alone) and `tests/traffic.rs`. A dev-only crate (`publish = false`, a path
//! dev-dependency of tollgate), so a row means the same quota, the same keys and the same key
//! sequence wherever it is measured, and nothing of it ships with the library or its binary.
//!
//! It holds what a row *is* (regime, quota, key type, key set, distribution, threads, clock),
//! how its keys and sequences are generated, the drivers that time it (throughput, and every
//! check on its own into an HDR histogram) and the tails table. It uses tollgate's public API
//! only, and never governor (the benches add governor's side themselves) nor clap (the example
//! adds its options on top).

use std::any::{Any, TypeId};
use std::borrow::Borrow;
use std::fmt::Write as _;
use std::hash::Hash;
use std::hint::black_box;
use std::marker::PhantomData;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex, OnceLock};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tollgate::{Gcra, Quota};

// ---------------------------------------------------------------------------------------------
// Regimes and their quotas

/// How the keys of a row behave between two visits (all GCRA).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Regime {
    /// Every key is charged [`WARM_COST`] before timing, so that no key's state is ever fresh
    /// (the warm-keys *trick* of the `keyed_gcra` groups): 1 000 000/s, burst 10^9, every
    /// check allowed. Flatters any store that evicts fresh keys; kept to compare with them.
    Warm,
    /// Clients well under their limit: each visit finds the key's bucket full again, so its
    /// state is fresh (indistinguishable from a new key's) by its next visit. Precise clock:
    /// 1 000 000/s, burst 1 (a key is full again 1 µs after a check). Coarse clock: 1 000/s,
    /// burst 10, the shortest span (10 ms) a 1 ms tick may serve (tollgate refuses a tick
    /// above a tenth of `B·T`); a key is full again one tick after a check.
    Returning,
    /// An API quota, 100/s, burst 1: allows and denies mixed, depending on how often a key
    /// comes back (every key is checked once before timing).
    Api,
    /// Mostly denied: 10/s, burst 1, every key exhausted by one check before timing.
    Deny,
    /// A flood of new keys: every check names a key the limiter has never seen (a bijective
    /// mix of a counter, so both limiters of a row see the same keys). Quota as [`Api`].
    ///
    /// [`Api`]: Regime::Api
    Flood,
}

/// What `Warm` charges every key before timing: 600 s of debt on a 1000 s span, so that no
/// key is fresh while the bench runs (4·10^8 more checks per key stay allowed).
pub const WARM_COST: u32 = 600_000_000;

/// A GCRA quota: `per_second` units a second (emission interval `T = 1 s / per_second`), and
/// bursts of `burst` (bucket span `B·T`). `u32` because governor's quota takes `NonZeroU32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub per_second: u32,
    pub burst: u32,
}

impl Rate {
    /// `T` in nanoseconds.
    pub fn interval_ns(self) -> u64 {
        1_000_000_000 / u64::from(self.per_second)
    }

    /// `B·T` in nanoseconds.
    pub fn span_ns(self) -> u64 {
        self.interval_ns() * u64::from(self.burst)
    }

    /// tollgate's rule for this rate.
    pub fn gcra(self) -> Gcra {
        let quota = Quota::per_second(u64::from(self.per_second))
            .and_then(|q| q.with_burst(u64::from(self.burst)))
            .expect("a valid quota");
        Gcra::new(quota).expect("a valid GCRA rule")
    }
}

/// The direct (one key) rows: 10^9/s, burst 10^9 (`T` = 1 ns, span 1 s), so that one state
/// can take every check of the bench and stay allowed (the `direct_gcra` group's quota).
pub const DIRECT: Rate = Rate {
    per_second: 1_000_000_000,
    burst: 1_000_000_000,
};

impl Regime {
    pub const ALL: [Regime; 5] = [
        Regime::Warm,
        Regime::Returning,
        Regime::Api,
        Regime::Deny,
        Regime::Flood,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Regime::Warm => "warm",
            Regime::Returning => "returning",
            Regime::Api => "api",
            Regime::Deny => "deny",
            Regime::Flood => "flood",
        }
    }

    /// The quota of this regime on this kind of clock (only `Returning` differs: see there).
    pub fn rate(self, clock: ClockKind) -> Rate {
        match (self, clock) {
            (Regime::Warm, _) => Rate {
                per_second: 1_000_000,
                burst: 1_000_000_000,
            },
            (Regime::Returning, ClockKind::Precise) => Rate {
                per_second: 1_000_000,
                burst: 1,
            },
            (Regime::Returning, ClockKind::Coarse) => Rate {
                per_second: 1_000,
                burst: 10,
            },
            (Regime::Api | Regime::Flood, _) => Rate {
                per_second: 100,
                burst: 1,
            },
            (Regime::Deny, _) => Rate {
                per_second: 10,
                burst: 1,
            },
        }
    }

    /// What each distinct key is charged once, in key order, before timing (both limiters
    /// alike): `None` for the flood, whose keys are new by definition.
    pub fn prime_cost(self) -> Option<u32> {
        match self {
            Regime::Warm => Some(WARM_COST),
            Regime::Returning | Regime::Api | Regime::Deny => Some(1),
            Regime::Flood => None,
        }
    }

    /// Whether a share of allowed checks fits this regime: a guard against a row that measures
    /// another path than it claims (a quota typo, a key set never primed). Loose on purpose:
    /// `Returning` at 1k keys or under Zipf revisits its hottest keys within 1 µs now and then.
    pub fn plausible_share(self, allowed: f64) -> Result<(), String> {
        let ok = match self {
            Regime::Warm | Regime::Flood => allowed >= 0.999,
            Regime::Returning => allowed >= 0.5,
            Regime::Deny => allowed <= 0.5,
            Regime::Api => true,
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{}: {:.1} % of checks allowed does not fit the regime",
                self.as_str(),
                allowed * 100.0
            ))
        }
    }
}

impl FromStr for Regime {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        Regime::ALL
            .into_iter()
            .find(|r| r.as_str() == text)
            .ok_or_else(|| format!("unknown regime {text:?} (warm, returning, api, deny, flood)"))
    }
}

/// Which clock both libraries read: `Precise` = tollgate `QuantaClock`, governor
/// `QuantaClock`; `Coarse` = tollgate `CoarseClock`, governor `QuantaUpkeepClock`, 1 ms each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClockKind {
    Precise,
    Coarse,
}

impl ClockKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ClockKind::Precise => "precise",
            ClockKind::Coarse => "coarse",
        }
    }
}

/// How a sequence draws from its key set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Distribution {
    Uniform,
    /// Key of rank `k` (1-based) drawn with weight `1 / k^exponent`; the rows use 1.
    Zipf {
        exponent: f64,
    },
}

impl Distribution {
    pub const ZIPF1: Distribution = Distribution::Zipf { exponent: 1.0 };

    /// `uniform`, `zipf` (exponent 1) or `zipf1.5`.
    pub fn label(self) -> String {
        match self {
            Distribution::Uniform => "uniform".into(),
            Distribution::Zipf { exponent: 1.0 } => "zipf".into(),
            Distribution::Zipf { exponent } => format!("zipf{exponent}"),
        }
    }
}

/// The key type of a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyType {
    U64,
    /// `IpAddr`: three in four IPv4, one in four IPv6 (see [`TrafficKey::nth`]).
    Ip,
    /// `String`: the same addresses as text ("203.0.113.7", "2001:db8::…"), looked up by
    /// `&str` in tollgate (governor takes `&String`).
    String,
    /// `String` again, of 36 bytes: UUID texts ([`uuid_text`]), the length of API keys and
    /// request IDs, past what a `String`'s own 24 bytes hold.
    Uuid,
}

impl KeyType {
    pub const ALL: [KeyType; 4] = [KeyType::U64, KeyType::Ip, KeyType::String, KeyType::Uuid];

    pub fn as_str(self) -> &'static str {
        match self {
            KeyType::U64 => "u64",
            KeyType::Ip => "ip",
            KeyType::String => "string",
            KeyType::Uuid => "uuid",
        }
    }
}

impl FromStr for KeyType {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        KeyType::ALL
            .into_iter()
            .find(|k| k.as_str() == text)
            .ok_or_else(|| format!("unknown key type {text:?} (u64, ip, string, uuid)"))
    }
}

// ---------------------------------------------------------------------------------------------
// Rows

/// One workload of the matrix. Its ID names every axis, in this order:
/// `{regime}/{key type}/{keys}/{distribution}/{threads}t/{clock}`, e.g.
/// `returning/u64/100k/uniform/1t/precise`; a flood row's keys and distribution read
/// `new/splitmix` (every key new, drawn from a counter).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Row {
    pub regime: Regime,
    pub key_type: KeyType,
    /// Distinct keys (ignored by the flood).
    pub keys: usize,
    pub distribution: Distribution,
    pub threads: usize,
    pub clock: ClockKind,
}

/// The base row every axis varies around: returning, 100k `u64` keys, uniform, one thread,
/// precise clock.
pub const BASE: Row = Row {
    regime: Regime::Returning,
    key_type: KeyType::U64,
    keys: 100_000,
    distribution: Distribution::Uniform,
    threads: 1,
    clock: ClockKind::Precise,
};

/// `1k`, `100k`, `1m` (the `keyed_gcra` groups' labels), or the plain count.
pub fn size_label(n: usize) -> String {
    if n >= 1_000_000 && n % 1_000_000 == 0 {
        format!("{}m", n / 1_000_000)
    } else if n >= 1_000 && n % 1_000 == 0 {
        format!("{}k", n / 1_000)
    } else {
        n.to_string()
    }
}

impl Row {
    pub fn id(&self) -> String {
        let (keys, distribution) = match self.regime {
            Regime::Flood => ("new".to_string(), "splitmix".to_string()),
            _ => (size_label(self.keys), self.distribution.label()),
        };
        format!(
            "{}/{}/{keys}/{distribution}/{}t/{}",
            self.regime.as_str(),
            self.key_type.as_str(),
            self.threads,
            self.clock.as_str()
        )
    }

    pub fn rate(&self) -> Rate {
        self.regime.rate(self.clock)
    }

    fn with(self, f: impl FnOnce(&mut Row)) -> Row {
        let mut row = self;
        f(&mut row);
        row
    }
}

/// The rows of the `traffic` matrix (and of the latency bench), without the direct row: one
/// axis at a time around [`BASE`], then the rows of the benchmark tables, two more that a
/// second machine reported (warm `String`, Zipf with two threads), the UUID rows, and the
/// millions of keys (2M, 4M, 8M).
pub fn matrix() -> Vec<Row> {
    use Regime::*;
    let k1 = 1_000;
    let m1 = 1_000_000;
    let rows = [
        // The base row, then each axis varied alone.
        BASE,
        BASE.with(|r| r.regime = Warm),
        BASE.with(|r| r.regime = Api),
        BASE.with(|r| r.regime = Deny),
        BASE.with(|r| r.regime = Flood),
        BASE.with(|r| r.key_type = KeyType::Ip),
        BASE.with(|r| r.key_type = KeyType::String),
        BASE.with(|r| r.keys = k1),
        BASE.with(|r| r.keys = m1),
        BASE.with(|r| r.distribution = Distribution::ZIPF1),
        BASE.with(|r| r.threads = 2),
        BASE.with(|r| r.clock = ClockKind::Coarse),
        // The benchmark tables' rows (warm 100k, deny 100k, returning coarse, returning 2t 100k and
        // flood are above).
        BASE.with(|r| (r.regime, r.keys) = (Warm, k1)),
        BASE.with(|r| (r.keys, r.threads) = (m1, 2)),
        BASE.with(|r| (r.regime, r.keys) = (Api, m1)),
        BASE.with(|r| (r.regime, r.keys, r.threads) = (Api, m1, 2)),
        BASE.with(|r| (r.regime, r.key_type) = (Api, KeyType::String)),
        BASE.with(|r| (r.regime, r.keys, r.distribution) = (Api, m1, Distribution::ZIPF1)),
        // The second machine's extra rows.
        BASE.with(|r| (r.regime, r.key_type) = (Warm, KeyType::String)),
        BASE.with(|r| {
            (r.regime, r.keys, r.distribution, r.threads) = (Api, m1, Distribution::ZIPF1, 2)
        }),
        // `String` keys of 36 bytes (UUIDs), at 100k and 1M.
        BASE.with(|r| r.key_type = KeyType::Uuid),
        BASE.with(|r| (r.regime, r.key_type) = (Api, KeyType::Uuid)),
        BASE.with(|r| (r.regime, r.key_type) = (Warm, KeyType::Uuid)),
        BASE.with(|r| (r.keys, r.key_type) = (m1, KeyType::Uuid)),
        BASE.with(|r| (r.regime, r.keys, r.key_type) = (Api, m1, KeyType::Uuid)),
        BASE.with(|r| (r.regime, r.keys, r.key_type) = (Warm, m1, KeyType::Uuid)),
    ];
    // Millions of clients, past the default `evict_above` (2^21 keys) and past L3: returning,
    // API-quota and warm traffic at 2M, 4M and 8M keys, one and two threads.
    let millions = [2, 4, 8].into_iter().flat_map(|m| {
        [Returning, Api, Warm].into_iter().flat_map(move |regime| {
            [1, 2].map(|threads| {
                BASE.with(|r| (r.regime, r.keys, r.threads) = (regime, m * m1, threads))
            })
        })
    });
    rows.into_iter().chain(millions).collect()
}

/// The ID of the direct (one key, unkeyed limiter) row.
pub const DIRECT_ID: &str = "direct/precise";

// ---------------------------------------------------------------------------------------------
// Keys

/// splitmix64's finaliser: a bijection of `u64`.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// murmur3's 32-bit finaliser: a bijection of `u32`.
fn mix32(mut z: u32) -> u32 {
    z ^= z >> 16;
    z = z.wrapping_mul(0x85EB_CA6B);
    z ^= z >> 13;
    z = z.wrapping_mul(0xC2B2_AE35);
    z ^ (z >> 16)
}

/// A key type of the matrix. `nth` is injective: key `i` of a set, or the `i`-th key of a
/// flood, distinct for every `i` (below 2^32 for `IpAddr` and IP texts). `kind` is the row's
/// key type, which only `String` reads (IP or UUID texts).
pub trait TrafficKey: Clone + Hash + Eq + Send + Sync + Borrow<Self::Lookup> + 'static {
    /// What tollgate is asked with: the key itself, or `str` for `String`.
    type Lookup: Hash + Eq + ToOwned<Owned = Self> + ?Sized;
    fn nth(kind: KeyType, i: u64) -> Self;
    fn lookup(&self) -> &Self::Lookup;
}

/// Golden-ratio step: `i → mix64(i · φ)` is a bijection (an odd multiplier, then the mix).
const PHI: u64 = 0x9E37_79B9_7F4A_7C15;

impl TrafficKey for u64 {
    type Lookup = u64;
    #[inline(always)]
    fn nth(_: KeyType, i: u64) -> u64 {
        mix64(i.wrapping_mul(PHI))
    }
    #[inline(always)]
    fn lookup(&self) -> &u64 {
        self
    }
}

impl TrafficKey for IpAddr {
    type Lookup = IpAddr;
    /// Keys `i ≡ 3 (mod 4)` are IPv6 in 2001:db8::/32 with 64 mixed low bits; the others IPv4,
    /// a bijective mix of `i`'s low 32 bits (any address, reserved ranges included).
    #[inline(always)]
    fn nth(_: KeyType, i: u64) -> IpAddr {
        if i % 4 == 3 {
            let low = mix64(i.wrapping_mul(PHI));
            IpAddr::V6(Ipv6Addr::from((0x2001_0db8_u128 << 96) | u128::from(low)))
        } else {
            IpAddr::V4(Ipv4Addr::from(mix32(i as u32)))
        }
    }
    #[inline(always)]
    fn lookup(&self) -> &IpAddr {
        self
    }
}

impl TrafficKey for String {
    type Lookup = str;
    /// The text of `IpAddr::nth(i)`, or a UUID's ([`uuid_text`]) in a `uuid` row.
    fn nth(kind: KeyType, i: u64) -> String {
        match kind {
            KeyType::Uuid => uuid_text(i),
            _ => IpAddr::nth(kind, i).to_string(),
        }
    }
    #[inline(always)]
    fn lookup(&self) -> &str {
        self
    }
}

/// Key `i` as a version-4 UUID's text, 36 bytes (`8-4-4-4-12` hex digits): the 64 bits of
/// `u64::nth(i)` (a bijection, so distinct for every `i`) and 58 of their own mix.
pub fn uuid_text(i: u64) -> String {
    let a = mix64(i.wrapping_mul(PHI));
    let b = mix64(a ^ PHI);
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        (a >> 4) & 0xfff,
        0x8000 | (a & 0xf) << 10 | (b >> 54),
        b & 0xffff_ffff_ffff,
    )
}

/// A deterministic splitmix64 stream.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(PHI);
        mix64(self.0)
    }

    /// A uniform float in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Sequence positions of `n` keys: a uniform draw (Lemire's multiply-shift) or Zipf by
/// inverse CDF (a binary search in the cumulative weights of ranks 1..=n; rank `k` is key
/// index `k − 1`). The seed depends only on `n`, so the `u64`, `IpAddr`
/// and `String` sequences of one size visit the same key indices in the same order.
pub fn draw_indices(n: usize, distribution: Distribution, len: usize) -> Vec<u32> {
    assert!(n > 0 && n <= u32::MAX as usize, "1 ≤ keys < 2^32");
    let mut rng = SplitMix(0x5EED_0000_0000_0000 ^ n as u64);
    match distribution {
        Distribution::Uniform => (0..len)
            .map(|_| ((u128::from(rng.next()) * n as u128) >> 64) as u32)
            .collect(),
        Distribution::Zipf { exponent } => {
            let mut total = 0.0;
            let mut cdf: Vec<f64> = (1..=n)
                .map(|k| {
                    total += 1.0 / (k as f64).powf(exponent);
                    total
                })
                .collect();
            cdf.iter_mut().for_each(|c| *c /= total);
            (0..len)
                .map(|_| {
                    let u = rng.unit();
                    cdf.partition_point(|&c| c < u).min(n - 1) as u32
                })
                .collect()
        }
    }
}

/// `n` distinct keys and a precomputed sequence drawing from them, stored by value in
/// visiting order (a `String` sequence allocates its texts in that order, as a server's
/// request buffers would hold them, not scattered). The sequence is at least four times the
/// key count (a power of two, at least 2^16), so that at 1M keys the keys it touches do not
/// fit in the cache.
pub struct Sequence<K> {
    /// Every key, in index order: what the limiters are primed with.
    pub keys: Vec<K>,
    seq: Vec<K>,
    mask: usize,
    /// Where the next run starts. It persists across runs (and rows sharing the set):
    /// restarting at 0 would replay the same keys, which would then stay cached.
    cursor: AtomicUsize,
}

impl<K: TrafficKey> Sequence<K> {
    pub fn new(kind: KeyType, n: usize, distribution: Distribution) -> Sequence<K> {
        let keys: Vec<K> = (0..n as u64).map(|i| K::nth(kind, i)).collect();
        let len = (4 * n).next_power_of_two().max(1 << 16);
        let seq = draw_indices(n, distribution, len)
            .into_iter()
            .map(|i| keys[i as usize].clone())
            .collect();
        Sequence {
            keys,
            seq,
            mask: len - 1,
            cursor: AtomicUsize::new(0),
        }
    }

    /// The `i`-th key of the sequence (wrapping).
    #[inline(always)]
    pub fn at(&self, i: usize) -> &K {
        &self.seq[i & self.mask]
    }
}

/// Where a driver takes its keys from: a precomputed [`Sequence`] or a [`Flood`].
pub trait Source<K>: Sync {
    /// Reserves `n` positions; returns the first.
    fn advance(&self, n: usize) -> usize;
    /// Runs `f` on the key at position `i`.
    fn visit<R>(&self, i: usize, f: impl FnOnce(&K) -> R) -> R;
}

impl<K: TrafficKey> Source<K> for Sequence<K> {
    fn advance(&self, n: usize) -> usize {
        // Relaxed: a position counter; no data is published through it.
        self.cursor.fetch_add(n, Ordering::Relaxed)
    }

    #[inline(always)]
    fn visit<R>(&self, i: usize, f: impl FnOnce(&K) -> R) -> R {
        f(self.at(i))
    }
}

impl<K, T: Source<K>> Source<K> for &T {
    fn advance(&self, n: usize) -> usize {
        (**self).advance(n)
    }

    #[inline(always)]
    fn visit<R>(&self, i: usize, f: impl FnOnce(&K) -> R) -> R {
        (**self).visit(i, f)
    }
}

/// One [`Sequence`] per key type, size and distribution for the whole process, built on first
/// use (a filtered bench run builds only the sets its rows need) and never freed.
pub fn shared<K: TrafficKey>(
    kind: KeyType,
    n: usize,
    distribution: Distribution,
) -> &'static Sequence<K> {
    type Set = (
        TypeId,
        KeyType,
        usize,
        String,
        &'static (dyn Any + Send + Sync),
    );
    static SETS: Mutex<Vec<Set>> = Mutex::new(Vec::new());
    let mut sets = SETS.lock().expect("no panic while building a key set");
    let (ty, label) = (TypeId::of::<K>(), distribution.label());
    let found = sets
        .iter()
        .find(|(t, k, size, d, _)| *t == ty && *k == kind && *size == n && *d == label)
        .map(|(.., set)| *set);
    let set = found.unwrap_or_else(|| {
        let set: &'static Sequence<K> = Box::leak(Box::new(Sequence::new(kind, n, distribution)));
        sets.push((ty, kind, n, label, set));
        set
    });
    set.downcast_ref().expect("the set of this key type")
}

/// Keys never seen before: position `i` is `K::nth(i)`, computed in the timed loop (a few
/// arithmetic instructions for `u64` and `IpAddr`; formatting and an allocation for `String`,
/// which the flood's times then include). One `Flood` per limiter, so that each limiter of a
/// row sees the same keys from the first.
pub struct Flood<K> {
    kind: KeyType,
    next: AtomicUsize,
    _keys: PhantomData<fn() -> K>,
}

impl<K> Flood<K> {
    /// A flood of keys of the row's type `kind` (see [`TrafficKey::nth`]).
    pub fn new(kind: KeyType) -> Flood<K> {
        Flood {
            kind,
            next: AtomicUsize::new(0),
            _keys: PhantomData,
        }
    }
}

impl<K: TrafficKey> Source<K> for Flood<K> {
    fn advance(&self, n: usize) -> usize {
        // Relaxed: as for `Sequence`.
        self.next.fetch_add(n, Ordering::Relaxed)
    }

    #[inline(always)]
    fn visit<R>(&self, i: usize, f: impl FnOnce(&K) -> R) -> R {
        f(&K::nth(self.kind, i as u64))
    }
}

/// Charges every key of `keys` `cost` units through `charge` (a limiter's check), in key
/// order: how each regime starts (see [`Regime::prime_cost`]).
pub fn prime<K>(keys: &[K], cost: Option<u32>, charge: impl Fn(&K, u32)) {
    if let Some(cost) = cost {
        for key in keys {
            charge(key, cost);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Drivers

/// What a throughput run measured.
#[derive(Debug, Clone, Copy)]
pub struct Throughput {
    pub checks: u64,
    pub allowed: u64,
    pub seconds: f64,
    pub threads: usize,
}

impl Throughput {
    /// Wall time × threads / checks: the time one check costs its thread.
    pub fn ns_per_check(&self) -> f64 {
        self.seconds * 1e9 * self.threads as f64 / self.checks.max(1) as f64
    }

    /// Aggregate checks per second, in millions.
    pub fn mops(&self) -> f64 {
        self.checks as f64 / self.seconds / 1e6
    }

    pub fn allowed_share(&self) -> f64 {
        self.allowed as f64 / self.checks.max(1) as f64
    }
}

/// `threads` threads check keys of `source` for `duration` (each from its own place), then
/// stop; `check` returns whether the request was admitted.
pub fn run_for<K, S: Source<K>>(
    threads: usize,
    duration: Duration,
    source: &S,
    check: impl Fn(&K) -> bool + Sync,
) -> Throughput {
    const CHUNK: usize = 1024;
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(threads + 1);
    let checks = AtomicU64::new(0);
    let allowed = AtomicU64::new(0);
    let mut seconds = 0.0;
    std::thread::scope(|scope| {
        for _ in 0..threads {
            let (stop, barrier, checks, allowed, check) =
                (&stop, &barrier, &checks, &allowed, &check);
            scope.spawn(move || {
                barrier.wait();
                let (mut n, mut ok) = (0u64, 0u64);
                // Relaxed: a stop flag; no data rides on it.
                while !stop.load(Ordering::Relaxed) {
                    let first = source.advance(CHUNK);
                    for i in 0..CHUNK {
                        ok += u64::from(source.visit(first.wrapping_add(i), check));
                    }
                    n += CHUNK as u64;
                }
                checks.fetch_add(n, Ordering::Relaxed);
                allowed.fetch_add(ok, Ordering::Relaxed);
            });
        }
        barrier.wait();
        let start = Instant::now();
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        seconds = start.elapsed().as_secs_f64();
    });
    Throughput {
        checks: checks.into_inner(),
        allowed: allowed.into_inner(),
        seconds,
        threads,
    }
}

/// The per-check timer: quanta's raw TSC counter read before and after each check, the
/// difference scaled to nanoseconds by `Clock::delta_as_nanos` (on a machine without a usable
/// TSC, quanta falls back to the OS monotonic clock). No fence around the reads: a check's
/// first instructions may overlap the read before it. What the pair costs on its own is
/// measured by [`timer_overhead`] and printed with every table.
fn timer() -> &'static quanta::Clock {
    static CLOCK: OnceLock<quanta::Clock> = OnceLock::new();
    CLOCK.get_or_init(quanta::Clock::new)
}

/// A latency above this is counted apart (the latency table's "checks over 10 µs").
pub const SLOW_NS: u64 = 10_000;

/// Every check of a run, timed on its own.
pub struct Tails {
    pub histogram: Histogram<u64>,
    /// Checks above [`SLOW_NS`], counted exactly (not from the histogram's buckets).
    pub slow: u64,
    pub allowed: u64,
    pub seconds: f64,
}

impl Tails {
    fn new() -> Tails {
        Tails {
            // 1 ns to 60 s, three significant digits (about 1 MB of counts).
            histogram: Histogram::new_with_bounds(1, 60_000_000_000, 3)
                .expect("valid histogram bounds"),
            slow: 0,
            allowed: 0,
            seconds: 0.0,
        }
    }

    pub fn merge(&mut self, other: Tails) {
        self.histogram
            .add(&other.histogram)
            .expect("histograms of the same bounds");
        self.slow += other.slow;
        self.allowed += other.allowed;
        self.seconds = self.seconds.max(other.seconds);
    }

    pub fn checks(&self) -> u64 {
        self.histogram.len()
    }

    pub fn quantile(&self, q: f64) -> u64 {
        self.histogram.value_at_quantile(q)
    }

    pub fn allowed_share(&self) -> f64 {
        self.allowed as f64 / self.checks().max(1) as f64
    }
}

/// `threads` threads make `checks` checks in all (an equal share each, interleaved through one
/// stretch of `source`, so that a key comes back no sooner than with one thread: separate
/// stretches of a cyclic sequence could line the threads up on the same keys), each check
/// timed on its own into the thread's histogram; the histograms are merged at the end.
pub fn run_timed<K, S: Source<K>>(
    threads: usize,
    checks: u64,
    source: &S,
    check: impl Fn(&K) -> bool + Sync,
) -> Tails {
    let clock = timer();
    let per_thread = (checks / threads as u64).max(1) as usize;
    let barrier = Barrier::new(threads);
    let mut all = Tails::new();
    let base = source.advance(per_thread * threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, check) = (&barrier, &check);
                scope.spawn(move || {
                    let mut tails = Tails::new();
                    barrier.wait();
                    let start = Instant::now();
                    for i in 0..per_thread {
                        let at = base.wrapping_add(i * threads + t);
                        let (ok, ns) = source.visit(at, |key| {
                            let before = clock.raw();
                            let ok = check(key);
                            let after = clock.raw();
                            (ok, clock.delta_as_nanos(before, after))
                        });
                        tails.histogram.saturating_record(ns);
                        tails.slow += u64::from(ns > SLOW_NS);
                        tails.allowed += u64::from(ok);
                    }
                    tails.seconds = start.elapsed().as_secs_f64();
                    tails
                })
            })
            .collect();
        for handle in handles {
            all.merge(handle.join().expect("a timed thread"));
        }
    });
    all
}

/// The timer's own cost: the median of 2^20 timed empty checks.
pub fn timer_overhead() -> u64 {
    let source = Flood::<u64>::new(KeyType::U64);
    run_timed(1, 1 << 20, &source, |key| black_box(*key) != 0).quantile(0.5)
}

// ---------------------------------------------------------------------------------------------
// The tails table

/// `870 ns`, `19.1 µs`, `2.80 ms`.
pub fn human_ns(ns: u64) -> String {
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.1} µs", ns as f64 / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2} ms", ns as f64 / 1e6)
    } else {
        format!("{:.2} s", ns as f64 / 1e9)
    }
}

const COLUMNS: [&str; 6] = ["p50", "p99", "p99.9", "p99.99", "max", ">10µs"];
const WIDTH: usize = 9;

/// The width of the row column for these row IDs.
pub fn id_width<'a>(ids: impl IntoIterator<Item = &'a str>) -> usize {
    ids.into_iter()
        .map(|id| id.chars().count())
        .max()
        .unwrap_or(0)
        .max(3)
}

/// The two header lines of a tails table (see [`tails_line`]).
pub fn tails_header(subjects: &[&str], id_width: usize) -> String {
    let group = COLUMNS.len() * WIDTH;
    let mut out = String::new();
    let _ = write!(out, "{:<id_width$}", "");
    for subject in subjects {
        let _ = write!(out, " | {subject:^group$}");
    }
    let _ = writeln!(out, " |");
    let _ = write!(out, "{:<id_width$}", "row");
    for _ in subjects {
        out.push_str(" | ");
        for column in COLUMNS {
            let _ = write!(out, "{column:>WIDTH$}");
        }
    }
    let _ = writeln!(out, " | allowed %");
    out
}

/// One line of a tails table: for each subject (tollgate, governor, …) side by side p50, p99,
/// p99.9, p99.99, max and the checks over 10 µs, then each subject's share of allowed checks.
/// `tails` holds one [`Tails`] per subject, in the header's order; a row with fewer than
/// `groups` subjects (the direct row has no `governor_retain`) shows `-` for the others.
pub fn tails_line(id: &str, tails: &[Tails], id_width: usize, groups: usize) -> String {
    let mut out = String::new();
    let _ = write!(out, "{id:<id_width$}");
    for t in tails {
        out.push_str(" | ");
        for ns in [
            t.quantile(0.5),
            t.quantile(0.99),
            t.quantile(0.999),
            t.quantile(0.9999),
            t.histogram.max(),
        ] {
            let _ = write!(out, "{:>WIDTH$}", human_ns(ns));
        }
        let _ = write!(out, "{:>WIDTH$}", t.slow);
    }
    for _ in tails.len()..groups {
        out.push_str(" | ");
        for _ in COLUMNS {
            let _ = write!(out, "{:>WIDTH$}", "-");
        }
    }
    let shares: Vec<String> = tails
        .iter()
        .map(|t| format!("{:.1}", t.allowed_share() * 100.0))
        .collect();
    let _ = writeln!(out, " | {}", shares.join(" / "));
    out
}

/// A whole table (header and lines) for `rows`, each a row ID and its subjects' tails.
pub fn tails_table(subjects: &[&str], rows: &[(String, Vec<Tails>)]) -> String {
    let width = id_width(rows.iter().map(|(id, _)| id.as_str()));
    let mut out = tails_header(subjects, width);
    for (id, tails) in rows {
        out.push_str(&tails_line(id, tails, width, subjects.len()));
    }
    out
}

/// The line printed above every tails table: how checks were timed and what that costs.
pub fn timer_note(checks: u64) -> String {
    format!(
        "every check timed on its own ({checks} checks a row, threads' histograms merged): \
         quanta raw TSC reads around the check, scaled by Clock::delta_as_nanos; \
         timer overhead (median of an empty check) {}",
        human_ns(timer_overhead())
    )
}
