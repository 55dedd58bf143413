//! Fuzz target `cni_config`: see `xdhcp::fuzzing::cni_config` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xdhcp::fuzzing::cni_config(data));
