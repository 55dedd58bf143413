//! The CNI protocol end to end: the `xdhcp` binary as the IPAM plugin of
//! Debian's real `bridge` and `macvlan` plugins, an `xdhcp agent` process in
//! embedded mode, dnsmasq as the server — all in test namespaces.
//!
//! Main plugins run inside a "node" namespace (`ip netns exec`), so the
//! bridges and veths they create never touch the host.

mod agent_support;

use std::path::Path;
use std::time::{Duration, Instant};

use agent_support::{AgentProcess, CniPath, PluginOutput, invoke};
use xdhcp_tests::{Bridge, Dnsmasq, DnsmasqConfig, Lab, NetNs, Veth, wait_until};

/// A node namespace with bridge `xbr0` (192.0.2.1/24) and dnsmasq on it.
struct BridgeNode {
    node: NetNs,
    _bridge: Bridge,
    dnsmasq: Option<Dnsmasq>,
}

impl BridgeNode {
    fn new(serve: bool) -> Self {
        let node = NetNs::new();
        let bridge = Bridge::new(&node, "xbr0");
        node.add_addr("xbr0", "192.0.2.1".parse().unwrap(), 24);
        let dnsmasq = serve.then(|| {
            Dnsmasq::start(
                &node,
                DnsmasqConfig {
                    interface: "xbr0".into(),
                    ..DnsmasqConfig::default()
                },
            )
        });
        Self {
            node,
            _bridge: bridge,
            dnsmasq,
        }
    }
}

fn bridge_conf(socket: &Path, ipam_extra: &str) -> String {
    format!(
        r#"{{"cniVersion":"1.0.0","name":"xnet","type":"bridge","bridge":"xbr0",
            "isGateway":false,"ipMasq":false,
            "ipam":{{"type":"xdhcp","socketPath":"{}"{ipam_extra}}}}}"#,
        socket.display()
    )
}

fn bridge(
    cni: &CniPath,
    node: &NetNs,
    cmd: &str,
    id: &str,
    pod: &Path,
    conf: &str,
) -> PluginOutput {
    invoke(
        &cni.plugin("bridge"),
        Some(node),
        cmd,
        id,
        Some(pod),
        "eth0",
        cni.dir.path(),
        conf,
    )
}

