//! The DHCP guard end to end in network namespaces: pods on a bridge (each
//! a namespace behind a veth whose host end is a bridge port), the real
//! DHCP server on the bridge, the guard attached to the host end of every
//! pod port. Pods lease with a real client, busybox's `udhcpc`.
//!
//! - a real dnsmasq started as a rogue server inside one pod: without the
//!   guard its OFFERs reach the other pods; with it none does, and every
//!   other pod binds to the real server; a trusted port lets them through
//!   again; a detached port too;
//! - a DISCOVER flood from one pod: the real server sees at most the
//!   configured rate from that port, and the other pods bind meanwhile;
//! - a rogue OFFER under stacked VLAN tags crosses no guarded port.
//!
//! - through the agent: the `xdhcp` binary runs as `xdhcp agent` inside the
//!   bridge's namespace (the "node"), the plugin's ADD puts the guard on
//!   the pod's port, DEL takes it off, and a VM's port drops crafted
//!   client messages from other MACs; a pod's port drops a RELEASE or
//!   DECLINE in a neighbour pod's name and DISCOVERs with made-up MACs.
//!
//! Needs root; fails, never skips, without it.

mod agent_support;

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use agent_support::NodeAgent;
use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode};
use dhcproto::{Encodable as _, Encoder};
use xdhcp::datapath::ebpf::{AttachTarget, GUARD_PIN_DIR, Guard, PortPolicy};
use xdhcp::datapath::frame::{FrameHeaders, build_udp_frame, parse_udp_frame};
use xdhcp_common::guard::GuardPort;
use xdhcp_tests::servers::ROGUE_IP;
use xdhcp_tests::{Dnsmasq, DnsmasqConfig, Lab, LabClient};

fn target(lab: &Lab, i: usize) -> AttachTarget {
    AttachTarget {
        ifname: lab.clients[i].port().to_owned(),
        netns: Some(lab.server.path().to_path_buf()),
    }
}

/// A real dnsmasq inside pod 0, serving its own range on the pod's interface.
fn rogue(lab: &Lab) -> Dnsmasq {
    let pod = &lab.clients[0];
    Dnsmasq::rogue(&pod.ns, &pod.ifname, None)
}

/// What `udhcpc` bound to: (address, server identifier).
type Bound = Option<(Ipv4Addr, Ipv4Addr)>;

/// Runs busybox `udhcpc` once in `pod` (three DISCOVERs, 1 s apart at
/// most); its script records the lease it binds.
fn udhcpc(pod: &LabClient) -> Bound {
    xdhcp_tests::udhcpc_once(&pod.ns, &pod.ifname)
}

/// An AF_PACKET socket (all protocols) on the pod's interface, made in its
/// namespace, with a 100 ms receive timeout.
fn packet_socket(pod: &LabClient) -> OwnedFd {
    packet_socket_on(&pod.ns, pod.ifindex)
}

/// An AF_PACKET socket (all protocols) on device `ifindex` of `ns`, with a
/// 100 ms receive timeout.
fn packet_socket_on(ns: &xdhcp_tests::NetNs, ifindex: u32) -> OwnedFd {
    ns.packet_socket(
        ifindex,
        libc::ETH_P_ALL as u16,
        Some(Duration::from_millis(100)),
    )
}

/// Counts DHCP server messages from the rogue that reach `pod` while
/// `udhcpc` runs there, and what it bound.
fn lease_watching_for_rogue(pod: &LabClient) -> (Bound, usize) {
    let sock = packet_socket(pod);
    let done = Arc::new(AtomicBool::new(false));
    let sniffer = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let mut seen = 0;
            let mut buf = vec![0u8; 4096];
            while !done.load(Ordering::Relaxed) {
                // SAFETY: receiving into an owned buffer.
                let n =
                    unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                let Ok(n) = usize::try_from(n) else { continue };
                if let Ok((h, _)) = parse_udp_frame(&buf[..n])
                    && h.src_port == 67
                    && h.src_ip == ROGUE_IP
                {
                    seen += 1;
                }
            }
            seen
        })
    };
    let bound = udhcpc(pod);
    // Late OFFERs from the other server.
    std::thread::sleep(Duration::from_millis(300));
    done.store(true, Ordering::Relaxed);
    (bound, sniffer.join().expect("sniffer"))
}

fn from_real_server(lab: &Lab, bound: Bound) -> bool {
    bound.is_some_and(|(ip, server)| {
        server == lab.server_ip && ip.octets()[..3] == lab.server_ip.octets()[..3]
    })
}

fn load_guard() -> Guard {
    Guard::load().expect("load the guard programs (needs root)")
}

#[test]
fn rogue_dnsmasq_in_a_pod_reaches_no_other_pod_and_every_pod_binds_to_the_real_server() {
    let lab = Lab::with_clients(4);
    let _server = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let rogue = rogue(&lab);

    // Without the guard the rogue is heard (the test can see a rogue at all).
    let (_, heard) = lease_watching_for_rogue(&lab.clients[1]);
    assert!(
        heard > 0,
        "the rogue dnsmasq's OFFERs reach other pods without the guard"
    );

    let mut guard = load_guard();
    for i in 0..lab.clients.len() {
        guard
            .attach(&target(&lab, i), &PortPolicy::default())
            .expect("attach the guard");
    }
    for i in 1..lab.clients.len() {
        let (bound, heard) = lease_watching_for_rogue(&lab.clients[i]);
        assert_eq!(heard, 0, "pod {i} heard the rogue through the guard");
        assert!(
            from_real_server(&lab, bound),
            "pod {i} bound {bound:?}, not to the real server"
        );
    }
    let rogue_port = guard.ifindex(&target(&lab, 0)).unwrap();
    let c = guard.counters(rogue_port).unwrap().unwrap();
    assert!(
        c.dropped_server >= 3,
        "the rogue's OFFERs were dropped: {c:?}"
    );
    let log = std::fs::read_to_string(rogue.log_file()).unwrap_or_default();
    assert!(log.contains("DHCPOFFER"), "the rogue did answer:\n{log}");

    // Detached (the pod's DEL), the port is open again.
    guard.detach(&target(&lab, 0)).expect("detach");
    assert_eq!(
        guard.counters(rogue_port).unwrap(),
        None,
        "counters removed"
    );
    let (_, heard) = lease_watching_for_rogue(&lab.clients[2]);
    assert!(heard > 0, "detached, the port no longer guards");
}

