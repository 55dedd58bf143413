//! Fuzz target `reply_options`: see `xdhcp_engine::fuzzing::reply_options` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xdhcp_engine::fuzzing::reply_options(data));
