//! Fault: the state directory is full or read-only.
//!
//! The agent (in-process) keeps its state on a tiny tmpfs (64 KiB) mounted
//! by the test on a directory of its own (unmounted on drop), against a real
//! dnsmasq in network namespaces; once in embedded mode (the `pod-networks`
//! store is in the state directory too) and once with the in-process fake
//! API server (not a cluster) holding the annotation, so that the lease
//! record's own write is what fails. While the filesystem is full, and while it
//! is read-only, an ADD fails with a CNI I/O error that names the state
//! directory, gives its lease back to the server (RELEASE) and leaves
//! nothing behind; the records written before stay whole and the lease they
//! hold keeps renewing; once space (or write access) returns, the same ADD
//! succeeds, and an agent restarted on the directory resumes every lease.
//! An IPv6 ADD whose record cannot be written counts that failure once.

use std::path::{Path, PathBuf};
use std::time::Duration;

use xdhcp::cli::{DatapathChoice, KubeMode};
use xdhcp::cni::types::code;
use xdhcp::rpc::CniRequest;
use xdhcp::store::LeaseRecord;
use xdhcp_tests::tmpfs::Tmpfs;
use xdhcp_tests::{
    Dnsmasq, DnsmasqConfig, InProcessAgent, Lab, LabClient, StandInApi, format_mac, wait_until,
};

const T1: u64 = 3;

fn request(client: &LabClient, container: &str, api: Option<&StandInApi>) -> CniRequest {
    if let Some(api) = api {
        api.server.add_pod("default", container, &[], &[]);
    }
    // `apply`: the pod holds its address, so it answers the server's ARP
    // for the unicast renewal ACKs.
    let conf = r#"{"cniVersion":"1.0.0","name":"net1","type":"bridge","ipam":{"type":"xdhcp","apply":true,"timeout":"10s"}}"#;
    xdhcp_tests::cni_request(client, container, "default", conf)
}

fn agent_on(state_dir: &Path, api: Option<&StandInApi>) -> InProcessAgent {
    let dir = state_dir.to_path_buf();
    let kubeconfig = api.map(|a| a.kubeconfig.clone());
    InProcessAgent::start_with(move |a| {
        a.datapath = DatapathChoice::Afpacket;
        a.state_dir = dir;
        if let Some(k) = kubeconfig {
            a.kube = KubeMode::On;
            a.kubeconfig = Some(k);
        }
    })
}

/// Every record file under `<state>/leases`, parsed; panics on a torn one.
fn records(state: &Path) -> Vec<(PathBuf, LeaseRecord)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(state.join("leases")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            let bytes = std::fs::read(&p).unwrap();
            let rec: LeaseRecord = serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("{} is torn: {e}", p.display()));
            out.push((p, rec));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn record_of<'a>(recs: &'a [(PathBuf, LeaseRecord)], container: &str) -> Option<&'a LeaseRecord> {
    recs.iter()
        .map(|(_, r)| r)
        .find(|r| r.container_id == container)
}

/// The ADD fails with the CNI I/O code, names the state directory and says
/// why; the attachment is gone from the agent and the server saw a RELEASE.
fn assert_clean_failure(
    agent: &InProcessAgent,
    dnsmasq: &Dnsmasq,
    client: &LabClient,
    req: &CniRequest,
    state: &Path,
    why: &str,
) {
    let mac = format_mac(client.mac);
    let releases = |d: &Dnsmasq| {
        d.log()
            .lines()
            .filter(|l| l.contains("DHCPRELEASE") && l.contains(&mac))
            .count()
    };
    let before = releases(dnsmasq);
    let err = agent.add(req).expect_err("ADD must fail").into_cni();
    assert_eq!(err.code, code::IO_FAILURE, "{err:?}");
    let text = format!("{} {}", err.msg, err.details);
    assert!(
        text.contains(&state.display().to_string()),
        "the error must name the state directory {}: {err:?}",
        state.display()
    );
    assert!(text.contains(why), "the error must say {why:?}: {err:?}");
    assert!(
        !agent
            .leases()
            .iter()
            .any(|l| l.container_id == req.container_id),
        "a failed ADD left its attachment behind: {:?}",
        agent.leases()
    );
    // The lease is given back, so the server holds no orphan.
    assert!(
        wait_until(Duration::from_secs(5), || releases(dnsmasq) > before),
        "no RELEASE for the lease of the failed ADD:\n{}",
        dnsmasq.log()
    );
    assert!(
        wait_until(Duration::from_secs(5), || dnsmasq
            .lease_for(client.mac)
            .is_none()),
        "dnsmasq still holds the lease of the failed ADD: {:?}",
        dnsmasq.leases()
    );
}