#[test]
fn a_trusted_port_passes_its_servers_messages() {
    let lab = Lab::with_clients(2);
    let _rogue = rogue(&lab);
    let mut guard = load_guard();
    guard
        .attach(
            &target(&lab, 0),
            &PortPolicy {
                trusted: true,
                ..PortPolicy::default()
            },
        )
        .unwrap();
    guard
        .attach(&target(&lab, 1), &PortPolicy::default())
        .unwrap();
    // The only server is the one on the trusted port: pod 1 binds to it.
    let (bound, heard) = lease_watching_for_rogue(&lab.clients[1]);
    assert!(heard > 0);
    assert_eq!(
        bound.map(|b| b.1),
        Some(ROGUE_IP),
        "pod 1 bound to the trusted server"
    );
    let c = guard
        .counters(guard.ifindex(&target(&lab, 0)).unwrap())
        .unwrap()
        .unwrap();
    assert!(c.passed_trusted_server >= 2, "{c:?}");
    assert_eq!(c.dropped_server, 0);
}

/// Sends DISCOVERs from `pod`, each with its own made-up MAC (an address
/// pool starvation attempt), for `how_long`; returns how many and the time
/// from first to last.
fn flood(pod: &LabClient, how_long: Duration) -> (u32, Duration) {
    let tx = packet_socket(pod);
    let start = Instant::now();
    let mut sent = 0u32;
    while start.elapsed() < how_long {
        let mac = [
            0x02,
            0xf1,
            0,
            (sent >> 16) as u8,
            (sent >> 8) as u8,
            sent as u8,
        ];
        xdhcp_tests::frames::send(
            &tx,
            &xdhcp_tests::frames::discover(mac, mac, 0xf100_0000 | sent),
        );
        sent += 1;
        std::thread::sleep(Duration::from_micros(200));
    }
    (sent, start.elapsed())
}

fn discovers_in_log(log: &Path, mac_prefix: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("DHCPDISCOVER(") && l.contains(mac_prefix))
        .count()
}

#[test]
fn a_discover_flood_from_one_pod_reaches_the_server_at_the_ports_rate() {
    let lab = Lab::with_clients(3);
    let server = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let mut guard = load_guard();
    let policy = PortPolicy {
        rate: 20,
        burst: 10,
        ..PortPolicy::default()
    };
    for i in 0..lab.clients.len() {
        guard.attach(&target(&lab, i), &policy).unwrap();
    }
    let (sent, elapsed) = std::thread::scope(|s| {
        let flooder = s.spawn(|| flood(&lab.clients[0], Duration::from_secs(3)));
        // The other pods lease while the flood runs.
        std::thread::sleep(Duration::from_millis(300));
        let others: Vec<_> = (1..lab.clients.len())
            .map(|i| {
                let pod = &lab.clients[i];
                s.spawn(move || udhcpc(pod))
            })
            .collect();
        for (i, h) in others.into_iter().enumerate() {
            let bound = h.join().expect("udhcpc thread");
            assert!(
                from_real_server(&lab, bound),
                "pod {} did not bind during the flood: {bound:?}",
                i + 1
            );
        }
        flooder.join().expect("flood thread")
    });
    // dnsmasq logs each DISCOVER it reads; give it a moment for the last.
    std::thread::sleep(Duration::from_millis(500));
    // The burst, the rate over the flood's time (rounded up), and one more
    // for the clock's tick.
    let ms = u64::try_from(elapsed.as_millis()).unwrap();
    let allowed = u64::from(policy.burst) + (u64::from(policy.rate) * ms).div_ceil(1000) + 1;
    let seen = discovers_in_log(&server.log_file(), "02:f1:00:");
    let c = guard
        .counters(guard.ifindex(&target(&lab, 0)).unwrap())
        .unwrap()
        .unwrap();
    assert!(sent > 1000, "the flood sent only {sent}");
    assert!(
        u64::try_from(seen).unwrap() <= allowed && c.passed_client <= allowed,
        "server saw {seen} DISCOVERs, guard passed {}, of {sent} in {elapsed:?} (at most {allowed})",
        c.passed_client
    );
    assert!(
        seen >= policy.burst as usize,
        "the server saw the burst at least: {seen}"
    );
    assert_eq!(c.passed_client + c.dropped_rate, u64::from(sent), "{c:?}");
}

/// One crafted DISCOVER from inside `pod`: Ethernet source `src`, `chaddr`
/// `chaddr`, xid `xid`.
fn send_discover(tx: &OwnedFd, src: [u8; 6], chaddr: [u8; 6], xid: u32) {
    xdhcp_tests::frames::send(tx, &xdhcp_tests::frames::discover(src, chaddr, xid));
}

/// xids of the DISCOVERs the server namespace sees on the bridge.
fn server_sees(sock: &OwnedFd, within: Duration) -> Vec<u32> {
    let deadline = Instant::now() + within;
    let mut xids = Vec::new();
    let mut buf = vec![0u8; 4096];
    while Instant::now() < deadline {
        // SAFETY: receiving into an owned buffer.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        let Ok(n) = usize::try_from(n) else { continue };
        if let Ok((h, p)) = parse_udp_frame(&buf[..n])
            && h.dst_port == 67
            && p.len() >= 8
        {
            xids.push(u32::from_be_bytes([p[4], p[5], p[6], p[7]]));
        }
    }
    xids
}

#[test]
fn a_vm_port_passes_only_the_vms_own_client_messages() {
    let lab = Lab::with_clients(1);
    let vm = &lab.clients[0];
    let vm_mac = [0x02, 0x00, 0x5e, 0x10, 0x00, 0x01];
    let other = [0x02, 0x00, 0x5e, 0x10, 0x00, 0x99];
    let mut guard = load_guard();
    let port = guard
        .attach(
            &target(&lab, 0),
            &PortPolicy {
                single_client: Some(vm_mac),
                rate: 0,
                ..PortPolicy::default()
            },
        )
        .unwrap();
    // What reaches the bridge, seen from the server's side of it.
    let bridge = packet_socket_on(&lab.server, lab.server.ifindex(Lab::BRIDGE));
    let tx = packet_socket(vm);
    // The VM's own MAC both ways; another MAC as source, as chaddr, as both.
    send_discover(&tx, vm_mac, vm_mac, 1);
    send_discover(&tx, other, vm_mac, 2);
    send_discover(&tx, vm_mac, other, 3);
    send_discover(&tx, other, other, 4);
    // The interface's own MAC is not the VM's either (bridge binding: the
    // guest's MAC is the VM's, the launcher's interface has another).
    send_discover(&tx, vm.mac, vm.mac, 5);
    let seen = server_sees(&bridge, Duration::from_millis(500));
    assert_eq!(seen, [1], "only the VM's own message crossed the port");
    let c = guard.counters(port).unwrap().unwrap();
    assert_eq!((c.passed_client, c.dropped_spoof), (1, 4), "{c:?}");
}

