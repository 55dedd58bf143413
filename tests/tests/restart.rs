//! Agent restart: an `xdhcp agent` process is killed (`SIGKILL`) and started again
//! on the same state dir; every lease is resumed from the store and renewed
//! afterwards without a new DISCOVER (upstream loses them all).

mod agent_support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use agent_support::{AgentProcess, CniPath, xdhcp_bin};
use xdhcp_tests::{Dnsmasq, DnsmasqConfig, Lab, format_mac, wait_until};

/// How many of dnsmasq's log lines name `what` (a message type) for each MAC.
fn per_mac(dnsmasq: &Dnsmasq, what: &str, macs: &[String]) -> Vec<usize> {
    let log = dnsmasq.log();
    macs.iter()
        .map(|m| {
            log.lines()
                .filter(|l| l.contains(what) && l.contains(m.as_str()))
                .count()
        })
        .collect()
}

/// The MACs without a DHCPACK beyond `acks_before` after waiting up to
/// `within` (empty once every one has one).
fn not_renewed_within(
    dnsmasq: &Dnsmasq,
    macs: &[String],
    acks_before: &[usize],
    within: Duration,
) -> Vec<String> {
    let late = || -> Vec<String> {
        let now = per_mac(dnsmasq, "DHCPACK", macs);
        macs.iter()
            .zip(acks_before.iter().zip(now))
            .filter(|(_, (before, now))| now <= *before)
            .map(|(m, _)| m.clone())
            .collect()
    };
    wait_until(within, || late().is_empty());
    late()
}

/// ADD every lab client through the plugin, as pod0, pod1, …
fn add_every_pod(cni: &CniPath, agent: &AgentProcess, lab: &Lab) {
    let conf = format!(
        r#"{{"cniVersion":"1.0.0","name":"xnet","ipam":{{"type":"xdhcp","socketPath":"{}"}}}}"#,
        agent.socket.display()
    );
    for (i, c) in lab.clients.iter().enumerate() {
        let r = cni.xdhcp("ADD", &format!("pod{i}"), c, &conf);
        assert!(r.ok, "ADD pod{i}: {}\n{}", r.stdout, agent.log());
    }
}

#[test]
fn sigkill_and_restart_keeps_renewing_without_discover() {
    let cni = CniPath::new();
    let mut agent = AgentProcess::start(&[]);
    let lab = Lab::with_clients(3);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::renewing_every(4));
    add_every_pod(&cni, &agent, &lab);
    let macs: Vec<String> = lab.clients.iter().map(|c| format_mac(c.mac)).collect();
    let discovers = per_mac(&dnsmasq, "DHCPDISCOVER", &macs);
    assert!(discovers.iter().all(|d| *d >= 1), "{}", dnsmasq.log());

    agent.kill_and_restart();
    let acks_at_restart = per_mac(&dnsmasq, "DHCPACK", &macs);
    assert!(
        agent.log().contains("resuming lease without DISCOVER"),
        "{}",
        agent.log()
    );
    // Every lease renews (T1 = 4 s) after the restart.
    let late = not_renewed_within(&dnsmasq, &macs, &acks_at_restart, Duration::from_secs(20));
    assert!(
        late.is_empty(),
        "not every lease renewed after restart:\n{}",
        dnsmasq.log()
    );
    let after = per_mac(&dnsmasq, "DHCPDISCOVER", &macs);
    assert_eq!(after, discovers, "a DISCOVER was sent after the restart");
    let table = agent.cli("leases", false);
    assert_eq!(table.lines().count(), 4, "{table}");
    for c in &lab.clients {
        let l = dnsmasq.lease_for(c.mac).expect("lease still held");
        assert!(table.contains(&l.ip.to_string()), "{table}");
    }

    // SIGTERM: the agent persists and stops without releasing anything; the
    // next agent resumes every lease.
    let releases = dnsmasq.count_in_log("DHCPRELEASE");
    assert!(
        agent.process.stop(Duration::from_secs(15)),
        "the agent did not exit on SIGTERM:\n{}",
        agent.log()
    );
    assert_eq!(
        dnsmasq.count_in_log("DHCPRELEASE"),
        releases,
        "SIGTERM released a lease"
    );
    assert!(agent.log().contains("SIGTERM"), "{}", agent.log());
    agent.kill_and_restart();
    let table = agent.cli("leases", false);
    assert_eq!(table.lines().count(), 4, "{table}");
    for c in &lab.clients {
        assert!(
            dnsmasq.lease_for(c.mac).is_some(),
            "lease dropped by the server"
        );
    }
}

