//! The agent's footprint in the lease count (a bounded number of OS threads
//! whatever the lease count, RSS per lease): many concurrent ADDs against
//! dnsmasq, the agent's OS threads sampled all along, and once every lease
//! has moved to the eBPF capture and is bound no packet socket (receiver or
//! sender) is left open.
//!
//! `XDHCP_FOOTPRINT_LEASES` (default 200) sets the lease count and
//! `XDHCP_BIN` the agent binary (default: this workspace's debug build);
//! `XDHCP_FOOTPRINT_HOLD=<secs>` keeps the agent up with every lease held
//! for inspection (`/proc/<pid>/smaps`).

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use xdhcp::rpc::{self, Client, CniRequest};
use xdhcp_tests::{Dnsmasq, DnsmasqConfig, Lab, LabClient, Process, wait_until};

mod agent_support;

/// OS threads the agent may keep, whatever the lease count: the main
/// thread, the runtime's workers and bounded blocking pool, and the two
/// socket closers. (ADDs in flight add short-lived namespace threads on top;
/// the peak is printed.)
const THREAD_BOUND: usize = 1 + xdhcp::cli::MAX_WORKER_THREADS + xdhcp::cli::BLOCKING_THREADS + 2;
/// ADDs in flight at once (as the CNI benchmark does).
const CHUNK: usize = 100;

fn lease_count() -> usize {
    std::env::var("XDHCP_FOOTPRINT_LEASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

fn agent_bin() -> PathBuf {
    std::env::var_os("XDHCP_BIN").map_or_else(agent_support::xdhcp_bin, PathBuf::from)
}

/// One `/proc/<pid>/status` field (first number).
fn status_field(pid: u32, name: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Samples the agent's thread count every few milliseconds; keeps the peak.
struct ThreadSampler {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ThreadSampler {
    fn start(pid: u32) -> Self {
        let peak = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(status_field(pid, "Threads:"), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Self {
            peak,
            stop,
            thread: Some(thread),
        }
    }

    fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

impl Drop for ThreadSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `AF_PACKET` sockets of process `pid`, as (bound protocol, network order)
/// — read through `pidfd_getfd(2)`: 0 for a raw sender, `ETH_P_ALL` for a
/// receiver.
fn packet_sockets(pid: u32) -> Vec<u16> {
    // SAFETY: plain syscalls; results are checked and owned at once.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    assert!(
        pidfd >= 0,
        "pidfd_open: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a fresh descriptor we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(i32::try_from(pidfd).expect("fd")) };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).expect("read the agent's fds") {
        let Ok(entry) = entry else { continue };
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        if !target.to_string_lossy().starts_with("socket:") {
            continue;
        }
        let Some(n) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: as above.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), n, 0) };
        if fd < 0 {
            continue; // closed meanwhile
        }
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).expect("fd")) };
        // SAFETY: sockaddr_ll is plain old data; getsockname fills at most `len` bytes.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut len = libc::socklen_t::try_from(size_of::<libc::sockaddr_ll>()).expect("size");
        // SAFETY: `sll` is writable for `len` bytes.
        let rc = unsafe {
            libc::getsockname(
                fd.as_raw_fd(),
                std::ptr::from_mut(&mut sll).cast(),
                &raw mut len,
            )
        };
        if rc == 0 && i32::from(sll.sll_family) == libc::AF_PACKET {
            out.push(sll.sll_protocol);
        }
    }
    out
}

fn request(client: &LabClient, container: &str) -> CniRequest {
    let conf =
        r#"{"cniVersion":"1.0.0","name":"footnet","type":"macvlan","ipam":{"type":"xdhcp"}}"#;
    xdhcp_tests::cni_request(client, container, "foot", conf)
}

/// An agent of its own: socket, state, bpffs directory and log in a fresh
/// directory, which goes after the agent is stopped (fields drop in order).
struct TestAgent {
    process: Process,
    socket: PathBuf,
    dir: tempfile::TempDir,
}

impl TestAgent {
    fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("xdt-foot-")
            .tempdir()
            .unwrap();
        let socket = dir.path().join("xdhcp.sock");
        let mut cmd = xdhcp_tests::agent_command(&agent_bin(), &socket, dir.path());
        cmd.env("RUST_LOG", "warn");
        let process = Process::spawn_logged("xdhcp agent", cmd, &dir.path().join("agent.log"));
        TestAgent {
            process,
            socket,
            dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }
}

/// dnsmasq on a /22, so 1000 leases fit.
fn big_dnsmasq(lab: &Lab) -> Dnsmasq {
    Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            range: (
                Ipv4Addr::new(198, 18, 0, 10),
                Ipv4Addr::new(198, 18, 3, 250),
            ),
            netmask: Ipv4Addr::new(255, 255, 252, 0),
            router: Some(Ipv4Addr::new(198, 18, 0, 1)),
            dns: vec![],
            lease_secs: 3600,
            no_ping: true,
            extra_args: vec!["--dhcp-lease-max=4000".to_owned()],
            ..DnsmasqConfig::default()
        },
    )
}

fn wait_ready(client: &Client, log: &dyn Fn() -> String) {
    let ready = wait_until(xdhcp_tests::AGENT_READY_WITHIN, || {
        client
            .get::<rpc::Readiness>(rpc::PATH_READY)
            .is_ok_and(|r| r.ready)
    });
    assert!(ready, "agent not ready:\n{}", log());
}