/// The egress program only copies a learning port's replies to the guard
/// ring, yet it would run on every frame towards every workload: a port
/// has the egress filter exactly while its policy learns, and a filter an
/// earlier agent left that the port's policy no longer needs is removed
/// when the port is taken over.
#[test]
fn a_port_has_the_egress_filter_only_while_its_policy_learns() {
    let lab = Lab::with_clients(1);
    let port = lab.clients[0].port().to_owned();
    let learning = PortPolicy {
        single_client: Some([0x02, 0x00, 0x5e, 0x10, 0x00, 0x01]),
        learn: true,
        ..PortPolicy::default()
    };
    let mut guard = load_guard();
    guard
        .attach(&target(&lab, 0), &PortPolicy::default())
        .unwrap();
    assert_eq!(guard_filters(&lab.server, &port), (1, 0), "a pod's port");
    guard.update(&target(&lab, 0), &learning).unwrap();
    assert_eq!(guard_filters(&lab.server, &port), (1, 1), "now learning");
    guard
        .update(&target(&lab, 0), &PortPolicy::default())
        .unwrap();
    assert_eq!(
        guard_filters(&lab.server, &port),
        (1, 0),
        "learning no more"
    );

    // A learning port left by an agent that stopped, taken over by the
    // next one with a policy that does not learn.
    guard.update(&target(&lab, 0), &learning).unwrap();
    drop(guard);
    assert_eq!(guard_filters(&lab.server, &port), (1, 1), "left in place");
    let mut next = load_guard();
    next.attach(&target(&lab, 0), &PortPolicy::default())
        .unwrap();
    assert_eq!(guard_filters(&lab.server, &port), (1, 0), "taken over");
    next.detach(&target(&lab, 0)).unwrap();
    assert_eq!(guard_filters(&lab.server, &port), (0, 0), "detached");
}

#[test]
fn detaching_a_port_whose_device_is_gone_cleans_up() {
    let mut lab = Lab::with_clients(1);
    let mut guard = load_guard();
    let t = target(&lab, 0);
    let ifindex = guard.attach(&t, &PortPolicy::default()).unwrap();
    assert!(guard.policy(ifindex).unwrap().is_some());
    // The workload goes first (its namespace and veth are deleted).
    drop(lab.clients.pop());
    guard.detach(&t).expect("detach after the device is gone");
    assert_eq!(guard.policy(ifindex).unwrap(), None);
    assert_eq!(guard.counters(ifindex).unwrap(), None);
    assert!(guard.ports().is_empty());
}

// ------------------------------------------------------- through the agent --

/// The plugin's ADD or DEL for `pod` (container id `cid`) through
/// `agent`, as a runtime calls the IPAM plugin.
fn ipam_call(
    agent: &NodeAgent,
    cni: &agent_support::CniPath,
    command: &str,
    cid: &str,
    pod: &LabClient,
    ipam: &str,
) -> agent_support::PluginOutput {
    let config = format!(
        r#"{{"cniVersion":"1.0.0","name":"guardnet","type":"bridge","ipam":{{"type":"xdhcp","socketPath":"{}"{ipam}}}}}"#,
        agent.socket.display()
    );
    agent_support::invoke(
        &cni.plugin("xdhcp"),
        None,
        command,
        cid,
        Some(pod.ns.path()),
        &pod.ifname,
        cni.dir.path(),
        &config,
    )
}

fn leased_ip(out: &agent_support::PluginOutput) -> Ipv4Addr {
    assert!(out.ok, "ADD failed: {}", out.text());
    let a = out.json["ips"][0]["address"].as_str().expect("an address");
    a.split('/').next().unwrap().parse().expect("IPv4")
}

#[test]
fn agent_add_guards_the_pods_port_and_del_removes_the_guard() {
    let lab = Lab::with_clients(3);
    let _server = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let agent = NodeAgent::start(&lab.server, &[]);
    let cni = agent_support::CniPath::new();

    // Pod 0 gets its lease, then starts a DHCP server of its own.
    let ip0 = leased_ip(&ipam_call(&agent, &cni, "ADD", "pod0", &lab.clients[0], ""));
    assert_eq!(ip0.octets()[..3], [192, 0, 2]);
    let _rogue = rogue(&lab);
    assert!(
        agent.log().contains("DHCP guard on"),
        "the ADD put the guard on:\n{}",
        agent.log()
    );
    // Pod 1 (not under the agent) hears nothing from it.
    let (bound, heard) = lease_watching_for_rogue(&lab.clients[1]);
    assert_eq!(heard, 0, "the rogue was heard through the guarded port");
    assert!(from_real_server(&lab, bound), "{bound:?}");
    // Pod 2's ADD through the agent binds to the real server.
    let ip2 = leased_ip(&ipam_call(&agent, &cni, "ADD", "pod2", &lab.clients[2], ""));
    assert_eq!(
        ip2.octets()[..3],
        [192, 0, 2],
        "pod 2 leased from the real server"
    );

    // DEL of pod 0 takes the guard off: the rogue is heard again.
    let del = ipam_call(&agent, &cni, "DEL", "pod0", &lab.clients[0], "");
    assert!(del.ok, "DEL failed: {}", del.text());
    assert!(
        agent.log().contains("DHCP guard detached"),
        "{}",
        agent.log()
    );
    let (_, heard) = lease_watching_for_rogue(&lab.clients[1]);
    assert!(heard > 0, "after DEL the port is no longer guarded");
}

/// The guard filters on `port` (in `ns`), ingress and egress:
/// `tc filter show` lines naming the guard programs.
fn guard_filters(ns: &xdhcp_tests::NetNs, port: &str) -> (usize, usize) {
    let count = |dir: &str| {
        ns.exec(&["tc", "filter", "show", "dev", port, dir])
            .lines()
            .filter(|l| l.contains("xdhcp_guard"))
            .count()
    };
    (count("ingress"), count("egress"))
}

#[test]
fn the_guard_stays_on_while_the_agent_restarts_and_the_next_agent_takes_it_over() {
    let lab = Lab::with_clients(2);
    let _server = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let agent = NodeAgent::start(&lab.server, &[]);
    let cni = agent_support::CniPath::new();
    let port = lab.clients[0].port().to_owned();
    leased_ip(&ipam_call(&agent, &cni, "ADD", "pod0", &lab.clients[0], ""));
    // A pod's port: the ingress filter only (nothing to learn).
    assert_eq!(guard_filters(&lab.server, &port), (1, 0), "{}", agent.log());

    // The agent stops: the port stays guarded, with the same filter.
    let dir = agent.stop();
    assert_eq!(guard_filters(&lab.server, &port), (1, 0));
    let _rogue = rogue(&lab);
    let (bound, heard) = lease_watching_for_rogue(&lab.clients[1]);
    assert_eq!(heard, 0, "the rogue was heard while no agent ran");
    assert!(from_real_server(&lab, bound), "{bound:?}");

    // The next agent resumes pod 0's lease and guards its port again,
    // replacing the filter rather than adding a second one.
    let agent = NodeAgent::start_in(&lab.server, &[], dir);
    assert!(
        xdhcp_tests::wait_until(Duration::from_secs(10), || agent
            .log()
            .contains("replaced a DHCP guard filter left by an earlier agent")),
        "{}",
        agent.log()
    );
    assert_eq!(guard_filters(&lab.server, &port), (1, 0), "{}", agent.log());
    let (_, heard) = lease_watching_for_rogue(&lab.clients[1]);
    assert_eq!(heard, 0, "the rogue was heard after the restart");

    // And its DEL takes them off.
    let del = ipam_call(&agent, &cni, "DEL", "pod0", &lab.clients[0], "");
    assert!(del.ok, "DEL failed: {}", del.text());
    assert_eq!(guard_filters(&lab.server, &port), (0, 0), "{}", agent.log());
    let (_, heard) = lease_watching_for_rogue(&lab.clients[1]);
    assert!(heard > 0, "after DEL the port is no longer guarded");
}

