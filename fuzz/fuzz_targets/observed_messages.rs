//! Fuzz target `observed_messages`: see `xdhcp_engine::fuzzing::observed_messages` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xdhcp_engine::fuzzing::observed_messages(data));
