//! One acquisition, shared by every ADD path (pod, VM on its pod netdev, VM
//! through the VFIO handoff): the engine configuration, the lease task, the
//! wait for its first outcome; and what follows a lease for every path: the
//! `pod-networks` entry and the CNI result.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use xdhcp_engine::{Client, ClientConfig, ClientId, Ipv4Prefix, Lease, Mode};

use super::context::Agent;
use super::error::{Error, Place};
use super::lease::apply;
use super::lease::live::Outcome;
use super::lease::persist::{self, LeaseRecord, PodRef};
use super::link::{Link, Sockets};
use super::registry::Handle;
use crate::cni::config::{ClientIdSpec, HostnameSpec, NetworkConfig, validate_hostname};
use crate::cni::types::{CniResult, DnsConfig, IpConfig, Ipv4Cidr, RouteConfig};
use crate::kube::{PodApiError, PodNetworkEntry, WriteGuard};
use crate::workload::MacAddr;

/// Extra time beyond the acquisition timeout for the engine's own failure
/// event (its deadline fires on a timer).
const ADD_MARGIN: Duration = Duration::from_secs(3);

/// The least an admitted acquisition gets to run, however long it queued.
const MIN_ACQUIRE_LEFT: Duration = Duration::from_secs(1);

/// What an acquisition is for.
#[derive(Debug)]
pub(crate) struct Request {
    /// The attachment's record, without a lease yet.
    pub(crate) record: LeaseRecord,
    /// Maintained (pod) or one-shot (VM).
    pub(crate) mode: Mode,
    /// INIT-REBOOT for this address (a migrating VM), else a fresh DORA.
    pub(crate) requested: Option<Ipv4Addr>,
    /// Where, for errors.
    pub(crate) place: Place,
}

/// Run the engine on `link` until the first lease (or failure); on failure
/// the attachment is forgotten and its record removed, leaving no trace.
pub(crate) async fn acquire(
    agent: &Arc<Agent>,
    req: Request,
    link: Link,
) -> Result<(Handle, Lease), Error> {
    let rec = &req.record;
    let mut cfg = client_config(
        agent,
        &rec.config,
        &rec.args,
        rec.mac,
        req.mode,
        req.requested,
    );
    cfg.validate()
        .map_err(|source| Error::ClientConfig { source })?;
    let timeout = cfg.acquire_timeout;
    // Admitted by the network's pacing before the first DISCOVER, within
    // the acquisition's deadline; the engine gets what is left of it.
    let asked = Instant::now();
    let slot = agent
        .pacing
        .admit_within(&rec.config.name, timeout)
        .await
        .map_err(|ahead| {
            agent.metrics().failure("acquire_queued");
            Error::Queued {
                place: req.place.clone(),
                network: rec.config.name.clone(),
                ahead,
                timeout,
            }
        })?;
    let waited = asked.elapsed();
    tracing::debug!(network = %rec.config.name, waited_us = waited.as_micros(),
        "acquisition admitted");
    cfg.acquire_timeout = timeout.saturating_sub(waited).max(MIN_ACQUIRE_LEFT);
    let client = Client::new(cfg, Instant::now(), seed());
    let (cid, ifname) = (rec.container_id.clone(), rec.ifname.clone());
    let (tx, rx) = oneshot::channel();
    let handle = agent
        .leases
        .spawn(req.record, client, link, Some(tx))
        .await
        .map_err(|source| {
            agent.metrics().failure("interface");
            Error::Interface {
                place: req.place.clone(),
                source,
            }
        })?;
    let outcome = slot
        .hold_during(tokio::time::timeout(timeout + ADD_MARGIN, rx))
        .await;
    let failure = match outcome {
        Ok(Ok(Outcome::Bound(lease))) => return Ok((handle, lease)),
        Ok(Ok(Outcome::Failed(source))) => Error::NoLease {
            place: req.place,
            timeout,
            source: Box::new(source),
        },
        Ok(Ok(Outcome::LinkFailed(source))) => Error::LinkFailed {
            place: req.place,
            source: Some(source),
        },
        Ok(Ok(Outcome::Removed)) => Error::LinkFailed {
            place: req.place,
            source: None,
        },
        Ok(Ok(Outcome::Cancelled)) => Error::ShuttingDown,
        // No answer by the deadline, or the task ended without one.
        Ok(Err(_)) | Err(_) => {
            agent.metrics().failure("acquire_no_reply");
            Error::Silent {
                place: req.place,
                timeout,
            }
        }
    };
    abandon(agent, &cid, &ifname, &handle, false).await;
    Err(failure)
}