/// The program id of the guard's ingress filter on `port` (in `ns`), as
/// `tc filter show` names it.
fn guard_filter_program(ns: &xdhcp_tests::NetNs, port: &str) -> Option<u32> {
    let out = ns.exec(&["tc", "filter", "show", "dev", port, "ingress"]);
    let line = out.lines().find(|l| l.contains("xdhcp_guard"))?;
    let mut words = line.split_whitespace();
    words.find(|w| *w == "id")?;
    words.next()?.parse().ok()
}

/// The guard's pinned port table under the agent's `bpffs`: ifindex →
/// entry (settings, MAC, rate bucket).
fn pinned_guard_ports(bpffs: &Path) -> std::collections::BTreeMap<u32, GuardPort> {
    let pin = bpffs
        .join(GUARD_PIN_DIR)
        .join(xdhcp_common::guard::MAP_GUARD_PORTS);
    let Ok(data) = aya::maps::MapData::from_pin(&pin) else {
        return std::collections::BTreeMap::new();
    };
    let map: aya::maps::HashMap<_, u32, GuardPort> =
        aya::maps::HashMap::try_from(aya::maps::Map::HashMap(data)).expect("a hash map");
    map.iter().map(|kv| kv.expect("an entry")).collect()
}

/// The guard's pinned programs under the agent's `bpffs`
/// (`guard/progs/<stamp>/<program>`): (stamp, program) → program id.
fn pinned_guard_programs(bpffs: &Path) -> std::collections::BTreeMap<(String, String), u32> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(stamps) = std::fs::read_dir(bpffs.join(GUARD_PIN_DIR).join("progs")) else {
        return out;
    };
    for stamp in stamps.flatten() {
        for prog in std::fs::read_dir(stamp.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let info = aya::programs::ProgramInfo::from_pin(prog.path())
                .unwrap_or_else(|e| panic!("{}: {e}", prog.path().display()));
            out.insert(
                (
                    stamp.file_name().to_string_lossy().into_owned(),
                    prog.file_name().to_string_lossy().into_owned(),
                ),
                info.id(),
            );
        }
    }
    out
}

/// The id of the pinned program `name` of the one build pinned under
/// `bpffs` (panics unless exactly one build is).
fn pinned_guard_program(bpffs: &Path, name: &str) -> u32 {
    let pinned = pinned_guard_programs(bpffs);
    let stamps: std::collections::BTreeSet<_> = pinned.keys().map(|(s, _)| s.clone()).collect();
    assert_eq!(
        stamps.len(),
        1,
        "one build's guard programs pinned: {pinned:?}"
    );
    *pinned
        .iter()
        .find(|((_, n), _)| n == name)
        .unwrap_or_else(|| panic!("{name} not pinned: {pinned:?}"))
        .1
}

/// Puts another program (the object's do-nothing baseline, standing in for
/// another version) in the guard's filter on `port` of `ns`, as an older
/// agent's would be; its program id.
fn put_another_version(ns: &xdhcp_tests::NetNs, port: &str) -> u32 {
    let port = port.to_owned();
    ns.run_in(move || {
        let mut ebpf = aya::EbpfLoader::new()
            .load(xdhcp::datapath::ebpf::embedded_object())
            .unwrap();
        let prog: &mut aya::programs::SchedClassifier = ebpf
            .program_mut(xdhcp_common::guard::PROG_GUARD_PASS)
            .unwrap()
            .try_into()
            .unwrap();
        prog.load().unwrap();
        let left = aya::programs::tc::SchedClassifierLink::attached(
            &port,
            aya::programs::tc::TcAttachType::Ingress,
            1,
            aya::programs::tc::TcHandle::new(0, 0x7864),
            None,
        )
        .unwrap();
        let id = prog.attach_to_link(left).unwrap();
        // The filter keeps the program when this process is gone.
        std::mem::forget(prog.take_link(id).unwrap());
        prog.info().unwrap().id()
    })
}

