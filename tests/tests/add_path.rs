//! The ADD path with the agent where a node runs it: in the node's
//! namespace, beside the bridge its pods' veths hang off.

mod agent_support;

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::sys::socket::{setsockopt, sockopt};
use xdhcp_tests::netns::packet_socket_here;

use agent_support::NodeAgent;
use xdhcp::rpc::{self, CniRequest};
use xdhcp_tests::{Dnsmasq, Dnsmasq6, DnsmasqConfig, Lab, NetNs};

/// Pods whose interface the main plugin hands over down (macvlan, bridge)
/// each get their lease from their first DISCOVER. The agent brings the
/// interface up; the kernel makes the veth's far end — the bridge port —
/// forward only once its link watcher has handled the carrier coming on,
/// under the RTNL lock, and a DISCOVER sent before is dropped at the
/// bridge without a word (a third of such ADDs or more on a busy node). The
/// agent's first retransmission is 30 s away here, beyond the ADD's 10 s
/// timeout, so an ADD whose first DISCOVER was dropped fails.
#[test]
fn pods_handed_over_down_are_leased_from_their_first_discover() {
    let (lab, _dnsmasq) = lab_with_dnsmasq();
    let agent = NodeAgent::start(
        &lab.server,
        &["--retransmit-initial", "30s", "--retransmit-jitter", "0s"],
    );
    let client = rpc::Client::new(&agent.socket, Duration::from_secs(30));
    let conf = r#"{"cniVersion":"1.0.0","name":"net1","type":"macvlan","ipam":{"type":"xdhcp","timeout":"10s"}}"#;
    let mut pods = Vec::new();
    for i in 0..6 {
        let pod = NetNs::new();
        let port = format!("cd{i}");
        lab.server.ip(&[
            "link",
            "add",
            &port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            pod.name(),
        ]);
        lab.bridge.attach(&port);
        lab.server.link_up(&port);
        let req = CniRequest {
            container_id: format!("pod-down-{i}"),
            ifname: "eth0".to_owned(),
            netns: Some(pod.path().to_path_buf()),
            args: [
                ("K8S_POD_NAMESPACE".to_owned(), "default".to_owned()),
                ("K8S_POD_NAME".to_owned(), format!("pod-down-{i}")),
            ]
            .into(),
            config: xdhcp::cni::config::parse(conf.as_bytes()).expect("a valid config"),
        };
        if let Err(e) = client.post::<_, serde_json::Value>(rpc::PATH_ADD, &req) {
            panic!(
                "ADD {i} of a pod handed over down: {}\n{}",
                e.into_cni().msg,
                agent.log()
            );
        }
        pods.push((pod, req));
    }
    for (_, req) in &pods {
        let _: serde_json::Value = client.post(rpc::PATH_DEL, req).expect("DEL");
    }
}

/// The Ethernet type of the test's stand-in replies (IEEE local
/// experimental: nothing in the pod takes them).
const MARK: u16 = 0x88b5;

