//! Fault: the eBPF capture path is lost under load. The agent runs
//! in-process against a real dnsmasq with 50 pod leases renewing every 3 s
//! (T1), all served by the eBPF ring buffer (TC on each pod's veth); then
//! the ring reader fails (injected through the test-only socket route).
//! Every lease moves to its own `AF_PACKET` receiver and every one of them
//! completes each renewal that falls due while the path is lost and after it
//! returns: none is missed. (`capture_fallback.rs` covers one lease, and a
//! link detached with `bpftool`.)

use std::collections::BTreeMap;
use std::time::Duration;

use xdhcp::cli::DatapathChoice;
use xdhcp::rpc::{self, CniRequest};
use xdhcp_tests::{Dnsmasq, DnsmasqConfig, InProcessAgent, Lab, wait_until};

const PODS: usize = 50;
const T1: u64 = 3;

fn expiries(agent: &InProcessAgent) -> BTreeMap<String, (u64, String)> {
    agent
        .leases()
        .into_iter()
        .map(|l| (l.container_id, (l.expires_unix_ms.unwrap_or(0), l.state)))
        .collect()
}

fn paths(agent: &InProcessAgent) -> Vec<String> {
    agent
        .status()
        .interfaces
        .into_iter()
        .map(|i| i.attach)
        .collect()
}

/// Every lease completes a renewal (its expiry moves on and it is BOUND
/// again) within a renewal period and a margin of `since`.
fn all_renew(agent: &InProcessAgent, since: &BTreeMap<String, (u64, String)>, what: &str) {
    let ok = wait_until(Duration::from_secs(T1 + 6), || {
        let now = expiries(agent);
        since.iter().all(|(id, (before, _))| {
            now.get(id)
                .is_some_and(|(e, state)| e > before && state == "Bound")
        })
    });
    if !ok {
        let now = expiries(agent);
        let missed: Vec<_> = since
            .iter()
            .filter(|(id, (before, _))| now.get(*id).is_none_or(|(e, _)| e <= before))
            .map(|(id, _)| (id.clone(), now.get(id).cloned()))
            .collect();
        panic!(
            "{} of {PODS} leases missed a renewal {what}: {missed:?}",
            missed.len()
        );
    }
}

#[test]
fn a_failed_ring_reader_under_fifty_renewing_leases_misses_no_renewal() {
    let lab = Lab::with_clients(PODS);
    let _dnsmasq = Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            t1_secs: Some(T1 as u32),
            t2_secs: Some(100),
            ..DnsmasqConfig::default()
        },
    );
    let agent = InProcessAgent::start(DatapathChoice::Ebpf);
    let conf = r#"{"cniVersion":"1.0.0","name":"net1","type":"bridge","ipam":{"type":"xdhcp","timeout":"20s","apply":true}}"#;
    let reqs: Vec<CniRequest> = lab
        .clients
        .iter()
        .enumerate()
        .map(|(i, c)| xdhcp_tests::cni_request(c, &format!("load-{i}"), "default", conf))
        .collect();
    for r in &reqs {
        agent.add(r).expect("ADD");
    }
    assert!(
        wait_until(Duration::from_secs(20), || {
            let p = paths(&agent);
            p.len() == PODS && p.iter().all(|p| p == "tc")
        }),
        "not every lease moved to the ring buffer: {:?}",
        paths(&agent)
    );
    all_renew(&agent, &expiries(&agent), "on the ring buffer");

    agent
        .post(
            rpc::PATH_TEST_READER_FAULT,
            &rpc::ReaderFault { broken: true },
        )
        .expect("inject the reader fault");
    let at_loss = expiries(&agent);
    assert!(
        wait_until(Duration::from_secs(2), || paths(&agent)
            .iter()
            .all(|p| p == "af-packet (ebpf lost)")),
        "not every lease fell back: {:?}",
        paths(&agent)
    );
    // Two rounds of renewals on the fallback.
    all_renew(&agent, &at_loss, "while the ring buffer was lost");
    all_renew(&agent, &expiries(&agent), "on the fallback, second round");

    agent
        .post(
            rpc::PATH_TEST_READER_FAULT,
            &rpc::ReaderFault { broken: false },
        )
        .expect("mend the reader");
    assert!(
        wait_until(Duration::from_secs(20), || paths(&agent)
            .iter()
            .all(|p| p == "tc")),
        "not every lease returned to the ring buffer: {:?}",
        paths(&agent)
    );
    all_renew(&agent, &expiries(&agent), "back on the ring buffer");
    for r in &reqs {
        let _ = agent.post(rpc::PATH_DEL, r);
    }
}
