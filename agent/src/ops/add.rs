//! The CNI operations as the agent performs them: ADD, DEL, CHECK, GC.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};
use xdhcp_engine::Mode;

use crate::cni::config::{Family, NetworkConfig};
use crate::cni::types::CniResult;
use crate::datapath::link::{Link, Sockets};
use crate::guard::HostEnd;
use crate::kube::network_key;
use crate::lease::acquire::Acquisition;
use crate::lease::apply;
use crate::lease::persist::{self, LeaseRecord, PodRef, WorkloadKind};
use crate::lease::registry::Handle;
use crate::ops::context::Agent;
use crate::ops::error::{Error, Place};
use crate::ops::guard_port::{first_send_held, guard_added};
use crate::ops::network::fresh_record;
use crate::ops::report::{
    Bound, Deadline, Phases, ReportTo, cni_result, kube_error, report_address, report_address6,
    report_and_record,
};
use crate::ops::vm;
use crate::rpc::{CniRequest, GcReply, GcRequest};
use crate::sys::sync::lock;
use crate::workload::{MacAddr, MigrationTarget, Workload};

/// Who an ADD is for.
struct Who {
    pod: Option<PodRef>,
    workload: Workload,
    annotation_key: Option<String>,
    /// A live-migration target launcher pod's migration.
    migration: Option<MigrationTarget>,
    /// The UID of the VMI the pod's owner reference names.
    owner_uid: Option<String>,
}

impl Who {
    /// The VM pod this ADD is for, owned by VMI `vmi_name`.
    fn vm_pod(&self, vmi_name: &str) -> vm::VmPod {
        vm::VmPod {
            pod: self.pod.clone(),
            annotation_key: self.annotation_key.clone(),
            vmi_name: vmi_name.to_owned(),
            owner_uid: self.owner_uid.clone(),
            migration: self.migration.clone(),
        }
    }
}

/// Ask the API (kube) or `CNI_ARGS` + local store (embedded) who this is;
/// without `CNI_ARGS` (ovnkube-node's call), Open vSwitch and the node's
/// pod watch (`identity.rs`; the network's NAD is then the port's).
async fn who(agent: &Agent, req: &mut CniRequest, deadline: Deadline) -> Result<Who, Error> {
    let Some((ns, name)) = req.pod() else {
        let found = crate::ops::identity::from_ovs(agent, req, deadline).await?;
        let Some(found) = found else {
            return Ok(Who {
                pod: None,
                workload: Workload::Pod,
                annotation_key: None,
                migration: None,
                owner_uid: None,
            });
        };
        crate::ops::trust::on_this_node(agent, &found.pod)?;
        if req.config.net_attach_def_name.is_none() {
            req.config.net_attach_def_name.clone_from(&found.port.nad);
        }
        // The entry is ovnkube-node's to write: no annotation key.
        return Ok(Who {
            workload: found.pod.workload(),
            migration: found.pod.migration_target(),
            owner_uid: found.pod.owner_vmi_uid.clone(),
            pod: Some(PodRef {
                namespace: found.port.namespace,
                name: found.port.name,
                uid: found.port.uid.or(found.pod.uid),
            }),
            annotation_key: None,
        });
    };
    let info = deadline
        .kube(
            agent.metrics(),
            || format!("reading pod {ns}/{name}"),
            agent.pod_api.get_pod(ns, name),
        )
        .await?;
    crate::ops::trust::on_this_node(agent, &info)?;
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
        owner_uid: info.owner_vmi_uid.clone(),
    })
}

/// The `pod-networks` key of `config` for a pod in `pod_ns`.
#[expect(
    clippy::result_large_err,
    reason = "a failed CNI operation is rare; its error goes straight to the socket"
)]
fn annotation_key(config: &NetworkConfig, pod_ns: &str) -> Result<String, Error> {
    network_key(config.net_attach_def_name.as_deref(), pod_ns, &config.name)
        .map_err(|source| Error::AnnotationKey { source })
}

/// How long before the caller stops waiting an ADD answers at the latest
/// (its Kubernetes calls are cut off there).
const ANSWER_SLACK: Duration = Duration::from_secs(1);

/// The deadline of an ADD whose caller told no wait: this beyond the
/// acquisition's timeout (the plugin waits that timeout plus 15 s).
const UNTOLD_MARGIN: Duration = Duration::from_secs(14);

