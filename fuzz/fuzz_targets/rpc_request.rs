//! Fuzz target `rpc_request`: see `xdhcp::fuzzing::rpc_request` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xdhcp::fuzzing::rpc_request(data));
