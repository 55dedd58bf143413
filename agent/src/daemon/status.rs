//! What the agent reports about itself: `xdhcp leases`, `xdhcp status`.

use std::collections::BTreeMap;

use crate::datapath::capture::CapturePath;
use crate::datapath::ebpf::AttachTarget;
use crate::kube::PodApi;
use crate::ops::context::Agent;
use crate::rpc::{AgentStatus, GuardedPortStatus, InterfaceStatus, LeaseView};
use crate::sys::sync::lock;

/// The `xdhcp leases` rows, sorted by attachment.
pub(crate) fn leases(agent: &Agent) -> Vec<LeaseView> {
    let mut v: Vec<LeaseView> = agent
        .leases
        .all()
        .iter()
        .map(|h| lock(&h.live).view())
        .collect();
    v.sort_by(|x, y| (&x.container_id, &x.ifname).cmp(&(&y.container_id, &y.ifname)));
    v
}

/// Per-interface datapath view.
fn interfaces(agent: &Agent) -> Vec<InterfaceStatus> {
    agent
        .leases
        .all()
        .iter()
        .map(|h| {
            let l = lock(&h.live);
            let bpf_link = match &l.capture {
                CapturePath::Ebpf(_) => agent.capture().link_id(&AttachTarget {
                    ifname: l.record.ifname.clone(),
                    netns: l.record.netns.clone(),
                }),
                CapturePath::Port(port) => agent.capture().link_id(&AttachTarget {
                    ifname: port.to_string(),
                    netns: None,
                }),
                _ => None,
            };
            InterfaceStatus {
                container_id: l.record.container_id.clone(),
                ifname: l.record.ifname.clone(),
                netns: l.record.netns.clone(),
                attach: l.capture.to_string(),
                bpf_link,
            }
        })
        .collect()
}

/// Agent and kernel counters.
fn counters(agent: &Agent) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (k, v) in agent.capture().kernel_counters().unwrap_or_default() {
        out.insert(format!("kernel.{k}"), v);
    }
    out.insert("agent.leases".into(), agent.leases.len() as u64);
    out.insert("agent.routed_xids".into(), agent.capture().routed() as u64);
    out
}

/// `xdhcp status` (reads kernel maps and the embedded store: call it off
/// the async workers).
pub(crate) fn status(agent: &Agent) -> AgentStatus {
    let annotations = match &agent.pod_api {
        PodApi::Embedded(s) => s
            .load()
            .ok()
            .and_then(|st| serde_json::to_value(st).ok())
            .unwrap_or(serde_json::Value::Null),
        PodApi::Kube(_) => serde_json::Value::Null,
    };
    AgentStatus {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        ready: agent.health.ready().is_ok() && agent.health.degraded().is_none(),
        state_recovered: agent.health.recovered(),
        datapath: agent.capture().name().to_owned(),
        datapath_note: agent.capture().note().map(str::to_owned),
        degraded: agent.health.degraded(),
        pod_api: if agent.pod_api.is_kube() {
            "kubernetes"
        } else {
            "embedded"
        }
        .to_owned(),
        socket: agent.args.socket.clone(),
        state_dir: agent.args.state_dir.clone(),
        leases: agent.leases.len(),
        leases_by_family: leases_by_family(agent),
        interfaces: interfaces(agent),
        uplinks: agent.capture().uplink_status(),
        guarded_ports: guarded_ports(agent),
        port_captures: agent.capture().found_port_status(),
        uplink_source: agent
            .uplink_source
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone(),
        counters: counters(agent),
        annotations,
    }
}

/// How many leases of each family the agent holds.
fn leases_by_family(agent: &Agent) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for h in agent.leases.all() {
        let family = lock(&h.live).record.family();
        *by.entry(family.label().to_owned()).or_insert(0) += 1;
    }
    by
}

