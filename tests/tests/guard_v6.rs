//! The guard's IPv6 half end to end in network namespaces: pods on a
//! bridge (each a namespace behind a veth whose host end is a bridge
//! port), the guard on the host end of every pod port, and a real dnsmasq
//! serving DHCPv6 with router advertisements (`--enable-ra`) as a rogue
//! inside one pod. Without the guard its ADVERTISEs answer a neighbour's
//! SOLICIT and its RAs give the neighbour's kernel a default route through
//! it; with the guard none of five pods hears either or takes its router,
//! and the rogue port's counters name both reasons.
//!
//! The pods' kernels are the RA clients (`accept_ra` 1, the default of a
//! host), asked with a router solicitation; the DHCPv6 client is dhcpcd
//! (`-6`, once), and for the unguarded and detached checks a SOLICIT sent
//! from the pod's own UDP socket on port 546. What reaches each pod is
//! watched on a packet socket there.
//!
//! Needs root; fails, never skips, without it.

use std::net::{Ipv6Addr, SocketAddrV6, UdpSocket};
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use xdhcp::datapath::ebpf::{AttachTarget, Guard, PortPolicy};
use xdhcp_tests::guest::GuestFs;
use xdhcp_tests::{Dnsmasq6, Lab, LabClient, wait_until};

/// Pods: the rogue's, then the five it must not reach.
const PODS: usize = 6;
/// How long each phase listens (the rogue answers solicitations at once,
/// and advertises every 4 s besides).
const LISTEN: Duration = Duration::from_secs(9);

fn target(lab: &Lab, i: usize) -> AttachTarget {
    AttachTarget {
        ifname: lab.clients[i].port().to_owned(),
        netns: Some(lab.server.path().to_path_buf()),
    }
}

/// dnsmasq in pod 0 serving DHCPv6 from `2001:db8:bad::/64` and
/// advertising itself as the router, every 4 s.
fn rogue(lab: &Lab) -> Dnsmasq6 {
    let pod = &lab.clients[0];
    let ra_param = format!("--ra-param={},4,600", pod.ifname);
    Dnsmasq6::start_on(
        &pod.ns,
        &pod.ifname,
        "2001:db8:bad::1/64",
        "2001:db8:bad::100,2001:db8:bad::1ff",
        &["--enable-ra", &ra_param],
    )
}

/// Sets `net.ipv6.conf.<ifname>.accept_ra` in the pod (1: its kernel
/// takes routers from advertisements, as a host does).
fn accept_ra(pod: &LabClient, on: bool) {
    let path = format!("/proc/sys/net/ipv6/conf/{}/accept_ra", pod.ifname);
    pod.ns.run_in(move || {
        std::fs::write(&path, if on { "1" } else { "0" }).expect("set accept_ra");
    });
}

/// Routes the pod's kernel took from router advertisements (a default
/// route through the rogue, its prefix).
fn ra_routes(pod: &LabClient) -> String {
    pod.ns.ip(&["-6", "route", "show", "proto", "ra"])
}

/// Waits until the pod's link-local address is no longer tentative, so a
/// socket can send from it.
fn wait_link_local(pod: &LabClient) {
    assert!(
        wait_until(Duration::from_secs(10), || {
            let out = pod
                .ns
                .ip(&["-6", "addr", "show", "dev", &pod.ifname, "scope", "link"]);
            out.contains("fe80::") && !out.contains("tentative")
        }),
        "no usable link-local address in {}",
        pod.ns.name()
    );
}

/// What reached a pod from the rogue while it listened.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Heard {
    /// DHCPv6 messages from port 547 (ADVERTISEs, REPLYs).
    dhcpv6: usize,
    /// Router advertisements.
    ra: usize,
    /// Router advertisements with a non-zero router lifetime (a default
    /// router).
    default_router: usize,
}

/// Counts the frames from `rogue_mac` that reach `sock` until `done`.
fn listen(sock: &OwnedFd, rogue_mac: [u8; 6], done: &AtomicBool) -> Heard {
    let mut heard = Heard::default();
    let mut buf = vec![0u8; 4096];
    while !done.load(Ordering::Relaxed) {
        // SAFETY: receiving into an owned buffer.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        let Ok(n) = usize::try_from(n) else { continue };
        let f = &buf[..n];
        // Untagged IPv6 without extension headers: what dnsmasq sends.
        if n < 58 || f[6..12] != rogue_mac || f[12..14] != [0x86, 0xdd] {
            continue;
        }
        match f[20] {
            17 if f[54..56] == 547u16.to_be_bytes() => heard.dhcpv6 += 1,
            58 if f[54] == 134 => {
                heard.ra += 1;
                if f[60..62] != [0, 0] {
                    heard.default_router += 1;
                }
            }
            _ => {}
        }
    }
    heard
}