/// Leases whose T1 passed while the agent was down renew right after the
/// restart, spread over the T1 fuzz window: not one retransmission period
/// (at least 60 s in RENEWING) later, and without a DISCOVER.
#[test]
fn leases_whose_t1_passed_while_down_renew_right_after_the_restart() {
    let cni = CniPath::new();
    let mut agent = AgentProcess::start(&[]);
    let pods = std::env::var("XDHCP_RESTART_T1_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let lab = Lab::with_clients(pods);
    let dnsmasq = Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            lease_secs: 600,
            t1_secs: Some(3),
            t2_secs: Some(500),
            ..DnsmasqConfig::default()
        },
    );
    add_every_pod(&cni, &agent, &lab);
    let macs: Vec<String> = lab.clients.iter().map(|c| format_mac(c.mac)).collect();
    let discovers = per_mac(&dnsmasq, "DHCPDISCOVER", &macs);
    // The addresses on the pods, as the main plugin puts them: the server
    // answers a renewal at the leased address, and must resolve it by ARP
    // once the entry its first ACK left behind has gone stale.
    let placed = xdhcp_tests::bench::configure_leased(&lab.clients, &dnsmasq.leases(), 24);
    assert_eq!(placed, pods, "a lease missing at the server");
    // Stopped once before T1 (as an upgrade would), then down across every
    // lease's T1 (3 s after its ACK).
    assert!(
        agent.process.stop(Duration::from_secs(15)),
        "{}",
        agent.log()
    );
    agent.kill_and_restart();
    agent.kill_and_restart_after(Duration::from_secs(5));
    let acks_at_restart = per_mac(&dnsmasq, "DHCPACK", &macs);
    // The fuzz window is 5 % of T1; well within 10 s, far from 60.
    let late = not_renewed_within(&dnsmasq, &macs, &acks_at_restart, Duration::from_secs(10));
    assert!(
        late.is_empty(),
        "{} of {} leases past T1 did not renew within 10 s of the restart: {late:?}\n{}\n{}",
        late.len(),
        macs.len(),
        agent.log(),
        dnsmasq.log()
    );
    let after = per_mac(&dnsmasq, "DHCPDISCOVER", &macs);
    assert_eq!(after, discovers, "a DISCOVER was sent after the restart");
}

/// The only lease record in `state_dir`, as JSON, once there is one.
fn the_record(state_dir: &std::path::Path) -> Option<serde_json::Value> {
    let file = xdhcp_tests::agent::lease_record_files(state_dir).pop()?;
    serde_json::from_slice(&std::fs::read(file).ok()?).ok()
}

