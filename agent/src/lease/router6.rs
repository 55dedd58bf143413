//! What an IPv6 lease learns from the link's routers: the router
//! advertisements heard on the attachment's interface (solicited at the
//! start), kept one per router, from which the lease's address takes its
//! on-link prefix and default router ([`Router6::for_address`]) when the
//! network names no prefix length.
//!
//! One thing: the advertisements of one attachment, heard and asked for.

use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info, warn};
use xdhcp_engine::v6::ra::{Router6, RouterAdvert, router_solicitation};

use crate::datapath::icmp6::RouterSocket;
use crate::metrics::Metrics;

/// When router solicitations go out, from the task's start: one at once,
/// two more if no advertisement came (RFC 4861 §6.3.7 allows three; its
/// 4 s interval is shortened for the first, which an ADD may wait on).
const SOLICIT_AT: [Duration; 3] = [
    Duration::ZERO,
    Duration::from_secs(1),
    Duration::from_secs(5),
];

/// How long a first lease waits, from the task's start, for an
/// advertisement giving its address a prefix or router (routers answer a
/// solicitation within 0.5 s, RFC 4861 §6.2.6); past it, the lease is
/// configured with what is known (a /128 with no route when nothing).
pub(crate) const FIRST_WAIT: Duration = Duration::from_secs(2);

/// At most this many routers are remembered (the newest kept).
const MAX_ROUTERS: usize = 8;

/// The advertisements of one attachment's link.
#[derive(Debug)]
pub(crate) struct Routers {
    sock: RouterSocket,
    mac: [u8; 6],
    started: Instant,
    /// Solicitations sent so far.
    solicited: usize,
    /// One per router, oldest first.
    heard: Vec<RouterAdvert>,
}

impl Routers {
    /// Listen on `ifname` (index `ifindex`) in `netns` (`None`: the agent's
    /// own) for a workload with
    /// link-layer address `mac`. A socket that cannot be opened is logged
    /// and the lease goes on without advertisements.
    pub(crate) async fn open(
        netns: Option<&Path>,
        ifname: &str,
        ifindex: u32,
        mac: [u8; 6],
    ) -> Option<Self> {
        match RouterSocket::open(netns, ifname, ifindex).await {
            Ok(sock) => Some(Self {
                sock,
                mac,
                started: Instant::now(),
                solicited: 0,
                heard: Vec::new(),
            }),
            Err(e) => {
                warn!(error = %crate::rpc::format_chain(&e),
                    "cannot hear router advertisements; the IPv6 lease gets no prefix or router from them");
                None
            }
        }
    }

    /// Until the next advertisement is believed (sending the solicitations
    /// when due); pends forever without one. A message that fails RFC 4861's
    /// checks is counted under its reason and dropped.
    pub(crate) async fn next(&mut self, metrics: &Metrics) {
        loop {
            let due = SOLICIT_AT.get(self.solicited).map(|at| self.started + *at);
            let solicit = async {
                match due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = solicit => {
                    self.solicited += 1;
                    if let Err(e) = self.sock.solicit(&router_solicitation(self.mac)).await {
                        debug!(error = %e, "router solicitation not sent");
                    }
                }
                got = self.sock.recv() => match got {
                    Ok(r) => match RouterAdvert::parse(&r.icmp, r.source, r.hop_limit) {
                        Ok(ra) => {
                            self.remember(ra);
                            return;
                        }
                        Err(e) => {
                            metrics.dropped(e.label(), 1);
                            debug!(source = %r.source, error = %e, "router advertisement dropped");
                        }
                    },
                    Err(e) => {
                        warn!(error = %e, "router advertisement socket failed; no more are heard");
                        std::future::pending::<()>().await;
                    }
                },
            }
        }
    }

    /// What the advertisements heard give `address`.
    pub(crate) fn for_address(&self, address: std::net::Ipv6Addr) -> Option<Router6> {
        Router6::for_address(&self.heard, address)
    }

    /// Until the advertisements give `address` a prefix or router, or
    /// [`FIRST_WAIT`] after the start: what they give it then.
    pub(crate) async fn wait_for(
        &mut self,
        address: std::net::Ipv6Addr,
        metrics: &Metrics,
    ) -> Option<Router6> {
        let until = self.started + FIRST_WAIT;
        while self.for_address(address).is_none() {
            tokio::select! {
                () = tokio::time::sleep_until(until) => {
                    info!(%address, waited = ?FIRST_WAIT,
                        "no router advertisement gave the DHCPv6 address a prefix or router");
                    return None;
                }
                () = self.next(metrics) => {}
            }
        }
        self.for_address(address)
    }

    fn remember(&mut self, ra: RouterAdvert) {
        debug!(router = %ra.router, lifetime = ?ra.router_lifetime, prefixes = ra.prefixes.len(),
            "router advertisement");
        self.heard.retain(|h| h.router != ra.router);
        if self.heard.len() == MAX_ROUTERS {
            self.heard.remove(0);
        }
        self.heard.push(ra);
    }
}
