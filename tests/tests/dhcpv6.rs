//! IPv6 networks end to end: the thin `xdhcp` plugin as the IPAM plugin of a
//! `"family": "ipv6"` network, an `xdhcp agent` process in embedded mode,
//! and dnsmasq serving a DHCPv6 range in a server namespace behind the lab
//! bridge. The agent leases through a UDP socket in the pod's namespace.
//!
//! ```text
//!  [pod ns: eth0] ──veth── c0 ┐
//!                             ├─ br0 (node ns)
//!                        up0 ─┘
//!                         │ veth
//!                  [dhcp ns: s0 fd00:6::1/64, dnsmasq DHCPv6 fd00:6::100–1ff]
//! ```

mod agent_support;

use std::path::Path;
use std::time::Duration;

use agent_support::{AgentProcess, NodeAgent, PluginOutput, ipam_only as call};
use xdhcp::cli::{DatapathChoice, KubeMode};
use xdhcp::cni::types::code;
use xdhcp_tests::bench::{free_local_addr, http_get, metric_count};
use xdhcp_tests::fake_apiserver::{Fault, Op};
use xdhcp_tests::{
    Dnsmasq6, InProcessAgent, Kea6, Kea6Options, Lab, NetNs, StandInApi, format_mac, wait_until,
};

fn conf(socket: &Path) -> String {
    format!(
        r#"{{"cniVersion":"1.1.0","name":"v6net",
            "ipam":{{"type":"xdhcp","socketPath":"{}","family":"ipv6","apply":true,
                     "timeout":"20s","ipv6":{{"prefixLength":64}}}}}}"#,
        socket.display()
    )
}