/// While an ADD's first REQUEST is out, its record is already on disk and
/// names the offered address (so the ADD does not wait for the disk after
/// the ACK). Killed right then (the server's ACK never leaves it), the agent
/// comes back, asks for that address again (INIT-REBOOT, no DISCOVER), and
/// holds the lease the server committed, its record now the full lease.
#[test]
fn a_kill_while_the_first_request_is_out_resumes_by_asking_for_the_offered_address() {
    let cni = CniPath::new();
    let mut agent = AgentProcess::start(&[]);
    let lab = Lab::with_clients(1);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let c = &lab.clients[0];
    let mac = format_mac(c.mac);
    let conf = format!(
        r#"{{"cniVersion":"1.0.0","name":"xnet","ipam":{{"type":"xdhcp","socketPath":"{}","timeout":"30s"}}}}"#,
        agent.socket.display()
    );
    let acks = lab.drop_server_acks();
    let (offered, add) = std::thread::scope(|s| {
        let add = s.spawn(|| cni.xdhcp("ADD", "pod0", c, &conf));
        let mut offered = None;
        wait_until(Duration::from_secs(15), || {
            offered = the_record(&agent.state_dir)
                .and_then(|r| r["requested"].as_str().map(str::to_owned));
            offered.is_some()
        });
        let offered = offered.unwrap_or_else(|| {
            panic!(
                "no record naming the requested address while the REQUEST was out\n{}\n{}",
                agent.log(),
                dnsmasq.log()
            )
        });
        let record = the_record(&agent.state_dir).expect("the record");
        assert!(record["lease"].is_null(), "{record}");
        agent.kill_and_restart();
        (offered, add.join().expect("the ADD thread"))
    });
    assert!(!add.ok, "the ADD answered though its agent was killed");
    assert!(
        dnsmasq
            .log()
            .lines()
            .any(|l| l.contains("DHCPOFFER") && l.contains(&offered) && l.contains(&mac)),
        "{offered} was not this client's offer:\n{}",
        dnsmasq.log()
    );
    let discovers = per_mac(&dnsmasq, "DHCPDISCOVER", std::slice::from_ref(&mac));
    drop(acks);

    let held = || {
        let table: Vec<serde_json::Value> =
            serde_json::from_str(&agent.cli("leases", true)).expect("lease table");
        table
            .iter()
            .find(|v| v["containerId"] == "pod0")
            .and_then(|v| v["address"].as_str().map(str::to_owned))
    };
    assert!(
        wait_until(Duration::from_secs(20), || held().is_some()),
        "the restarted agent holds no lease for pod0:\n{}\n{}",
        agent.log(),
        dnsmasq.log()
    );
    assert_eq!(held(), Some(format!("{offered}/24")));
    assert!(
        agent
            .log()
            .contains("resuming an acquisition whose REQUEST was out"),
        "{}",
        agent.log()
    );
    assert_eq!(
        per_mac(&dnsmasq, "DHCPDISCOVER", std::slice::from_ref(&mac)),
        discovers,
        "the restarted agent sent a DISCOVER:\n{}",
        dnsmasq.log()
    );
    assert_eq!(
        dnsmasq.lease_for(c.mac).map(|l| l.ip.to_string()),
        Some(offered.clone())
    );
    assert!(
        wait_until(Duration::from_secs(5), || {
            the_record(&agent.state_dir).is_some_and(|r| {
                r["lease"]["address"] == offered.as_str() && r.get("requested").is_none()
            })
        }),
        "the record does not hold the lease: {:?}",
        the_record(&agent.state_dir)
    );
}

/// An ADD's address goes on the pod interface once the record naming it
/// is in place: the one written while its REQUEST was out, which names the
/// address and not yet the lease (the full record follows the ADD's
/// answer). Killed between the two, the agent leaves an ADD the runtime
/// DELs, and a record that names only the requested address. The restarted
/// agent's DEL takes that address off even though its own request for it
/// is still unanswered: the runtime's next ADD on the interface finds it
/// carrying nothing else, and that ADD's DEL takes its own address off.
#[test]
fn a_del_after_a_kill_before_the_full_record_takes_the_configured_address_off() {
    let cni = CniPath::new();
    // The full record held back long enough to kill the agent in between.
    let mut agent =
        AgentProcess::start_with_env(&[], &[("XDHCP_TEST_FULL_RECORD_DELAY_MS", "60000")]);
    let lab = Lab::with_clients(1);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let c = &lab.clients[0];
    let conf = format!(
        r#"{{"cniVersion":"1.0.0","name":"xnet","ipam":{{"type":"xdhcp","socketPath":"{}","apply":true,"timeout":"30s"}}}}"#,
        agent.socket.display()
    );
    let cni_call = |cmd: &str, id: &str| cni.xdhcp(cmd, id, c, &conf);
    let first = cni_call("ADD", "pod0");
    assert!(first.ok, "ADD pod0: {}\n{}", first.stdout, agent.log());
    let answered = |out: &xdhcp_tests::PluginOutput| -> std::net::Ipv4Addr {
        let cidr = out.json["ips"][0]["address"].as_str().expect("an address");
        cidr.split('/')
            .next()
            .unwrap()
            .parse()
            .expect("an IPv4 address")
    };
    let address = answered(&first);
    assert_eq!(c.ns.ipv4_addrs(&c.ifname), vec![(address, 24)]);
    let record = the_record(&agent.state_dir).expect("the record");
    assert!(
        record["lease"].is_null() && record["requested"] == address.to_string().as_str(),
        "the record is not the one written ahead: {record}"
    );
    // It names the server the REQUEST went to, which acknowledged it.
    assert_eq!(
        record["requestedFrom"],
        lab.server_ip.to_string().as_str(),
        "{record}"
    );
    let held = || dnsmasq.leases().iter().any(|l| l.ip == address);
    assert!(held(), "dnsmasq holds no lease for {address}");

    // Killed there. The restarted agent asks for the address again; its
    // ACK never comes, so the DEL finds the request still out.
    let acks = lab.drop_server_acks();
    agent.kill_and_restart();
    let del = cni_call("DEL", "pod0");
    assert!(del.ok, "DEL pod0: {}\n{}", del.stdout, agent.log());
    assert_eq!(
        c.ns.ipv4_addrs(&c.ifname),
        vec![],
        "the DEL left the address the killed agent configured:\n{}",
        agent.log()
    );
    assert!(
        agent
            .log()
            .contains("took off the address a previous agent configured"),
        "{}",
        agent.log()
    );
    // And gave it back to the server, which had committed it to the ACK
    // the killed agent heard: without the RELEASE it would hold it to
    // the lease's end.
    assert!(
        wait_until(Duration::from_secs(5), || !held()),
        "dnsmasq still holds {address} after the DEL:\n{}\nagent:\n{}",
        dnsmasq.log(),
        agent.log()
    );
    assert!(dnsmasq.log().contains("DHCPRELEASE"), "{}", dnsmasq.log());
    drop(acks);

    let next = cni_call("ADD", "pod1");
    assert!(next.ok, "ADD pod1: {}\n{}", next.stdout, agent.log());
    assert_eq!(c.ns.ipv4_addrs(&c.ifname), vec![(answered(&next), 24)]);
    // Its DEL takes its lease's address off, as every DEL does.
    assert!(cni_call("DEL", "pod1").ok, "DEL pod1\n{}", agent.log());
    assert_eq!(c.ns.ipv4_addrs(&c.ifname), vec![]);
}

