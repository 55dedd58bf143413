//! ADD on a dual-stack network (`"ipam": {"family": "dual"}`), for a pod:
//! the interface opened once in the pod's namespace, the DHCP guard on its
//! port, and two leases acquired at the same time — a DHCPv4 one through
//! the link as on an IPv4 network ([`crate::lease::acquire`]) and a
//! `DHCPv6` one through the pod's UDP socket ([`crate::lease::v6`]) — so
//! the ADD takes as long as the slower of the two, not their sum. Each
//! lease has its own task, record, renewals and RELEASE; the ADD reports
//! both addresses in one `pod-networks` entry, answers once both records
//! are in place, and returns one CNI result with both. If either family
//! fails, the other's lease is given back (released, taken off the
//! interface, its record removed) and the ADD fails.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};
use xdhcp_engine::Mode;

use crate::cni::types::{CniResult, DnsConfig};
use crate::datapath::link::{Link, Sockets};
use crate::guard::HostEnd;
use crate::lease::acquire::{Acquired, Acquisition};
use crate::lease::persist::{Family, WorkloadKind};
use crate::lease::registry::Handle;
use crate::lease::v6::{Acquired6, Acquisition6, address6};
use crate::ops::add6::{For, cni_result6};
use crate::ops::context::Agent;
use crate::ops::error::{Error, LeaseFate, Place};
use crate::ops::guard_port::{first_send_held, guard_added};
use crate::ops::network::fresh_record;
use crate::ops::report::{
    Deadline, Phases, ReportTo, cni_result, micros, report_address_dual, unapply, unrecorded,
    unreport,
};
use crate::rpc::CniRequest;
use crate::sys::sync::lock;
use crate::workload::MacAddr;

/// ADD of a pod's attachment on a dual-stack network, within `deadline`.
pub(crate) async fn add(
    agent: &Arc<Agent>,
    req: &CniRequest,
    who: For,
    netns: PathBuf,
    deadline: Deadline,
    mut phases: Phases,
) -> Result<CniResult, Error> {
    let place = Place::Pod {
        ifname: req.ifname.clone(),
        netns: netns.clone(),
    };
    // One trip into the namespace: the DHCPv4 lease's sender and receiver,
    // the DHCPv6 client socket, the interface brought up, its veth peer
    // found (the guard's port).
    let link = Link::open_looking(Some(&netns), &req.ifname, Sockets::Dual, true)
        .map_err(|source| Error::interface(agent.metrics(), place.clone(), source))?;
    phases.open = phases.lap();
    let mac = link.info.mac;
    // Boxed: both acquisitions and the guard, joined, make a large future.
    let (got4, got6, guarded) =
        Box::pin(acquire_both(agent, req, &who, link, &netns, place)).await?;
    phases.guard = micros(guarded);
    phases.dora = phases.lap();
    let slower = Slower::of(&got4, &got6);
    match slower {
        Slower::V4 => phases.acquired(&got4),
        Slower::V6 => phases.acquired6(&got6),
    }
    let (h4, lease4, h6, lease6) = (got4.handle, got4.lease, got6.handle, got6.lease);
    let router = lock(&h6.live).record.router6;
    let a6 = address6(&lease_network(&h6), &lease6, router);
    let to = ReportTo {
        pod: who.pod.as_ref(),
        key: who.annotation_key.as_deref(),
    };
    // Both addresses reported before the answer, in one write; a failed
    // or stale write gives both leases back.
    if let (Some(pod), Some(key)) = (to.pod, to.key)
        && let Err(source) = deadline
            .kube(
                agent.metrics(),
                || {
                    format!(
                        "writing the pod-networks entry of pod {}/{}",
                        pod.namespace, pod.name
                    )
                },
                report_address_dual(
                    &*agent.pod_api,
                    pod,
                    key,
                    (&lease4, a6),
                    mac,
                    req.netns.as_deref(),
                ),
            )
            .await
    {
        give_back_both(agent, req, (&h4, &lease4), &h6).await;
        warn!(container = %req.container_id, ifname = %req.ifname, address = %lease4.address,
            address6 = %lease6.address, error = %crate::rpc::format_chain(&source),
            "ADD not reported; both leases released");
        return Err(Error::NotReported {
            address: lease4.address.into(),
            fate: LeaseFate::Released,
            source: Box::new(source),
        });
    }
    phases.report = phases.lap();
    // Answer only once both records are in place (a restart must resume
    // both).
    let missing = match unrecorded(&h4, deadline).await {
        Some(reason) => Some(reason),
        None => unrecorded(&h6, deadline).await,
    };
    if let Some(reason) = missing {
        give_back_both(agent, req, (&h4, &lease4), &h6).await;
        return Err(unreport(agent, to, deadline, reason).await);
    }
    phases.durable += phases.lap();
    phases.observe(agent.metrics());
    info!(container = %req.container_id, ifname = %req.ifname, address = %lease4.address,
        address6 = %lease6.address, mac = %MacAddr(mac), who_us = phases.who,
        open_us = phases.open, guard_us = phases.guard, dora_us = phases.dora,
        phases_of = slower.label(), slot_us = phases.slot, start_us = phases.start,
        offer_us = phases.offer, ack_us = phases.ack, apply_us = phases.apply,
        report_us = phases.report, durable_us = phases.durable, total_us = phases.total(),
        "ADD done (dual stack)");
    Ok(result(&lease4, &lease6, router, &req.config))
}