/// `xdhcp unpin --bpffs-dir <bpffs>` run in `ns`; its output.
fn unpin_in(ns: &xdhcp_tests::NetNs, bpffs: &Path) -> String {
    let out = xdhcp_tests::netns_exec(ns.name(), &agent_support::xdhcp_bin())
        .arg("unpin")
        .arg("--bpffs-dir")
        .arg(bpffs)
        .env_remove("CNI_COMMAND")
        .output()
        .expect("run xdhcp unpin");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Removes the lease record of container `cid` from `state_dir` (its lease
/// ended while no agent ran).
fn remove_record(state_dir: &Path, cid: &str) {
    let stale = xdhcp_tests::agent::lease_record_files(state_dir)
        .into_iter()
        .find(|f| std::fs::read_to_string(f).is_ok_and(|t| t.contains(&format!("\"{cid}\""))))
        .unwrap_or_else(|| panic!("{cid}'s lease record"));
    std::fs::remove_file(stale).unwrap();
}

/// Has `pod` send one client message of its own, which spends from its
/// port's bucket; the port's pinned entry once it shows that.
fn spend_from_bucket(pod: &LabClient, bpffs: &Path, ifindex: u32) -> GuardPort {
    send_discover(&packet_socket(pod), pod.mac, pod.mac, 0x7e57_0001);
    let spent = || {
        pinned_guard_ports(bpffs)
            .get(&ifindex)
            .copied()
            .filter(|e| e.tat_ns != 0)
    };
    assert!(
        xdhcp_tests::wait_until(Duration::from_secs(5), || spent().is_some()),
        "no pinned entry with a spent bucket for the port: {:?}",
        pinned_guard_ports(bpffs)
    );
    spent().unwrap()
}

/// With `--bpffs-dir` on a bpffs, the guard's tables are pinned and handed
/// from one agent to the next with its filters: a pod's port stays guarded
/// through a SIGTERM and a SIGKILL (the same filter, a rogue OFFER from the
/// pod dropped while no agent runs and after), its entry — settings, MAC
/// and the rate bucket the pod's own DHCP left — is the very same entry
/// after each takeover (not one written afresh); a filter running another
/// program when the agent starts gets this agent's program in place (never
/// removed); a port whose lease ended while no agent ran loses its guard
/// once the next agent has taken over the rest; `xdhcp unpin` takes the
/// guard off every port and removes its pins.
#[test]
#[expect(
    clippy::too_many_lines,
    reason = "three agents' handovers and the uninstall, in order"
)]
fn the_guards_tables_and_filters_are_handed_over_and_unpin_removes_them() {
    let lab = Lab::with_clients(3);
    let _server = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let dir = tempfile::Builder::new()
        .prefix("xdt-agent-")
        .tempdir()
        .unwrap();
    let bpffs_mount = agent_support::BpffsMount::new(&dir.path().join("bpffs"));
    let bpffs = bpffs_mount.path.clone();
    let agent = NodeAgent::start_in(&lab.server, &[], dir);
    let cni = agent_support::CniPath::new();
    let (port, stale_port) = (
        lab.clients[0].port().to_owned(),
        lab.clients[2].port().to_owned(),
    );
    let ifindex = lab.server.ifindex(&port);
    let stale_ifindex = lab.server.ifindex(&stale_port);
    leased_ip(&ipam_call(&agent, &cni, "ADD", "pod0", &lab.clients[0], ""));
    leased_ip(&ipam_call(&agent, &cni, "ADD", "pod2", &lab.clients[2], ""));
    let filter = guard_filter_program(&lab.server, &port).expect("the guard's filter");
    let entry = spend_from_bucket(&lab.clients[0], &bpffs, ifindex);
    assert_eq!(entry.mac, lab.clients[0].mac, "the pod's single client");
    let _rogue = rogue(&lab);
    let replaced = |agent: &NodeAgent| {
        agent
            .log()
            .matches("replaced a DHCP guard filter left by an earlier agent")
            .count()
    };
    let from_pins = |agent: &NodeAgent| {
        agent
            .log()
            .matches("DHCP guard programs of this build taken from their pins")
            .count()
    };
    // The first agent loaded the guard's programs (its XDP twin with
    // them) and pinned them for the next one; its filter runs the pinned
    // ingress program.
    let programs = pinned_guard_programs(&bpffs);
    for name in [
        xdhcp_common::guard::PROG_GUARD_INGRESS,
        xdhcp_common::guard::PROG_GUARD_EGRESS,
        xdhcp_common::guard::PROG_GUARD_XDP,
    ] {
        pinned_guard_program(&bpffs, name);
    }
    assert_eq!(
        pinned_guard_program(&bpffs, xdhcp_common::guard::PROG_GUARD_INGRESS),
        filter
    );

    // The agent's log is one file across its restarts.
    let mut agent = agent;
    for (round, how) in ["SIGTERM", "SIGKILL"].into_iter().enumerate() {
        let before = replaced(&agent);
        let dir = if how == "SIGTERM" {
            agent.stop()
        } else {
            agent.kill()
        };
        assert_eq!(
            guard_filter_program(&lab.server, &port),
            Some(filter),
            "the same filter after {how}"
        );
        assert_eq!(pinned_guard_ports(&bpffs).get(&ifindex), Some(&entry));
        let (bound, heard) = lease_watching_for_rogue(&lab.clients[1]);
        assert_eq!(heard, 0, "the rogue was heard while no agent ran ({how})");
        assert!(from_real_server(&lab, bound), "{bound:?}");
        if how == "SIGKILL" {
            // pod2's lease ended while no agent ran: its record is gone.
            remove_record(&dir.path().join("state"), "pod2");
        }
        agent = NodeAgent::start_in(&lab.server, &[], dir);
        assert!(
            xdhcp_tests::wait_until(Duration::from_secs(10), || replaced(&agent) > before),
            "{}",
            agent.log()
        );
        assert_eq!(guard_filters(&lab.server, &port), (1, 0), "{}", agent.log());
        // The same build: the next agent took the guard's programs from
        // their pins (no load, no verifier), so the filter stayed and runs
        // the very same program.
        assert_eq!(from_pins(&agent), round + 1, "{}", agent.log());
        assert_eq!(
            pinned_guard_programs(&bpffs),
            programs,
            "the same pinned programs after {how}"
        );
        let now = guard_filter_program(&lab.server, &port).expect("the filter");
        assert_eq!(now, filter, "the same program on the port after {how}");
        assert_eq!(
            pinned_guard_ports(&bpffs).get(&ifindex),
            Some(&entry),
            "the next agent carries on with the same entry after {how}"
        );
        let (_, heard) = lease_watching_for_rogue(&lab.clients[1]);
        assert_eq!(heard, 0, "the rogue was heard after the restart ({how})");
    }
    // The port of the lease that ended while no agent ran is released once
    // the next agent has taken over the rest.
    assert!(
        xdhcp_tests::wait_until(Duration::from_secs(20), || !pinned_guard_ports(&bpffs)
            .contains_key(&stale_ifindex)),
        "{}",
        agent.log()
    );
    assert_eq!(guard_filters(&lab.server, &stale_port), (0, 0));
    assert!(pinned_guard_ports(&bpffs).contains_key(&ifindex));

    // Another version on the filter when the next agent starts (here the
    // object's do-nothing baseline): replaced in place, never removed.
    let before = replaced(&agent);
    let dir = agent.stop();
    let other = put_another_version(&lab.server, &port);
    assert_eq!(guard_filter_program(&lab.server, &port), Some(other));
    let agent = NodeAgent::start_in(&lab.server, &[], dir);
    assert!(
        xdhcp_tests::wait_until(Duration::from_secs(10), || replaced(&agent) > before),
        "{}",
        agent.log()
    );
    let now = guard_filter_program(&lab.server, &port).expect("the filter");
    assert_ne!(
        now, other,
        "this agent's program replaced the other version"
    );
    assert_eq!(now, filter, "the program this agent took from its pin");
    let (_, heard) = lease_watching_for_rogue(&lab.clients[1]);
    assert_eq!(heard, 0, "the rogue was heard after the update");

    // Uninstalled.
    // (The directory stays until the end: removing it would remove the pins.)
    let _dir = agent.stop();
    // In the node's namespace, where the ports' host ends are.
    let out = unpin_in(&lab.server, &bpffs);
    assert!(out.contains("removed"), "{out}");
    assert_eq!(guard_filters(&lab.server, &port), (0, 0), "{out}");
    assert!(!bpffs.join(GUARD_PIN_DIR).exists(), "{out}");
    let (_, heard) = lease_watching_for_rogue(&lab.clients[1]);
    assert!(heard > 0, "after unpin the port is no longer guarded");
    // Unmounted before the agent's directory is removed, which a mount in
    // it would keep.
    drop(bpffs_mount);
}

