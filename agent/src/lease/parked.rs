//! The RELEASE of a parked lease: one whose task ended with its interface
//! (the `bridge` plugin removes the pod's interface before the DEL), or
//! whose interface was gone when a restarted agent found its record. No
//! socket in the pod is left to send it, so it goes out of the node uplink
//! the lease's replies came by, from the pod's MAC: a DHCPv4 RELEASE
//! unicast from the leased address to the server's MAC learned from the
//! ACK, a DHCPv6 one to `ff02::1:2`.
//!
//! No server answers a RELEASE, so, as a lease task's own does
//! ([`crate::lease::task`]), it goes once more a moment later
//! ([`crate::lease::task::release_again_delay`]), without the DEL waiting
//! for the copy.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use tracing::{debug, info, warn};
use xdhcp_engine::{ClientConfig, Mode};

use crate::datapath::capture::Capture;
use crate::datapath::rawsock::RawSockError;
use crate::lease::persist::LeaseRecord;
use crate::lease::services::Services;
use crate::model::UplinkRef;
use crate::sys::clock::{now_unix_ms, seed};

/// Sends one message of a family out of an uplink: (capture, uplink name,
/// the pod's MAC, the uplink's VLAN, the message).
type Send<M> = fn(&Capture, &str, [u8; 6], Option<u16>, &M) -> Result<(), RawSockError>;

/// RELEASE the lease of `rec` out of the uplink its record names, then
/// once more a moment later. Nothing without a lease or an uplink.
/// `base`: the agent's client settings (the engine resumed to build the
/// message needs a whole configuration).
pub(crate) fn release(svc: &Arc<Services>, base: &ClientConfig, rec: &LeaseRecord) {
    let Some(uplink) = rec.uplink.clone() else {
        return;
    };
    if let Some(lease) = rec.lease6.as_deref() {
        let cfg = crate::lease::v6::engine_config6(&rec.network, rec.mac, base.acquire_timeout);
        let now = Instant::now();
        let mut client =
            xdhcp_engine::v6::Client::resume(cfg, lease.clone(), now, now_unix_ms(), seed());
        client.release(now);
        let messages = std::iter::from_fn(|| client.poll_transmit().map(|t| t.payload)).collect();
        let send: Send<Vec<u8>> = |c, name, mac, vlan, p| c.send6_via_uplink(name, mac, vlan, p);
        twice(svc, rec, uplink, lease.address.into(), messages, send);
    } else if let Some(lease) = &rec.lease {
        let cfg = crate::lease::acquire::engine_config(
            base,
            &rec.network,
            &rec.args,
            rec.mac,
            Mode::Maintain,
            None,
        );
        let now = Instant::now();
        let mut client =
            xdhcp_engine::Client::resume(cfg, lease.clone(), now, now_unix_ms(), seed());
        client.release(now);
        let messages = std::iter::from_fn(|| client.poll_transmit()).collect();
        let send: Send<xdhcp_engine::Transmit> =
            |c, name, mac, vlan, t| c.send_via_uplink(name, mac, vlan, t);
        twice(svc, rec, uplink, lease.address.into(), messages, send);
    }
}

/// Send `messages` (the RELEASE of `address`) out of `uplink` with
/// `send`, each failure logged and counted (`release_uplink`); what went
/// goes again after [`crate::lease::task::release_again_delay`], from a
/// task of its own (a failed copy counted as `release_again`).
fn twice<M: std::marker::Send + Sync + 'static>(
    svc: &Arc<Services>,
    rec: &LeaseRecord,
    uplink: UplinkRef,
    address: IpAddr,
    messages: Vec<M>,
    send: Send<M>,
) {
    let mac = rec.mac;
    let mut sent = Vec::with_capacity(messages.len());
    for m in messages {
        match send(&svc.capture, &uplink.ifname, mac, uplink.vlan, &m) {
            Ok(()) => {
                info!(container = %rec.container_id, ifname = %rec.ifname,
                    uplink = %uplink.ifname, %address, "released through the uplink");
                sent.push(m);
            }
            Err(e) => {
                svc.metrics.failure("release_uplink");
                warn!(uplink = %uplink.ifname, %address, error = %crate::rpc::format_chain(&e),
                    "the RELEASE through the uplink could not be sent");
            }
        }
    }
    if sent.is_empty() {
        return;
    }
    let svc = svc.clone();
    tokio::spawn(async move {
        tokio::time::sleep(crate::lease::task::release_again_delay()).await;
        for m in &sent {
            if let Err(e) = send(&svc.capture, &uplink.ifname, mac, uplink.vlan, m) {
                svc.metrics.failure("release_again");
                debug!(uplink = %uplink.ifname, error = %crate::rpc::format_chain(&e),
                    "the RELEASE's second copy could not be sent through the uplink");
            }
        }
    });
}