/// The agent's pinned links (`links/` under its pin directory): pin name →
/// link id, read through each pin.
fn pinned_links(pin_dir: &Path) -> BTreeMap<String, u32> {
    let Ok(entries) = std::fs::read_dir(pin_dir.join("links")) else {
        return BTreeMap::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let link: aya::programs::links::FdLink =
                aya::programs::links::PinnedLink::from_pin(e.path())
                    .ok()?
                    .into();
            Some((
                e.file_name().to_string_lossy().into_owned(),
                link.info().ok()?.id(),
            ))
        })
        .collect()
}

fn link_exists(id: u32) -> bool {
    aya::programs::loaded_links()
        .filter_map(Result::ok)
        .any(|l| l.id() == id)
}

/// The programs attached at tcx ingress of `ifname` in `ns` (the pods'
/// veths get the capture there).
fn capture_programs(ns: &xdhcp_tests::NetNs, ifname: &str) -> usize {
    let ifname = ifname.to_owned();
    ns.run_in(move || {
        let (_, progs) = aya::programs::SchedClassifier::query_tcx(
            &ifname,
            aya::programs::tc::TcAttachType::Ingress,
        )
        .unwrap_or_else(|e| panic!("query tcx on {ifname}: {e}"));
        progs.len()
    })
}

