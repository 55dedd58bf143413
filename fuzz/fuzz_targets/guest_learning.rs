//! Fuzz target `guest_learning`: see `xdhcp::fuzzing::guest_learning` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xdhcp::fuzzing::guest_learning(data));
