//! The agent as a real process (this test binary re-executed as
//! `xdhcp::daemon::run_until_signal`, so it can be SIGKILL-ed) against real
//! DHCP servers in network namespaces — dnsmasq, ISC Kea 2.2 (memfile) and
//! ISC dhcpd — with short T1/T2 so renewals happen within seconds.
//!
//! Per server: acquire; renewal seen in the server log; rebinding when the
//! server's unicast path is cut (the renewal is dropped at the server's
//! bridge, a broadcast REQUEST is acknowledged and the address kept); a NAK after the
//! server forgot the lease gives a fresh lease that reaches the pod; RELEASE
//! removes the lease from the server's store; a SIGKILL-ed agent restarted on
//! the same state dir renews its bound lease without a new DISCOVER. Plus
//! dnsmasq with its default ping check, and 20 concurrent clients.
//!
//! These tests mostly wait for DHCP timers; run them in parallel:
//! `cargo test -p xdhcp-tests --test servers -- --test-threads=16`.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use xdhcp::cli::{AgentArgs, DatapathChoice, KubeMode};
use xdhcp::rpc::{self, Client, ClientError, CniRequest, CniResult, LeaseView};
use xdhcp_tests::{
    Dhcpd, DhcpdConfig, Dnsmasq, DnsmasqConfig, Kea, KeaConfig, Lab, LabClient, Process,
    ServerLease, format_mac, wait_until,
};

/// T1 and T2 every server hands out.
const T1: u32 = 5;
const T2: u32 = 8;

/// Set in the re-executed child: the agent's directory.
const AGENT_DIR_ENV: &str = "XDT_SERVERS_AGENT_DIR";
/// Set in the re-executed child: `auto` or `afpacket`.
const AGENT_DATAPATH_ENV: &str = "XDT_SERVERS_AGENT_DATAPATH";
/// Name of the (ignored) test function that is the agent process.
const AGENT_ENTRY: &str = "agent_process";

/// Not a test: the agent process the other tests start by re-executing this
/// binary (`--ignored --exact agent_process`). Runs until SIGTERM/SIGKILL.
#[test]
#[ignore = "entry point of the agent child process, started by the other tests"]
fn agent_process() {
    let dir = PathBuf::from(
        std::env::var_os(AGENT_DIR_ENV)
            .unwrap_or_else(|| panic!("{AGENT_ENTRY} runs only as a child with {AGENT_DIR_ENV}")),
    );
    let datapath = match std::env::var(AGENT_DATAPATH_ENV).as_deref() {
        Ok("afpacket") => DatapathChoice::Afpacket,
        _ => DatapathChoice::Auto,
    };
    let mut args = AgentArgs::with_defaults(dir.join("run/xdhcp.sock"), dir.join("state"));
    args.kube = KubeMode::Off;
    args.datapath = datapath;
    args.bpffs_dir = dir.join("bpffs");
    xdhcp::telemetry::init(args.log_format).expect("agent logging");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("agent runtime");
    rt.block_on(xdhcp::daemon::run_until_signal(args))
        .expect("agent ran");
}

/// The agent as a child process; its directory (socket, state, log)
/// outlives restarts. SIGTERM on drop.
struct AgentProc {
    process: Option<Process>,
    datapath: &'static str,
    dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
}