/// ADD, within the caller's `wait` (the plugin tells it; see
/// [`crate::rpc::HEADER_WAIT_MS`]).
pub(crate) async fn add(
    agent: &Arc<Agent>,
    mut req: CniRequest,
    wait: Option<Duration>,
) -> Result<CniResult, Error> {
    agent.metrics().cni_request("add");
    let deadline = add_deadline(agent, &req, wait);
    let mut phases = Phases::start();
    tracing::debug!(container = %req.container_id, ifname = %req.ifname, "ADD received");
    // Held to the end of the ADD. A repeated ADD for a bound attachment
    // returns the same result, once its address is reported again.
    let begun = agent.leases.begin(&req.container_id, &req.ifname).await;
    if !begun.bound.is_empty() {
        return again(agent, &req, &begun.bound, deadline).await;
    }
    let netns = req.netns.clone().ok_or(Error::NoNetns)?;
    let who = who(agent, &mut req, deadline).await?;
    phases.who = phases.lap();

    if req.config.ipam.family.has_ipv6() {
        return add_v6(agent, &req, who, netns, deadline, phases).await;
    }

    // A VM whose VF is passed through (vfio-pci): DORA during a driver handoff.
    if let Workload::Vm { vmi_name } = &who.workload
        && let Some(pci) = vm::vfio_device(agent, &req, who.pod.as_ref())?
    {
        let target = who.vm_pod(vmi_name);
        return Box::pin(vm::add_vfio(agent, &req, target, pci, deadline, phases)).await;
    }

    let place = Place::Pod {
        ifname: req.ifname.clone(),
        netns: netns.clone(),
    };
    let pod = who.workload == Workload::Pod;
    // One trip into the pod's namespace opens the link (a pod's with its
    // own receiver) and finds its veth peer (the port the guard goes on).
    let sockets = if pod {
        Sockets::SenderAndReceiver
    } else {
        Sockets::Sender
    };
    let mut link = Link::open_looking(Some(&netns), &req.ifname, sockets, true)
        .map_err(|source| Error::interface(agent.metrics(), place, source))?;
    phases.open = phases.lap();
    tracing::debug!(ifindex = link.info.ifindex, "link open");
    // A pod's port is guarded while its lease is acquired: the pod's own
    // processes start only after the ADD answers, so the guard has to be
    // on by then, not before the agent's own DORA. (The attach's cost is
    // the kernel's: its first filter on the port's new qdisc waits for an
    // expedited RCU grace period. Beside the DORA a server's round trip
    // hides it; in line, before or after the DORA, it is on every pod's
    // ADD path — measured after the DORA, it cost as much as it saves.)
    // A VM's guard needs the VM's MAC and goes on before its one-shot
    // discovery, in `bind`.
    let pod_peer = link.take_veth_peer_if(pod);
    let prepared = pod
        .then(|| first_send_held(agent, &mut link, &pod_peer))
        .flatten();
    // The pod's one client: the agent's own exchanges for it carry this MAC.
    let pod_mac = link.info.mac;
    let pod_guard = async {
        if pod {
            let started = std::time::Instant::now();
            guard_added(
                agent,
                &req,
                &netns,
                (pod_mac, false),
                HostEnd {
                    peer: pod_peer,
                    prepared,
                },
            )
            .await;
            u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX)
        } else {
            0
        }
    };
    let bind = bind(agent, &req, &who, link, &netns, deadline, &mut phases);
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
        netns: Some(&netns),
        release: kind == WorkloadKind::Pod,
    };
    let to = ReportTo {
        pod: who.pod.as_ref(),
        key: who.annotation_key.as_deref(),
    };
    let result = report_and_record(agent, &req, to, &bound, deadline, &mut phases).await?;
    phases.observe(agent.metrics());
    info!(container = %req.container_id, ifname = %req.ifname, address = %lease.address,
        mac = %MacAddr(mac), who_us = phases.who, open_us = phases.open, guard_us = phases.guard,
        protect_us = phases.protect, slot_us = phases.slot, start_us = phases.start,
        offer_us = phases.offer, ack_us = phases.ack, apply_us = phases.apply,
        report_us = phases.report, durable_us = phases.durable,
        total_us = phases.total(), "ADD done");
    Ok(result)
}

/// The ADD's one deadline: just inside the caller's `wait`; without one,
/// the acquisition's timeout (the network's, else the agent's) and a
/// margin.
fn add_deadline(agent: &Agent, req: &CniRequest, wait: Option<Duration>) -> Deadline {
    Deadline::after(wait.map_or_else(
        || {
            req.config
                .ipam
                .timeout
                .unwrap_or(agent.base.acquire_timeout)
                + UNTOLD_MARGIN
        },
        |w| w.saturating_sub(ANSWER_SLACK),
    ))
}

