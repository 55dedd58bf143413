//! Fuzz target `cni_env`: see `xdhcp::fuzzing::cni_env` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xdhcp::fuzzing::cni_env(data));