#[test]
fn twenty_concurrent_adds_through_the_bridge_plugin() {
    let cni = CniPath::new();
    let agent = AgentProcess::start(&[]);
    let node = BridgeNode::new(true);
    let dnsmasq = node.dnsmasq.as_ref().unwrap();
    let pods: Vec<NetNs> = (0..20).map(|_| NetNs::new()).collect();
    let conf = bridge_conf(&agent.socket, r#","timeout":"30s""#);

    let t0 = Instant::now();
    let results: Vec<PluginOutput> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                let (cni, node, conf) = (&cni, &node.node, &conf);
                s.spawn(move || bridge(cni, node, "ADD", &format!("pod{i:02}"), pod.path(), conf))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let took = t0.elapsed();
    for (i, r) in results.iter().enumerate() {
        assert!(
            r.ok,
            "ADD pod{i:02} failed: {} {}\nagent:\n{}",
            r.stdout,
            r.stderr,
            agent.log()
        );
    }
    #[expect(clippy::print_stderr, reason = "the figure is useful in test logs")]
    {
        eprintln!("20 concurrent ADDs through bridge+xdhcp: {took:?}");
    }

    let leases = dnsmasq.leases();
    assert_eq!(leases.len(), 20, "dnsmasq leases: {leases:?}");
    for (pod, r) in pods.iter().zip(&results) {
        let cidr = r.json["ips"][0]["address"]
            .as_str()
            .expect("address in result");
        let (ip, len) = cidr.split_once('/').unwrap();
        let ip: std::net::Ipv4Addr = ip.parse().unwrap();
        assert!(
            pod.ipv4_addrs("eth0").contains(&(ip, len.parse().unwrap())),
            "{cidr} not on eth0: {:?}",
            pod.ipv4_addrs("eth0")
        );
        assert!(
            pod.routes().contains("default via 192.0.2.1"),
            "{}",
            pod.routes()
        );
        let mac = pod.mac("eth0");
        assert_eq!(
            leases.iter().find(|l| l.mac == mac).map(|l| l.ip),
            Some(ip),
            "dnsmasq lease for {cidr}"
        );
    }
    let table = agent.cli("leases", false);
    assert_eq!(table.lines().count(), 21, "{table}");
    assert!(table.contains("default/pod07"), "{table}");

    // DEL through the bridge: the bridge plugin deletes the veth before it
    // calls IPAM DEL, so no RELEASE can leave the pod (the agent's link watch
    // ends each lease when its veth goes; dnsmasq keeps the leases until they
    // expire). DEL succeeds and the agent forgets every lease. A RELEASE needs
    // IPAM DEL before the interface is torn down, as macvlan (see
    // `macvlan_add_del_releases_the_lease`) and ovnkube-node do.
    for (i, pod) in pods.iter().enumerate() {
        let r = bridge(
            &cni,
            &node.node,
            "DEL",
            &format!("pod{i:02}"),
            pod.path(),
            &conf,
        );
        assert!(r.ok, "DEL pod{i:02}: {} {}", r.stdout, r.stderr);
    }
    assert!(
        agent.cli("leases", true).trim() == "[]",
        "{}",
        agent.cli("leases", false)
    );
}

#[test]
fn del_of_an_unknown_container_succeeds() {
    let cni = CniPath::new();
    let agent = AgentProcess::start(&[]);
    let node = BridgeNode::new(false);
    let pod = NetNs::new();
    let conf = bridge_conf(&agent.socket, "");
    let r = bridge(&cni, &node.node, "DEL", "never-added", pod.path(), &conf);
    assert!(r.ok, "{} {}", r.stdout, r.stderr);
    // Also with the sandbox already gone (no CNI_NETNS).
    let r = invoke(
        &cni.plugin("xdhcp"),
        None,
        "DEL",
        "never-added-2",
        None,
        "eth0",
        cni.dir.path(),
        &conf,
    );
    assert!(r.ok, "{} {}", r.stdout, r.stderr);
}

/// A rolling upgrade as the plugin meets it: the stopping agent answers
/// the ADD "try again later" (code 11, shutting down), then its socket is
/// the next agent's. The thin plugin waits and asks again, as for a
/// missing socket, and the ADD succeeds.
#[test]
fn an_add_answered_shutting_down_is_sent_again_to_the_next_agent() {
    use std::io::{Read as _, Write as _};

    let cni = CniPath::new();
    let agent = AgentProcess::start(&[]);
    let node = BridgeNode::new(true);
    let pod = NetNs::new();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("upgrading.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let (at, next) = (socket.clone(), agent.socket.clone());
    let stopping = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut buf = [0u8; 8192];
        let n = conn.read(&mut buf).unwrap();
        let request = String::from_utf8_lossy(&buf[..n]).into_owned();
        let body = r#"{"code":11,"msg":"the xdhcp agent is shutting down"}"#;
        write!(
            conn,
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        drop(conn);
        drop(listener);
        // The old agent is gone; the path leads to the next one.
        std::fs::remove_file(&at).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        std::os::unix::fs::symlink(&next, &at).unwrap();
        request
    });
    let conf = bridge_conf(&socket, "");
    let t0 = Instant::now();
    let r = bridge(&cni, &node.node, "ADD", "pod-upgraded", pod.path(), &conf);
    let request = stopping.join().unwrap();
    assert!(request.starts_with("POST /v1/cni/add "), "{request}");
    assert!(r.ok, "{} {}", r.stdout, r.stderr);
    let ip = r.json["ips"][0]["address"].as_str().unwrap_or_default();
    assert!(ip.starts_with("192.0.2."), "{}", r.stdout);
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let r = bridge(&cni, &node.node, "DEL", "pod-upgraded", pod.path(), &conf);
    assert!(r.ok, "{} {}", r.stdout, r.stderr);
}

#[test]
fn add_with_the_server_down_fails_within_the_timeout() {
    let cni = CniPath::new();
    let agent = AgentProcess::start(&[]);
    let node = BridgeNode::new(false);
    let pod = NetNs::new();
    let conf = bridge_conf(&agent.socket, r#","timeout":"3s""#);
    let t0 = Instant::now();
    let r = bridge(&cni, &node.node, "ADD", "pod-noserver", pod.path(), &conf);
    let took = t0.elapsed();
    assert!(!r.ok);
    assert_eq!(r.json["code"], 101, "{}", r.stdout);
    let msg = r.json["msg"].as_str().unwrap_or_default();
    assert!(
        msg.contains("eth0") && msg.contains("heard nothing"),
        "{msg}"
    );
    assert!(took < Duration::from_secs(8), "took {took:?}");
}

#[test]
fn malformed_config_is_a_cni_error_naming_the_field() {
    let cni = CniPath::new();
    let pod = NetNs::new();
    let conf = r#"{"cniVersion":"1.0.0","name":"xnet","ipam":{"type":"xdhcp","timeout":"0s"}}"#;
    let r = invoke(
        &cni.plugin("xdhcp"),
        None,
        "ADD",
        "c1",
        Some(pod.path()),
        "eth0",
        cni.dir.path(),
        conf,
    );
    assert!(!r.ok);
    assert_eq!(r.json["code"], 7, "{}", r.stdout);
    assert_eq!(
        r.json["msg"],
        "ipam.timeout: must be a duration between 1s and 300s"
    );
    assert_eq!(r.json["cniVersion"], "1.0.0");

    // Through the bridge plugin the same error comes back.
    let node = BridgeNode::new(false);
    let conf = r#"{"cniVersion":"1.0.0","name":"xnet","type":"bridge","bridge":"xbr0",
                   "ipam":{"type":"xdhcp","timout":"5s"}}"#;
    let r = bridge(&cni, &node.node, "ADD", "c2", pod.path(), conf);
    assert!(!r.ok);
    assert!(
        r.stdout.contains("ipam.timout: unknown field"),
        "{}",
        r.stdout
    );

    // Bad environment: the interface name.
    let r = invoke(
        &cni.plugin("xdhcp"),
        None,
        "ADD",
        "c3",
        Some(pod.path()),
        "bad/name",
        cni.dir.path(),
        r#"{"cniVersion":"1.0.0","name":"xnet","ipam":{"type":"xdhcp"}}"#,
    );
    assert_eq!(r.json["code"], 4, "{}", r.stdout);
    assert!(r.json["msg"].as_str().unwrap().starts_with("CNI_IFNAME:"));
}

#[test]
fn version_and_agent_down_messages() {
    let cni = CniPath::new();
    let r = invoke(
        &cni.plugin("xdhcp"),
        None,
        "VERSION",
        "",
        None,
        "",
        cni.dir.path(),
        "",
    );
    assert!(r.ok, "{}", r.stderr);
    assert!(r.json["supportedVersions"].as_array().unwrap().len() >= 4);

    let pod = NetNs::new();
    let sock = cni.dir.path().join("nobody.sock");
    let conf = format!(
        r#"{{"cniVersion":"1.1.0","name":"xnet","ipam":{{"type":"xdhcp","socketPath":"{}"}}}}"#,
        sock.display()
    );
    let r = invoke(
        &cni.plugin("xdhcp"),
        None,
        "ADD",
        "c1",
        Some(pod.path()),
        "eth0",
        cni.dir.path(),
        &conf,
    );
    assert_eq!(r.json["code"], 100, "{}", r.stdout);
    let msg = r.json["msg"].as_str().unwrap();
    assert!(
        msg.contains("not running") && msg.contains(&sock.display().to_string()),
        "{msg}"
    );
    let r = invoke(
        &cni.plugin("xdhcp"),
        None,
        "STATUS",
        "",
        None,
        "",
        cni.dir.path(),
        &conf,
    );
    assert_eq!(r.json["code"], 50, "{}", r.stdout);
}

#[test]
fn check_fails_after_the_address_is_removed_by_hand() {
    let cni = CniPath::new();
    let agent = AgentProcess::start(&[]);
    let lab = Lab::with_clients(1);
    let _dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let c = &lab.clients[0];
    let conf = format!(
        r#"{{"cniVersion":"1.0.0","name":"xnet","ipam":{{"type":"xdhcp","apply":true,"socketPath":"{}"}}}}"#,
        agent.socket.display()
    );
    let run = |cmd| {
        invoke(
            &cni.plugin("xdhcp"),
            None,
            cmd,
            "pod-check",
            Some(c.ns.path()),
            "eth0",
            cni.dir.path(),
            &conf,
        )
    };
    let r = run("ADD");
    assert!(r.ok, "{} {}", r.stdout, agent.log());
    assert!(run("CHECK").ok, "CHECK with the address in place");
    c.ns.ip(&["addr", "flush", "dev", "eth0"]);
    let r = run("CHECK");
    assert!(!r.ok);
    assert_eq!(r.json["code"], 106, "{}", r.stdout);
    assert!(
        r.json["msg"].as_str().unwrap().contains("missing"),
        "{}",
        r.stdout
    );
    assert!(run("DEL").ok);
}

#[test]
fn macvlan_add_del_releases_the_lease() {
    // node ns: `m0` is the macvlan master; its veth peer `s0` sits in the
    // server ns with dnsmasq (a macvlan child cannot reach its own master).
    let cni = CniPath::new();
    let agent = AgentProcess::start(&[]);
    let node = NetNs::new();
    let server = NetNs::new();
    let _veth = Veth::new(&node, "m0", &server, "s0");
    server.add_addr("s0", "192.0.2.1".parse().unwrap(), 24);
    let dnsmasq = Dnsmasq::start(
        &server,
        DnsmasqConfig {
            interface: "s0".into(),
            ..DnsmasqConfig::default()
        },
    );
    let pod = NetNs::new();
    let conf = format!(
        r#"{{"cniVersion":"1.0.0","name":"mnet","type":"macvlan","master":"m0","mode":"bridge",
            "ipam":{{"type":"xdhcp","socketPath":"{}"}}}}"#,
        agent.socket.display()
    );
    let mv = |cmd| {
        invoke(
            &cni.plugin("macvlan"),
            Some(&node),
            cmd,
            "pod-mv",
            Some(pod.path()),
            "net1",
            cni.dir.path(),
            &conf,
        )
    };
    let r = mv("ADD");
    assert!(r.ok, "{} {}\n{}", r.stdout, r.stderr, agent.log());
    let mac = pod.mac("net1");
    let lease = dnsmasq
        .lease_for(mac)
        .expect("dnsmasq lease for the macvlan pod");
    assert_eq!(r.json["ips"][0]["address"], format!("{}/24", lease.ip));
    let r = mv("DEL");
    assert!(r.ok, "{} {}", r.stdout, r.stderr);
    assert!(
        wait_until(Duration::from_secs(5), || dnsmasq.lease_for(mac).is_none()),
        "lease not released:\n{}\nagent:\n{}",
        dnsmasq.log(),
        agent.log()
    );
}

