//! Fault: the eBPF capture path is lost under load. The agent runs
//! in-process against a real dnsmasq with 50 pod leases renewing every 3 s
//! (T1), all served by the eBPF ring buffer (TC on each pod's veth); then
//! the ring reader fails (injected through the test-only socket route).
//! Every lease moves to its own `AF_PACKET` receiver and every one of them
//! completes each renewal that falls due while the path is lost and after it
//! returns: none is missed. (`capture_fallback.rs` covers one lease, and a
//! link detached with `bpftool`.)
//!
//! And the ring buffer full: the reader stalled and one xid owned in the
//! kernel (test-only socket route), replies carrying it flooded to the pod
//! until the kernel has no room for a record; a reply then goes on
//! uncaptured, to the pod's stack. The lease
//! moves to its own `AF_PACKET` receiver, which sees it, and renews while
//! the ring overflows; once the reader has emptied it, back to the ring.

use std::collections::BTreeMap;
use std::time::Duration;

use xdhcp::cli::DatapathChoice;
use xdhcp::rpc::{self, CniRequest};
use xdhcp_tests::bench::{free_local_addr, http_get, metric_count};
use xdhcp_tests::{Dnsmasq, DnsmasqConfig, InProcessAgent, Lab, chaos, wait_until};

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
            "{} of {} leases missed a renewal {what}: {missed:?}",
            missed.len(),
            since.len()
        );
    }
}

#[test]
fn a_failed_ring_reader_under_fifty_renewing_leases_misses_no_renewal() {
    let lab = Lab::with_clients(PODS);
    let _dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::renewing_every(T1 as u32));
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

/// The kernel's count of replies the ring had no room for.
fn ring_full(agent: &InProcessAgent) -> u64 {
    agent
        .status()
        .counters
        .get("kernel.ringbuf_full")
        .copied()
        .unwrap_or(0)
}

#[test]
fn a_full_ring_moves_its_leases_to_af_packet_and_they_renew_while_it_overflows() {
    const JUNK_XID: u32 = 0x5eed_f111;
    let lab = Lab::with_clients(1);
    let _dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::renewing_every(T1 as u32));
    let metrics = free_local_addr();
    let agent = InProcessAgent::start_with(|a| {
        a.datapath = DatapathChoice::Ebpf;
        a.metrics_addr = Some(metrics);
    });
    let conf = r#"{"cniVersion":"1.0.0","name":"net1","type":"bridge","ipam":{"type":"xdhcp","timeout":"20s","apply":true}}"#;
    let req = xdhcp_tests::cni_request(&lab.clients[0], "ring-full", "default", conf);
    agent.add(&req).expect("ADD");
    assert!(
        wait_until(Duration::from_secs(10), || paths(&agent) == ["tc"]),
        "the lease did not move to the ring buffer: {:?}",
        paths(&agent)
    );
    all_renew(&agent, &expiries(&agent), "on the ring buffer");
    let counter = |name: &str, reason: &str| {
        let text = http_get(metrics, "/metrics").unwrap_or_default();
        metric_count(&text, name, &format!("reason=\"{reason}\""))
    };

    // Nothing reads the ring; replies to the pod that carry an xid the
    // kernel owns (the programs copy no other) fill it.
    let stall = |stalled: bool| {
        agent
            .post(
                rpc::PATH_TEST_READER_STALL,
                &rpc::ReaderStall {
                    stalled,
                    owned_xids: vec![JUNK_XID],
                },
            )
            .expect("stall or release the reader");
    };
    stall(true);
    let port = lab.clients[0].port().to_owned();
    let mac = lab.clients[0].mac;
    let before = ring_full(&agent);
    assert!(
        wait_until(Duration::from_secs(10), || {
            chaos::flood_replies_with_xid(Some(lab.server.path()), &port, mac, 2000, JUNK_XID);
            ring_full(&agent) > before
        }),
        "the ring never overflowed: {:?}",
        agent.status().counters
    );
    // The promise: renewals complete while the ring has no room. On the
    // fallback the lease's xids are no longer owned in the kernel, so its
    // replies pass the program uncopied, to its own receiver.
    let uncopied = || {
        agent
            .status()
            .counters
            .get("kernel.unowned_uncaptured")
            .copied()
            .unwrap_or(0)
    };
    let uncopied_at = uncopied();
    all_renew(&agent, &expiries(&agent), "while the ring was full");
    all_renew(
        &agent,
        &expiries(&agent),
        "while the ring was full, second round",
    );
    assert!(
        uncopied() >= uncopied_at + 2,
        "the renewals' replies should have passed the program uncopied: {:?}",
        agent.status().counters
    );
    assert_eq!(paths(&agent), ["af-packet (ebpf lost)"]);
    let s = agent.status();
    assert!(
        s.degraded
            .as_deref()
            .is_some_and(|d| d.contains("overflowed")),
        "{s:?}"
    );
    assert_eq!(counter("xdhcp_capture_lost_total", "ring_full"), 1);

    // The reader reads again: it empties the ring, the leases return.
    stall(false);
    assert!(
        wait_until(Duration::from_secs(10), || paths(&agent) == ["tc"]),
        "the lease did not return to the ring buffer: {:?}",
        agent.status()
    );
    assert!(agent.status().degraded.is_none());
    assert_eq!(counter("xdhcp_capture_restored_total", "ring_full"), 1);
    all_renew(&agent, &expiries(&agent), "back on the ring buffer");
    let _ = agent.post(rpc::PATH_DEL, &req);
}