impl AgentProc {
    fn start(datapath: DatapathChoice) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("xdt-srv-agent-")
            .tempdir()
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut me = Self {
            process: None,
            datapath: match datapath {
                DatapathChoice::Afpacket => "afpacket",
                _ => "auto",
            },
            dir,
            rt,
        };
        me.spawn();
        me
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("run/xdhcp.sock")
    }

    fn log_file(&self) -> PathBuf {
        self.dir.path().join("agent.log")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log_file()).unwrap_or_default()
    }

    /// Starts the agent process and waits until it reports ready.
    fn spawn(&mut self) {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--ignored", "--exact", AGENT_ENTRY, "--nocapture"])
            .env(AGENT_DIR_ENV, self.dir.path())
            .env(AGENT_DATAPATH_ENV, self.datapath)
            .env("RUST_LOG", "xdhcp=debug,info");
        self.process = Some(Process::spawn_logged("xdhcp agent", cmd, &self.log_file()));
        let c = self.client();
        let ready = wait_until(Duration::from_secs(20), || {
            c.get::<rpc::Readiness>(rpc::PATH_READY)
                .is_ok_and(|r| r.ready)
        });
        assert!(ready, "agent did not become ready:\n{}", self.log());
    }

    /// SIGKILL: no destructor, no shutdown persistence.
    fn sigkill(&mut self) {
        self.process.take().expect("agent running").kill();
    }

    fn client(&self) -> Client {
        Client::new(self.socket(), Duration::from_mins(1))
    }

    fn post(&self, path: &str, req: &CniRequest) -> Result<serde_json::Value, ClientError> {
        self.client().post(path, req)
    }

    fn add(&self, req: &CniRequest) -> CniResult {
        let v = self
            .post(rpc::PATH_ADD, req)
            .unwrap_or_else(|e| panic!("ADD {} failed: {e}\n{}", req.container_id, self.log()));
        serde_json::from_value(v).expect("ADD reply is a CNI result")
    }

    fn del(&self, req: &CniRequest) {
        let _ = self
            .post(rpc::PATH_DEL, req)
            .unwrap_or_else(|e| panic!("DEL {} failed: {e}", req.container_id));
    }

    fn leases(&self) -> Vec<LeaseView> {
        self.client().get(rpc::PATH_LEASES).expect("lease table")
    }

    fn lease(&self, container: &str) -> LeaseView {
        self.leases()
            .into_iter()
            .find(|l| l.container_id == container)
            .unwrap_or_else(|| panic!("{container} not in the agent's lease table"))
    }
}

#[expect(
    clippy::print_stderr,
    reason = "test diagnostics: show the agent log when a test fails"
)]
impl Drop for AgentProc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(80).collect();
            eprintln!("---- last lines of the agent log ----");
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
            eprintln!("---- end of the agent log ----");
        }
    }
}

fn request(client: &LabClient, container: &str, ipam: &str) -> CniRequest {
    let conf = format!(r#"{{"cniVersion":"1.0.0","name":"net1","type":"bridge","ipam":{ipam}}}"#);
    xdhcp_tests::cni_request(client, container, "default", &conf)
}

const IPAM: &str = r#"{"type":"xdhcp","timeout":"20s"}"#;
const IPAM_APPLY: &str = r#"{"type":"xdhcp","timeout":"20s","apply":true}"#;

// ------------------------------------------------------------------ servers

/// Which server a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dnsmasq,
    Kea,
}

/// Address plan of one server instance: the pool it hands out.
#[derive(Debug, Clone, Copy)]
struct Pool(Ipv4Addr, Ipv4Addr);

impl Pool {
    const FIRST: Self = Self(Ipv4Addr::new(192, 0, 2, 100), Ipv4Addr::new(192, 0, 2, 150));
    const SECOND: Self = Self(Ipv4Addr::new(192, 0, 2, 200), Ipv4Addr::new(192, 0, 2, 250));

    fn contains(self, ip: Ipv4Addr) -> bool {
        (self.0..=self.1).contains(&ip)
    }
}

/// A running dnsmasq or Kea with the short timers, behind one interface.
#[derive(Debug)]
enum Server {
    Dnsmasq(Dnsmasq),
    Kea(Kea),
}

impl Server {
    fn start(kind: Kind, lab: &Lab, pool: Pool) -> Self {
        match kind {
            Kind::Dnsmasq => Self::Dnsmasq(Dnsmasq::start(
                &lab.server,
                DnsmasqConfig {
                    range: (pool.0, pool.1),
                    t1_secs: Some(T1),
                    t2_secs: Some(T2),
                    ..DnsmasqConfig::default()
                },
            )),
            Kind::Kea => Self::Kea(Kea::start(
                &lab.server,
                KeaConfig {
                    pool: (pool.0, pool.1),
                    valid_lifetime: 60,
                    renew_timer: T1,
                    rebind_timer: T2,
                    ..KeaConfig::default()
                },
            )),
        }
    }

    fn log(&self) -> String {
        match self {
            Self::Dnsmasq(d) => d.log(),
            Self::Kea(k) => k.log(),
        }
    }

    fn lease_for(&self, mac: [u8; 6]) -> Option<ServerLease> {
        match self {
            Self::Dnsmasq(d) => d.lease_for(mac),
            Self::Kea(k) => k.lease_for(mac),
        }
    }

