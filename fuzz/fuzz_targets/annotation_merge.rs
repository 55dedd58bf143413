//! Fuzz target `annotation_merge`: see `xdhcp::fuzzing::annotation_merge` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xdhcp::fuzzing::annotation_merge(data));
