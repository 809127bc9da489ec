//! The criterion benches: tollgate against governor 0.10 and against floors, in one
//! harness. Each module exposes its groups as functions.
//!
//! ```text
//! cargo bench --bench limiters                        # everything (about 15 minutes)
//! cargo bench --bench limiters -- keyed_gcra/         # one group
//! cargo bench --bench limiters -- traffic/            # the traffic matrix (about 7 minutes without the 2M-8M rows)
//! cargo bench --bench limiters -- in_flight/          # concurrency limits, per key and global
//! cargo bench --bench limiters -- 'keyed_gcra/tollgate/100k'
//! ```
//! See `benches/README.md` for the figures and what every row measures.

use criterion::{criterion_group, criterion_main};
// The traffic rows (the `tollgate-traffic` dev crate, `benches/traffic/`), shared with the
// latency bench and the `traffic` example.
use tollgate_traffic as regime;

mod algos;
mod common;
mod direct;
mod in_flight;
mod keyed;
mod subjects;
mod traffic;

criterion_group!(
    benches,
    direct::bench_all,
    keyed::bench_one_thread,
    keyed::bench_two_threads,
    algos::bench_all,
    in_flight::bench_all,
    traffic::bench_all
);
criterion_main!(benches);
