//! VM pods whose device for the network is an SR-IOV VF passed through with
//! `vfio-pci`.
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

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{error, info, warn};
use xdhcp_engine::{Lease, Mode};

use crate::cni::config::Family as CniFamily;
use crate::cni::types::CniResult;
use crate::datapath::link::{Link, Sockets};
use crate::kube::PodStore;
use crate::kube::annotation::PodNetworks;
use crate::lease::acquire::Acquisition;
use crate::lease::persist::{Family, PodRef, WorkloadKind};
use crate::lease::registry::Handle;
use crate::lease::v6::Acquisition6;
use crate::metrics::Metrics;
use crate::netlink::Netlink;
use crate::ops::context::Agent;
use crate::ops::error::{Error, Place};
use crate::ops::network::fresh_record;
use crate::ops::report::{Bound, Deadline, Phases, ReportTo, report_and_record};
use crate::ops::vm_answer::{self, Found};
use crate::rpc::{CniRequest, format_chain};
use crate::settings::AgentArgs;
use crate::vfio::{self, PciAddr, Sysfs, VmDevice};
use crate::workload::{
    MacAddr, MacSource, MigrationTarget, SourceReport, VmiInfo, migration_source_pod, vm_identity,
};

/// How long to wait for carrier on the freshly bound netdev before sending
/// anyway (the engine retransmits if the first frames are lost).
const CARRIER_WAIT: Duration = Duration::from_secs(5);
/// Carrier poll interval.
const CARRIER_POLL: Duration = Duration::from_millis(50);

/// At agent start, before serving: give every VF a killed agent left
/// handed off (journaled under `<state_dir>/vfio-journal`) back to
/// `vfio-pci`. Failures are logged; their journal entries stay, so an ADD
/// for such a device fails naming the journal, and the next start retries.
pub(crate) async fn heal_at_start(args: &AgentArgs) {
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

/// The VF to hand off for a VM pod's ADD: `Some` when the config's
/// `deviceID` names a PCI device bound to `vfio-pci`, `None` when the DORA
/// runs on the pod's netdev (no `deviceID`, or a VF with a kernel driver).
/// A `deviceID` that is not a PCI address or names no device is an error.
#[expect(
    clippy::result_large_err,
    reason = "a failed CNI operation is rare; its error goes straight to the socket"
)]
pub(crate) fn vfio_device(
    agent: &Agent,
    req: &CniRequest,
    pod: Option<&PodRef>,
) -> Result<Option<PciAddr>, Error> {
    let sysfs = Sysfs::new(&agent.args.sysfs_root);
    match vfio::vm_device(&sysfs, req.config.device_id.as_deref()) {
        Ok(VmDevice::Vfio(pci)) => {
            let uid = pod.and_then(|p| p.uid.as_deref());
            crate::ops::trust::device_of_pod(&agent.args.device_checkpoint, &pci.to_string(), uid)
                .map_err(|source| {
                    agent.metrics().failure("refused");
                    Error::Refused { source }
                })?;
            Ok(Some(pci))
        }
        Ok(VmDevice::PodNetdev) => Ok(None),
        Err(source) => {
            agent.metrics().failure("vfio");
            Err(Error::Device {
                device_id: req.config.device_id.clone().unwrap_or_default(),
                pod: pod_label(pod),
                source: Box::new(source),
            })
        }
    }
}

/// Who the discovery is for.
pub(crate) struct VmPod {
    /// The pod (from `CNI_ARGS`), if named.
    pub(crate) pod: Option<PodRef>,
    /// Its `k8s.ovn.org/pod-networks` key.
    pub(crate) annotation_key: Option<String>,
    /// The owning `VirtualMachineInstance`.
    pub(crate) vmi_name: String,
    /// The UID the pod's owner reference names (the cluster's; `None` in
    /// the embedded store): the VMI read must have it.
    pub(crate) owner_uid: Option<String>,
    /// The migration, when the pod is a live-migration target.
    pub(crate) migration: Option<MigrationTarget>,
}

