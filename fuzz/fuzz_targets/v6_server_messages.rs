//! Fuzz target `v6_server_messages`: see `xdhcp_engine::v6::fuzzing` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xdhcp_engine::fuzzing::v6_server_messages(data));