/// ADD on an IPv6 network (one DHCPv6 lease) or a dual-stack one (a
/// DHCPv4 and a DHCPv6 lease): a pod's leases, or a VM's one-shot
/// discoveries on the launcher pod's netdev, or, for a VM whose VF is
/// passed through with `vfio-pci`, on the VF's netdev during its driver
/// handoff.
async fn add_v6(
    agent: &Arc<Agent>,
    req: &CniRequest,
    who: Who,
    netns: std::path::PathBuf,
    deadline: Deadline,
    phases: Phases,
) -> Result<CniResult, Error> {
    let family = req.config.ipam.family;
    if let Workload::Vm { vmi_name } = &who.workload {
        let target = who.vm_pod(vmi_name);
        // A VM whose VF is passed through (vfio-pci): the discoveries run
        // on the VF's netdev during a driver handoff.
        if let Some(pci) = vm::vfio_device(agent, req, who.pod.as_ref())? {
            return Box::pin(vm::add_vfio(agent, req, target, pci, deadline, phases)).await;
        }
        return Box::pin(crate::ops::vm6::add(agent, req, target, netns, deadline)).await;
    }
    let to = crate::ops::add6::For {
        pod: who.pod,
        annotation_key: who.annotation_key,
    };
    // Boxed: the IPv4 path's future is large enough without these in it.
    if family == Family::Dual {
        return Box::pin(crate::ops::add_dual::add(
            agent, req, to, netns, deadline, phases,
        ))
        .await;
    }
    Box::pin(crate::ops::add6::add(
        agent, req, to, netns, deadline, phases,
    ))
    .await
}

/// A repeated ADD of an attachment that holds a lease: the runtime retrying
/// after its caller gave up, or after the agent was killed between the
/// lease and its report. The first ADD may never have written the
/// `pod-networks` entry, so it is written again (the write is idempotent)
/// before the same result is returned; if it cannot be, the ADD fails and
/// the lease stays for the runtime's DEL or the next retry.
async fn again(
    agent: &Arc<Agent>,
    req: &CniRequest,
    records: &[LeaseRecord],
    deadline: Deadline,
) -> Result<CniResult, Error> {
    if let [r4, r6] = records {
        return again_dual(agent, req, (r4, r6), deadline).await;
    }
    let Some(rec) = records.first() else {
        return Err(Error::LeaseGone {
            ifname: req.ifname.clone(),
            state: "without a lease".to_owned(),
        });
    };
    if let Some(lease) = &rec.lease6 {
        if let (Some(pod), Some(key)) = (&rec.pod, &rec.annotation_key) {
            let a = crate::lease::v6::address6(&rec.network, lease, rec.router6);
            let write =
                report_address6(&*agent.pod_api, pod, key, a, rec.mac, rec.netns.as_deref());
            report_again(agent, pod, deadline, write).await?;
        }
        info!(container = %req.container_id, ifname = %req.ifname, address = %lease.address,
            "repeated ADD: the DHCPv6 lease held, its address reported again");
        return Ok(crate::ops::add6::cni_result6(
            lease,
            rec.router6,
            &req.config,
        ));
    }
    let Some(lease) = &rec.lease else {
        return Err(Error::LeaseGone {
            ifname: req.ifname.clone(),
            state: "without a lease".to_owned(),
        });
    };
    if let (Some(pod), Some(key)) = (&rec.pod, &rec.annotation_key) {
        let write = report_address(
            &*agent.pod_api,
            pod,
            key,
            lease,
            rec.mac,
            rec.netns.as_deref(),
        );
        report_again(agent, pod, deadline, write).await?;
    }
    info!(container = %req.container_id, ifname = %req.ifname, address = %lease.address,
        "repeated ADD: the lease held, its address reported again");
    Ok(cni_result(lease, &req.config))
}

