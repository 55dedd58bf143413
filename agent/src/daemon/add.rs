//! The CNI operations as the agent performs them: ADD, DEL, CHECK, GC.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};
use xdhcp_engine::Mode;

use super::acquire::{self, Request, cni_result, report_address};
use super::context::Agent;
use super::error::{Error, Place};
use super::lease::apply;
use super::lease::persist::{self, PodRef, WorkloadKind};
use super::lease::task::lock;
use super::vm;
use crate::cni::config::NetworkConfig;
use crate::cni::types::CniResult;
use crate::kube::network_key;
use crate::rpc::{CniRequest, GcReply, GcRequest};
use crate::workload::{MacAddr, Workload, vm_dhcp_identity};

/// How long ADD waits for the first lease record to reach the disk.
const PERSIST_WAIT: Duration = Duration::from_secs(5);

fn kube(agent: &Agent, source: crate::kube::PodApiError) -> Error {
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
}

/// Ask the API (kube) or `CNI_ARGS` + local store (embedded) who this is.
async fn who(agent: &Agent, req: &CniRequest) -> Result<Who, Error> {
    let Some((ns, name)) = req.pod() else {
        return Ok(Who {
            pod: None,
            workload: Workload::Pod,
            annotation_key: None,
        });
    };
    let info = agent
        .pod_api
        .get_pod(ns, name)
        .await
        .map_err(|e| kube(agent, e))?;
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
    })
}

/// ADD.
pub(crate) async fn add(agent: &Arc<Agent>, req: CniRequest) -> Result<CniResult, Error> {
    agent.metrics().cni_request("add");
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
    let who = who(agent, &req).await?;

    // A VM whose VF is passed through (vfio-pci): DORA during a driver handoff.
    if let Workload::Vm { vmi_name } = &who.workload
        && let Some(pci) = vm::vfio_device(agent, &req, who.pod.as_ref())?
    {
        let target = vm::VmPod {
            pod: who.pod,
            annotation_key: who.annotation_key,
            vmi_name: vmi_name.clone(),
        };
        return vm::add_vfio(agent, &req, target, pci).await;
    }

    let place = Place::Pod {
        ifname: req.ifname.clone(),
        netns: netns.clone(),
    };
    let pod = who.workload == Workload::Pod;
    let link = acquire::open_link(agent, Some(&netns), &req.ifname, pod, &place).await?;
    tracing::debug!(ifindex = link.info.ifindex, "link open");
    let (mac, mode, requested, kind) = match &who.workload {
        Workload::Pod => (link.info.mac, Mode::Maintain, None, WorkloadKind::Pod),
        Workload::Vm { vmi_name } => {
            let ns = who.pod.as_ref().map_or("", |p| p.namespace.as_str());
            let vmi = agent
                .pod_api
                .get_vmi(ns, vmi_name)
                .await
                .map_err(|e| kube(agent, e))?;
            let key = who.annotation_key.clone().unwrap_or_default();
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
    // The guard is on the port before the first DHCP message of the lease.
    let vm_mac = (kind != WorkloadKind::Pod).then_some(mac);
    guard_port(
        agent,
        &req.container_id,
        &req.ifname,
        &netns,
        &req.config,
        vm_mac,
    )
    .await;
    let record = persist::fresh(
        &req,
        who.pod.clone(),
        kind.clone(),
        mac,
        who.annotation_key.clone(),
    );
    let request = Request {
        record,
        mode,
        requested,
        place,
    };
    let (handle, lease) = acquire::acquire(agent, request, link.with_src_mac(mac)).await?;

    // Report the address (pods and VMs alike).
    if let (Some(p), Some(key)) = (&who.pod, &who.annotation_key)
        && let Err(e) = report_address(agent, p, key, &lease, mac).await
    {
        // Give the address back: the pod cannot use an unreported address.
        let release = kind == WorkloadKind::Pod;
        acquire::abandon(agent, &req.container_id, &req.ifname, &handle, release).await;
        return Err(kube(agent, e));
    }
    // Answer only once the lease is on disk (a restart must resume it).
    if !handle.persisted(PERSIST_WAIT).await {
        warn!("the lease was not persisted within {PERSIST_WAIT:?}; answering anyway");
    }
    info!(container = %req.container_id, ifname = %req.ifname, address = %lease.address,
        mac = %MacAddr(mac), "ADD done");
    Ok(cni_result(&lease, &req.config))
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
) {
    let policy = super::guard::port_policy(&config.ipam.dhcp_guard, vm_mac);
    match agent
        .guard
        .protect(container_id, ifname, netns, policy)
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

/// DEL: RELEASE (pods), forget, remove the annotation entry. Idempotent.
pub(crate) async fn del(agent: &Arc<Agent>, req: CniRequest) -> Result<(), Error> {
    agent.metrics().cni_request("del");
    let _guard = agent.leases.key_lock(&req.container_id, &req.ifname).await;
    let handle = agent.leases.get(&req.container_id, &req.ifname);
    let record = handle.as_ref().map(|h| lock(&h.live).record.clone());
    if let (Some(h), Some(rec)) = (&handle, &record) {
        let release = rec.workload == WorkloadKind::Pod;
        agent.leases.stop(h, release).await;
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
            .map_err(|e| kube(agent, e))?;
    }
    if record.is_some() {
        info!(container = %req.container_id, ifname = %req.ifname, "DEL done");
    }
    Ok(())
}

/// CHECK: the lease must exist and (with apply) be configured.
pub(crate) async fn check(agent: &Arc<Agent>, req: CniRequest) -> Result<(), Error> {
    agent.metrics().cni_request("check");
    let h = agent
        .leases
        .get(&req.container_id, &req.ifname)
        .ok_or_else(|| Error::Unknown {
            container_id: req.container_id.clone(),
            ifname: req.ifname.clone(),
        })?;
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
