//! Dual-stack networks end to end: the thin `xdhcp` plugin as the IPAM
//! plugin of a `"family": "dual"` network, an `xdhcp agent` process in
//! embedded mode (or in process, reporting to the stand-in API server), and
//! two dnsmasq processes in a server namespace behind the lab bridge, one
//! serving a DHCPv4 range and one a DHCPv6 range. The pod's attachment
//! holds a lease of each family.
//!
//! ```text
//!  [pod ns: eth0] ──veth── c0 ┐
//!                             ├─ br0 (node ns)
//!                        up0 ─┘
//!                         │ veth
//!   [dhcp ns: s0 192.0.2.1/24 fd00:6::1/64,
//!    dnsmasq DHCPv4 192.0.2.10–250, dnsmasq DHCPv6 fd00:6::100–1ff]
//! ```

mod agent_support;

use std::path::Path;
use std::time::Duration;

use agent_support::{AgentProcess, PluginOutput, ipam_only as call};
use xdhcp::cli::{DatapathChoice, KubeMode};
use xdhcp_tests::bench::{free_local_addr, http_get};
use xdhcp_tests::{
    Dnsmasq, Dnsmasq6, DnsmasqConfig, InProcessAgent, Lab, NetNs, StandInApi, format_mac,
    wait_until,
};

fn conf(socket: &Path) -> String {
    format!(
        r#"{{"cniVersion":"1.1.0","name":"dualnet",
            "ipam":{{"type":"xdhcp","socketPath":"{}","family":"dual","apply":true,
                     "timeout":"20s","ipv6":{{"prefixLength":64}}}}}}"#,
        socket.display()
    )
}

/// Both servers in the lab's server namespace, on its interface: DHCPv4
/// (`v4`, on the interface's 192.0.2.1/24) and DHCPv6.
fn servers(lab: &Lab, v4: DnsmasqConfig) -> (Dnsmasq, Dnsmasq6) {
    let v4 = Dnsmasq::start(
        lab.dhcp_ns(),
        DnsmasqConfig {
            interface: Lab::SERVER_IF.to_owned(),
            ..v4
        },
    );
    (v4, Dnsmasq6::start(lab.dhcp_ns()))
}

/// The two addresses of a dual-stack ADD's result (IPv4 /24 with its
/// router, IPv6 /64 in the range), after checking the rest of the result:
/// the default route of the IPv4 lease and both servers' DNS.
fn leased(r: &PluginOutput, agent: &AgentProcess) -> (String, String) {
    assert!(r.ok, "ADD failed: {}\nagent:\n{}", r.text(), agent.log());
    let ips = r.json["ips"]
        .as_array()
        .unwrap_or_else(|| panic!("no ips in {}", r.stdout));
    assert_eq!(ips.len(), 2, "{}", r.stdout);
    let v4 = ips[0]["address"].as_str().unwrap();
    assert!(
        v4.starts_with("192.0.2.") && v4.ends_with("/24"),
        "{}",
        r.stdout
    );
    assert_eq!(ips[0]["gateway"], "192.0.2.1", "{}", r.stdout);
    let v6 = ips[1]["address"].as_str().unwrap();
    let (v6_addr, len) = v6.split_once('/').unwrap();
    assert_eq!(len, "64", "{}", r.stdout);
    let a: std::net::Ipv6Addr = v6_addr.parse().unwrap();
    assert!(
        (0xfd00_0006_0000_0000_0000_0000_0000_0100..=0xfd00_0006_0000_0000_0000_0000_0000_01ff)
            .contains(&u128::from(a)),
        "{a} is not in the DHCPv6 server's range"
    );
    assert_eq!(
        r.json["routes"],
        serde_json::json!([{"dst": "0.0.0.0/0", "gw": "192.0.2.1"}]),
        "{}",
        r.stdout
    );
    assert_eq!(
        r.json["dns"]["nameservers"],
        serde_json::json!(["192.0.2.53", "fd00:6::53"]),
        "{}",
        r.stdout
    );
    (v4.split('/').next().unwrap().to_owned(), v6_addr.to_owned())
}

