//! Memory per key at 1M keys, for every tollgate algorithm and for governor, measured by a
//! counting global allocator; then the allocations of 1M checks on keys already held (the hot
//! path), which should be none.
//!
//! ```text
//! cargo run --release --example memory_per_key            # 1M keys
//! cargo run --release --example memory_per_key -- 100000  # another key count
//! cargo run --release --example memory_per_key -- sweep   # GCRA and governor, 125k to 2M keys
//! cargo run --release --example memory_per_key -- rss     # resident memory, see below
//! ```
//!
//! `rss` measures what users pay for: resident memory (Linux: `VmRSS` and `VmHWM` of
//! `/proc/self/status`), for tollgate's GCRA and governor side by side, with `u64`, `IpAddr` (half
//! v4, half v6) and `String` keys (IP-like text, about 17 bytes, and UUIDs, 36 bytes, looked up
//! by `&str`), at 100k to 8M keys (or the counts given after `rss`). Each measurement runs in a
//! fresh process (a freed table may stay resident, so processes are never shared): the keys
//! are made first, then each is checked once under a quota that keeps every state live; the
//! growth in RSS over the keys held is shown right after the inserts, settled (after two more
//! checks of every key, once the growth spread over later calls has run), and at its peak
//! (the high-water mark: a growth step's old and new tables alive together, tables built
//! ahead).
//!
//! Both maps grow by steps (tollgate's shard tables by about 1.3x, governor's hashbrown tables
//! by 2x), so bytes per key at one key count depends on where it falls in each one's step: the
//! sweep shows the whole cycle.
//!
//! "bytes/key" is (live heap bytes after inserting the keys − live heap bytes before) / keys,
//! as requested from the allocator. The word table's tables of 4 KiB and more live in pages
//! mapped outside the allocator, which it does not see: its rows show the heap that remains
//! (a `String` key's text, the sliding log's tables); `rss` is the measure for them. Otherwise it counts the map's tables at their real capacity (a
//! table that has just doubled shows it) but not the allocator's own per-block overhead. Every
//! key is inserted by one admitted check, under a quota that keeps it from being fresh (so
//! tollgate's automatic sweeps evict nothing). Keys are distinct uniformly random `u64`s.

use std::alloc::System;
use std::hint::black_box;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};
use tollgate::Algorithm;
use tollgate::{FixedWindow, Gcra, KeyedLimiter, LeakyQueue, Quota, SlidingLog, SlidingWindow};

/// `stats_alloc`'s counting wrapper of the system allocator (no unsafe code of ours).
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Live heap bytes, as requested from the allocator (a reallocation's change is in both
/// counts already; `bytes_reallocated` would count it twice).
fn live() -> usize {
    let s = GLOBAL.stats();
    (s.bytes_allocated as isize - s.bytes_deallocated as isize) as usize
}

/// Allocation calls so far (fresh and `realloc`).
fn calls() -> usize {
    let s = GLOBAL.stats();
    s.allocations + s.reallocations
}

/// splitmix64 over a counter: distinct, uniformly spread keys.
fn keys(n: usize) -> Vec<u64> {
    let mut state = 0x5EED_0000_0000_0000_u64 ^ n as u64;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        })
        .collect()
}

struct Row {
    name: String,
    held: usize,
    /// Right after the inserts.
    bytes_per_key: f64,
    /// After one more check of every key (the word table's drains still running after the
    /// inserts end as those checks reach the keys not moved yet).
    bytes_per_key_checked: f64,
    allocs_per_key: f64,
    hot_allocs: usize,
}

/// Builds a subject, inserts every key with `insert`, then checks every key again with `check`.
fn measure<T: Copy, L>(
    name: &str,
    keys: &[T],
    build: impl FnOnce() -> L,
    insert: impl Fn(&L, T),
    check: impl Fn(&L, T),
    held: impl Fn(&L) -> usize,
) -> Row {
    let (bytes_before, calls_before) = (live(), calls());
    let subject = build();
    for &key in keys {
        insert(&subject, key);
    }
    let (bytes_after, calls_after) = (live(), calls());
    for &key in keys {
        check(&subject, key);
    }
    let hot_allocs = calls() - calls_after;
    let bytes_checked = live();
    let n = keys.len() as f64;
    let row = Row {
        name: name.to_owned(),
        held: held(&subject),
        bytes_per_key: (bytes_after as f64 - bytes_before as f64) / n,
        bytes_per_key_checked: (bytes_checked as f64 - bytes_before as f64) / n,
        allocs_per_key: (calls_after - calls_before) as f64 / n,
        hot_allocs,
    };
    drop(subject);
    row
}