/// On a live-migration target: what the source pod reported for network
/// `key` (its `pod-networks` entry), found through the migration object,
/// else the VMI's migration state (see [`crate::workload`]). Best effort:
/// anything missing or unreadable is logged and the DORA goes on with the
/// VMI status address, if any.
pub(crate) async fn migration_source(
    pods: &dyn PodStore,
    vmi_name: &str,
    pod: Option<&PodRef>,
    migration: Option<&MigrationTarget>,
    vmi: Option<&VmiInfo>,
    key: &str,
) -> Option<SourceReport> {
    let (pod, target) = (pod?, migration?);
    let ns = pod.namespace.as_str();
    let object = match target.migration_name.as_deref() {
        Some(name) => match pods.get_migration(ns, name).await {
            Ok(m) => m,
            Err(e) => {
                warn!(pod = %pod_label(Some(pod)), migration = name, error = %format_chain(&e),
                    "migration target: cannot read the migration; trying the VMI's migration state");
                None
            }
        },
        None => None,
    };
    let state = vmi.and_then(|v| v.migration_state.as_ref());
    if let Some(m) = &object
        && !m.names_target(&pod.name, vmi_name)
    {
        warn!(pod = %pod_label(Some(pod)), migration = %target.migration_uid,
            migration_vmi = ?m.vmi_name, migration_target = ?m.target_pod,
            "the pod carries a migration's label, but the migration does not name it as its target; not asking for the source's address");
        return None;
    }
    let Some((source, from)) = migration_source_pod(target, &pod.name, object.as_ref(), state)
    else {
        warn!(pod = %pod_label(Some(pod)), migration = %target.migration_uid,
            "migration target: the source pod is not known; asking for the VMI status address, if any");
        return None;
    };
    let entry = match pods.get_pod(ns, &source).await {
        Ok(info) => PodNetworks::parse(info.pod_networks.as_deref()).and_then(|n| n.entry(key)),
        Err(e) => {
            warn!(pod = %pod_label(Some(pod)), source = %source, error = %format_chain(&e),
                "migration target: cannot read the source pod");
            return None;
        }
    };
    match entry {
        Ok(Some(e)) => {
            let report =
                SourceReport::from_entry(&source, &e.mac_address, &e.ip_addresses, &e.gateway_ips);
            info!(pod = %pod_label(Some(pod)), source = %source, source_from = ?from,
                address = ?report.address, mac = ?report.mac,
                "migration target: the source pod's reported address");
            Some(report)
        }
        Ok(None) => {
            info!(pod = %pod_label(Some(pod)), source = %source, network = key,
                "migration target: the source pod reported nothing on this network");
            None
        }
        Err(e) => {
            warn!(pod = %pod_label(Some(pod)), source = %source, error = %format_chain(&e),
                "migration target: the source pod's pod-networks annotation is unusable");
            None
        }
    }
}

/// The VMI read must be the one the pod's owner reference names (its UID):
/// a pod that names another VMI, or a VMI deleted and recreated under the
/// same name, gets nothing of it (its MAC, its addresses).
#[expect(
    clippy::result_large_err,
    reason = "a failed CNI operation is rare; its error goes straight to the socket"
)]
fn check_owner(vm: &VmPod, vmi: &VmiInfo) -> Result<(), Error> {
    match &vm.owner_uid {
        Some(owner) if vmi.uid.as_ref() != Some(owner) => Err(Error::Refused {
            source: crate::ops::error::Refusal::NotTheVmisPod {
                pod: pod_label(vm.pod.as_ref()),
                vmi: vm.vmi_name.clone(),
                owner_uid: owner.clone(),
                vmi_uid: vmi.uid.clone(),
            },
        }),
        _ => Ok(()),
    }
}

