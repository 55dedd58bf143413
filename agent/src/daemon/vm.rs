//! VM pods whose device for the network is an SR-IOV VF passed through with
//! `vfio-pci` (SPEC R24).
//!
//! The host has no netdev for such a VF, so the one-shot discovery runs
//! inside [`vfio::with_kernel_driver`]: the VF is bound to its kernel NIC
//! driver for the length of one DORA, the netdev that appears (in the
//! agent's own network namespace) gets the VM's MAC and is set up, the
//! daemon's ordinary one-shot lease task runs on it, and `vfio-pci` is bound
//! again on every path before the ADD answers. The address is only
//! reported (CNI result and `k8s.ovn.org/pod-networks`), never configured:
//! the netdev disappears with the rebind anyway.
//!
//! [`heal_at_start`] restores `vfio-pci` for handoffs a killed agent left
//! journaled, before the agent serves anything.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use rtnetlink::LinkUnspec;
use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags};
use tokio::sync::oneshot;
use tracing::{error, info, warn};
use xdhcp_engine::{Client, Lease, Mode};

use super::lease::{Command as LeaseCmd, Outcome};
use super::link::{Link, mac_string};
use super::ops::{acquire_error, client_config, cni_result, report_address};
use super::persist::{self, LeaseRecord, PodRef, RECORD_VERSION, WorkloadKind};
use super::{Agent, Handle};
use crate::cli::AgentArgs;
use crate::cni::types::{CniError, CniResult, code};
use crate::kube::PodApiError;
use crate::rpc::{CniRequest, format_chain};
use crate::vfio::{self, PciAddr, Sysfs, VmDevice};
use crate::workload::{MacAddr, MacSource, VmiInfo, vm_dhcp_identity};

/// Extra time beyond the acquisition timeout for the engine's own failure event.
const ADD_MARGIN: Duration = Duration::from_secs(3);
/// How long to wait for a lease task to let go of the netdev.
const STOP_WAIT: Duration = Duration::from_secs(5);
/// How long to wait for carrier on the freshly bound netdev before sending
/// anyway (the engine retransmits if the first frames are lost).
const CARRIER_WAIT: Duration = Duration::from_secs(5);
/// Carrier poll interval.
const CARRIER_POLL: Duration = Duration::from_millis(50);

/// At agent start, before serving: give every VF a killed agent left
/// handed off (journaled under `<state_dir>/vfio-journal`) back to
/// `vfio-pci`. Failures are logged; their journal entries stay, so an ADD
/// for such a device fails naming the journal, and the next start retries.
pub async fn heal_at_start(args: &AgentArgs) {
    let sysfs = Sysfs::new(&args.sysfs_root);
    let dir = vfio::journal_dir(&args.state_dir);
    let shown = dir.display().to_string();
    match tokio::task::spawn_blocking(move || vfio::heal(&sysfs, &dir)).await {
        Ok(Ok(reports)) if reports.is_empty() => {}
        Ok(Ok(reports)) => {
            let failed = reports.iter().filter(|r| !r.is_healed()).count();
            if failed == 0 {
                info!(journal = %shown, healed = reports.len(),
                    "interrupted VFIO handoffs found at start; every device is on vfio-pci again");
            } else {
                error!(journal = %shown, healed = reports.len() - failed, failed,
                    "interrupted VFIO handoffs found at start; some devices could not be given back to vfio-pci (journal kept)");
            }
        }
        Ok(Err(e)) => {
            error!(journal = %shown, error = %format_chain(&e),
                "cannot read the VFIO handoff journal; interrupted handoffs are not healed");
        }
        Err(e) => error!(journal = %shown, error = %e, "the VFIO heal task failed"),
    }
}

fn pod_label(pod: Option<&PodRef>) -> String {
    pod.map_or_else(|| "-".to_owned(), |p| format!("{}/{}", p.namespace, p.name))
}

fn kube_err(e: &PodApiError) -> CniError {
    CniError::new(code::KUBE_API, e.to_string()).with_details(format_chain(e))
}