/// A bpffs of the test's own, mounted on a fresh directory (so the agent
/// pins its maps where the test can reach them), unmounted on drop.
struct Bpffs(tempfile::TempDir);

impl Bpffs {
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("xdt-bpffs-")
            .tempdir()
            .unwrap();
        nix::mount::mount(
            Some("bpf"),
            dir.path(),
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .expect("mount -t bpf (needs root)");
        Self(dir)
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.0.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

/// When the kernel will not own a lease's xid — here its ownership map is
/// full, filled from outside through the pin — the programs pass the
/// lease's replies on uncaptured, and the lease moves to its own
/// `AF_PACKET` receiver before its frame goes out: its renewals complete
/// while the map is full (logged, counted as `xid_unowned`), and once an
/// xid registers again it is back on the ring buffer and renews there.
#[test]
fn a_lease_whose_xid_the_kernel_will_not_own_renews_on_its_own_receiver() {
    const FILLER: u32 = 0xf00d_0000;
    let lab = Lab::with_clients(1);
    let _dnsmasq = Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            t1_secs: Some(T1 as u32),
            t2_secs: Some(100),
            ..DnsmasqConfig::default()
        },
    );
    let bpffs = Bpffs::new();
    let metrics = free_local_addr();
    let agent = InProcessAgent::start_with(|a| {
        a.datapath = DatapathChoice::Ebpf;
        a.metrics_addr = Some(metrics);
        a.bpffs_dir = bpffs.0.path().to_path_buf();
    });
    let conf = r#"{"cniVersion":"1.0.0","name":"net1","type":"bridge","ipam":{"type":"xdhcp","timeout":"20s","apply":true}}"#;
    let req = xdhcp_tests::cni_request(&lab.clients[0], "unowned", "default", conf);
    agent.add(&req).expect("ADD");
    assert!(
        wait_until(Duration::from_secs(10), || paths(&agent) == ["tc"]),
        "the lease did not move to the ring buffer: {:?}",
        paths(&agent)
    );
    all_renew(&agent, &expiries(&agent), "on the ring buffer");
    let counter = |name: &str| {
        let text = http_get(metrics, "/metrics").unwrap_or_default();
        metric_count(&text, name, "reason=\"xid_unowned\"")
    };

    // The ownership map filled to its capacity from outside.
    let data = aya::maps::MapData::from_pin(bpffs.0.path().join(xdhcp_common::MAP_OWNED))
        .expect("the pinned ownership map");
    let mut owned: aya::maps::HashMap<_, u32, xdhcp_common::Owned> =
        aya::maps::HashMap::try_from(aya::maps::Map::HashMap(data)).unwrap();
    let filler = xdhcp_common::Owned {
        ifindex: 0,
        reserved: 0,
    };
    let mut filled = 0u32;
    while owned.insert(FILLER + filled, filler, 0).is_ok() {
        filled += 1;
        assert!(filled <= xdhcp_common::OWNED_CAPACITY, "never full");
    }
    assert!(filled > 0);

    all_renew(&agent, &expiries(&agent), "while the map was full");
    all_renew(
        &agent,
        &expiries(&agent),
        "while the map was full, second round",
    );
    assert_eq!(paths(&agent), ["af-packet (ebpf lost)"]);
    assert!(counter("xdhcp_capture_lost_total") >= 1);

    // Room again: the next xid registers, the lease returns.
    for k in 0..filled {
        let _ = owned.remove(&(FILLER + k));
    }
    all_renew(&agent, &expiries(&agent), "once the map had room");
    assert!(
        wait_until(Duration::from_secs(T1 + 6), || paths(&agent) == ["tc"]),
        "the lease did not return to the ring buffer: {:?}",
        paths(&agent)
    );
    assert!(counter("xdhcp_capture_restored_total") >= 1);
    all_renew(&agent, &expiries(&agent), "back on the ring buffer");
    let _ = agent.post(rpc::PATH_DEL, &req);
}
