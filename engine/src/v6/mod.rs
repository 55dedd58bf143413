//! Sans-IO `DHCPv6` client engine (RFC 8415) for one `IA_NA`, beside the
//! `DHCPv4` one and in its shape: the driver feeds server messages and timer
//! expiries in with an explicit `now` ([`Client::handle_packet`],
//! [`Client::handle_timeout`]) and drains messages, deadlines and events out
//! ([`Client::poll_transmit`], [`Client::poll_timeout`],
//! [`Client::poll_event`]). Randomness (transaction ids, the RAND of every
//! retransmission time, the `SOL_MAX_DELAY` wait) comes from a seed, so every
//! path is testable in virtual time.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use xdhcp_engine::v6::{Client, ClientConfig, Destination, MessageKind, State, Timeouts};
//!
//! let cfg = ClientConfig {
//!     mac: [0x02, 0, 0, 0, 0, 1],
//!     timeouts: Timeouts { sol_max_delay: Duration::ZERO, ..Timeouts::default() },
//!     ..ClientConfig::default()
//! };
//! cfg.validate().unwrap();
//! let t0 = Instant::now();
//! let mut client = Client::new(cfg, t0, 42);
//! let solicit = client.poll_transmit().unwrap();
//! assert_eq!(solicit.kind, MessageKind::Solicit);
//! assert_eq!(solicit.dst, Destination::Multicast);
//! assert_eq!(client.state(), State::Soliciting);
//! // ADVERTISEs are collected until the first retransmission time, which is
//! // strictly more than `SOL_TIMEOUT` (1 s) and at most 10 % more.
//! let rt = client.poll_timeout().unwrap();
//! assert!(rt > t0 + Duration::from_secs(1) && rt <= t0 + Duration::from_millis(1100));
//! ```
//!
//! # Modules
//! - [`state`]: client states, each citing its RFC 8415 section.
//! - [`client`]: the state machine.
//! - [`validate`]: decoding with dhcproto behind structural checks, and
//!   [`DropReason`]: bad input is dropped and counted, never a panic, never a
//!   lost lease.
//! - [`lease`]: [`Lease`], `IA_NA` reading, T1/T2 defaults.
//! - [`message`]: outgoing messages built with dhcproto.
//! - [`backoff`]: RFC 8415 §15 retransmission times.
//! - [`config`]: configuration, the DUID and IAID choices, defaults.
//! - [`ra`]: router advertisements (RFC 4861): the prefix length and the
//!   default router `DHCPv6` does not carry.

pub mod backoff;
pub mod client;
pub mod config;
pub mod event;
/// Fuzzing entry point (feature `fuzzing`; always built for unit tests).
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod lease;
pub mod message;
pub mod ra;
pub mod state;
pub mod stats;
pub mod validate;

pub use client::{Client, Destination, LeaseTimers, Transmit};
pub use config::{
    ClientConfig, ConfigError, DuidKind, ResumeMode, Timeouts, Timing, iaid_from_mac,
};
pub use event::{AcquireError, Event, LostReason};
pub use lease::{Lease, Source};
pub use message::MessageKind;
pub use state::State;
pub use stats::ClientStats;
pub use validate::DropReason;

#[cfg(test)]
mod tests;