/// The VF to hand off for a VM pod's ADD: `Some` when the config's
/// `deviceID` names a PCI device bound to `vfio-pci`, `None` when the DORA
/// runs on the pod's netdev (no `deviceID`, or a VF with a kernel driver).
/// A `deviceID` that is not a PCI address or names no device is an error.
pub fn vfio_device(
    agent: &Agent,
    req: &CniRequest,
    pod: Option<&PodRef>,
) -> Result<Option<PciAddr>, CniError> {
    let sysfs = Sysfs::new(&agent.args.sysfs_root);
    match vfio::vm_device(&sysfs, req.config.device_id.as_deref()) {
        Ok(VmDevice::Vfio(pci)) => Ok(Some(pci)),
        Ok(VmDevice::PodNetdev) => Ok(None),
        Err(e) => {
            agent.metrics.failure("vfio");
            Err(CniError::new(
                code::VFIO,
                format!(
                    "deviceID {:?} of pod {}: {e}",
                    req.config.device_id.as_deref().unwrap_or_default(),
                    pod_label(pod)
                ),
            )
            .with_details(format_chain(&e)))
        }
    }
}

/// Who the discovery is for.
pub struct VmPod {
    /// The pod (from `CNI_ARGS`), if named.
    pub pod: Option<PodRef>,
    /// Its `k8s.ovn.org/pod-networks` key.
    pub annotation_key: Option<String>,
    /// The owning `VirtualMachineInstance`.
    pub vmi_name: String,
}

/// ADD for a VM whose device is the VF `pci` on `vfio-pci`: hand it off,
/// one-shot DORA on the netdev, restore, report.
pub async fn add_vfio(
    agent: &Arc<Agent>,
    req: &CniRequest,
    vm: VmPod,
    pci: PciAddr,
) -> Result<CniResult, CniError> {
    let who = pod_label(vm.pod.as_ref());
    let ns = vm.pod.as_ref().map_or("", |p| p.namespace.as_str());
    let vmi = agent.pod_api.get_vmi(ns, &vm.vmi_name).await.map_err(|e| {
        agent.metrics.failure("kube_api");
        kube_err(&e)
    })?;
    let sysfs = Sysfs::new(&agent.args.sysfs_root).with_vf_drivers(&agent.args.vf_driver);
    let journal = vfio::journal_dir(&agent.args.state_dir);
    let handed = vfio::with_kernel_driver(
        &sysfs,
        &journal,
        &pci,
        agent.args.vfio_netdev_timeout,
        |netdev| discover(agent, req, &vm, vmi.as_ref(), pci, netdev),
    )
    .await;
    let (handle, lease, mac) = match handed {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => return Err(e),
        Err(e) => {
            // The DORA may have bound before the restore failed: drop it.
            if let Some(h) = agent.handle(&req.container_id, &req.ifname) {
                abandon(agent, req, &h).await;
            }
            agent.metrics.failure("vfio");
            return Err(CniError::new(
                code::VFIO,
                format!("VFIO handoff of {pci} for pod {who}: {e}"),
            )
            .with_details(format_chain(&e)));
        }
    };

    if let (Some(p), Some(key)) = (&vm.pod, &vm.annotation_key)
        && let Err(e) = report_address(agent, p, key, &lease, mac).await
    {
        agent.metrics.failure("kube_api");
        abandon(agent, req, &handle).await;
        return Err(kube_err(&e));
    }
    info!(container = %req.container_id, ifname = %req.ifname, %pci, address = %lease.address,
        mac = %mac_string(mac), "ADD done (VFIO VM: address reported, vfio-pci restored)");
    Ok(cni_result(&lease, &req.config))
}

