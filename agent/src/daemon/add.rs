//! The CNI operations as the agent performs them: ADD, DEL, CHECK, GC.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};
use xdhcp_engine::Mode;

use super::acquire::{self, Request, cni_result, report_address};
use super::context::Agent;
use super::error::{Error, Place};
use super::lease::apply;
use super::lease::persist::{self, Durable, PodRef, WorkloadKind};
use super::lease::task::lock;
use super::link::Link;
use super::vm;
use crate::cni::config::NetworkConfig;
use crate::cni::types::CniResult;
use crate::kube::network_key;
use crate::rpc::{CniRequest, GcReply, GcRequest};
use crate::workload::{MacAddr, MigrationTarget, Workload, vm_identity};

/// How long ADD waits for the first lease record to reach the disk; an ADD
/// whose record is not durable by then fails (and gives the lease back).
const PERSIST_WAIT: Duration = Duration::from_secs(10);

/// How long before the CNI plugin stops waiting an ADD answers at the
/// latest (its Kubernetes calls are cut off there).
const ANSWER_SLACK: Duration = Duration::from_secs(1);

/// When an ADD must have answered: just inside the plugin's wait, so the
/// plugin always hears the outcome and the runtime never sees a timeout
/// while the agent goes on to finish (or undo) the ADD.
pub(super) fn add_deadline(req: &CniRequest) -> (tokio::time::Instant, Duration) {
    let budget = crate::cni::shim_timeout(&req.config).saturating_sub(ANSWER_SLACK);
    (tokio::time::Instant::now() + budget, budget)
}

/// Run a Kubernetes call `what` until `deadline`.
async fn kube_within<T>(
    agent: &Agent,
    (deadline, budget): (tokio::time::Instant, Duration),
    what: impl FnOnce() -> String,
    call: impl std::future::Future<Output = Result<T, crate::kube::PodApiError>>,
) -> Result<T, Error> {
    // Boxed: the API calls' futures are large and ADD's future holds them.
    let Ok(r) = tokio::time::timeout_at(deadline, Box::pin(call)).await else {
        agent.metrics().failure("kube_api");
        return Err(Error::KubeDeadline {
            what: what(),
            deadline: budget,
        });
    };
    r.map_err(|e| kube(agent, e))
}

pub(super) fn kube(agent: &Agent, source: crate::kube::PodApiError) -> Error {
    agent.metrics().failure("kube_api");
    Error::Kube { source }
}

/// The `pod-networks` key of `config` for a pod in `pod_ns`.
#[expect(
    clippy::result_large_err,
    reason = "a failed CNI operation is rare; its error goes straight to the socket"
)]
pub(crate) fn annotation_key(config: &NetworkConfig, pod_ns: &str) -> Result<String, Error> {
    network_key(config.net_attach_def_name.as_deref(), pod_ns, &config.name)
        .map_err(|source| Error::AnnotationKey { source })
}

/// Who an ADD is for.
struct Who {
    pod: Option<PodRef>,
    workload: Workload,
    annotation_key: Option<String>,
    /// A live-migration target launcher pod's migration.
    migration: Option<MigrationTarget>,
}

/// Ask the API (kube) or `CNI_ARGS` + local store (embedded) who this is.
async fn who(
    agent: &Agent,
    req: &CniRequest,
    deadline: (tokio::time::Instant, Duration),
) -> Result<Who, Error> {
    let Some((ns, name)) = req.pod() else {
        return Ok(Who {
            pod: None,
            workload: Workload::Pod,
            annotation_key: None,
            migration: None,
        });
    };
    let info = kube_within(
        agent,
        deadline,
        || format!("reading pod {ns}/{name}"),
        agent.pod_api.get_pod(ns, name),
    )
    .await?;
    // The runtime's UID first: the annotation write then refuses a pod
    // recreated under the same name since this ADD was issued.
    let uid = req
        .args
        .get("K8S_POD_UID")
        .cloned()
        .or_else(|| info.uid.clone());
    Ok(Who {
        pod: Some(PodRef {
            namespace: ns.to_owned(),
            name: name.to_owned(),
            uid,
        }),
        workload: info.workload(),
        annotation_key: Some(annotation_key(&req.config, ns)?),
        migration: info.migration_target(),
    })
}

