//! Fault: the capture of a pod lease is taken apart from outside, again and
//! again, as an operator (or another tool on the node) might. The agent
//! runs in-process against a real dnsmasq (T1 = 4 s); the pod's lease is on
//! the per-interface eBPF path (TC on its veth, a tcx link on this kernel).
//! Round after round the test detaches the agent's link with `bpftool`
//! together with `tc filter del` in the pod, deletes a `clsact` qdisc (one
//! another tool added), takes the pod's interface down and up, and does all
//! of these at once; after each round the lease completes a renewal, and
//! after each re-attach it completes another on the ring buffer. Whenever
//! the agent's status says the lease is on the ring buffer, the link it
//! names is attached to the pod's interface in the kernel; whenever that
//! link is gone, the status says the lease is on `AF_PACKET`.
//!
//! A renewal whose reply was lost on the host just before the loss was
//! noticed (its ACK dropped, then the link detached) is sent again at once
//! on the fallback, not at its next retransmission a minute away.
//!
//! An interface taken down and up loses its routes (the kernel flushes
//! them) but keeps its address; with `apply`, the next renewal puts the
//! lease's routes back.
//!
//! The outside actions are those of `xdhcp_tests::chaos`, which the soak's
//! chaos schedule uses too.

use std::time::Duration;

use xdhcp::cli::DatapathChoice;
use xdhcp::rpc::{self, CniRequest};
use xdhcp_tests::{Dnsmasq, DnsmasqConfig, InProcessAgent, Lab, chaos, format_mac, wait_until};

const T1: u32 = 4;
/// How long after a loss the agent re-attaches, at most (its first retry
/// is 10 s after the loss), with a margin.
const REATTACH: Duration = Duration::from_secs(20);

struct Setup {
    lab: Lab,
    dnsmasq: Dnsmasq,
    agent: InProcessAgent,
    req: CniRequest,
}

impl Setup {
    fn new() -> Self {
        let lab = Lab::with_clients(1);
        let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::renewing_every(T1));
        let agent = InProcessAgent::start(DatapathChoice::Ebpf);
        let req = agent.add_applied(&lab.clients[0], "pod-out");
        let me = Self {
            lab,
            dnsmasq,
            agent,
            req,
        };
        me.on_ring("after the ADD");
        me
    }

    fn netns(&self) -> &std::path::Path {
        self.lab.clients[0].ns.path()
    }

    fn ifname(&self) -> &str {
        &self.lab.clients[0].ifname
    }

    /// The lease's path and the link the status names.
    fn path(&self) -> (String, Option<u32>) {
        self.agent
            .status()
            .interfaces
            .first()
            .map(|i| (i.attach.clone(), i.bpf_link))
            .unwrap_or_default()
    }

    /// The tcx links on the pod's interface, as the kernel has them.
    fn kernel_links(&self) -> Vec<u32> {
        chaos::tcx_links(Some(self.netns()), self.ifname()).unwrap_or_default()
    }

    /// The status tells the truth: "tc" with a link the kernel has on the
    /// pod's interface, or a fallback path.
    fn status_is_true(&self, what: &str) {
        let (path, link) = self.path();
        let kernel = self.kernel_links();
        if path == "tc" {
            assert!(
                link.is_some_and(|l| kernel.contains(&l)),
                "{what}: the status says the lease is on the ring buffer through link {link:?}, \
                 but the kernel has {kernel:?} on the pod's interface"
            );
        } else {
            assert!(path.starts_with("af-packet"), "{what}: path {path}");
        }
    }

    /// The lease is (back) on the ring buffer, through a link the kernel
    /// has on the pod's interface.
    fn on_ring(&self, what: &str) {
        assert!(
            wait_until(REATTACH, || {
                let (path, link) = self.path();
                path == "tc" && link.is_some_and(|l| self.kernel_links().contains(&l))
            }),
            "{what}: the lease is not on the ring buffer through an attached link: {:?}, kernel {:?}",
            self.agent.status().interfaces,
            self.kernel_links()
        );
    }

    /// The lease falls back to its own receiver, and says so.
    fn falls_back(&self, what: &str) {
        assert!(
            wait_until(Duration::from_secs(2), || self.path().0
                == "af-packet (ebpf lost)"),
            "{what}: the lease did not fall back: {:?}, kernel {:?}",
            self.agent.status().interfaces,
            self.kernel_links()
        );
    }

    fn expiry(&self) -> u64 {
        self.agent.leases()[0].expires_unix_ms.unwrap_or(0)
    }

    /// The agent completes a renewal (its expiry moves on, BOUND again).
    fn renews(&self, what: &str) {
        let before = self.expiry();
        let mac = format_mac(self.lab.clients[0].mac);
        assert!(
            wait_until(Duration::from_secs(u64::from(T1) * 2 + 4), || {
                let l = &self.agent.leases()[0];
                l.expires_unix_ms.unwrap_or(0) > before && l.state == "Bound"
            }),
            "no renewal completed {what}: {:?}\nstatus {:?}\nkernel links {:?}\n{}",
            self.agent.leases(),
            self.agent.status().interfaces,
            self.kernel_links(),
            self.dnsmasq
                .log()
                .lines()
                .filter(|l| l.contains(&mac))
                .collect::<Vec<_>>()
                .join("\n")
        );
        self.status_is_true(what);
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = self.agent.post(rpc::PATH_DEL, &self.req);
    }
}