/// The VMI and, on a live-migration target, what the source pod reported:
/// the one lookup every VM ADD makes, within the ADD's deadline.
async fn lookup(
    pods: &dyn PodStore,
    metrics: &Metrics,
    vm: &VmPod,
    deadline: Deadline,
) -> Result<(Option<VmiInfo>, Option<SourceReport>), Error> {
    let ns = vm.pod.as_ref().map_or("", |p| p.namespace.as_str());
    let vmi = deadline
        .kube(
            metrics,
            || format!("reading VirtualMachineInstance {ns}/{}", vm.vmi_name),
            pods.get_vmi(ns, &vm.vmi_name),
        )
        .await?;
    let key = vm.annotation_key.as_deref().unwrap_or_default();
    if let Some(vmi) = &vmi {
        check_owner(vm, vmi)?;
    }
    let source = migration_source(
        pods,
        &vm.vmi_name,
        vm.pod.as_ref(),
        vm.migration.as_ref(),
        vmi.as_ref(),
        key,
    );
    let report = if let Ok(r) = tokio::time::timeout(deadline.left(), source).await {
        r
    } else {
        warn!(pod = %pod_label(vm.pod.as_ref()),
            "migration target: the source pod's report was not read within the ADD's deadline");
        None
    };
    Ok((vmi, report))
}

/// A VM pod's DHCP identity on its pod netdev: the MAC the VM's guest will
/// use (the MAC chain) and the address to ask for (on a migration target,
/// what the source pod reported).
pub(crate) async fn identity_on_pod_netdev(
    agent: &Agent,
    vm: &VmPod,
    pod_mac: [u8; 6],
    deadline: Deadline,
) -> Result<([u8; 6], Option<std::net::Ipv4Addr>), Error> {
    let (vmi, source) = lookup(&*agent.pod_api, agent.metrics(), vm, deadline).await?;
    let key = vm.annotation_key.as_deref().unwrap_or_default();
    let id = vm_identity(vmi.as_ref(), key, MacAddr(pod_mac), source.as_ref());
    info!(vmi = %vm.vmi_name, mac = %id.mac, mac_source = %id.mac_source,
        requested = ?id.requested, migration_source = ?source.as_ref().map(|s| &s.pod),
        "VM pod: one-shot discovery, the address is not configured");
    Ok((id.mac.octets(), id.requested.map(|(a, _)| a)))
}

/// ADD for a VM whose device is the VF `pci` on `vfio-pci`: hand it off,
/// one-shot DORA on the netdev, restore, report.
pub(crate) async fn add_vfio(
    agent: &Arc<Agent>,
    req: &CniRequest,
    vm: VmPod,
    pci: PciAddr,
    deadline: Deadline,
    mut phases: Phases,
) -> Result<CniResult, Error> {
    let who = pod_label(vm.pod.as_ref());
    // Before the handoff: the window on the kernel driver stays one
    // exchange long.
    let (vmi, report) = lookup(&*agent.pod_api, agent.metrics(), &vm, deadline).await?;
    phases.who = phases.lap();
    let sysfs = Sysfs::new(&agent.args.sysfs_root).with_vf_drivers(&agent.args.vf_driver);
    let journal = vfio::journal_dir(&agent.args.state_dir);
    let handed = vfio::with_kernel_driver(
        &sysfs,
        &journal,
        &pci,
        agent.args.vfio_netdev_timeout,
        |netdev| {
            Box::pin(discover(
                agent,
                req,
                &vm,
                vmi.as_ref(),
                report.as_ref(),
                pci,
                netdev,
            ))
        },
    )
    .await;
    let (found, mac) = match handed {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => return Err(e),
        Err(source) => {
            // The exchanges may have bound before the restore failed:
            // drop them.
            for h in agent.leases.attachment(&req.container_id, &req.ifname) {
                agent.leases.abandon(&h, false).await;
            }
            agent.metrics().failure("vfio");
            return Err(Error::Handoff {
                pci,
                pod: who,
                source: Box::new(source),
            });
        }
    };
    phases.dora = phases.lap();
    let to = ReportTo {
        pod: vm.pod.as_ref(),
        key: vm.annotation_key.as_deref(),
    };
    let (handle, lease) = match found {
        OnVf::V4(handle, lease) => (handle, *lease),
        OnVf::V6(found) => {
            // An IPv6 or dual-stack network: reported and recorded as a VM's
            // one-shot discoveries on its launcher's netdev are.
            let (result, address6) =
                vm_answer::answer(agent, req, to, &found, mac, deadline).await?;
            info!(container = %req.container_id, ifname = %req.ifname, %pci,
                address = ?found.v4.as_ref().map(|(_, l)| l.address), %address6,
                mac = %MacAddr(mac), who_us = phases.who, dora_us = phases.dora,
                total_us = phases.total(),
                "ADD done (VFIO VM, DHCPv6 one-shot: address reported, vfio-pci restored)");
            return Ok(result);
        }
    };
    // Report and record as every ADD does; the VM owns its lease (never
    // released), and a restarted agent answers this VM's CHECK and DEL
    // from the record.
    let bound = Bound {
        handle: &handle,
        lease: &lease,
        mac,
        netns: req.netns.as_deref(),
        release: false,
    };
    let result = report_and_record(agent, req, to, &bound, deadline, &mut phases).await?;
    info!(container = %req.container_id, ifname = %req.ifname, %pci, address = %lease.address,
        mac = %MacAddr(mac), who_us = phases.who, dora_us = phases.dora, report_us = phases.report,
        durable_us = phases.durable, total_us = phases.total(),
        "ADD done (VFIO VM: address reported, vfio-pci restored)");
    Ok(result)
}

