//! Fuzz target `lease_record`: see `xdhcp::fuzzing::lease_record` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xdhcp::fuzzing::lease_record(data));
