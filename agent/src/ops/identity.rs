//! Who an ADD without `CNI_ARGS` is for, found in Open vSwitch and the
//! node's pod watch.
//!
//! ovnkube-node execs the `dhcp` IPAM plugin with an empty `CNI_ARGS`: no
//! pod namespace, name or UID reaches the agent. It has put the pod's port
//! on the integration bridge first (`ConfigureOVS`), with the pod's
//! identity in the Interface's `external_ids`. So the agent follows the
//! request's interface to its port: the host end of the `CNI_NETNS` /
//! `CNI_IFNAME` veth → the `br-int` port of that name → `iface-id` (the
//! logical switch port: `<namespace>_<pod>` on the default network, the
//! NAD key with `-` and `/` as `.`, then `_<namespace>_<pod>`, on a
//! secondary one), `iface-id-ver` (the pod UID), `k8s.ovn.org/nad`,
//! `attached_mac` and `sandbox`. The pod object comes from the node's pod
//! watch ([`crate::kube::node_pods`]), else one read.
//!
//! A stale sandbox's ADD is refused: one whose container id is not the
//! sandbox OVS shows on the port (the sandbox was superseded), or whose
//! port was added for another UID than the pod of that name has now (the
//! pod was recreated). The lease record carries the UID; GC keeps an
//! attachment whose port OVS still shows for the same sandbox and pod
//! ([`in_use`]).
//!
//! The `pod-networks` entry of such an attachment is ovnkube-node's to
//! write (it reports the result the plugin returns); the agent writes none.

use std::time::Duration;

use tracing::{debug, info};
use xdhcp_ovsdb::{NodeState, WorkloadPort};

use crate::kube::PodInfo;
use crate::lease::persist::LeaseRecord;
use crate::ops::context::Agent;
use crate::ops::error::{Error, Refusal};
use crate::ops::report::Deadline;
use crate::rpc::CniRequest;

/// How long an ADD waits for the agent's view of Open vSwitch to show the
/// request's port (ovnkube-node adds it before it execs the plugin, and
/// `ovs-vsctl` returns once the database has it; the view follows the
/// database within milliseconds). An interface no port is found for by
/// then is served without a pod. Without a database (none at `--ovsdb`,
/// or it is down) nothing is waited for.
const OVS_WAIT: Duration = Duration::from_millis(250);

/// What OVS says a port is for, read from its `external_ids`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PortIdentity {
    pub(crate) namespace: String,
    pub(crate) name: String,
    /// `iface-id-ver`.
    pub(crate) uid: Option<String>,
    /// `k8s.ovn.org/nad` (secondary networks).
    pub(crate) nad: Option<String>,
    /// `attached_mac`.
    pub(crate) mac: Option<[u8; 6]>,
    /// The port (the host end of the pod's veth).
    pub(crate) port: String,
}

/// An ADD's pod, found from OVS.
#[derive(Debug, Clone)]
pub(crate) struct Found {
    pub(crate) port: PortIdentity,
    /// The pod object (its UID is the port's).
    pub(crate) pod: PodInfo,
}

/// The prefix OVN-Kubernetes puts before `<namespace>_<pod>` in the
/// logical port of a secondary network's attachment (its
/// `GetSecondaryNetworkPrefix`): the NAD key with `-` and `/` as `.`, then
/// `_`.
fn secondary_prefix(nad: &str) -> String {
    format!("{}_", nad.replace(['-', '/'], "."))
}

/// The pod a logical port (`iface-id`) names, with `nad` the port's
/// `k8s.ovn.org/nad` (none, or `default`, on the default network).
/// Namespace and pod names are DNS names: neither has a `_`.
pub(crate) fn pod_of_logical_port(
    iface_id: &str,
    nad: Option<&str>,
) -> Result<(String, String), String> {
    let rest = match nad.filter(|n| *n != "default") {
        Some(nad) => {
            let prefix = secondary_prefix(nad);
            iface_id.strip_prefix(&prefix).ok_or_else(|| {
                format!("it does not start with {prefix:?}, the prefix of NAD {nad}")
            })?
        }
        None => iface_id,
    };
    match rest.split_once('_') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('_') => {
            Ok((ns.to_owned(), name.to_owned()))
        }
        _ => Err("it is not <namespace>_<pod>".to_owned()),
    }
}

/// What `port` says it is for; refused when it names another sandbox than
/// `container_id`'s (a stale sandbox's ADD).
pub(crate) fn read_port(
    port: &WorkloadPort,
    container_id: &str,
    ifname: &str,
) -> Result<PortIdentity, Refusal> {
    if let Some(sandbox) = port.sandbox.as_deref()
        && sandbox != container_id
    {
        return Err(Refusal::StaleSandbox {
            container_id: container_id.to_owned(),
            ifname: ifname.to_owned(),
            port: port.ifname.clone(),
            sandbox: sandbox.to_owned(),
        });
    }
    let (namespace, name) =
        pod_of_logical_port(&port.iface_id, port.nad.as_deref()).map_err(|why| {
            Refusal::LogicalPort {
                port: port.ifname.clone(),
                iface_id: port.iface_id.clone(),
                why,
            }
        })?;
    Ok(PortIdentity {
        namespace,
        name,
        uid: port.pod_uid.clone(),
        nad: port.nad.clone(),
        mac: port.attached_mac.map(|m| m.0),
        port: port.ifname.clone(),
    })
}

