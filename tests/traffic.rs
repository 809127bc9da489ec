//! The benches' traffic regimes (`tollgate-traffic`, `benches/traffic/`), through the API the
//! benches and the `traffic` example use: names parse back and bad ones are refused naming the
//! valid values, row IDs name every axis, keys and sequences are what the rows claim, and a
//! tiny row runs to completion (throughput and every check timed) with sensible numbers.

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::Duration;

use tollgate::clock::{Clock, QuantaClock};
use tollgate::{Gcra, KeyedLimiter};
use tollgate_traffic::{
    self as regime, ClockKind, Distribution, Flood, KeyType, Regime, Row, Sequence, Source,
    TrafficKey, BASE,
};

#[test]
fn regimes_parse_by_name_and_an_unknown_one_names_the_valid_values() {
    for r in Regime::ALL {
        assert_eq!(r.as_str().parse::<Regime>(), Ok(r));
    }
    let e = "sometimes".parse::<Regime>().unwrap_err();
    assert!(e.contains("sometimes"), "{e}");
    for r in Regime::ALL {
        assert!(e.contains(r.as_str()), "{e}");
    }
    assert!(
        "Returning".parse::<Regime>().is_err(),
        "names are lower case"
    );
    assert!("".parse::<Regime>().is_err());
}

#[test]
fn key_types_parse_by_name_and_an_unknown_one_names_the_valid_values() {
    for k in KeyType::ALL {
        assert_eq!(k.as_str().parse::<KeyType>(), Ok(k));
    }
    let e = "guid".parse::<KeyType>().unwrap_err();
    assert!(e.contains("guid"), "{e}");
    for k in KeyType::ALL {
        assert!(e.contains(k.as_str()), "{e}");
    }
}

#[test]
fn row_ids_name_every_axis_and_the_matrix_has_each_once() {
    assert_eq!(BASE.id(), "returning/u64/100k/uniform/1t/precise");
    let row = Row {
        regime: Regime::Api,
        key_type: KeyType::String,
        keys: 1_000_000,
        distribution: Distribution::ZIPF1,
        threads: 2,
        clock: ClockKind::Coarse,
    };
    assert_eq!(row.id(), "api/string/1m/zipf/2t/coarse");
    let flood = Row {
        regime: Regime::Flood,
        ..BASE
    };
    assert_eq!(flood.id(), "flood/u64/new/splitmix/1t/precise");
    assert_eq!(regime::size_label(1_500), "1500");

    let matrix = regime::matrix();
    assert!(matrix.contains(&BASE));
    let ids: HashSet<String> = matrix.iter().map(Row::id).collect();
    assert_eq!(ids.len(), matrix.len(), "no row twice");
    assert!(!ids.contains(regime::DIRECT_ID));
    // Every row's quota is one tollgate accepts, on the clock the row names.
    for row in &matrix {
        let rate = row.rate();
        assert!(rate.interval_ns() > 0 && rate.span_ns() >= rate.interval_ns());
        let _ = rate.gcra();
    }
    let _ = regime::DIRECT.gcra();
}

#[test]
fn keys_are_distinct_and_the_text_keys_are_the_addresses_as_text() {
    let n = 10_000u64;
    let u64s: HashSet<u64> = (0..n).map(|i| u64::nth(KeyType::U64, i)).collect();
    let ips: HashSet<IpAddr> = (0..n).map(|i| IpAddr::nth(KeyType::Ip, i)).collect();
    assert_eq!((u64s.len(), ips.len()), (n as usize, n as usize));
    let v6 = ips.iter().filter(|ip| ip.is_ipv6()).count();
    assert_eq!(v6, n as usize / 4, "one in four IPv6");
    for i in 0..100 {
        let ip = IpAddr::nth(KeyType::Ip, i);
        assert_eq!(String::nth(KeyType::String, i), ip.to_string());
        assert_eq!(
            String::nth(KeyType::String, i).lookup(),
            ip.to_string().as_str()
        );
    }
    // The UUID texts: 36 bytes, version 4, the variant's bits, distinct.
    let uuids: HashSet<String> = (0..n).map(|i| String::nth(KeyType::Uuid, i)).collect();
    assert_eq!(uuids.len(), n as usize);
    for uuid in &uuids {
        let groups: Vec<&str> = uuid.split('-').collect();
        assert_eq!(
            groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(
            groups[2].starts_with('4') && "89ab".contains(&groups[3][..1]),
            "{uuid}"
        );
        assert!(
            uuid.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit()),
            "{uuid}"
        );
    }
}