/// Which family's acquisition a dual-stack ADD waited for: the one whose
/// steps (slot, start, offer, ack) took longer. Its steps are the ADD's
/// phases (logged and observed as an IPv4 or IPv6 ADD's are); the other's
/// ran beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slower {
    V4,
    V6,
}

impl Slower {
    fn of(v4: &Acquired, v6: &Acquired6) -> Self {
        let steps =
            |slot: Duration, e: &crate::lease::live::Exchange| slot + e.start + e.offer + e.ack;
        if steps(v6.slot, &v6.exchange) > steps(v4.protect + v4.slot, &v4.exchange) {
            Self::V6
        } else {
            Self::V4
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::V4 => "dhcpv4",
            Self::V6 => "dhcpv6",
        }
    }
}

/// Both leases of a pod's dual-stack attachment on its opened `link`,
/// acquired at once, with the guard put on its port meanwhile (how long
/// it took is the third value); when either fails, the other is given
/// back and the ADD fails with the first failure (the DHCPv4 one when
/// both failed; the other is logged).
async fn acquire_both(
    agent: &Arc<Agent>,
    req: &CniRequest,
    who: &For,
    mut link: Link,
    netns: &std::path::Path,
    place: Place,
) -> Result<(Acquired, Acquired6, Duration), Error> {
    let (mac, ifindex) = (link.info.mac, link.info.ifindex);
    let peer = link.take_veth_peer();
    let sock = link.take_udp6();
    let prepared = first_send_held(agent, &mut link, &peer);
    let gate6 = link.port_gate();
    let record = |family| {
        fresh_record(
            req,
            who.pod.clone(),
            WorkloadKind::Pod,
            (mac, family),
            who.annotation_key.clone(),
        )
    };
    let v4 = agent.leases.acquire_timed(
        &agent.pacing,
        &agent.base,
        Acquisition {
            record: record(Family::Ipv4),
            mode: Mode::Maintain,
            requested: None,
            link: link.with_src_mac(mac),
        },
    );
    // The guard goes on beside both exchanges: each first message waits
    // only for the port's qdisc, the DISCOVER on the link's hold, the
    // SOLICIT (from a socket of its own) on a copy of it.
    let v6 = async {
        if let Some(gate) = gate6 {
            gate.ready().await;
        }
        let acquisition = Acquisition6 {
            record: record(Family::Ipv6),
            netns: Some(netns.to_path_buf()),
            ifindex,
            link_mac: mac,
            sock,
        };
        agent
            .leases
            .acquire6_timed(&agent.pacing, agent.base.acquire_timeout, acquisition)
            .await
    };
    let guard = async {
        let started = std::time::Instant::now();
        guard_added(agent, req, netns, (mac, false), HostEnd { peer, prepared }).await;
        started.elapsed()
    };
    let (v4, v6, guarded) = tokio::join!(v4, v6, guard);
    match (v4, v6) {
        (Ok(a), Ok(b)) => Ok((a, b, guarded)),
        // The family that bound gives its lease back: nothing is left.
        (Err(f), v6) => {
            match v6 {
                Ok(b) => agent.leases.abandon(&b.handle, true).await,
                Err(f6) => {
                    warn!(container = %req.container_id, ifname = %req.ifname,
                        error = %Error::acquisition(place.clone(), &req.config.name, f6),
                        "the DHCPv6 lease of the dual-stack ADD failed too");
                }
            }
            agent.guard.release(&req.container_id, &req.ifname);
            Err(Error::acquisition(place, &req.config.name, f))
        }
        (Ok(a), Err(f)) => {
            give_back4(agent, req, &a.handle, &a.lease).await;
            agent.guard.release(&req.container_id, &req.ifname);
            Err(Error::acquisition(place, &req.config.name, f))
        }
    }
}

