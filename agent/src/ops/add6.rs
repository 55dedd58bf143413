//! ADD on an IPv6 network (`"ipam": {"family": "ipv6"}`), for a pod: the
//! interface opened (and brought up) in the pod's namespace, the DHCP guard
//! on its port as for IPv4, one `DHCPv6` lease acquired from the pod's own
//! UDP socket, its replies taken by the capture programs once they serve
//! the interface ([`crate::lease::v6`]), its record on disk before the
//! answer, and the CNI result with the address.
//!
//! The pod's `pod-networks` entry carries the address, as for IPv4. A VM's
//! ADD on such a network is [`crate::ops::vm6`]'s.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};
use xdhcp_engine::v6::Lease;
use xdhcp_engine::v6::ra::Router6;

use crate::cni::config::NetworkConfig;
use crate::cni::types::{CniResult, DnsConfig, Ip6Config, Ipv6Cidr, Route6Config};
use crate::datapath::link::{Link, Sockets};
use crate::guard::HostEnd;
use crate::lease::acquire::Failure;
use crate::lease::persist::{PodRef, WorkloadKind};
use crate::lease::v6::{Acquired6, Acquisition6, address6};
use crate::model::Network;
use crate::ops::context::Agent;
use crate::ops::error::{Error, LeaseFate, Place};
use crate::ops::guard_port::{first_send_held, guard_added};
use crate::ops::network::fresh_record;
use crate::ops::report::{
    Deadline, Phases, ReportTo, micros, report_address6, unrecorded, unreport,
};
use crate::rpc::CniRequest;
use crate::sys::sync::lock;
use crate::workload::MacAddr;

/// Who an IPv6 ADD is for.
pub(crate) struct For {
    pub(crate) pod: Option<PodRef>,
    pub(crate) annotation_key: Option<String>,
}

/// ADD of a pod's attachment on an IPv6 network, within `deadline`.
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
    // Brought up if it is down, its veth peer found, the DHCPv6 client
    // socket made: one trip into the namespace, no packet socket.
    let link = Link::open_looking(Some(&netns), &req.ifname, Sockets::Udp6, true)
        .map_err(|source| Error::interface(agent.metrics(), place.clone(), source))?;
    phases.open = phases.lap();
    let mac = link.info.mac;
    let (acquired, guarded) = acquire_guarded(agent, req, &who, &netns, link).await;
    phases.guard = micros(guarded);
    let got = match acquired {
        Ok(x) => x,
        Err(f) => {
            agent.guard.release(&req.container_id, &req.ifname);
            return Err(Error::acquisition(place, &req.config.name, f));
        }
    };
    phases.dora = phases.lap();
    phases.acquired6(&got);
    let (handle, lease) = (got.handle, got.lease);
    // What the link's router advertisements gave the address, if anything.
    let router = lock(&handle.live).record.router6;
    // Reported before the answer, as for IPv4: a pod cannot use an address
    // OVN-Kubernetes does not know. A failed or stale write gives the lease
    // back.
    if let (Some(pod), Some(key)) = (&who.pod, &who.annotation_key)
        && let Err(source) = deadline
            .kube(
                agent.metrics(),
                || {
                    format!(
                        "writing the pod-networks entry of pod {}/{}",
                        pod.namespace, pod.name
                    )
                },
                report_address6(
                    &*agent.pod_api,
                    pod,
                    key,
                    address6(&Network::from(&req.config), &lease, router),
                    mac,
                    req.netns.as_deref(),
                ),
            )
            .await
    {
        agent.leases.abandon(&handle, true).await;
        agent.guard.release(&req.container_id, &req.ifname);
        warn!(container = %req.container_id, ifname = %req.ifname, address = %lease.address,
            error = %crate::rpc::format_chain(&source), "ADD not reported; the DHCPv6 lease released");
        return Err(Error::NotReported {
            address: lease.address.into(),
            fate: LeaseFate::Released,
            source: Box::new(source),
        });
    }
    phases.report = phases.lap();
    // Answer only once the lease is on disk (a restart must resume it); a
    // lease that could not be recorded is given back, its entry removed.
    if let Some(reason) = unrecorded(&handle, deadline).await {
        agent.leases.abandon(&handle, true).await;
        agent.guard.release(&req.container_id, &req.ifname);
        let to = ReportTo {
            pod: who.pod.as_ref(),
            key: who.annotation_key.as_deref(),
        };
        return Err(unreport(agent, to, deadline, reason).await);
    }
    phases.durable += phases.lap();
    phases.observe(agent.metrics());
    info!(container = %req.container_id, ifname = %req.ifname, address = %lease.address,
        mac = %MacAddr(mac), who_us = phases.who, open_us = phases.open, guard_us = phases.guard,
        slot_us = phases.slot, start_us = phases.start, offer_us = phases.offer,
        ack_us = phases.ack, apply_us = phases.apply, report_us = phases.report,
        durable_us = phases.durable, total_us = phases.total(), "ADD done (DHCPv6)");
    Ok(cni_result6(&lease, router, &req.config))
}