/// A repeated ADD of a dual-stack attachment holding both its leases
/// (`r4`, `r6`): both addresses reported again, the same result.
async fn again_dual(
    agent: &Arc<Agent>,
    req: &CniRequest,
    (r4, r6): (&LeaseRecord, &LeaseRecord),
    deadline: Deadline,
) -> Result<CniResult, Error> {
    let (Some(l4), Some(l6)) = (&r4.lease, &r6.lease6) else {
        return Err(Error::LeaseGone {
            ifname: req.ifname.clone(),
            state: "without both of its dual-stack leases".to_owned(),
        });
    };
    if let (Some(pod), Some(key)) = (&r4.pod, &r4.annotation_key) {
        let a6 = crate::lease::v6::address6(&r6.network, l6, r6.router6);
        let write = crate::ops::report::report_address_dual(
            &*agent.pod_api,
            pod,
            key,
            (l4, a6),
            r4.mac,
            r4.netns.as_deref(),
        );
        report_again(agent, pod, deadline, write).await?;
    }
    info!(container = %req.container_id, ifname = %req.ifname, address = %l4.address,
        address6 = %l6.address, "repeated ADD: both dual-stack leases held, their addresses reported again");
    Ok(crate::ops::add_dual::result(
        l4,
        l6,
        r6.router6,
        &req.config,
    ))
}

/// A repeated ADD's write of `pod`'s `pod-networks` entry (`write`, either
/// family's), within the ADD's deadline.
async fn report_again(
    agent: &Agent,
    pod: &PodRef,
    deadline: Deadline,
    write: impl std::future::Future<Output = Result<(), crate::kube::PodApiError>>,
) -> Result<(), Error> {
    let what = || {
        format!(
            "writing the pod-networks entry of pod {}/{} again",
            pod.namespace, pod.name
        )
    };
    deadline.kube(agent.metrics(), what, write).await
}

/// Acquire the lease on the attachment's opened interface (a VM's guard
/// goes on first: it needs the VM's MAC).
async fn bind(
    agent: &Arc<Agent>,
    req: &CniRequest,
    who: &Who,
    mut link: Link,
    netns: &std::path::Path,
    deadline: Deadline,
    phases: &mut Phases,
) -> Result<(Handle, xdhcp_engine::Lease, [u8; 6], WorkloadKind), Error> {
    let (mac, mode, requested, kind) = match &who.workload {
        Workload::Pod => (link.info.mac, Mode::Maintain, None, WorkloadKind::Pod),
        Workload::Vm { vmi_name } => {
            let (mac, requested) =
                vm::identity_on_pod_netdev(agent, &who.vm_pod(vmi_name), link.info.mac, deadline)
                    .await?;
            guard_added(
                agent,
                req,
                netns,
                (mac, true),
                HostEnd::of(link.take_veth_peer()),
            )
            .await;
            phases.guard = phases.lap();
            let kind = WorkloadKind::Vm {
                vmi: vmi_name.clone(),
            };
            (mac, Mode::OneShot, requested, kind)
        }
    };
    let record = fresh_record(
        req,
        who.pod.clone(),
        kind.clone(),
        (mac, crate::model::Family::Ipv4),
        who.annotation_key.clone(),
    );
    let acquisition = Acquisition {
        record,
        mode,
        requested,
        link: link.with_src_mac(mac),
    };
    let place = Place::Pod {
        ifname: req.ifname.clone(),
        netns: netns.to_owned(),
    };
    let acquired = agent
        .leases
        .acquire_timed(&agent.pacing, &agent.base, acquisition)
        .await
        .map_err(|f| Error::acquisition(place, &req.config.name, f))?;
    phases.dora = phases.lap();
    phases.acquired(&acquired);
    Ok((acquired.handle, acquired.lease, mac, kind))
}