/// Refused when the pod `info` (the one of that name now) is not the pod
/// the port was added for.
pub(crate) fn same_pod(port: &PortIdentity, info: &PodInfo) -> Result<(), Refusal> {
    match (&port.uid, &info.uid) {
        (Some(ours), Some(theirs)) if ours != theirs => Err(Refusal::RecreatedPod {
            pod: format!("{}/{}", port.namespace, port.name),
            port: port.port.clone(),
            port_uid: ours.clone(),
            pod_uid: theirs.clone(),
        }),
        _ => Ok(()),
    }
}

/// The workload port named `host_ifname`, once the view shows it (at most
/// `within`; none as soon as the database is found unavailable).
async fn port_named(agent: &Agent, host_ifname: &str, within: Duration) -> Option<WorkloadPort> {
    let mut rx = agent.node_ovs.clone();
    let shows = |s: &NodeState| match s {
        NodeState::Ready(v) => v.workload(host_ifname).is_some(),
        NodeState::Unavailable { reason } => reason != "connecting",
    };
    let state = tokio::time::timeout(within, rx.wait_for(shows))
        .await
        .ok()?
        .ok()?;
    match &*state {
        NodeState::Ready(v) => v.workload(host_ifname).cloned(),
        NodeState::Unavailable { .. } => None,
    }
}

/// The pod `port` names: from the node's pod watch when it has that pod
/// with the port's UID, else read (within the deadline): before the
/// watch's first list, while it cannot list (no RBAC for it), for a pod it
/// has not seen yet, or one it shows with another UID (which may be
/// stale).
async fn pod_object(
    agent: &Agent,
    port: &PortIdentity,
    deadline: Deadline,
) -> Result<PodInfo, Error> {
    let (ns, name) = (port.namespace.as_str(), port.name.as_str());
    if let Some(pods) = &agent.node_pods
        && pods.listed()
        && let Some(info) = pods.get(ns, name)
        && info.uid.is_some()
        && info.uid == port.uid
    {
        return Ok(info);
    }
    deadline
        .kube(
            agent.metrics(),
            || format!("reading pod {ns}/{name}"),
            agent.pod_api.get_pod(ns, name),
        )
        .await
}

/// The pod of `req`'s interface, from OVS; `None` when OVS shows no port
/// for it (no Open vSwitch, or an interface on something else than the
/// integration bridge): the ADD is then served without a pod, as before.
pub(crate) async fn from_ovs(
    agent: &Agent,
    req: &CniRequest,
    deadline: Deadline,
) -> Result<Option<Found>, Error> {
    let Some(netns) = req.netns.as_deref() else {
        return Ok(None);
    };
    // No database to ask (once the watch has tried): nothing to find.
    if matches!(&*agent.node_ovs.borrow(), NodeState::Unavailable { reason } if reason != "connecting")
    {
        return Ok(None);
    }
    let host =
        match crate::guard::host_end(netns, &req.ifname, crate::netlink::PeerLookup::NotLooked)
            .await
        {
            Ok(Some(host)) => host,
            Ok(None) => return Ok(None),
            Err(e) => {
                debug!(ifname = %req.ifname, error = %crate::rpc::format_chain(&e),
                "no host end found for the interface; no pod identity from Open vSwitch");
                return Ok(None);
            }
        };
    let Some(port) = port_named(agent, &host, OVS_WAIT.min(deadline.left())).await else {
        debug!(ifname = %req.ifname, port = %host, "Open vSwitch shows no workload port for the interface");
        return Ok(None);
    };
    // OVN-Kubernetes' CNI always writes the sandbox; a port without one is
    // another's, whose `iface-id` this does not read.
    if port.sandbox.is_none() {
        debug!(ifname = %req.ifname, port = %host, "the interface's port names no sandbox: not OVN-Kubernetes'; no pod from it");
        return Ok(None);
    }
    let refused = |source: Refusal| {
        agent.metrics().failure("refused");
        tracing::warn!(container = %req.container_id, ifname = %req.ifname, error = %source, "ADD refused");
        Error::Refused { source }
    };
    let port = read_port(&port, &req.container_id, &req.ifname).map_err(refused)?;
    let pod = pod_object(agent, &port, deadline).await?;
    same_pod(&port, &pod).map_err(refused)?;
    info!(container = %req.container_id, ifname = %req.ifname, port = %port.port,
        pod = %format!("{}/{}", port.namespace, port.name), uid = port.uid.as_deref().unwrap_or("-"),
        nad = port.nad.as_deref().unwrap_or("-"), network = %req.config.name,
        "the ADD's pod found in Open vSwitch");
    Ok(Some(Found { port, pod }))
}

