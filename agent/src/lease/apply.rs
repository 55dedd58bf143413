//! `"apply": true`: configure the leased address and routes on the pod
//! interface, check them (CHECK), and take them away (DEL, lease lost) —
//! with rtnetlink in the pod namespace ([`crate::netlink`]).

use std::net::Ipv4Addr;
use std::path::Path;

use xdhcp_engine::{Ipv4Prefix, Lease};

use crate::netlink::{Netlink, NetlinkError, lease_routes};

/// Configure `lease` on `ifname` in `netns`: link up, MTU (option 26),
/// address, then routes (option 121, else a default route via option 3)
/// with `metric` (the network's `ipam.priority`). A route already there
/// for the same destination and metric that is not ours is never replaced:
/// that is an error naming both routes.
pub(crate) async fn configure(
    netns: &Path,
    ifname: &str,
    lease: &Lease,
    metric: Option<u32>,
) -> Result<(), NetlinkError> {
    let (nl, ifindex) = open(netns, ifname).await?;
    if let Err(e) = nl.apply_lease(ifindex, lease, metric).await {
        // Take off what went on before the failure; the error is the news.
        if let Err(undo) = nl.remove_lease(ifindex, lease, metric).await {
            tracing::warn!(error = %crate::rpc::format_chain(&undo),
                "could not take off a partly applied lease");
        }
        return Err(e);
    }
    Ok(())
}

/// What a lease on `ifname` must not reroute, read in `netns` (the node's
/// namespace when `None`): every route of the pod's other interfaces and
/// their networks ([`Netlink::prefixes_to_protect`]). The pod's other
/// interfaces are there before this one (the primary network is set up
/// first). A namespace that cannot be read protects nothing more and says
/// so: the interface's own open fails right after with the real error.
pub(crate) async fn protected_in_pod(netns: Option<&Path>, ifname: &str) -> Vec<Ipv4Prefix> {
    let read = async {
        let nl = Netlink::open(netns).await?;
        let except = nl.link(ifname).await.ok().map(|l| l.ifindex);
        nl.prefixes_to_protect(except).await
    };
    match read.await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(ifname, error = %crate::rpc::format_chain(&e),
                "could not read the pod's other routes to protect them");
            Vec::new()
        }
    }
}

/// Routes as `(dst/len, gateway)` (`0.0.0.0` for on-link) for the CNI
/// result: the same set [`configure`] installs.
pub(crate) fn routes(lease: &Lease) -> Vec<(String, Ipv4Addr)> {
    lease_routes(lease)
        .into_iter()
        .map(|r| {
            (
                format!("{}/{}", r.dest, r.prefix_len),
                r.gateway.unwrap_or(Ipv4Addr::UNSPECIFIED),
            )
        })
        .collect()
}

/// Whether `ifname` carries `address/prefix_len`.
pub(crate) async fn has_address(
    netns: &Path,
    ifname: &str,
    address: Ipv4Addr,
    prefix_len: u8,
) -> Result<bool, NetlinkError> {
    let (nl, ifindex) = open(netns, ifname).await?;
    nl.has_address(ifindex, address, Some(prefix_len)).await
}

/// Remove the leased address and its routes; missing pieces are fine.
pub(crate) async fn deconfigure(
    netns: &Path,
    ifname: &str,
    lease: &Lease,
    metric: Option<u32>,
) -> Result<(), NetlinkError> {
    let (nl, ifindex) = open(netns, ifname).await?;
    nl.remove_lease(ifindex, lease, metric).await
}

/// rtnetlink in `netns`, and the index of `ifname` there.
async fn open(netns: &Path, ifname: &str) -> Result<(Netlink, u32), NetlinkError> {
    let nl = Netlink::open(Some(netns)).await?;
    let ifindex = nl.link(ifname).await?.ifindex;
    Ok((nl, ifindex))
}
