//! The CNI operations as the agent performs them: ADD, DEL, CHECK and GC
//! ([`add`]; an IPv6 network's ADD [`add6`], a dual-stack one's
//! [`add_dual`]), a VM's one-shot discovery and VFIO handoff ([`vm`]; on an
//! IPv6 or dual-stack network [`vm6`]), the
//! CNI network configuration as the agent's own record keeps it
//! ([`network`]), the guest learning that follows a VM's own DHCP
//! ([`learn`]), and why an operation failed ([`error`]); what follows a bound lease on every ADD path — the
//! report, the record and their undoing, within one deadline — is written
//! once ([`report`]). [`context`] is the state they share; [`trust`] is
//! what a request is checked for before anything acts on it; [`identity`]
//! finds the pod of an ADD that names none, from Open vSwitch; [`ovnk_vm`]
//! is what the agent knows of a VM whose DHCP OVN-Kubernetes does itself
//! (no ADD: its port and its pod's entry).
//!
//! Operations stand on leases, the guard and the adapters; nothing below
//! imports them, and the daemon above calls them.

pub(crate) mod add;
pub(crate) mod add6;
pub(crate) mod add_dual;
pub(crate) mod context;
pub(crate) mod error;
pub(crate) mod guard_port;
pub(crate) mod identity;
pub(crate) mod learn;
pub(crate) mod network;
pub(crate) mod ovnk_vm;
pub(crate) mod report;
pub(crate) mod trust;
pub(crate) mod vm;
pub(crate) mod vm6;
pub(crate) mod vm_answer;