/// DEL: RELEASE (pods; each lease of a dual-stack attachment, at once),
/// forget, remove the annotation entry. Idempotent.
pub(crate) async fn del(agent: &Arc<Agent>, req: CniRequest) -> Result<(), Error> {
    agent.metrics().cni_request("del");
    let _guard = agent.leases.key_lock(&req.container_id, &req.ifname).await;
    let handles = agent.leases.attachment(&req.container_id, &req.ifname);
    let records: Vec<LeaseRecord> = handles
        .iter()
        .map(|h| lock(&h.live).record.clone())
        .collect();
    // Tests: a DEL still under way when the agent is told to stop.
    #[cfg(feature = "test-hooks")]
    if !handles.is_empty() {
        let held = crate::sys::test_delay::from_env("XDHCP_TEST_DEL_DELAY_MS");
        if !held.is_zero() {
            info!(ms = held.as_millis(), "DEL held (test hook)");
            tokio::time::sleep(held).await;
        }
    }
    let ended = futures::future::join_all(
        handles
            .iter()
            .zip(&records)
            .map(|(h, rec)| end_lease(agent, &req, h, rec)),
    )
    .await;
    ended.into_iter().collect::<Result<Vec<()>, Error>>()?;
    let record = records.into_iter().next();
    agent.guard.release(&req.container_id, &req.ifname);
    // A VM's learned binding goes with its attachment.
    if let Some(rec) = record.as_ref().filter(|r| r.workload != WorkloadKind::Pod) {
        agent.guard.forget_learned(rec.mac);
    }
    persist::remove_attachment(&agent.svc.store, &req.container_id, &req.ifname).map_err(
        |source| Error::Store {
            op: "remove",
            source,
        },
    )?;
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
            .map_err(|e| kube_error(agent.metrics(), e))?;
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

/// DEL of one lease of the attachment: its task stopped (RELEASE, for a
/// pod), forgotten, and its DHCPv4 address taken off (`apply`; a DHCPv6
/// task takes its own off).
async fn end_lease(
    agent: &Arc<Agent>,
    req: &CniRequest,
    h: &Handle,
    rec: &LeaseRecord,
) -> Result<(), Error> {
    let release = rec.workload == WorkloadKind::Pod;
    // A task that did not take the Stop sent no RELEASE. If this agent
    // is stopping, the task ended keeping its lease for the next agent:
    // so does this DEL, answering "try again later", which the plugin
    // waits through; the next agent resumes the lease and releases it
    // at the DEL repeated to it. Else the task was parked (the pod
    // interface went before DEL, the bridge plugin's order, whether
    // before the lookup above or just after it): the lease is released
    // through the uplink that carried it.
    let stopped = agent.leases.stop(h, release).await;
    if !stopped && release && agent.svc.token.is_cancelled() {
        info!(container = %req.container_id, ifname = %req.ifname,
            "DEL during shutdown: the lease is kept for the next agent, which releases it");
        return Err(Error::ShuttingDown);
    }
    // The record as the stopped task left it.
    let ended = lock(&h.live).record.clone();
    if !stopped && release {
        crate::lease::parked::release(&agent.svc, &agent.base, &ended);
    }
    agent
        .leases
        .forget(&req.container_id, &req.ifname, h.generation);
    if release
        && rec.network.ipam.apply
        && let Some(ns) = &req.netns
    {
        take_off(ns, &req.ifname, &ended).await;
    }
    Ok(())
}

/// DEL with `apply`: take off the pod interface what the stopped task's
/// record says went on it. Its lease's address and routes; else, with no
/// lease yet, the address its REQUEST was out for. That is a record a
/// previous agent wrote ahead and then died, maybe after configuring the
/// address (its ADD failed; the runtime's DEL for it comes to this agent,
/// whose own request for the address had not been answered): left on, the
/// interface carries it beside the next ADD's address.
async fn take_off(netns: &std::path::Path, ifname: &str, rec: &LeaseRecord) {
    let taken = match (&rec.lease, rec.requested) {
        (Some(l), _) => apply::deconfigure(netns, ifname, l, rec.network.ipam.route_priority).await,
        (None, Some(address)) => match apply::take_off_requested(netns, ifname, address).await {
            Ok(true) => {
                info!(%address, "took off the address a previous agent configured before its lease was recorded");
                Ok(())
            }
            other => other.map(drop),
        },
        (None, None) => Ok(()),
    };
    if let Err(e) = taken {
        warn!(error = %crate::rpc::format_chain(&e), "could not remove the address at DEL");
    }
}

/// CHECK: a lease xdhcp holds must be bound and (with apply) configured;
/// on a dual-stack network, both.
/// An attachment xdhcp holds no lease for passes with a log line: it was
/// leased before xdhcp took over the node (by the upstream daemon), and
/// failing its CHECK would have the runtime tear down a working pod.
pub(crate) async fn check(agent: &Arc<Agent>, req: CniRequest) -> Result<(), Error> {
    agent.metrics().cni_request("check");
    // After the attachment's record is resumed, if the agent is starting.
    drop(agent.leases.key_lock(&req.container_id, &req.ifname).await);
    let handles = agent.leases.attachment(&req.container_id, &req.ifname);
    if handles.is_empty() {
        info!(container = %req.container_id, ifname = %req.ifname, network = %req.config.name,
            "CHECK for an attachment xdhcp holds no lease for (leased before xdhcp took over?): nothing to check");
        return Ok(());
    }
    if req.config.ipam.family == Family::Dual && handles.len() < 2 {
        return Err(Error::LeaseGone {
            ifname: req.ifname.clone(),
            state: "holding one of its two dual-stack leases".to_owned(),
        });
    }
    for h in handles {
        let (rec, state) = {
            let l = lock(&h.live);
            (l.record.clone(), l.state)
        };
        if h.family == crate::model::Family::Ipv6 {
            check6(&req, rec, state).await?;
        } else {
            check4(&req, rec, state).await?;
        }
    }
    Ok(())
}

/// CHECK of an attachment's DHCPv4 lease: held and (with apply, for a pod)
/// its address on the interface.
async fn check4(
    req: &CniRequest,
    rec: persist::LeaseRecord,
    state: crate::lease::live::EngineState,
) -> Result<(), Error> {
    let lease = rec.lease.ok_or_else(|| Error::LeaseGone {
        ifname: req.ifname.clone(),
        state: format!("{state:?}"),
    })?;
    if rec.network.ipam.apply && rec.workload == WorkloadKind::Pod {
        let ns = req.netns.as_ref().ok_or(Error::NoNetns)?;
        let present = apply::has_address(ns, &req.ifname, lease.address, lease.prefix_len).await;
        return on_interface(req, ns, (lease.address.into(), lease.prefix_len), present);
    }
    Ok(())
}

/// CHECK's verdict on whether the leased `address` (with its prefix
/// length) is on the interface in `ns`, as `present` says.
#[expect(
    clippy::result_large_err,
    reason = "a failed CNI operation is rare; its error goes straight to the socket"
)]
fn on_interface(
    req: &CniRequest,
    ns: &std::path::Path,
    address: (std::net::IpAddr, u8),
    present: Result<bool, crate::netlink::NetlinkError>,
) -> Result<(), Error> {
    let present = present.map_err(|source| Error::Inspect {
        ifname: req.ifname.clone(),
        source,
    })?;
    if present {
        return Ok(());
    }
    Err(Error::AddressMissing {
        address: address.0,
        prefix_len: address.1,
        ifname: req.ifname.clone(),
        netns: ns.to_path_buf(),
    })
}

