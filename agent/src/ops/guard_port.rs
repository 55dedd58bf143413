//! The DHCP guard on an attachment's port, as every ADD path (IPv4 and
//! IPv6, pods and VMs) and the recovery at start put it on.

use tracing::{info, warn};

use crate::cni::config::{DhcpGuardSpec, NetworkConfig};
use crate::datapath::link::{Link, PortPrepared};
use crate::guard::HostEnd;
use crate::netlink::PeerLookup;
use crate::ops::context::Agent;
use crate::rpc::CniRequest;

/// What the guard takes of a port's network: what its config asks
/// (`ipam.dhcpGuard`), and its names (a `DhcpGuardPolicy` names one).
pub(crate) struct PortNetwork {
    pub(crate) spec: DhcpGuardSpec,
    pub(crate) names: crate::guard::NetworkNames,
}

impl PortNetwork {
    /// An ADD's network: its config's `ipam.dhcpGuard`, `name` and
    /// `netAttachDefName`.
    pub(crate) fn of_config(c: &NetworkConfig) -> Self {
        Self::of(c.ipam.dhcp_guard, &c.name, c.net_attach_def_name.as_deref())
    }

    /// A lease record's network.
    pub(crate) fn of_record(n: &crate::model::Network) -> Self {
        Self::of(
            crate::ops::network::guard_spec(n.ipam.dhcp_guard),
            &n.name,
            n.net_attach_def_name.as_deref(),
        )
    }

    fn of(spec: DhcpGuardSpec, name: &str, nad: Option<&str>) -> Self {
        Self {
            spec,
            names: crate::guard::NetworkNames {
                nad: nad.map(str::to_owned),
                name: (!name.is_empty()).then(|| name.to_owned()),
            },
        }
    }
}

/// [`guard_port`] for an ADD's attachment: `req`'s container, interface
/// and network, its port in `netns`.
pub(crate) async fn guard_added(
    agent: &Agent,
    req: &CniRequest,
    netns: &std::path::Path,
    client: ([u8; 6], bool),
    end: HostEnd,
) {
    let network = PortNetwork::of_config(&req.config);
    guard_port(
        agent,
        &req.container_id,
        &req.ifname,
        netns,
        network,
        client,
        end,
    )
    .await;
}

/// Puts the DHCP guard on the host end of the attachment's port (its
/// network's `DhcpGuardPolicy` applied on what `network`'s config asks), with the
/// single-client rule on `client`'s MAC (`(mac, vm)`: a VM's port also
/// learns). A port the guard cannot take is logged and counted, never a
/// failed ADD: the lease does not depend on it. `end`: the veth peer as
/// the link's trip left it, and what the lease's first DISCOVER waits for
/// (the port's `clsact` qdisc, made before the filters go on).
pub(crate) async fn guard_port(
    agent: &Agent,
    container_id: &str,
    ifname: &str,
    netns: &std::path::Path,
    network: PortNetwork,
    client: ([u8; 6], bool),
    end: HostEnd,
) {
    let (mac, vm) = client;
    let policy = crate::guard::port_policy(&network.spec, Some(mac), vm);
    match agent
        .guard
        .protect(container_id, ifname, netns, end, policy, network.names)
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

/// A pod's first frame held until the guard has made its host port's
/// `clsact` qdisc: creating it deactivates the port for a moment, and a
/// reply arriving then would be dropped (`PortPrepared`); only the qdisc
/// is made before the first DISCOVER leaves, the filter goes on beside the
/// exchange. A port of a bridge the guard serves has it already (made
/// ready before its ADD): nothing is held. `None` without the guard.
pub(crate) fn first_send_held(
    agent: &Agent,
    link: &mut Link,
    peer: &PeerLookup,
) -> Option<PortPrepared> {
    let ready = peer
        .host_ifindex()
        .is_some_and(|port| agent.guard.made_ready(port));
    (agent.guard.is_on() && !ready).then(|| link.hold_first_send())
}
