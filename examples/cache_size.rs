//! How much cache this machine gives one process, measured: a chase of dependent loads, one
//! cache line each, through working sets from 1 MiB to 1 GiB. The benches name the L3 beside
//! their figures, and a VM's `lscpu` may report the host's whole cache (or none); where the
//! time per load jumps is where the tables of the traffic rows stop fitting.
//!
//! ```sh
//! cargo run --release --example cache_size
//! ```

use std::hint::black_box;
use std::time::Instant;

/// Bytes a step of the chase moves on: one cache line.
const LINE: usize = 64;
/// Loads timed per working set.
const STEPS: usize = 20_000_000;

fn main() {
    println!("| working set | ns per dependent load |");
    println!("|---|---|");
    for mib in [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024] {
        let lines = mib * (1 << 20) / LINE;
        // One `usize` a line is read; the rest of the line pads it.
        let stride = LINE / size_of::<usize>();
        // A random cycle through every line (xorshift-driven Fisher-Yates), so the hardware
        // prefetchers cannot guess the next line.
        let mut order: Vec<usize> = (0..lines).collect();
        let mut x = 0x2545_F491_4F6C_DD1D_u64;
        for i in (1..lines).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let mut next = vec![0usize; lines * stride];
        for (i, &line) in order.iter().enumerate() {
            next[line * stride] = order[(i + 1) % lines] * stride;
        }
        // Once round the cycle first: the pages are touched and the TLB warm.
        let mut at = 0;
        for _ in 0..lines {
            at = next[at];
        }
        let start = Instant::now();
        for _ in 0..STEPS {
            at = next[at];
        }
        let ns = start.elapsed().as_nanos() as f64 / STEPS as f64;
        black_box(at);
        println!("| {mib} MiB | {ns:.1} |");
    }
}