/// The address of an ADD's result, which must be a /64 in the range.
fn leased(r: &PluginOutput, agent: &AgentProcess) -> String {
    assert!(r.ok, "ADD failed: {}\nagent:\n{}", r.text(), agent.log());
    let cidr = r.json["ips"][0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no address in {}", r.stdout));
    let (addr, len) = cidr.split_once('/').unwrap();
    assert_eq!(len, "64", "{cidr}");
    let a: std::net::Ipv6Addr = addr.parse().unwrap();
    assert!(
        (0xfd00_0006_0000_0000_0000_0000_0000_0100..=0xfd00_0006_0000_0000_0000_0000_0000_01ff)
            .contains(&u128::from(a)),
        "{a} is not in the server's range"
    );
    assert_eq!(
        r.json["dns"]["nameservers"][0], "fd00:6::53",
        "{}",
        r.stdout
    );
    assert!(
        r.json.get("routes").is_none(),
        "no gateway, no route: {}",
        r.stdout
    );
    addr.to_owned()
}

fn pod_has(pod: &NetNs, addr: &str) -> bool {
    pod.ip(&["-6", "addr", "show", "dev", "eth0"])
        .contains(&format!("{addr}/64"))
}

/// ADD leases an IPv6 address through the agent (on the pod's interface, in
/// the result, at the server, in `xdhcp leases` with its family); DEL
/// RELEASEs it (gone from the server's lease file) and takes it off.
#[test]
fn an_ipv6_pod_gets_its_lease_and_releases_it_at_del() {
    let lab = Lab::builder().server_behind_uplink().build();
    let server = Dnsmasq6::start(lab.dhcp_ns());
    let agent = AgentProcess::start(&[]);
    let pod = &lab.clients[0].ns;
    let conf = conf(&agent.socket);

    let r = call("ADD", "v6pod", pod, &conf);
    let addr = leased(&r, &agent);
    assert!(
        pod_has(pod, &addr),
        "{addr} not on eth0:\n{}",
        pod.ip(&["-6", "addr"])
    );
    assert!(
        server.leases().contains(&addr),
        "dnsmasq holds no lease for {addr}:\n{}",
        server.leases()
    );
    let table = agent.cli("leases", false);
    let row = table
        .lines()
        .find(|l| l.contains("default/v6pod"))
        .unwrap_or_else(|| panic!("no row for the pod:\n{table}"));
    assert!(
        row.contains("ipv6") && row.contains(&format!("{addr}/64")) && row.contains("Bound"),
        "{table}"
    );
    // CHECK passes while the address is on the interface.
    let c = call("CHECK", "v6pod", pod, &conf);
    assert!(c.ok, "CHECK failed: {}", c.text());

    let d = call("DEL", "v6pod", pod, &conf);
    assert!(d.ok, "DEL failed: {}\nagent:\n{}", d.text(), agent.log());
    assert!(
        wait_until(Duration::from_secs(5), || !server.leases().contains(&addr)),
        "the RELEASE was not honoured: dnsmasq still holds {addr}:\n{}\nlog:\n{}",
        server.leases(),
        server.log()
    );
    assert!(server.log().contains("DHCPRELEASE"), "{}", server.log());
    assert!(!pod_has(pod, &addr), "{addr} still on eth0");
    assert!(
        !agent.cli("leases", false).contains("v6pod"),
        "the attachment is forgotten"
    );
}

/// A pod whose interface has just come up has a tentative link-local
/// address for as long as the kernel's duplicate address detection runs,
/// and no source to send a SOLICIT from. The SOLICIT goes as soon as the
/// address is usable, not at the engine's next retransmission: here the
/// detection takes 1.5 s (one solicitation, a 1.5 s retransmission timer,
/// no random delay), so the retransmissions (about 1 s and 3 s after the
/// first SOLICIT) would start the exchange near 3 s; here it runs from
/// the SOLICIT sent at the kernel's notice, which no retransmission
/// follows. (Without `apply`: the leased address's own detection, which an
/// ADD with `apply` waits for, would take 1.5 s more.)
#[test]
fn a_fresh_interfaces_solicit_leaves_as_soon_as_its_link_local_address_is_usable() {
    let lab = Lab::builder().server_behind_uplink().build();
    let _server = Dnsmasq6::start(lab.dhcp_ns());
    let agent = AgentProcess::start(&[]);
    let pod = &lab.clients[0].ns;
    let conf = conf(&agent.socket).replace(r#""apply":true"#, r#""apply":false"#);
    assert!(conf.contains(r#""apply":false"#), "{conf}");
    pod.run_in(|| {
        for (key, value) in [
            ("conf/eth0/dad_transmits", "1"),
            ("neigh/eth0/retrans_time_ms", "1500"),
            ("conf/eth0/router_solicitation_delay", "0"),
        ] {
            let path = format!("/proc/sys/net/ipv6/{key}");
            std::fs::write(&path, value).unwrap_or_else(|e| panic!("{path}: {e}"));
        }
    });
    // Down and up: the link-local address is made again, tentative.
    pod.ip(&["link", "set", "eth0", "down"]);
    pod.ip(&["link", "set", "eth0", "up"]);
    let up = std::time::Instant::now();
    let addrs = pod.ip(&["-6", "addr", "show", "dev", "eth0", "scope", "link"]);
    assert!(addrs.contains("tentative"), "{addrs}");

    let r = call("ADD", "v6fresh", pod, &conf);
    let took = up.elapsed();
    let _ = leased(&r, &agent);
    assert!(
        agent
            .log()
            .contains("the interface's link-local address became usable"),
        "the SOLICIT was not held back:\n{}",
        agent.log()
    );
    // Sent on the kernel's notice that the address is usable, not found
    // so by trying the send again on a timer; and the exchange ran from
    // that SOLICIT: no retransmission was sent after it.
    let log = agent.log();
    let mut after = log
        .lines()
        .skip_while(|l| !l.contains("the interface's link-local address became usable"));
    let sent = after.next().unwrap_or_default();
    assert!(sent.contains("woken_by=\"notice\""), "{sent}");
    assert!(
        !after.any(|l| l.contains("DHCPv6 send kind=solicit")),
        "the exchange waited for a retransmission ({took:?} after the interface came up):\n{log}"
    );
    assert!(
        log.contains("DHCPv6 send kind=solicit"),
        "the log names no SOLICIT sent:\n{log}"
    );
    let d = call("DEL", "v6fresh", pod, &conf);
    assert!(d.ok, "DEL failed: {}", d.text());
}

/// The kernel path: the capture program goes on the pod's interface a
/// little after the ADD (the first exchange is the socket's), the agent
/// owns each later transaction in the kernel by its id and the IAID, and
/// the server's REPLY to the renewal comes over the ring buffer, consumed
/// before the pod's stack (which the lease's socket listens on). `xdhcp
/// status` shows it captured and dropped, and the lease's path is the
/// program's. At DEL nothing stays owned. Kea, with a T1 of 2 s.
#[test]
fn an_ipv6_pods_renewal_comes_through_the_kernel_program() {
    let lab = Lab::builder().server_behind_uplink().build();
    let kea = Kea6::start_with(
        lab.dhcp_ns(),
        Kea6Options {
            timers: Some([2, 4, 6, 12]),
            ..Kea6Options::default()
        },
    );
    let agent = AgentProcess::start(&[]);
    let pod = &lab.clients[0].ns;
    let conf = conf(&agent.socket);

    let r = call("ADD", "v6kernel", pod, &conf);
    assert!(r.ok, "ADD failed: {}\nagent:\n{}", r.text(), agent.log());
    let status =
        || -> serde_json::Value { serde_json::from_str(&agent.cli("status", true)).unwrap() };
    let counter = |name: &str| status()["counters"][name].as_u64().unwrap_or(0);
    assert_eq!(status()["datapath"], "ebpf");
    let path_is_tc = || {
        agent
            .cli("leases", false)
            .lines()
            .any(|l| l.contains("default/v6kernel") && l.contains(" tc "))
    };
    assert!(
        wait_until(Duration::from_secs(10), path_is_tc),
        "the lease's path never became the program's:\n{}",
        agent.cli("leases", false)
    );
    // The renewal at T1 (2 s) is opened with the program attached.
    assert!(
        wait_until(Duration::from_secs(10), || agent
            .log()
            .contains("DHCPv6 lease renewed")),
        "no renewal:\n{}",
        agent.log()
    );
    assert!(
        counter("kernel.captured") >= 1 && counter("kernel.dropped_owned") >= 1,
        "no DHCPv6 reply came through the kernel program: {}\nagent:\n{}",
        status()["counters"],
        agent.log()
    );

    let d = call("DEL", "v6kernel", pod, &conf);
    assert!(d.ok, "DEL failed: {}\nagent:\n{}", d.text(), agent.log());
    assert!(
        wait_until(Duration::from_secs(5), || kea.leases().is_empty()),
        "the RELEASE was not honoured:\n{:?}",
        kea.leases()
    );
    assert_eq!(
        status()["counters"]["agent.routed_xids"],
        0,
        "a transaction is still routed after DEL: {}",
        status()
    );
}

/// With the server behind a node uplink the agent captures on (`--uplink
/// up0`, the agent in the node's namespace), the server's REPLYs are taken
/// by the uplink's program: the same ownership map serves both programs.
/// The lease's path names the uplink, and the RELEASE at DEL is honoured.
#[test]
fn an_ipv6_pods_replies_are_taken_at_the_node_uplink() {
    let lab = Lab::builder().server_behind_uplink().build();
    let server = Dnsmasq6::start(lab.dhcp_ns());
    let agent = NodeAgent::start(&lab.server, &["--uplink", "up0"]);
    agent.wait_uplink_live(Duration::from_secs(10), "the uplink was not attached");
    let pod = &lab.clients[0].ns;
    let conf = conf(&agent.socket);

    let r = call("ADD", "v6uplink", pod, &conf);
    assert!(r.ok, "ADD failed: {}\nagent:\n{}", r.text(), agent.log());
    let leases = agent.leases();
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(leases[0].path, "uplink:up0", "{leases:?}\n{}", agent.log());
    assert!(
        agent.counter("kernel.captured") >= 1 && agent.counter("kernel.dropped_owned") >= 1,
        "{:?}",
        agent.status().counters
    );
    let addr = leases[0]
        .address6
        .as_ref()
        .map_or_else(|| panic!("no address: {leases:?}"), |c| c.addr.to_string());
    let d = call("DEL", "v6uplink", pod, &conf);
    assert!(d.ok, "DEL failed: {}\nagent:\n{}", d.text(), agent.log());
    assert!(
        wait_until(Duration::from_secs(5), || !server.leases().contains(&addr)),
        "the RELEASE was not honoured: {addr}\n{}",
        server.log()
    );
}

/// The bridge plugin deletes the pod's interface before the IPAM plugin's
/// DEL: the pod's socket cannot send the RELEASE any more. A lease whose
/// replies came through a node uplink is released there instead — from the
/// pod's MAC and link-local address to `ff02::1:2` — and the server gives
/// the address up.
#[test]
fn an_ipv6_lease_whose_interface_is_gone_before_del_is_released_through_the_uplink() {
    released_through_the_uplink_once_the_interface_is_gone(false);
}

/// The same when the agent restarted after the interface went: the lease's
/// record names the uplink, the restarted agent keeps the lease it cannot
/// resume, and its DEL releases it there.
#[test]
fn an_ipv6_lease_whose_interface_went_before_a_restart_is_released_through_the_uplink_at_del() {
    released_through_the_uplink_once_the_interface_is_gone(true);
}

fn released_through_the_uplink_once_the_interface_is_gone(restart: bool) {
    let lab = Lab::builder().server_behind_uplink().build();
    let server = Dnsmasq6::start(lab.dhcp_ns());
    let flags = ["--uplink", "up0"];
    let mut agent = NodeAgent::start(&lab.server, &flags);
    agent.wait_uplink_live(Duration::from_secs(10), "the uplink was not attached");
    let pod = &lab.clients[0].ns;
    let conf = conf(&agent.socket);

    let r = call("ADD", "v6gone", pod, &conf);
    assert!(r.ok, "ADD failed: {}\nagent:\n{}", r.text(), agent.log());
    let leases = agent.leases();
    assert_eq!(leases[0].path, "uplink:up0", "{leases:?}\n{}", agent.log());
    let addr = leases[0]
        .address6
        .as_ref()
        .map_or_else(|| panic!("no address: {leases:?}"), |c| c.addr.to_string());
    pod.ip(&["link", "del", "eth0"]);
    if restart {
        agent = agent.restart(&lab.server, &flags);
        agent.wait_uplink_live(Duration::from_secs(10), "the uplink was not attached again");
        assert!(
            agent
                .log()
                .contains("the lease is kept until DEL releases it through the uplink"),
            "{}",
            agent.log()
        );
    }
    let d = call("DEL", "v6gone", pod, &conf);
    assert!(d.ok, "DEL failed: {}\nagent:\n{}", d.text(), agent.log());
    assert!(
        wait_until(Duration::from_secs(5), || !server.leases().contains(&addr)),
        "the RELEASE of {addr} was not honoured\n{}\nagent:\n{}",
        server.log(),
        agent.log()
    );
    assert!(
        agent.log().contains("released through the uplink"),
        "{}",
        agent.log()
    );
}

/// Without an uplink that carried the lease, a RELEASE the pod's gone
/// interface cannot send is lost: the DEL still answers and says so; the
/// server keeps the address until its lifetime ends.
#[test]
fn an_ipv6_lease_whose_interface_is_gone_without_an_uplink_says_its_release_is_lost() {
    let lab = Lab::builder().server_behind_uplink().build();
    let server = Dnsmasq6::start(lab.dhcp_ns());
    let agent = AgentProcess::start(&[]);
    let pod = &lab.clients[0].ns;
    let conf = conf(&agent.socket);

    let addr = leased(&call("ADD", "v6lost", pod, &conf), &agent);
    pod.ip(&["link", "del", "eth0"]);
    let d = call("DEL", "v6lost", pod, &conf);
    assert!(d.ok, "DEL failed: {}\nagent:\n{}", d.text(), agent.log());
    assert!(
        agent.log().contains("no node uplink carried this lease"),
        "{}",
        agent.log()
    );
    assert!(
        server.leases().contains(&addr),
        "the server lost {addr} without a RELEASE:\n{}",
        server.leases()
    );
}

/// Another node on the link holds the address the server gives the pod:
/// the kernel's duplicate address detection on the pod's interface finds
/// it, and the agent takes the address off, DECLINEs it (the server hears
/// the DECLINE) and solicits again; the ADD answers with another address,
/// and the duplicate is nowhere on the pod.
#[test]
fn an_address_another_node_holds_is_declined_and_the_add_gets_another() {
    let lab = Lab::builder().server_behind_uplink().clients(2).build();
    let server = Dnsmasq6::start(lab.dhcp_ns());
    let agent = AgentProcess::start(&[]);
    let pod = &lab.clients[0].ns;
    let squatter = &lab.clients[1].ns;
    let conf = conf(&agent.socket);

    // The address the server gives this pod (its DUID and IAID choose it),
    // given back.
    let first = leased(&call("ADD", "v6dad", pod, &conf), &agent);
    let d = call("DEL", "v6dad", pod, &conf);
    assert!(d.ok, "DEL failed: {}", d.text());
    assert!(
        wait_until(Duration::from_secs(5), || !server.leases().contains(&first)),
        "dnsmasq still holds {first}:\n{}",
        server.leases()
    );
    // Another node on the link takes it.
    squatter.ip(&["link", "set", "eth0", "up"]);
    squatter.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{first}/64"),
        "dev",
        "eth0",
        "nodad",
    ]);

    let r = call("ADD", "v6dad", pod, &conf);
    let second = leased(&r, &agent);
    assert!(
        server.log().contains("DHCPDECLINE"),
        "the server heard no DECLINE of {first}:\n{}\nagent:\n{}",
        server.log(),
        agent.log()
    );
    assert_ne!(second, first, "the declined address was taken again");
    assert!(
        agent.log().contains("duplicate address detection failed"),
        "{}",
        agent.log()
    );
    assert!(pod_has(pod, &second), "{second} not on eth0");
    assert!(
        !pod.ip(&["-6", "addr", "show", "dev", "eth0"])
            .contains(&first),
        "the duplicate {first} is still on eth0:\n{}",
        pod.ip(&["-6", "addr"])
    );
    let d = call("DEL", "v6dad", pod, &conf);
    assert!(d.ok, "DEL failed: {}", d.text());
}

/// A restarted agent resumes the stored IPv6 lease with a REBIND (no new
/// SOLICIT), keeps the same address, and still releases it at DEL.
#[test]
fn a_restarted_agent_resumes_the_ipv6_lease_with_rebind() {
    let lab = Lab::builder().server_behind_uplink().build();
    let server = Dnsmasq6::start(lab.dhcp_ns());
    let mut agent = AgentProcess::start(&[]);
    let pod = &lab.clients[0].ns;
    let conf = conf(&agent.socket);

    let addr = leased(&call("ADD", "v6again", pod, &conf), &agent);
    let solicits = server.log().matches("DHCPSOLICIT").count();
    agent.kill_and_restart();
    assert!(
        wait_until(Duration::from_secs(10), || server
            .log()
            .contains("DHCPREBIND")),
        "no REBIND after the restart:\n{}\nagent:\n{}",
        server.log(),
        agent.log()
    );
    assert_eq!(
        server.log().matches("DHCPSOLICIT").count(),
        solicits,
        "the resumed lease solicited again"
    );
    assert!(
        wait_until(Duration::from_secs(5), || {
            let t = agent.cli("leases", false);
            t.lines()
                .any(|l| l.contains("v6again") && l.contains(&addr) && l.contains("Bound"))
        }),
        "{}",
        agent.cli("leases", false)
    );
    assert!(pod_has(pod, &addr));
    // A repeated ADD returns the lease held.
    let again = call("ADD", "v6again", pod, &conf);
    assert_eq!(leased(&again, &agent), addr);

    let d = call("DEL", "v6again", pod, &conf);
    assert!(d.ok, "DEL failed: {}", d.text());
    assert!(
        wait_until(Duration::from_secs(5), || !server.leases().contains(&addr)),
        "the resumed lease was not released:\n{}",
        server.log()
    );
}

/// The pod of the stand-in API server (**not a cluster**) the tests below
/// report to, with the cluster network's entry already in its annotation.
const POD_NETWORKS: &str = "k8s.ovn.org/pod-networks";
const DEFAULT_ENTRY: &str = r#"{"default":{"ip_addresses":["10.128.0.9/23"],"mac_address":"0a:58:0a:80:00:09","gateway_ips":["10.128.0.1"],"role":"primary"}}"#;

/// An IPv6 localnet attachment's ADD as ovnkube-node passes it on, naming
/// the network attachment definition (the annotation's key).
fn request6(pod: &str, uid: &str, netns: &Path) -> xdhcp::rpc::CniRequest {
    let conf = r#"{"cniVersion":"1.1.0","name":"v6net","type":"ovn-k8s-cni-overlay",
        "topology":"localnet","role":"secondary","netAttachDefName":"tenant/v6net",
        "ipam":{"type":"xdhcp","family":"ipv6","apply":true,"timeout":"20s",
                "ipv6":{"prefixLength":64,"gateway":"fd00:6::1"}}}"#;
    xdhcp::rpc::CniRequest {
        container_id: format!("ctr-{pod}"),
        ifname: "eth0".to_owned(),
        netns: Some(netns.to_path_buf()),
        args: [
            ("K8S_POD_NAMESPACE".to_owned(), "tenant".to_owned()),
            ("K8S_POD_NAME".to_owned(), pod.to_owned()),
            ("K8S_POD_UID".to_owned(), uid.to_owned()),
        ]
        .into(),
        config: xdhcp::cni::config::parse(conf.as_bytes()).unwrap(),
    }
}

fn entry(api: &StandInApi, pod: &str) -> serde_json::Value {
    api.server
        .annotation("tenant", pod, POD_NETWORKS)
        .map_or_else(
            || serde_json::json!({}),
            |a| serde_json::from_str(&a).unwrap(),
        )
}

/// The agent, reporting to `api`, serving its metrics at the address
/// returned.
fn kube_agent(api: &StandInApi) -> (InProcessAgent, std::net::SocketAddr) {
    let metrics = free_local_addr();
    let agent = InProcessAgent::start_with(|a| {
        a.kube = KubeMode::On;
        a.kubeconfig = Some(api.kubeconfig.clone());
        a.datapath = DatapathChoice::Afpacket;
        a.metrics_addr = Some(metrics);
    });
    (agent, metrics)
}

/// The `xdhcp_leases` gauge of IPv6 leases in `state` (any state: "").
fn v6_leases(metrics: std::net::SocketAddr, state: &str) -> u64 {
    let text = http_get(metrics, "/metrics").unwrap_or_default();
    let label = if state.is_empty() {
        r#"family="ipv6""#.to_owned()
    } else {
        format!(r#"family="ipv6",state="{state}""#)
    };
    metric_count(&text, "xdhcp_leases", &label)
}

/// Where an IPv6 pod's ADD spent its time is in the metrics, as an IPv4
/// one's is: each phase observed once in `xdhcp_add_phase_seconds`, the
/// server's share (ADVERTISE, REPLY) above zero, `protect` zero (an IPv6
/// lease adds no route through the interface).
#[test]
fn an_ipv6_adds_phases_are_observed_in_the_metrics_fake_apiserver() {
    let api = StandInApi::start();
    let uid = api
        .server
        .add_pod("tenant", "v6timed", &[], &[(POD_NETWORKS, DEFAULT_ENTRY)]);
    let lab = Lab::builder().server_behind_uplink().build();
    let _server = Dnsmasq6::start(lab.dhcp_ns());
    let (agent, metrics) = kube_agent(&api);
    let req = request6("v6timed", &uid, lab.clients[0].ns.path());
    let _ = agent.add(&req).expect("ADD");
    let text = http_get(metrics, "/metrics").expect("the metrics server answers");
    xdhcp_tests::bench::assert_add_phases_observed(&text, 1);
    let sum = |phase: &str| xdhcp_tests::bench::add_phase_sum(&text, phase);
    assert!(sum("offer") > 0.0 && sum("ack") > 0.0, "{text}");
    assert!(sum("report") > 0.0, "the entry's write: {text}");
    assert!(sum("protect").abs() < f64::EPSILON, "{text}");
}

/// An IPv6 pod's address is reported in its `pod-networks` entry (the
/// address in the network's prefix, its gateway, `ipam_mode: dhcp`, the
/// pod's MAC) beside the cluster network's entry, which is kept; reported
/// again by a repeated ADD after the entry was lost; removed at DEL. The
/// lease counts in `xdhcp_leases` under `family="ipv6"` while it lives.
#[test]
fn an_ipv6_pods_address_is_in_its_pod_networks_entry_fake_apiserver() {
    let api = StandInApi::start();
    let uid = api
        .server
        .add_pod("tenant", "v6web", &[], &[(POD_NETWORKS, DEFAULT_ENTRY)]);
    let lab = Lab::builder().server_behind_uplink().build();
    let server = Dnsmasq6::start(lab.dhcp_ns());
    let (agent, metrics) = kube_agent(&api);
    let c = &lab.clients[0];
    let req = request6("v6web", &uid, c.ns.path());

    let r = agent.add(&req).expect("ADD");
    let addr = r.ips6[0].address.to_string();
    assert!(
        addr.starts_with("fd00:6::1") && addr.ends_with("/64"),
        "{addr}"
    );
    let e = &entry(&api, "v6web")["tenant/v6net"];
    assert_eq!(e["ip_addresses"], serde_json::json!([addr]), "{e}");
    assert_eq!(e["gateway_ips"], serde_json::json!(["fd00:6::1"]), "{e}");
    assert_eq!(e["ipam_mode"], "dhcp", "{e}");
    assert_eq!(e["role"], "secondary", "{e}");
    assert_eq!(e["mac_address"], format_mac(c.mac), "{e}");
    assert!(entry(&api, "v6web").get("default").is_some());
    assert_eq!(
        v6_leases(metrics, "bound"),
        1,
        "the lease in the gauge, by family"
    );

    // The entry lost (as after a kill between the lease and the patch): a
    // repeated ADD reports the held address again.
    let mut pod = api.server.pod("tenant", "v6web").expect("the pod");
    pod["metadata"]["annotations"][POD_NETWORKS] = serde_json::json!(DEFAULT_ENTRY);
    api.server.put_pod(pod);
    let again = agent.add(&req).expect("the repeated ADD");
    assert_eq!(again.ips6[0].address.to_string(), addr);
    assert_eq!(
        entry(&api, "v6web")["tenant/v6net"]["ip_addresses"][0],
        addr.as_str()
    );

    let _: serde_json::Value = agent.post(xdhcp::rpc::PATH_DEL, &req).expect("DEL");
    assert!(
        wait_until(Duration::from_secs(2), || v6_leases(metrics, "") == 0),
        "the deleted lease stays in the gauge: {}",
        http_get(metrics, "/metrics").unwrap_or_default()
    );
    assert!(
        entry(&api, "v6web").get("tenant/v6net").is_none(),
        "{}",
        entry(&api, "v6web")
    );
    assert!(entry(&api, "v6web").get("default").is_some());
    let plain = addr.split('/').next().unwrap().to_owned();
    assert!(
        wait_until(Duration::from_secs(5), || !server.leases().contains(&plain)),
        "{}",
        server.leases()
    );
}

/// A failed write of the entry (500) fails the IPv6 ADD with the API's
/// code, naming the pod, and gives the lease back: released at the server,
/// off the interface, no record kept. Once with the address configured by
/// the agent, once not (there the entry is written while the lease's
/// record is, and the record the failed ADD was writing goes too).
#[test]
fn an_ipv6_add_whose_entry_cannot_be_written_releases_its_lease_fake_apiserver() {
    for apply in [true, false] {
        entry_cannot_be_written(apply);
    }
}

fn entry_cannot_be_written(apply: bool) {
    let api = StandInApi::start();
    let uid = api.server.add_pod("tenant", "v6fail", &[], &[]);
    let lab = Lab::builder().server_behind_uplink().build();
    let server = Dnsmasq6::start(lab.dhcp_ns());
    let (agent, _) = kube_agent(&api);
    let c = &lab.clients[0];
    api.server.inject(Op::PatchPod, Fault::Status(500));

    let mut req = request6("v6fail", &uid, c.ns.path());
    req.config.ipam.apply = apply;
    let err = agent.add(&req).expect_err("the ADD must fail").into_cni();
    assert_eq!(err.code, code::KUBE_API, "{err:?}");
    assert!(
        err.msg.contains("tenant/v6fail") && err.msg.contains("500"),
        "{err:?}"
    );
    assert!(
        wait_until(Duration::from_secs(5), || server
            .log()
            .contains("DHCPRELEASE")),
        "no RELEASE:\n{}",
        server.log()
    );
    assert!(
        wait_until(Duration::from_secs(5), || server.leases().trim().is_empty()),
        "the server still holds the lease:\n{}",
        server.leases()
    );
    assert!(agent.leases().is_empty(), "{:?}", agent.leases());
    assert!(
        !c.ns
            .ip(&["-6", "addr", "show", "dev", &c.ifname])
            .contains("fd00:6::"),
        "the unreported address stayed on the interface"
    );
    assert_eq!(
        xdhcp_tests::agent::lease_record_files(&agent.state_dir()),
        Vec::<std::path::PathBuf>::new(),
        "apply={apply}: the failed ADD's record stayed"
    );
}

/// A network that names no prefix length takes the address's prefix and
/// the default router from the link's router advertisements (dnsmasq's
/// `--enable-ra`: its range's /64, itself as the router, from its
/// link-local address): the result is the address in that /64 with a
/// default route through the router, the pod's interface carries the /64,
/// and `xdhcp leases` shows it. Without advertisements (the first test's
/// server, a network naming no prefix) the same ADD is a /128 with no route.
#[test]
fn a_network_naming_no_prefix_takes_it_and_the_router_from_router_advertisements() {
    let lab = Lab::builder().server_behind_uplink().build();
    let server = Dnsmasq6::start_with(lab.dhcp_ns(), &["--enable-ra"]);
    let router = link_local(lab.dhcp_ns(), Lab::SERVER_IF);
    let agent = AgentProcess::start(&[]);
    let pod = &lab.clients[0].ns;
    let conf = format!(
        r#"{{"cniVersion":"1.1.0","name":"v6ra",
            "ipam":{{"type":"xdhcp","socketPath":"{}","family":"ipv6","apply":true,"timeout":"20s"}}}}"#,
        agent.socket.display()
    );

    let r = call("ADD", "v6ra", pod, &conf);
    assert!(r.ok, "ADD failed: {}\nagent:\n{}", r.text(), agent.log());
    let cidr = r.json["ips"][0]["address"].as_str().unwrap().to_owned();
    assert!(
        cidr.starts_with("fd00:6::1") && cidr.ends_with("/64"),
        "not the advertised /64: {}\nagent:\n{}\ndnsmasq:\n{}",
        r.stdout,
        agent.log(),
        server.log()
    );
    assert_eq!(r.json["ips"][0]["gateway"], router.as_str(), "{}", r.stdout);
    assert_eq!(
        r.json["routes"][0]["dst"], "::/0",
        "a default route through the router: {}",
        r.stdout
    );
    assert_eq!(r.json["routes"][0]["gw"], router.as_str(), "{}", r.stdout);
    let addr = cidr.split('/').next().unwrap();
    assert!(pod_has(pod, addr), "{}", pod.ip(&["-6", "addr"]));
    let table = agent.cli("leases", false);
    assert!(table.contains(&cidr), "{table}");

    let d = call("DEL", "v6ra", pod, &conf);
    assert!(d.ok, "DEL failed: {}", d.text());
    assert!(!pod_has(pod, addr), "{addr} still on eth0");
}

