//! A server that sends a malformed optional option does not cost the pod
//! its lease: dnsmasq sends an option 121 that cannot be decoded (an
//! impossible prefix length, or a truncated descriptor) in every OFFER and
//! ACK; the agent (`xdhcp agent` process, one per receive path) binds,
//! answers ADD with option 3's router as the default route, logs the dropped
//! option, and renews with the same lease.

mod agent_support;

use std::time::{Duration, Instant};

use agent_support::{AgentProcess, CniPath, PluginOutput};
use serde_json::Value;
use xdhcp_tests::{Dnsmasq, DnsmasqConfig, Lab, LabClient, format_mac, wait_until};

/// Option 121 payloads no decoder can take whole.
const IMPOSSIBLE_PREFIX: &str = "21:0a:00:00:00:00:c0:00:02:01"; // /33
const TRUNCATED: &str = "18:c6:33:64:c0:00:02"; // 198.51.100.0/24 via a 3-octet router

fn status(agent: &AgentProcess) -> Value {
    serde_json::from_str(&agent.cli("status", true)).expect("status JSON")
}

/// The log without terminal colour codes.
fn plain_log(agent: &AgentProcess) -> String {
    let log = agent.log();
    let mut out = String::with_capacity(log.len());
    let mut rest = log.as_str();
    while let Some(at) = rest.find('\x1b') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        rest = rest.find('m').map_or("", |m| &rest[m + 1..]);
    }
    out.push_str(rest);
    out
}

/// Engine log lines for a dropped option 121.
fn malformed_logged(agent: &AgentProcess) -> usize {
    plain_log(agent)
        .lines()
        .filter(|l| l.contains("malformed option dropped") && l.contains("option=121"))
        .count()
}

/// The xdhcp plugin, as a runtime runs it, for the test's one pod.
fn plugin(cni: &CniPath, c: &LabClient, command: &str, conf: &str) -> PluginOutput {
    cni.xdhcp(command, "pod-bad121", c, conf)
}

fn binds_and_renews_despite_a_broken_121(datapath: &str, option121: &str) {
    let cni = CniPath::new();
    let agent = AgentProcess::start(&["--datapath", datapath]);
    let lab = Lab::with_clients(1);
    let dnsmasq = Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            extra_args: vec![format!("--dhcp-option-force=121,{option121}")],
            ..DnsmasqConfig::renewing_every(3)
        },
    );
    let c = &lab.clients[0];
    let mac = format_mac(c.mac);
    let conf = format!(
        r#"{{"cniVersion":"1.0.0","name":"xnet","ipam":{{"type":"xdhcp","socketPath":"{}","timeout":"15s"}}}}"#,
        agent.socket.display()
    );

    // First DORA: the OFFER and the ACK carry the broken option; ADD
    // succeeds at once (it used to fail after the whole timeout).
    let t0 = Instant::now();
    let r = plugin(&cni, c, "ADD", &conf);
    assert!(r.ok, "ADD failed: {}\n{}", r.text(), agent.log());
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert!(
        dnsmasq.log().contains("option:121"),
        "dnsmasq did not send option 121:\n{}",
        dnsmasq.log()
    );
    let ip = r.json["ips"][0]["address"].as_str().expect("an address");
    assert!(ip.starts_with("192.0.2.") && ip.ends_with("/24"), "{ip}");
    // Option 121 was dropped whole: the routes are option 3's default route.
    assert_eq!(r.json["ips"][0]["gateway"], "192.0.2.1", "{}", r.stdout);
    let routes = r.json["routes"].as_array().cloned().unwrap_or_default();
    assert_eq!(routes.len(), 1, "{}", r.stdout);
    assert_eq!(routes[0]["dst"], "0.0.0.0/0", "{}", r.stdout);
    assert_eq!(routes[0]["gw"], "192.0.2.1", "{}", r.stdout);
    let at_bind = malformed_logged(&agent);
    assert!(at_bind >= 2, "OFFER and ACK not logged:\n{}", agent.log());

    // The receive path is the one asked for. With eBPF the first exchange
    // may run on AF_PACKET while the program attaches in the background;
    // the renewal below then comes through the ring buffer.
    let want = if datapath == "ebpf" {
        ("ebpf", "tc")
    } else {
        ("af-packet", "af-packet")
    };
    assert!(
        wait_until(Duration::from_secs(10), || {
            let s = status(&agent);
            s["datapath"] == want.0 && s["interfaces"][0]["attach"] == want.1
        }),
        "{}",
        status(&agent)
    );
    let captured = || status(&agent)["counters"]["kernel.captured"].as_u64();
    let captured_at_bind = captured();

    // Renewal at T1 = 3 s: the ACK carries the broken option again; the
    // agent takes it and keeps the lease.
    let acks = || {
        dnsmasq
            .log()
            .lines()
            .filter(|l| l.contains("DHCPACK") && l.contains(&mac))
            .count()
    };
    assert!(
        wait_until(Duration::from_secs(15), || acks() >= 2
            && malformed_logged(&agent) > at_bind),
        "no renewal taken:\n{}\n{}",
        dnsmasq.log(),
        agent.log()
    );
    let leases: Value = serde_json::from_str(&agent.cli("leases", true)).expect("leases JSON");
    assert_eq!(leases[0]["address"], ip, "{leases}");
    assert!(
        wait_until(Duration::from_secs(3), || {
            let l: Value = serde_json::from_str(&agent.cli("leases", true)).unwrap();
            l[0]["state"] == "Bound"
        }),
        "{}",
        agent.cli("leases", true)
    );
    assert_eq!(
        dnsmasq.lease_for(c.mac).map(|l| l.ip.to_string()),
        ip.split('/').next().map(str::to_owned)
    );
    if datapath == "ebpf" {
        assert!(
            captured() > captured_at_bind,
            "the renewal did not come through the ring buffer: {}",
            status(&agent)
        );
    }

    let del = plugin(&cni, c, "DEL", &conf);
    assert!(del.ok, "DEL: {}", del.text());
}

#[test]
fn impossible_121_prefix_af_packet() {
    binds_and_renews_despite_a_broken_121("afpacket", IMPOSSIBLE_PREFIX);
}

#[test]
fn impossible_121_prefix_ebpf() {
    binds_and_renews_despite_a_broken_121("ebpf", IMPOSSIBLE_PREFIX);
}

#[test]
fn truncated_121_af_packet() {
    binds_and_renews_despite_a_broken_121("afpacket", TRUNCATED);
}

#[test]
fn truncated_121_ebpf() {
    binds_and_renews_despite_a_broken_121("ebpf", TRUNCATED);
}