/// The ports the guard is on, and where each one's identity came from.
fn guarded_ports(agent: &Agent) -> Vec<GuardedPortStatus> {
    let counters: BTreeMap<String, _> = agent
        .guard
        .snapshot()
        .into_iter()
        .map(|(p, c)| (p.host_ifname, c))
        .collect();
    agent
        .guard
        .ports()
        .into_iter()
        .map(|((container_id, ifname), p)| {
            let ovs = p.identity.ovs.clone().unwrap_or_default();
            let drops = counters
                .get(&p.host_ifname)
                .map(|c| {
                    c.drops()
                        .into_iter()
                        .filter(|&(_, _, n)| n > 0)
                        .map(|(family, reason, n)| (format!("{family}.{reason}"), n))
                        .collect()
                })
                .unwrap_or_default();
            GuardedPortStatus {
                port: p.host_ifname.clone(),
                identity: p.identity.label().to_owned(),
                container_id,
                ifname,
                network: ovs.network,
                nad: ovs.nad,
                pod_uid: ovs.pod_uid,
                mac: ovs.mac.map(crate::bindings::format_mac),
                vf_netdev_name: ovs.vf_netdev_name,
                vf_is_vfio: ovs.vf_is_vfio,
                learning: p.policy.learn,
                drops,
            }
        })
        .collect()
}

/// The `xdhcp bindings` rows: [`bindings`], each with where its port's
/// identity came from (`ovs`, `cni`, `both`) when the guard is on it.
pub(crate) fn binding_rows(agent: &Agent) -> Vec<crate::bindings::BindingRow> {
    bindings(agent)
        .into_iter()
        .map(|binding| crate::bindings::BindingRow {
            family: crate::bindings::family_of(binding.ip).to_owned(),
            identity: binding
                .port
                .as_deref()
                .and_then(|port| agent.guard.port_on(port))
                .map(|p| p.identity.label().to_owned()),
            binding,
        })
        .collect()
}

/// The binding table: every lease the agent holds (pods and VMs' one-shot
/// discoveries), then every binding learned from a guest, by MAC.
pub(crate) fn bindings(agent: &Agent) -> Vec<crate::bindings::Binding> {
    use crate::bindings::{Binding, BindingSource, format_mac};
    let now = crate::sys::clock::now_unix_ms();
    let learned = agent
        .guard
        .learned
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .rows(now);
    let mut rows: Vec<Binding> = agent
        .leases
        .all()
        .iter()
        .filter_map(|h| {
            let l = lock(&h.live);
            let rec = &l.record;
            let ip: std::net::IpAddr = match (&rec.lease, &rec.lease6) {
                (Some(lease), _) => lease.address.into(),
                (None, Some(lease)) => lease.address.into(),
                (None, None) => return None,
            };
            Some(Binding {
                mac: format_mac(rec.mac),
                ip,
                port: agent
                    .guard
                    .port_for(&rec.container_id, &rec.ifname)
                    .map(|p| p.host_ifname),
                pod: rec
                    .pod
                    .as_ref()
                    .map(|p| format!("{}/{}", p.namespace, p.name)),
                expires_unix_ms: l.expires_unix_ms,
                source: BindingSource::Leased,
                replaced: None,
            })
        })
        .collect();
    rows.sort_by(|a, b| (&a.mac, a.ip).cmp(&(&b.mac, b.ip)));
    rows.extend(learned);
    rows
}

/// How often the guard's kernel counters (and the store's) are copied into
/// the metrics.
const METRICS_PERIOD: std::time::Duration = std::time::Duration::from_secs(2);

/// Copies the guard's per-port counters, its learning filter's counters,
/// the binding table and the lease store's barrier counts into the metrics
/// until shutdown.
pub(crate) async fn export_metrics(
    agent: std::sync::Arc<crate::ops::context::Agent>,
    token: tokio_util::sync::CancellationToken,
) {
    loop {
        let a = agent.clone();
        let snap = tokio::task::spawn_blocking(move || {
            (a.guard.snapshot(), a.guard.learn_counters(), bindings(&a))
        })
        .await;
        if let Ok((snap, learn, bindings)) = snap {
            if let Some(learn) = learn {
                agent.metrics().learn_skipped_snapshot(&learn.labelled());
            }
            let rows: Vec<_> = snap
                .iter()
                .map(|(p, c)| (p.host_ifname.clone(), c.passed(), c.drops()))
                .collect();
            agent.metrics().guard_snapshot(&rows);
            agent.metrics().bindings_snapshot(&bindings);
        }
        let store = &agent.svc.store;
        agent
            .metrics()
            .store_snapshot(store.syncs_total(), store.sync_failures());
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(METRICS_PERIOD) => {}
        }
    }
}