/// The link-local address of `ifname` in `ns`.
fn link_local(ns: &NetNs, ifname: &str) -> String {
    let shown = ns.ip(&["-6", "-o", "addr", "show", "dev", ifname, "scope", "link"]);
    shown
        .split_whitespace()
        .skip_while(|w| *w != "inet6")
        .nth(1)
        .and_then(|a| a.split('/').next())
        .unwrap_or_else(|| panic!("no link-local address on {ifname}: {shown}"))
        .to_owned()
}

/// Against ISC Kea's `kea-dhcp6`: ADD leases an address Kea records under
/// the pod's DUID-LL (type 3, hardware type 1, the pod interface's MAC)
/// and the IAID the agent documents; DEL's RELEASE is honoured (the lease
/// gone from Kea's memfile).
#[test]
fn kea_dhcp6_leases_under_the_pods_duid_and_honours_the_release() {
    let lab = Lab::builder().server_behind_uplink().build();
    let kea = Kea6::start(lab.dhcp_ns());
    let agent = AgentProcess::start(&[]);
    let client = &lab.clients[0];
    let conf = conf(&agent.socket);

    let r = call("ADD", "v6kea", &client.ns, &conf);
    let addr = leased(&r, &agent);
    let held = kea.leases();
    let lease = held
        .iter()
        .find(|l| l.address.to_string() == addr)
        .unwrap_or_else(|| panic!("Kea holds no lease for {addr}: {held:?}\n{}", kea.log()));
    assert_eq!(
        lease.duid,
        format!("00:03:00:01:{}", format_mac(client.mac)),
        "not the pod's DUID-LL"
    );
    assert_eq!(
        lease.iaid,
        xdhcp_engine::v6::iaid_from_mac(client.mac),
        "not the documented IAID"
    );

    let d = call("DEL", "v6kea", &client.ns, &conf);
    assert!(d.ok, "DEL failed: {}", d.text());
    assert!(
        wait_until(Duration::from_secs(5), || kea
            .leases()
            .iter()
            .all(|l| l.address.to_string() != addr)),
        "Kea still holds {addr} after the RELEASE: {:?}\n{}",
        kea.leases(),
        kea.log()
    );
}

