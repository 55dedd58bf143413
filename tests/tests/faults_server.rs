//! Fault: the DHCP server dies mid-DORA, dies mid-renewal, and stays away
//! past the lease's expiry.
//!
//! The agent runs in-process against real servers (dnsmasq, Kea) in network
//! namespaces, with `"apply": true` so what the pod sees can be checked.
//! (The server coming back with an empty lease database, answering the
//! renewal with a NAK, is `servers.rs`'s
//! `{dnsmasq,kea}_nak_after_the_server_forgot_gives_a_fresh_lease`.)

use std::time::{Duration, Instant};

use xdhcp::cli::DatapathChoice;
use xdhcp::cni::types::code;
use xdhcp::rpc::{CniRequest, LeaseView};
use xdhcp_tests::{
    Dnsmasq, DnsmasqConfig, InProcessAgent, Kea, KeaConfig, Lab, LabClient, wait_until,
};

const IPAM: &str = r#"{"type":"xdhcp","apply":true,"timeout":"3s"}"#;

fn request(client: &LabClient, container: &str) -> CniRequest {
    let conf = format!(r#"{{"cniVersion":"1.0.0","name":"net1","type":"bridge","ipam":{IPAM}}}"#);
    xdhcp_tests::cni_request(client, container, "default", &conf)
}

fn view(agent: &InProcessAgent, container: &str) -> Option<LeaseView> {
    agent
        .leases()
        .into_iter()
        .find(|l| l.container_id == container)
}

/// The server answers the DISCOVER, then dies before its ACK reaches the
/// pod: the ADD fails within its timeout with the DHCP code and says it had
/// offers but no ACK; nothing is left in the agent, its state directory or
/// on the pod. The server's own lease for the REQUEST it committed is the
/// one the retried ADD gets back (same client), so nothing is orphaned.
#[test]
fn server_dying_mid_dora_fails_the_add_clearly_and_a_retry_succeeds() {
    let lab = Lab::with_clients(1);
    let mut dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let agent = InProcessAgent::start(DatapathChoice::Afpacket);
    let c = &lab.clients[0];
    let req = request(c, "pod-dora");

    let drop_acks = lab.drop_server_acks();
    let killer = {
        // Kill the server once it has offered (the ACK it sends is dropped).
        let log = dnsmasq.log_file();
        std::thread::spawn(move || {
            wait_until(Duration::from_secs(10), || {
                std::fs::read_to_string(&log).is_ok_and(|l| l.contains("DHCPREQUEST"))
            })
        })
    };
    let t0 = Instant::now();
    let err = agent.add(&req).expect_err("ADD must fail").into_cni();
    let took = t0.elapsed();
    assert!(killer.join().unwrap(), "no REQUEST reached the server");
    dnsmasq.kill();
    drop(drop_acks);
    assert_eq!(err.code, code::DHCP_TIMEOUT, "{err:?}");
    let text = format!("{} {}", err.msg, err.details);
    assert!(text.contains(&c.ifname), "{err:?}");
    assert!(
        text.contains("OFFER") || text.contains("offer"),
        "the error must say what was heard: {err:?}"
    );
    assert!(took < Duration::from_secs(8), "took {took:?}");
    assert!(view(&agent, "pod-dora").is_none(), "{:?}", agent.leases());
    // The record written while the REQUEST was out went with the ADD.
    assert_eq!(agent.record_files(), Vec::<String>::new());
    assert!(c.ns.ipv4_addrs(&c.ifname).is_empty());

    // The server comes back: the retried ADD succeeds, and the server holds
    // exactly the lease the agent holds for this client.
    dnsmasq.restart();
    let ip = agent.add(&req).expect("retried ADD").ips[0].address.addr;
    let held: Vec<_> = dnsmasq
        .leases()
        .into_iter()
        .filter(|l| l.mac == c.mac)
        .map(|l| l.ip)
        .collect();
    assert_eq!(held, vec![ip], "{:?}", dnsmasq.leases());
    assert_eq!(c.ns.ipv4_addrs(&c.ifname), vec![(ip, 24)]);
}

/// The server dies with the lease bound: the renewal at T1 goes unanswered
/// (RENEWING), the lease and its address are kept meanwhile, and once the
/// server is back (its lease file kept) the broadcast REQUEST at T2 binds
/// the same address again. (A RENEWING or REBINDING client retransmits only
/// every half of the remaining time, at least 60 s apart, as RFC 2131 §4.4.5
/// says; so T2 is where a short outage ends.)
#[test]
fn server_dying_mid_renewal_keeps_the_lease_until_it_is_back() {
    const T2: u64 = 12;
    let lab = Lab::with_clients(1);
    let mut dnsmasq = Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            t1_secs: Some(3),
            t2_secs: Some(T2 as u32),
            ..DnsmasqConfig::default()
        },
    );
    let agent = InProcessAgent::start(DatapathChoice::Afpacket);
    let c = &lab.clients[0];
    let req = request(c, "pod-renew");
    let ip = agent.add(&req).expect("ADD").ips[0].address.addr;
    let bound_at = Instant::now();
    dnsmasq.kill();

    // T1: renewing, unanswered; lease and address kept.
    assert!(
        wait_until(Duration::from_secs(T2 - 3), || {
            view(&agent, "pod-renew").is_some_and(|v| v.state == "Renewing")
        }),
        "never renewing: {:?}",
        agent.leases()
    );
    let v = view(&agent, "pod-renew").unwrap();
    assert_eq!(v.address.map(|a| a.addr), Some(ip), "{v:?}");
    assert_eq!(c.ns.ipv4_addrs(&c.ifname), vec![(ip, 24)]);
    assert!(
        bound_at.elapsed() < Duration::from_secs(T2 - 1),
        "test setup: too slow to restart the server before T2"
    );

    dnsmasq.restart();
    assert!(
        wait_until(Duration::from_secs(T2 + 5), || {
            view(&agent, "pod-renew").is_some_and(|v| v.state == "Bound")
        }),
        "not bound again after the server returned: {:?}\n{}",
        agent.leases(),
        dnsmasq.log()
    );
    let v = view(&agent, "pod-renew").unwrap();
    assert_eq!(v.address.map(|a| a.addr), Some(ip), "{v:?}");
    assert_eq!(c.ns.ipv4_addrs(&c.ifname), vec![(ip, 24)]);
    assert_eq!(dnsmasq.lease_for(c.mac).map(|l| l.ip), Some(ip));
}