/// The guard's programs of another build pinned when an agent starts (an
/// upgrade: the previous build's programs run on the ports' filters and
/// are pinned under their own stamp): the agent loads and pins its own,
/// puts them in the filters in place — the port's filter is never absent
/// while the agent stops and starts — and removes the other build's pins.
#[test]
fn a_guard_of_another_build_is_replaced_in_place_and_its_pins_removed() {
    let lab = Lab::with_clients(1);
    let _server = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let dir = tempfile::Builder::new()
        .prefix("xdt-agent-")
        .tempdir()
        .unwrap();
    let bpffs_mount = agent_support::BpffsMount::new(&dir.path().join("bpffs"));
    let bpffs = bpffs_mount.path.clone();
    let agent = NodeAgent::start_in(&lab.server, &[], dir);
    let cni = agent_support::CniPath::new();
    let port = lab.clients[0].port().to_owned();
    leased_ip(&ipam_call(&agent, &cni, "ADD", "pod0", &lab.clients[0], ""));
    let ingress = xdhcp_common::guard::PROG_GUARD_INGRESS;
    let old = guard_filter_program(&lab.server, &port).expect("the guard's filter");
    assert_eq!(pinned_guard_program(&bpffs, ingress), old);
    let old_pins = pinned_guard_programs(&bpffs);

    // Watches the port's filter from here to the end of the next start.
    let stop_watching = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (ns, tc, port, stop) = (
            lab.server.name().to_owned(),
            xdhcp_tests::program("tc"),
            port.clone(),
            stop_watching.clone(),
        );
        std::thread::spawn(move || {
            let (mut looks, mut absent) = (0u32, 0u32);
            while !stop.load(Ordering::Relaxed) {
                let out = xdhcp_tests::netns_exec(&ns, tc)
                    .args(["filter", "show", "dev", &port, "ingress"])
                    .output()
                    .expect("run tc");
                looks += 1;
                if !String::from_utf8_lossy(&out.stdout).contains("xdhcp_guard") {
                    absent += 1;
                }
            }
            (looks, absent)
        })
    };

    // The pins become another build's: the stamp differs from this
    // agent's (their programs are the ones the filter runs).
    let dir = agent.stop();
    let progs = bpffs.join(GUARD_PIN_DIR).join("progs");
    let (stamp, _) = old_pins.keys().next().cloned().expect("a pinned program");
    let other = "00000000000000ff";
    assert_ne!(stamp, other);
    std::fs::rename(progs.join(&stamp), progs.join(other)).expect("rename the pin directory");
    let agent = NodeAgent::start_in(&lab.server, &[], dir);
    assert!(
        xdhcp_tests::wait_until(Duration::from_secs(10), || agent
            .log()
            .contains("replaced a DHCP guard filter left by an earlier agent")),
        "{}",
        agent.log()
    );
    stop_watching.store(true, Ordering::Relaxed);
    let (looks, absent) = watcher.join().unwrap();
    assert!(looks > 1, "the filter was looked at {looks} times");
    assert_eq!(
        absent, 0,
        "the port's filter was absent {absent} of {looks} times"
    );
    let log = agent.log();
    assert!(log.contains("DHCP guard programs loaded"), "{log}");
    assert!(
        !log.contains("DHCP guard programs of this build taken from their pins"),
        "{log}"
    );
    // Its own programs, pinned under its stamp; the other build's pins
    // gone; the filter runs the new ingress program.
    let now = guard_filter_program(&lab.server, &port).expect("the filter");
    assert_ne!(now, old, "the new build's program is in the filter");
    assert_eq!(pinned_guard_program(&bpffs, ingress), now);
    let new_pins = pinned_guard_programs(&bpffs);
    assert!(
        new_pins.keys().all(|(s, _)| *s == stamp),
        "the other build's pins were not removed: {new_pins:?}"
    );
    assert_eq!(
        new_pins.keys().map(|(_, n)| n).collect::<Vec<_>>(),
        old_pins.keys().map(|(_, n)| n).collect::<Vec<_>>(),
        "every guard program pinned again"
    );
    for (k, id) in &new_pins {
        assert!(
            !old_pins.values().any(|o| o == id),
            "{k:?} was not loaded anew"
        );
    }
    assert_eq!(guard_filters(&lab.server, &port), (1, 0), "{log}");
    let _dir = agent.stop();
    // Unmounted before the agent's directory is removed, which a mount in
    // it would keep.
    drop(bpffs_mount);
}

/// A network config (a NAD a tenant may write) that asks for a trusted
/// port is not believed: the port stays guarded unless the agent's own
/// flags name the network.
#[test]
fn a_network_config_alone_cannot_make_a_port_trusted() {
    let lab = Lab::with_clients(2);
    let _server = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let agent = NodeAgent::start(&lab.server, &[]);
    let cni = agent_support::CniPath::new();
    let trusted = r#","dhcpGuard":{"trusted":true,"rate":10000,"burst":10000}"#;
    leased_ip(&ipam_call(
        &agent,
        &cni,
        "ADD",
        "pod0",
        &lab.clients[0],
        trusted,
    ));
    let _rogue = rogue(&lab);
    let (_, heard) = lease_watching_for_rogue(&lab.clients[1]);
    assert_eq!(heard, 0, "a NAD alone made its port trusted");
}

#[test]
fn agent_honours_a_trusted_network() {
    let lab = Lab::with_clients(2);
    let _server = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let agent = NodeAgent::start(&lab.server, &["--dhcp-guard-trusted-network", "guardnet"]);
    let cni = agent_support::CniPath::new();
    let trusted = r#","dhcpGuard":{"trusted":true}"#;
    leased_ip(&ipam_call(
        &agent,
        &cni,
        "ADD",
        "pod0",
        &lab.clients[0],
        trusted,
    ));
    let _rogue = rogue(&lab);
    let (_, heard) = lease_watching_for_rogue(&lab.clients[1]);
    assert!(heard > 0, "a trusted port passes its server's messages");
    // A bad guard field is a CNI error naming it.
    let out = ipam_call(
        &agent,
        &cni,
        "ADD",
        "pod1",
        &lab.clients[1],
        r#","dhcpGuard":{"rate":0}"#,
    );
    assert!(!out.ok);
    assert!(out.text().contains("ipam.dhcpGuard.rate"), "{}", out.text());
}

/// Where a test agent serves its metrics: inside the lab's node namespace,
/// so a fixed port cannot collide.
const METRICS: &str = "127.0.0.1:9464";