/// ADD.
pub(crate) async fn add(agent: &Arc<Agent>, req: CniRequest) -> Result<CniResult, Error> {
    agent.metrics().cni_request("add");
    let deadline = add_deadline(&req);
    let mut phases = Phases::start();
    tracing::debug!(container = %req.container_id, ifname = %req.ifname, "ADD received");
    let _guard = agent.leases.key_lock(&req.container_id, &req.ifname).await;

    // A repeated ADD for a bound attachment returns the same result.
    if let Some(h) = agent.leases.get(&req.container_id, &req.ifname) {
        let existing = lock(&h.live).record.lease.clone();
        if let Some(l) = existing {
            return Ok(cni_result(&l, &req.config));
        }
        agent.leases.stop(&h, false).await;
    }
    let netns = req.netns.clone().ok_or(Error::NoNetns)?;
    let who = who(agent, &req, deadline).await?;
    phases.who = phases.lap();

    // A VM whose VF is passed through (vfio-pci): DORA during a driver handoff.
    if let Workload::Vm { vmi_name } = &who.workload
        && let Some(pci) = vm::vfio_device(agent, &req, who.pod.as_ref())?
    {
        let target = vm::VmPod {
            pod: who.pod,
            annotation_key: who.annotation_key,
            vmi_name: vmi_name.clone(),
            migration: who.migration,
        };
        return vm::add_vfio(agent, &req, target, pci, deadline).await;
    }

    let place = Place::Pod {
        ifname: req.ifname.clone(),
        netns: netns.clone(),
    };
    let pod = who.workload == Workload::Pod;
    // One trip into the pod's namespace opens the link and finds its veth
    // peer (the port the guard goes on).
    let mut link = acquire::open_link(agent, Some(&netns), &req.ifname, pod, true, &place)?;
    phases.open = phases.lap();
    tracing::debug!(ifindex = link.info.ifindex, "link open");
    // A pod's port is guarded while its lease is acquired: the pod's own
    // processes start only after the ADD answers, so the guard has to be
    // on by then, not before the agent's own DORA. (The attach's cost is
    // the kernel's: its first filter on the port's new qdisc waits for an
    // expedited RCU grace period. Beside the DORA a server's round trip
    // hides it; in line, before or after the DORA, it is on every pod's
    // ADD path — measured after the DORA, it cost as much as it saves.) A
    // VM's guard needs the VM's MAC and goes on before its one-shot
    // discovery, in `bind`.
    let pod_peer = if pod { link.take_veth_peer() } else { None };
    let pod_guard = async {
        if pod {
            let started = std::time::Instant::now();
            guard_port(
                agent,
                &req.container_id,
                &req.ifname,
                &netns,
                &req.config,
                None,
                pod_peer,
            )
            .await;
            u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX)
        } else {
            0
        }
    };
    let bind = bind(agent, &req, &who, link, &netns, &place, &mut phases);
    let (bound, pod_guard_us) = tokio::join!(bind, pod_guard);
    if pod {
        phases.guard = pod_guard_us;
    }
    let (handle, lease, mac, kind) = match bound {
        Ok(b) => b,
        Err(e) => {
            if pod {
                agent.guard.release(&req.container_id, &req.ifname);
            }
            return Err(e);
        }
    };
    // Any wait for a pod's guard after the DORA is in no phase of its own.
    let _ = phases.lap();

    let bound = Bound {
        handle: &handle,
        lease: &lease,
        mac,
        netns: &netns,
        release: kind == WorkloadKind::Pod,
    };
    report_and_record(agent, &req, &who, &bound, deadline, &mut phases).await?;
    info!(container = %req.container_id, ifname = %req.ifname, address = %lease.address,
        mac = %MacAddr(mac), who_us = phases.who, open_us = phases.open, guard_us = phases.guard,
        dora_us = phases.dora, report_us = phases.report, durable_us = phases.durable,
        total_us = phases.total(), "ADD done");
    Ok(cni_result(&lease, &req.config))
}

/// Acquire the lease on the attachment's opened interface (a VM's guard
/// goes on first: it needs the VM's MAC).
async fn bind(
    agent: &Arc<Agent>,
    req: &CniRequest,
    who: &Who,
    mut link: Link,
    netns: &std::path::Path,
    place: &Place,
    phases: &mut Phases,
) -> Result<
    (
        super::registry::Handle,
        xdhcp_engine::Lease,
        [u8; 6],
        WorkloadKind,
    ),
    Error,
