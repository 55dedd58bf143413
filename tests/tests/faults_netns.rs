//! Fault: the pod's interface or network namespace disappears under the
//! agent (in-process, against a real dnsmasq in network namespaces).
//!
//! - The interface is deleted during the ADD's DORA: the ADD fails at once
//!   with the interface code (105) naming the interface and namespace, not
//!   after its DHCP timeout; nothing is left (no lease task, no record).
//! - The interface is deleted while its lease is renewing: the lease ends,
//!   its record is removed, a later DEL succeeds (no RELEASE can leave a
//!   deleted interface; the server's lease runs out).
//! - The namespace's name is deleted (`ip netns del`) while its lease is
//!   held and no DEL came: the lease lives on (the agent's sockets keep the
//!   namespace and its interface alive, so nothing half-works), and the
//!   DEL that follows — with `CNI_NETNS` gone — releases the lease and lets
//!   the namespace and its veth go.
//!
//! (An interface that goes away inside the VFIO handoff is the handoff
//! closure failing: `vfio.rs`'s `closure_error_restores_vfio` and
//! `closure_panic_restores_vfio` show the journal restoring `vfio-pci`.)

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use xdhcp::cli::DatapathChoice;
use xdhcp::cni::types::code;
use xdhcp::rpc::{self, CniRequest, LeaseView};
use xdhcp_tests::{Dnsmasq, DnsmasqConfig, InProcessAgent, Lab, LabClient, format_mac, wait_until};

fn request(client: &LabClient, container: &str) -> CniRequest {
    let conf = r#"{"cniVersion":"1.0.0","name":"net1","type":"bridge","ipam":{"type":"xdhcp","apply":true,"timeout":"10s"}}"#;
    xdhcp_tests::cni_request(client, container, "default", conf)
}

/// An agent whose state directory the test can look into.
fn agent(state: &Path) -> InProcessAgent {
    let state = state.to_path_buf();
    InProcessAgent::start_with(move |a| {
        a.datapath = DatapathChoice::Afpacket;
        a.state_dir = state;
    })
}

fn record(state: &Path, container: &str) -> PathBuf {
    state.join("leases").join(format!("{container}@eth0.json"))
}

fn view(agent: &InProcessAgent, container: &str) -> Option<LeaseView> {
    agent
        .leases()
        .into_iter()
        .find(|l| l.container_id == container)
}

#[test]
fn interface_deleted_during_the_add_fails_it_at_once() {
    let dir = tempfile::tempdir().unwrap();
    // No server: the DORA goes on until the interface goes.
    let lab = Lab::with_clients(1);
    let agent = agent(dir.path());
    let c = &lab.clients[0];
    let req = request(c, "pod-gone-add");
    let client = agent.client();
    let t0 = Instant::now();
    let add = std::thread::spawn(move || client.post::<_, serde_json::Value>(rpc::PATH_ADD, &req));
    std::thread::sleep(Duration::from_secs(1));
    lab.server.link_del(c.port());
    let err = add.join().unwrap().expect_err("ADD must fail").into_cni();
    let took = t0.elapsed();
    assert_eq!(err.code, code::INTERFACE, "{err:?}");
    let text = format!("{} {}", err.msg, err.details);
    assert!(text.contains(&c.ifname), "{err:?}");
    assert!(text.contains(&c.ns.path().display().to_string()), "{err:?}");
    assert!(
        took < Duration::from_secs(6),
        "the ADD waited for its DHCP timeout: {took:?}"
    );
    assert!(
        view(&agent, "pod-gone-add").is_none(),
        "{:?}",
        agent.leases()
    );
    assert!(!record(dir.path(), "pod-gone-add").exists());
}

#[test]
fn interface_deleted_while_renewing_ends_the_lease_and_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let lab = Lab::with_clients(2);
    let mut dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::renewing_every(3));
    let agent = agent(dir.path());
    let (c, other) = (&lab.clients[0], &lab.clients[1]);
    let req = request(c, "pod-gone-renew");
    let keep = request(other, "pod-stays");
    agent.add(&req).expect("ADD");
    agent.add(&keep).expect("ADD");
    assert!(record(dir.path(), "pod-gone-renew").exists());
    // The server goes quiet so the renewal stays in flight.
    dnsmasq.kill();
    assert!(
        wait_until(Duration::from_secs(8), || view(&agent, "pod-gone-renew")
            .is_some_and(|v| v.state == "Renewing")),
        "{:?}",
        agent.leases()
    );
    lab.server.link_del(c.port());
    assert!(
        wait_until(Duration::from_secs(5), || view(&agent, "pod-gone-renew")
            .is_none()),
        "the lease outlived its interface: {:?}",
        agent.leases()
    );
    assert!(
        !record(dir.path(), "pod-gone-renew").exists(),
        "the record of a lease whose interface is gone was kept"
    );
    // The other lease is untouched, and the runtime's DEL still succeeds.
    assert!(view(&agent, "pod-stays").is_some());
    assert!(record(dir.path(), "pod-stays").exists());
    agent
        .post(rpc::PATH_DEL, &req)
        .expect("DEL of an attachment whose interface is gone");
}

#[test]
fn netns_deleted_without_del_keeps_the_lease_until_del_frees_it() {
    let dir = tempfile::tempdir().unwrap();
    let lab = Lab::with_clients(1);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let agent = agent(dir.path());
    let c = &lab.clients[0];
    let req = request(c, "pod-netns");
    let ip = agent.add(&req).expect("ADD").ips[0].address.addr;
    xdhcp_tests::netns::run(
        std::process::Command::new(xdhcp_tests::program("ip")).args(["netns", "del", c.ns.name()]),
    );
    assert!(!c.ns.path().exists());
    // The lease lives on: the agent's sockets hold the namespace, so its
    // veth (and the bridge port) stay.
    std::thread::sleep(Duration::from_secs(1));
    let v = view(&agent, "pod-netns").expect("the lease is still held");
    assert_eq!(v.address.map(|a| a.addr), Some(ip));
    assert!(lab.server.has_link(c.port()));

    // The DEL, with CNI_NETNS already gone: RELEASE, record removed, and
    // the namespace (with its veth) freed.
    let mut del = req.clone();
    del.netns = Some(c.ns.path().to_path_buf());
    agent.post(rpc::PATH_DEL, &del).expect("DEL");
    assert!(view(&agent, "pod-netns").is_none());
    assert!(!record(dir.path(), "pod-netns").exists());
    let mac = format_mac(c.mac);
    assert!(
        wait_until(Duration::from_secs(5), || dnsmasq
            .log()
            .lines()
            .any(|l| l.contains("DHCPRELEASE") && l.contains(&mac))),
        "no RELEASE:\n{}",
        dnsmasq.log()
    );
    assert!(
        wait_until(Duration::from_secs(5), || !lab.server.has_link(c.port())),
        "the agent still holds the deleted namespace (its veth is still there)"
    );
}
