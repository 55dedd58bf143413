//! Fault: the agent is killed (`SIGKILL`) in the middle of a burst of 100 ADDs.
//!
//! The `xdhcp agent` binary runs as a child process against a real dnsmasq;
//! 100 ADDs are posted to its socket at once and the agent is killed with
//! SIGKILL once some have answered, then started again on the same state
//! directory. Then:
//! - every ADD that returned success has a durable record: the restarted
//!   agent holds it with the same address (at once, or, answered while the
//!   full record was being written, after asking for the address the record
//!   written ahead names: INIT-REBOOT), and keeps renewing it;
//! - every other ADD failed with a CNI error (the agent went away), and the
//!   runtime's retry of it succeeds;
//! - no orphan lease is left at the server: once settled, dnsmasq's lease
//!   file holds exactly the leases the agent holds (an exchange the kill
//!   interrupted left the server a lease for the pod's MAC; the retried ADD,
//!   same client, is given that same lease back).

mod agent_support;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use agent_support::AgentProcess;
use xdhcp::rpc::{self, Client, ClientError, CniRequest, CniResult, LeaseView};
use xdhcp_tests::{Dnsmasq, DnsmasqConfig, Lab, format_mac, wait_until};

const PODS: usize = 100;
const T1: u32 = 4;

fn request(lab: &Lab, i: usize) -> CniRequest {
    let conf = r#"{"cniVersion":"1.0.0","name":"net1","type":"bridge","ipam":{"type":"xdhcp","apply":true,"timeout":"20s"}}"#;
    xdhcp_tests::cni_request(&lab.clients[i], &format!("burst-{i}"), "default", conf)
}

fn leases(socket: &std::path::Path) -> Vec<LeaseView> {
    Client::new(socket, Duration::from_secs(30))
        .get(rpc::PATH_LEASES)
        .expect("lease table")
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario: burst, kill, restart, then each promise checked"
)]
fn sigkill_mid_burst_loses_no_answered_add_and_leaves_no_orphan() {
    let lab = Lab::with_clients(PODS);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::renewing_every(T1));
    let mut agent = AgentProcess::start(&["--datapath", "afpacket"]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    // The burst, in the background; the kill lands once a fifth answered.
    let answered = Arc::new(AtomicUsize::new(0));
    let socket = agent.socket.clone();
    let reqs: Vec<CniRequest> = (0..PODS).map(|i| request(&lab, i)).collect();
    let burst = {
        let answered = answered.clone();
        let reqs = reqs.clone();
        rt.spawn(async move {
            let mut set = tokio::task::JoinSet::new();
            for (i, req) in reqs.into_iter().enumerate() {
                let socket = socket.clone();
                let answered = answered.clone();
                set.spawn_blocking(move || {
                    let r: Result<CniResult, ClientError> =
                        Client::new(&socket, Duration::from_secs(40)).post(rpc::PATH_ADD, &req);
                    if r.is_ok() {
                        answered.fetch_add(1, Ordering::SeqCst);
                    }
                    (i, r)
                });
            }
            let mut out = BTreeMap::new();
            while let Some(j) = set.join_next().await {
                let (i, r) = j.expect("ADD task");
                out.insert(i, r);
            }
            out
        })
    };
    assert!(
        wait_until(Duration::from_mins(1), || answered.load(Ordering::SeqCst)
            >= PODS / 5),
        "the burst never got going:\n{}",
        agent.log()
    );
    agent.process.kill();
    let results = rt.block_on(burst).expect("burst");
    let ok: BTreeMap<usize, Ipv4Addr> = results
        .iter()
        .filter_map(|(i, r)| r.as_ref().ok().map(|r| (*i, r.ips[0].address.addr)))
        .collect();
    let failed: Vec<(usize, String)> = results
        .into_iter()
        .filter_map(|(i, r)| r.err().map(|e| (i, format!("{:?}", e.into_cni()))))
        .collect();
    assert!(
        !failed.is_empty(),
        "the kill came after the whole burst had answered; nothing was interrupted"
    );
    for (i, e) in &failed {
        assert!(
            e.contains("agent"),
            "ADD burst-{i} failed without saying the agent went away: {e}"
        );
    }

    // Restart on the same state dir. Every answered ADD has its record at
    // once; one answered while its full record was still being written
    // (the record written ahead names the address its REQUEST was out for)
    // asks for that address again (INIT-REBOOT) and holds it moments later.
    let restarted = Instant::now();
    agent.kill_and_restart();
    let held = || -> BTreeMap<String, Option<Ipv4Addr>> {
        leases(&agent.socket)
            .into_iter()
            .map(|l| (l.container_id, l.address.map(|a| a.addr)))
            .collect()
    };
    let at_restart = held();
    for i in ok.keys() {
        assert!(
            at_restart.contains_key(&format!("burst-{i}")),
            "ADD burst-{i} answered but the restarted agent has no record of it: {at_restart:?}"
        );
    }
    let all_held = |h: &BTreeMap<String, Option<Ipv4Addr>>| {
        ok.iter()
            .all(|(i, ip)| h.get(&format!("burst-{i}")) == Some(&Some(*ip)))
    };
    assert!(
        wait_until(Duration::from_secs(15), || all_held(&held())),
        "an answered ADD's address is not held by the restarted agent: answered {ok:?}, held {:?}\n{}",
        held(),
        agent.log()
    );

    // The runtime retries every failed ADD: each succeeds.
    for (i, _) in &failed {
        let r: CniResult = Client::new(&agent.socket, Duration::from_secs(40))
            .post(rpc::PATH_ADD, &reqs[*i])
            .unwrap_or_else(|e| {
                panic!("retried ADD burst-{i}: {:?}\n{}", e.into_cni(), agent.log())
            });
        let c = &lab.clients[*i];
        assert_eq!(
            c.ns.ipv4_addrs(&c.ifname),
            vec![(r.ips[0].address.addr, 24)]
        );
    }

    // Every lease answered before the kill renews after the restart.
    let acks = |mac: [u8; 6]| {
        let mac = format_mac(mac);
        dnsmasq
            .log()
            .lines()
            .filter(|l| l.contains("DHCPACK") && l.contains(&mac))
            .count()
    };
    let before: Vec<(usize, usize)> = ok.keys().map(|i| (*i, acks(lab.clients[*i].mac))).collect();
    let renewed = wait_until(Duration::from_secs(u64::from(T1) * 3 + 10), || {
        before.iter().all(|(i, n)| acks(lab.clients[*i].mac) > *n)
    });
    assert!(
        renewed,
        "not every answered lease renewed after the restart ({:?} since)",
        restarted.elapsed()
    );

    // No orphan: the server's leases are exactly the agent's.
    let agent_side: BTreeMap<String, Ipv4Addr> = leases(&agent.socket)
        .into_iter()
        .filter_map(|l| l.address.map(|a| (l.mac.to_ascii_lowercase(), a.addr)))
        .collect();
    assert_eq!(agent_side.len(), PODS, "{agent_side:?}");
    // The server's file is read whole only between its rewrites (a renewal
    // every few seconds rewrites it): compare until a read agrees.
    let server_side = || -> BTreeMap<String, Ipv4Addr> {
        dnsmasq
            .leases()
            .into_iter()
            .map(|l| (format_mac(l.mac), l.ip))
            .collect()
    };
    wait_until(Duration::from_secs(5), || server_side() == agent_side);
    assert_eq!(
        server_side(),
        agent_side,
        "the server holds leases the agent does not know (or the reverse)"
    );
}

