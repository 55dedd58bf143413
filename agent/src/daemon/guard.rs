//! The DHCP guard actor: which workload ports are guarded, with what policy.
//!
//! At ADD the agent finds the host end of the pod interface (the veth's
//! peer, which must live in the agent's own namespace: the node's) and
//! attaches the guard programs there before the first DHCP message; at DEL
//! it detaches them. A pod interface that is not a veth (macvlan, a VF) or
//! whose peer lives elsewhere is not guarded, and the log says so.
//!
//! The attachments are BPF links held by this process: they go when the
//! agent goes, and [`GuardService::protect`] is called again for every
//! lease the agent resumes at start.

use std::collections::HashMap;
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tracing::{info, warn};

use crate::cli::{AgentArgs, GuardChoice};
use crate::cni::config::DhcpGuardSpec;
use crate::datapath::ebpf::{AttachTarget, EbpfDatapathError, Guard, GuardCounters, PortPolicy};
use crate::netlink::{Netlink, NetlinkError};

/// Why a port could not be guarded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GuardError {
    #[error("finding the host end of {ifname} in {}: {source}", netns.display())]
    Peer {
        ifname: String,
        netns: PathBuf,
        #[source]
        source: NetlinkError,
    },
    #[error("opening the agent's own network namespace: {0}")]
    OwnNamespace(#[source] std::io::Error),
    #[error("the host end of {ifname} (ifindex {ifindex}) has no name in the agent's namespace")]
    NoName { ifname: String, ifindex: u32 },
    #[error(transparent)]
    Ebpf(#[from] EbpfDatapathError),
}

/// One guarded port.
#[derive(Debug, Clone)]
pub(crate) struct GuardedPort {
    /// Host-side interface name (in the agent's namespace).
    pub(crate) host_ifname: String,
    pub(crate) ifindex: u32,
    pub(crate) policy: PortPolicy,
}

struct Inner {
    guard: Guard,
    /// (container id, pod ifname) → its port.
    ports: HashMap<(String, String), GuardedPort>,
}

/// The guard, or why there is none.
pub(crate) struct GuardService {
    inner: Option<Mutex<Inner>>,
    /// Why the guard is off (logged at start).
    off_reason: Option<String>,
}

impl std::fmt::Debug for GuardService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardService")
            .field("on", &self.inner.is_some())
            .field("off_reason", &self.off_reason)
            .finish_non_exhaustive()
    }
}

/// The kernel policy of a port: the network's `ipam.dhcpGuard`, plus the
/// single-client rule on a VM's port.
pub(crate) fn port_policy(spec: &DhcpGuardSpec, vm_mac: Option<[u8; 6]>) -> PortPolicy {
    PortPolicy {
        trusted: spec.trusted,
        rate: spec.rate,
        burst: spec.burst,
        single_client: vm_mac,
        learn: false,
    }
}

impl GuardService {
    /// Loads the guard unless `--dhcp-guard off`; a kernel that refuses it
    /// leaves the agent running unguarded, with the reason logged and in
    /// `xdhcp status`.
    pub(crate) fn start(args: &AgentArgs) -> Self {
        if args.dhcp_guard == GuardChoice::Off {
            return Self::off("--dhcp-guard off");
        }
        match Guard::load() {
            Ok(guard) => {
                info!("DHCP guard loaded");
                Self {
                    inner: Some(Mutex::new(Inner {
                        guard,
                        ports: HashMap::new(),
                    })),
                    off_reason: None,
                }
            }
            Err(e) => {
                let reason = crate::rpc::format_chain(&e);
                warn!(error = %reason, "the DHCP guard could not be loaded; workload ports are not guarded");
                Self::off(&reason)
            }
        }
    }

    fn off(reason: &str) -> Self {
        Self {
            inner: None,
            off_reason: Some(reason.to_owned()),
        }
    }

