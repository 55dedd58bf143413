//! `"apply": true`: configure the leased address and routes on the pod
//! interface, check them (CHECK), put back what went missing (a renewal),
//! and take them away (DEL, lease lost) — with rtnetlink in the pod
//! namespace ([`crate::netlink`]).

use std::net::Ipv4Addr;
use std::path::Path;

use xdhcp_engine::{Ipv4Prefix, Lease};

use crate::netlink::{
    Dad6, Ipv4Route, KernelRoute, LinkDetails, MIN_IPV4_MTU, Netlink, NetlinkError, lease_routes,
};

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
    let (nl, ifindex) = open(Some(netns), ifname).await?;
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

/// What of a lease's configuration an interface lacks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Missing {
    /// The link is administratively down.
    pub up: bool,
    /// The MTU the lease asks for (option 26), when the link has another.
    pub mtu: Option<u32>,
    /// The leased address with its prefix length.
    pub address: bool,
    /// The lease's routes not there (on-link routes first, as
    /// [`Netlink::apply_lease`] adds them).
    pub routes: Vec<Ipv4Route>,
}

impl Missing {
    /// Nothing to put back.
    pub(crate) fn is_empty(&self) -> bool {
        *self == Missing::default()
    }
}

/// What `lease` (its routes with `metric`) lacks on `link`, given the
/// link's IPv4 `addresses` and the namespace's main-table `routes`: the
/// same pieces [`Netlink::apply_lease`] puts on, each compared as
/// [`Netlink::add_route`] would find it (destination, gateway, interface
/// and metric).
pub(crate) fn missing(
    lease: &Lease,
    metric: Option<u32>,
    link: &LinkDetails,
    addresses: &[(Ipv4Addr, u8)],
    routes: &[KernelRoute],
) -> Missing {
    let mtu = lease
        .mtu
        .filter(|m| *m >= MIN_IPV4_MTU)
        .map(u32::from)
        .filter(|m| link.mtu != Some(*m));
    let mut wanted = lease_routes(lease);
    wanted.sort_by_key(|r| r.gateway.is_some());
    let metric = metric.unwrap_or(0);
    Missing {
        up: !link.up,
        mtu,
        address: !addresses.contains(&(lease.address, lease.prefix_len)),
        routes: wanted
            .into_iter()
            .filter(|w| {
                !routes.iter().any(|r| {
                    r.dest == w.dest
                        && r.prefix_len == w.prefix_len
                        && r.gateway == w.gateway
                        && r.oif == Some(link.ifindex)
                        && r.metric == metric
                })
            })
            .collect(),
    }
}

/// Put back what `ifname` in `netns` lacks of `lease`'s configuration (a
/// renewal: the kernel flushes a link's routes when it is taken down, and
/// nothing else restores them). Reads the link, its addresses and the
/// routes first, and writes only what is missing ([`missing`]): a renewal
/// of a configured interface changes nothing. Returns what was missing.
/// What was there is never taken off, even when putting a piece back
/// fails.
pub(crate) async fn repair(
    netns: &Path,
    ifname: &str,
    lease: &Lease,
    metric: Option<u32>,
) -> Result<Missing, NetlinkError> {
    let nl = Netlink::open(Some(netns)).await?;
    let link = nl.link(ifname).await?;
    let addresses = nl.addresses(link.ifindex).await?;
    let routes = nl.routes().await?;
    let lacks = missing(lease, metric, &link, &addresses, &routes);
    if lacks.up {
        nl.set_up(link.ifindex).await?;
    }
    if let Some(mtu) = lacks.mtu
        && let Err(error) = nl.set_mtu(link.ifindex, mtu).await
    {
        tracing::warn!(ifname, mtu, %error, "MTU from the lease (option 26) not applied");
    }
    if lacks.address {
        nl.add_address(link.ifindex, lease.address, lease.prefix_len)
            .await?;
    }
    for route in &lacks.routes {
        nl.add_route(link.ifindex, *route, metric).await?;
    }
    Ok(lacks)
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
    let (nl, ifindex) = open(Some(netns), ifname).await?;
    nl.has_address(ifindex, address, Some(prefix_len)).await
}