fn pod_has(pod: &NetNs, cidr: &str) -> bool {
    pod.ip(&["addr", "show", "dev", "eth0"]).contains(cidr)
}

fn v4_held(server: &Dnsmasq, addr: &str) -> bool {
    server.leases().iter().any(|l| l.ip.to_string() == addr)
}

/// The two rows of the attachment `id` in `xdhcp leases`: (family,
/// address) each, IPv4 first.
fn lease_rows(agent: &AgentProcess, id: &str) -> Vec<(String, String)> {
    let rows: serde_json::Value = serde_json::from_str(&agent.cli("leases", true)).unwrap();
    let mut out: Vec<(String, String)> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["containerId"] == id)
        .map(|r| {
            let address = match r["family"].as_str() {
                Some("ipv6") => r["address6"].as_str(),
                _ => r["address"].as_str(),
            };
            (
                r["family"].as_str().unwrap_or_default().to_owned(),
                address.unwrap_or_default().to_owned(),
            )
        })
        .collect();
    out.sort();
    out
}

/// The records in the agent's lease directory.
fn record_files(agent: &AgentProcess) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(agent.state_dir.join("leases"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// ADD leases both families on the one attachment, at once: the DHCPv6
/// lease is bound while the DHCPv4 server is still checking its address
/// (dnsmasq pings an address for ~3 s before offering it), after the
/// DHCPv4 DISCOVER reached it. The result carries both; both are on the
/// pod's interface, at their servers, in `xdhcp leases` as two rows, and
/// in a record each; CHECK passes. DEL RELEASEs both (gone from both lease
/// files), takes both off and removes both records.
#[test]
fn a_dual_stack_pod_gets_both_leases_at_once_and_releases_both_at_del() {
    let lab = Lab::builder().server_behind_uplink().build();
    let (v4, v6) = servers(
        &lab,
        DnsmasqConfig {
            no_ping: false,
            ..DnsmasqConfig::default()
        },
    );
    let agent = AgentProcess::start(&[]);
    let pod = &lab.clients[0].ns;
    let conf = conf(&agent.socket);

    let r = std::thread::scope(|s| {
        let adding = s.spawn(|| call("ADD", "dualpod", pod, &conf));
        assert!(
            wait_until(Duration::from_secs(20), || !v6.leases().trim().is_empty()),
            "no DHCPv6 lease:\n{}\nagent:\n{}",
            v6.log(),
            agent.log()
        );
        assert!(
            // dnsmasq logs the DISCOVER itself with its OFFER, after the
            // ping; the line naming the client is logged as it arrives.
            v4.log().contains("client provides name: dualpod") && v4.leases().is_empty(),
            "the DHCPv6 lease was not acquired beside the DHCPv4 exchange:\n{}",
            v4.log()
        );
        adding.join().unwrap()
    });
    let (a4, a6) = leased(&r, &agent);
    assert!(pod_has(pod, &format!("{a4}/24")), "{}", pod.ip(&["addr"]));
    assert!(pod_has(pod, &format!("{a6}/64")), "{}", pod.ip(&["addr"]));
    assert!(v4_held(&v4, &a4), "{:?}", v4.leases());
    assert!(v6.leases().contains(&a6), "{}", v6.leases());
    assert_eq!(
        lease_rows(&agent, "dualpod"),
        [
            ("ipv4".to_owned(), format!("{a4}/24")),
            ("ipv6".to_owned(), format!("{a6}/64")),
        ],
        "{}",
        agent.cli("leases", false)
    );
    assert_eq!(
        record_files(&agent),
        ["dualpod@eth0@ipv4.json", "dualpod@eth0@ipv6.json"]
    );
    // `xdhcp status` counts them by family.
    let status: serde_json::Value = serde_json::from_str(&agent.cli("status", true)).unwrap();
    assert_eq!(
        status["leasesByFamily"],
        serde_json::json!({"ipv4": 1, "ipv6": 1}),
        "{status}"
    );
    let text = agent.cli("status", false);
    assert!(text.contains("leases:       2 (ipv4 1, ipv6 1)"), "{text}");
    // `xdhcp bindings` lists both, each with its family.
    let rows: serde_json::Value = serde_json::from_str(&agent.cli("bindings", true)).unwrap();
    let mut bound: Vec<(String, String, String)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let field = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
            (field("family"), field("ip"), field("source"))
        })
        .collect();
    bound.sort();
    assert_eq!(
        bound,
        [
            ("ipv4".to_owned(), a4.clone(), "leased".to_owned()),
            ("ipv6".to_owned(), a6.clone(), "leased".to_owned()),
        ],
        "{}",
        agent.cli("bindings", false)
    );
    let c = call("CHECK", "dualpod", pod, &conf);
    assert!(c.ok, "CHECK failed: {}", c.text());
    // A repeated ADD returns both.
    let again = call("ADD", "dualpod", pod, &conf);
    assert_eq!(leased(&again, &agent), (a4.clone(), a6.clone()));

    let d = call("DEL", "dualpod", pod, &conf);
    assert!(d.ok, "DEL failed: {}\nagent:\n{}", d.text(), agent.log());
    assert!(
        wait_until(Duration::from_secs(5), || !v4_held(&v4, &a4)),
        "the DHCPv4 RELEASE was not honoured:\n{}",
        v4.log()
    );
    assert!(
        wait_until(Duration::from_secs(5), || !v6.leases().contains(&a6)),
        "the DHCPv6 RELEASE was not honoured:\n{}",
        v6.log()
    );
    assert!(!pod_has(pod, &format!("{a4}/24")), "{a4} still on eth0");
    assert!(!pod_has(pod, &format!("{a6}/64")), "{a6} still on eth0");
    assert!(lease_rows(&agent, "dualpod").is_empty());
    assert!(
        record_files(&agent).is_empty(),
        "{:?}",
        record_files(&agent)
    );
}