/// What the discoveries on a VF's netdev bound: a DHCPv4 lease on an IPv4
/// network; the `DHCPv6` one, with the DHCPv4 one beside it on a
/// dual-stack network.
enum OnVf {
    V4(Handle, Box<Lease>),
    V6(Box<Found>),
}

/// Inside the handoff window: prepare `netdev`, run the network's one-shot
/// discoveries on it (DHCPv4, `DHCPv6`, or both at once), and wait until
/// their tasks have let go of the netdev (which goes away with the
/// rebind). Returns what they bound and the VM's MAC.
async fn discover(
    agent: &Arc<Agent>,
    req: &CniRequest,
    vm: &VmPod,
    vmi: Option<&VmiInfo>,
    report: Option<&SourceReport>,
    pci: PciAddr,
    netdev: String,
) -> Result<(OnVf, [u8; 6]), Error> {
    let (mac, requested, ifindex) = vf_ready(agent, req, vm, (vmi, report), pci, &netdev).await?;
    let place = Place::VfNetdev {
        netdev: netdev.clone(),
    };
    let record = |family| {
        fresh_record(
            req,
            vm.pod.clone(),
            WorkloadKind::Vm {
                vmi: vm.vmi_name.clone(),
            },
            (mac.octets(), family),
            vm.annotation_key.clone(),
        )
    };
    let v4 = async {
        let link = Link::open_looking(None, &netdev, Sockets::Sender, false)
            .map_err(|source| Error::interface(agent.metrics(), place.clone(), source))?
            .with_src_mac(mac.octets());
        let acquisition = Acquisition {
            record: record(Family::Ipv4),
            mode: Mode::OneShot,
            requested,
            link,
        };
        agent
            .leases
            .acquire(&agent.pacing, &agent.base, acquisition)
            .await
            .map_err(|f| Error::acquisition(place.clone(), &req.config.name, f))
    };
    let v6 = async {
        // The netdev is in the agent's own namespace: the socket is made
        // here, on it.
        let sock = crate::datapath::udp6::bound_socket(&netdev, ifindex)
            .map_err(|(op, source)| netdev_error(agent, pci, &netdev, op, Box::new(source)))?;
        agent
            .leases
            .acquire6(
                &agent.pacing,
                agent.base.acquire_timeout,
                Acquisition6 {
                    record: record(Family::Ipv6),
                    netns: None,
                    ifindex,
                    link_mac: mac.octets(),
                    sock: Some(sock),
                },
            )
            .await
            .map_err(|f| Error::acquisition(place.clone(), &req.config.name, f))
    };
    let found = match req.config.ipam.family {
        CniFamily::Ipv4 => v4.await.map(|(h, l)| OnVf::V4(h, Box::new(l))),
        CniFamily::Ipv6 => v6
            .await
            .map(|v6| OnVf::V6(Box::new(Found { v4: None, v6 }))),
        CniFamily::Dual => match tokio::join!(v4, v6) {
            (Ok(v4), Ok(v6)) => Ok(OnVf::V6(Box::new(Found { v4: Some(v4), v6 }))),
            (Err(e), other) => {
                if let Ok((h, _)) = other {
                    agent.leases.abandon(&h, false).await;
                }
                Err(e)
            }
            (Ok((h, _)), Err(e)) => {
                agent.leases.abandon(&h, false).await;
                Err(e)
            }
        },
    };
    let found = found?;
    // The netdev goes away with the rebind: the tasks must be done with it.
    match &found {
        OnVf::V4(h, _) => {
            agent.leases.stop(h, false).await;
        }
        OnVf::V6(f) => {
            for h in f.handles() {
                agent.leases.stop(h, false).await;
            }
        }
    }
    Ok((found, mac.octets()))
}

