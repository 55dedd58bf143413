//! The CNI operations as the agent performs them: ADD, DEL, CHECK, GC.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tracing::{info, warn};
use xdhcp_engine::{Client, ClientConfig, ClientId, Ipv4Prefix, Lease, Mode};

use super::lease::{Command as LeaseCmd, Outcome, lock};
use super::link::{Link, mac_string};
use super::persist::{self, LeaseRecord, PodRef, RECORD_VERSION, WorkloadKind};
use super::{Agent, Handle, apply};
use crate::cni::config::{ClientIdSpec, HostnameSpec, NetworkConfig, validate_hostname};
use crate::cni::types::{CniError, CniResult, DnsConfig, IpConfig, Ipv4Cidr, RouteConfig, code};
use crate::kube::{PodApiError, PodNetworkEntry, network_key};
use crate::rpc::{CniRequest, GcReply, GcRequest};
use crate::workload::{MacAddr, Workload, vm_dhcp_identity};

/// Extra time ADD waits beyond the acquisition timeout for the engine's own
/// failure event (its deadline fires on a timer).
const ADD_MARGIN: Duration = Duration::from_secs(3);
/// How long DEL waits for a lease task to send RELEASE and stop.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// Engine configuration for one attachment: the agent's flags, then the
/// network's `ipam` settings, then identity.
pub fn client_config(
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
pub fn cni_result(lease: &Lease, config: &NetworkConfig) -> CniResult {
    let routes = apply::routes(lease)
        .into_iter()
        .filter_map(|(dst, gw)| {
            Some(RouteConfig {
                dst: Ipv4Cidr::parse(&dst).ok()?,
                gw: (!gw.is_unspecified()).then_some(gw),
                priority: config.ipam.route_priority,
            })
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

/// Writes the `pod-networks` entry for a learned lease (pods and VMs alike,
/// SPEC R26); the pod UID guards against a recreated pod.
pub(super) async fn report_address(
    agent: &Agent,
    pod: &PodRef,
    key: &str,
    lease: &Lease,
    mac: [u8; 6],
) -> Result<(), PodApiError> {
    let entry = PodNetworkEntry::dhcp(
        lease.address,
        lease.prefix_len,
        MacAddr(mac),
        &lease.default_gateway().into_iter().collect::<Vec<_>>(),
    );
    agent
        .pod_api
        .set_network_entry_for_uid(&pod.namespace, &pod.name, pod.uid.as_deref(), key, entry)
        .await
}

fn kube_err(e: &PodApiError) -> CniError {
    CniError::new(code::KUBE_API, e.to_string()).with_details(crate::rpc::format_chain(e))
}

fn annotation_key(config: &NetworkConfig, pod_ns: &str) -> Result<String, CniError> {
    network_key(config.net_attach_def_name.as_deref(), pod_ns, &config.name)
        .map_err(|e| CniError::config("netAttachDefName", e))
}

fn netns_label(req: &CniRequest) -> String {
    req.netns
        .as_ref()
        .map_or_else(|| "-".into(), |p| p.display().to_string())
}

/// ADD.
#[expect(
    clippy::too_many_lines,
    reason = "the ADD flow is one readable sequence of steps with early returns"
)]
pub async fn add(agent: &Arc<Agent>, req: CniRequest) -> Result<CniResult, CniError> {
    agent.metrics.cni_request("add");
    tracing::debug!(container = %req.container_id, ifname = %req.ifname, "ADD received");
    let _guard = agent.key_lock(&req.container_id, &req.ifname).await;

    // A repeated ADD for a bound attachment returns the same result.
    if let Some(h) = agent.handle(&req.container_id, &req.ifname) {
        let existing = lock(&h.live).record.lease.clone();
        if let Some(l) = existing {
            return Ok(cni_result(&l, &req.config));
        }
        stop(agent, &h, false).await;
    }

    let netns = req
        .netns
        .clone()
        .ok_or_else(|| CniError::env("CNI_NETNS", "not set"))?;

    // Who is this? (kube: the API; embedded: CNI_ARGS + local store)
    let (pod, workload) = match req.pod() {
        Some((ns, name)) => {
            let info = agent.pod_api.get_pod(ns, name).await.map_err(|e| {
                agent.metrics.failure("kube_api");
                kube_err(&e)
            })?;
            let w = info.workload();
            // The runtime's UID first: the annotation write then refuses a
            // pod recreated under the same name since this ADD was issued.
            let uid = req
                .args
                .get("K8S_POD_UID")
                .cloned()
                .or_else(|| info.uid.clone());
            (
                Some(PodRef {
                    namespace: ns.to_owned(),
                    name: name.to_owned(),
                    uid,
                }),
                w,
            )
        }
        None => (None, Workload::Pod),
    };
    let ann_key = match &pod {
        Some(p) => Some(annotation_key(&req.config, &p.namespace)?),
        None => None,
    };

    // A VM whose VF is passed through (vfio-pci): DORA during a driver handoff.
    if let Workload::Vm { vmi_name } = &workload
        && let Some(pci) = super::vm::vfio_device(agent, &req, pod.as_ref())?
    {
        let vm = super::vm::VmPod {
            pod,
            annotation_key: ann_key,
            vmi_name: vmi_name.clone(),
        };
        return super::vm::add_vfio(agent, &req, vm, pci).await;
    }

    // Pods start on their own AF_PACKET receiver (see `attach_capture`).
    let link = Link::open(Some(&netns), &req.ifname, workload == Workload::Pod)
        .await
        .map_err(|e| {
            agent.metrics.failure("interface");
            CniError::new(
                code::INTERFACE,
                format!("cannot use interface {} in {}", req.ifname, netns.display()),
            )
            .with_details(crate::rpc::format_chain(&e))
        })?;

    tracing::debug!(ifindex = link.info.ifindex, "link open");
    let (mac, mode, requested, kind) = match &workload {
        Workload::Pod => (link.info.mac, Mode::Maintain, None, WorkloadKind::Pod),
        Workload::Vm { vmi_name } => {
            let ns = pod
                .as_ref()
                .map(|p| p.namespace.as_str())
                .unwrap_or_default();
            let vmi = agent
                .pod_api
                .get_vmi(ns, vmi_name)
                .await
                .map_err(|e| kube_err(&e))?;
            let key = ann_key.clone().unwrap_or_default();
            let (mac, source, req_ip) =
                vm_dhcp_identity(vmi.as_ref(), &key, MacAddr(link.info.mac));
            info!(vmi = %vmi_name, mac = %mac, source = ?source, requested = ?req_ip,
                "VM pod: one-shot discovery, the address is not configured");
            (
                mac.octets(),
                Mode::OneShot,
                req_ip,
                WorkloadKind::Vm {
                    vmi: vmi_name.clone(),
                },
            )
        }
    };

    let link = link.with_src_mac(mac);
    let cfg = client_config(agent, &req.config, &req.args, mac, mode, requested);
    cfg.validate()
        .map_err(|e| CniError::new(code::INVALID_NETWORK_CONFIG, e.to_string()))?;
    let timeout = cfg.acquire_timeout;
    let client = Client::new(cfg, Instant::now(), super::seed());
    let record = LeaseRecord {
        version: RECORD_VERSION,
        container_id: req.container_id.clone(),
        ifname: req.ifname.clone(),
        netns: Some(netns.clone()),
        config: req.config.clone(),
        args: req.args.clone(),
        pod: pod.clone(),
        workload: kind.clone(),
        mac,
        annotation_key: ann_key.clone(),
        lease: None,
    };
    let (tx, rx) = oneshot::channel();
    let handle = agent
        .spawn_lease(record, client, link, Some(tx))
        .await
        .map_err(|e| {
            CniError::new(
                code::INTERFACE,
                format!(
                    "cannot capture DHCP replies on {} in {}",
                    req.ifname,
                    netns.display()
                ),
            )
            .with_details(crate::rpc::format_chain(&e))
        })?;

    let outcome = tokio::time::timeout(timeout + ADD_MARGIN, rx).await;
    let lease = match outcome {
        Ok(Ok(Outcome::Bound(l))) => l,
        other => {
            // Nothing bound: end the task and leave no trace.
            stop(agent, &handle, false).await;
            agent.forget(&req.container_id, &req.ifname, handle.generation);
            let _ = persist::remove(&agent.store, &req.container_id, &req.ifname);
            let what = format!("interface {} in {}", req.ifname, netns_label(&req));
            return Err(acquire_error(agent, other, &what, timeout));
        }
    };

    // Report the address (pods and VMs alike, SPEC R26).
    if let (Some(p), Some(key)) = (&pod, &ann_key)
        && let Err(e) = report_address(agent, p, key, &lease, mac).await
    {
        agent.metrics.failure("kube_api");
        // Give the address back: the pod cannot use an unreported address.
        stop(agent, &handle, kind == WorkloadKind::Pod).await;
        agent.forget(&req.container_id, &req.ifname, handle.generation);
        let _ = persist::remove(&agent.store, &req.container_id, &req.ifname);
        return Err(kube_err(&e));
    }
    // Answer only once the lease is on disk (a restart must resume it).
    if let Some(mut p) = handle.persisted.clone()
        && tokio::time::timeout(STOP_WAIT, p.wait_for(|v| *v))
            .await
            .is_err()
    {
        warn!("the lease was not persisted within {STOP_WAIT:?}; answering anyway");
    }
    info!(container = %req.container_id, ifname = %req.ifname, address = %lease.address,
        mac = %mac_string(mac), "ADD done");
    Ok(cni_result(&lease, &req.config))
}

/// The CNI error for an acquisition that ended without a lease (`outcome`:
/// what ADD's wait for the lease task gave, never `Bound`); `what` names the
/// interface the way the operator knows it.
pub(super) fn acquire_error<E1, E2>(
    agent: &Agent,
    outcome: Result<Result<Outcome, E1>, E2>,
    what: &str,
    timeout: Duration,
) -> CniError {
    let secs = timeout.as_secs();
    match outcome {
        Ok(Ok(Outcome::Failed(e))) => CniError::new(
            code::DHCP_TIMEOUT,
            format!("no DHCP lease on {what} within {secs}s: {e}"),
        ),
        Ok(Ok(Outcome::LinkFailed(e))) => {
            CniError::new(code::INTERFACE, format!("{what} failed during DHCP")).with_details(e)
        }
        Ok(Ok(Outcome::Cancelled)) => {
            CniError::new(code::TRY_AGAIN_LATER, "the xdhcp agent is shutting down")
        }
        // No answer by the deadline, or the task ended without one.
        _ => {
            agent.metrics.failure("acquire_no_reply");
            CniError::new(
                code::DHCP_TIMEOUT,
                format!("no DHCP lease on {what} within {secs}s: heard nothing"),
            )
        }
    }
}

/// Stop a lease task (RELEASE first when `release`) and wait for it.
async fn stop(agent: &Agent, h: &Handle, release: bool) {
    let Some(cmds) = &h.cmds else { return };
    let (ack, done) = oneshot::channel();
    if cmds.send(LeaseCmd::Stop { release, ack }).await.is_ok()
        && tokio::time::timeout(STOP_WAIT, done).await.is_err()
    {
        warn!("lease task did not stop within {STOP_WAIT:?}");
        agent.metrics.failure("stop_timeout");
    }
}

/// DEL: RELEASE (pods), forget, remove the annotation entry. Idempotent.
pub async fn del(agent: &Arc<Agent>, req: CniRequest) -> Result<(), CniError> {
    agent.metrics.cni_request("del");
    let _guard = agent.key_lock(&req.container_id, &req.ifname).await;
    let handle = agent.handle(&req.container_id, &req.ifname);
    let record = handle.as_ref().map(|h| lock(&h.live).record.clone());
    if let (Some(h), Some(rec)) = (&handle, &record) {
        let release = rec.workload == WorkloadKind::Pod;
        stop(agent, h, release).await;
        agent.forget(&req.container_id, &req.ifname, h.generation);
        if release
            && rec.config.ipam.apply
            && let (Some(ns), Some(l)) = (&req.netns, &rec.lease)
            && let Err(e) = apply::deconfigure(ns, &req.ifname, l).await
        {
            warn!(error = %e, "could not remove the address at DEL");
        }
    }
    persist::remove(&agent.store, &req.container_id, &req.ifname).map_err(|e| {
        CniError::new(code::IO_FAILURE, "cannot remove the lease record")
            .with_details(e.to_string())
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
                    uid: None,
                },
                annotation_key(&req.config, ns)?,
            )),
            None => None,
        },
    };
    if let Some((p, key)) = target {
        agent
            .pod_api
            .remove_network_entry(&p.namespace, &p.name, &key)
            .await
            .map_err(|e| {
                agent.metrics.failure("kube_api");
                kube_err(&e)
            })?;
    }
    if record.is_some() {
        info!(container = %req.container_id, ifname = %req.ifname, "DEL done");
    }
    Ok(())
}