/// An IPv6 pod's ADD (the address not configured by the agent, the
/// default) writes its `pod-networks` entry while the lease's record is
/// being written, not after it, and answers only once the record is in
/// place. The record's write held back 1.5 s (a test hook): the entry
/// names the address while the ADD is still out and no record names the
/// lease yet; the answer comes with the record in place.
#[test]
fn an_ipv6_adds_entry_is_written_beside_its_record_and_the_answer_waits_for_the_record() {
    let lab = Lab::builder().server_behind_uplink().build();
    let _server = Dnsmasq6::start(lab.dhcp_ns());
    let agent = AgentProcess::start_with_env(&[], &[("XDHCP_TEST_V6_RECORD_DELAY_MS", "1500")]);
    let c = &lab.clients[0];
    let conf = r#"{"cniVersion":"1.1.0","name":"v6net","type":"ovn-k8s-cni-overlay",
        "topology":"localnet","role":"secondary","netAttachDefName":"tenant/v6net",
        "ipam":{"type":"xdhcp","family":"ipv6","timeout":"20s",
                "ipv6":{"prefixLength":64,"gateway":"fd00:6::1"}}}"#;
    let mut req = request6("v6beside", "uid-beside", c.ns.path());
    req.config = xdhcp::cni::config::parse(conf.as_bytes()).unwrap();
    assert!(!req.config.ipam.apply);
    let socket = agent.socket.clone();
    let add = std::thread::spawn(move || {
        let client = xdhcp::rpc::Client::new(&socket, Duration::from_mins(1));
        client.post(xdhcp::rpc::PATH_ADD, &req)
    });
    let store = agent.state_dir.join("pod-networks.json");
    let reported = || -> Option<String> {
        let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&store).ok()?).ok()?;
        let entries = doc["pods"]["tenant/v6beside"]["annotations"][POD_NETWORKS].as_str()?;
        let e: serde_json::Value = serde_json::from_str(entries).ok()?;
        e["tenant/v6net"]["ip_addresses"][0]
            .as_str()
            .map(str::to_owned)
    };
    let lease_recorded = || {
        xdhcp_tests::agent::lease_record_files(&agent.state_dir)
            .iter()
            .filter_map(|f| {
                serde_json::from_slice::<serde_json::Value>(&std::fs::read(f).ok()?).ok()
            })
            .any(|r| !r["lease6"].is_null())
    };
    assert!(
        wait_until(Duration::from_secs(10), || reported().is_some()
            || add.is_finished()),
        "neither the entry nor the answer came:\n{}",
        agent.log()
    );
    let early = reported();
    assert!(
        !add.is_finished() && !lease_recorded(),
        "the entry ({early:?}) came only once the record was in place or the ADD had answered:\n{}",
        agent.log()
    );
    let v = add.join().unwrap().expect("ADD");
    let r: xdhcp::rpc::CniResult = serde_json::from_value(v).expect("a CNI result");
    assert!(
        lease_recorded(),
        "the ADD answered before its record was in place"
    );
    assert_eq!(early, Some(r.ips6[0].address.to_string()));
}