/// The DHCP guard goes on a pod's host port while replies are on their
/// way into the pod, and none is lost. Creating a port's first qdisc (the
/// guard's `clsact`) deactivates the device for a moment and drops the
/// frames it is handed then; the agent makes that qdisc before the first
/// DISCOVER leaves, and adds the guard's filter — which deactivates
/// nothing — beside the exchange. The agent's test hook holds the attach
/// back 100 ms past the qdisc, into the exchange: when the test sees the
/// DISCOVER on the port, the qdisc must be there and the filter not yet;
/// from then until the ADD has answered (the guard on), the test sends a
/// stream of frames through the port into the pod, every one of which
/// must arrive, and the lease must come from the first DISCOVER (the
/// agent's first retransmission is 30 s away, beyond the ADD's 10 s).
#[test]
fn the_guard_goes_on_beside_the_exchange_without_losing_a_reply() {
    let (lab, _dnsmasq) = lab_with_dnsmasq();
    let agent = NodeAgent::start_with_env(
        &lab.server,
        &["--retransmit-initial", "30s", "--retransmit-jitter", "0s"],
        &[("XDHCP_TEST_GUARD_ATTACH_DELAY_MS", "100")],
    );
    let port = "cg0";
    let pod = pod_on(&lab.server, &lab.bridge.name, port);

    let reader = Reader::in_pod(&pod);
    let answered = Arc::new(AtomicBool::new(false));
    let streamer = stream_from_discover(&lab.server, port, pod.mac("eth0"), answered.clone());
    let client = rpc::Client::new(&agent.socket, Duration::from_secs(30));
    let conf = r#"{"cniVersion":"1.0.0","name":"net1","type":"macvlan","ipam":{"type":"xdhcp","timeout":"10s"}}"#;
    let req = CniRequest {
        container_id: "pod-guarded".to_owned(),
        ifname: "eth0".to_owned(),
        netns: Some(pod.path().to_path_buf()),
        args: [
            ("K8S_POD_NAMESPACE".to_owned(), "default".to_owned()),
            ("K8S_POD_NAME".to_owned(), "pod-guarded".to_owned()),
        ]
        .into(),
        config: xdhcp::cni::config::parse(conf.as_bytes()).expect("a valid config"),
    };
    let added = client.post::<_, serde_json::Value>(rpc::PATH_ADD, &req);
    answered.store(true, Ordering::SeqCst);
    let (qdiscs, filters, sent) = streamer.join().expect("the stream");
    let got = reader.stop();
    if let Err(e) = added {
        panic!("ADD: {}\n{}", e.into_cni().msg, agent.log());
    }
    assert!(
        qdiscs.contains("clsact"),
        "the port had no clsact qdisc when the DISCOVER left ({} of {sent} frames into the pod \
         lost):\n{qdiscs}\n{}",
        sent - got,
        agent.log()
    );
    assert!(
        !filters.contains("bpf"),
        "the guard was on before the DISCOVER left (the attach was not held back):\n{filters}"
    );
    let now = lab
        .server
        .exec(&["tc", "filter", "show", "dev", port, "ingress"]);
    assert!(now.contains("bpf"), "the guard is not on the port:\n{now}");
    assert_eq!(
        got,
        sent,
        "{} of {sent} frames sent into the pod while the guard went on were lost",
        sent - got
    );
    let _: serde_json::Value = client.post(rpc::PATH_DEL, &req).expect("DEL");
}

/// A dual-stack pod's SOLICIT, like its DISCOVER, waits only for its host
/// port's `clsact` qdisc, not for the guard's filter: the agent's test hook
/// holds the attach back 3 s, and the DHCPv6 lease is bound (from the
/// first SOLICIT) long before the guard is on. The ADD itself answers once
/// the guard is on.
#[test]
fn a_dual_stack_pods_solicit_waits_for_its_ports_qdisc_not_the_guards_attach() {
    let (lab, _dnsmasq) = lab_with_dnsmasq();
    let _dnsmasq6 = Dnsmasq6::start(lab.dhcp_ns());
    let agent = NodeAgent::start_with_env(
        &lab.server,
        &[],
        &[("XDHCP_TEST_GUARD_ATTACH_DELAY_MS", "3000")],
    );
    let pod = pod_on(&lab.server, &lab.bridge.name, "cd0");
    // The pod's link-local address usable first: its detection is not what
    // this test times.
    assert!(
        xdhcp_tests::wait_until(Duration::from_secs(5), || !pod
            .ip(&["-6", "addr", "show", "dev", "eth0"])
            .contains("tentative")),
        "{}",
        pod.ip(&["-6", "addr", "show", "dev", "eth0"])
    );
    let client = rpc::Client::new(&agent.socket, Duration::from_secs(30));
    let conf = r#"{"cniVersion":"1.1.0","name":"dualnet","type":"macvlan",
        "ipam":{"type":"xdhcp","family":"dual","timeout":"10s","ipv6":{"prefixLength":64}}}"#;
    let req = CniRequest {
        container_id: "pod-dual".to_owned(),
        ifname: "eth0".to_owned(),
        netns: Some(pod.path().to_path_buf()),
        args: [
            ("K8S_POD_NAMESPACE".to_owned(), "default".to_owned()),
            ("K8S_POD_NAME".to_owned(), "pod-dual".to_owned()),
        ]
        .into(),
        config: xdhcp::cni::config::parse(conf.as_bytes()).expect("a valid config"),
    };
    let began = Instant::now();
    if let Err(e) = client.post::<_, serde_json::Value>(rpc::PATH_ADD, &req) {
        panic!("ADD: {}\n{}", e.into_cni().msg, agent.log());
    }
    assert!(
        began.elapsed() >= Duration::from_secs(3),
        "the ADD answered before the guard was on"
    );
    let log = agent.log();
    let at = |what: &str| {
        log.find(what)
            .unwrap_or_else(|| panic!("no \"{what}\" in the log:\n{log}"))
    };
    assert!(
        at("DHCPv6 lease bound") < at("DHCP guard attached"),
        "the DHCPv6 lease waited for the guard's attach:\n{log}"
    );
    let _: serde_json::Value = client.post(rpc::PATH_DEL, &req).expect("DEL");
}

