//! A small OVSDB client (RFC 7047, and the `monitor_cond`/`update2`
//! extensions `ovsdb-server(7)` documents) and the node view xdhcp reads
//! from a node's Open vSwitch database.
//!
//! On an OVN-Kubernetes node, pods are ports of the integration bridge
//! (`br-int`) and a localnet network reaches the wire through a patch port
//! into the provider bridge that `ovn-bridge-mappings` names, whose ports
//! are the NICs. The agent needs both: the uplinks to capture on and the
//! pod ports with the identities OVN-Kubernetes writes on them.
//!
//! * [`Client`]: connect, `get_schema`, `transact` (reads), `monitor_cond`
//!   (falling back to `monitor`), `echo`, with the server's notifications as
//!   [`Events`];
//! * [`Replica`]: the monitored tables, kept by `update`/`update2`;
//! * [`node_view`]: the sans-IO step from a replica to a [`NodeView`];
//! * [`NodeWatch`]: all of it running, as a `watch` channel of
//!   [`NodeState`] that reconnects on its own.
//!
//! ```no_run
//! # async fn f() {
//! use xdhcp_ovsdb::{DEFAULT_SOCKET, NodeState, NodeWatch, WatchOptions};
//!
//! let mut rx = NodeWatch::spawn(DEFAULT_SOCKET, WatchOptions::default());
//! while rx.changed().await.is_ok() {
//!     if let NodeState::Ready(view) = &*rx.borrow_and_update() {
//!         for uplink in view.uplinks_of("physnet1") {
//!             // capture on uplink.ifname …
//!         }
//!     }
//! }
//! # }
//! ```
//!
//! No published crate fitted: the `ovsdb` crate on crates.io was at 0.0.6,
//! and this needs only reads, one monitor and a reconnect loop.

pub mod client;
pub mod node;
pub mod replica;
pub mod rpc;
pub mod schema;
pub mod value;
pub mod watch;

pub use client::{
    Applied, Client, Condition, DEFAULT_SOCKET, Error, Event, Events, Function, Monitor,
    MonitorKind, MonitorRequests, Operation, OperationResult,
};
pub use node::{
    BridgeMapping, DEFAULT_INTEGRATION_BRIDGE, Datapath, Mac, NodeView, Uplink, UplinkKind,
    ViewOptions, ViewWarning, WorkloadPort, monitor_requests, node_view, parse_bridge_mappings,
};
pub use replica::{Replica, Row, UpdateError};
pub use schema::{DatabaseSchema, SchemaError};
pub use value::{Atom, ColumnKind, Uuid, Value, ValueError};
pub use watch::{NodeState, NodeWatch, VSWITCH_DB, WatchError, WatchOptions};