    /// Log lines about `mac` that mark a message of `kind` (`DISCOVER`,
    /// `REQUEST`, `ACK`, `NAK`, `RELEASE`): dnsmasq `DHCPACK(br0) ip mac`,
    /// Kea `DHCP4_PACKET_SEND [hwtype=1 mac] ...: trying to send packet
    /// DHCPACK (type 5)` / `DHCP4_PACKET_RECEIVED ... DHCPREQUEST (type 3)`.
    fn lines(&self, mac: [u8; 6], kind: &str) -> Vec<String> {
        let mac = format_mac(mac);
        let needle = match self {
            Self::Dnsmasq(_) => format!("DHCP{kind}("),
            Self::Kea(_) => format!("DHCP{kind} (type"),
        };
        self.log()
            .lines()
            .filter(|l| l.contains(&mac) && l.contains(&needle))
            .map(str::to_owned)
            .collect()
    }

    fn count(&self, mac: [u8; 6], kind: &str) -> usize {
        self.lines(mac, kind).len()
    }
}

fn addr(r: &CniResult) -> Ipv4Addr {
    r.ips[0].address.addr
}

// ------------------------------------------------------------------ tests

/// Acquire; a renewal (REQUEST + ACK for the same address) at T1; then the
/// unicast path to the server is cut: the next renewal is dropped at the
/// server's bridge, and at T2 a broadcast REQUEST (REBINDING) is acknowledged and
/// the address kept.
fn renew_then_rebind(kind: Kind) {
    let lab = Lab::with_clients(1);
    let server = Server::start(kind, &lab, Pool::FIRST);
    let agent = AgentProc::start(DatapathChoice::Auto);
    let c = &lab.clients[0];
    // apply: the pod holds the address and answers ARP for it, as a pod
    // whose main plugin configured the IPAM result does. dnsmasq sends a
    // REBINDING ACK to ciaddr through the kernel (ARP needed); Kea and
    // dhcpd use raw sockets.
    let req = request(c, "pod-rebind", IPAM_APPLY);

    let ip = addr(&agent.add(&req));
    assert!(Pool::FIRST.contains(ip), "{ip}");
    assert_eq!(server.lease_for(c.mac).map(|l| l.ip), Some(ip));
    assert_eq!(server.count(c.mac, "DISCOVER"), 1, "{}", server.log());
    assert_eq!(server.count(c.mac, "ACK"), 1, "{}", server.log());

    // Renewal at T1: a second REQUEST and ACK, for the same address.
    assert!(
        wait_until(Duration::from_secs(u64::from(T1) + 5), || server
            .count(c.mac, "ACK")
            >= 2),
        "no renewal ACK within T1 + 5 s"
    );
    assert_eq!(server.count(c.mac, "REQUEST"), 2, "{}", server.log());
    if kind == Kind::Dnsmasq {
        let renewal = server.lines(c.mac, "ACK").pop().unwrap();
        assert!(renewal.contains(&ip.to_string()), "{renewal}");
    }
    assert_eq!(server.lease_for(c.mac).map(|l| l.ip), Some(ip));
    // The server logs the ACK as it sends it: give the agent a moment to
    // handle it rather than racing it.
    assert!(
        wait_until(Duration::from_secs(3), || agent
            .lease(&req.container_id)
            .state
            == "Bound"),
        "not Bound after the renewal ACK: {:?}",
        agent.lease(&req.container_id)
    );
    let renewed = agent.lease(&req.container_id);
    assert_eq!(renewed.address.map(|a| a.addr), Some(ip));

    // Cut the unicast path: every unicast frame to the server's port 67 is
    // dropped before the server sees it. Only broadcasts get through.
    let cut = lab.cut_server_unicast();
    let acks_before_cut = server.count(c.mac, "ACK");
    let cut_at = Instant::now();
    assert!(
        wait_until(Duration::from_secs(u64::from(T1) + 5), || cut.dropped()
            >= 1),
        "the renewal after the cut never reached the server's bridge"
    );
    let dropped_at = cut_at.elapsed();
    assert_eq!(
        server.count(c.mac, "ACK"),
        acks_before_cut,
        "a unicast renewal got through the cut"
    );
    // REBINDING at T2 (T2 - T1 = 3 s after the dropped renewal).
    assert!(
        wait_until(Duration::from_secs(u64::from(T2 - T1) + 6), || server
            .count(c.mac, "ACK")
            > acks_before_cut),
        "no REBINDING ACK after the renewal was dropped ({:?} after the cut); agent state {:?}",
        dropped_at,
        agent.lease(&req.container_id).state
    );
    if let Server::Kea(_) = server {
        // Kea logs where the REQUEST was addressed: the rebinding one is a
        // broadcast.
        let last = server.lines(c.mac, "REQUEST").pop().unwrap();
        assert!(last.contains("255.255.255.255"), "{last}");
    }
    // The server logs the ACK as it sends it: give the agent a moment.
    assert!(
        wait_until(Duration::from_secs(3), || agent
            .lease(&req.container_id)
            .state
            == "Bound"),
        "the REBINDING ACK did not bring the lease back to BOUND: {:?}",
        agent.lease(&req.container_id)
    );
    let after = agent.lease(&req.container_id);
    assert_eq!(after.address.map(|a| a.addr), Some(ip), "address kept");
    assert_eq!(server.lease_for(c.mac).map(|l| l.ip), Some(ip));
    assert_eq!(
        server.count(c.mac, "DISCOVER"),
        1,
        "the rebind must not restart discovery"
    );
    drop(cut);
    agent.del(&req);
}