/// Remove the leased address and its routes; missing pieces are fine.
pub(crate) async fn deconfigure(
    netns: &Path,
    ifname: &str,
    lease: &Lease,
    metric: Option<u32>,
) -> Result<(), NetlinkError> {
    let (nl, ifindex) = open(Some(netns), ifname).await?;
    nl.remove_lease(ifindex, lease, metric).await
}

/// Take `address` off `ifname`, whatever its prefix length: the address
/// a previous agent's REQUEST was out for, which it may have configured
/// before it died (its record names the address, not yet the lease). The
/// kernel takes the link's routes with its last address. Whether it was
/// there.
pub(crate) async fn take_off_requested(
    netns: &Path,
    ifname: &str,
    address: Ipv4Addr,
) -> Result<bool, NetlinkError> {
    let (nl, ifindex) = open(Some(netns), ifname).await?;
    nl.del_address_of_any_prefix(ifindex, address).await
}

/// How a `DHCPv6` lease is configured: its address with the network's
/// prefix length (a /128 without one), and a default route when the
/// network names a gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Address6 {
    pub(crate) address: std::net::Ipv6Addr,
    pub(crate) prefix_len: u8,
    pub(crate) gateway: Option<std::net::Ipv6Addr>,
    pub(crate) metric: Option<u32>,
}

/// How `network` configures `lease`: the prefix length and gateway the
/// network names; else what the link's router advertisements give the
/// address (`router`: its on-link prefix, else /128; the default router);
/// else a /128 with no route. The metric is the network's.
pub(crate) fn address6(
    network: &crate::model::Network,
    lease: &xdhcp_engine::v6::Lease,
    router: Option<xdhcp_engine::v6::ra::Router6>,
) -> Address6 {
    let v6 = network.ipam.ipv6.unwrap_or_default();
    let (prefix_len, gateway) = match (v6.prefix_length, router) {
        (Some(len), _) => (len, v6.gateway),
        (None, Some(r)) => (r.prefix_len.unwrap_or(128), r.gateway),
        (None, None) => (128, None),
    };
    Address6 {
        address: lease.address,
        prefix_len,
        gateway,
        metric: network.ipam.route_priority,
    }
}

/// Whether `network` leaves the prefix length and router to the link's
/// router advertisements (it names no prefix length).
pub(crate) fn wants_router(network: &crate::model::Network) -> bool {
    network
        .ipam
        .ipv6
        .unwrap_or_default()
        .prefix_length
        .is_none()
}

/// Configure `a` on `ifname` in `netns`: link up, the address, the
/// default route. What went on before a failure is taken off again.
///
/// With `dad` (a new address), the address goes on tentative and the
/// kernel's duplicate address detection runs (RFC 4862 §5.4: up to
/// `rtr_solicit_delay` at random, then `dad_transmits` solicitations
/// `retrans_time` apart; 1–2 s with the defaults), waited for at most
/// `dad`: another node holding the address takes it off again and answers
/// [`Dad6::Duplicate`] (for the lease to be declined); one still tentative
/// by then is kept and answered [`Dad6::Tentative`]. Without it the
/// address goes on `nodad` ([`Dad6::Unique`]): a renewal of an address the
/// interface holds already.
pub(crate) async fn configure6(
    netns: Option<&Path>,
    ifname: &str,
    a: Address6,
    dad: Option<std::time::Duration>,
) -> Result<Dad6, NetlinkError> {
    // With detection, the socket hears the namespace's address changes
    // from before the address goes on, so no notice of its outcome is
    // missed.
    let (nl, mut changes) = if dad.is_some() {
        let (nl, changes) = Netlink::open_watching6(netns).await?;
        (nl, Some(changes))
    } else {
        (Netlink::open(netns).await?, None)
    };
    let ifindex = nl.link(ifname).await?.ifindex;
    let done = async {
        nl.set_up(ifindex).await?;
        nl.add_address6(ifindex, a.address, a.prefix_len, dad.is_some())
            .await?;
        let state = match (dad, changes.as_mut()) {
            (Some(limit), Some(changes)) => {
                let read = || nl.dad6(ifindex, a.address);
                settled6(changes, read, ifindex, a.address, limit).await?
            }
            _ => Dad6::Unique,
        };
        if state == Dad6::Duplicate {
            nl.del_address6(ifindex, a.address, a.prefix_len).await?;
            return Ok(state);
        }
        if let Some(gw) = a.gateway {
            nl.add_default_route6(ifindex, gw, a.metric).await?;
        }
        Ok(state)
    }
    .await;
    if done.is_err()
        && let Err(undo) = remove6(&nl, ifindex, a).await
    {
        tracing::warn!(error = %crate::rpc::format_chain(&undo),
            "could not take off a partly applied IPv6 lease");
    }
    done
}