#[test]
fn full_or_read_only_state_dir_fails_add_clearly_and_loses_nothing_embedded() {
    full_or_read_only(None);
}

#[test]
fn full_or_read_only_state_dir_fails_add_clearly_and_loses_nothing_fake_apiserver() {
    full_or_read_only(Some(&StandInApi::start()));
}

#[expect(
    clippy::too_many_lines,
    reason = "one scenario: full, space back, read-only, writable, restart, each with its checks"
)]
fn full_or_read_only(api: Option<&StandInApi>) {
    let fs = Tmpfs::mount("64k");
    let state = fs.path().join("state");
    let lab = Lab::with_clients(3);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::renewing_every(T1 as u32));
    let agent = agent_on(&state, api);
    let (a, b, c) = (&lab.clients[0], &lab.clients[1], &lab.clients[2]);
    let req_a = request(a, "pod-a", api);
    let ip_a = agent.add(&req_a).expect("ADD with room on disk").ips[0]
        .address
        .addr;
    // The full record follows the ADD's answer (which waits only for the
    // record written ahead): the one to keep while the disk is full.
    assert!(
        wait_until(Duration::from_secs(5), || record_of(
            &records(&state),
            "pod-a"
        )
        .is_some_and(|r| r.lease.is_some())),
        "pod-a's full record never followed its answer"
    );
    let before = records(&state);
    let rec_a = record_of(&before, "pod-a").expect("pod-a's record").clone();

    // --- Full.
    let filler = fs.path().join("filler");
    let filled = Tmpfs::fill(&filler);
    assert!(filled > 0, "the filler took no space");
    let req_b = request(b, "pod-b", api);
    assert_clean_failure(
        &agent,
        &dnsmasq,
        b,
        &req_b,
        &state,
        "No space left on device",
    );
    // No pod-networks entry names the address that was given back, and the
    // entries written before are whole.
    if let Some(api) = api {
        let ann = api
            .server
            .annotation("default", "pod-b", "k8s.ovn.org/pod-networks")
            .unwrap_or_default();
        assert!(!ann.contains("192.0.2."), "{ann}");
    } else {
        let doc = std::fs::read(state.join("pod-networks.json")).unwrap();
        let doc: serde_json::Value =
            serde_json::from_slice(&doc).expect("the embedded pod store is whole");
        assert!(doc.to_string().contains(&ip_a.to_string()), "{doc}");
        assert!(!doc.to_string().contains("pod-b"), "{doc}");
    }
    // pod-a keeps its lease and renews (twice T1) while its record cannot
    // be rewritten; the record on disk stays whole (the older version).
    let acks = |d: &Dnsmasq| {
        let mac = format_mac(a.mac);
        d.log()
            .lines()
            .filter(|l| l.contains("DHCPACK") && l.contains(&mac))
            .count()
    };
    let acks_before = acks(&dnsmasq);
    assert!(
        wait_until(Duration::from_secs(3 * T1 + 5), || acks(&dnsmasq)
            >= acks_before + 2),
        "pod-a stopped renewing while the disk was full:\n{}",
        dnsmasq.log()
    );
    let during = records(&state);
    assert_eq!(
        record_of(&during, "pod-a"),
        Some(&rec_a),
        "pod-a's record changed while the disk was full"
    );
    assert!(record_of(&during, "pod-b").is_none(), "{during:?}");

    // --- Space returns: the same ADD succeeds and is recorded.
    std::fs::remove_file(&filler).unwrap();
    let ip_b = agent.add(&req_b).expect("ADD once space returned").ips[0]
        .address
        .addr;
    assert!(record_of(&records(&state), "pod-b").is_some());
    // pod-a's next renewal is written again.
    assert!(
        wait_until(Duration::from_secs(2 * T1 + 5), || {
            record_of(&records(&state), "pod-a")
                .is_some_and(|r| r.updated_unix_ms > rec_a.updated_unix_ms)
        }),
        "pod-a's record was not rewritten after space returned"
    );

    // --- Read-only.
    fs.remount(true);
    let req_c = request(c, "pod-c", api);
    assert_clean_failure(&agent, &dnsmasq, c, &req_c, &state, "Read-only file system");
    fs.remount(false);
    let ip_c = agent.add(&req_c).expect("ADD once writable again").ips[0]
        .address
        .addr;

    // --- Nothing lost: every lease is on disk, whole, and an agent started
    // again on the directory resumes all three.
    let after = records(&state);
    assert_eq!(after.len(), 3, "{after:?}");
    drop(agent);
    let agent = agent_on(&state, api);
    let mut held: Vec<_> = agent
        .leases()
        .into_iter()
        .map(|l| (l.container_id, l.address.map(|a| a.addr)))
        .collect();
    held.sort();
    assert_eq!(
        held,
        vec![
            ("pod-a".to_owned(), Some(ip_a)),
            ("pod-b".to_owned(), Some(ip_b)),
            ("pod-c".to_owned(), Some(ip_c)),
        ]
    );
    // No temporary file was left in the leases directory besides the
    // store's own spares.
    let stray: Vec<_> = std::fs::read_dir(state.join("leases"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| {
            Path::new(n).extension().is_none_or(|x| x != "json") && !n.starts_with(".spare.tmp.")
        })
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
    drop(agent);
}

