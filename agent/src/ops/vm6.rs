//! ADD for a KubeVirt VM whose device is the launcher pod's own netdev
//! (bridge binding) on an IPv6 network (`"family": "ipv6"`) or a
//! dual-stack one (`"family": "dual"`): a one-shot `DHCPv6` discovery with
//! the VM's MAC, and on a dual-stack network a one-shot DHCPv4 discovery
//! beside it, as [`crate::ops::add_dual`] runs a pod's two leases.
//!
//! The `DHCPv6` exchange runs from the UDP socket in the launcher pod's
//! namespace ([`crate::lease::v6`]), with the engine configured from the
//! VM's MAC: the server binds the address to the VM's DUID-LL and IAID,
//! whichever interface the messages leave by. At the first binding the
//! task ends: nothing is renewed, released or configured (the guest's own
//! client owns the binding), and the record stays, as an IPv4 VM's does,
//! so the entry is reported from it and a restart keeps it as it is.
//!
//! A live-migration target's ADD runs the same discovery with the same MAC,
//! so it presents the same DUID and IAID and the server answers with the
//! binding it holds for them. The engine sends no address hint in its
//! SOLICIT: that stability is what keeps the IPv6 address across the
//! migration (the IPv4 one is asked for, as on an IPv4 network).

use std::path::PathBuf;
use std::sync::Arc;

use tracing::{info, warn};
use xdhcp_engine::Mode;

use crate::cni::config::Family as CniFamily;
use crate::cni::types::CniResult;
use crate::datapath::link::{Link, Sockets};
use crate::guard::HostEnd;
use crate::lease::acquire::Acquisition;
use crate::lease::persist::{Family, WorkloadKind};
use crate::lease::v6::Acquisition6;
use crate::ops::context::Agent;
use crate::ops::error::{Error, Place};
use crate::ops::guard_port::guard_added;
use crate::ops::network::fresh_record;
use crate::ops::report::{Deadline, ReportTo};
use crate::ops::vm::{VmPod, identity_on_pod_netdev};
use crate::ops::vm_answer::{Found, answer};
use crate::rpc::CniRequest;
use crate::workload::MacAddr;

/// ADD of a VM's attachment on an IPv6 or dual-stack network, within
/// `deadline`.
pub(crate) async fn add(
    agent: &Arc<Agent>,
    req: &CniRequest,
    vm: VmPod,
    netns: PathBuf,
    deadline: Deadline,
) -> Result<CniResult, Error> {
    let started = std::time::Instant::now();
    let dual = req.config.ipam.family == CniFamily::Dual;
    let place = Place::Pod {
        ifname: req.ifname.clone(),
        netns: netns.clone(),
    };
    // Brought up if it is down, its veth peer found; the DHCPv4
    // discovery's sender on a dual-stack network (the DHCPv6 one opens its
    // own socket).
    let sockets = if dual {
        Sockets::Sender
    } else {
        Sockets::Later
    };
    let mut link = Link::open_looking(Some(&netns), &req.ifname, sockets, true)
        .map_err(|source| Error::interface(agent.metrics(), place.clone(), source))?;
    let (pod_mac, peer) = (link.info.mac, link.take_veth_peer());
    let (mac, requested) = identity_on_pod_netdev(agent, &vm, pod_mac, deadline).await?;
    let found = discover(agent, req, &vm, link, (mac, requested), &netns, place).await?;
    // The guard goes on once the discoveries are done, not before as on an
    // IPv4 network: it holds the port to the VM's MAC, and the SOLICITs
    // leave from the launcher's own socket with the interface's MAC as
    // their source, which on a migration target (or wherever the VM's MAC
    // is not the interface's) it would drop as spoofed. Nothing of the
    // launcher runs before the ADD answers, and the guard is on by then.
    guard_added(agent, req, &netns, (mac, true), HostEnd::of(peer)).await;
    let to = ReportTo {
        pod: vm.pod.as_ref(),
        key: vm.annotation_key.as_deref(),
    };
    let (result, address6) = answer(agent, req, to, &found, mac, deadline).await?;
    info!(container = %req.container_id, ifname = %req.ifname, vmi = %vm.vmi_name,
        address = ?found.v4.as_ref().map(|(_, l)| l.address), %address6,
        mac = %MacAddr(mac), total_us = started.elapsed().as_micros(),
        "ADD done (VM, DHCPv6 one-shot: address reported, not configured)");
    Ok(result)
}

/// The VM's one-shot discoveries with its `mac` on the launcher's opened
/// `link`: `DHCPv6`, and on a dual-stack network DHCPv4 at the same time
/// (asking for `requested`, a migration target's reported address). When
/// either fails, the other is dropped (not released) and the ADD fails with
/// the first failure (the DHCPv4 one when both failed; the other is
/// logged).
async fn discover(
    agent: &Arc<Agent>,
    req: &CniRequest,
    vm: &VmPod,
    link: Link,
    (mac, requested): ([u8; 6], Option<std::net::Ipv4Addr>),
    netns: &std::path::Path,
    place: Place,
) -> Result<Found, Error> {
    let dual = req.config.ipam.family == CniFamily::Dual;
    let (link_mac, ifindex) = (link.info.mac, link.info.ifindex);
    let record = |family| {
        fresh_record(
            req,
            vm.pod.clone(),
            WorkloadKind::Vm {
                vmi: vm.vmi_name.clone(),
            },
            (mac, family),
            vm.annotation_key.clone(),
        )
    };
    info!(container = %req.container_id, ifname = %req.ifname, vmi = %vm.vmi_name,
        mac = %MacAddr(mac), interface_mac = %MacAddr(link_mac), requested = ?requested,
        "VM on an IPv6 network: one-shot DHCPv6 discovery with the VM's DUID-LL and IAID; the address is not configured");
    let v6 = agent.leases.acquire6(
        &agent.pacing,
        agent.base.acquire_timeout,
        Acquisition6 {
            record: record(Family::Ipv6),
            netns: Some(netns.to_path_buf()),
            ifindex,
            link_mac,
            sock: None,
        },
    );
    if !dual {
        drop(link);
        let v6 = v6
            .await
            .map_err(|f| Error::acquisition(place, &req.config.name, f))?;
        return Ok(Found { v4: None, v6 });
    }
    let v4 = agent.leases.acquire_timed(
        &agent.pacing,
        &agent.base,
        Acquisition {
            record: record(Family::Ipv4),
            mode: Mode::OneShot,
            requested,
            link: link.with_src_mac(mac),
        },
    );
    match tokio::join!(v4, v6) {
        (Ok(a), Ok(v6)) => Ok(Found {
            v4: Some((a.handle, a.lease)),
            v6,
        }),
        (Err(f), v6) => {
            match v6 {
                Ok((h, _)) => agent.leases.abandon(&h, false).await,
                Err(f6) => {
                    warn!(container = %req.container_id, ifname = %req.ifname,
                        error = %Error::acquisition(place.clone(), &req.config.name, f6),
                        "the DHCPv6 discovery of the dual-stack VM ADD failed too");
                }
            }
            Err(Error::acquisition(place, &req.config.name, f))
        }
        (Ok(a), Err(f)) => {
            agent.leases.abandon(&a.handle, false).await;
            Err(Error::acquisition(place, &req.config.name, f))
        }
    }
}
