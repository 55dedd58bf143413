//! The OVS + OVN node lab (`xdhcp_tests::OvnLab`) carries DHCP: a pod on a
//! localnet network leases from dnsmasq behind the provider bridge, through
//! `br-int`, OVN's patch ports and the userspace datapath, and the node
//! view read from the lab's own `Open_vSwitch` database names the uplink and
//! the pod's port as OVN-Kubernetes would have written it.
//!
//! Needs root; fails, never skips, without it.

use std::net::Ipv4Addr;
use std::time::Duration;

use xdhcp_ovsdb::{Datapath, NodeState, NodeWatch, WatchOptions};
use xdhcp_tests::{Dnsmasq, DnsmasqConfig, OvnLab, OvnPod, parse_mac};

/// Runs busybox `udhcpc` once in the pod; the lease it bound, if any.
fn udhcpc(pod: &OvnPod) -> Option<(Ipv4Addr, Ipv4Addr)> {
    xdhcp_tests::udhcpc_once(&pod.ns, &pod.ifname)
}

#[test]
fn a_pod_on_the_localnet_leases_from_dnsmasq_behind_the_provider_bridge() {
    let mut lab = OvnLab::start();
    let dnsmasq = Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            interface: OvnLab::SERVER_IF.to_owned(),
            ..DnsmasqConfig::default()
        },
    );
    let mac = parse_mac("0a:58:c0:00:02:05").unwrap();
    lab.add_pod("pod1", mac);
    let pod = &lab.pods()[0];

    let bound = udhcpc(pod);
    let Some((ip, server)) = bound else {
        panic!(
            "no lease through the OVN lab; ovn-controller log:\n{}\novs-vswitchd log:\n{}",
            lab.log("ovn-controller"),
            lab.log("ovs-vswitchd")
        );
    };
    assert_eq!(server, OvnLab::SERVER_IP);
    let lease = dnsmasq.lease_for(mac).expect("dnsmasq's lease for the pod");
    assert_eq!(lease.ip, ip);

    // OVN wired the localnet with patch ports, which are no uplink.
    let ports = lab.vsctl(&["list-ports", OvnLab::PROVIDER_BRIDGE]);
    assert!(ports.lines().any(|p| p.starts_with("patch-")), "{ports}");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let view = rt.block_on(async {
        let mut rx = NodeWatch::spawn(lab.db_socket(), WatchOptions::default());
        let state = tokio::time::timeout(
            Duration::from_secs(10),
            rx.wait_for(|s| matches!(s, NodeState::Ready(_))),
        )
        .await
        .expect("a view in 10 s")
        .expect("the watcher runs")
        .clone();
        match state {
            NodeState::Ready(v) => v,
            NodeState::Unavailable { .. } => unreachable!(),
        }
    });
    let uplinks: Vec<_> = view
        .uplinks
        .iter()
        .map(|u| {
            (
                u.physnet.as_str(),
                u.bridge.as_str(),
                u.ifname.as_str(),
                &u.datapath,
            )
        })
        .collect();
    assert_eq!(
        uplinks,
        [(
            OvnLab::PHYSNET,
            OvnLab::PROVIDER_BRIDGE,
            OvnLab::UPLINK,
            &Datapath::Netdev
        )],
        "{view:#?}"
    );
    assert_eq!(view.warnings, [], "{view:#?}");
    let w = view
        .workload(&pod.host_ifname)
        .expect("the pod's port in the view");
    assert_eq!(w.iface_id, pod.iface_id);
    assert_eq!(w.pod_uid.as_deref(), Some(pod.uid.as_str()));
    assert_eq!(w.attached_mac.map(|m| m.0), Some(mac));
    assert_eq!(w.network.as_deref(), Some(OvnLab::NETWORK));
    assert_eq!(w.nad.as_deref(), Some(OvnLab::NAD));
    assert_eq!(w.pod_if_name.as_deref(), Some(pod.ifname.as_str()));
    // ovn-controller wrote that it wired the port.
    assert!(w.ovn_installed, "{w:#?}");
}