/// Whether `rec`'s attachment is in use: Open vSwitch shows a port for its
/// sandbox and interface, added for the pod UID the record carries, and
/// that pod is on this node (when the node's pod watch has listed).
pub(crate) fn in_use(agent: &Agent, rec: &LeaseRecord) -> bool {
    let Some(uid) = rec.pod.as_ref().and_then(|p| p.uid.as_deref()) else {
        return false;
    };
    let shown = match &*agent.node_ovs.borrow() {
        NodeState::Ready(v) => v.workloads.iter().any(|w| {
            w.sandbox.as_deref() == Some(rec.container_id.as_str())
                && w.pod_uid.as_deref() == Some(uid)
                && w.pod_if_name
                    .as_deref()
                    .is_none_or(|n| n == rec.ifname.as_str())
        }),
        NodeState::Unavailable { .. } => false,
    };
    shown
        && agent
            .node_pods
            .as_ref()
            .is_none_or(|pods| !pods.listed() || pods.by_uid(uid).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(sandbox: &str, iface_id: &str, nad: Option<&str>) -> WorkloadPort {
        WorkloadPort {
            ifname: "5a4db0c00eeee_3".to_owned(),
            iface_id: iface_id.to_owned(),
            pod_uid: Some("uid-1".to_owned()),
            sandbox: Some(sandbox.to_owned()),
            attached_mac: Some(xdhcp_ovsdb::Mac([0x0a, 0x58, 0xc0, 0, 2, 5])),
            pod_if_name: Some("net1".to_owned()),
            network: nad.map(|n| n.replace('/', "_")),
            nad: nad.map(str::to_owned),
            vf_netdev_name: None,
            vf_is_vfio: false,
            ovn_installed: true,
        }
    }

    #[test]
    fn the_logical_port_names_the_pod_on_the_default_and_a_secondary_network() {
        assert_eq!(
            pod_of_logical_port("web_frontend-1", None),
            Ok(("web".to_owned(), "frontend-1".to_owned()))
        );
        assert_eq!(
            pod_of_logical_port("web_frontend-1", Some("default")),
            Ok(("web".to_owned(), "frontend-1".to_owned()))
        );
        // The NAD's `-` and `/` are `.` in the prefix; the namespace and
        // pod keep theirs.
        assert_eq!(
            pod_of_logical_port("my.ns.loc.dhcp_my-ns_pod-1", Some("my-ns/loc-dhcp")),
            Ok(("my-ns".to_owned(), "pod-1".to_owned()))
        );
        // A repeated attachment key.
        assert_eq!(
            pod_of_logical_port("ns.nad.1_ns_p", Some("ns/nad/1")),
            Ok(("ns".to_owned(), "p".to_owned()))
        );
    }

    #[test]
    fn a_logical_port_of_another_shape_names_no_pod() {
        for (id, nad) in [
            ("other.nad_ns_p", Some("ns/nad")),
            ("nsp", None),
            ("_p", None),
            ("ns_", None),
            ("a_b_c", None),
        ] {
            assert!(pod_of_logical_port(id, nad).is_err(), "{id} {nad:?}");
        }
    }

    #[test]
    fn the_port_of_another_sandbox_refuses_the_add() {
        let p = port(
            "sandbox-new",
            "lab.ns.localnet1_lab-ns_pod1",
            Some("lab-ns/localnet1"),
        );
        let ok = read_port(&p, "sandbox-new", "net1").unwrap();
        assert_eq!(
            (ok.namespace.as_str(), ok.name.as_str(), ok.uid.as_deref()),
            ("lab-ns", "pod1", Some("uid-1"))
        );
        assert_eq!(ok.nad.as_deref(), Some("lab-ns/localnet1"));
        assert_eq!(ok.mac, Some([0x0a, 0x58, 0xc0, 0, 2, 5]));
        let e = read_port(&p, "sandbox-old", "net1").unwrap_err();
        assert!(matches!(e, Refusal::StaleSandbox { .. }), "{e}");
        let text = e.to_string();
        assert!(
            text.contains("sandbox-old") && text.contains("sandbox-new"),
            "{text}"
        );
        // A logical port that names no pod is refused too, saying why.
        let bad = port("s", "something-else", Some("lab-ns/localnet1"));
        assert!(matches!(
            read_port(&bad, "s", "net1"),
            Err(Refusal::LogicalPort { .. })
        ));
    }

    #[test]
    fn a_recreated_pod_refuses_the_port_s_add() {
        let p = read_port(&port("s", "ns_p", None), "s", "eth0").unwrap();
        let info = |uid: Option<&str>| PodInfo {
            namespace: "ns".into(),
            name: "p".into(),
            uid: uid.map(str::to_owned),
            ..PodInfo::default()
        };
        assert!(same_pod(&p, &info(Some("uid-1"))).is_ok());
        let e = same_pod(&p, &info(Some("uid-2"))).unwrap_err();
        assert!(
            e.to_string().contains("uid-1") && e.to_string().contains("uid-2"),
            "{e}"
        );
        // No UID to compare (the embedded store): the port's stands.
        assert!(same_pod(&p, &info(None)).is_ok());
    }
}
