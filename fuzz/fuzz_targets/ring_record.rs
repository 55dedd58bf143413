//! Fuzz target `ring_record`: see `xdhcp::fuzzing::ring_record` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xdhcp::fuzzing::ring_record(data));