    fn lock(&self) -> Option<std::sync::MutexGuard<'_, Inner>> {
        self.inner
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Guards the host end of `ifname` (in `netns`) for the attachment
    /// `(container_id, ifname)`. `Ok(None)`: the guard is off, or the port
    /// is not one it can guard (not a veth, or its peer is not in the
    /// agent's namespace). A second call for a guarded attachment updates
    /// its policy.
    pub(crate) async fn protect(
        &self,
        container_id: &str,
        ifname: &str,
        netns: &Path,
        policy: PortPolicy,
    ) -> Result<Option<GuardedPort>, GuardError> {
        if self.inner.is_none() {
            return Ok(None);
        }
        let Some(host_ifname) = host_end(netns, ifname).await? else {
            info!(ifname, netns = %netns.display(),
                "pod interface is not a veth with its peer in the agent's namespace; not guarded");
            return Ok(None);
        };
        let key = (container_id.to_owned(), ifname.to_owned());
        let Some(mut inner) = self.lock() else {
            return Ok(None);
        };
        if let Some(port) = inner.ports.get(&key).cloned() {
            if port.host_ifname == host_ifname {
                inner.guard.set_policy(port.ifindex, &policy)?;
                let port = GuardedPort { policy, ..port };
                inner.ports.insert(key, port.clone());
                return Ok(Some(port));
            }
            // The pod interface was recreated with another peer.
            let old = AttachTarget {
                ifname: port.host_ifname,
                netns: None,
            };
            if let Err(e) = inner.guard.detach(&old) {
                warn!(error = %e, "could not detach the guard from the old host end");
            }
            inner.ports.remove(&key);
        }
        let target = AttachTarget {
            ifname: host_ifname.clone(),
            netns: None,
        };
        let ifindex = inner.guard.attach(&target, &policy)?;
        let port = GuardedPort {
            host_ifname,
            ifindex,
            policy,
        };
        inner.ports.insert(key, port.clone());
        Ok(Some(port))
    }

    /// Unguards the attachment's port (DEL). Nothing to do is fine.
    pub(crate) fn release(&self, container_id: &str, ifname: &str) {
        let Some(mut inner) = self.lock() else {
            return;
        };
        let Some(port) = inner
            .ports
            .remove(&(container_id.to_owned(), ifname.to_owned()))
        else {
            return;
        };
        let target = AttachTarget {
            ifname: port.host_ifname.clone(),
            netns: None,
        };
        match inner.guard.detach(&target) {
            Ok(()) => info!(port = %port.host_ifname, "DHCP guard detached"),
            Err(e) => warn!(port = %port.host_ifname, error = %crate::rpc::format_chain(&e),
                "could not detach the DHCP guard"),
        }
    }

    /// Every guarded port with its counters, for metrics and status.
    pub(crate) fn snapshot(&self) -> Vec<(GuardedPort, GuardCounters)> {
        let Some(inner) = self.lock() else {
            return Vec::new();
        };
        inner
            .ports
            .values()
            .map(|p| {
                let c = inner
                    .guard
                    .counters(p.ifindex)
                    .ok()
                    .flatten()
                    .unwrap_or_default();
                (p.clone(), c)
            })
            .collect()
    }
}

/// The name, in the agent's namespace, of the peer of veth `ifname` in
/// `netns`; `None` when `ifname` is not a veth or its peer is elsewhere.
async fn host_end(netns: &Path, ifname: &str) -> Result<Option<String>, GuardError> {
    let own = std::fs::File::open("/proc/thread-self/ns/net").map_err(GuardError::OwnNamespace)?;
    let peer_err = |source| GuardError::Peer {
        ifname: ifname.to_owned(),
        netns: netns.to_path_buf(),
        source,
    };
    let nl = Netlink::open(Some(netns)).await.map_err(peer_err)?;
    let Some(peer) = nl.veth_peer(ifname, &own.as_fd()).await.map_err(peer_err)? else {
        return Ok(None);
    };
    if !peer.in_namespace {
        return Ok(None);
    }
    let name = nix::net::if_::if_indextoname(peer.ifindex).map_err(|_| GuardError::NoName {
        ifname: ifname.to_owned(),
        ifindex: peer.ifindex,
    })?;
    Ok(Some(name.to_string_lossy().into_owned()))
}

/// How often the guard's kernel counters are copied into the metrics.
const METRICS_PERIOD: std::time::Duration = std::time::Duration::from_secs(2);

/// Copies the guard's per-port counters into the metrics until shutdown.
pub(crate) async fn export_metrics(
    agent: std::sync::Arc<super::context::Agent>,
    token: tokio_util::sync::CancellationToken,
) {
    loop {
        let a = agent.clone();
        let snap = tokio::task::spawn_blocking(move || a.guard.snapshot()).await;
        if let Ok(snap) = snap {
            let rows: Vec<_> = snap
                .iter()
                .map(|(p, c)| (p.host_ifname.clone(), c.passed_client, c.drops()))
                .collect();
            agent.metrics().guard_snapshot(&rows);
        }
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(METRICS_PERIOD) => {}
        }
    }
}