/// The pod's lease acquired from its own socket, the DHCP guard going on
/// its port beside it: the acquisition's outcome, and how long the guard
/// took.
async fn acquire_guarded(
    agent: &Arc<Agent>,
    req: &CniRequest,
    who: &For,
    netns: &Path,
    mut link: Link,
) -> (Result<Acquired6, Failure>, Duration) {
    let (mac, ifindex, peer) = (link.info.mac, link.info.ifindex, link.take_veth_peer());
    let sock = link.take_udp6();
    // The guard goes on beside the acquisition, as for IPv4: its filter's
    // attach waits for an RCU grace period, which the server's round trips
    // hide. Only the port's `clsact` qdisc is waited for before the first
    // SOLICIT (making it drops what the port is handed in that moment), and,
    // when the open brought the interface up, its bridge port forwarding.
    let prepared = first_send_held(agent, &mut link, &peer);
    let record = fresh_record(
        req,
        who.pod.clone(),
        WorkloadKind::Pod,
        (mac, crate::model::Family::Ipv6),
        who.annotation_key.clone(),
    );
    let acquisition = Acquisition6 {
        record,
        netns: Some(netns.to_path_buf()),
        ifindex,
        link_mac: mac,
        sock,
    };
    let acquire = async {
        // The wait for the host port's qdisc (and for a link the open
        // brought up) is the task's start, as for IPv4.
        let settling = std::time::Instant::now();
        link.settle().await;
        drop(link);
        let settled = settling.elapsed();
        agent
            .leases
            .acquire6_timed(&agent.pacing, agent.base.acquire_timeout, acquisition)
            .await
            .map(|mut got| {
                got.exchange.start += settled;
                got
            })
    };
    let guard = async {
        let started = std::time::Instant::now();
        guard_added(agent, req, netns, (mac, false), HostEnd { peer, prepared }).await;
        started.elapsed()
    };
    tokio::join!(acquire, guard)
}

/// The CNI result for a `DHCPv6` lease: the address with the network's
/// prefix length, else the one the link's router advertisements give it
/// (`router`), else a /128; a default route through the network's gateway,
/// else the advertising router, when there is one; and the lease's DNS
/// servers and search list.
pub(crate) fn cni_result6(
    lease: &Lease,
    router: Option<Router6>,
    config: &NetworkConfig,
) -> CniResult {
    let a = address6(&Network::from(config), lease, router);
    CniResult {
        cni_version: config.cni_version.clone(),
        ips: Vec::new(),
        ips6: vec![Ip6Config {
            version: None,
            address: Ipv6Cidr {
                addr: a.address,
                prefix_len: a.prefix_len,
            },
            gateway: a.gateway,
        }],
        routes: Vec::new(),
        routes6: a
            .gateway
            .map(|gw| Route6Config {
                dst: Ipv6Cidr {
                    addr: std::net::Ipv6Addr::UNSPECIFIED,
                    prefix_len: 0,
                },
                gw: Some(gw),
                priority: a.metric,
            })
            .into_iter()
            .collect(),
        dns: DnsConfig {
            nameservers: lease.dns_servers.iter().map(|&d| d.into()).collect(),
            domain: None,
            search: lease.domain_search.clone(),
        },
    }
    .for_version(&config.cni_version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::v6::tests::lease;

    fn config(ipam: &str) -> NetworkConfig {
        crate::cni::config::parse(
            format!(r#"{{"cniVersion":"1.1.0","name":"v6","ipam":{ipam}}}"#).as_bytes(),
        )
        .unwrap()
    }

    /// A bare IPv6 network's result: the address as a /128, no route; one
    /// naming a prefix length and gateway: the address in the prefix and a
    /// default route with the network's metric.
    #[test]
    fn the_result_carries_the_address_and_what_the_network_names() {
        let bare = cni_result6(
            &lease(),
            None,
            &config(r#"{"type":"xdhcp","family":"ipv6"}"#),
        );
        let v = serde_json::to_value(&bare).unwrap();
        assert_eq!(v["ips"][0]["address"], "2001:db8::5/128");
        assert!(v["ips"][0].get("gateway").is_none());
        assert!(v.get("routes").is_none(), "{v}");
        assert_eq!(v["dns"]["nameservers"][0], "2001:db8::53");
        assert_eq!(v["dns"]["search"][0], "example.test");
        let named = cni_result6(
            &lease(),
            None,
            &config(
                r#"{"type":"xdhcp","family":"ipv6","priority":5,
                    "ipv6":{"prefixLength":64,"gateway":"2001:db8::1"}}"#,
            ),
        );
        let v = serde_json::to_value(&named).unwrap();
        assert_eq!(v["ips"][0]["address"], "2001:db8::5/64");
        assert_eq!(v["ips"][0]["gateway"], "2001:db8::1");
        assert_eq!(
            v["routes"][0],
            serde_json::json!({"dst": "::/0", "gw": "2001:db8::1", "priority": 5})
        );
    }
}