/// The guard's drops on `port` for `reason` in `family` (`ipv4`,
/// `ipv6`), from the agent's metrics.
fn guard_drops(lab: &Lab, port: &str, reason: &str, family: &str) -> u64 {
    let addr: std::net::SocketAddr = METRICS.parse().expect("an address");
    let text = lab
        .server
        .run_in(move || xdhcp_tests::bench::http_get(addr, "/metrics"))
        .unwrap_or_default();
    let (port, reason) = (format!("port=\"{port}\""), format!("reason=\"{reason}\""));
    let family = format!("family=\"{family}\"");
    text.lines()
        .filter(|l| {
            l.contains("guard_dropped_frames{")
                && l.contains(&port)
                && l.contains(&reason)
                && l.contains(&family)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A client message of type `mt` from inside a pod: Ethernet source `src`,
/// `chaddr`, client identifier `01` + `id`, `ciaddr`, and for a DECLINE the
/// address declined; IP from `src_ip` to `dst_ip`.
#[expect(
    clippy::too_many_arguments,
    reason = "one crafted message, every field named"
)]
fn send_client_message(
    tx: &OwnedFd,
    mt: MessageType,
    src: [u8; 6],
    chaddr: [u8; 6],
    id: [u8; 6],
    ciaddr: Ipv4Addr,
    requested: Option<Ipv4Addr>,
    (src_ip, dst_ip): (Ipv4Addr, Ipv4Addr),
    server: Ipv4Addr,
) {
    let mut m = Message::default();
    m.set_opcode(Opcode::BootRequest)
        .set_xid(0x0bad_0000 | u32::from(id[5]))
        .set_ciaddr(ciaddr)
        .set_chaddr(&chaddr);
    let mut client_id = vec![1];
    client_id.extend_from_slice(&id);
    let opts = m.opts_mut();
    opts.insert(DhcpOption::MessageType(mt));
    opts.insert(DhcpOption::ServerIdentifier(server));
    opts.insert(DhcpOption::ClientIdentifier(client_id));
    if let Some(ip) = requested {
        opts.insert(DhcpOption::RequestedIpAddress(ip));
    }
    let mut payload = Vec::new();
    m.encode(&mut Encoder::new(&mut payload)).expect("encode");
    let frame = build_udp_frame(
        &FrameHeaders {
            src_mac: src,
            dst_mac: [0xff; 6],
            vlan: None,
            src_ip,
            dst_ip,
            src_port: 68,
            dst_port: 67,
        },
        &payload,
    );
    // SAFETY: sending a buffer on a bound packet socket.
    let n = unsafe { libc::send(tx.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
    assert_eq!(
        n,
        frame.len() as isize,
        "send: {}",
        std::io::Error::last_os_error()
    );
}

/// A pod's port has the single-client rule on the pod's own MAC: a RELEASE
/// or DECLINE in a neighbour pod's name (its `chaddr`, or its `01` + MAC
/// client identifier with the pod's own `chaddr`) and DISCOVERs with
/// made-up MACs never reach the server, and are counted; the pod's own
/// RELEASE does.
#[test]
fn a_pod_cannot_release_or_decline_in_a_neighbours_name() {
    let lab = Lab::with_clients(2);
    let server = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let agent = NodeAgent::start(&lab.server, &["--metrics-addr", METRICS]);
    let cni = agent_support::CniPath::new();
    let (attacker, victim) = (&lab.clients[0], &lab.clients[1]);
    let own_ip = leased_ip(&ipam_call(&agent, &cni, "ADD", "pod0", attacker, ""));
    let victim_ip = leased_ip(&ipam_call(&agent, &cni, "ADD", "pod1", victim, ""));
    let held = server.lease_for(victim.mac).expect("the victim's lease");
    assert_eq!(held.ip, victim_ip);

    let tx = packet_socket(attacker);
    let to_server = (own_ip, lab.server_ip);
    let broadcast = (Ipv4Addr::UNSPECIFIED, Ipv4Addr::BROADCAST);
    let (me, them) = (attacker.mac, victim.mac);
    // RELEASE of the victim's address: with the pod's own chaddr and the
    // victim's client identifier (by which dnsmasq finds the lease first),
    // then with the victim's chaddr too.
    for (chaddr, id) in [(me, them), (them, them)] {
        let r = MessageType::Release;
        send_client_message(
            &tx,
            r,
            me,
            chaddr,
            id,
            victim_ip,
            None,
            to_server,
            lab.server_ip,
        );
    }
    // DECLINE of it, both ways: the server would take it out of its pool.
    for (chaddr, id) in [(me, them), (them, them)] {
        let d = MessageType::Decline;
        let ip = Ipv4Addr::UNSPECIFIED;
        send_client_message(
            &tx,
            d,
            me,
            chaddr,
            id,
            ip,
            Some(victim_ip),
            broadcast,
            lab.server_ip,
        );
    }
    // Pool starvation: DISCOVERs with a made-up MAC, as source and chaddr
    // or as chaddr only.
    let fresh = [0x02, 0xf1, 0, 0, 0, 1];
    send_discover(&tx, fresh, fresh, 0xf1);
    send_discover(&tx, me, fresh, 0xf2);

    // The server saw none of them: the victim's lease is intact.
    std::thread::sleep(Duration::from_secs(1));
    let log = server.log();
    assert!(
        !log.contains("DHCPRELEASE") && !log.contains("DHCPDECLINE"),
        "a message in the neighbour's name reached the server:\n{log}"
    );
    assert_eq!(
        discovers_in_log(&server.log_file(), "02:f1:00:"),
        0,
        "{log}"
    );
    let still = server
        .lease_for(victim.mac)
        .expect("the victim's lease is kept");
    assert_eq!(still.ip, victim_ip);
    // And the guard counted each (the metrics are copied every 2 s).
    let port = attacker.port();
    assert!(
        xdhcp_tests::wait_until(Duration::from_secs(10), || guard_drops(
            &lab, port, "spoof", "ipv4"
        ) == 6),
        "the guard counted {} spoofed messages on the pod's port, not 6\n{}",
        guard_drops(&lab, port, "spoof", "ipv4"),
        agent.log()
    );

    // The pod's own RELEASE, in its own name, passes (and the server acts
    // on it: the messages above were ones it would have taken).
    send_client_message(
        &tx,
        MessageType::Release,
        me,
        me,
        me,
        own_ip,
        None,
        to_server,
        lab.server_ip,
    );
    assert!(
        server.wait_for_log("DHCPRELEASE", Duration::from_secs(5)),
        "the pod's own RELEASE did not reach the server:\n{}",
        server.log()
    );
    assert!(
        xdhcp_tests::wait_until(Duration::from_secs(5), || server.lease_for(me).is_none()),
        "{}",
        server.log()
    );
    assert!(server.lease_for(victim.mac).is_some());

    ipv6_drops_are_named_by_family(&lab, &agent, &tx, me);
}

/// The end of [`a_pod_cannot_release_or_decline_in_a_neighbours_name`]:
/// the same port polices IPv6, a router advertisement and a DHCPv6
/// ADVERTISE from the pod are dropped, and the metrics and `xdhcp status`
/// name the family and the reason (the six IPv4 spoofs before them too).
fn ipv6_drops_are_named_by_family(lab: &Lab, agent: &NodeAgent, tx: &OwnedFd, me: [u8; 6]) {
    let port = lab.clients[0].port();
    xdhcp_tests::frames::send(
        tx,
        &ipv6_frame(me, 58, &[134, 0, 0, 0, 64, 0, 7, 8, 0, 0, 0, 0, 0, 0, 0, 0]),
    );
    let advertise = [2u8, 0x5e, 0xed, 0x06, 0, 8, 0, 2, 0, 0];
    let mut udp = [
        547u16.to_be_bytes(),
        546u16.to_be_bytes(),
        18u16.to_be_bytes(),
        [0, 0],
    ]
    .concat();
    udp.extend_from_slice(&advertise);
    xdhcp_tests::frames::send(tx, &ipv6_frame(me, 17, &udp));
    let v6_drops = |reason: &str| guard_drops(lab, port, reason, "ipv6");
    assert!(
        xdhcp_tests::wait_until(Duration::from_secs(10), || v6_drops("router_advertisement")
            == 1
            && v6_drops("server") == 1),
        "the guard counted {} RAs and {} DHCPv6 server messages on the pod's port, not 1 each\n{}",
        v6_drops("router_advertisement"),
        v6_drops("server"),
        agent.log()
    );
    let status = agent.status();
    let row = status
        .guarded_ports
        .iter()
        .find(|p| p.port == port)
        .expect("the pod's port in xdhcp status");
    let want: std::collections::BTreeMap<String, u64> = [
        ("ipv4.spoof", 6),
        ("ipv6.router_advertisement", 1),
        ("ipv6.server", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(row.drops, want, "{row:?}");
}

/// An IPv6 frame from `src` (link-local source, to `ff02::1`) carrying
/// `payload` as next header `proto`; checksums left zero (the guard reads
/// none).
fn ipv6_frame(src: [u8; 6], proto: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x33, 0x33, 0, 0, 0, 1];
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
    f.extend_from_slice(&u16::try_from(payload.len()).unwrap().to_be_bytes());
    f.extend_from_slice(&[proto, 255, 0xfe, 0x80, 0, 0, 0, 0, 0, 0]);
    f.extend_from_slice(&[
        src[0] ^ 2,
        src[1],
        src[2],
        0xff,
        0xfe,
        src[3],
        src[4],
        src[5],
    ]);
    f.extend_from_slice(&[0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    f.extend_from_slice(payload);
    f
}

/// An OFFER from a rogue in `pod` (source port 67, the rogue's address),
/// with VLAN tags of `tpids` (outermost first) after the MAC addresses.
fn tagged_offer(pod: &LabClient, tpids: &[u16], xid: u32) -> Vec<u8> {
    let mut m = Message::default();
    m.set_opcode(Opcode::BootReply)
        .set_xid(xid)
        .set_yiaddr(Ipv4Addr::new(198, 51, 100, 20))
        .set_chaddr(&[0x02, 0x00, 0x5e, 0x10, 0x00, 0x42]);
    let opts = m.opts_mut();
    opts.insert(DhcpOption::MessageType(MessageType::Offer));
    opts.insert(DhcpOption::ServerIdentifier(ROGUE_IP));
    let mut payload = Vec::new();
    m.encode(&mut Encoder::new(&mut payload)).expect("encode");
    let f = build_udp_frame(
        &FrameHeaders {
            src_mac: pod.mac,
            dst_mac: [0xff; 6],
            vlan: None,
            src_ip: ROGUE_IP,
            dst_ip: Ipv4Addr::BROADCAST,
            src_port: 67,
            dst_port: 68,
        },
        &payload,
    );
    let mut out = f[..12].to_vec();
    for (i, tpid) in tpids.iter().enumerate() {
        out.extend_from_slice(&tpid.to_be_bytes());
        out.extend_from_slice(&(100 + i as u16).to_be_bytes());
    }
    out.extend_from_slice(&f[12..]);
    out
}

/// xids of the OFFERs (`0x5eed....`) that `sock` sees within `within`,
/// whatever tags they carry.
fn offers_seen(sock: &OwnedFd, within: Duration) -> Vec<u32> {
    let deadline = Instant::now() + within;
    let mut xids = Vec::new();
    let mut buf = vec![0u8; 4096];
    while Instant::now() < deadline {
        // SAFETY: receiving into an owned buffer.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        let Ok(n) = usize::try_from(n) else { continue };
        // The xid is the only 0x5eed.... word in the frame: find it.
        let f = &buf[..n];
        xids.extend(
            f.windows(4)
                .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
                .filter(|x| x >> 16 == 0x5eed),
        );
    }
    xids
}

/// Stacked VLAN tags (802.1ad over 802.1Q, two or three) do not carry a
/// rogue's OFFER past the guard: unguarded, the bridge forwards them to
/// the other pod; guarded, none crosses the port, and each is counted
/// (`BPF_PROG_TEST_RUN`, which keeps every tag in the frame, is in
/// `guard_kernel.rs`).
#[test]
fn stacked_vlan_tags_carry_no_rogue_offer_past_the_guard() {
    let lab = Lab::with_clients(2);
    let (rogue, other) = (&lab.clients[0], &lab.clients[1]);
    let stacks: [&[u16]; 3] = [
        &[0x88a8, 0x8100],
        &[0x8100, 0x8100],
        &[0x88a8, 0x8100, 0x8100],
    ];
    let tx = packet_socket(rogue);
    let send_all = |base: u32| {
        for (i, tags) in stacks.iter().enumerate() {
            let f = tagged_offer(rogue, tags, base + i as u32);
            // SAFETY: sending a buffer on a bound packet socket.
            let n = unsafe { libc::send(tx.as_raw_fd(), f.as_ptr().cast(), f.len(), 0) };
            assert_eq!(
                n,
                f.len() as isize,
                "send: {}",
                std::io::Error::last_os_error()
            );
        }
    };
    // Unguarded: the other pod hears them all.
    let rx = packet_socket(other);
    send_all(0x5eed_0000);
    let mut heard = offers_seen(&rx, Duration::from_millis(500));
    heard.sort_unstable();
    heard.dedup();
    assert_eq!(heard, [0x5eed_0000, 0x5eed_0001, 0x5eed_0002]);

    let mut guard = load_guard();
    let port = guard
        .attach(&target(&lab, 0), &PortPolicy::default())
        .unwrap();
    send_all(0x5eed_0100);
    let heard = offers_seen(&rx, Duration::from_millis(500));
    assert!(
        heard.is_empty(),
        "stacked OFFERs crossed the guard: {heard:x?}"
    );
    let c = guard.counters(port).unwrap().unwrap();
    // At TC ingress the kernel has already moved the outermost tag into
    // the skb: two stacked tags leave one in the frame, which the parser
    // reads (a server message); three leave two, which it does not (the
    // frame that passed before stacked tags were policed).
    assert_eq!(
        (c.dropped_server, c.dropped_unclassified, c.passed_client),
        (2, 1, 0),
        "{c:?}"
    );
}