/// A KubeVirt VM's one-shot DHCPv6 discovery (its launcher pod and VMI in
/// the embedded pod store; the VM's MAC from the VMI's spec) is run once:
/// dnsmasq binds the address to the VM's DUID-LL; a killed and restarted
/// agent keeps the record as it is (`OneShot` in `xdhcp leases`) and sends
/// nothing for it (no SOLICIT, REQUEST, RENEW or REBIND); a repeated ADD
/// reports the same address without an exchange; DEL sends no RELEASE and
/// dnsmasq keeps the binding.
#[test]
fn a_vms_ipv6_discovery_is_not_run_again_after_a_restart() {
    const VM_MAC: &str = "02:00:00:00:20:64";
    const POD: &str = "virt-launcher-vm8";
    let lab = Lab::builder().server_behind_uplink().build();
    let server = Dnsmasq6::start(lab.dhcp_ns());
    let mut agent = AgentProcess::start(&[]);
    let vmi =
        xdhcp_tests::fake_apiserver::vmi(("tenant", "vm8"), false, ("v6", "tenant/v6net", VM_MAC));
    let store = serde_json::json!({
        "pods": {format!("tenant/{POD}"): {"labels": {
            "kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": "vm8"}}},
        "vmis": {"tenant/vm8": vmi}
    });
    std::fs::write(agent.state_dir.join("pod-networks.json"), store.to_string()).unwrap();
    let c = &lab.clients[0];
    let req = request6(POD, "uid-vm8", c.ns.path());
    let client = xdhcp::rpc::Client::new(&agent.socket, Duration::from_mins(1));
    let add = || -> xdhcp::rpc::CniResult {
        let v = client.post(xdhcp::rpc::PATH_ADD, &req).expect("VM ADD");
        serde_json::from_value(v).expect("a CNI result")
    };
    let addr = add().ips6[0].address.addr.to_string();
    // dnsmasq writes its lease file after its REPLY has gone, a moment
    // after the ADD can have answered.
    let bound = || {
        server.leases().lines().any(|l| {
            l.contains(&format!(" {addr} ")) && l.ends_with(&format!("00:03:00:01:{VM_MAC}"))
        })
    };
    assert!(
        wait_until(Duration::from_secs(5), bound),
        "dnsmasq holds no lease for {addr} under the VM's DUID-LL:\n{}",
        server.leases()
    );
    let exchanges = || {
        let log = server.log();
        ["DHCPSOLICIT", "DHCPREQUEST", "DHCPRENEW", "DHCPREBIND"]
            .iter()
            .map(|m| log.matches(m).count())
            .sum::<usize>()
    };
    let before = exchanges();

    agent.kill_and_restart();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        exchanges(),
        before,
        "the restarted agent ran the VM's discovery again:\n{}",
        server.log()
    );
    let table = agent.cli("leases", false);
    assert!(
        table
            .lines()
            .any(|l| l.contains(POD) && l.contains(&addr) && l.contains("OneShot")),
        "{table}"
    );
    assert_eq!(add().ips6[0].address.addr.to_string(), addr);
    assert_eq!(exchanges(), before, "the repeated ADD ran an exchange");

    let _: serde_json::Value = client.post(xdhcp::rpc::PATH_DEL, &req).expect("DEL");
    std::thread::sleep(Duration::from_secs(2));
    assert!(!server.log().contains("DHCPRELEASE"), "{}", server.log());
    assert!(server.leases().contains(&format!(" {addr} ")));
    assert!(!agent.cli("leases", false).contains(POD));
}
