//! How the DHCP guard's XDP program goes on a workload port (the hook of
//! ports a userspace-datapath Open vSwitch bridge reads through a packet
//! socket), checked in the kernel's own state:
//!
//! - the program goes on a veth in the generic receive path (which runs
//!   before the packet taps, as a driver program does), never native: a
//!   native program on a veth sets up and tears down the device's NAPI
//!   rings on every attach and detach, each detach an RCU grace period on
//!   the ADD and DEL path;
//! - while the guard is loaded, the same program stays attached outside
//!   every port (the loopback of a namespace of the guard's own), so that
//!   a port's attach and detach never change the kernel's XDP dispatcher
//!   nor the generic path's static key (each change waits on the kernel);
//!   and taking a port's program off leaves that one on.
//!
//! Needs root (`CAP_BPF`, `CAP_NET_ADMIN`); fails, never skips, without it.

use std::path::Path;

use xdhcp::datapath::ebpf::{AttachTarget, Guard, GuardHook, PortPolicy};
use xdhcp::netlink::{XdpHook, xdp_prog_here};
use xdhcp_tests::netns::{NetNs, Veth};

/// The XDP program on `ifname` in `ns`, and its mode, as the kernel says.
fn xdp_on(ns: &Path, ifname: &str) -> Option<(u32, XdpHook)> {
    let ifname = ifname.to_owned();
    xdhcp::sys::netns::run_in_netns(ns, move || {
        let ifindex = nix::net::if_::if_nametoindex(ifname.as_str()).expect("the port exists");
        xdp_prog_here(ifindex).expect("RTM_GETLINK")
    })
    .expect("enter the namespace")
}

#[test]
fn a_port_guarded_at_xdp_carries_the_program_in_the_generic_path() {
    let mut guard = Guard::load().expect("load the guard programs (needs root)");
    let (node, pod) = (NetNs::new(), NetNs::new());
    let _veth = Veth::new(&node, "gx_host", &pod, "eth0");
    let target = AttachTarget {
        ifname: "gx_host".to_owned(),
        netns: Some(node.path().to_owned()),
    };
    guard
        .attach_at(&target, &PortPolicy::default(), GuardHook::Xdp)
        .expect("guard the port at XDP");
    assert_eq!(guard.hook(&target), Some(GuardHook::Xdp));
    assert_eq!(guard.xdp_mode(&target), Some(XdpHook::Generic));
    let (_, mode) = xdp_on(node.path(), "gx_host").expect("an XDP program on the port");
    assert_eq!(mode, XdpHook::Generic, "the kernel's view of the port");
    guard.detach(&target).expect("unguard the port");
    assert_eq!(xdp_on(node.path(), "gx_host"), None);
}

#[test]
fn the_guard_keeps_its_xdp_program_attached_outside_every_port() {
    let mut guard = Guard::load().expect("load the guard programs (needs root)");
    let kept = guard
        .kept_xdp_program()
        .expect("read the kept attachment")
        .expect("the guard keeps its XDP program attached while it is loaded");
    let (node, pod) = (NetNs::new(), NetNs::new());
    let _veth = Veth::new(&node, "gk_host", &pod, "eth0");
    let target = AttachTarget {
        ifname: "gk_host".to_owned(),
        netns: Some(node.path().to_owned()),
    };
    guard
        .attach_at(&target, &PortPolicy::default(), GuardHook::Xdp)
        .expect("guard the port at XDP");
    // One program: the port's is the one kept, so the kernel's set of
    // attached XDP programs did not change.
    let (on_port, _) = xdp_on(node.path(), "gk_host").expect("an XDP program on the port");
    assert_eq!(on_port, kept);
    guard.detach(&target).expect("unguard the port");
    assert_eq!(
        guard.kept_xdp_program().expect("read the kept attachment"),
        Some(kept),
        "the kept attachment outlives the port's"
    );
}