/// The VF's `netdev`, handed over to its kernel driver, made ready for the
/// VM's discoveries: the VM's identity read (its MAC, and the address a
/// migration target asks for), the netdev given that MAC and set up, with
/// duplicate address detection off first on a network with IPv6. Returns
/// the MAC, the address to ask for, and the netdev's index.
async fn vf_ready(
    agent: &Agent,
    req: &CniRequest,
    vm: &VmPod,
    (vmi, report): (Option<&VmiInfo>, Option<&SourceReport>),
    pci: PciAddr,
    netdev: &str,
) -> Result<(MacAddr, Option<std::net::Ipv4Addr>, u32), Error> {
    let netdev_err = |op, netdev: &str, source| netdev_error(agent, pci, netdev, op, source);
    let nl = Netlink::open(None)
        .await
        .map_err(|e| netdev_err("open rtnetlink for", netdev, e.into()))?;
    let details = nl
        .link(netdev)
        .await
        .map_err(|e| netdev_err("look up", netdev, e.into()))?;
    let vf_mac = details.mac.ok_or_else(|| {
        netdev_err(
            "read the Ethernet address of",
            netdev,
            "the link has no 6-byte hardware address".into(),
        )
    })?;
    let key = vm.annotation_key.clone().unwrap_or_default();
    let id = vm_identity(vmi, &key, MacAddr(vf_mac), report);
    let (mac, source) = (id.mac, id.mac_source);
    let requested = id.requested.map(|(a, _)| a);
    let family = req.config.ipam.family;
    info!(%pci, netdev, vmi = %vm.vmi_name, mac = %mac, mac_source = %source, requested = ?id.requested,
        ?family, "VFIO VM: one-shot discovery on the VF netdev; the address is not configured");
    if family.has_ipv6() {
        no_dad(netdev);
    }
    prepare(&nl, netdev, details.ifindex, vf_mac, mac.octets(), source)
        .await
        .map_err(|e| netdev_err("set up", netdev, e.into()))?;

    Ok((mac, requested, details.ifindex))
}

/// `op` on the VF's `netdev` failed: counted, and said naming both.
fn netdev_error(
    agent: &Agent,
    pci: PciAddr,
    netdev: &str,
    op: &'static str,
    source: Box<dyn std::error::Error + Send + Sync>,
) -> Error {
    agent.metrics().failure("interface");
    Error::Netdev {
        pci,
        netdev: netdev.to_owned(),
        op,
        source,
    }
}

/// Turn duplicate address detection off on a VF's netdev before it comes
/// up: the netdev lives only for the discovery, in the agent's namespace,
/// and its link-local address would otherwise be tentative, and unusable
/// as the SOLICIT's source, for 1–2 s of the handoff window. Nothing else
/// uses the address. Failing, the SOLICIT waits for the detection.
fn no_dad(netdev: &str) {
    let path = format!("/proc/sys/net/ipv6/conf/{netdev}/accept_dad");
    if let Err(e) = std::fs::write(&path, "0") {
        warn!(netdev, path, error = %e,
            "cannot turn duplicate address detection off on the VF netdev; the SOLICIT waits for it");
    }
}