/// A DHCPv6 SOLICIT (DUID-LL of `mac`, an `IA_NA`, Elapsed Time) sent from
/// a UDP socket on port 546 in the pod, to `ff02::1:2`.
fn solicit(pod: &LabClient) {
    let (ifindex, mac) = (pod.ifindex, pod.mac);
    pod.ns.run_in(move || {
        // A client that ran here may hold the port a moment longer (dhcpcd's
        // helper processes exit after it).
        let mut sock = None;
        wait_until(Duration::from_secs(5), || {
            sock = UdpSocket::bind("[::]:546").ok();
            sock.is_some()
        });
        let sock = sock.expect("bind [::]:546 in the pod");
        let mut m = vec![1, 0x12, 0x34, 0x56];
        m.extend_from_slice(&[0, 1, 0, 10, 0, 3, 0, 1]);
        m.extend_from_slice(&mac);
        m.extend_from_slice(&[0, 3, 0, 12, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
        m.extend_from_slice(&[0, 8, 0, 2, 0, 0]);
        let to = SocketAddrV6::new(Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 1, 2), 547, 0, ifindex);
        sock.send_to(&m, to).expect("send the SOLICIT");
    });
}

/// A router solicitation from the pod (an ICMPv6 socket: the kernel fills
/// in the checksum), to `ff02::2` with hop limit 255 (RFC 4861 §6.1.1): a
/// router answers it at once.
fn router_solicitation(pod: &LabClient) {
    let ifindex = pod.ifindex;
    pod.ns.run_in(move || {
        // SAFETY: plain socket calls on a descriptor this closure owns.
        unsafe {
            let fd = libc::socket(libc::AF_INET6, libc::SOCK_RAW, libc::IPPROTO_ICMPV6);
            assert!(
                fd >= 0,
                "ICMPv6 socket: {}",
                std::io::Error::last_os_error()
            );
            let fd = <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd);
            let hops: libc::c_int = 255;
            let rc = libc::setsockopt(
                fd.as_raw_fd(),
                libc::IPPROTO_IPV6,
                libc::IPV6_MULTICAST_HOPS,
                (&raw const hops).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            );
            assert_eq!(rc, 0, "IPV6_MULTICAST_HOPS");
            let mut to: libc::sockaddr_in6 = std::mem::zeroed();
            to.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            to.sin6_addr.s6_addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2).octets();
            to.sin6_scope_id = ifindex;
            let rs = [133u8, 0, 0, 0, 0, 0, 0, 0];
            let n = libc::sendto(
                fd.as_raw_fd(),
                rs.as_ptr().cast(),
                rs.len(),
                0,
                (&raw const to).cast(),
                size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            );
            assert_eq!(n, 8, "send the RS: {}", std::io::Error::last_os_error());
        }
    });
}

/// Each of `pods` solicits a router (and with `solicit`, a DHCPv6 server:
/// without, a client running there does) and listens for [`LISTEN`]: what
/// reached each.
fn watch(lab: &Lab, pods: &[usize], solicit_too: bool) -> Vec<Heard> {
    let rogue_mac = lab.clients[0].mac;
    let done = Arc::new(AtomicBool::new(false));
    let listeners: Vec<_> = pods
        .iter()
        .map(|&i| {
            let pod = &lab.clients[i];
            let sock = pod.ns.packet_socket(
                pod.ifindex,
                libc::ETH_P_ALL as u16,
                Some(Duration::from_millis(100)),
            );
            let done = Arc::clone(&done);
            std::thread::spawn(move || listen(&sock, rogue_mac, &done))
        })
        .collect();
    for &i in pods {
        router_solicitation(&lab.clients[i]);
        if solicit_too {
            solicit(&lab.clients[i]);
        }
    }
    std::thread::sleep(LISTEN);
    done.store(true, Ordering::Relaxed);
    listeners
        .into_iter()
        .map(|l| l.join().expect("listener"))
        .collect()
}

