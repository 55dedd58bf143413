//! Guest learning: follows the guests' own DHCP on guarded VM ports (the
//! guard's ring) and keeps each VM's `pod-networks` entry at the address
//! its guest holds, through the same report as an ADD.

use tracing::{info, warn};

use crate::bindings::LearnedStore;
use crate::guard::GuardedPort;

/// How often expired learned bindings are dropped.
const EXPIRY_PERIOD: std::time::Duration = std::time::Duration::from_secs(5);

/// Follows the guests' own DHCP on VM ports (the guard ring): an ACK for
/// the VM's MAC records a learned binding and, when the address is not the
/// one the `pod-networks` entry reports, rewrites the entry (the same
/// read-modify-write as at ADD) at once; a renewal of the same address
/// changes nothing; a RELEASE or the lease's expiry drops the learned
/// binding and leaves the entry at the last address the guest held; a
/// DECLINE drops it and, when its ACK had moved the entry, puts back the
/// address the entry reported before (the guest never held the declined
/// one).
pub(crate) async fn learn_guests(
    agent: std::sync::Arc<crate::ops::context::Agent>,
    token: tokio_util::sync::CancellationToken,
) {
    let reader = agent.guard.take_reader();
    let Some(mut reader) = reader else {
        token.cancelled().await;
        return;
    };
    let mut sweep = tokio::time::interval(EXPIRY_PERIOD);
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            _ = sweep.tick() => expire(&agent),
            ev = reader.recv() => match ev {
                Ok(ev) => on_event(&agent, &ev).await,
                Err(e) => {
                    warn!(error = %crate::rpc::format_chain(&e),
                        "the guard ring failed; guests' leases are no longer learned");
                    token.cancelled().await;
                    return;
                }
            },
        }
    }
}

fn expire(agent: &crate::ops::context::Agent) {
    let now = crate::sys::clock::now_unix_ms();
    let gone = agent
        .guard
        .learned
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .expire(now);
    match gone {
        Ok(gone) => {
            for b in gone {
                info!(mac = %b.mac, ip = %b.ip, "learned binding expired");
            }
        }
        Err(e) => warn!(error = %e, "could not drop expired learned bindings"),
    }
}

async fn on_event(agent: &crate::ops::context::Agent, ev: &crate::datapath::ebpf::GuardEvent) {
    use crate::bindings::{Learned, format_mac, learn};
    use crate::datapath::ebpf::Direction;

    let Some(((cid, ifname), port)) = agent.guard.port_of(ev.ifindex) else {
        return;
    };
    let Some(mac) = port.policy.single_client else {
        return;
    };
    let learned = match learn(&ev.payload, mac, ev.direction == Direction::ToWorkload) {
        Ok(l) => l,
        Err(e) => {
            tracing::trace!(port = %port.host_ifname, reason = %e, "guest message teaches nothing");
            return;
        }
    };
    let record = agent
        .leases
        .get(&cid, &ifname)
        .map(|h| crate::sys::sync::lock(&h.live).record.clone());
    let mac_text = format_mac(mac);
    match learned {
        Learned::Released { ip } => {
            with_store(agent, &mut |s| s.remove(&mac_text, Some(ip)).map(|_| ()));
            info!(port = %port.host_ifname, mac = %mac_text, %ip, "guest gave its address back");
        }
        Learned::Declined { ip } => {
            let mut gone = None;
            with_store(agent, &mut |s| {
                s.take(&mac_text, Some(ip)).map(|b| gone = b)
            });
            info!(port = %port.host_ifname, mac = %mac_text, %ip,
                "guest declined the address it was acknowledged (in use)");
            // The ACK moved the entry to an address the guest never held:
            // put back what it reported before.
            if let Some(back) = gone.and_then(|b| b.replaced).filter(|b| *b != ip) {
                move_entry(agent, &port, mac, record, back, None, None).await;
            }
        }
        Learned::Bound {
            ip,
            prefix_len,
            router,
            lease_secs,
        } => {
            let bound = GuestBound {
                ip,
                prefix_len,
                router,
                lease_secs,
            };
            follow(agent, &port, mac, record, &bound).await;
        }
    }
}