/// A killed and restarted agent resumes both leases: the DHCPv4 one
/// without a new DISCOVER, the DHCPv6 one with a REBIND (no new
/// SOLICIT); both stay on the interface, a repeated ADD returns both,
/// and DEL still releases both.
#[test]
fn a_restarted_agent_resumes_both_leases_of_a_dual_stack_pod() {
    let lab = Lab::builder().server_behind_uplink().build();
    let (v4, v6) = servers(&lab, DnsmasqConfig::default());
    let mut agent = AgentProcess::start(&[]);
    let pod = &lab.clients[0].ns;
    let conf = conf(&agent.socket);

    let (a4, a6) = leased(&call("ADD", "dualagain", pod, &conf), &agent);
    let (discovers, solicits) = (
        v4.count_in_log("DHCPDISCOVER"),
        v6.log().matches("DHCPSOLICIT").count(),
    );
    agent.kill_and_restart();
    assert!(
        wait_until(Duration::from_secs(10), || v6.log().contains("DHCPREBIND")),
        "no REBIND after the restart:\n{}\nagent:\n{}",
        v6.log(),
        agent.log()
    );
    assert!(
        wait_until(Duration::from_secs(10), || lease_rows(&agent, "dualagain")
            == [
                ("ipv4".to_owned(), format!("{a4}/24")),
                ("ipv6".to_owned(), format!("{a6}/64")),
            ]),
        "{}\nagent:\n{}",
        agent.cli("leases", false),
        agent.log()
    );
    assert_eq!(v4.count_in_log("DHCPDISCOVER"), discovers, "{}", v4.log());
    assert_eq!(v6.log().matches("DHCPSOLICIT").count(), solicits);
    assert!(pod_has(pod, &format!("{a4}/24")) && pod_has(pod, &format!("{a6}/64")));
    let again = call("ADD", "dualagain", pod, &conf);
    assert_eq!(leased(&again, &agent), (a4.clone(), a6.clone()));

    let d = call("DEL", "dualagain", pod, &conf);
    assert!(d.ok, "DEL failed: {}", d.text());
    assert!(
        wait_until(Duration::from_secs(5), || !v4_held(&v4, &a4)
            && !v6.leases().contains(&a6)),
        "the resumed leases were not both released:\n{:?}\n{}",
        v4.leases(),
        v6.leases()
    );
}