#[test]
fn a_sequence_draws_from_its_keys_and_zipf_favours_the_first() {
    let sequence = Sequence::<u64>::new(KeyType::U64, 100, Distribution::Uniform);
    assert_eq!(sequence.keys.len(), 100);
    let keys: HashSet<u64> = sequence.keys.iter().copied().collect();
    let first = sequence.advance(1_000);
    let seen: HashSet<u64> = (0..1_000)
        .map(|i| sequence.visit(first + i, |k| *k))
        .collect();
    assert!(seen.is_subset(&keys));
    assert!(
        seen.len() > 90,
        "1000 uniform draws of 100 keys touch nearly all"
    );
    assert_eq!(
        sequence.advance(1),
        first + 1_000,
        "runs go on where the last stopped"
    );

    let zipf = regime::draw_indices(1_000, Distribution::ZIPF1, 10_000);
    let uniform = regime::draw_indices(1_000, Distribution::Uniform, 10_000);
    assert!(zipf.iter().chain(&uniform).all(|&i| i < 1_000));
    let zeros = |d: &[u32]| d.iter().filter(|&&i| i == 0).count();
    assert!(
        zeros(&zipf) > 10 * zeros(&uniform).max(1),
        "rank 1 drawn most"
    );
    // The draw depends only on the key count: every key type visits the same indices.
    assert_eq!(
        zipf,
        regime::draw_indices(1_000, Distribution::ZIPF1, 10_000)
    );

    // One shared set per key type, size and distribution.
    let a = regime::shared::<u64>(KeyType::U64, 100, Distribution::Uniform);
    let b = regime::shared::<u64>(KeyType::U64, 100, Distribution::Uniform);
    assert!(std::ptr::eq(a, b));
    assert_eq!(a.keys, sequence.keys);

    // A flood's keys are new: position i is key i.
    let flood = Flood::<u64>::new(KeyType::U64);
    let at = flood.advance(3);
    assert_eq!(
        flood.visit(at + 2, |k| *k),
        u64::nth(KeyType::U64, at as u64 + 2)
    );
}

/// A fresh tollgate limiter for `row`, every key primed as the regime says (what the example
/// and the benches do).
fn limiter<K: TrafficKey>(row: &Row, keys: &[K]) -> KeyedLimiter<K, Gcra, QuantaClock> {
    let limiter = KeyedLimiter::<K, Gcra>::builder(row.rate().gcra())
        .clock(QuantaClock::new())
        .build()
        .expect("the regime's quota suits the precise clock");
    regime::prime(keys, row.regime.prime_cost(), |key, cost| {
        let _ = limiter.check_n(key.lookup(), u64::from(cost));
    });
    limiter
}

fn check<K: TrafficKey, C: Clock>(limiter: &KeyedLimiter<K, Gcra, C>, key: &K) -> bool {
    limiter.check(key.lookup()).is_ok_and(|d| d.allowed())
}

