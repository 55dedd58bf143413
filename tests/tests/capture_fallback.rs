//! A lost kernel capture path must not leave leases deaf. The agent runs
//! in-process against a real dnsmasq (T1 = 3 s); a pod lease is on the eBPF
//! ring buffer; then the path is lost under it — the ring reader fails
//! (injected through the test-only socket route), or the program's BPF link
//! is detached from outside with `bpftool link detach`, as an operator
//! might. In both cases: within a second the lease moves to its own
//! `AF_PACKET` receiver, the loss is counted and `/readyz` reports it, a
//! renewal completes on the fallback, and once the path is restored the
//! lease returns to the ring buffer and renews there.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::Duration;

use xdhcp::cli::DatapathChoice;
use xdhcp::rpc::{self, CniRequest};
use xdhcp_tests::{Dnsmasq, DnsmasqConfig, InProcessAgent, Lab, format_mac, wait_until};

/// A free loopback port for the agent's metrics server.
fn metrics_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    l.local_addr().expect("local address")
}

/// `GET path` on the metrics server: (status code, body).
fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the metrics server");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    (code, body)
}

/// The value of the first exposition line starting with `series`.
fn metric(addr: SocketAddr, series: &str) -> u64 {
    let (_, body) = http_get(addr, "/metrics");
    body.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

struct Setup {
    lab: Lab,
    dnsmasq: Dnsmasq,
    agent: InProcessAgent,
    metrics: SocketAddr,
    req: CniRequest,
}

impl Setup {
    /// One pod lease, held and moved to the ring buffer (TC on the veth).
    fn new() -> Self {
        let lab = Lab::with_clients(1);
        let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::renewing_every(3));
        let metrics = metrics_addr();
        let agent = InProcessAgent::start_with(|a| {
            a.datapath = DatapathChoice::Ebpf;
            a.metrics_addr = Some(metrics);
        });
        let req = agent.add_applied(&lab.clients[0], "pod-fb");
        let me = Self {
            lab,
            dnsmasq,
            agent,
            metrics,
            req,
        };
        assert!(
            wait_until(Duration::from_secs(10), || me.path() == "tc"),
            "the lease did not move to the ring buffer: {:?}",
            me.agent.status()
        );
        me
    }

    fn path(&self) -> String {
        self.agent
            .status()
            .interfaces
            .first()
            .map(|i| i.attach.clone())
            .unwrap_or_default()
    }

    /// DHCPACKs dnsmasq sent to the pod so far.
    fn acks(&self) -> usize {
        let mac = format_mac(self.lab.clients[0].mac);
        self.dnsmasq
            .log()
            .lines()
            .filter(|l| l.contains("DHCPACK") && l.contains(&mac))
            .count()
    }

    /// The lease's expiry as the agent knows it (moves on every renewal).
    fn expiry(&self) -> u64 {
        self.agent.leases()[0].expires_unix_ms.unwrap_or(0)
    }

    /// Wait for the agent itself to complete a renewal (the server's ACK
    /// alone proves nothing: with a deaf lease dnsmasq ACKs every
    /// retransmitted REQUEST), and for the lease to be BOUND again.
    fn renews(&self, what: &str) {
        let before = self.expiry();
        let acks = self.acks();
        assert!(
            wait_until(Duration::from_secs(12), || {
                let l = &self.agent.leases()[0];
                l.expires_unix_ms.unwrap_or(0) > before && l.state == "Bound"
            }),
            "no renewal completed {what} (acks {acks} → {}): {:?}\n{}",
            self.acks(),
            self.agent.leases(),
            self.dnsmasq.log()
        );
    }

    /// The loss was noticed: the lease is on AF_PACKET within a second,
    /// counted, and `/readyz` says degraded.
    fn falls_back(&self, reason: &str) {
        self.falls_back_within(Duration::from_secs(1), reason);
    }

    /// [`Self::falls_back`] within `within`.
    fn falls_back_within(&self, within: Duration, reason: &str) {
        assert!(
            wait_until(within, || self.path() == "af-packet (ebpf lost)"),
            "the lease did not fall back within {within:?}: {:?}",
            self.agent.status()
        );
        let s = self.agent.status();
        assert!(s.degraded.is_some(), "{s:?}");
        assert!(!s.ready, "{s:?}");
        let (code, body) = http_get(self.metrics, "/readyz");
        assert_eq!(code, 503, "{body}");
        assert!(body.contains("degraded"), "{body}");
        assert_eq!(
            metric(
                self.metrics,
                &format!("xdhcp_capture_lost_total{{reason=\"{reason}\"}}")
            ),
            1
        );
        assert_eq!(metric(self.metrics, "xdhcp_capture_fallbacks_total"), 1);
        // CNI requests are still served while degraded.
        let r: rpc::Readiness = self.agent.client().get(rpc::PATH_READY).unwrap();
        assert!(r.ready, "{r:?}");
    }

    /// The path came back: the lease is on the ring buffer again, readiness
    /// restored, the restore counted.
    fn returns(&self, reason: &str) {
        assert!(
            wait_until(Duration::from_secs(20), || self.path() == "tc"),
            "the lease did not return to the ring buffer: {:?}",
            self.agent.status()
        );
        let s = self.agent.status();
        assert!(s.degraded.is_none() && s.ready, "{s:?}");
        assert_eq!(http_get(self.metrics, "/readyz").0, 200);
        assert_eq!(
            metric(
                self.metrics,
                &format!("xdhcp_capture_restored_total{{reason=\"{reason}\"}}")
            ),
            1
        );
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = self.agent.post(rpc::PATH_DEL, &self.req);
    }
}