/// CHECK: the lease must exist and (with apply) be configured.
pub async fn check(agent: &Arc<Agent>, req: CniRequest) -> Result<(), CniError> {
    agent.metrics.cni_request("check");
    let h = agent.handle(&req.container_id, &req.ifname).ok_or_else(|| {
        CniError::new(
            code::CHECK_FAILED,
            format!(
                "no lease for container {} interface {}: the agent does not know this attachment",
                req.container_id, req.ifname
            ),
        )
    })?;
    let (rec, state) = {
        let l = lock(&h.live);
        (l.record.clone(), l.state)
    };
    let lease = rec.lease.ok_or_else(|| {
        CniError::new(
            code::CHECK_FAILED,
            format!(
                "the lease on {} is gone (state {state:?}); the agent is acquiring a new one",
                req.ifname
            ),
        )
    })?;
    if rec.config.ipam.apply && rec.workload == WorkloadKind::Pod {
        let ns = req
            .netns
            .as_ref()
            .ok_or_else(|| CniError::env("CNI_NETNS", "not set"))?;
        let present = apply::has_address(ns, &req.ifname, lease.address, lease.prefix_len)
            .await
            .map_err(|e| {
                CniError::new(code::CHECK_FAILED, format!("cannot inspect {}", req.ifname))
                    .with_details(e.to_string())
            })?;
        if !present {
            return Err(CniError::new(
                code::CHECK_FAILED,
                format!(
                    "address {}/{} is missing from {} in {}",
                    lease.address,
                    lease.prefix_len,
                    req.ifname,
                    ns.display()
                ),
            ));
        }
    }
    Ok(())
}

/// GC: drop attachments of this network that are not in the valid list.
pub async fn gc(agent: &Arc<Agent>, req: GcRequest) -> Result<GcReply, CniError> {
    agent.metrics.cni_request("gc");
    let valid = req.config.valid_attachments.clone().ok_or_else(|| {
        CniError::config("cni.dev/valid-attachments", "missing (required for GC)")
    })?;
    let mut removed = Vec::new();
    for h in agent.handles() {
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
                warn!(container = %rec.container_id, error = %e, "GC could not remove an attachment");
            }
        }
    }
    Ok(GcReply { removed })
}