/// The server is away longer than the lease: at expiry the agent takes the
/// address off the pod interface (the pod must not use an address nobody
/// holds), `xdhcp leases` shows no address, and the agent keeps trying
/// (DISCOVER); when the server is back the pod gets a lease again.
#[test]
fn server_away_past_expiry_removes_the_address_then_reacquires() {
    let lab = Lab::with_clients(1);
    let mut kea = Kea::start(
        &lab.server,
        KeaConfig {
            valid_lifetime: 6,
            renew_timer: 2,
            rebind_timer: 4,
            ..KeaConfig::default()
        },
    );
    let agent = InProcessAgent::start(DatapathChoice::Afpacket);
    let c = &lab.clients[0];
    let req = request(c, "pod-expiry");
    let ip = agent.add(&req).expect("ADD").ips[0].address.addr;
    assert_eq!(c.ns.ipv4_addrs(&c.ifname), vec![(ip, 24)]);
    kea.kill();

    // Kea's 6 s lease is held for the agent's floor of 20 s (its T1 and
    // T2 the floor's defaults, 10 s and 17.5 s).
    assert!(
        wait_until(Duration::from_secs(30), || c
            .ns
            .ipv4_addrs(&c.ifname)
            .is_empty()),
        "the expired address is still on the pod: {:?}",
        c.ns.ipv4_addrs(&c.ifname)
    );
    let v = view(&agent, "pod-expiry").expect("the attachment stays known");
    assert_eq!(v.address, None, "{v:?}");
    assert_ne!(v.state, "Bound", "{v:?}");

    kea.restart();
    assert!(
        wait_until(Duration::from_secs(25), || {
            view(&agent, "pod-expiry").is_some_and(|v| v.state == "Bound" && v.address.is_some())
        }),
        "no new lease after the server returned: {:?}\n{}",
        agent.leases(),
        kea.log()
    );
    let v = view(&agent, "pod-expiry").unwrap();
    let new = v.address.unwrap().addr;
    assert!(
        wait_until(Duration::from_secs(5), || c.ns.ipv4_addrs(&c.ifname)
            == vec![(new, 24)]),
        "{:?}",
        c.ns.ipv4_addrs(&c.ifname)
    );
}