#[test]
fn installed_as_dhcp_with_the_upstream_config() {
    let cni = CniPath::new();
    let agent = AgentProcess::start(&[]);
    let node = BridgeNode::new(true);
    let pod = NetNs::new();
    let conf = format!(
        r#"{{"cniVersion":"1.0.0","name":"xnet","type":"bridge","bridge":"xbr0",
            "ipam":{{"type":"dhcp","daemonSocketPath":"{}",
                     "provide":[{{"option":"host-name","fromArg":"K8S_POD_NAME"}}],
                     "request":[{{"skipDefault":false,"option":"classless-static-routes"}}]}}}}"#,
        agent.socket.display()
    );
    let r = bridge(&cni, &node.node, "ADD", "pod-up", pod.path(), &conf);
    assert!(r.ok, "{} {}\n{}", r.stdout, r.stderr, agent.log());
    let lease = node
        .dnsmasq
        .as_ref()
        .unwrap()
        .lease_for(pod.mac("eth0"))
        .expect("lease");
    assert_eq!(lease.hostname.as_deref(), Some("pod-up"));
}

#[test]
fn gc_status_and_embedded_annotations() {
    let cni = CniPath::new();
    let agent = AgentProcess::start(&[]);
    let lab = Lab::with_clients(2);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let conf = |extra: &str| {
        format!(
            r#"{{"cniVersion":"1.1.0","name":"xnet","ipam":{{"type":"xdhcp","socketPath":"{}"}}{extra}}}"#,
            agent.socket.display()
        )
    };
    for (i, c) in lab.clients.iter().enumerate() {
        let r = cni.xdhcp("ADD", &format!("pod-gc{i}"), c, &conf(""));
        assert!(r.ok, "{} {}", r.stdout, agent.log());
    }
    // STATUS: the agent is ready.
    let r = invoke(
        &cni.plugin("xdhcp"),
        None,
        "STATUS",
        "",
        None,
        "",
        cni.dir.path(),
        &conf(""),
    );
    assert!(r.ok, "{}", r.stdout);

    // Embedded mode: the pod-networks entries are in the local store.
    let status: serde_json::Value = serde_json::from_str(&agent.cli("status", true)).unwrap();
    let ann =
        status["annotations"]["pods"]["default/pod-gc0"]["annotations"]["k8s.ovn.org/pod-networks"]
            .as_str()
            .unwrap_or_else(|| panic!("no annotation: {status}"));
    let ann: serde_json::Value = serde_json::from_str(ann).unwrap();
    let entry = &ann["default/xnet"];
    assert_eq!(entry["ipam_mode"], "dhcp", "{ann}");
    assert_eq!(entry["role"], "secondary", "{ann}");
    assert_eq!(status["datapath"], "ebpf", "{status}");
    assert!(
        wait_until(Duration::from_secs(5), || agent
            .cli("status", false)
            .contains(" tc ")),
        "{}",
        agent.cli("status", false)
    );

    // GC keeps pod-gc0 only: pod-gc1's lease is released.
    let gc = conf(r#","cni.dev/valid-attachments":[{"containerID":"pod-gc0","ifname":"eth0"}]"#);
    let r = invoke(
        &cni.plugin("xdhcp"),
        None,
        "GC",
        "",
        None,
        "",
        cni.dir.path(),
        &gc,
    );
    assert!(r.ok, "{} {}", r.stdout, agent.log());
    let gone = lab.clients[1].mac;
    assert!(
        wait_until(Duration::from_secs(5), || dnsmasq.lease_for(gone).is_none()),
        "GC did not release:\n{}",
        dnsmasq.log()
    );
    assert!(dnsmasq.lease_for(lab.clients[0].mac).is_some());
    let table = agent.cli("leases", false);
    assert!(
        table.contains("default/pod-gc0") && !table.contains("default/pod-gc1"),
        "{table}"
    );
}

#[test]
fn bridge_pod_is_bound_renewed_and_deleted_on_the_ebpf_datapath() {
    // The pod path end to end on whatever kernel runs it (the VM tier runs
    // it on its second kernel): ADD through the real bridge plugin, the eBPF
    // capture on the pod's veth (never the AF_PACKET fallback: the agent is
    // told `--datapath ebpf`), a renewal at T1 and DEL.
    let cni = CniPath::new();
    let agent = AgentProcess::start(&["--datapath", "ebpf"]);
    let node = NetNs::new();
    let _bridge = Bridge::new(&node, "xbr0");
    node.add_addr("xbr0", "192.0.2.1".parse().unwrap(), 24);
    let dnsmasq = Dnsmasq::start(
        &node,
        DnsmasqConfig {
            interface: "xbr0".into(),
            t1_secs: Some(3),
            t2_secs: Some(100),
            ..DnsmasqConfig::default()
        },
    );
    let pod = NetNs::new();
    let conf = bridge_conf(&agent.socket, "");
    let r = bridge(&cni, &node, "ADD", "pod-renew", pod.path(), &conf);
    assert!(r.ok, "{} {}\n{}", r.stdout, r.stderr, agent.log());
    let mac = pod.mac("eth0");
    let lease = dnsmasq.lease_for(mac).expect("dnsmasq lease for the pod");
    assert_eq!(r.json["ips"][0]["address"], format!("{}/24", lease.ip));

    // The first DORA runs on AF_PACKET while the lease task attaches the
    // TC program (no ADD waits for an attach); from then on the ring buffer.
    let status = || -> serde_json::Value {
        serde_json::from_str(&agent.cli("status", true)).expect("status JSON")
    };
    assert_eq!(status()["datapath"], "ebpf", "{}", status());
    assert!(
        wait_until(
            Duration::from_secs(20),
            || status()["interfaces"][0]["attach"] == "tc"
        ),
        "{}\n{}",
        status(),
        agent.log()
    );

    let mac_text = xdhcp_tests::format_mac(mac);
    let acks = || {
        dnsmasq
            .log()
            .lines()
            .filter(|l| l.contains("DHCPACK(") && l.contains(&mac_text))
            .count()
    };
    // A renewal after the attach (T1 is 3 s, and under load the attach can
    // come after the first renewal, which then ran on AF_PACKET).
    let before = acks();
    assert!(
        wait_until(Duration::from_secs(30), || acks() > before.max(1)),
        "no renewal at T1 after the attach:\n{}\nagent:\n{}",
        dnsmasq.log(),
        agent.log()
    );
    let leases = agent.cli("leases", true);
    assert!(leases.contains(&lease.ip.to_string()), "{leases}");
    // The renewal's ACK came through the ring buffer.
    // (dnsmasq logs its ACK before it sends it: wait for the frame.)
    assert!(
        wait_until(
            Duration::from_secs(5),
            || status()["counters"]["kernel.captured"].as_u64() >= Some(1)
        ),
        "{}\n{}",
        status(),
        agent.log()
    );

    let r = bridge(&cni, &node, "DEL", "pod-renew", pod.path(), &conf);
    assert!(r.ok, "DEL: {} {}", r.stdout, r.stderr);
    assert_eq!(agent.cli("leases", true).trim(), "[]");
}

/// The installed plugin is the thin binary (no async runtime, no Kubernetes
/// client, no eBPF loader); it must answer exactly as the agent binary does
/// and hand every agent command over to the agent binary beside it.
#[test]
fn thin_plugin_answers_as_the_agent_binary_and_hands_agent_commands_over() {
    let cni = CniPath::new();
    let full = agent_support::xdhcp_bin();
    let thin = cni.plugin("xdhcp");
    let netns = format!("/proc/{}/ns/net", std::process::id());
    let bad = r#"{"cniVersion":"0.4.0","name":"n","ipam":{"type":"xdhcp","timeout":"forever"}}"#;
    for (command, config) in [
        ("VERSION", ""),
        ("ADD", bad),
        ("STATUS", bad),
        ("BOGUS", bad),
    ] {
        let run = |plugin: &Path| {
            invoke(
                plugin,
                None,
                command,
                "c1",
                Some(Path::new(&netns)),
                "eth0",
                cni.dir.path(),
                config,
            )
        };
        let (a, b) = (run(&full), run(&thin));
        assert_eq!(
            (a.ok, &a.stdout, &a.stderr),
            (b.ok, &b.stdout, &b.stderr),
            "{command}"
        );
        assert!(!a.stdout.is_empty(), "{command}: {a:?}");
    }
    // The bad config names the field, through either binary.
    let out = invoke(
        &thin,
        None,
        "ADD",
        "c1",
        Some(Path::new(&netns)),
        "eth0",
        cni.dir.path(),
        bad,
    );
    assert!(!out.ok);
    assert_eq!(out.json["code"], 7, "{out:?}");
    assert_eq!(
        out.json["msg"], "ipam.timeout: must be a duration between 1s and 300s",
        "{out:?}"
    );

    // `xdhcp agent --help` and `dhcp daemon -h` come from the agent binary.
    for (name, args) in [
        ("xdhcp", &["agent", "--help"][..]),
        ("dhcp", &["daemon", "-h"][..]),
    ] {
        let run = |bin: &Path| {
            let o = std::process::Command::new(bin)
                .args(args)
                .env_remove("CNI_COMMAND")
                .output()
                .unwrap();
            (o.status.code(), o.stdout, o.stderr)
        };
        let via_thin = run(&cni.plugin(name));
        assert_eq!(via_thin.0, Some(0), "{name} {args:?}: {via_thin:?}");
        // argv[0] is kept: the agent binary sees the name it was run as.
        let link = cni.dir.path().join(format!("direct-{name}"));
        let _ = std::fs::create_dir(&link);
        std::os::unix::fs::symlink(&full, link.join(name)).unwrap();
        assert_eq!(via_thin, run(&link.join(name)), "{name} {args:?}");
    }
    assert!(
        String::from_utf8_lossy(
            &std::process::Command::new(cni.plugin("xdhcp"))
                .args(["agent", "--help"])
                .env_remove("CNI_COMMAND")
                .output()
                .unwrap()
                .stdout
        )
        .contains("--state-dir")
    );

    // Without the agent binary beside it, the thin binary says what it tried.
    let lonely = tempfile::tempdir().unwrap();
    let copy = lonely.path().join("dhcp");
    std::fs::copy(agent_support::plugin_bin(), &copy).unwrap();
    let o = std::process::Command::new(&copy)
        .arg("daemon")
        .env_remove("CNI_COMMAND")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(127), "{o:?}");
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(text.contains("xdhcp-agent"), "{text}");
}