/// Give the netdev the VM's MAC (when it differs: the VF's anti-spoofing
/// would drop frames from another source), set it up and wait briefly for
/// carrier.
async fn prepare(
    nl: &Netlink,
    ifname: &str,
    index: u32,
    current: [u8; 6],
    mac: [u8; 6],
    source: MacSource,
) -> Result<(), crate::netlink::NetlinkError> {
    if current != mac
        && let Err(e) = nl.set_mac(index, mac).await
    {
        // Some PFs pin the VF MAC; the frames still carry the VM's MAC,
        // which works when spoof checking is off.
        warn!(ifname, error = %format_chain(&e), from = %MacAddr(current), to = %MacAddr(mac), source = ?source,
            "cannot give the VF netdev the VM's MAC; sending with it as the source anyway");
    }
    nl.set_up(index).await?;
    let deadline = Instant::now() + CARRIER_WAIT;
    loop {
        if nl.link(ifname).await?.running {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::kube::fake::{FakePods, Hung};

    fn migration_target() -> VmPod {
        VmPod {
            pod: Some(PodRef {
                namespace: "tenant".to_owned(),
                name: "virt-launcher-vm2-x".to_owned(),
                uid: None,
            }),
            annotation_key: Some("tenant/localnet".to_owned()),
            vmi_name: "vm2".to_owned(),
            owner_uid: None,
            migration: Some(MigrationTarget {
                migration_uid: "m-1".to_owned(),
                migration_name: Some("migrate-vm2".to_owned()),
            }),
        }
    }

    /// Every VM ADD, the VFIO handoff's included, reads its VMI within the
    /// ADD's deadline: a read that never answers fails the ADD when the
    /// deadline is up, naming the VMI.
    #[tokio::test(start_paused = true)]
    async fn a_vmi_read_that_never_answers_ends_at_the_deadline() {
        let t0 = tokio::time::Instant::now();
        let e = lookup(
            &FakePods::hung(Hung {
                vmis: true,
                ..Hung::default()
            }),
            &Metrics::new(),
            &migration_target(),
            Deadline::after(Duration::from_secs(16)),
        )
        .await
        .unwrap_err();
        assert_eq!(t0.elapsed(), Duration::from_secs(16));
        assert!(
            matches!(&e, Error::KubeDeadline { what, .. }
                if what == "reading VirtualMachineInstance tenant/vm2"),
            "{e:?}"
        );
    }

    /// A migration target whose migration object never answers still gets
    /// its ADD: the source's report is best effort, cut at the deadline, and
    /// the DORA goes on without it.
    #[tokio::test(start_paused = true)]
    async fn a_migration_read_that_never_answers_is_cut_at_the_deadline() {
        let t0 = tokio::time::Instant::now();
        let (vmi, report) = lookup(
            &FakePods::hung(Hung {
                migrations: true,
                ..Hung::default()
            }),
            &Metrics::new(),
            &migration_target(),
            Deadline::after(Duration::from_secs(16)),
        )
        .await
        .unwrap();
        assert_eq!(t0.elapsed(), Duration::from_secs(16));
        assert!(vmi.is_none() && report.is_none());
    }

    /// A pod whose owner reference names the VMI's name but another UID (a
    /// forged owner, or a VMI recreated since) gets nothing of the VMI; the
    /// VMI with the UID it names is its own.
    #[test]
    fn a_pod_owned_by_another_vmi_uid_is_refused() {
        let vmi = VmiInfo {
            uid: Some("vmi-uid-real".into()),
            name: "vm2".into(),
            ..VmiInfo::default()
        };
        let mut pod = migration_target();
        pod.owner_uid = Some("vmi-uid-forged".into());
        let e = check_owner(&pod, &vmi).unwrap_err();
        assert!(
            matches!(
                &e,
                Error::Refused {
                    source: crate::ops::error::Refusal::NotTheVmisPod { .. }
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("vmi-uid-real"), "{e}");
        pod.owner_uid = Some("vmi-uid-real".into());
        check_owner(&pod, &vmi).unwrap();
    }
}