/// The network a lease's record keeps.
fn lease_network(h: &Handle) -> crate::model::Network {
    lock(&h.live).record.network.clone()
}

/// Give a bound DHCPv4 lease back: RELEASE, forgotten, its record removed,
/// its address taken off the interface (`apply`; the v6 task takes its
/// own off when it stops).
async fn give_back4(
    agent: &Arc<Agent>,
    req: &CniRequest,
    handle: &Handle,
    lease: &xdhcp_engine::Lease,
) {
    agent.leases.abandon(handle, true).await;
    unapply(req, lease, true).await;
}

/// Give both leases of an ADD back, and the port's guard.
async fn give_back_both(
    agent: &Arc<Agent>,
    req: &CniRequest,
    (h4, lease4): (&Handle, &xdhcp_engine::Lease),
    h6: &Handle,
) {
    tokio::join!(
        give_back4(agent, req, h4, lease4),
        agent.leases.abandon(h6, true)
    );
    agent.guard.release(&req.container_id, &req.ifname);
}

/// The CNI result of a dual-stack attachment's two leases (the first
/// ADD's and a repeated one's).
pub(crate) fn result(
    lease4: &xdhcp_engine::Lease,
    lease6: &xdhcp_engine::v6::Lease,
    router: Option<xdhcp_engine::v6::ra::Router6>,
    config: &crate::cni::config::NetworkConfig,
) -> CniResult {
    merge(
        cni_result(lease4, config),
        cni_result6(lease6, router, config),
    )
}

/// One CNI result of a dual-stack attachment from its two families' (pure):
/// the IPv4 `ips` and routes then the IPv6 ones; the DNS servers of both,
/// IPv4's first, each once; the IPv4 lease's domain; the search lists of
/// both, each name once.
pub(crate) fn merge(v4: CniResult, v6: CniResult) -> CniResult {
    let mut dns = DnsConfig {
        nameservers: v4.dns.nameservers,
        domain: v4.dns.domain.or(v6.dns.domain),
        search: v4.dns.search,
    };
    for n in v6.dns.nameservers {
        if !dns.nameservers.contains(&n) {
            dns.nameservers.push(n);
        }
    }
    for s in v6.dns.search {
        if !dns.search.contains(&s) {
            dns.search.push(s);
        }
    }
    CniResult {
        cni_version: v4.cni_version,
        ips: v4.ips,
        ips6: v6.ips6,
        routes: v4.routes,
        routes6: v6.routes6,
        dns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::config::NetworkConfig;

    fn config(ipam: &str) -> NetworkConfig {
        crate::cni::config::parse(
            format!(r#"{{"cniVersion":"1.1.0","name":"dual","ipam":{ipam}}}"#).as_bytes(),
        )
        .unwrap()
    }

    /// A dual-stack attachment's result: both addresses, each with its
    /// prefix and gateway, the routes of both, the DNS of both merged.
    #[test]
    fn the_result_carries_both_families() {
        let c = config(
            r#"{"type":"xdhcp","family":"dual","priority":5,
                "ipv6":{"prefixLength":64,"gateway":"2001:db8::1"}}"#,
        );
        let lease4 = xdhcp_engine::Lease {
            routers: vec!["192.0.2.1".parse().unwrap()],
            dns_servers: vec!["192.0.2.53".parse().unwrap()],
            domain_name: Some("example.test".into()),
            search: vec!["example.test".into(), "v4.example.test".into()],
            ..crate::lease::persist::tests::lease()
        };
        let merged = result(&lease4, &crate::lease::v6::tests::lease(), None, &c);
        let v = serde_json::to_value(&merged).unwrap();
        assert_eq!(v["cniVersion"], "1.1.0");
        assert_eq!(
            v["ips"],
            serde_json::json!([
                {"address": "192.0.2.10/24", "gateway": "192.0.2.1"},
                {"address": "2001:db8::5/64", "gateway": "2001:db8::1"},
            ])
        );
        assert_eq!(
            v["routes"],
            serde_json::json!([
                {"dst": "0.0.0.0/0", "gw": "192.0.2.1", "priority": 5},
                {"dst": "::/0", "gw": "2001:db8::1", "priority": 5},
            ])
        );
        assert_eq!(
            v["dns"],
            serde_json::json!({
                "nameservers": ["192.0.2.53", "2001:db8::53"],
                "domain": "example.test",
                "search": ["example.test", "v4.example.test"],
            })
        );
    }
}