/// An IPv6 ADD whose record cannot be written (the state directory
/// read-only) fails and counts the one write that failed once in
/// `xdhcp_failures_total{error="persist"}`: the lease task counted it
/// again on top of the store's own count.
#[test]
fn an_ipv6_adds_failed_record_is_counted_once() {
    let fs = Tmpfs::mount("1m");
    let state = fs.path().join("state");
    let api = StandInApi::start();
    let uid = api.server.add_pod("tenant", "v6ro", &[], &[]);
    let lab = Lab::builder().server_behind_uplink().build();
    let _server = xdhcp_tests::Dnsmasq6::start(lab.dhcp_ns());
    let metrics = xdhcp_tests::bench::free_local_addr();
    let (dir, kubeconfig) = (state.clone(), api.kubeconfig.clone());
    let agent = InProcessAgent::start_with(move |a| {
        a.datapath = DatapathChoice::Afpacket;
        a.state_dir = dir;
        a.kube = KubeMode::On;
        a.kubeconfig = Some(kubeconfig);
        a.metrics_addr = Some(metrics);
    });
    fs.remount(true);
    let conf = r#"{"cniVersion":"1.1.0","name":"v6net","type":"ovn-k8s-cni-overlay",
        "topology":"localnet","role":"secondary","netAttachDefName":"tenant/v6net",
        "ipam":{"type":"xdhcp","family":"ipv6","timeout":"20s","ipv6":{"prefixLength":64}}}"#;
    let mut req = xdhcp_tests::cni_request(&lab.clients[0], "v6ro", "tenant", conf);
    req.args.insert("K8S_POD_UID".to_owned(), uid);
    let e = agent
        .add(&req)
        .expect_err("an ADD whose record cannot be written fails");
    assert!(
        e.to_string().contains("Read-only file system"),
        "the error names the cause: {e}"
    );
    let text =
        xdhcp_tests::bench::http_get(metrics, "/metrics").expect("the metrics server answers");
    assert_eq!(
        xdhcp_tests::bench::metric_count(&text, "xdhcp_failures_total", r#"error="persist""#),
        1,
        "{text}"
    );
    fs.remount(false);
}