/// Open `ifname` (in `netns`, else the agent's own namespace) for an
/// acquisition: its sender, and its own receiver when `rx`; with
/// `veth_peer`, also find its veth peer for the DHCP guard in the same trip.
#[expect(
    clippy::result_large_err,
    reason = "a failed open is rare; its error goes straight to the socket"
)]
pub(crate) fn open_link(
    agent: &Agent,
    netns: Option<&std::path::Path>,
    ifname: &str,
    rx: bool,
    veth_peer: bool,
    place: &Place,
) -> Result<Link, Error> {
    let sockets = if rx {
        Sockets::SenderAndReceiver
    } else {
        Sockets::Sender
    };
    Link::open_looking(netns, ifname, sockets, veth_peer).map_err(|source| {
        agent.metrics().failure("interface");
        Error::Interface {
            place: place.clone(),
            source,
        }
    })
}

/// End an attachment this ADD created (RELEASE first when `release`),
/// forget it and remove its record.
pub(crate) async fn abandon(
    agent: &Agent,
    cid: &str,
    ifname: &str,
    handle: &Handle,
    release: bool,
) {
    agent.leases.stop(handle, release).await;
    agent.leases.forget(cid, ifname, handle.generation);
    if let Err(e) = persist::remove(&agent.svc.store, cid, ifname) {
        tracing::warn!(error = %crate::rpc::format_chain(&e), "could not remove the lease record of a failed ADD");
    }
}

/// Engine configuration for one attachment: the agent's flags, then the
/// network's `ipam` settings, then identity.
pub(crate) fn client_config(
    agent: &Agent,
    config: &NetworkConfig,
    args: &BTreeMap<String, String>,
    mac: [u8; 6],
    mode: Mode,
    requested_ip: Option<Ipv4Addr>,
) -> ClientConfig {
    let mut cfg = agent.base.clone();
    cfg.chaddr = mac;
    cfg.mode = mode;
    cfg.requested_ip = requested_ip;
    cfg.client_id = match &config.ipam.client_id {
        ClientIdSpec::Mac => ClientId::Mac,
        ClientIdSpec::None => ClientId::None,
        ClientIdSpec::Raw(b) => ClientId::Raw(b.clone()),
    };
    cfg.hostname = match &config.ipam.hostname {
        HostnameSpec::PodName => args.get("K8S_POD_NAME").cloned(),
        HostnameSpec::Fixed(h) => Some(h.clone()),
        HostnameSpec::FromArg(k) => args.get(k).cloned(),
    }
    .filter(|h| validate_hostname(h).is_ok());
    if let Some(t) = config.ipam.timeout {
        cfg.acquire_timeout = t;
    }
    if let Some(m) = config.ipam.resend_max {
        cfg.retransmit.max_interval = m.max(cfg.retransmit.initial);
    }
    cfg.route_policy.allow_default_override = config.ipam.allow_default_route_override;
    cfg.route_policy.protected = config
        .ipam
        .protected_prefixes
        .iter()
        .map(|p| Ipv4Prefix {
            addr: p.addr,
            len: p.prefix_len,
        })
        .collect();
    cfg
}

/// The CNI result for a lease.
pub(crate) fn cni_result(lease: &Lease, config: &NetworkConfig) -> CniResult {
    let routes = apply::routes(lease)
        .into_iter()
        .filter_map(|(dst, gw)| {
            Some(RouteConfig::new(
                Ipv4Cidr::parse(&dst).ok()?,
                gw,
                config.ipam.route_priority,
            ))
        })
        .collect();
    CniResult {
        cni_version: config.cni_version.clone(),
        ips: vec![IpConfig {
            version: None,
            address: Ipv4Cidr {
                addr: lease.address,
                prefix_len: lease.prefix_len,
            },
            gateway: lease.default_gateway(),
        }],
        routes,
        dns: DnsConfig {
            nameservers: lease.dns_servers.clone(),
            domain: lease.domain_name.clone(),
            search: lease.search.clone(),
        },
    }
    .for_version(&config.cni_version)
}

/// Write the `pod-networks` entry for a learned lease (pods and VMs
/// alike). Nothing is written when the ADD went stale while the lease was
/// acquired: the pod's UID is not the one the ADD started with (the pod was
/// deleted and recreated under the same name), or the sandbox's network
/// namespace `netns` is gone (torn down or superseded). Both are checked
/// after every read of the pod, right before the patch.
pub(crate) async fn report_address(
    agent: &Agent,
    pod: &PodRef,
    key: &str,
    lease: &Lease,
    mac: [u8; 6],
    netns: Option<&std::path::Path>,
) -> Result<(), PodApiError> {
    let entry = PodNetworkEntry::dhcp(
        lease.address,
        lease.prefix_len,
        MacAddr(mac),
        &lease.default_gateway().into_iter().collect::<Vec<_>>(),
    );
    let guard = WriteGuard {
        uid: pod.uid.clone(),
        netns: netns.map(std::path::Path::to_path_buf),
    };
    agent
        .pod_api
        .set_network_entry_guarded(&pod.namespace, &pod.name, &guard, key, entry)
        .await
}