#[test]
fn a_tiny_row_runs_to_completion_with_sensible_numbers() {
    let row = Row {
        keys: 1_000,
        ..BASE
    };
    let sequence = Sequence::<u64>::new(row.key_type, row.keys, row.distribution);

    // Throughput: every check counted, and as many allowed as a returning row allows.
    let limiter = limiter(&row, &sequence.keys);
    let t = regime::run_for(row.threads, Duration::from_millis(20), &sequence, |key| {
        check(&limiter, key)
    });
    assert!(t.checks > 0 && t.checks % 1024 == 0, "whole chunks: {t:?}");
    assert!(t.allowed <= t.checks);
    assert!(t.seconds >= 0.02 && t.seconds < 10.0, "{t:?}");
    assert!(t.ns_per_check() > 0.0 && t.mops() > 0.0, "{t:?}");
    row.regime.plausible_share(t.allowed_share()).unwrap();

    // Every check timed: exactly the checks asked for, ordered quantiles.
    let limiter = self::limiter(&row, &sequence.keys);
    let tails = regime::run_timed(row.threads, 20_000, &sequence, |key| check(&limiter, key));
    assert_eq!(tails.checks(), 20_000);
    let (p50, p99, max) = (
        tails.quantile(0.5),
        tails.quantile(0.99),
        tails.histogram.max(),
    );
    assert!(0 < p50 && p50 <= p99 && p99 <= max, "{p50} {p99} {max}");
    assert!(tails.slow <= tails.checks());
    row.regime.plausible_share(tails.allowed_share()).unwrap();

    // The tails table: a header naming every column, then the row: five durations, the
    // count over 10 µs, the share allowed.
    let id = row.id();
    let table = regime::tails_table(&["tollgate"], &[(id.clone(), vec![tails])]);
    let header = table
        .lines()
        .find(|l| l.starts_with("row"))
        .unwrap_or_else(|| panic!("a header: {table}"));
    let columns: Vec<&str> = header.split_whitespace().collect();
    for column in ["p50", "p99", "p99.9", "p99.99", "max", ">10µs", "allowed"] {
        assert!(columns.contains(&column), "{header}");
    }
    let line = table
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("a line for {id}: {table}"));
    let cells: Vec<&str> = line.split('|').map(str::trim).collect();
    assert_eq!(cells.len(), 3, "{line}");
    let tokens: Vec<&str> = cells[1].split_whitespace().collect();
    assert_eq!(tokens.len(), 11, "{line}");
    for pair in tokens[..10].chunks(2) {
        assert!(pair[0].parse::<f64>().is_ok(), "{line}");
        assert!(["ns", "µs", "ms", "s"].contains(&pair[1]), "{line}");
    }
    assert!(tokens[10].parse::<u64>().is_ok(), "{line}");
    assert!(cells[2].parse::<f64>().is_ok(), "{line}");
}

#[test]
fn deny_and_flood_rows_allow_what_their_regimes_say() {
    // Deny: every key exhausted before timing, 10/s: nearly every check denied.
    let row = Row {
        regime: Regime::Deny,
        keys: 1_000,
        ..BASE
    };
    let sequence = Sequence::<String>::new(row.key_type, row.keys, row.distribution);
    let limiter = limiter(&row, &sequence.keys);
    let tails = regime::run_timed(1, 5_000, &sequence, |key| check(&limiter, key));
    assert_eq!(tails.checks(), 5_000);
    row.regime.plausible_share(tails.allowed_share()).unwrap();
    assert!(Regime::Deny.plausible_share(1.0).is_err());

    // Flood: a new key every check, on two threads: all allowed.
    let row = Row {
        regime: Regime::Flood,
        key_type: KeyType::Ip,
        threads: 2,
        ..BASE
    };
    let limiter = self::limiter::<IpAddr>(&row, &[]);
    let tails = regime::run_timed(
        row.threads,
        5_000,
        &Flood::<IpAddr>::new(KeyType::Ip),
        |key| check(&limiter, key),
    );
    assert_eq!(tails.checks(), 5_000);
    assert_eq!(tails.allowed, 5_000);
    assert_eq!(limiter.len(), 5_000, "every key new");
}

#[test]
fn durations_read_as_people_write_them() {
    assert_eq!(regime::human_ns(870), "870 ns");
    assert_eq!(regime::human_ns(19_100), "19.1 µs");
    assert_eq!(regime::human_ns(2_800_000), "2.80 ms");
    assert_eq!(regime::human_ns(3_000_000_000), "3.00 s");
}
