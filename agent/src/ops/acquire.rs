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

use crate::cni::config::{ClientIdSpec, HostnameSpec, NetworkConfig, validate_hostname};
use crate::cni::types::{CniResult, DnsConfig, IpConfig, Ipv4Cidr, RouteConfig};
use crate::datapath::link::{Link, Sockets};
use crate::lease::apply;
use crate::lease::live::Outcome;
use crate::lease::persist::{self, LeaseRecord};
use crate::lease::registry::Handle;
use crate::ops::context::Agent;
use crate::ops::error::{Error, Place};

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
    cfg.route_policy
        .protected
        .extend(apply::protected_in_pod(rec.netns.as_deref(), &rec.ifname).await);
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
    let client = Client::new(cfg, Instant::now(), crate::sys::clock::seed());
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
        Ok(Ok(Outcome::ApplyFailed(source))) => {
            // Bound at the server: give the address back, nobody uses it.
            abandon(agent, &cid, &ifname, &handle, true).await;
            return Err(Error::Apply {
                place: req.place,
                source,
            });
        }
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
    // The network's own protected prefixes add to the agent's (its flags
    // and the node's networks); they never replace them.
    cfg.route_policy
        .protected
        .extend(config.ipam.protected_prefixes.iter().map(|p| Ipv4Prefix {
            addr: p.addr,
            len: p.prefix_len,
        }));
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