/// Counts the [`MARK`] frames that reach a pod's `eth0`.
struct Reader {
    received: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Reader {
    fn in_pod(pod: &NetNs) -> Self {
        let index = pod.ifindex("eth0");
        let fd = pod.run_in(move || {
            let fd = packet_socket_here(index, MARK, Some(Duration::from_millis(100)))
                .expect("a packet socket in the pod");
            // Room for the whole stream, however late the reader runs.
            setsockopt(&fd, sockopt::RcvBufForce, &(16 << 20)).expect("SO_RCVBUFFORCE");
            fd
        });
        let received = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (received, stop) = (received.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 2048];
                while !stop.load(Ordering::SeqCst) {
                    // SAFETY: reading into a buffer we own from an open socket.
                    let n = unsafe {
                        libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0)
                    };
                    if n >= 14 && buf[12..14] == MARK.to_be_bytes() {
                        received.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        };
        Self {
            received,
            stop,
            thread,
        }
    }

    /// How many arrived, once what is still queued is read.
    fn stop(self) -> u64 {
        std::thread::sleep(Duration::from_millis(300));
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("the reader");
        self.received.load(Ordering::SeqCst)
    }
}

/// On a thread: waits for the first DISCOVER from `mac` on `port` of
/// `node`, reads the port's qdiscs and ingress filters at once, then sends
/// [`MARK`] frames to `mac` through the port's transmit queue (as the
/// bridge hands it replies), one every 100 µs, until `answered` and 20 ms
/// more. Returns the qdiscs, the filters and how many frames it sent.
fn stream_from_discover(
    node: &NetNs,
    port: &str,
    mac: [u8; 6],
    answered: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(String, String, u64)> {
    let index = node.ifindex(port);
    let tap = node.packet_socket(
        index,
        libc::ETH_P_ALL as u16,
        Some(Duration::from_millis(200)),
    );
    let out = node.packet_socket(index, 0, None);
    let (node, port) = (node.name().to_owned(), port.to_owned());
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(Instant::now() < until, "no DISCOVER on the port");
            // SAFETY: reading into a buffer we own from an open socket.
            let n = unsafe { libc::recv(tap.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if let Ok(n) = usize::try_from(n)
                && is_discover_from(&buf[..n], mac)
            {
                break;
            }
        }
        let tc = |what: &str, extra: &[&str]| {
            let mut cmd = xdhcp_tests::netns_exec(&node, xdhcp_tests::program("tc"));
            cmd.args([what, "show", "dev", &port]).args(extra);
            String::from_utf8_lossy(&xdhcp_tests::netns::output(&mut cmd).stdout).into_owned()
        };
        let qdiscs = tc("qdisc", &[]);
        let filters = tc("filter", &["ingress"]);
        let sent = send_marks(&out, mac, &answered);
        (qdiscs, filters, sent)
    })
}

/// Sends [`MARK`] frames to `mac` on packet socket `out` (through its
/// port's transmit queue, as the bridge hands a port its frames), one
/// every 100 µs, until `until` and 20 ms more; how many it sent.
fn send_marks(out: &impl AsRawFd, mac: [u8; 6], until: &AtomicBool) -> u64 {
    let mut frame = vec![0u8; 60];
    frame[..6].copy_from_slice(&mac);
    frame[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x5e]);
    frame[12..14].copy_from_slice(&MARK.to_be_bytes());
    let mut sent = 0u64;
    let mut after = None;
    loop {
        if after.is_none() && until.load(Ordering::SeqCst) {
            after = Some(Instant::now() + Duration::from_millis(20));
        }
        if after.is_some_and(|t| Instant::now() >= t) {
            return sent;
        }
        frame[14..22].copy_from_slice(&sent.to_be_bytes());
        xdhcp_tests::frames::send(out, &frame);
        sent += 1;
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Whether `frame` is a DHCP DISCOVER (an IPv4 UDP frame to port 67 whose
/// message type is 1) from `mac`.
fn is_discover_from(frame: &[u8], mac: [u8; 6]) -> bool {
    if frame.len() < 14 + 20 + 8 + 240 || frame[6..12] != mac || frame[12..14] != [0x08, 0x00] {
        return false;
    }
    let ihl = usize::from(frame[14] & 0x0f) * 4;
    let udp = 14 + ihl;
    if frame[14 + 9] != 17 || frame.len() < udp + 8 + 240 || frame[udp + 2..udp + 4] != [0, 67] {
        return false;
    }
    // Options after the magic cookie: type 53, length 1, value 1.
    let mut i = udp + 8 + 240;
    while i + 1 < frame.len() && frame[i] != 255 {
        if frame[i] == 0 {
            i += 1;
            continue;
        }
        let len = usize::from(frame[i + 1]);
        if frame[i] == 53 && len == 1 && i + 2 < frame.len() {
            return frame[i + 2] == 1;
        }
        i += 2 + len;
    }
    false
}

/// The qdiscs of `port` in `ns`, once one of them is `clsact` or `within`
/// has passed (then `Err` with what the port had last).
fn clsact_within(ns: &NetNs, port: &str, within: Duration) -> Result<String, String> {
    let until = Instant::now() + within;
    loop {
        let qdiscs = ns.exec(&["tc", "qdisc", "show", "dev", port]);
        if qdiscs.contains("clsact") {
            return Ok(qdiscs);
        }
        if Instant::now() >= until {
            return Err(qdiscs);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A pod's port on a Linux bridge `node`, its peer `eth0` in a namespace
/// of its own, both up.
fn pod_on(node: &NetNs, bridge: &str, port: &str) -> NetNs {
    let pod = NetNs::new();
    node.ip(&[
        "link",
        "add",
        port,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        pod.name(),
    ]);
    node.ip(&["link", "set", port, "master", bridge]);
    node.link_up(port);
    pod.link_up("eth0");
    pod
}

/// The ports of a Linux bridge the guard serves are made ready for it
/// before their ADD: once the first pod of the bridge is guarded, a veth
/// port enslaved to the bridge gets its `clsact` qdisc as the kernel
/// announces it, so its ADD does not hold the first DISCOVER for the
/// qdisc. The ports the bridge had already are live — its uplink, running
/// pods — and making their first qdisc would drop what the bridge hands
/// them in that moment (a pod's REQUEST on its way out of the uplink was
/// lost so): they are left alone, and a stream of frames into a running
/// pod through its port, all the while the bridge's first pod gets its ADD,
/// loses none. A port of a bridge the guard does not serve is left alone.
/// A live port whose qdisc its ADD made counts as made ready from then on.
#[test]
fn ports_enslaved_to_a_served_bridge_are_made_ready_before_their_add_and_live_ones_are_left_alone()
{
    let (lab, _dnsmasq) = lab_with_dnsmasq();
    let node = &lab.server;
    let bridge = lab.bridge.name.as_str();
    node.ip(&["link", "add", "brx", "type", "bridge"]);
    node.link_up("brx");
    let first = pod_on(node, bridge, "ca0");
    let running = pod_on(node, bridge, "cb0");
    let _elsewhere = pod_on(node, "brx", "cx0");
    let agent = NodeAgent::start(node, &[]);
    assert!(
        clsact_within(node, "cb0", Duration::from_millis(300)).is_err(),
        "a port was made ready before the guard served its bridge"
    );

    let client = rpc::Client::new(&agent.socket, Duration::from_secs(30));
    let add = |pod: &NetNs, id: &str| add_pod(&client, &agent, pod, id);
    let reader = Reader::in_pod(&running);
    let served = Arc::new(AtomicBool::new(false));
    let streamer = {
        let out = node.packet_socket(node.ifindex("cb0"), 0, None);
        let (mac, served) = (running.mac("eth0"), served.clone());
        std::thread::spawn(move || send_marks(&out, mac, &served))
    };
    let first_req = add(&first, "pod-first");
    // The bridge is served once its first port's guard is on: a port
    // enslaved from then on is made ready at once.
    let later = pod_on(node, bridge, "cc0");
    if let Err(had) = clsact_within(node, "cc0", Duration::from_secs(5)) {
        panic!(
            "a port enslaved to the served bridge has no clsact qdisc 5 s later:\n{had}\n{}",
            agent.log()
        );
    }
    served.store(true, Ordering::SeqCst);
    let sent = streamer.join().expect("the stream");
    let got = reader.stop();
    for port in ["cb0", Lab::UPLINK, "cx0"] {
        let qdiscs = node.exec(&["tc", "qdisc", "show", "dev", port]);
        assert!(
            !qdiscs.contains("clsact"),
            "{port}, live before the bridge was served or on a bridge not served, was touched:\n{qdiscs}\n{}",
            agent.log()
        );
    }
    assert_eq!(
        got,
        sent,
        "{} of {sent} frames sent into a running pod while its bridge became served were lost",
        sent - got
    );
    // Every port is guarded at its ADD; only the port enslaved after the
    // bridge was served had its qdisc before.
    let reqs = [
        first_req,
        add(&running, "pod-running"),
        add(&later, "pod-later"),
    ];
    for port in ["ca0", "cb0", "cc0"] {
        let filters = node.exec(&["tc", "filter", "show", "dev", port, "ingress"]);
        assert!(filters.contains("bpf"), "{port} is not guarded:\n{filters}");
    }
    let log = agent.log();
    let held = |id: &str| {
        log.lines().any(|l| {
            l.contains(&format!("container={id} "))
                && l.contains("the host port is ready for its guard")
        })
    };
    for id in ["pod-first", "pod-running"] {
        assert!(
            held(id),
            "{id}'s DISCOVER did not wait for its port's qdisc:\n{log}"
        );
    }
    assert!(
        !held("pod-later"),
        "pod-later's DISCOVER waited for a port made ready before its ADD:\n{log}"
    );
    for req in &reqs {
        let _: serde_json::Value = client.post(rpc::PATH_DEL, req).expect("DEL");
    }
    // A live port's qdisc, made at its ADD, stays when the guard comes off
    // at DEL: the next ADD on that port (the pod's sandbox made again on
    // it) does not wait for it.
    assert!(
        xdhcp_tests::wait_until(Duration::from_secs(5), || agent
            .log()
            .contains("port made ready for the guard at its ADD")),
        "no port counts as made ready after its ADD:\n{}",
        agent.log()
    );
    let again = add(&running, "pod-running-again");
    let log = agent.log();
    assert!(
        !log.lines()
            .any(|l| l.contains("container=pod-running-again ")
                && l.contains("the host port is ready for its guard")),
        "a port whose qdisc its first ADD made held the next ADD's DISCOVER for it:\n{log}"
    );
    let _: serde_json::Value = client.post(rpc::PATH_DEL, &again).expect("DEL");
}

/// Counts, on a thread, the DHCP client frames (IPv4 UDP to port 67) from
/// `mac` that the bridge sends out of `port` of `node`, until `stop`.
fn client_frames_out_of(
    node: &NetNs,
    port: &str,
    mac: [u8; 6],
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    let tap = node.packet_socket(
        node.ifindex(port),
        libc::ETH_P_ALL as u16,
        Some(Duration::from_millis(50)),
    );
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        let mut seen = 0;
        while !stop.load(Ordering::SeqCst) {
            // SAFETY: reading into a buffer we own from an open socket.
            let n = unsafe { libc::recv(tap.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            let Ok(n) = usize::try_from(n) else { continue };
            let f = &buf[..n];
            if n >= 14 + 20 + 8 && f[6..12] == mac && f[12..14] == [0x08, 0x00] && f[14 + 9] == 17 {
                let udp = 14 + usize::from(f[14] & 0x0f) * 4;
                if f.get(udp + 2..udp + 4) == Some(&[0, 67]) {
                    seen += 1;
                }
            }
        }
        seen
    })
}

/// Without an uplink, a fresh pod's first DISCOVER (and its REQUEST) go
/// to the MAC of the server that bound the network's latest lease, not to
/// the broadcast address: the bridge floods a broadcast to every port of
/// the segment — every pod takes a copy — where the server's MAC reaches
/// the server alone. A witness port on the bridge sees none of the second
/// pod's client frames. When that MAC is stale (the server's interface got
/// another), the DISCOVER goes unanswered, its retransmission broadcasts,
/// the ADD is served, and the next pod's DISCOVER goes to the new MAC.
#[test]
fn a_fresh_pods_first_discover_goes_to_the_servers_mac_and_floods_no_port() {
    const TO_SERVER: &str = "sent to the network's server's MAC";
    let (lab, _dnsmasq) = lab_with_dnsmasq();
    let node = &lab.server;
    let bridge = lab.bridge.name.as_str();
    let _witness = pod_on(node, bridge, "cw0");
    let agent = NodeAgent::start(
        node,
        &["--retransmit-initial", "1s", "--retransmit-jitter", "0s"],
    );
    let client = rpc::Client::new(&agent.socket, Duration::from_secs(30));
    let add = |pod: &NetNs, id: &str| add_pod(&client, &agent, pod, id);
    let said = |id: &str, what: &str| {
        agent
            .log()
            .lines()
            .any(|l| l.contains(&format!("container={id} ")) && l.contains(what))
    };
    let first = pod_on(node, bridge, "cu0");
    let mut reqs = vec![add(&first, "pod-first")];
    assert!(!said("pod-first", TO_SERVER), "no lease was bound yet");

    let second = pod_on(node, bridge, "cu1");
    let stop = Arc::new(AtomicBool::new(false));
    let witness = client_frames_out_of(node, "cw0", second.mac("eth0"), stop.clone());
    reqs.push(add(&second, "pod-second"));
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::SeqCst);
    let flooded = witness.join().expect("the witness");
    assert_eq!(
        flooded,
        0,
        "the second pod's DHCP frames were flooded to another port of the bridge\n{}",
        agent.log()
    );
    assert!(said("pod-second", TO_SERVER), "{}", agent.log());

    // The server's interface takes another MAC: the one the agent knows is
    // stale.
    let (server, ifname) = (lab.dhcp_ns(), lab.dhcp_ifname());
    server.ip(&["link", "set", "dev", ifname, "down"]);
    server.ip(&["link", "set", "dev", ifname, "address", "02:00:5e:00:aa:01"]);
    server.link_up(ifname);
    let third = pod_on(node, bridge, "cu2");
    reqs.push(add(&third, "pod-third"));
    assert!(
        said(
            "pod-third",
            "no reply to the DISCOVER sent to the network's server; broadcasting"
        ),
        "{}",
        agent.log()
    );
    let fourth = pod_on(node, bridge, "cu3");
    reqs.push(add(&fourth, "pod-fourth"));
    assert!(
        agent
            .log()
            .lines()
            .any(|l| l.contains("container=pod-fourth ")
                && l.contains(TO_SERVER)
                && l.contains("02:00:5e:00:aa:01")),
        "the next pod's DISCOVER did not go to the server's new MAC\n{}",
        agent.log()
    );
    for req in &reqs {
        let _: serde_json::Value = client.post(rpc::PATH_DEL, req).expect("DEL");
    }
}

/// ADDs pod `id` (its interface `eth0` in `pod`) on the tests' network
/// through `client`, panicking with the agent's log if it fails; the
/// request, for its DEL.
fn add_pod(client: &rpc::Client, agent: &NodeAgent, pod: &NetNs, id: &str) -> CniRequest {
    let conf = r#"{"cniVersion":"1.0.0","name":"net1","type":"macvlan","ipam":{"type":"xdhcp","timeout":"10s"}}"#;
    let req = CniRequest {
        container_id: id.to_owned(),
        ifname: "eth0".to_owned(),
        netns: Some(pod.path().to_path_buf()),
        args: [
            ("K8S_POD_NAMESPACE".to_owned(), "default".to_owned()),
            ("K8S_POD_NAME".to_owned(), id.to_owned()),
        ]
        .into(),
        config: xdhcp::cni::config::parse(conf.as_bytes()).expect("a valid config"),
    };
    if let Err(e) = client.post::<_, serde_json::Value>(rpc::PATH_ADD, &req) {
        panic!("ADD {id}: {}\n{}", e.into_cni().msg, agent.log());
    }
    req
}

/// A node namespace with a Linux bridge and dnsmasq behind its uplink
/// port, no pods yet.
fn lab_with_dnsmasq() -> (Lab, Dnsmasq) {
    let lab = Lab::builder().server_behind_uplink().clients(0).build();
    let dnsmasq = Dnsmasq::start(
        lab.dhcp_ns(),
        DnsmasqConfig {
            interface: lab.dhcp_ifname().into(),
            ..DnsmasqConfig::default()
        },
    );
    (lab, dnsmasq)
}