#[test]
fn dnsmasq_renews_then_rebinds_when_unicast_is_cut() {
    renew_then_rebind(Kind::Dnsmasq);
}

#[test]
fn kea_renews_then_rebinds_when_unicast_is_cut() {
    renew_then_rebind(Kind::Kea);
}

/// The server forgot the lease and can no longer give the held address; the
/// renewal at T1 is refused with a NAK, the client starts over and ends BOUND on another
/// address, which replaces the old one in the pod (apply on).
///
/// - dnsmasq: replaced by one whose range excludes the held address
///   (`--dhcp-authoritative` NAKs it: "address not available").
/// - Kea 2.2 stays silent for a RENEWING request whose address is in no pool
///   (`DHCP4_UNKNOWN_ADDRESS_REQUESTED`, dropped, no NAK), so Kea is
///   restarted with an empty memfile and another client is given the held
///   address first: the renewal of an address leased to someone else is
///   refused with a NAK (`DHCP4_PACKET_NAK_0004`).
fn nak_gives_a_fresh_lease(kind: Kind) {
    let lab = Lab::with_clients(2);
    let agent = AgentProc::start(DatapathChoice::Auto);
    let c = &lab.clients[0];
    let req = request(c, "pod-nak", IPAM_APPLY);
    let (server, old) = match kind {
        Kind::Dnsmasq => {
            let first = Server::start(kind, &lab, Pool::FIRST);
            let old = addr(&agent.add(&req));
            assert!(Pool::FIRST.contains(old), "{old}");
            drop(first);
            (Server::start(kind, &lab, Pool::SECOND), old)
        }
        Kind::Kea => {
            let Server::Kea(mut kea) = Server::start(kind, &lab, Pool::FIRST) else {
                unreachable!()
            };
            let old = addr(&agent.add(&req));
            kea.restart_forgetting_leases();
            let thief = request(&lab.clients[1], "pod-thief", IPAM);
            let taken = addr(&agent.add(&thief));
            assert_eq!(
                taken, old,
                "test setup: Kea's iterative allocator should hand the forgotten address out again"
            );
            (Server::Kea(kea), old)
        }
    };
    assert!(c.ns.ipv4_addrs(&c.ifname).contains(&(old, 24)));

    let moved = wait_until(Duration::from_secs(u64::from(T1) + 10), || {
        c.ns.ipv4_addrs(&c.ifname).iter().any(|(a, _)| *a != old)
    });
    assert!(
        moved,
        "the pod never got a new address: {:?}; agent: {:?}",
        c.ns.ipv4_addrs(&c.ifname),
        agent.leases()
    );
    assert!(
        server.count(c.mac, "NAK") >= 1,
        "the renewal was not refused with a NAK:\n{}",
        server.log()
    );
    let view = agent.lease(&req.container_id);
    let new = view.address.expect("a new lease").addr;
    assert_ne!(new, old);
    if kind == Kind::Dnsmasq {
        assert!(Pool::SECOND.contains(new), "{view:?}");
    }
    assert_eq!(view.state, "Bound");
    let addrs = c.ns.ipv4_addrs(&c.ifname);
    assert_eq!(addrs, vec![(new, 24)], "the old address must be gone");
    assert_eq!(server.lease_for(c.mac).map(|l| l.ip), Some(new));
    assert!(
        c.ns.routes().contains("default via 192.0.2.1"),
        "{}",
        c.ns.routes()
    );
    agent.del(&req);
}