/// Without the guard, pod 1 hears the rogue's ADVERTISE and RAs, its
/// kernel takes the rogue as its router, and dhcpcd leases from it.
fn the_rogue_reaches_pod_1_unguarded(lab: &Lab, rogue: &Dnsmasq6) {
    let heard = watch(lab, &[1], true);
    assert!(
        heard[0].dhcpv6 > 0 && heard[0].default_router > 0,
        "the rogue's ADVERTISEs and RAs reach another pod without the guard: {heard:?}"
    );
    let pod1 = &lab.clients[1];
    // Asked again now and then: an advertisement may be lost on a busy host.
    let mut asked = std::time::Instant::now();
    assert!(
        wait_until(Duration::from_secs(10), || {
            if asked.elapsed() > Duration::from_secs(2) {
                router_solicitation(pod1);
                asked = std::time::Instant::now();
            }
            ra_routes(pod1).contains("default")
        }),
        "pod 1's kernel took the rogue as its router ({heard:?}): {}",
        pod1.ns.ip(&["-6", "route"])
    );
    // A real client (dhcpcd) leases from the rogue.
    let leased = GuestFs::new().dhcpcd6_once(&pod1.ns, &pod1.ifname, 8);
    assert!(
        leased.is_some_and(|a| a.segments()[..3] == [0x2001, 0xdb8, 0xbad]),
        "dhcpcd in pod 1 leased {leased:?}, not from the rogue\n{}",
        rogue.log()
    );
}

#[test]
fn rogue_dhcpv6_server_and_router_in_a_pod_reach_no_other_pod() {
    let lab = Lab::with_clients(PODS);
    let victims: Vec<usize> = (1..PODS).collect();
    for &i in &victims {
        wait_link_local(&lab.clients[i]);
    }
    wait_link_local(&lab.clients[0]);
    // Only pod 1 listens to routers while the rogue is unguarded: the
    // others must meet the rogue first behind the guard.
    for &i in &victims[1..] {
        accept_ra(&lab.clients[i], false);
    }
    let rogue = rogue(&lab);

    // Without the guard the rogue is heard (the test can see a rogue at all).
    the_rogue_reaches_pod_1_unguarded(&lab, &rogue);
    let pod1 = &lab.clients[1];

    let mut guard = Guard::load().expect("load the guard programs (needs root)");
    for i in 0..PODS {
        guard
            .attach(&target(&lab, i), &PortPolicy::default())
            .expect("attach the guard");
    }
    // What pod 1 took from the rogue goes now the guard is on (before, a
    // late advertisement could put it back).
    pod1.ns.ip(&["-6", "route", "flush", "proto", "ra"]);
    assert_eq!(ra_routes(pod1).trim(), "");
    for &i in &victims {
        accept_ra(&lab.clients[i], true);
    }
    let advertised_before = rogue.log().matches("DHCPADVERTISE").count();
    // A real client (dhcpcd) in every pod at the same time: none leases.
    let (heard, leases): (Vec<Heard>, Vec<_>) = std::thread::scope(|scope| {
        let runs: Vec<_> = victims
            .iter()
            .map(|&i| {
                let pod = &lab.clients[i];
                scope.spawn(move || GuestFs::new().dhcpcd6_once(&pod.ns, &pod.ifname, 6))
            })
            .collect();
        let heard = watch(&lab, &victims, false);
        let leases = runs
            .into_iter()
            .map(|r| r.join().expect("dhcpcd"))
            .collect();
        (heard, leases)
    });
    assert!(
        leases.iter().all(Option::is_none),
        "pods leased through the guard: {leases:?}"
    );
    for (&i, h) in victims.iter().zip(&heard) {
        assert_eq!(
            *h,
            Heard::default(),
            "pod {i} heard the rogue through the guard"
        );
        let routes = ra_routes(&lab.clients[i]);
        assert_eq!(routes.trim(), "", "pod {i} took routes from the rogue");
    }
    // The rogue did answer the SOLICITs, and advertise itself: the guard
    // dropped it all on its port, counted by reason.
    let log = rogue.log();
    assert!(
        log.matches("DHCPADVERTISE").count() > advertised_before,
        "the rogue answered the SOLICITs:\n{log}"
    );
    let rogue_port = guard.ifindex(&target(&lab, 0)).unwrap();
    let c = guard.counters(rogue_port).unwrap().unwrap();
    assert!(
        c.dropped_server_v6 >= victims.len() as u64 && c.dropped_router_advertisement >= 2,
        "the rogue's ADVERTISEs and RAs were dropped: {c:?}"
    );
    assert_eq!(
        (c.dropped_server, c.dropped_unclassified_v6),
        (0, 0),
        "{c:?}"
    );
    // The victims' SOLICITs passed their own ports.
    for &i in &victims {
        let port = guard.ifindex(&target(&lab, i)).unwrap();
        let c = guard.counters(port).unwrap().unwrap();
        assert!(c.passed_client_v6 >= 1, "pod {i}'s SOLICIT: {c:?}");
    }

    // Detached (the pod's DEL), the rogue's port is open again.
    guard.detach(&target(&lab, 0)).expect("detach");
    let heard = watch(&lab, &[2], true);
    assert!(
        heard[0].dhcpv6 > 0 && heard[0].ra > 0,
        "detached, the port no longer guards: {heard:?}"
    );
}