#[test]
fn capture_taken_apart_from_outside_again_and_again_loses_no_renewal() {
    let s = Setup::new();
    s.renews("on the ring buffer before anything");
    let ns = Some(s.netns());
    let eth = s.ifname().to_owned();

    for round in 1..=2 {
        // The operator's pair: the link detached, the filter deleted.
        let detached = chaos::detach_links(ns, &eth);
        assert!(!detached.is_empty(), "round {round}: no link to detach");
        chaos::delete_tc_filters(ns, &eth);
        s.falls_back(&format!("round {round}, link detached"));
        s.renews(&format!("round {round}, on the fallback after the detach"));
        s.on_ring(&format!("round {round}, re-attached after the detach"));
        s.renews(&format!(
            "round {round}, on the ring buffer after the detach"
        ));

        // Another tool's clsact, deleted with its filters.
        chaos::add_clsact(ns, &eth);
        chaos::delete_tc_filters(ns, &eth);
        chaos::delete_clsact(ns, &eth);
        s.status_is_true(&format!("round {round}, clsact deleted"));
        s.renews(&format!("round {round}, after the clsact went"));

        // The pod's interface down and up.
        chaos::flap(ns, &eth, Duration::from_millis(300));
        s.status_is_true(&format!("round {round}, after a flap"));
        s.renews(&format!("round {round}, after a flap"));

        // All at once.
        chaos::add_clsact(ns, &eth);
        chaos::detach_links(ns, &eth);
        chaos::delete_tc_filters(ns, &eth);
        chaos::delete_clsact(ns, &eth);
        chaos::flap(ns, &eth, Duration::from_millis(300));
        s.falls_back(&format!("round {round}, everything at once"));
        s.renews(&format!("round {round}, on the fallback after everything"));
        s.on_ring(&format!("round {round}, re-attached after everything"));
        s.renews(&format!(
            "round {round}, on the ring buffer after everything"
        ));
    }
}

#[test]
fn a_renewal_in_flight_when_its_capture_is_lost_is_sent_again_at_once() {
    let s = Setup::new();
    let mac = format_mac(s.lab.clients[0].mac);
    let acks = || {
        s.dnsmasq
            .log()
            .lines()
            .filter(|l| l.contains("DHCPACK") && l.contains(&mac))
            .count()
    };
    // The server's answer to the renewal at T1 never reaches the pod: the
    // lease stays RENEWING, its next retransmission at least 60 s away.
    let before = s.expiry();
    let acked = acks();
    let drop = s.lab.drop_server_acks();
    assert!(
        wait_until(Duration::from_secs(u64::from(T1) + 4), || acks() > acked
            && s.agent.leases()[0].state == "Renewing"),
        "no renewal went unanswered: {:?}",
        s.agent.leases()
    );
    std::thread::sleep(Duration::from_secs(1));
    std::mem::drop(drop);
    assert_eq!(s.expiry(), before, "the dropped ACK was heard");
    // Now the capture is lost: the lease asks again on its fallback.
    let lost_at = std::time::Instant::now();
    assert!(!chaos::detach_links(Some(s.netns()), s.ifname()).is_empty());
    s.falls_back("after the detach");
    assert!(
        wait_until(Duration::from_secs(5), || {
            let l = &s.agent.leases()[0];
            l.expires_unix_ms.unwrap_or(0) > before && l.state == "Bound"
        }),
        "the renewal in flight was not sent again when the capture was lost ({:?} ago): {:?}",
        lost_at.elapsed(),
        s.agent.leases()
    );
}

#[test]
fn a_flapped_interface_gets_its_lease_routes_back_at_the_next_renewal() {
    let s = Setup::new();
    let ns = &s.lab.clients[0].ns;
    let eth = s.ifname().to_owned();
    let default_route = || ns.ip(&["-4", "route", "show", "default", "dev", &eth]);
    assert!(
        default_route().contains("via 192.0.2.1"),
        "the lease's default route is not on the pod: {}",
        default_route()
    );
    chaos::flap(Some(s.netns()), &eth, Duration::from_millis(300));
    // The premise: taken down, the link lost its routes, kept its address.
    assert_eq!(default_route().trim(), "", "the kernel kept the route");
    assert!(!ns.ipv4_addrs(&eth).is_empty());
    s.renews("after the flap");
    assert!(
        wait_until(Duration::from_secs(2), || default_route()
            .contains("via 192.0.2.1")),
        "the renewal did not put the default route back: {}",
        ns.ip(&["-4", "route"])
    );
}
