//! A server reply gets the same outcome whichever receive path brought it:
//! the eBPF ring buffer hands the DHCP payload on undecoded, as the AF_PACKET
//! receiver does, and only the engine's validation judges it.
//!
//! The reply: dnsmasq's OFFER and ACK carrying option 80 (Rapid Commit) with
//! a value byte, where RFC 4039 gives the option none. The engine ignores
//! option 80 and accepts the reply. dhcproto 0.15's decoder, which the ring
//! reader used to run on every record, asserts that length: in a debug build
//! the reader task panicked on the first such ACK and every lease already
//! moved to eBPF heard nothing more. The first exchange of a lease runs on
//! AF_PACKET while the program attaches, so the ring buffer is exercised by
//! the renewals.

mod agent_support;

use std::time::Duration;

use agent_support::{AgentProcess, CniPath};
use xdhcp::rpc::{AgentStatus, LeaseView};
use xdhcp_tests::{Dnsmasq, DnsmasqConfig, Lab, wait_until};

/// Option 80 with one value byte, forced into every reply.
const RAPID_COMMIT_WITH_A_VALUE: &str = "--dhcp-option-force=80,01";

/// Binds a pod lease through `datapath` (`ebpf` or `afpacket`) against a
/// dnsmasq whose replies carry [`RAPID_COMMIT_WITH_A_VALUE`], and checks that
/// the lease settles on `attach` and that two renewals there are accepted.
fn renewals_accepted(datapath: &str, attach: &str) {
    let cni = CniPath::new();
    let agent = AgentProcess::start(&["--datapath", datapath]);
    let lab = Lab::with_clients(1);
    let dnsmasq = Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            extra_args: vec![RAPID_COMMIT_WITH_A_VALUE.to_owned()],
            ..DnsmasqConfig::renewing_every(3)
        },
    );
    let conf = format!(
        r#"{{"cniVersion":"1.0.0","name":"xnet","ipam":{{"type":"xdhcp","socketPath":"{}"}}}}"#,
        agent.socket.display()
    );
    let c = &lab.clients[0];
    let add = cni.xdhcp("ADD", "pod-odd", c, &conf);
    assert!(add.ok, "ADD: {}\n{}", add.stdout, agent.log());

    let status = || -> AgentStatus {
        serde_json::from_str(&agent.cli("status", true)).expect("status JSON")
    };
    let expiry = || -> u64 {
        let leases: Vec<LeaseView> =
            serde_json::from_str(&agent.cli("leases", true)).expect("leases JSON");
        assert_eq!(leases.len(), 1, "{leases:?}");
        leases[0]
            .expires_unix_ms
            .expect("a bound lease has an expiry")
    };
    let counter = |s: &AgentStatus, name: &str| s.counters.get(name).copied().unwrap_or(0);

    assert!(
        wait_until(Duration::from_secs(15), || status()
            .interfaces
            .first()
            .is_some_and(|i| i.attach == attach)),
        "the lease never moved to {attach}: {:?}\n{}",
        status(),
        agent.log()
    );
    let at_switch = status();
    // Two renewals (T1 = 3 s) accepted on that path: each moves the expiry on.
    let mut last = expiry();
    for n in 1..=2 {
        assert!(
            wait_until(Duration::from_secs(10), || expiry() > last),
            "renewal {n} over {attach} not accepted\nagent:\n{}\ndnsmasq:\n{}",
            agent.log(),
            dnsmasq.log()
        );
        last = expiry();
    }
    let s = status();
    assert!(s.ready, "{s:?}");
    assert_eq!(s.datapath, datapath.replace("afpacket", "af-packet"));
    assert_eq!(s.interfaces[0].attach, attach, "{s:?}");
    if datapath == "ebpf" {
        // The ACKs came through the ring: captured as owned and dropped in
        // the kernel (the lease closed its AF_PACKET socket on the switch).
        assert!(
            counter(&s, "kernel.dropped_owned") >= counter(&at_switch, "kernel.dropped_owned") + 2,
            "{:?} then {:?}",
            at_switch.counters,
            s.counters
        );
    }
}

#[test]
fn reply_with_odd_option_renews_over_the_ring_buffer() {
    renewals_accepted("ebpf", "tc");
}

#[test]
fn reply_with_odd_option_renews_over_af_packet() {
    renewals_accepted("afpacket", "af-packet");
}