#[test]
fn dnsmasq_nak_after_the_server_forgot_gives_a_fresh_lease() {
    nak_gives_a_fresh_lease(Kind::Dnsmasq);
}

#[test]
fn kea_nak_after_the_server_forgot_gives_a_fresh_lease() {
    nak_gives_a_fresh_lease(Kind::Kea);
}

/// DEL releases: the lease leaves the server's store.
fn release_honoured(kind: Kind) -> Server {
    let lab = Lab::with_clients(1);
    let server = Server::start(kind, &lab, Pool::FIRST);
    let agent = AgentProc::start(DatapathChoice::Auto);
    let c = &lab.clients[0];
    let req = request(c, "pod-release", IPAM);
    let ip = addr(&agent.add(&req));
    assert_eq!(server.lease_for(c.mac).map(|l| l.ip), Some(ip));

    agent.del(&req);
    assert!(
        wait_until(Duration::from_secs(5), || server.lease_for(c.mac).is_none()),
        "RELEASE not honoured: the server still holds {ip}"
    );
    assert_eq!(server.count(c.mac, "RELEASE"), 1, "{}", server.log());
    assert!(agent.leases().is_empty());
    server
}

#[test]
fn dnsmasq_release_removes_the_lease_from_the_lease_file() {
    let Server::Dnsmasq(d) = release_honoured(Kind::Dnsmasq) else {
        unreachable!()
    };
    let text = std::fs::read_to_string(d.lease_file()).unwrap();
    assert!(text.trim().is_empty(), "lease file: {text}");
}

#[test]
fn kea_release_marks_the_lease_gone_in_the_memfile() {
    let Server::Kea(k) = release_honoured(Kind::Kea) else {
        unreachable!()
    };
    // Kea 2.2 appends to the memfile: the lease row, then on RELEASE its
    // deletion — a row for the same address and client with valid_lifetime
    // 0 (state stays 0; state 2, expired-reclaimed, would also mean gone).
    // The last row for the address counts.
    let text = std::fs::read_to_string(k.lease_file()).unwrap();
    let rows: Vec<Vec<&str>> = text
        .lines()
        .filter(|l| !l.starts_with("address"))
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(rows.len(), 2, "memfile: {text}");
    let (granted, last) = (&rows[0], &rows[1]);
    assert_eq!(last[..3], granted[..3], "same address and client: {text}");
    assert_ne!(granted[3], "0", "{text}");
    assert!(
        last[3] == "0" || last[9] == "2",
        "the last row is still an active lease: {text}"
    );
}