/// What became of a lease whose address could not be reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LeaseFate {
    /// A pod's lease: RELEASE sent to the server (nobody would report or
    /// renew it otherwise).
    Released,
    /// A pod's lease another attachment on this node holds too (same MAC
    /// and address: a newer sandbox of the same pod); a RELEASE would take
    /// it from that one, so none is sent.
    Shared { container_id: String },
    /// A VM's lease: the binding belongs to the VM's identity, which the
    /// VM's next launcher pod asks for again; VM leases are never released.
    KeptForVm,
}

impl std::fmt::Display for LeaseFate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaseFate::Released => f.write_str("the lease was released at the DHCP server"),
            LeaseFate::Shared { container_id } => write!(
                f,
                "the lease was not released: container {container_id} on this node holds the same binding"
            ),
            LeaseFate::KeptForVm => f.write_str(
                "the VM's lease stays at the DHCP server for its next launcher pod (VM leases are never released)",
            ),
        }
    }
}

/// The lease fate rule for an unreported address (pure): VMs keep theirs;
/// a pod releases unless another attachment (`others`: container id, MAC,
/// address) holds the same binding.
pub(crate) fn unreported_fate<'a>(
    vm: bool,
    mac: [u8; 6],
    address: Ipv4Addr,
    others: impl IntoIterator<Item = (&'a str, [u8; 6], Option<Ipv4Addr>)>,
) -> LeaseFate {
    if vm {
        return LeaseFate::KeptForVm;
    }
    match others
        .into_iter()
        .find(|(_, m, a)| *m == mac && *a == Some(address))
    {
        Some((cid, ..)) => LeaseFate::Shared {
            container_id: cid.to_owned(),
        },
        None => LeaseFate::Released,
    }
}

/// End an attachment whose address was not reported, deciding its lease's
/// fate ([`unreported_fate`]); the error names the fate.
pub(crate) async fn abandon_unreported(
    agent: &Agent,
    record: &LeaseRecord,
    handle: &Handle,
    lease: &Lease,
    source: Error,
) -> Error {
    let (cid, ifname) = (&record.container_id, &record.ifname);
    let others: Vec<(String, [u8; 6], Option<Ipv4Addr>)> = agent
        .leases
        .all()
        .into_iter()
        .filter(|h| h.generation != handle.generation)
        .map(|h| {
            let l = super::lease::task::lock(&h.live);
            (
                l.record.container_id.clone(),
                l.record.mac,
                l.record.lease.as_ref().map(|x| x.address),
            )
        })
        .collect();
    let vm = record.workload != persist::WorkloadKind::Pod;
    let fate = unreported_fate(
        vm,
        record.mac,
        lease.address,
        others.iter().map(|(c, m, a)| (c.as_str(), *m, *a)),
    );
    abandon(agent, cid, ifname, handle, fate == LeaseFate::Released).await;
    tracing::warn!(container = %cid, ifname = %ifname, address = %lease.address,
        error = %crate::rpc::format_chain(&source), fate = %fate, "ADD not reported");
    Error::NotReported {
        address: lease.address,
        fate,
        source: Box::new(source),
    }
}

/// A fresh random seed for an engine client (xids, backoff jitter).
pub(crate) fn seed() -> u64 {
    use rand::TryRngCore as _;
    rand::rngs::OsRng.try_next_u64().unwrap_or_else(|_| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        t.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);

    #[test]
    fn an_unreported_pod_lease_is_released_unless_another_attachment_holds_it() {
        assert_eq!(unreported_fate(false, MAC, ADDR, []), LeaseFate::Released);
        // Other attachments with another MAC, another address, or none yet.
        let others = [
            ("a", [2, 0, 0, 0, 0, 2], Some(ADDR)),
            ("b", MAC, Some(Ipv4Addr::new(192, 0, 2, 11))),
            ("c", MAC, None),
        ];
        assert_eq!(
            unreported_fate(false, MAC, ADDR, others),
            LeaseFate::Released
        );
        // A newer sandbox of the same pod (same MAC) already holds it.
        let others = [
            ("a", [2, 0, 0, 0, 0, 2], Some(ADDR)),
            ("newer", MAC, Some(ADDR)),
        ];
        assert_eq!(
            unreported_fate(false, MAC, ADDR, others),
            LeaseFate::Shared {
                container_id: "newer".into()
            }
        );
    }

    #[test]
    fn an_unreported_vm_lease_is_kept() {
        assert_eq!(unreported_fate(true, MAC, ADDR, []), LeaseFate::KeptForVm);
        assert!(LeaseFate::KeptForVm.to_string().contains("never released"));
        assert!(LeaseFate::Released.to_string().contains("released"));
    }
}