/// A restarted agent that finds only one of a dual-stack attachment's
/// records (the DHCPv6 one lost) resumes that lease alone; the runtime's
/// repeated ADD then does not answer with the one family it holds, but
/// acquires the attachment whole again: both addresses in the result (the
/// DHCPv6 one the same, the server knowing the pod's DUID), two rows.
#[test]
fn a_repeated_add_makes_a_dual_stack_attachment_that_lost_a_record_whole() {
    let lab = Lab::builder().server_behind_uplink().build();
    let (v4, v6) = servers(&lab, DnsmasqConfig::default());
    let mut agent = AgentProcess::start(&[]);
    let pod = &lab.clients[0].ns;
    let conf = conf(&agent.socket);

    let (a4, a6) = leased(&call("ADD", "dualhalf", pod, &conf), &agent);
    agent.process.kill();
    std::fs::remove_file(agent.state_dir.join("leases/dualhalf@eth0@ipv6.json")).unwrap();
    agent.start_again();
    assert!(
        wait_until(Duration::from_secs(10), || lease_rows(&agent, "dualhalf")
            == [("ipv4".to_owned(), format!("{a4}/24"))]),
        "{}\nagent:\n{}",
        agent.cli("leases", false),
        agent.log()
    );

    let again = call("ADD", "dualhalf", pod, &conf);
    assert_eq!(leased(&again, &agent), (a4.clone(), a6.clone()));
    assert_eq!(
        lease_rows(&agent, "dualhalf"),
        [
            ("ipv4".to_owned(), format!("{a4}/24")),
            ("ipv6".to_owned(), format!("{a6}/64")),
        ]
    );
    assert_eq!(
        record_files(&agent),
        ["dualhalf@eth0@ipv4.json", "dualhalf@eth0@ipv6.json"]
    );
    let d = call("DEL", "dualhalf", pod, &conf);
    assert!(d.ok, "DEL failed: {}", d.text());
    assert!(
        wait_until(Duration::from_secs(5), || !v4_held(&v4, &a4)
            && !v6.leases().contains(&a6)),
        "not both released:\n{:?}\n{}",
        v4.leases(),
        v6.leases()
    );
}