#[test]
fn a_failed_ring_reader_moves_leases_to_af_packet_and_back() {
    let s = Setup::new();
    s.renews("on the ring buffer before the fault");

    let broken = rpc::ReaderFault { broken: true };
    s.agent
        .post(rpc::PATH_TEST_READER_FAULT, &broken)
        .expect("inject the reader fault");
    s.falls_back("reader");
    // The reader stays broken (reopening fails too): renewals run on the
    // lease's own AF_PACKET receiver.
    s.renews("on the AF_PACKET fallback");
    assert_eq!(s.path(), "af-packet (ebpf lost)");

    let mended = rpc::ReaderFault { broken: false };
    s.agent
        .post(rpc::PATH_TEST_READER_FAULT, &mended)
        .expect("mend the reader");
    s.returns("reader");
    s.renews("back on the ring buffer");
}

#[test]
fn a_link_detached_from_outside_moves_leases_to_af_packet_and_back() {
    let s = Setup::new();
    let link = s.agent.status().interfaces[0]
        .bpf_link
        .expect("the TC attachment is a BPF link (tcx) on this kernel");
    s.renews("on the ring buffer before the detach");

    let out = Command::new(xdhcp_tests::program("bpftool"))
        .args(["link", "detach", "id", &link.to_string()])
        .output()
        .expect("run bpftool");
    assert!(
        out.status.success(),
        "bpftool link detach: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.falls_back("link_detached");
    s.renews("on the AF_PACKET fallback");
    // The agent re-attaches (a new link) and the lease returns.
    s.returns("link_detached");
    let again = s.agent.status().interfaces[0].bpf_link;
    assert!(again.is_some_and(|l| l != link), "{again:?}");
    s.renews("on the re-attached program");
}

/// Before tcx (kernels before 6.6, the VM tier's 6.1 guest) the TC program
/// is a netlink filter, which `tc filter del` removes without a BPF link
/// to notice it by: the agent lists the hook's filters every 2 s and moves
/// the lease to its fallback when its filter is gone, then attaches again.
/// On a kernel with tcx the same command removes nothing of the agent's:
/// the lease stays on the ring buffer and renews there.
#[test]
fn a_tc_filter_deleted_from_outside_is_noticed_where_tc_programs_are_filters() {
    let s = Setup::new();
    let tcx = s.agent.status().interfaces[0].bpf_link.is_some();
    s.renews("on the ring buffer before the deletion");
    let c = &s.lab.clients[0];
    let deleted = xdhcp_tests::chaos::delete_tc_filters(Some(c.ns.path()), &c.ifname);
    if tcx {
        assert!(
            !deleted,
            "a tcx kernel's pod interface had netlink filters to delete"
        );
        std::thread::sleep(Duration::from_secs(3));
        assert_eq!(s.path(), "tc", "{:?}", s.agent.status());
        s.renews("after `tc filter del`, still on the ring buffer");
        return;
    }
    assert!(deleted, "`tc filter del` found no filter of the agent's");
    s.falls_back_within(Duration::from_secs(3), "link_detached");
    s.renews("on the AF_PACKET fallback");
    // The agent attaches the filter again and the lease returns.
    s.returns("link_detached");
    s.renews("on the filter attached again");
}
