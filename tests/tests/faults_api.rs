//! Fault: the Kubernetes API server is down, slow, or answers 500 or 429.
//!
//! **The API server here is the in-process fake (`fake_apiserver`), not a
//! cluster**, driven by the real `kube::Client` of an in-process agent
//! (`--kube on --kubeconfig <fake>`), against a real dnsmasq in network
//! namespaces, with `"apply": true` so the address on the pod interface can
//! be checked.
//!
//! What ADD does, as `docs/faults.md` states it:
//! - the pod cannot be read (API down, failing, hung): the ADD fails with the
//!   Kubernetes API code (103) naming the pod, before any DHCP;
//! - the `pod-networks` entry cannot be written (500, conflicts exhausted,
//!   hung past the deadline): the ADD fails with code 103, the lease is
//!   released at the server and its address taken off the pod interface,
//!   so no pod keeps an address nobody reported;
//! - 429 (and 503/504) are retried by the client, waiting the server's
//!   `Retry-After`, but never past the ADD's deadline: the plugin's wait
//!   (DHCP timeout + 15 s) less one second.

use std::time::{Duration, Instant};

use xdhcp::cli::{DatapathChoice, KubeMode};
use xdhcp::cni::types::code;
use xdhcp::rpc::CniRequest;
use xdhcp_tests::fake_apiserver::{Fault, Op};
use xdhcp_tests::{
    Dnsmasq, DnsmasqConfig, InProcessAgent, Lab, LabClient, StandInApi, format_mac, wait_until,
};

const NS: &str = "tenant";
const POD_NETWORKS: &str = "k8s.ovn.org/pod-networks";
/// The ADD deadline of a network with `"timeout": "2s"`: the plugin waits
/// 2 s + 15 s; the agent answers one second before.
const DEADLINE: Duration = Duration::from_secs(16);

/// A lab with one dnsmasq, the fake API server, and an agent using it.
struct Setup {
    // Dropped in this order: the agent before the API it uses.
    agent: InProcessAgent,
    server: StandInApi,
    dnsmasq: Dnsmasq,
    lab: Lab,
}

impl Setup {
    fn new(clients: usize) -> Self {
        let server = StandInApi::start();
        let lab = Lab::with_clients(clients);
        let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
        let agent = InProcessAgent::start_with(|a| {
            a.kube = KubeMode::On;
            a.kubeconfig = Some(server.kubeconfig.clone());
            a.datapath = DatapathChoice::Afpacket;
        });
        Self {
            agent,
            server,
            dnsmasq,
            lab,
        }
    }

    /// A pod `name` in the fake API and the ADD for it on client `i`.
    fn pod(&self, i: usize, name: &str) -> CniRequest {
        let uid = self.server.add_pod(NS, name, &[], &[]);
        let conf = r#"{"cniVersion":"1.0.0","name":"net1","type":"bridge","ipam":{"type":"xdhcp","apply":true,"timeout":"2s"}}"#;
        let mut req = xdhcp_tests::cni_request(&self.lab.clients[i], name, NS, conf);
        req.args.insert("K8S_POD_UID".into(), uid);
        req
    }

    fn client(&self, i: usize) -> &LabClient {
        &self.lab.clients[i]
    }

    fn log_count(&self, what: &str, mac: [u8; 6]) -> usize {
        let mac = format_mac(mac);
        self.dnsmasq
            .log()
            .lines()
            .filter(|l| l.contains(what) && l.contains(&mac))
            .count()
    }

    fn annotation(&self, pod: &str) -> Option<String> {
        self.server.annotation(NS, pod, POD_NETWORKS)
    }

    /// Nothing of a failed ADD remains: no attachment in the agent, no
    /// address on the pod interface, no lease at the server (released if one
    /// was taken), no `pod-networks` entry.
    fn assert_nothing_left(&self, i: usize, req: &CniRequest) {
        let c = self.client(i);
        assert!(
            !self
                .agent
                .leases()
                .iter()
                .any(|l| l.container_id == req.container_id),
            "{:?}",
            self.agent.leases()
        );
        assert!(
            c.ns.ipv4_addrs(&c.ifname).is_empty(),
            "the pod kept an address nobody reported: {:?}",
            c.ns.ipv4_addrs(&c.ifname)
        );
        assert!(
            wait_until(Duration::from_secs(5), || self
                .dnsmasq
                .lease_for(c.mac)
                .is_none()),
            "dnsmasq still holds a lease for the failed ADD: {:?}",
            self.dnsmasq.leases()
        );
        let ann = self.annotation(&req.container_id).unwrap_or_default();
        assert!(!ann.contains("192.0.2."), "an entry was left: {ann}");
    }
}

/// 500 on the annotation write: the ADD fails with the API code naming the
/// pod and the status, the lease is released and its address removed; the
/// retried ADD succeeds and reports the address.
#[test]
fn api_500_on_the_annotation_write_gives_the_lease_back_fake_apiserver() {
    let s = Setup::new(1);
    let req = s.pod(0, "web-500");
    s.server.inject(Op::PatchPod, Fault::Status(500));
    let err = s.agent.add(&req).expect_err("ADD must fail").into_cni();
    assert_eq!(err.code, code::KUBE_API, "{err:?}");
    assert!(err.msg.contains("tenant/web-500"), "{err:?}");
    assert!(err.msg.contains("500"), "{err:?}");
    // Sent before the ADD answered; dnsmasq logs it a moment later.
    assert!(
        wait_until(Duration::from_secs(5), || s
            .log_count("DHCPRELEASE", s.client(0).mac)
            >= 1),
        "the lease was not released:\n{}",
        s.dnsmasq.log()
    );
    s.assert_nothing_left(0, &req);

    let r = s.agent.add(&req).expect("the retried ADD succeeds");
    let ip = r.ips[0].address.addr;
    let ann = s.annotation("web-500").expect("annotation written");
    assert!(ann.contains(&ip.to_string()), "{ann}");
    let c = s.client(0);
    assert_eq!(c.ns.ipv4_addrs(&c.ifname), vec![(ip, 24)]);
}