/// No DHCPv6 server answers: the dual-stack ADD fails naming the DHCPv6
/// acquisition, and the DHCPv4 lease it had bound is given back —
/// released (gone from the server's lease file), off the interface, no
/// record and no row left.
#[test]
fn a_dual_stack_add_whose_ipv6_lease_fails_gives_the_ipv4_one_back() {
    let lab = Lab::builder().server_behind_uplink().build();
    let v4 = Dnsmasq::start(
        lab.dhcp_ns(),
        DnsmasqConfig {
            interface: Lab::SERVER_IF.to_owned(),
            ..DnsmasqConfig::default()
        },
    );
    let agent = AgentProcess::start(&[]);
    let pod = &lab.clients[0].ns;
    let conf = conf(&agent.socket).replace(r#""timeout":"20s""#, r#""timeout":"4s""#);

    let r = call("ADD", "dualfail", pod, &conf);
    assert!(!r.ok, "the ADD must fail: {}", r.stdout);
    assert!(
        r.text().contains("DHCPv6"),
        "the error names the failed family: {}",
        r.text()
    );
    assert!(v4.log().contains("DHCPACK"), "{}", v4.log());
    assert!(
        wait_until(Duration::from_secs(5), || v4.leases().is_empty()),
        "the DHCPv4 lease was not given back:\n{:?}\n{}",
        v4.leases(),
        v4.log()
    );
    assert!(v4.log().contains("DHCPRELEASE"), "{}", v4.log());
    assert!(
        !pod.ip(&["-4", "addr", "show", "dev", "eth0"])
            .contains("192.0.2."),
        "the DHCPv4 address stayed on the interface"
    );
    assert!(lease_rows(&agent, "dualfail").is_empty());
    assert!(
        record_files(&agent).is_empty(),
        "{:?}",
        record_files(&agent)
    );
}

/// The pod of the stand-in API server (**not a cluster**) the test below
/// reports to.
const POD_NETWORKS: &str = "k8s.ovn.org/pod-networks";

/// A dual-stack pod's `pod-networks` entry carries both its addresses
/// (each with its prefix length), both gateways (the DHCPv4 lease's router,
/// the network's IPv6 gateway), `ipam_mode: dhcp` and the pod's MAC,
/// written before the ADD answers; DEL removes it. Where the ADD's time
/// went is in the metrics, each phase once, as for one family.
#[test]
fn a_dual_stack_pods_addresses_are_in_its_pod_networks_entry_fake_apiserver() {
    let api = StandInApi::start();
    let uid = api.server.add_pod("tenant", "dualweb", &[], &[]);
    let lab = Lab::builder().server_behind_uplink().build();
    let (_v4, _v6) = servers(&lab, DnsmasqConfig::default());
    let metrics = free_local_addr();
    let agent = InProcessAgent::start_with(|a| {
        a.kube = KubeMode::On;
        a.kubeconfig = Some(api.kubeconfig.clone());
        a.datapath = DatapathChoice::Afpacket;
        a.metrics_addr = Some(metrics);
    });
    let c = &lab.clients[0];
    let conf = r#"{"cniVersion":"1.1.0","name":"dualnet","type":"ovn-k8s-cni-overlay",
        "topology":"localnet","role":"secondary","netAttachDefName":"tenant/dualnet",
        "ipam":{"type":"xdhcp","family":"dual","apply":true,"timeout":"20s",
                "ipv6":{"prefixLength":64,"gateway":"fd00:6::1"}}}"#;
    let req = xdhcp::rpc::CniRequest {
        container_id: "ctr-dualweb".to_owned(),
        ifname: "eth0".to_owned(),
        netns: Some(c.ns.path().to_path_buf()),
        args: [
            ("K8S_POD_NAMESPACE".to_owned(), "tenant".to_owned()),
            ("K8S_POD_NAME".to_owned(), "dualweb".to_owned()),
            ("K8S_POD_UID".to_owned(), uid),
        ]
        .into(),
        config: xdhcp::cni::config::parse(conf.as_bytes()).unwrap(),
    };

    let r = agent.add(&req).expect("ADD");
    let (a4, a6) = (r.ips[0].address.to_string(), r.ips6[0].address.to_string());
    assert!(a4.starts_with("192.0.2.") && a4.ends_with("/24"), "{a4}");
    assert!(a6.starts_with("fd00:6::1") && a6.ends_with("/64"), "{a6}");
    let annotation = api
        .server
        .annotation("tenant", "dualweb", POD_NETWORKS)
        .expect("the entry is written before the ADD answers");
    let e = &serde_json::from_str::<serde_json::Value>(&annotation).unwrap()["tenant/dualnet"];
    assert_eq!(e["ip_addresses"], serde_json::json!([a4, a6]), "{e}");
    assert_eq!(
        e["gateway_ips"],
        serde_json::json!(["192.0.2.1", "fd00:6::1"]),
        "{e}"
    );
    assert_eq!(e["ipam_mode"], "dhcp", "{e}");
    assert_eq!(e["role"], "secondary", "{e}");
    assert_eq!(e["mac_address"], format_mac(c.mac), "{e}");
    let families: Vec<String> = agent.leases().into_iter().map(|l| l.family).collect();
    assert_eq!(families.len(), 2, "{families:?}");
    let text = http_get(metrics, "/metrics").expect("the metrics server answers");
    xdhcp_tests::bench::assert_add_phases_observed(&text, 1);
    let sum = |phase: &str| xdhcp_tests::bench::add_phase_sum(&text, phase);
    assert!(sum("offer") > 0.0 && sum("ack") > 0.0, "{text}");
    assert!(sum("report") > 0.0, "the entry's write: {text}");

    let _: serde_json::Value = agent.post(xdhcp::rpc::PATH_DEL, &req).expect("DEL");
    let after = api
        .server
        .annotation("tenant", "dualweb", POD_NETWORKS)
        .unwrap_or_default();
    assert!(!after.contains("tenant/dualnet"), "{after}");
    assert!(agent.leases().is_empty(), "{:?}", agent.leases());
}
