//! `"apply": true`: configure the leased address and routes on the pod
//! interface, check them (CHECK), and take them away (DEL, lease lost) —
//! with rtnetlink in the pod namespace ([`crate::netlink`]).

use std::net::Ipv4Addr;
use std::path::Path;

use xdhcp_engine::Lease;

use crate::netlink::{Netlink, NetlinkError, lease_routes};

/// Configure `lease` on `ifname` in `netns`: link up, MTU (option 26),
/// address, then routes (option 121, else a default route via option 3).
pub(crate) async fn configure(
    netns: &Path,
    ifname: &str,
    lease: &Lease,
) -> Result<(), NetlinkError> {
    let (nl, ifindex) = open(netns, ifname).await?;
    nl.apply_lease(ifindex, lease).await
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
) -> Result<(), NetlinkError> {
    let (nl, ifindex) = open(netns, ifname).await?;
    nl.remove_lease(ifindex, lease).await
}

/// rtnetlink in `netns`, and the index of `ifname` there.
async fn open(netns: &Path, ifname: &str) -> Result<(Netlink, u32), NetlinkError> {
    let nl = Netlink::open(Some(netns)).await?;
    let ifindex = nl.link(ifname).await?.ifindex;
    Ok((nl, ifindex))
}