/// With its pin directory on a bpffs, the agent pins one link per pod
/// interface. Stopped with SIGTERM, it leaves them attached; the next agent
/// takes each over as its lease resumes (the same link ids, one program per
/// interface, no second attach) and the leases renew on them; after a
/// SIGKILL, likewise; each restarted agent takes its programs from the pins
/// the first one left (no load, no verifier). `xdhcp unpin` then removes
/// every pin (programs too), which detaches the links. Without the pinning, the ids would change at each restart
/// (the links die with the process).
#[test]
fn a_restarted_agent_takes_over_its_pinned_links_and_unpin_removes_them() {
    let cni = CniPath::new();
    let mut agent = AgentProcess::start_pinned(&[]);
    let lab = Lab::with_clients(2);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::renewing_every(4));
    add_every_pod(&cni, &agent, &lab);
    let macs: Vec<String> = lab.clients.iter().map(|c| format_mac(c.mac)).collect();
    let pin_dir = agent.pin_dir();
    // Each lease moves to the ring a little after its ADD: one link each.
    assert!(
        wait_until(Duration::from_secs(15), || pinned_links(&pin_dir).len()
            == 2),
        "{:?}\n{}",
        pinned_links(&pin_dir),
        agent.log()
    );
    let before = pinned_links(&pin_dir);
    let took_over = |agent: &AgentProcess| {
        agent
            .log()
            .matches("took over the link a previous agent pinned")
            .count()
    };

    for (round, how) in ["SIGTERM", "SIGKILL"].into_iter().enumerate() {
        if how == "SIGTERM" {
            assert!(
                agent.process.stop(Duration::from_secs(15)),
                "{}",
                agent.log()
            );
        }
        // Nothing detached while no agent runs.
        assert_eq!(pinned_links(&pin_dir), before, "after {how}");
        agent.kill_and_restart();
        assert!(
            wait_until(Duration::from_secs(15), || took_over(&agent)
                == 2 * (round + 1)),
            "after {how}, not every link was taken over:\n{}",
            agent.log()
        );
        assert_eq!(pinned_links(&pin_dir), before, "the same links after {how}");
        // The same build: its programs come from their pins, not the
        // verifier.
        assert_eq!(
            agent
                .log()
                .matches("eBPF programs of this build taken from their pins")
                .count(),
            round + 1,
            "after {how}:\n{}",
            agent.log()
        );
        for c in &lab.clients {
            assert_eq!(
                capture_programs(&c.ns, &c.ifname),
                1,
                "one capture program on {} after {how}",
                c.ifname
            );
        }
        let acks = per_mac(&dnsmasq, "DHCPACK", &macs);
        let late = not_renewed_within(&dnsmasq, &macs, &acks, Duration::from_secs(15));
        assert!(
            late.is_empty(),
            "{late:?} did not renew after {how}:\n{}",
            agent.log()
        );
    }

    // Uninstalled: the agent stops for good and its pins go.
    assert!(agent.process.stop(Duration::from_secs(15)));
    assert_eq!(pinned_links(&pin_dir), before, "SIGTERM leaves the pins");
    let out = std::process::Command::new(xdhcp_bin())
        .arg("unpin")
        .arg("--bpffs-dir")
        .arg(&pin_dir)
        .env_remove("CNI_COMMAND")
        .output()
        .expect("run xdhcp unpin");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The directory is the mount point here, so it stays, with the files
    // every bpffs root has.
    let left: Vec<_> = std::fs::read_dir(&pin_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "maps.debug" && n != "progs.debug")
        .collect();
    assert!(left.is_empty(), "pins left after unpin: {left:?}");
    // `unpin` detaches each link before it drops its pin: no capture
    // program is left the moment it returns (the pin's removal alone
    // would take it off later, from a kernel work queue).
    for c in &lab.clients {
        assert_eq!(
            capture_programs(&c.ns, &c.ifname),
            0,
            "a capture program is still on {} when unpin returned",
            c.ifname
        );
    }
    // The links themselves are freed by that work queue.
    for id in before.values() {
        assert!(
            wait_until(Duration::from_secs(5), || !link_exists(*id)),
            "link {id} still exists after unpin"
        );
    }
}

/// A pinned link detached from outside (`bpftool link detach`) while its
/// agent runs is attached again and pinned again: afterwards the pin names
/// a link on the interface, never the dead one (which goes with its pin),
/// and the lease renews through it.
#[test]
fn a_pinned_link_detached_from_outside_is_attached_and_pinned_again() {
    let cni = CniPath::new();
    let agent = AgentProcess::start_pinned(&[]);
    let lab = Lab::with_clients(1);
    let dnsmasq = Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            t1_secs: Some(4),
            t2_secs: Some(100),
            ..DnsmasqConfig::default()
        },
    );
    add_every_pod(&cni, &agent, &lab);
    let pin_dir = agent.pin_dir();
    let c = &lab.clients[0];
    let on_port =
        || xdhcp_tests::chaos::tcx_links(Some(c.ns.path()), &c.ifname).unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(15), || pinned_links(&pin_dir).len()
            == 1),
        "{}",
        agent.log()
    );
    let (pin, old) = pinned_links(&pin_dir).into_iter().next().expect("the pin");
    assert_eq!(on_port(), [old], "the pinned link is the one on the port");

    xdhcp_tests::chaos::detach_link(old);
    assert!(
        wait_until(Duration::from_secs(30), || pinned_links(&pin_dir)
            .get(&pin)
            .is_some_and(|id| *id != old && on_port() == [*id])),
        "the pin does not name a link on the port: {:?} on the port {:?}\n{}",
        pinned_links(&pin_dir),
        on_port(),
        agent.log()
    );
    assert!(!link_exists(old), "the detached link lingers");
    assert_eq!(capture_programs(&c.ns, &c.ifname), 1);
    let macs = [format_mac(c.mac)];
    let acks = per_mac(&dnsmasq, "DHCPACK", &macs);
    let late = not_renewed_within(&dnsmasq, &macs, &acks, Duration::from_secs(15));
    assert!(
        late.is_empty(),
        "no renewal on the new link:\n{}",
        agent.log()
    );
}

