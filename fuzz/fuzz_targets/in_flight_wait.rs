#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz::run("in_flight_wait", data));