/// A burst of ADDs, the agent killed (`SIGKILL`) the moment the last one answered
/// (the full records of the last leases are then still being written, in
/// one batch with their neighbours'): every answered ADD already has a
/// record on disk naming its address (the full lease, or the address its
/// REQUEST was out for), and the restarted agent holds every one of them at
/// the same address.
#[test]
fn sigkill_right_after_a_burst_answered_keeps_every_answered_lease() {
    const BURST: usize = 10;
    let lab = Lab::with_clients(BURST);
    let _dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let mut agent = AgentProcess::start(&["--datapath", "afpacket"]);
    let (answered_tx, answered) = std::sync::mpsc::channel();
    let adds: Vec<_> = (0..BURST)
        .map(|i| {
            let (socket, req, tx) = (agent.socket.clone(), request(&lab, i), answered_tx.clone());
            std::thread::spawn(move || {
                let r: Result<CniResult, ClientError> =
                    Client::new(&socket, Duration::from_secs(40)).post(rpc::PATH_ADD, &req);
                let _ = tx.send((i, r.map(|r| r.ips[0].address.addr)));
            })
        })
        .collect();
    let mut ok = BTreeMap::new();
    for _ in 0..BURST {
        let (i, r) = answered.recv().expect("an ADD's answer");
        let addr =
            r.unwrap_or_else(|e| panic!("ADD burst-{i}: {:?}\n{}", e.into_cni(), agent.log()));
        ok.insert(i, addr);
    }
    // At once: the kill lands while the last records are being written.
    agent.process.kill();
    for a in adds {
        a.join().expect("ADD thread");
    }

    // On disk, before anything starts again: a record per answered ADD,
    // naming its address.
    let on_disk: BTreeMap<String, Ipv4Addr> =
        xdhcp_tests::agent::lease_record_files(&agent.state_dir)
            .into_iter()
            .filter_map(|f| {
                let v: serde_json::Value = serde_json::from_slice(&std::fs::read(f).ok()?).ok()?;
                let addr = v["lease"]["address"].as_str().or(v["requested"].as_str())?;
                Some((v["containerId"].as_str()?.to_owned(), addr.parse().ok()?))
            })
            .collect();
    for (i, addr) in &ok {
        assert_eq!(
            on_disk.get(&format!("burst-{i}")),
            Some(addr),
            "ADD burst-{i} answered {addr} but its record does not name it: {on_disk:?}"
        );
    }

    // The restarted agent holds every answered lease, same address.
    agent.kill_and_restart();
    let held = || -> BTreeMap<String, Option<Ipv4Addr>> {
        leases(&agent.socket)
            .into_iter()
            .map(|l| (l.container_id, l.address.map(|a| a.addr)))
            .collect()
    };
    assert!(
        wait_until(Duration::from_secs(15), || {
            let h = held();
            ok.iter()
                .all(|(i, ip)| h.get(&format!("burst-{i}")) == Some(&Some(*ip)))
        }),
        "an answered ADD's address is not held after the restart: answered {ok:?}, held {:?}\n{}",
        held(),
        agent.log()
    );
}