> {
    let pod = who.workload == Workload::Pod;
    let (mac, mode, requested, kind) = match &who.workload {
        Workload::Pod => (link.info.mac, Mode::Maintain, None, WorkloadKind::Pod),
        Workload::Vm { vmi_name } => {
            let (mac, requested) = vm_dhcp(agent, who, vmi_name, link.info.mac).await?;
            (
                mac,
                Mode::OneShot,
                requested,
                WorkloadKind::Vm {
                    vmi: vmi_name.clone(),
                },
            )
        }
    };
    if !pod {
        guard_port(
            agent,
            &req.container_id,
            &req.ifname,
            netns,
            &req.config,
            Some(mac),
            link.take_veth_peer(),
        )
        .await;
        phases.guard = phases.lap();
    }
    let record = persist::fresh(
        req,
        who.pod.clone(),
        kind.clone(),
        mac,
        who.annotation_key.clone(),
    );
    let request = Request {
        record,
        mode,
        requested,
        place: place.clone(),
    };
    let (handle, lease) = acquire::acquire(agent, request, link.with_src_mac(mac)).await?;
    phases.dora = phases.lap();
    Ok((handle, lease, mac, kind))
}

/// A VM pod's DHCP identity: the MAC the VM's guest will use (the MAC
/// chain) and the address to ask for (on a migration target, what the
/// source pod reported).
async fn vm_dhcp(
    agent: &Arc<Agent>,
    who: &Who,
    vmi_name: &str,
    pod_mac: [u8; 6],
) -> Result<([u8; 6], Option<std::net::Ipv4Addr>), Error> {
    let ns = who.pod.as_ref().map_or("", |p| p.namespace.as_str());
    let vmi = agent
        .pod_api
        .get_vmi(ns, vmi_name)
        .await
        .map_err(|e| kube(agent, e))?;
    let key = who.annotation_key.clone().unwrap_or_default();
    let source = vm::migration_source(
        agent,
        who.pod.as_ref(),
        who.migration.as_ref(),
        vmi.as_ref(),
        &key,
    )
    .await;
    let id = vm_identity(vmi.as_ref(), &key, MacAddr(pod_mac), source.as_ref());
    info!(vmi = %vmi_name, mac = %id.mac, mac_source = %id.mac_source,
        requested = ?id.requested, migration_source = ?source.as_ref().map(|s| &s.pod),
        "VM pod: one-shot discovery, the address is not configured");
    Ok((id.mac.octets(), id.requested.map(|(a, _)| a)))
}

/// Where a pod ADD's time went inside the agent, in µs per step (logged
/// with "ADD done"; `docs/performance-notes.md` reads them).
#[derive(Debug)]
struct Phases {
    started: std::time::Instant,
    last: std::time::Instant,
    /// Lock and pod lookup.
    who: u64,
    /// The trip into the pod namespace (sender, receiver, removal watch).
    open: u64,
    /// The DHCP guard's attach: a VM's after the open (it needs the VM's
    /// MAC); a pod's alongside open and DORA, so not part of the sum of
    /// the others, which falls short of the total by any wait for the
    /// guard after the DORA.
    guard: u64,
    /// Lease task start to the first outcome (DISCOVER .. ACK).
    dora: u64,
    /// The `pod-networks` entry.
    report: u64,
    /// The rest of the wait for the lease record to be on disk.
    durable: u64,
}

impl Phases {
    fn start() -> Self {
        let now = std::time::Instant::now();
        Self {
            started: now,
            last: now,
            who: 0,
            open: 0,
            guard: 0,
            dora: 0,
            report: 0,
            durable: 0,
        }
    }

    /// µs since the previous lap.
    fn lap(&mut self) -> u64 {
        let now = std::time::Instant::now();
        let d = now.duration_since(self.last);
        self.last = now;
        u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
    }