/// How often the address's flags are read again while the kernel's
/// notices are heard: a safety net for a notice lost (a full socket
/// buffer), never what decides the wait otherwise.
const DAD_RECHECK: std::time::Duration = std::time::Duration::from_millis(250);
/// How often they are read once the notices have ended (their socket
/// failed).
const DAD_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Waits (at most `limit`) until `addr` on `ifindex` is no longer
/// tentative; its state then. The wait ends on the kernel's notice of the
/// change (`changes`, opened before the address went on), not on a timer:
/// the detection's outcome is acted on the moment the kernel has it. The
/// state is read (`read`) first, in case the detection ended before the
/// wait began, and again every [`DAD_RECHECK`] (every [`DAD_POLL`] once the
/// notices have ended).
pub(crate) async fn settled6<R, F>(
    changes: &mut crate::netlink::Addr6Events,
    mut read: R,
    ifindex: u32,
    addr: std::net::Ipv6Addr,
    limit: std::time::Duration,
) -> Result<Dad6, NetlinkError>
where
    R: FnMut() -> F,
    F: std::future::Future<Output = Result<Dad6, NetlinkError>>,
{
    let until = tokio::time::Instant::now() + limit;
    let mut state = read().await?;
    let mut hearing = true;
    while state == Dad6::Tentative && tokio::time::Instant::now() < until {
        let every = if hearing { DAD_RECHECK } else { DAD_POLL };
        let recheck = (tokio::time::Instant::now() + every).min(until);
        tokio::select! {
            change = changes.next_where(|c| c.ifindex == ifindex && c.address == addr), if hearing => {
                hearing = change.is_some();
                state = match change {
                    Some(c) => c.state,
                    None => read().await?,
                };
            }
            () = tokio::time::sleep_until(recheck) => state = read().await?,
        }
    }
    Ok(state)
}

/// Take `a` off `ifname` in `netns`; missing pieces are fine.
pub(crate) async fn deconfigure6(
    netns: Option<&Path>,
    ifname: &str,
    a: Address6,
) -> Result<(), NetlinkError> {
    let (nl, ifindex) = open(netns, ifname).await?;
    remove6(&nl, ifindex, a).await
}

async fn remove6(nl: &Netlink, ifindex: u32, a: Address6) -> Result<(), NetlinkError> {
    if let Some(gw) = a.gateway {
        nl.del_default_route6(ifindex, gw, a.metric).await?;
    }
    nl.del_address6(ifindex, a.address, a.prefix_len).await?;
    Ok(())
}

/// Whether `ifname` carries `a`'s address with its prefix length.
pub(crate) async fn has_address6(
    netns: Option<&Path>,
    ifname: &str,
    a: Address6,
) -> Result<bool, NetlinkError> {
    let (nl, ifindex) = open(netns, ifname).await?;
    nl.has_address6(ifindex, a.address, a.prefix_len).await
}

/// rtnetlink in `netns`, and the index of `ifname` there.
async fn open(netns: Option<&Path>, ifname: &str) -> Result<(Netlink, u32), NetlinkError> {
    let nl = Netlink::open(netns).await?;
    let ifindex = nl.link(ifname).await?.ifindex;
    Ok((nl, ifindex))
}

#[cfg(test)]
mod tests {
    use super::*;

    const IF: u32 = 7;

    /// 192.0.2.10/24 with router 192.0.2.1, and option 121 `routes`.
    fn lease(routes: Vec<xdhcp_engine::Route>) -> Lease {
        Lease {
            routers: vec![Ipv4Addr::new(192, 0, 2, 1)],
            routes,
            ..crate::lease::persist::tests::lease()
        }
    }

