//! Types shared by the xdhcp eBPF programs and the user-space agent.
//!
//! Everything here is `#[repr(C)]`, `Copy`, free of `bool` and implicit padding,
//! and implements `aya::Pod` behind the `user` feature.
#![no_std]

/// The rustup toolchain that builds the eBPF object: the machine's installed
/// nightly (never a downloaded one). Used by `agent/build.rs` and by
/// `cargo xtask setup`, which builds bpf-linker against this toolchain's LLVM.
pub const EBPF_TOOLCHAIN: &str = "nightly";