fn tollgate<A: Algorithm>(name: &str, keys: &[u64], rule: A, cost: u64) -> Row {
    measure(
        name,
        keys,
        || KeyedLimiter::<u64, A>::new(rule),
        |limiter, key| {
            let decision = limiter.check_n(&key, cost).expect("no key bound");
            assert!(decision.allowed());
        },
        |limiter, key| {
            black_box(limiter.check(&key).expect("no key bound"));
        },
        |limiter| limiter.len(),
    )
}

fn governor_row(keys: &[u64]) -> Row {
    let quota = governor::Quota::per_hour(NonZeroU32::new(10).expect("non-zero"));
    measure(
        "governor keyed (default DashMap)",
        keys,
        || governor::RateLimiter::keyed(quota),
        |limiter, key| assert!(limiter.check_key(&key).is_ok()),
        |limiter, key| {
            let _ = black_box(limiter.check_key(&key));
        },
        |limiter| limiter.len(),
    )
}

/// Text keys: every key's address as text (three in four IPv4, one in four IPv6 in
/// 2001:db8::/32), kept as `String` by both. The texts to look up are made before measuring;
/// a `String` key's heap block is counted (tollgate keeps these texts inline: none).
fn text_rows(keys: &[u64], quota: Quota) -> Vec<Row> {
    let texts: Vec<String> = keys
        .iter()
        .enumerate()
        .map(|(i, &key)| {
            if i % 4 == 3 {
                std::net::Ipv6Addr::from((0x2001_0db8_u128 << 96) | u128::from(key)).to_string()
            } else {
                std::net::Ipv4Addr::from(key as u32).to_string()
            }
        })
        .collect();
    let texts: Vec<&String> = texts.iter().collect();
    let rule = || Gcra::new(quota).expect("valid");
    let governor_quota = governor::Quota::per_hour(NonZeroU32::new(10).expect("non-zero"));
    vec![
        measure(
            "tollgate gcra, String keys (IP text)",
            &texts,
            || KeyedLimiter::<String, Gcra>::new(rule()),
            |limiter, text| {
                assert!(limiter
                    .check(text.as_str())
                    .expect("no key bound")
                    .allowed())
            },
            |limiter, text| {
                black_box(limiter.check(text.as_str()).expect("no key bound"));
            },
            |limiter| limiter.len(),
        ),
        measure(
            "governor keyed, String keys (IP text)",
            &texts,
            || governor::RateLimiter::<String, _, _>::keyed(governor_quota),
            |limiter, text| assert!(limiter.check_key(text).is_ok()),
            |limiter, text| {
                let _ = black_box(limiter.check_key(text));
            },
            |limiter| limiter.len(),
        ),
    ]
}

/// Bytes per key of tollgate's GCRA and of governor over a range of key counts.
fn sweep(ten: Quota) {
    println!("| keys | tollgate gcra | tollgate gcra after one check of every key | governor |");
    println!("|---|---|---|---|");
    for n in [
        125_000, 250_000, 500_000, 750_000, 1_000_000, 1_500_000, 2_000_000,
    ] {
        let keys = keys(n);
        let ours = tollgate("tollgate gcra", &keys, Gcra::new(ten).expect("valid"), 1);
        let theirs = governor_row(&keys);
        println!(
            "| {n} | {:.1} | {:.1} | {:.1} |",
            ours.bytes_per_key, ours.bytes_per_key_checked, theirs.bytes_per_key_checked
        );
    }
}

/// Resident memory now and at its peak, in bytes (Linux; 0 elsewhere).
fn resident() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |field: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map_or(0, |kib| kib * 1024)
    };
    (kib("VmRSS:"), kib("VmHWM:"))
}