/// The agent is SIGKILL-ed right after ADD and started again on the same state
/// dir: it holds the same lease again and renews it — no new DISCOVER. (Killed
/// this soon, the full lease may not be on disk yet: the record written while
/// the REQUEST was out is, and the restarted agent asks for its address again
/// with an INIT-REBOOT REQUEST; either way the server sees no DISCOVER.)
fn sigkill_resume(kind: Kind, datapath: DatapathChoice) {
    let lab = Lab::with_clients(1);
    let server = Server::start(kind, &lab, Pool::FIRST);
    let mut agent = AgentProc::start(datapath);
    let c = &lab.clients[0];
    let req = request(c, "pod-kill", IPAM_APPLY);
    let ip = addr(&agent.add(&req));
    agent.sigkill();
    let discovers = server.count(c.mac, "DISCOVER");
    let requests = server.count(c.mac, "REQUEST");
    let acks = server.count(c.mac, "ACK");
    assert_eq!((discovers, requests, acks), (1, 1, 1), "{}", server.log());

    agent.spawn();
    let held = || {
        let view = agent.lease(&req.container_id);
        view.address.map(|a| a.addr) == Some(ip)
            && matches!(view.state.as_str(), "Bound" | "Renewing")
    };
    assert!(
        wait_until(Duration::from_secs(10), held),
        "the restarted agent does not hold {ip}: {:?}\n{}",
        agent.lease(&req.container_id),
        server.log()
    );
    assert!(
        wait_until(Duration::from_secs(u64::from(T1) + 5), || server
            .count(c.mac, "ACK")
            > acks),
        "the restarted agent did not renew"
    );
    assert_eq!(
        server.count(c.mac, "DISCOVER"),
        discovers,
        "the restarted agent started over with DISCOVER:\n{}",
        server.log()
    );
    assert!(server.count(c.mac, "REQUEST") > requests);
    assert_eq!(server.lease_for(c.mac).map(|l| l.ip), Some(ip));
    // The server logs its ACK before the agent has handled it: wait for the
    // agent to get back to BOUND rather than racing it.
    assert!(
        wait_until(Duration::from_secs(3), || agent
            .lease(&req.container_id)
            .state
            == "Bound"),
        "the restarted agent did not get back to Bound: {:?}",
        agent.lease(&req.container_id)
    );
    let view = agent.lease(&req.container_id);
    assert_eq!(view.address.map(|a| a.addr), Some(ip));
    assert!(c.ns.ipv4_addrs(&c.ifname).contains(&(ip, 24)));
    agent.del(&req);
}

#[test]
fn dnsmasq_sigkilled_agent_resumes_renewals_without_discover() {
    sigkill_resume(Kind::Dnsmasq, DatapathChoice::Afpacket);
}

#[test]
fn kea_sigkilled_agent_resumes_renewals_without_discover() {
    sigkill_resume(Kind::Kea, DatapathChoice::Auto);
}

/// dnsmasq's default ICMP check of every new address (no `--no-ping`): the
/// OFFER comes ~3 s late, the client still ends BOUND.
#[test]
fn dnsmasq_with_its_default_ping_check_still_binds() {
    let lab = Lab::with_clients(1);
    let server = Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            no_ping: false,
            ..DnsmasqConfig::default()
        },
    );
    let agent = AgentProc::start(DatapathChoice::Auto);
    let c = &lab.clients[0];
    let req = request(c, "pod-ping", IPAM);
    let t0 = Instant::now();
    let ip = addr(&agent.add(&req));
    let took = t0.elapsed();
    assert_eq!(server.lease_for(c.mac).map(|l| l.ip), Some(ip));
    assert_eq!(agent.lease("pod-ping").state, "Bound");
    // The ping ran: dnsmasq waited before offering (the only thing that
    // delays an OFFER on an idle lab by seconds).
    assert!(took >= Duration::from_secs(2), "no ping delay: {took:?}");
    agent.del(&req);
}

/// 20 clients added at once against dnsmasq `--no-ping`: every one ends
/// BOUND on its own address, NAKs or not.
#[test]
fn dnsmasq_twenty_concurrent_clients_all_bind() {
    const N: usize = 20;
    let lab = Lab::with_clients(N);
    let server = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let agent = AgentProc::start(DatapathChoice::Auto);
    let reqs: Vec<CniRequest> = lab
        .clients
        .iter()
        .enumerate()
        .map(|(i, c)| request(c, &format!("pod-many-{i}"), IPAM))
        .collect();
    let client = agent.client();
    let results: Vec<Result<serde_json::Value, ClientError>> = agent.rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for (i, r) in reqs.iter().cloned().enumerate() {
            let client = client.clone();
            set.spawn_blocking(move || (i, client.post(rpc::PATH_ADD, &r)));
        }
        let mut out: Vec<Option<Result<serde_json::Value, ClientError>>> =
            (0..N).map(|_| None).collect();
        while let Some(j) = set.join_next().await {
            let (i, r) = j.expect("ADD task");
            out[i] = Some(r);
        }
        out.into_iter().map(|r| r.expect("every ADD ran")).collect()
    });
    let mut addrs = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        let v = r.unwrap_or_else(|e| panic!("ADD {i} failed: {e}"));
        let r: CniResult = serde_json::from_value(v).unwrap();
        let ip = addr(&r);
        assert_eq!(
            server.lease_for(lab.clients[i].mac).map(|l| l.ip),
            Some(ip),
            "client {i}"
        );
        addrs.push(ip);
    }
    addrs.sort_unstable();
    addrs.dedup();
    assert_eq!(addrs.len(), N, "duplicate addresses: {addrs:?}");
    let table = agent.leases();
    assert_eq!(table.len(), N);
    assert!(table.iter().all(|l| l.state == "Bound"), "{table:?}");
    // Reported, not asserted: how many NAKs dnsmasq sent during the rush.
    let naks = server.count_in_log("DHCPNAK");
    report_naks(naks, N);
    assert!(
        naks <= 10 * N,
        "{naks} NAKs for {N} clients: a NAK loop, not contention"
    );
}

