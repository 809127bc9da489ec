//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) through the same logic the
//! cargo-fuzz targets run, so `cargo test` covers it even without cargo-fuzz.

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod fuzz_logic;

use std::path::Path;

#[test]
fn committed_corpus_passes_every_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let mut inputs = 0;
    for target in fuzz_logic::TARGETS {
        let dir = root.join(target);
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("no seed corpus for {target} at {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("corpus entry").path();
            let data = std::fs::read(&path).expect("readable corpus file");
            fuzz_logic::run(target, &data);
            inputs += 1;
        }
    }
    assert!(
        inputs >= fuzz_logic::TARGETS.len(),
        "every target has seeds"
    );
}