/// One RSS measurement, in this (fresh) process: prints `keys held, base, after the inserts,
/// settled, peak, live heap settled` (the heap as requested from the allocator, grown since
/// base), in bytes.
fn rss_one(subject: &str, key_type: &str, n: usize) {
    let raw = keys(n);
    let hour = Duration::from_secs(3600);
    let ten = Quota::new(10, hour).expect("valid quota");
    let governor_quota = governor::Quota::per_hour(NonZeroU32::new(10).expect("non-zero"));
    fn run<K: Clone, L>(
        keys: &[K],
        build: impl FnOnce() -> L,
        check: impl Fn(&L, &K) -> bool,
        held: impl Fn(&L) -> usize,
    ) {
        let (base, _) = resident();
        let heap = live();
        let subject = build();
        for key in keys {
            assert!(check(&subject, key), "every first check is admitted");
        }
        let (after, _) = resident();
        for _ in 0..2 {
            for key in keys {
                black_box(check(&subject, key));
            }
        }
        let (settled, peak) = resident();
        let heap = live() - heap;
        println!("{} {base} {after} {settled} {peak} {heap}", held(&subject));
    }
    fn tollgate_check<K: std::hash::Hash + Eq + Clone + Send + Sync>(
        limiter: &KeyedLimiter<K, Gcra>,
        key: &K,
    ) -> bool {
        limiter.check(key).expect("no key bound").allowed()
    }
    match (subject, key_type) {
        ("tollgate", "u64") => run(
            &raw,
            || KeyedLimiter::<u64, Gcra>::new(Gcra::new(ten).expect("valid")),
            tollgate_check,
            |l| l.len(),
        ),
        ("governor", "u64") => run(
            &raw,
            || governor::RateLimiter::keyed(governor_quota),
            |l, k| l.check_key(k).is_ok(),
            |l| l.len(),
        ),
        ("tollgate", "ip") => {
            let ips = ip_keys(&raw);
            run(
                &ips,
                || KeyedLimiter::<IpAddr, Gcra>::new(Gcra::new(ten).expect("valid")),
                tollgate_check,
                |l| l.len(),
            )
        }
        ("governor", "ip") => {
            let ips = ip_keys(&raw);
            run(
                &ips,
                || governor::RateLimiter::keyed(governor_quota),
                |l, k| l.check_key(k).is_ok(),
                |l| l.len(),
            )
        }
        ("tollgate", "string" | "uuid") => {
            let texts = texts_of(key_type, &raw);
            run(
                &texts,
                || KeyedLimiter::<String, Gcra>::new(Gcra::new(ten).expect("valid")),
                |l, k| l.check(k.as_str()).expect("no bound").allowed(),
                |l| l.len(),
            )
        }
        ("governor", "string" | "uuid") => {
            let texts = texts_of(key_type, &raw);
            run(
                &texts,
                || governor::RateLimiter::<String, _, _>::keyed(governor_quota),
                |l, k| l.check_key(k).is_ok(),
                |l| l.len(),
            )
        }
        _ => panic!("unknown subject or key type: {subject} {key_type}"),
    }
}

/// `IpAddr` keys: even ones IPv4, odd ones IPv6 (in 2001:db8::/32).
fn ip_keys(raw: &[u64]) -> Vec<IpAddr> {
    raw.iter()
        .enumerate()
        .map(|(i, &key)| {
            if i % 2 == 0 {
                IpAddr::V4((key as u32).into())
            } else {
                IpAddr::V6(((0x2001_0db8_u128 << 96) | u128::from(key)).into())
            }
        })
        .collect()
}

/// IP-like text keys of about 17 bytes, `198.a.b.c#hex`: distinct, and past the 15 bytes a
/// `String`'s heap block of 16 would hold.
fn text_keys(raw: &[u64]) -> Vec<String> {
    raw.iter()
        .map(|&key| {
            let [a, b, c, d, e, ..] = key.to_le_bytes();
            format!("198.{a}.{b}.{c}#{:x}", u16::from_le_bytes([d, e]))
        })
        .collect()
}

/// UUID text keys, 36 bytes (`8-4-4-4-12` hex digits), distinct: the key's 64 bits, a
/// version nibble and 60 bits of their mix.
fn uuid_keys(raw: &[u64]) -> Vec<String> {
    raw.iter()
        .map(|&key| {
            let mix = key.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
            format!(
                "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
                key >> 32,
                (key >> 16) & 0xffff,
                (key >> 4) & 0xfff,
                0x8000 | (key & 0xf) << 10 | (mix >> 54),
                mix & 0xffff_ffff_ffff,
            )
        })
        .collect()
}

/// The text keys of `key_type`: `string` (IP-like, [`text_keys`]) or `uuid` ([`uuid_keys`]).
fn texts_of(key_type: &str, raw: &[u64]) -> Vec<String> {
    match key_type {
        "uuid" => uuid_keys(raw),
        _ => text_keys(raw),
    }
}