    fn link(up: bool, mtu: u32) -> LinkDetails {
        LinkDetails {
            ifindex: IF,
            name: "eth0".into(),
            mac: None,
            kind: Some("veth".into()),
            mtu: Some(mtu),
            up,
            running: up,
            master: None,
        }
    }

    fn kernel(r: Ipv4Route, oif: u32, metric: u32) -> KernelRoute {
        KernelRoute {
            dest: r.dest,
            prefix_len: r.prefix_len,
            gateway: r.gateway,
            oif: Some(oif),
            metric,
        }
    }

    fn default_via(gw: [u8; 4]) -> Ipv4Route {
        Ipv4Route {
            dest: Ipv4Addr::UNSPECIFIED,
            prefix_len: 0,
            gateway: Some(gw.into()),
        }
    }

    #[test]
    fn a_configured_interface_lacks_nothing() {
        let l = lease(vec![]);
        let present = [kernel(default_via([192, 0, 2, 1]), IF, 0)];
        let m = missing(&l, None, &link(true, 1500), &[(l.address, 24)], &present);
        assert!(m.is_empty(), "{m:?}");
        // With a metric, the route of that metric is the lease's.
        let present = [kernel(default_via([192, 0, 2, 1]), IF, 200)];
        assert!(
            missing(
                &l,
                Some(200),
                &link(true, 1500),
                &[(l.address, 24)],
                &present
            )
            .is_empty()
        );
    }

    #[test]
    fn a_flapped_link_lacks_its_routes_and_keeps_its_address() {
        let l = lease(vec![]);
        let m = missing(&l, None, &link(true, 1500), &[(l.address, 24)], &[]);
        assert_eq!(
            m,
            Missing {
                routes: vec![default_via([192, 0, 2, 1])],
                ..Missing::default()
            }
        );
    }

    #[test]
    fn a_route_like_the_leases_but_not_it_does_not_count() {
        let l = lease(vec![]);
        let want = default_via([192, 0, 2, 1]);
        for other in [
            kernel(want, IF + 1, 0),                    // another interface's
            kernel(default_via([192, 0, 2, 9]), IF, 0), // another gateway
            kernel(want, IF, 100),                      // another metric
        ] {
            let m = missing(
                &l,
                None,
                &link(true, 1500),
                &[(l.address, 24)],
                std::slice::from_ref(&other),
            );
            assert_eq!(m.routes, vec![want], "{other}");
        }
    }

    #[test]
    fn everything_missing_is_put_back_in_apply_order() {
        let on_link = xdhcp_engine::Route {
            dest: Ipv4Addr::new(203, 0, 113, 0),
            prefix_len: 24,
            gateway: Ipv4Addr::UNSPECIFIED,
        };
        let via = xdhcp_engine::Route {
            dest: Ipv4Addr::new(198, 51, 100, 0),
            prefix_len: 24,
            gateway: Ipv4Addr::new(203, 0, 113, 1),
        };
        let mut l = lease(vec![via, on_link]);
        l.mtu = Some(1400);
        // Down, another MTU, the address with another prefix length only.
        let m = missing(&l, None, &link(false, 1500), &[(l.address, 16)], &[]);
        assert_eq!(
            m,
            Missing {
                up: true,
                mtu: Some(1400),
                address: true,
                routes: vec![
                    Ipv4Route {
                        dest: on_link.dest,
                        prefix_len: 24,
                        gateway: None
                    },
                    Ipv4Route {
                        dest: via.dest,
                        prefix_len: 24,
                        gateway: Some(via.gateway)
                    },
                ],
            }
        );
        // An MTU below IPv4's minimum is never applied, so never missing.
        l.mtu = Some(MIN_IPV4_MTU - 1);
        assert_eq!(missing(&l, None, &link(true, 1500), &[], &[]).mtu, None);
    }

    /// Detection's outcome as the kernel announces it, against a state
    /// read by hand (`reads` counts the reads).
    mod settled6 {
        use super::super::{DAD_POLL, DAD_RECHECK, settled6};
        use crate::netlink::{Dad6, FakeAddr6};
        use rtnetlink::packet_route::address::AddressFlags;
        use std::net::Ipv6Addr;
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::time::Duration;
        use tokio::time::Instant;