/// The xids of the DHCPREQUESTs from `mac` in dnsmasq's log (`--log-dhcp`
/// puts each message's xid, in decimal, first).
fn requests_from(dnsmasq: &Dnsmasq, mac: &str) -> Vec<u32> {
    dnsmasq
        .log()
        .lines()
        .filter(|l| l.contains("DHCPREQUEST(") && l.contains(mac))
        .filter_map(|l| {
            l.split_once("]: ")?
                .1
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// The state of the only lease, as `xdhcp leases` shows it.
fn lease_state(agent: &AgentProcess) -> Option<String> {
    let table: Vec<serde_json::Value> = serde_json::from_str(&agent.cli("leases", true)).ok()?;
    table.first()?["state"].as_str().map(str::to_owned)
}

/// A renewal out when the agent stops: the server's ACK arrives while no
/// agent runs (dnsmasq held with SIGSTOP until the agent is gone, then let
/// go), is kept from the pod by the pinned link and stays in the pinned
/// ring. The next agent adopts the transaction (the xid it finds owned in
/// the pinned map is the one the record planned for that renewal) and
/// that very ACK renews the lease: the server sees no other REQUEST. After
/// SIGTERM, then after SIGKILL. Without the adoption, the next agent would
/// renew with a REQUEST of its own (a new xid) and drop the kept ACK as
/// unrouted.
#[test]
fn a_reply_that_arrives_while_no_agent_runs_completes_the_renewal_it_answers() {
    use nix::sys::signal::Signal;
    let cni = CniPath::new();
    let mut agent = AgentProcess::start_pinned(&[]);
    let lab = Lab::with_clients(1);
    let dnsmasq = Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            lease_secs: 600,
            t1_secs: Some(4),
            t2_secs: Some(500),
            ..DnsmasqConfig::default()
        },
    );
    add_every_pod(&cni, &agent, &lab);
    // The server answers a renewal at the leased address (ARP).
    let placed = xdhcp_tests::bench::configure_leased(&lab.clients, &dnsmasq.leases(), 24);
    assert_eq!(placed, 1);
    let mac = format_mac(lab.clients[0].mac);
    let pin_dir = agent.pin_dir();
    assert!(
        wait_until(Duration::from_secs(15), || pinned_links(&pin_dir).len()
            == 1),
        "the lease never moved to the ring:\n{}",
        agent.log()
    );
    for (round, how) in ["SIGTERM", "SIGKILL"].into_iter().enumerate() {
        let ctx =
            |agent: &AgentProcess| format!("after {how}:\n{}\n{}", agent.log(), dnsmasq.log());
        dnsmasq.signal(Signal::SIGSTOP);
        let before = requests_from(&dnsmasq, &mac);
        // T1 = 4 s: the renewal goes out into the stopped server's queue.
        let renewing = wait_until(Duration::from_secs(10), || {
            lease_state(&agent).as_deref() == Some("Renewing")
        });
        if !renewing {
            dnsmasq.signal(Signal::SIGCONT);
            panic!("no renewal out {}", ctx(&agent));
        }
        std::thread::sleep(Duration::from_millis(300));
        if how == "SIGTERM" {
            assert!(
                agent.process.stop(Duration::from_secs(15)),
                "{}",
                ctx(&agent)
            );
        } else {
            agent.process.kill();
        }
        dnsmasq.signal(Signal::SIGCONT);
        // The server answers the REQUEST it had queued: the first agent's.
        let mut sent = Vec::new();
        assert!(
            wait_until(Duration::from_secs(10), || {
                sent = requests_from(&dnsmasq, &mac)[before.len()..].to_vec();
                !sent.is_empty()
                    && dnsmasq
                        .log()
                        .lines()
                        .any(|l| l.contains("DHCPACK(") && l.contains(&sent[0].to_string()))
            }),
            "the server never answered the queued REQUEST {}",
            ctx(&agent)
        );
        assert_eq!(sent.len(), 1, "{}", ctx(&agent));
        let xid = sent[0];
        // The ACK is in the ring (kept from the pod) before anyone reads it.
        std::thread::sleep(Duration::from_millis(300));
        agent.start_again();
        let renewed_by_it = format!("xid={xid} renewed");
        let renewed = |agent: &AgentProcess| {
            agent
                .log()
                .lines()
                .filter(|l| l.contains("renewed") && l.contains(&format!("xid={xid}")))
                .count()
        };
        assert!(
            wait_until(Duration::from_secs(5), || renewed(&agent) >= 1),
            "the restarted agent did not renew on the kept ACK ({renewed_by_it}) {}",
            ctx(&agent)
        );
        assert_eq!(
            agent
                .log()
                .matches("adopted the previous agent's transaction in flight")
                .count(),
            round + 1,
            "{}",
            ctx(&agent)
        );
        // No other REQUEST: not a retransmission, not a renewal of its own.
        std::thread::sleep(Duration::from_secs(1));
        assert_eq!(
            requests_from(&dnsmasq, &mac)[before.len()..],
            [xid],
            "the server saw another REQUEST {}",
            ctx(&agent)
        );
    }
}

/// The address an ADD's result gives (`ips[0]`, without its prefix).
fn result_address(out: &xdhcp_tests::PluginOutput) -> String {
    out.json["ips"][0]["address"]
        .as_str()
        .and_then(|a| a.split('/').next())
        .unwrap_or_else(|| panic!("no address in the result: {}", out.stdout))
        .to_owned()
}

/// A restarted agent answers its socket while it still resumes its
/// records: CNI STATUS at once; an ADD for a new pod goes ahead; an ADD for
/// the pod whose record is being resumed waits for that record and finds
/// its lease (the same address, no DISCOVER: never a second lease). The
/// record's resume is held back 4 s (`XDHCP_TEST_RESUME_DELAY_MS`) so the
/// recovery is still running while all this happens.
#[test]
fn the_socket_answers_during_recovery_and_an_add_waits_only_for_its_own_record() {
    let cni = CniPath::new();
    let mut agent = AgentProcess::start(&[]);
    let lab = Lab::with_clients(2);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::renewing_every(30));
    let conf = format!(
        r#"{{"cniVersion":"1.1.0","name":"xnet","ipam":{{"type":"xdhcp","socketPath":"{}"}}}}"#,
        agent.socket.display()
    );
    let call = |command: &str, i: usize| {
        let c = &lab.clients[i];
        cni.xdhcp(command, &format!("pod{i}"), c, &conf)
    };
    let first = call("ADD", 0);
    assert!(first.ok, "ADD pod0: {}\n{}", first.stdout, agent.log());
    let address = result_address(&first);
    // The full record follows the ADD's answer: the one to resume.
    assert!(
        wait_until(Duration::from_secs(5), || the_record(&agent.state_dir)
            .is_some_and(|r| !r["lease"].is_null())),
        "the lease never reached its record:\n{}",
        agent.log()
    );
    let mac0 = format_mac(lab.clients[0].mac);
    let discovers = per_mac(&dnsmasq, "DHCPDISCOVER", std::slice::from_ref(&mac0))[0];

    let log_before = agent.log().len();
    agent.kill_and_start_with_env(&[("XDHCP_TEST_RESUME_DELAY_MS", "4000")]);
    let started = std::time::Instant::now();
    let recovered =
        |agent: &AgentProcess| agent.log()[log_before..].contains("lease state recovered");
    assert!(
        wait_until(Duration::from_secs(10), || call("STATUS", 0).ok),
        "no STATUS answered:\n{}",
        agent.log()
    );
    assert!(
        !recovered(&agent),
        "STATUS was answered only after the recovery:\n{}",
        &agent.log()[log_before..]
    );
    let status: serde_json::Value =
        serde_json::from_str(&agent.cli("status", true)).expect("xdhcp status --json");
    assert_eq!(status["ready"], false, "recovery still runs: {status}");

    let ((again, again_at), (fresh, fresh_at)) = std::thread::scope(|s| {
        let again = s.spawn(|| (call("ADD", 0), started.elapsed()));
        let fresh = s.spawn(|| (call("ADD", 1), started.elapsed()));
        (again.join().unwrap(), fresh.join().unwrap())
    });
    let log = agent.log()[log_before..].to_owned();
    assert!(fresh.ok, "ADD pod1: {}\n{log}", fresh.stdout);
    assert!(again.ok, "ADD pod0 again: {}\n{log}", again.stdout);
    assert!(
        log.contains("resuming lease without DISCOVER container=pod0"),
        "pod0's record was not resumed as its lease:\n{log}"
    );
    assert_eq!(
        result_address(&again),
        address,
        "the resumed lease, not another:\n{log}"
    );
    assert_eq!(
        per_mac(&dnsmasq, "DHCPDISCOVER", std::slice::from_ref(&mac0))[0],
        discovers,
        "a DISCOVER from pod0 since the restart: a second lease\n{log}\n{}",
        dnsmasq.log()
    );
    assert!(
        fresh_at < again_at,
        "the new pod's ADD ({fresh_at:?}) waited for another pod's record (pod0 answered after {again_at:?})"
    );
    agent.wait_ready();
    let leases: serde_json::Value =
        serde_json::from_str(&agent.cli("leases", true)).expect("xdhcp leases --json");
    let pod0 = leases
        .as_array()
        .expect("a list")
        .iter()
        .filter(|l| l["containerId"] == "pod0")
        .count();
    assert_eq!(pod0, 1, "{leases}");
}

