//! Fuzz target `udp_frame`: see `xdhcp::fuzzing::udp_frame` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xdhcp::fuzzing::udp_frame(data));