/// Inside the handoff window: prepare `netdev`, run the one-shot lease task
/// on it, and wait until the task has let go of the netdev.
async fn discover(
    agent: &Arc<Agent>,
    req: &CniRequest,
    vm: &VmPod,
    vmi: Option<&VmiInfo>,
    pci: PciAddr,
    netdev: String,
) -> Result<(Handle, Lease, [u8; 6]), CniError> {
    let iface_err = |what: String, e: &dyn std::error::Error| {
        agent.metrics.failure("interface");
        CniError::new(code::INTERFACE, what).with_details(e.to_string())
    };
    let nl = HostLinks::connect()
        .map_err(|e| iface_err("cannot open rtnetlink in the agent's namespace".into(), &e))?;
    let (ifindex, vf_mac) = nl.lookup(&netdev).await.map_err(|e| {
        iface_err(
            format!("VF {pci}: netdev {netdev} is not usable in the agent's namespace"),
            &e,
        )
    })?;
    let key = vm.annotation_key.clone().unwrap_or_default();
    let (mac, source, requested) = vm_dhcp_identity(vmi, &key, MacAddr(vf_mac));
    info!(%pci, netdev, vmi = %vm.vmi_name, mac = %mac, source = ?source, requested = ?requested,
        "VFIO VM: one-shot discovery on the VF netdev; the address is not configured");
    nl.prepare(&netdev, ifindex, vf_mac, mac.octets(), source)
        .await
        .map_err(|e| iface_err(format!("VF {pci}: cannot set up netdev {netdev}"), &e))?;

    let link = Link::open(None, &netdev, false)
        .await
        .map_err(|e| iface_err(format!("VF {pci}: cannot open netdev {netdev}"), &e))?
        .with_src_mac(mac.octets());
    let (handle, lease) = one_shot(agent, req, vm, link, mac.octets(), requested).await?;
    Ok((handle, lease, mac.octets()))
}

/// Run the daemon's one-shot lease task on `link` and wait for its outcome.
async fn one_shot(
    agent: &Arc<Agent>,
    req: &CniRequest,
    vm: &VmPod,
    link: Link,
    mac: [u8; 6],
    requested: Option<Ipv4Addr>,
) -> Result<(Handle, Lease), CniError> {
    let netdev = link.ifname.clone();
    let cfg = client_config(agent, &req.config, &req.args, mac, Mode::OneShot, requested);
    cfg.validate()
        .map_err(|e| CniError::new(code::INVALID_NETWORK_CONFIG, e.to_string()))?;
    let timeout = cfg.acquire_timeout;
    let client = Client::new(cfg, Instant::now(), super::seed());
    let record = LeaseRecord {
        version: RECORD_VERSION,
        container_id: req.container_id.clone(),
        ifname: req.ifname.clone(),
        netns: req.netns.clone(),
        config: req.config.clone(),
        args: req.args.clone(),
        pod: vm.pod.clone(),
        workload: WorkloadKind::Vm {
            vmi: vm.vmi_name.clone(),
        },
        mac,
        annotation_key: vm.annotation_key.clone(),
        lease: None,
    };
    let (tx, rx) = oneshot::channel();
    let handle = agent
        .spawn_lease(record, client, link, Some(tx))
        .await
        .map_err(|e| {
            agent.metrics.failure("interface");
            CniError::new(
                code::INTERFACE,
                format!("cannot capture DHCP replies on VF netdev {netdev}"),
            )
            .with_details(format_chain(&e))
        })?;
    let outcome = tokio::time::timeout(timeout + ADD_MARGIN, rx).await;
    // The netdev goes away with the rebind: the task must be done with it.
    wait_stopped(agent, &handle).await;
    match outcome {
        Ok(Ok(Outcome::Bound(lease))) => Ok((handle, lease)),
        other => {
            abandon(agent, req, &handle).await;
            Err(acquire_error(
                agent,
                other,
                &format!("VF netdev {netdev}"),
                timeout,
            ))
        }
    }
}

/// Ask the lease task to end without RELEASE and wait until it has (a
/// one-shot task that reached BOUND has usually ended already).
async fn wait_stopped(agent: &Agent, h: &Handle) {
    let Some(cmds) = &h.cmds else { return };
    let (ack, done) = oneshot::channel();
    // A send error means the task is gone; a dropped ack means it ended
    // without reading the command. Either way it no longer holds the link.
    if cmds
        .send(LeaseCmd::Stop {
            release: false,
            ack,
        })
        .await
        .is_ok()
        && tokio::time::timeout(STOP_WAIT, done).await.is_err()
    {
        warn!("the VF lease task did not stop within {STOP_WAIT:?}");
        agent.metrics.failure("stop_timeout");
    }
}

