//! Fuzz target `client_replies`: see `xdhcp_engine::fuzzing::client_replies` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xdhcp_engine::fuzzing::client_replies(data));
