//! Leases: one lease's live view ([`live`]), the task that runs it
//! ([`task`]), its record on disk ([`persist`]) and, when asked, its address
//! on the pod interface ([`apply`]), which the task asks for as effects
//! that a store writer and an applier carry out ([`effects`]); the table of every lease the agent
//! holds ([`registry`]), how many new acquisitions a network admits at
//! once ([`pacing`]), the one acquisition every ADD path runs
//! ([`acquire`]: slot, task, first outcome), and the RELEASE of a lease
//! whose interface is gone, out of the node uplink ([`parked`]).
//!
//! The lease layer stands on the host and kernel adapters (the datapath,
//! the store, netlink) and knows nothing of CNI operations, Kubernetes or
//! the agent socket.

pub(crate) mod acquire;
pub(crate) mod apply;
pub(crate) mod effects;
pub(crate) mod live;
pub(crate) mod pacing;
pub(crate) mod parked;
pub(crate) mod persist;
pub(crate) mod registry;
pub(crate) mod router6;
pub(crate) mod services;
pub(crate) mod task;
pub(crate) mod v6;