/// 429 with `Retry-After: 1`, twice: the client waits as asked and the ADD
/// succeeds within its deadline.
#[test]
fn api_429_with_retry_after_is_waited_for_fake_apiserver() {
    let s = Setup::new(1);
    let req = s.pod(0, "web-429");
    s.server.inject_n(
        Op::PatchPod,
        &Fault::TooManyRequests {
            retry_after_secs: 1,
        },
        2,
    );
    let t0 = Instant::now();
    let r = s.agent.add(&req).expect("ADD succeeds after the 429s");
    let took = t0.elapsed();
    assert_eq!(s.server.pending_faults(), 0, "both 429s were served");
    let patches: Vec<u16> = s
        .server
        .requests()
        .iter()
        .filter(|r| r.op == Some(Op::PatchPod))
        .map(|r| r.status)
        .collect();
    assert_eq!(patches, vec![429, 429, 200], "{patches:?}");
    // Retry-After is honoured: two waits of a second each.
    assert!(took >= Duration::from_secs(2), "took {took:?}");
    let ann = s.annotation("web-429").expect("annotation written");
    assert!(ann.contains(&r.ips[0].address.addr.to_string()), "{ann}");
}

/// An API server that keeps answering 429 (`Retry-After: 3`) to the
/// annotation write: the ADD fails at its deadline, not after the client's
/// fifteen retries, with an error that says so; the lease is given back.
#[test]
fn api_429_storm_ends_the_add_at_its_deadline_fake_apiserver() {
    let s = Setup::new(1);
    let req = s.pod(0, "web-storm");
    s.server.inject_n(
        Op::PatchPod,
        &Fault::TooManyRequests {
            retry_after_secs: 3,
        },
        100,
    );
    let t0 = Instant::now();
    let err = s.agent.add(&req).expect_err("ADD must fail").into_cni();
    let took = t0.elapsed();
    assert_eq!(err.code, code::KUBE_API, "{err:?}");
    assert!(err.msg.contains("deadline"), "{err:?}");
    assert!(err.msg.contains("tenant/web-storm"), "{err:?}");
    assert!(
        took + Duration::from_secs(1) >= DEADLINE && took < DEADLINE + Duration::from_secs(3),
        "the ADD must end at its deadline ({DEADLINE:?}), took {took:?}"
    );
    s.assert_nothing_left(0, &req);
}

/// The API server is down: the ADD fails at once with the API code naming
/// the pod, before any DHCP (no DISCOVER reaches the server).
#[test]
fn api_down_fails_the_add_before_any_dhcp_fake_apiserver() {
    let mut s = Setup::new(1);
    let req = s.pod(0, "web-down");
    s.server.stop();
    std::thread::sleep(Duration::from_millis(100));
    let err = s.agent.add(&req).expect_err("ADD must fail").into_cni();
    assert_eq!(err.code, code::KUBE_API, "{err:?}");
    let text = format!("{} {}", err.msg, err.details);
    assert!(text.contains("tenant/web-down"), "{err:?}");
    assert_eq!(
        s.log_count("DHCPDISCOVER", s.client(0).mac),
        0,
        "DHCP ran although the pod could not be read:\n{}",
        s.dnsmasq.log()
    );
    s.assert_nothing_left(0, &req);
}

/// The agent answers within the wait its caller tells it (the plugin sends
/// its own in `xdhcp-wait-ms`), not one it works out for itself: with the
/// pod read hung and a caller that waits 6 s, the ADD fails with the API
/// code a second before that, where a caller that tells nothing gets 16 s.
#[test]
fn the_add_ends_within_the_wait_its_caller_tells_fake_apiserver() {
    let s = Setup::new(1);
    let req = s.pod(0, "web-told");
    s.server
        .inject(Op::GetPod, Fault::Delay(Duration::from_mins(1)));
    let socket = s.agent.client().socket().to_path_buf();
    let client = xdhcp::rpc::Client::new(socket, Duration::from_secs(6));
    let t0 = Instant::now();
    let err = client
        .post_telling_wait::<_, serde_json::Value>(xdhcp::rpc::PATH_ADD, &req)
        .expect_err("ADD must fail")
        .into_cni();
    let took = t0.elapsed();
    assert_eq!(err.code, code::KUBE_API, "{err:?}");
    assert!(err.msg.contains("deadline of 5s"), "{err:?}");
    assert!(err.msg.contains("tenant/web-told"), "{err:?}");
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(6),
        "took {took:?}"
    );
    s.assert_nothing_left(0, &req);
}

/// A hung API server (the pod read held for 60 s): the ADD fails within its
/// deadline with the API code naming the pod, before any DHCP.
#[test]
fn api_hung_fails_the_add_within_its_deadline_fake_apiserver() {
    let s = Setup::new(1);
    let req = s.pod(0, "web-hung");
    s.server
        .inject(Op::GetPod, Fault::Delay(Duration::from_mins(1)));
    let t0 = Instant::now();
    let err = s.agent.add(&req).expect_err("ADD must fail").into_cni();
    let took = t0.elapsed();
    assert_eq!(err.code, code::KUBE_API, "{err:?}");
    let text = format!("{} {}", err.msg, err.details);
    assert!(text.contains("tenant/web-hung"), "{err:?}");
    assert!(took < DEADLINE + Duration::from_secs(1), "took {took:?}");
    assert_eq!(s.log_count("DHCPDISCOVER", s.client(0).mac), 0);
    s.assert_nothing_left(0, &req);
}