#[expect(
    clippy::print_stderr,
    reason = "test diagnostics (visible with --nocapture)"
)]
fn report_naks(naks: usize, clients: usize) {
    eprintln!("dnsmasq sent {naks} NAK(s) while {clients} clients acquired at once");
}

/// ISC dhcpd: acquire, a renewal at T1 (options 58/59 set in the subnet),
/// and RELEASE frees the binding.
#[test]
fn dhcpd_acquire_renew_release() {
    let lab = Lab::with_clients(1);
    let server = Dhcpd::start(
        &lab.server,
        &DhcpdConfig {
            extra: format!(
                "option dhcp-renewal-time {T1}; option dhcp-rebinding-time {T2}; ping-check false;"
            ),
            ..DhcpdConfig::default()
        },
    );
    let agent = AgentProc::start(DatapathChoice::Auto);
    let c = &lab.clients[0];
    let req = request(c, "pod-dhcpd", IPAM);
    let ip = addr(&agent.add(&req));
    let mac = format_mac(c.mac);
    let count = |what: &str| {
        server
            .log()
            .lines()
            .filter(|l| l.starts_with(what) && l.contains(&mac))
            .count()
    };
    assert!(server.leases().iter().any(|l| l.ip == ip && l.mac == c.mac));
    assert_eq!(count("DHCPACK"), 1, "{}", server.log());
    assert!(
        wait_until(Duration::from_secs(u64::from(T1) + 5), || count("DHCPACK")
            >= 2),
        "no renewal ACK"
    );
    let renewal = server
        .log()
        .lines()
        .rev()
        .find(|l| l.starts_with("DHCPREQUEST") && l.contains(&mac))
        .map(str::to_owned)
        .unwrap();
    assert!(renewal.contains(&format!("for {ip}")), "{renewal}");
    assert_eq!(count("DHCPDISCOVER"), 1);
    agent.del(&req);
    assert!(
        wait_until(Duration::from_secs(5), || count("DHCPRELEASE") == 1),
        "no RELEASE:\n{}",
        server.log()
    );
    assert!(
        wait_until(Duration::from_secs(5), || !server
            .leases()
            .iter()
            .any(|l| l.mac == c.mac)),
        "dhcpd still holds the binding"
    );
}

/// `GET /v1/status` (what `xdhcp status` calls) answers while a lease is
/// bound, and the agent keeps answering afterwards (lease table, DEL).
#[test]
fn status_answers_and_the_agent_stays_usable() {
    let lab = Lab::with_clients(1);
    let server = Server::start(Kind::Dnsmasq, &lab, Pool::FIRST);
    let agent = AgentProc::start(DatapathChoice::Auto);
    let c = &lab.clients[0];
    let req = request(c, "pod-status", IPAM);
    let ip = addr(&agent.add(&req));
    let quick = Client::new(agent.socket(), Duration::from_secs(5));
    let status: rpc::AgentStatus = quick
        .get(rpc::PATH_STATUS)
        .unwrap_or_else(|e| panic!("GET {}: {e}", rpc::PATH_STATUS));
    assert_eq!(status.leases, 1, "{status:?}");
    assert_eq!(status.interfaces.len(), 1, "{status:?}");
    assert_eq!(status.interfaces[0].ifname, c.ifname);
    let table: Vec<LeaseView> = quick
        .get(rpc::PATH_LEASES)
        .unwrap_or_else(|e| panic!("lease table after status: {e}"));
    assert_eq!(table[0].address.map(|a| a.addr), Some(ip));
    agent.del(&req);
    assert!(
        wait_until(Duration::from_secs(5), || server.lease_for(c.mac).is_none()),
        "DEL after status did not release"
    );
}