        const ADDR: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x10);
        const LIMIT: Duration = Duration::from_secs(3);

        /// A read that always finds the address tentative, and its count.
        fn tentative() -> (
            Arc<AtomicUsize>,
            impl FnMut() -> std::future::Ready<Result<Dad6, crate::netlink::NetlinkError>>,
        ) {
            let reads = Arc::new(AtomicUsize::new(0));
            let counted = reads.clone();
            let read = move || {
                counted.fetch_add(1, Ordering::Relaxed);
                std::future::ready(Ok(Dad6::Tentative))
            };
            (reads, read)
        }

        #[tokio::test(start_paused = true)]
        async fn the_wait_ends_on_the_kernels_notice_not_on_a_timer() {
            let (kernel, mut changes) = FakeAddr6::new();
            let (reads, read) = tentative();
            let start = Instant::now();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(7)).await;
                // Another address, then another link: neither ends the wait.
                kernel.announce(super::IF, Ipv6Addr::LOCALHOST, AddressFlags::empty());
                kernel.announce(super::IF + 1, ADDR, AddressFlags::empty());
                tokio::time::sleep(Duration::from_millis(1300)).await;
                kernel.announce(super::IF, ADDR, AddressFlags::Tentative);
                kernel.announce(super::IF, ADDR, AddressFlags::Permanent);
                tokio::time::sleep(LIMIT).await;
            });
            let state = settled6(&mut changes, read, super::IF, ADDR, LIMIT)
                .await
                .unwrap();
            assert_eq!(state, Dad6::Unique);
            // At the notice, to the millisecond (a 20 ms poll would have
            // ended at 1320 ms).
            assert_eq!(start.elapsed(), Duration::from_millis(1307));
            // The first read, and one safety read per 250 ms before it.
            assert_eq!(
                reads.load(Ordering::Relaxed),
                1 + (1307 / DAD_RECHECK.as_millis()) as usize
            );
        }

        #[tokio::test(start_paused = true)]
        async fn a_duplicate_and_a_removed_address_end_the_wait_at_once() {
            let (kernel, mut changes) = FakeAddr6::new();
            let (_, read) = tentative();
            kernel.announce(
                super::IF,
                ADDR,
                AddressFlags::Tentative | AddressFlags::Dadfailed,
            );
            let start = Instant::now();
            let state = settled6(&mut changes, read, super::IF, ADDR, LIMIT)
                .await
                .unwrap();
            assert_eq!((state, start.elapsed()), (Dad6::Duplicate, Duration::ZERO));

            let (_, read) = tentative();
            kernel.delete(super::IF, ADDR);
            let state = settled6(&mut changes, read, super::IF, ADDR, LIMIT)
                .await
                .unwrap();
            assert_eq!(state, Dad6::Gone);
        }

        #[tokio::test(start_paused = true)]
        async fn a_detection_over_before_the_wait_is_not_waited_for() {
            let (_kernel, mut changes) = FakeAddr6::new();
            let read = || std::future::ready(Ok(Dad6::Unique));
            let start = Instant::now();
            let state = settled6(&mut changes, read, super::IF, ADDR, LIMIT)
                .await
                .unwrap();
            assert_eq!((state, start.elapsed()), (Dad6::Unique, Duration::ZERO));
        }

        #[tokio::test(start_paused = true)]
        async fn without_notices_the_state_is_read_until_the_limit() {
            let (kernel, mut changes) = FakeAddr6::new();
            // The subscription ends (its socket failed): reads take over.
            drop(kernel);
            let (reads, read) = tentative();
            let start = Instant::now();
            let state = settled6(&mut changes, read, super::IF, ADDR, LIMIT)
                .await
                .unwrap();
            assert_eq!((state, start.elapsed()), (Dad6::Tentative, LIMIT));
            let polls = (LIMIT.as_millis() / DAD_POLL.as_millis()) as usize;
            assert!(reads.load(Ordering::Relaxed) >= polls, "{reads:?}");
        }
    }
}