/// A guest's ACK, as learned.
#[derive(Clone, Copy)]
struct GuestBound {
    ip: std::net::Ipv4Addr,
    prefix_len: Option<u8>,
    router: Option<std::net::Ipv4Addr>,
    lease_secs: Option<u32>,
}

/// Records the guest's binding and, when its address is not the one
/// reported, moves the `pod-networks` entry to it.
async fn follow(
    agent: &crate::ops::context::Agent,
    port: &GuardedPort,
    mac: [u8; 6],
    record: Option<crate::store::LeaseRecord>,
    bound: &GuestBound,
) {
    use crate::bindings::{Binding, BindingSource, format_mac};
    let GuestBound {
        ip,
        prefix_len,
        router,
        lease_secs,
    } = *bound;
    let mac_text = format_mac(mac);
    let existing = agent
        .guard
        .learned
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(&mac_text)
        .cloned();
    // What the entry reports now: the last learned address, else the one-shot's.
    let previous = existing.as_ref().map(|b| b.ip).or_else(|| {
        record
            .as_ref()
            .and_then(|r| r.lease.as_ref())
            .map(|l| l.address)
    });
    let now = crate::sys::clock::now_unix_ms();
    let binding = Binding {
        mac: mac_text.clone(),
        ip,
        port: Some(port.host_ifname.clone()),
        pod: record
            .as_ref()
            .and_then(|r| r.pod.as_ref())
            .map(|p| format!("{}/{}", p.namespace, p.name)),
        expires_unix_ms: lease_secs.map(|s| now + u64::from(s) * 1000),
        source: BindingSource::Learned,
        // A renewal keeps what its first ACK replaced; a move records
        // what it replaces.
        replaced: if previous == Some(ip) {
            existing.filter(|b| b.ip == ip).and_then(|b| b.replaced)
        } else {
            previous
        },
    };
    with_store(agent, &mut |s| s.upsert(binding.clone()));
    if previous == Some(ip) {
        return;
    }
    info!(port = %port.host_ifname, mac = %mac_text, %ip, previous = ?previous,
        "guest holds another address than reported");
    move_entry(agent, port, mac, record, ip, prefix_len, router).await;
}

/// Rewrites the `pod-networks` entry of the VM's record to `ip` (the
/// record's prefix length and router unless given).
async fn move_entry(
    agent: &crate::ops::context::Agent,
    port: &GuardedPort,
    mac: [u8; 6],
    record: Option<crate::store::LeaseRecord>,
    ip: std::net::Ipv4Addr,
    prefix_len: Option<u8>,
    router: Option<std::net::Ipv4Addr>,
) {
    let Some(rec) = record else {
        info!(port = %port.host_ifname, %ip, "no lease record for the port; the entry is not written");
        return;
    };
    let (Some(pod), Some(key), Some(mut lease)) = (
        rec.pod.clone(),
        rec.annotation_key.clone(),
        rec.lease.clone(),
    ) else {
        return;
    };
    lease.address = ip;
    if let Some(p) = prefix_len {
        lease.prefix_len = p;
    }
    if let Some(r) = router {
        lease.routers = vec![r];
    }
    match crate::ops::report::report_address(&*agent.pod_api, &pod, &key, &lease, mac, None).await {
        Ok(()) => info!(pod = %format!("{}/{}", pod.namespace, pod.name), %ip,
            "pod-networks entry follows the guest's address"),
        Err(e) => {
            agent.metrics().failure("kube_api");
            warn!(error = %crate::rpc::format_chain(&e),
                "could not update the pod-networks entry to the guest's address");
        }
    }
}

/// Runs `f` on the learned-binding store; a failure to persist is logged
/// and counted (the binding stays in memory).
fn with_store(
    agent: &crate::ops::context::Agent,
    f: &mut dyn FnMut(&mut LearnedStore) -> Result<(), crate::bindings::StoreError>,
) {
    let mut s = agent
        .guard
        .learned
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Err(e) = f(&mut s) {
        agent.metrics().failure("learned_binding_store");
        warn!(error = %e, "could not persist a learned binding");
    }
}
