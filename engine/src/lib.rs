//! Sans-IO `DHCPv4` client engine (RFC 2131) for xdhcp, and in [`v6`] its
//! `DHCPv6` counterpart (RFC 8415).
//!
//! No sockets, no clocks, no async runtime: the driver feeds packets and
//! timer expiries in with an explicit `now` ([`Client::handle_packet`],
//! [`Client::handle_timeout`]) and drains messages, deadlines and events out
//! ([`Client::poll_transmit`], [`Client::poll_timeout`],
//! [`Client::poll_event`]) — the quinn-proto shape. Randomness (xids,
//! backoff jitter) comes from a seed, so every path is testable in virtual
//! time.
//!
//! # Driving the client
//!
//! ```
//! use std::time::{Duration, Instant};
//! use xdhcp_engine::{Client, ClientConfig, Destination, MessageKind, State};
//!
//! let cfg = ClientConfig { chaddr: [0x02, 0, 0, 0, 0, 1], ..ClientConfig::default() };
//! cfg.validate().unwrap();
//! let t0 = Instant::now();
//! let mut client = Client::new(cfg, t0, 42);
//!
//! // The DISCOVER is queued at once; send it, register its xid.
//! let discover = client.poll_transmit().unwrap();
//! assert_eq!(discover.kind, MessageKind::Discover);
//! assert_eq!(discover.dst, Destination::Broadcast);
//! assert_eq!(client.state(), State::Selecting);
//!
//! // Nothing heard: at the deadline the driver fires the timer and the
//! // DISCOVER is retransmitted (4 s ± 1 s later, RFC 2131 §4.1).
//! let deadline = client.poll_timeout().unwrap();
//! assert!(deadline >= t0 + Duration::from_secs(3) && deadline <= t0 + Duration::from_secs(5));
//! client.set_wall_clock_unix_ms(1_800_000_000_000);
//! client.handle_timeout(deadline);
//! assert_eq!(client.poll_transmit().unwrap().xid, discover.xid);
//! // Replies go to `handle_packet(now, source, udp_payload)`; events
//! // (`Bound`, `Renewed`, `Lost`, ...) come out of `poll_event`.
//! assert!(client.poll_event().is_none());
//! ```
//!
//! # Clocks
//! - [`Client::resume`] takes the wall clock at `now` (`now_unix_ms`) besides
//!   the monotonic `now`: the remaining T1/T2/lease times of a persisted
//!   lease are computed from [`Lease::acquired_unix_ms`] and cannot be known
//!   without it.
//! - [`Client::set_wall_clock_unix_ms`] anchors its value to the `now` of the
//!   next `handle_*`/`release`/`decline`/`restart` call; call it right before.
//! - [`Client::new`] queues the first DISCOVER (or INIT-REBOOT REQUEST) at
//!   once, so [`Client::state`] is already SELECTING/REBOOTING unless
//!   `retransmit.init_delay_max` is set.
//!
//! # Building the public structs
//! New fields are only ever added to [`ClientConfig`], which callers build
//! with `..ClientConfig::default()`; [`Lease`] and [`Retransmit`] may be
//! built field by field.
//!
//! # Modules
//! - [`state`]: RFC 2131 states.
//! - [`client`]: the state machine.
//! - [`validate`]: raw reply parsing and [`DropReason`]: bad input from the
//!   wire is dropped and counted, never a panic, never a wrong lease.
//! - [`lease`]: [`Lease`] and option extraction; a malformed optional option
//!   is dropped ([`LeaseOption`]), never the reply.
//! - [`routes`]: option 121 and the route policy against `TunnelVision`.
//! - [`message`]: outgoing messages built with `dhcproto`.
//! - [`backoff`]: RFC 2131 §4.1 / §4.4.5 retransmission timing.
//! - [`config`]: configuration and defaults.
//! - [`v6`]: the `DHCPv6` client (RFC 8415), same shape, own types.
//! - `fuzzing` (feature `fuzzing`): entry points of the `fuzz/` targets.

pub mod backoff;
pub mod client;
pub mod config;
pub mod event;
/// Fuzzing entry points (feature `fuzzing`; always built for unit tests,
/// which replay the committed corpora through them).
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod lease;
pub mod message;
pub mod routes;
pub mod state;
pub mod stats;
mod tally;
/// The `DHCPv6` client engine (RFC 8415), in the same shape.
pub mod v6;
pub mod validate;
mod wall;

pub use client::{Client, Destination, LeaseTimers, PacketSource, PlannedXids, Transmit};
pub use config::{ClientConfig, ClientId, ConfigError, ExpiredLeasePolicy, Mode, Retransmit};
pub use event::{AcquireError, Event, Heard, HeardNak, HeardOffer, LostReason};
pub use lease::{Lease, LeaseOption, Malformation, MalformedOption};
pub use message::MessageKind;
pub use routes::{Ipv4Prefix, RejectedRoute, Route, RoutePolicy, RouteRejection};
pub use state::State;
pub use stats::ClientStats;
pub use validate::DropReason;

#[cfg(test)]
mod tests;