/// The RSS table: every size, key type and subject in a fresh process of this example.
fn rss(sizes: &[usize]) {
    let exe = std::env::current_exe().expect("this example's path");
    println!("Resident bytes per key held (tollgate GCRA / governor), each in a fresh process:");
    println!();
    println!("| keys | key | after the inserts | settled | peak |");
    println!("|---|---|---|---|---|");
    for &n in sizes {
        for key_type in ["u64", "ip", "string", "uuid"] {
            let mut cells = [String::new(), String::new(), String::new()];
            let mut per_key = Vec::new();
            for subject in ["tollgate", "governor"] {
                let out = std::process::Command::new(&exe)
                    .args(["rss-one", subject, key_type, &n.to_string()])
                    .output()
                    .expect("the example runs itself");
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let text = String::from_utf8_lossy(&out.stdout);
                let v: Vec<f64> = text
                    .split_whitespace()
                    .map(|x| x.parse().expect("a number"))
                    .collect();
                let (held, base) = (v[0], v[1]);
                per_key.push([
                    (v[2] - base) / held,
                    (v[3] - base) / held,
                    (v[4] - base) / held,
                ]);
            }
            for (i, cell) in cells.iter_mut().enumerate() {
                *cell = format!("{:.0} / {:.0}", per_key[0][i], per_key[1][i]);
            }
            let key = match key_type {
                "ip" => "IpAddr",
                "string" => "String",
                "uuid" => "String (UUID)",
                _ => "u64",
            };
            println!(
                "| {n} | {key} | {} | {} | {} |",
                cells[0], cells[1], cells[2]
            );
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let arg = args.next();
    if arg.as_deref() == Some("rss-one") {
        let (subject, key_type, n) = (args.next(), args.next(), args.next());
        let n = n
            .and_then(|n| n.parse().ok())
            .expect("rss-one SUBJECT KEY_TYPE COUNT");
        return rss_one(
            &subject.unwrap_or_default(),
            &key_type.unwrap_or_default(),
            n,
        );
    }
    if arg.as_deref() == Some("rss") {
        let sizes: Vec<usize> = args.map(|n| n.parse().expect("key counts")).collect();
        let default = [
            100_000, 600_000, 1_000_000, 1_500_000, 2_000_000, 4_000_000, 8_000_000,
        ];
        return rss(if sizes.is_empty() { &default } else { &sizes });
    }
    let hour = Duration::from_secs(3600);
    // Ten per hour: one admission leaves GCRA 6 minutes of debt and a window a count of 1, so
    // no key is fresh while this runs; the hot-path pass is admitted too.
    let ten = Quota::new(10, hour).expect("valid quota");
    if arg.as_deref() == Some("sweep") {
        return sweep(ten);
    }
    let n: usize = arg
        .map(|arg| arg.parse().expect("a key count or `sweep`"))
        .unwrap_or(1_000_000);
    let keys = keys(n);
    let sixty_four = Quota::new(64, hour).expect("valid quota");

    let mut rows = vec![
        tollgate("tollgate gcra", &keys, Gcra::new(ten).expect("valid"), 1),
        tollgate(
            "tollgate leaky_queue",
            &keys,
            LeakyQueue::new(ten).expect("valid"),
            1,
        ),
        tollgate(
            "tollgate fixed_window",
            &keys,
            FixedWindow::new(ten).expect("valid"),
            1,
        ),
        tollgate(
            "tollgate sliding_window",
            &keys,
            SlidingWindow::new(ten).expect("valid"),
            1,
        ),
        tollgate(
            "tollgate sliding_log (L=64, 1 entry)",
            &keys,
            SlidingLog::new(sixty_four).expect("valid"),
            1,
        ),
    ];
    // Seven entries: past the cell's six inline slots (the smallest heap ring).
    rows.push(tollgate(
        "tollgate sliding_log (L=64, 7 entries)",
        &keys,
        SlidingLog::new(sixty_four).expect("valid"),
        7,
    ));
    // A full log, for the worst case at L = 64; its hot-path checks are denials.
    rows.push(tollgate(
        "tollgate sliding_log (L=64, 64 entries)",
        &keys,
        SlidingLog::new(sixty_four).expect("valid"),
        64,
    ));
    rows.push(governor_row(&keys));
    rows.extend(text_rows(&keys, ten));
    // For scale: the least a map of 8-byte keys to 8-byte states can take.
    rows.push(measure(
        "floor: HashMap<u64, u64> (foldhash), no shards",
        &keys,
        || {
            std::sync::Mutex::new(std::collections::HashMap::<
                u64,
                u64,
                foldhash::fast::RandomState,
            >::default())
        },
        |map, key| {
            map.lock().expect("not poisoned").insert(key, 1);
        },
        |map, key| {
            black_box(map.lock().expect("not poisoned").get(&key).copied());
        },
        |map| map.lock().expect("not poisoned").len(),
    ));

    println!("keys: {n}");
    println!(
        "| subject | keys held | bytes/key | bytes/key after one check of every key | allocations/key (insert) | allocations in {n} hot-path checks |"
    );
    println!("|---|---|---|---|---|---|");
    for row in &rows {
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.3} | {} |",
            row.name,
            row.held,
            row.bytes_per_key,
            row.bytes_per_key_checked,
            row.allocs_per_key,
            row.hot_allocs
        );
    }
}