    fn total(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

/// A lease an ADD has bound, and whether giving it back releases it.
struct Bound<'a> {
    handle: &'a super::registry::Handle,
    lease: &'a xdhcp_engine::Lease,
    mac: [u8; 6],
    /// The pod's network namespace: gone by the time of the write means
    /// the ADD is stale.
    netns: &'a std::path::Path,
    release: bool,
}

/// End an ADD's bound lease: RELEASE (pods), forget it, remove its record,
/// and take its address off the pod interface (`apply`).
async fn give_back(agent: &Arc<Agent>, req: &CniRequest, b: &Bound<'_>) {
    acquire::abandon(agent, &req.container_id, &req.ifname, b.handle, b.release).await;
    unapply(req, b.lease, b.release).await;
}

/// Report a bound lease's address (pods and VMs alike) and wait for its
/// record to be on disk, within the ADD's deadline; if either fails, the
/// lease is given back and the ADD fails.
async fn report_and_record(
    agent: &Arc<Agent>,
    req: &CniRequest,
    who: &Who,
    b: &Bound<'_>,
    deadline: (tokio::time::Instant, Duration),
    phases: &mut Phases,
) -> Result<(), Error> {
    // Report the address (pods and VMs alike) within the ADD's deadline,
    // unless the ADD went stale.
    if let (Some(p), Some(key)) = (&who.pod, &who.annotation_key)
        && let Err(e) = kube_within(
            agent,
            deadline,
            || {
                format!(
                    "writing the pod-networks entry of pod {}/{}",
                    p.namespace, p.name
                )
            },
            report_address(agent, p, key, b.lease, b.mac, Some(b.netns)),
        )
        .await
    {
        // The pod cannot use an unreported address: give it back (pods,
        // unless another attachment holds the same address).
        let record = lock(&b.handle.live).record.clone();
        let e = acquire::abandon_unreported(agent, &record, b.handle, b.lease, e).await;
        if let Error::NotReported {
            fate: acquire::LeaseFate::Released,
            ..
        } = &e
        {
            unapply(req, b.lease, true).await;
        }
        return Err(e);
    }
    phases.report = phases.lap();
    // Answer only once the lease is on disk (a restart must resume it); a
    // lease that could not be recorded is given back and the ADD fails.
    let unrecorded = unrecorded(b.handle, deadline).await;
    phases.durable = phases.lap();
    if let Some(reason) = unrecorded {
        give_back(agent, req, b).await;
        return Err(unreport(
            agent,
            who.pod.as_ref(),
            who.annotation_key.as_deref(),
            deadline,
            reason,
        )
        .await);
    }
    Ok(())
}

/// Why the attachment's record is not on disk, after waiting for it within
/// the ADD's deadline; `None` once it is.
pub(super) async fn unrecorded(
    handle: &super::registry::Handle,
    deadline: (tokio::time::Instant, Duration),
) -> Option<String> {
    let left = deadline
        .0
        .saturating_duration_since(tokio::time::Instant::now());
    match handle.persisted(PERSIST_WAIT.min(left)).await {
        Durable::Saved => None,
        Durable::Failed(e) => Some(crate::rpc::format_chain(&*e)),
        Durable::Pending => Some(format!(
            "the write did not finish within {:?} (or the lease ended before it was written)",
            PERSIST_WAIT.min(left)
        )),
    }
}

/// An ADD whose lease could not be recorded (and was given back): remove
/// the address it reported, and name the state directory in its error.
pub(super) async fn unreport(
    agent: &Agent,
    pod: Option<&PodRef>,
    annotation_key: Option<&str>,
    deadline: (tokio::time::Instant, Duration),
    reason: String,
) -> Error {
    if let (Some(p), Some(key)) = (pod, annotation_key)
        && let Err(e) = kube_within(
            agent,
            deadline,
            || {
                format!(
                    "removing the pod-networks entry of pod {}/{}",
                    p.namespace, p.name
                )
            },
            agent
                .pod_api
                .remove_network_entry(&p.namespace, &p.name, key),
        )
        .await
    {
        warn!(error = %crate::rpc::format_chain(&e),
            "could not remove the pod-networks entry of an ADD whose lease was not recorded");
    }
    Error::Persist {
        dir: agent.args.state_dir.clone(),
        reason,
    }
}

/// Puts the DHCP guard on the host end of the attachment's port. A port the
/// guard cannot take is logged and counted, never a failed ADD: the lease
/// does not depend on it.
pub(crate) async fn guard_port(
    agent: &Agent,
    container_id: &str,
    ifname: &str,
    netns: &std::path::Path,
    config: &NetworkConfig,
    vm_mac: Option<[u8; 6]>,
    peer: crate::netlink::PeerLookup,
) {
    let policy = super::guard::port_policy(&config.ipam.dhcp_guard, vm_mac);
    match agent
        .guard
        .protect(container_id, ifname, netns, peer, policy)
        .await
    {
        Ok(Some(port)) => {
            info!(container = %container_id, ifname, port = %port.host_ifname, ?policy, "DHCP guard on");
        }
        Ok(None) => {}
        Err(e) => {
            agent.metrics().failure("dhcp_guard");
            warn!(container = %container_id, ifname, error = %crate::rpc::format_chain(&e),
                "could not put the DHCP guard on the port");
        }
    }
}

/// Take a released lease's address off the pod interface again (`apply`):
/// an ADD that fails after BOUND leaves the pod without the address.
async fn unapply(req: &CniRequest, lease: &xdhcp_engine::Lease, released: bool) {
    if released
        && req.config.ipam.apply
        && let Some(ns) = &req.netns
        && let Err(e) = apply::deconfigure(ns, &req.ifname, lease).await
    {
        warn!(error = %crate::rpc::format_chain(&e), "could not remove the address of a failed ADD");
    }
}

/// DEL: RELEASE (pods), forget, remove the annotation entry. Idempotent.
pub(crate) async fn del(agent: &Arc<Agent>, req: CniRequest) -> Result<(), Error> {
    agent.metrics().cni_request("del");
    let _guard = agent.leases.key_lock(&req.container_id, &req.ifname).await;
    let handle = agent.leases.get(&req.container_id, &req.ifname);
    let record = handle.as_ref().map(|h| lock(&h.live).record.clone());
    if let (Some(h), Some(rec)) = (&handle, &record) {
        let release = rec.workload == WorkloadKind::Pod;
        // A task that did not take the Stop (parked: the pod interface went
        // before DEL, the bridge plugin's order, whether before the lookup
        // above or just after it) sent no RELEASE: the lease is released
        // through the uplink that carried it.
        if !agent.leases.stop(h, release).await && release {
            let rec = lock(&h.live).record.clone();
            release_through_uplink(agent, &rec);
        }
        agent
            .leases
            .forget(&req.container_id, &req.ifname, h.generation);
        if release
            && rec.config.ipam.apply
            && let (Some(ns), Some(l)) = (&req.netns, &rec.lease)
            && let Err(e) = apply::deconfigure(ns, &req.ifname, l).await
        {
            warn!(error = %crate::rpc::format_chain(&e), "could not remove the address at DEL");
        }
    }
    agent.guard.release(&req.container_id, &req.ifname);
    // A VM's learned binding goes with its attachment.
    if let Some(rec) = record.as_ref().filter(|r| r.workload != WorkloadKind::Pod) {
        agent.guard.forget_learned(rec.mac);
    }
    persist::remove(&agent.svc.store, &req.container_id, &req.ifname).map_err(|source| {
        Error::Store {
            op: "remove",
            source,
        }
    })?;
    // The annotation entry: from the record, else from CNI_ARGS + config.
    let target = match record
        .as_ref()
        .and_then(|r| r.pod.clone().zip(r.annotation_key.clone()))
    {
        Some(x) => Some(x),
        None => match req.pod() {
            Some((ns, name)) => Some((
                PodRef {
                    namespace: ns.to_owned(),
                    name: name.to_owned(),
                    uid: req.args.get("K8S_POD_UID").cloned(),
                },
                annotation_key(&req.config, ns)?,
            )),
            None => None,
        },
    };
    // Only from the pod this attachment was for: a pod recreated under the
    // same name keeps the entry its own ADD wrote.
    if let Some((p, key)) = target {
        agent
            .pod_api
            .remove_network_entry_for_uid(&p.namespace, &p.name, p.uid.as_deref(), &key)
            .await
            .map_err(|e| kube(agent, e))?;
    }
    if record.is_some() {
        info!(container = %req.container_id, ifname = %req.ifname, "DEL done");
    } else {
        // A repeated DEL, or an attachment leased before xdhcp took over
        // (the upstream daemon's): nothing of ours to release.
        info!(container = %req.container_id, ifname = %req.ifname, network = %req.config.name,
            "DEL for an attachment xdhcp holds no lease for (already deleted, or never leased here): nothing to release");
    }
    Ok(())
}

/// RELEASE a parked lease (task ended with its interface) out of the node
/// uplink that carried its replies: unicast from the leased address to the
/// server, at the server MAC learned from the ACK, with the pod's MAC.
fn release_through_uplink(agent: &Agent, rec: &persist::LeaseRecord) {
    let (Some(uplink), Some(lease)) = (&rec.uplink, &rec.lease) else {
        return;
    };
    let cfg = acquire::client_config(agent, &rec.config, &rec.args, rec.mac, Mode::Maintain, None);
    let now = std::time::Instant::now();
    let now_ms = crate::cli::now_unix_ms();
    let mut client = xdhcp_engine::Client::resume(cfg, lease.clone(), now, now_ms, acquire::seed());
    client.release(now);
    while let Some(t) = client.poll_transmit() {
        match agent
            .svc
            .capture
            .send_via_uplink(&uplink.ifname, rec.mac, uplink.vlan, &t)
        {
            Ok(()) => info!(container = %rec.container_id, ifname = %rec.ifname,
                uplink = %uplink.ifname, address = %lease.address, "released through the uplink"),
            Err(e) => {
                agent.metrics().failure("release_uplink");
                warn!(uplink = %uplink.ifname, error = %crate::rpc::format_chain(&e),
                    "RELEASE through the uplink could not be sent");
            }
        }
    }
}

/// CHECK: a lease xdhcp holds must be bound and (with apply) configured.
/// An attachment xdhcp holds no lease for passes with a log line: it was
/// leased before xdhcp took over the node (by the upstream daemon), and
/// failing its CHECK would have the runtime tear down a working pod.
pub(crate) async fn check(agent: &Arc<Agent>, req: CniRequest) -> Result<(), Error> {
    agent.metrics().cni_request("check");
    let Some(h) = agent.leases.get(&req.container_id, &req.ifname) else {
        info!(container = %req.container_id, ifname = %req.ifname, network = %req.config.name,
            "CHECK for an attachment xdhcp holds no lease for (leased before xdhcp took over?): nothing to check");
        return Ok(());
    };
    let (rec, state) = {
        let l = lock(&h.live);
        (l.record.clone(), l.state)
    };
    let lease = rec.lease.ok_or_else(|| Error::LeaseGone {
        ifname: req.ifname.clone(),
        state: format!("{state:?}"),
    })?;
    if rec.config.ipam.apply && rec.workload == WorkloadKind::Pod {
        let ns = req.netns.as_ref().ok_or(Error::NoNetns)?;
        let present = apply::has_address(ns, &req.ifname, lease.address, lease.prefix_len)
            .await
            .map_err(|source| Error::Inspect {
                ifname: req.ifname.clone(),
                source,
            })?;
        if !present {
            return Err(Error::AddressMissing {
                address: lease.address,
                prefix_len: lease.prefix_len,
                ifname: req.ifname.clone(),
                netns: ns.clone(),
            });
        }
    }
    Ok(())
}

/// GC: drop attachments of this network that are not in the valid list.
pub(crate) async fn gc(agent: &Arc<Agent>, req: GcRequest) -> Result<GcReply, Error> {
    agent.metrics().cni_request("gc");
    let valid = req
        .config
        .valid_attachments
        .clone()
        .ok_or(Error::NoValidAttachments)?;
    let mut removed = Vec::new();
    for h in agent.leases.all() {
        let rec = lock(&h.live).record.clone();
        if rec.config.name != req.config.name {
            continue;
        }
        let att = crate::cni::config::Attachment {
            container_id: rec.container_id.clone(),
            ifname: rec.ifname.clone(),
        };
        if valid.contains(&att) {
            continue;
        }
        let del_req = CniRequest {
            container_id: rec.container_id.clone(),
            ifname: rec.ifname.clone(),
            netns: rec.netns.clone().filter(|p| p.exists()),
            args: rec.args.clone(),
            config: rec.config.clone(),
        };
        match del(agent, del_req).await {
            Ok(()) => removed.push(att),
            Err(e) => {
                warn!(container = %rec.container_id, error = %crate::rpc::format_chain(&e),
                    "GC could not remove an attachment");
            }
        }
    }
    Ok(GcReply { removed })
}