/// ADD every client, [`CHUNK`] at a time (a thread each: the socket's
/// client is blocking); container ids `foot-<i>`.
fn add_all(socket: &Path, clients: &[LabClient]) {
    for (chunk_no, chunk) in clients.chunks(CHUNK).enumerate() {
        let failed: Vec<String> = std::thread::scope(|s| {
            let adds: Vec<_> = chunk
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let req = request(c, &format!("foot-{}", chunk_no * CHUNK + i));
                    s.spawn(move || {
                        Client::new(socket, Duration::from_mins(2))
                            .post::<_, serde_json::Value>(rpc::PATH_ADD, &req)
                    })
                })
                .collect();
            adds.into_iter()
                .map(|h| h.join().expect("ADD thread"))
                .filter_map(|r| r.err().map(|e| e.to_string()))
                .collect()
        });
        assert!(
            failed.is_empty(),
            "{} ADDs failed, first: {}",
            failed.len(),
            failed[0]
        );
    }
}

#[test]
#[expect(
    clippy::cast_precision_loss,
    clippy::print_stderr,
    reason = "prints the measured footprint; KiB and lease counts far below 2^52"
)]
fn threads_stay_bounded_and_receivers_close_after_handover() {
    let n = lease_count();
    let lab = Lab::builder()
        .server_ip(Ipv4Addr::new(198, 18, 0, 1), 22)
        .clients(n)
        .build();
    let _dnsmasq = big_dnsmasq(&lab);
    let agent = TestAgent::start();
    let (socket, log) = (&agent.socket, || agent.log());
    let client = Client::new(socket, Duration::from_mins(2));
    wait_ready(&client, &log);
    let pid = agent.process.pid().expect("agent running");
    let rss0 = status_field(pid, "VmRSS:");
    let threads0 = status_field(pid, "Threads:");
    let sampler = ThreadSampler::start(pid);

    add_all(socket, &lab.clients);
    // Where `cargo xtask bench cni` measures: half a second after the last
    // ADD, while the last leases still move to eBPF.
    std::thread::sleep(Duration::from_millis(500));
    let rss_bench = status_field(pid, "VmRSS:");
    let threads_bench = status_field(pid, "Threads:");

    // Every lease moves to the eBPF capture (TC on veths) in the background.
    let status = || -> rpc::AgentStatus { client.get(rpc::PATH_STATUS).expect("agent status") };
    let handed_over = wait_until(Duration::from_mins(1), || {
        let s = status();
        s.interfaces.len() == n && s.interfaces.iter().all(|i| i.attach == "tc")
    });
    assert!(handed_over, "not every lease moved to eBPF: {:?}", status());
    std::thread::sleep(Duration::from_secs(1));
    let rss = status_field(pid, "VmRSS:");
    let threads = status_field(pid, "Threads:");
    let peak = sampler.peak();
    // Closes run on the agent's closer threads, a grace period each.
    wait_until(Duration::from_secs(10), || packet_sockets(pid).is_empty());
    let sockets = packet_sockets(pid);
    let receivers = sockets.iter().filter(|p| **p != 0).count();
    eprintln!(
        "footprint: {n} leases: RSS {rss0} → {rss} KiB ({:.1} KiB/lease), threads {threads0} → {threads} (peak {peak}), packet sockets {} ({receivers} receiving); 0.5 s after the last ADD: RSS {rss_bench} KiB ({:.1} KiB/lease), {threads_bench} threads",
        rss.saturating_sub(rss0) as f64 / n as f64,
        sockets.len(),
        rss_bench.saturating_sub(rss0) as f64 / n as f64,
    );
    if let Some(hold) = std::env::var("XDHCP_FOOTPRINT_HOLD")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        eprintln!("holding agent pid {pid} for {hold} s");
        std::thread::sleep(Duration::from_secs(hold));
    }
    assert_eq!(
        receivers, 0,
        "AF_PACKET receive sockets still open after the handover to eBPF"
    );
    // Bound leases send nothing until T1: their senders are closed too, so
    // that an agent that dies holding every lease exits at once instead of
    // closing a packet socket per lease, a grace period each.
    assert_eq!(
        sockets.len(),
        0,
        "packet sockets still open with every lease bound and idle"
    );
    assert!(
        threads <= THREAD_BOUND as u64,
        "{threads} OS threads with {n} leases held (bound {THREAD_BOUND})"
    );
    drop(sampler);
    drop(agent);
}

/// The per-lease removal watch (a bare netlink socket opened with the link,
/// no connection task) still ends a lease as soon as its interface goes,
/// and leaves the other leases alone.
#[test]
fn a_lease_ends_when_its_interface_is_deleted() {
    let lab = Lab::with_clients(2);
    let _dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let agent = TestAgent::start();
    let (socket, log) = (&agent.socket, || agent.log());
    let client = Client::new(socket, Duration::from_mins(1));
    wait_ready(&client, &log);
    for (i, c) in lab.clients.iter().enumerate() {
        client
            .post::<_, serde_json::Value>(rpc::PATH_ADD, &request(c, &format!("gone-{i}")))
            .unwrap_or_else(|e| panic!("ADD {i}: {e}\n{}", log()));
    }
    let leases = || -> Vec<rpc::LeaseView> { client.get(rpc::PATH_LEASES).expect("lease table") };
    assert_eq!(leases().len(), 2);
    // Once on eBPF no AF_PACKET receiver is left to see the interface go.
    let on_ebpf = wait_until(Duration::from_secs(10), || {
        let s: rpc::AgentStatus = client.get(rpc::PATH_STATUS).expect("status");
        s.interfaces.len() == 2 && s.interfaces.iter().all(|i| i.attach == "tc")
    });
    assert!(on_ebpf, "leases did not move to eBPF:\n{}", log());
    // Deleting the bridge end deletes the pod end of the veth too.
    lab.server.link_del(lab.clients[0].port());
    let ended = wait_until(Duration::from_secs(5), || {
        let l = leases();
        l.len() == 1 && l[0].container_id == "gone-1"
    });
    assert!(ended, "lease table: {:?}\n{}", leases(), log());
}
