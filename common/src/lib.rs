//! Types shared by the xdhcp eBPF programs and the user-space agent.
//!
//! Everything here is `#[repr(C)]`, `Copy`, free of `bool` and implicit padding,
//! and implements `aya::Pod` behind the `user` feature.
#![no_std]