/// Forget an attachment this ADD created (no RELEASE: the VM owns the lease).
async fn abandon(agent: &Agent, req: &CniRequest, h: &Handle) {
    wait_stopped(agent, h).await;
    agent.forget(&req.container_id, &req.ifname, h.generation);
    if let Err(e) = persist::remove(&agent.store, &req.container_id, &req.ifname) {
        warn!(error = %e, "could not remove the lease record of a failed VFIO ADD");
    }
}

/// An rtnetlink connection in the agent's own namespace (where the VF
/// netdev appears), for the few link changes the handoff needs.
struct HostLinks {
    handle: rtnetlink::Handle,
    conn: tokio::task::JoinHandle<()>,
}

impl Drop for HostLinks {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

impl HostLinks {
    fn connect() -> std::io::Result<Self> {
        let (conn, handle, _) = rtnetlink::new_connection()?;
        Ok(Self {
            handle,
            conn: tokio::spawn(conn),
        })
    }

    /// Index, MAC and whether the link has carrier (`IFF_RUNNING`).
    async fn query(&self, ifname: &str) -> Result<(u32, Option<[u8; 6]>, bool), BoxError> {
        let msg = self
            .handle
            .link()
            .get()
            .match_name(ifname.to_owned())
            .execute()
            .try_next()
            .await?
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENODEV))?;
        let mac = msg.attributes.iter().find_map(|a| match a {
            LinkAttribute::Address(a) => <[u8; 6]>::try_from(a.as_slice()).ok(),
            _ => None,
        });
        Ok((
            msg.header.index,
            mac,
            msg.header.flags.contains(LinkFlags::Running),
        ))
    }

    async fn lookup(&self, ifname: &str) -> Result<(u32, [u8; 6]), NetdevError> {
        let (index, mac, _) = self.query(ifname).await.map_err(|source| NetdevError {
            op: "look up",
            ifname: ifname.to_owned(),
            source,
        })?;
        let mac = mac.ok_or_else(|| NetdevError {
            op: "read the Ethernet address of",
            ifname: ifname.to_owned(),
            source: "the link has no 6-byte hardware address".into(),
        })?;
        Ok((index, mac))
    }

    /// Give the netdev the VM's MAC (when it differs: the VF's anti-spoofing
    /// would drop frames from another source), set it up and wait briefly
    /// for carrier.
    async fn prepare(
        &self,
        ifname: &str,
        index: u32,
        current: [u8; 6],
        mac: [u8; 6],
        source: MacSource,
    ) -> Result<(), NetdevError> {
        let err = |op| {
            let ifname = ifname.to_owned();
            move |source| NetdevError { op, ifname, source }
        };
        if current != mac {
            let set = LinkUnspec::new_with_index(index)
                .address(mac.to_vec())
                .build();
            if let Err(e) = self.handle.link().set(set).execute().await {
                // Some PFs pin the VF MAC; the frames still carry the VM's
                // MAC, which works when spoof checking is off.
                warn!(ifname, error = %e, from = %mac_string(current), to = %mac_string(mac), source = ?source,
                    "cannot give the VF netdev the VM's MAC; sending with it as the source anyway");
            }
        }
        let up = LinkUnspec::new_with_index(index).up().build();
        self.handle
            .link()
            .set(up)
            .execute()
            .await
            .map_err(|e| err("set up")(e.into()))?;
        let deadline = Instant::now() + CARRIER_WAIT;
        loop {
            let (_, _, running) = self.query(ifname).await.map_err(err("look up"))?;
            if running {
                return Ok(());
            }
            if Instant::now() >= deadline {
                warn!(
                    ifname,
                    "no carrier on the VF netdev after {CARRIER_WAIT:?}; trying DHCP anyway"
                );
                return Ok(());
            }
            tokio::time::sleep(CARRIER_POLL).await;
        }
    }
}

/// An rtnetlink operation on the VF netdev failed.
#[derive(Debug, thiserror::Error)]
#[error("failed to {op} {ifname} in the agent's namespace: {source}")]
struct NetdevError {
    op: &'static str,
    ifname: String,
    #[source]
    source: BoxError,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
