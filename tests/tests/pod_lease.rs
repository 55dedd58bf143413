//! The agent in-process (`xdhcp::daemon::run`) against a real dnsmasq in
//! network namespaces: ADD → BOUND → renewal → CHECK → DEL → RELEASE seen
//! by the server; `apply`, CHECK after the address is removed by hand; ADD
//! with the server down fails within the configured timeout.

use std::time::{Duration, Instant};

use xdhcp::cli::DatapathChoice;
use xdhcp::cni::types::code;
use xdhcp::rpc::{self, ClientError, CniRequest};
use xdhcp_tests::{Dnsmasq, DnsmasqConfig, InProcessAgent, Lab, LabClient, format_mac, wait_until};

fn request(client: &LabClient, container: &str, ipam: &str) -> CniRequest {
    let conf = format!(r#"{{"cniVersion":"1.0.0","name":"net1","type":"bridge","ipam":{ipam}}}"#);
    xdhcp_tests::cni_request(client, container, "default", &conf)
}

fn agent_code(e: ClientError) -> (u32, String) {
    let e = e.into_cni();
    (e.code, e.msg)
}

fn lease_cycle(datapath: DatapathChoice) {
    let lab = Lab::with_clients(1);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::renewing_every(3));
    let agent = InProcessAgent::start(datapath);
    let c = &lab.clients[0];
    let req = request(c, "pod-a", r#"{"type":"xdhcp","timeout":"15s"}"#);

    let r = agent.add(&req).expect("ADD succeeds");
    let ip = r.ips[0].address;
    assert_eq!(ip.prefix_len, 24);
    assert_eq!(r.ips[0].gateway, Some(lab.server_ip));
    assert!(r.routes.iter().any(|rt| rt.dst.prefix_len == 0), "{r:?}");
    assert_eq!(
        r.dns.nameservers,
        vec![std::net::IpAddr::from([192, 0, 2, 53])]
    );
    let server_lease = dnsmasq.lease_for(c.mac).expect("dnsmasq has the lease");
    assert_eq!(server_lease.ip, ip.addr);
    assert_eq!(server_lease.hostname.as_deref(), Some("pod-a"));

    // The receive path is the one asked for, reported per interface (with
    // eBPF, the first exchange runs on AF_PACKET while the program attaches
    // in the background; the lease then moves to the ring buffer).
    let want = match datapath {
        DatapathChoice::Afpacket => ("af-packet", "af-packet"),
        // veths get the TC program by default.
        _ => ("ebpf", "tc"),
    };
    let status = || agent.status();
    assert!(
        wait_until(Duration::from_secs(5), || {
            let s = status();
            (s.datapath.as_str(), s.interfaces[0].attach.as_str()) == want
        }),
        "{:?}",
        status()
    );
    let s = status();
    assert!(s.ready && s.state_recovered);

    // A repeated ADD returns the same lease without a new exchange.
    let again = agent.add(&req).expect("repeated ADD");
    assert_eq!(again.ips, r.ips);

    // Renewal at T1 = 3 s: a second DHCPACK for this client.
    let mac = format_mac(c.mac);
    let acks = || {
        dnsmasq
            .log()
            .lines()
            .filter(|l| l.contains("DHCPACK") && l.contains(&mac))
            .count()
    };
    assert!(
        wait_until(Duration::from_secs(15), || acks() >= 2),
        "no renewal seen by dnsmasq:\n{}",
        dnsmasq.log()
    );
    let table = agent.leases();
    assert_eq!(table.len(), 1);
    assert_eq!(table[0].address, Some(ip));
    assert_eq!(table[0].pod.as_deref(), Some("default/pod-a"));

    let _ = agent.post(rpc::PATH_CHECK, &req).expect("CHECK passes");

    // DEL releases: the lease disappears from dnsmasq's file.
    let _ = agent.post(rpc::PATH_DEL, &req).expect("DEL");
    assert!(
        wait_until(Duration::from_secs(5), || dnsmasq
            .lease_for(c.mac)
            .is_none()),
        "RELEASE not honoured by dnsmasq:\n{}",
        dnsmasq.log()
    );
    assert!(dnsmasq.log().contains("DHCPRELEASE"));
    // CHECK and DEL pass for an attachment the agent holds no lease for
    // (one leased before xdhcp took over the node looks the same).
    let _ = agent
        .post(rpc::PATH_CHECK, &req)
        .expect("CHECK of an unknown attachment");
    // DEL is idempotent, and fine for containers nobody knows.
    let _ = agent.post(rpc::PATH_DEL, &req).expect("second DEL");
    let unknown = request(c, "never-added", r#"{"type":"xdhcp"}"#);
    let _ = agent.post(rpc::PATH_DEL, &unknown).expect("unknown DEL");
    assert!(agent.leases().is_empty());
}

/// A server answers no RELEASE, so a dropped one is never known to the
/// client: under a burst a server's socket overflows and it keeps a
/// deleted pod's lease until it expires. The agent sends every RELEASE
/// twice, the second a moment after the DEL was answered; a server whose
/// firewall drops exactly the first DHCPRELEASE still lets the lease go.
#[test]
fn a_release_the_server_drops_goes_again_and_the_lease_is_gone() {
    let lab = Lab::with_clients(1);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let agent = InProcessAgent::start(DatapathChoice::Afpacket);
    let c = &lab.clients[0];
    let req = request(c, "pod-released", r#"{"type":"xdhcp","timeout":"15s"}"#);
    let _ = agent.add(&req).expect("ADD succeeds");
    assert!(dnsmasq.lease_for(c.mac).is_some(), "dnsmasq has the lease");

    // DHCP message type RELEASE (option 53, length 1, value 7), the first
    // option: its options start 240 bytes into the DHCP message, after the
    // 8 bytes of UDP header (bit 1984 of the transport header). Every one
    // is counted; only the first is dropped (a bucket of one, refilled
    // hourly).
    let release = ["udp", "dport", "67", "@th,1984,24", "0x350107"];
    let table = "inet xdhcp_drop_release";
    xdhcp_tests::nft::add_counter(&lab.server, table, "input priority -10", &release);
    let drop_first = [
        &["nft", "add", "rule", "inet", "xdhcp_drop_release", "c"][..],
        &release,
        &["limit", "rate", "1/hour", "burst", "1", "packets", "drop"],
    ]
    .concat();
    let out = lab.server.exec_output(&drop_first);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let _ = agent.post(rpc::PATH_DEL, &req).expect("DEL");
    assert!(
        wait_until(Duration::from_secs(5), || dnsmasq
            .lease_for(c.mac)
            .is_none()),
        "the lease outlived a dropped RELEASE ({} RELEASEs reached the server):\n{}",
        xdhcp_tests::nft::counted(&lab.server, table),
        dnsmasq.log()
    );
    assert_eq!(
        xdhcp_tests::nft::counted(&lab.server, table),
        2,
        "the first RELEASE (dropped) and its copy"
    );
    assert_eq!(dnsmasq.count_in_log("DHCPRELEASE"), 1, "{}", dnsmasq.log());
}

#[test]
fn pod_lease_cycle_ebpf_or_fallback() {
    lease_cycle(DatapathChoice::Auto);
}

#[test]
fn pod_lease_cycle_af_packet() {
    lease_cycle(DatapathChoice::Afpacket);
}

#[test]
fn apply_configures_and_check_sees_a_removed_address() {
    let lab = Lab::with_clients(1);
    let _dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let agent = InProcessAgent::start(DatapathChoice::Auto);
    let c = &lab.clients[0];
    let req = request(c, "pod-apply", r#"{"type":"xdhcp","apply":true}"#);
    let r = agent.add(&req).expect("ADD");
    let want = (r.ips[0].address.addr, r.ips[0].address.prefix_len);
    assert!(
        c.ns.ipv4_addrs(&c.ifname).contains(&want),
        "address not applied: {:?}",
        c.ns.ipv4_addrs(&c.ifname)
    );
    assert!(
        c.ns.routes().contains("default via 192.0.2.1"),
        "{}",
        c.ns.routes()
    );
    let _ = agent.post(rpc::PATH_CHECK, &req).expect("CHECK passes");

    c.ns.ip(&["addr", "flush", "dev", &c.ifname]);
    let (code_, msg) = agent_code(agent.post(rpc::PATH_CHECK, &req).unwrap_err());
    assert_eq!(code_, code::CHECK_FAILED);
    assert!(msg.contains("missing"), "{msg}");
    let _ = agent.post(rpc::PATH_DEL, &req).expect("DEL");
}

/// Give the client's namespace a primary interface the way a pod has one
/// before its secondary network's ADD: `prim0` (a veth whose peer stays in
/// the same namespace) with 10.99.0.2/24, a default route and `routes`
/// (each `dst/len`) via 10.99.0.1.
fn add_primary_interface(c: &LabClient, routes: &[&str]) {
    c.ns.ip(&[
        "link", "add", "prim0", "type", "veth", "peer", "name", "prim0p",
    ]);
    c.ns.ip(&["addr", "add", "10.99.0.2/24", "dev", "prim0"]);
    c.ns.ip(&["link", "set", "prim0", "up"]);
    c.ns.ip(&["link", "set", "prim0p", "up"]);
    c.ns.ip(&[
        "route",
        "add",
        "default",
        "via",
        "10.99.0.1",
        "dev",
        "prim0",
    ]);
    for r in routes {
        c.ns.ip(&["route", "add", r, "via", "10.99.0.1", "dev", "prim0"]);
    }
}

/// `apply` never moves a route of another interface: the lease's default
/// route (option 3) meets the pod's primary default route with the same
/// metric, the ADD fails naming both, the primary route is untouched and
/// the lease's address is taken off again. With `priority` (the metric)
/// the two live side by side.
#[test]
fn apply_never_replaces_another_interfaces_route() {
    let lab = Lab::with_clients(1);
    let _dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let agent = InProcessAgent::start(DatapathChoice::Auto);
    let c = &lab.clients[0];
    add_primary_interface(c, &[]);

    let req = request(c, "pod-conflict", r#"{"type":"xdhcp","apply":true}"#);
    let (code_, msg) = agent_code(agent.add(&req).unwrap_err());
    assert_eq!(code_, code::INTERFACE, "{msg}");
    assert!(
        msg.contains("0.0.0.0/0 via 192.0.2.1") && msg.contains("0.0.0.0/0 via 10.99.0.1"),
        "the error names both routes: {msg}"
    );
    let routes = c.ns.routes();
    assert!(
        routes.contains("default via 10.99.0.1 dev prim0"),
        "{routes}"
    );
    assert!(!routes.contains("192.0.2.1"), "{routes}");
    assert!(
        !c.ns
            .ipv4_addrs(&c.ifname)
            .iter()
            .any(|(a, _)| a.octets()[..3] == [192, 0, 2]),
        "the address of the failed ADD is taken off: {:?}",
        c.ns.ipv4_addrs(&c.ifname)
    );

    let req = request(
        c,
        "pod-metric",
        r#"{"type":"xdhcp","apply":true,"priority":100}"#,
    );
    let _ = agent.add(&req).expect("ADD with a metric");
    let routes = c.ns.routes();
    assert!(
        routes.contains("default via 10.99.0.1 dev prim0"),
        "{routes}"
    );
    assert!(
        routes.contains(&format!(
            "default via 192.0.2.1 dev {} proto dhcp metric 100",
            c.ifname
        )),
        "{routes}"
    );
    let _ = agent.post(rpc::PATH_DEL, &req).expect("DEL");
    let routes = c.ns.routes();
    assert!(
        !routes.contains("192.0.2.1"),
        "DEL takes its route off: {routes}"
    );
    assert!(
        routes.contains("default via 10.99.0.1 dev prim0"),
        "{routes}"
    );
}

/// A server may not reroute what the pod already routes elsewhere: the
/// pod's primary interface routes 172.30.0.0/16 (a service CIDR), and an
/// option-121 route 172.16.0.0/12 around it is refused while an unrelated
/// route is kept. No flag or network setting asks for this protection.
#[test]
fn a_route_around_the_pods_other_routes_is_refused() {
    let lab = Lab::with_clients(1);
    let _dnsmasq = Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            extra_args: vec![
                "--dhcp-option-force=121,172.16.0.0/12,192.0.2.1,198.51.100.0/24,192.0.2.1"
                    .to_owned(),
            ],
            ..DnsmasqConfig::default()
        },
    );
    let agent = InProcessAgent::start(DatapathChoice::Auto);
    let c = &lab.clients[0];
    add_primary_interface(c, &["172.30.0.0/16"]);
    let req = request(c, "pod-protect", r#"{"type":"xdhcp"}"#);
    let r = agent.add(&req).expect("ADD");
    let dsts: Vec<String> = r.routes.iter().map(|rt| rt.dst.to_string()).collect();
    assert!(dsts.contains(&"198.51.100.0/24".to_owned()), "{dsts:?}");
    assert!(!dsts.contains(&"172.16.0.0/12".to_owned()), "{dsts:?}");
    let _ = agent.post(rpc::PATH_DEL, &req).expect("DEL");
}

/// A burst against a silent server: with one acquisition per network at a
/// time, held until its outcome, an ADD with a shorter deadline than the
/// one ahead of it never gets its slot and fails in time, saying it was
/// queued and behind what.
#[test]
fn an_add_queued_behind_a_silent_server_fails_naming_its_network_and_the_queue() {
    let lab = Lab::with_clients(2);
    let agent = InProcessAgent::start_with(|a| {
        a.acquisitions_per_network = 1;
        a.acquisition_slot_hold = Duration::from_secs(30);
    });
    let first = request(
        &lab.clients[0],
        "pod-q1",
        r#"{"type":"xdhcp","timeout":"6s"}"#,
    );
    let second = request(
        &lab.clients[1],
        "pod-q2",
        r#"{"type":"xdhcp","timeout":"2s"}"#,
    );
    let t0 = Instant::now();
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| agent.add(&first));
        // The first is admitted before the second asks.
        std::thread::sleep(Duration::from_millis(300));
        let b = s.spawn(|| agent.add(&second));
        (a.join().expect("first ADD"), b.join().expect("second ADD"))
    });
    let took = t0.elapsed();
    let (code_a, msg_a) = agent_code(a.unwrap_err());
    assert_eq!(code_a, code::DHCP_TIMEOUT, "{msg_a}");
    assert!(msg_a.contains("heard nothing"), "{msg_a}");
    let (code_b, msg_b) = agent_code(b.unwrap_err());
    assert_eq!(code_b, code::DHCP_TIMEOUT, "{msg_b}");
    assert!(
        msg_b.contains("still waiting for one of network \"net1\"'s acquisition slots (1 ahead"),
        "{msg_b}"
    );
    assert!(took < Duration::from_secs(11), "took {took:?}");
    assert!(
        agent.leases().is_empty(),
        "failed ADDs leave nothing behind"
    );
}

#[test]
fn add_with_the_server_down_fails_within_the_timeout() {
    let lab = Lab::with_clients(1);
    let agent = InProcessAgent::start(DatapathChoice::Auto);
    let c = &lab.clients[0];
    let req = request(c, "pod-timeout", r#"{"type":"xdhcp","timeout":"3s"}"#);
    let t0 = Instant::now();
    let (code_, msg) = agent_code(agent.add(&req).unwrap_err());
    let took = t0.elapsed();
    assert_eq!(code_, code::DHCP_TIMEOUT, "{msg}");
    assert!(msg.contains(&c.ifname), "{msg}");
    assert!(msg.contains("heard nothing"), "{msg}");
    assert!(took < Duration::from_secs(7), "took {took:?}");
    assert!(
        agent.leases().is_empty(),
        "a failed ADD leaves nothing behind"
    );
}

/// Where one ADD's time went is in the metrics: every phase of a pod's ADD,
/// from the request read off the socket to the answer, is observed once in
/// `xdhcp_add_phase_seconds`, and the whole in `xdhcp_add_duration_seconds`.
/// The routes the lease must not reroute are read in the open's own trip
/// into the pod's namespace: nothing is read between the open and the first
/// DISCOVER (the `protect` phase is there, and zero).
#[test]
fn an_adds_phases_are_observed_in_the_metrics() {
    let lab = Lab::with_clients(1);
    let _dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port");
    let agent = InProcessAgent::start_with(|a| {
        a.datapath = DatapathChoice::Auto;
        a.metrics_addr = Some(metrics);
    });
    let c = &lab.clients[0];
    add_primary_interface(c, &["172.30.0.0/16"]);
    let req = request(c, "pod-phases", r#"{"type":"xdhcp"}"#);
    let _ = agent.add(&req).expect("ADD");
    let mut text = None;
    assert!(wait_until(Duration::from_secs(5), || {
        text = xdhcp_tests::bench::http_get(metrics, "/metrics");
        text.is_some()
    }));
    let text = text.expect("the metrics server answers");
    xdhcp_tests::bench::assert_add_phases_observed(&text, 1);
    assert_eq!(
        xdhcp_tests::bench::metric_count(&text, "xdhcp_add_duration_seconds_count", ""),
        1,
        "{text}"
    );
    let sum = |phase: &str| xdhcp_tests::bench::add_phase_sum(&text, phase);
    assert!(sum("offer") + sum("ack") > 0.0, "{text}");
    assert!(sum("protect").abs() < f64::EPSILON, "{text}");
    let _ = agent.post(rpc::PATH_DEL, &req).expect("DEL");
}