/// A DEL still under way when the agent is told to stop (a rolling
/// upgrade) finds the pod's lease task ended at the shutdown, holding its
/// lease for the next agent. It must not answer success: nothing released
/// the lease, and with the record gone nobody ever would (the server keeps
/// the address until it expires). It answers "try again later" and keeps
/// the record; the plugin waits through the restart, the next agent
/// resumes the lease and releases it at the DEL repeated to it. The DEL is
/// held 2 s after its lookup (`XDHCP_TEST_DEL_DELAY_MS`) so the SIGTERM
/// lands inside it.
#[test]
fn a_del_caught_by_the_shutdown_is_answered_try_again_and_the_next_agent_releases() {
    let cni = CniPath::new();
    let mut agent = AgentProcess::start(&[]);
    let lab = Lab::with_clients(1);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::renewing_every(30));
    let conf = format!(
        r#"{{"cniVersion":"1.1.0","name":"xnet","ipam":{{"type":"xdhcp","socketPath":"{}"}}}}"#,
        agent.socket.display()
    );
    let c = &lab.clients[0];
    let call = |command: &str| cni.xdhcp(command, "pod0", c, &conf);
    let added = call("ADD");
    assert!(added.ok, "ADD: {}\n{}", added.stdout, agent.log());
    assert!(
        wait_until(Duration::from_secs(5), || the_record(&agent.state_dir)
            .is_some_and(|r| !r["lease"].is_null())),
        "the lease never reached its record:\n{}",
        agent.log()
    );
    agent.kill_and_start_with_env(&[("XDHCP_TEST_DEL_DELAY_MS", "2000")]);
    agent.wait_ready();
    let log_before = agent.log().len();

    std::thread::scope(|s| {
        let del = s.spawn(|| call("DEL"));
        assert!(
            wait_until(Duration::from_secs(10), || agent.log()[log_before..]
                .contains("DEL held (test hook)")),
            "the DEL never reached the agent:\n{}",
            agent.log()
        );
        assert!(
            agent.process.stop(Duration::from_secs(15)),
            "the agent did not exit on SIGTERM:\n{}",
            agent.log()
        );
        assert_eq!(dnsmasq.count_in_log("DHCPRELEASE"), 0, "{}", dnsmasq.log());
        assert!(
            the_record(&agent.state_dir).is_some_and(|r| !r["lease"].is_null()),
            "the stopping agent dropped the record of a lease it never released:\n{}",
            agent.log()
        );
        let stopped_log = agent.log()[log_before..].to_owned();
        assert!(
            stopped_log.contains("DEL during shutdown"),
            "the DEL was not answered try-again at the shutdown:\n{stopped_log}"
        );
        assert!(
            !stopped_log.contains("DEL done"),
            "the stopping agent answered the DEL as done:\n{stopped_log}"
        );

        // The next agent: the plugin's DEL, waiting through the restart,
        // reaches it and releases the lease.
        agent.start_again();
        let del = del.join().expect("the DEL thread");
        assert!(del.ok, "DEL: {}\n{}", del.stdout, agent.log());
    });
    let log = agent.log()[log_before..].to_owned();
    assert!(log.contains("DEL done container=pod0"), "{log}");
    assert!(
        wait_until(Duration::from_secs(5), || dnsmasq
            .count_in_log("DHCPRELEASE")
            >= 1),
        "the next agent did not release the lease:\n{}\n{log}",
        dnsmasq.log()
    );
    assert!(dnsmasq.lease_for(c.mac).is_none(), "{}", dnsmasq.log());
    assert!(the_record(&agent.state_dir).is_none(), "{log}");
}