/// CHECK of an IPv6 attachment: its lease held and (with apply, for a pod)
/// its address on the interface.
async fn check6(
    req: &CniRequest,
    rec: persist::LeaseRecord,
    state: crate::lease::live::EngineState,
) -> Result<(), Error> {
    let lease = rec.lease6.ok_or_else(|| Error::LeaseGone {
        ifname: req.ifname.clone(),
        state: format!("{state:?}"),
    })?;
    if rec.network.ipam.apply && rec.workload == WorkloadKind::Pod {
        let ns = req.netns.as_ref().ok_or(Error::NoNetns)?;
        let a = crate::lease::v6::address6(&rec.network, &lease, rec.router6);
        let present = apply::has_address6(Some(ns), &req.ifname, a).await;
        return on_interface(req, ns, (a.address.into(), a.prefix_len), present);
    }
    Ok(())
}

/// GC: drop attachments of this network that are not in the valid list.
pub(crate) async fn gc(agent: &Arc<Agent>, req: GcRequest) -> Result<GcReply, Error> {
    agent.metrics().cni_request("gc");
    // It looks at every attachment: after every record is resumed.
    agent.leases.wait_recovered().await;
    let valid = req
        .config
        .valid_attachments
        .clone()
        .ok_or(Error::NoValidAttachments)?;
    let mut removed = Vec::new();
    for h in agent.leases.all() {
        let rec = lock(&h.live).record.clone();
        if rec.network.name != req.config.name {
            continue;
        }
        let att = crate::cni::config::Attachment {
            container_id: rec.container_id.clone(),
            ifname: rec.ifname.clone(),
        };
        // A dual-stack attachment's second lease: its DEL ended both.
        if valid.contains(&att) || removed.contains(&att) {
            continue;
        }
        // Open vSwitch still shows its port for this sandbox and pod: in use.
        if crate::ops::identity::in_use(agent, &rec) {
            info!(container = %rec.container_id, ifname = %rec.ifname,
                "GC keeps an attachment not in the valid list: Open vSwitch shows its port for the same sandbox and pod");
            continue;
        }
        let del_req = CniRequest {
            container_id: rec.container_id.clone(),
            ifname: rec.ifname.clone(),
            netns: rec.netns.clone().filter(|p| p.exists()),
            args: rec.args.clone(),
            // The network's configuration as GC gives it (the same network).
            config: req.config.clone(),
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
