//! `cargo xtask bench flood`: junk frames to UDP port 68 on leased pod
//! interfaces, at several offered rates, while the leases renew every 10 s —
//! xdhcp side by side with the upstream CNI `dhcp` daemon and with a bare
//! receiver, in one run.
//!
//! Testbed: dnsmasq (`--no-ping`, 120 s leases, T1 10 s) behind a lab
//! bridge; a few pod namespaces with a veth each into the bridge, leased
//! through the plugin under test; one more namespace, the flooder, on an
//! uplink-like port of the same bridge. The flooder sends from an
//! `AF_PACKET` socket, paced, to the pods' MACs and leased addresses, in
//! turn four kinds of frame:
//! - non-DHCP UDP to port 68 (source port 9999);
//! - malformed DHCP (UDP 67 → 68, a BOOTP header cut at 100 bytes);
//! - well-formed DHCPACKs with random xids;
//! - a reply storm for owned xids: DHCPOFFERs carrying the xid each pod last
//!   sent (a sniffer on the server's side of the bridge reads them from the
//!   pods' REQUESTs), from a server nobody asked.
//!
//! For each daemon and each rate (0 first: the idle baseline), for
//! `XDHCP_BENCH_FLOOD_SECS` (default 30) seconds: the daemon's CPU (from
//! `/proc/<pid>/stat`) and RSS sampled every second, the rate the flooder
//! achieved against the rate offered, the renewals the server saw (its lease
//! file) and the longest gap between two renewals of one lease (a missed
//! renewal shows as a gap past T1 + 5 s), and for xdhcp its own counters:
//! the kernel program's outcomes and the engine's dropped replies, against
//! the frames sent. The floor: a bare receiver — one unfiltered `AF_PACKET`
//! socket per pod interface that reads every frame and does nothing else —
//! what copying every frame to user space costs at that rate, whoever does it.
//!
//! Results: `$XDHCP_BENCH_RESULTS/flood.md` and `flood-cpu.svg` (CPU against
//! the achieved rate). `XDHCP_BENCH_FLOOD_RATES=0,10000,…` changes the rates,
//! `XDHCP_BENCH_ONLY=xdhcp|upstream` runs one daemon (and the floor).
#![expect(clippy::print_stdout, reason = "a benchmark report")]
#![expect(
    clippy::cast_precision_loss,
    reason = "counts far below 2^52 turned into rates"
)]

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
    net::{Ipv4Addr, SocketAddr},
    os::fd::{AsRawFd as _, OwnedFd},
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use xdhcp_tests::{
    bench::{self, Daemon, DaemonOptions, Impl, Series},
    netns::{Lab, NetNs, Veth},
    progress,
    servers::{Dnsmasq, DnsmasqConfig},
};

const PODS: usize = 4;
const LEASE_SECS: u32 = 120;
const T1_SECS: u32 = 10;
const FAKE_SERVER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 254);
/// Longer than the agent's kernel counter poll (5 s).
const COUNTER_SETTLE: Duration = Duration::from_secs(6);
const FLOOD_MAC: [u8; 6] = [0x02, 0xf1, 0x00, 0x00, 0x00, 0x01];

/// Who receives the flood.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Receiver {
    Daemon(Impl),
    /// An unfiltered `AF_PACKET` socket per pod that reads every frame.
    Bare,
}

impl Receiver {
    fn name(self) -> &'static str {
        match self {
            Receiver::Daemon(i) => i.name(),
            Receiver::Bare => "bare AF_PACKET receiver (floor)",
        }
    }
}

/// One (receiver, rate) phase.
struct Phase {
    who: Receiver,
    offered: u64,
    achieved: f64,
    sent: [u64; 4],
    sender_cpu_ms: u64,
    /// Receiver CPU over the phase, in % of one core.
    cpu_pct: f64,
    /// Max CPU % of one core over any one-second sample.
    cpu_peak: f64,
    rss_first: u64,
    rss_last: u64,
    rss_max: u64,
    renewals: usize,
    /// Longest gap between two renewals of one lease (or since the phase
    /// started), seconds.
    max_gap: f64,
    /// Counter deltas (xdhcp): kernel outcomes and engine drops.
    counters: BTreeMap<String, f64>,
}

fn main() {
    let xdhcp = bench::xdhcp_bin();
    let _ = bench::upstream();
    xdhcp_tests::netns::sweep_leftovers();
    let secs: u64 = std::env::var("XDHCP_BENCH_FLOOD_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let rates: Vec<u64> = std::env::var("XDHCP_BENCH_FLOOD_RATES").ok().map_or_else(
        || vec![0, 10_000, 50_000, 100_000],
        |v| v.split(',').filter_map(|r| r.trim().parse().ok()).collect(),
    );
    progress!("building a lab: {PODS} pods, a DHCP server and a flooder on one bridge…");
    let lab = Lab::builder()
        .server_ip(Ipv4Addr::new(198, 18, 0, 1), 24)
        .clients(PODS)
        .build();
    let flooder = NetNs::new();
    let uplink = Veth::new(&lab.server, "fl0", &flooder, "fl1");
    lab.bridge.attach(&uplink.a);
    let mut phases = Vec::new();
    let mut who: Vec<Receiver> = bench::impls().into_iter().map(Receiver::Daemon).collect();
    who.push(Receiver::Bare);
    for w in who {
        phases.extend(run(
            w,
            &xdhcp,
            &lab,
            &flooder,
            &rates,
            Duration::from_secs(secs),
        ));
    }
    drop(uplink);
    report(&phases, secs);
}

fn server(lab: &Lab) -> Dnsmasq {
    Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            range: (
                Ipv4Addr::new(198, 18, 0, 10),
                Ipv4Addr::new(198, 18, 0, 200),
            ),
            netmask: Ipv4Addr::new(255, 255, 255, 0),
            lease_secs: LEASE_SECS,
            t1_secs: Some(T1_SECS),
            router: Some(Ipv4Addr::new(198, 18, 0, 1)),
            dns: vec![],
            ..DnsmasqConfig::default()
        },
    )
}

/// The counters of the agent's `/metrics` this bench accounts frames with.
fn counters(metrics: SocketAddr) -> BTreeMap<String, f64> {
    let text = bench::http_get(metrics, "/metrics").unwrap_or_default();
    let mut out = BTreeMap::new();
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((key, value)) = l.rsplit_once(' ') else {
            continue;
        };
        let interesting = ["xdhcp_kernel_frames_total{", "xdhcp_dropped_replies_total{"]
            .iter()
            .any(|p| key.starts_with(p))
            || key == "xdhcp_renewals_total"
            || key.starts_with("xdhcp_failures_total");
        if interesting && let Ok(v) = value.parse::<f64>() {
            out.insert(key.to_owned(), v);
        }
    }
    out
}

#[allow(clippy::too_many_lines, reason = "one linear script per receiver")]
fn run(
    who: Receiver,
    xdhcp: &Path,
    lab: &Lab,
    flooder: &NetNs,
    rates: &[u64],
    secs: Duration,
) -> Vec<Phase> {
    let dnsmasq = server(lab);
    let metrics = bench::free_local_addr();
    // The pods' leases: through the daemon under test; for the bare receiver
    // (no DHCP client at all) the addresses are only needed as destinations.
    let daemon = match who {
        Receiver::Daemon(i) => {
            let d = Daemon::start_with(
                i,
                xdhcp,
                &DaemonOptions {
                    metrics: Some(metrics),
                    ..DaemonOptions::default()
                },
            );
            for (n, c) in lab.clients.iter().enumerate() {
                if let Err(e) = d.cni("ADD", &format!("flood-{n}"), c) {
                    panic!("{}: ADD failed before the flood: {e}", i.name());
                }
            }
            Some(d)
        }
        Receiver::Bare => None,
    };
    if daemon.is_some() {
        bench::configure_leased(&lab.clients, &dnsmasq.leases(), 24);
    }
    let targets: Vec<([u8; 6], Ipv4Addr)> = lab
        .clients
        .iter()
        .enumerate()
        .map(|(n, c)| {
            let ip = dnsmasq
                .lease_for(c.mac)
                .map_or(Ipv4Addr::new(198, 18, 0, 100 + n as u8), |l| l.ip);
            (c.mac, ip)
        })
        .collect();
    progress!(
        "{}: {} pods leased; flooding at {:?} pps, {} s each",
        who.name(),
        targets.len(),
        rates,
        secs.as_secs()
    );
    // The sniffer: the xid each pod last sent, read on the server's side.
    let owned: Arc<Mutex<HashMap<[u8; 6], u32>>> = Arc::default();
    let stop_sniff = Arc::new(AtomicBool::new(false));
    let sniffer = {
        let (owned, stop) = (owned.clone(), stop_sniff.clone());
        let ns = lab.server.path().to_path_buf();
        std::thread::spawn(move || sniff(&ns, Lab::BRIDGE, &owned, &stop))
    };
    let mut phases = Vec::new();
    for &rate in rates {
        // The bare receiver's sockets live for one phase.
        let bare_stop = Arc::new(AtomicBool::new(false));
        let bare_cpu = Arc::new(AtomicU64::new(0));
        let bare: Vec<_> = if who == Receiver::Bare {
            lab.clients
                .iter()
                .map(|c| {
                    let (stop, cpu) = (bare_stop.clone(), bare_cpu.clone());
                    let (ns, ifname) = (c.ns.path().to_path_buf(), c.ifname.clone());
                    std::thread::spawn(move || bare_receive(&ns, &ifname, &stop, &cpu))
                })
                .collect()
        } else {
            Vec::new()
        };
        let pid = daemon.as_ref().and_then(|d| d.process.pid());
        // The agent publishes the kernel counters every few seconds: read
        // them after they have settled, before and after each phase.
        if daemon.is_some() {
            std::thread::sleep(COUNTER_SETTLE);
        }
        let before = daemon.as_ref().map(|_| counters(metrics));
        let started = Instant::now();
        let mut last_seen: HashMap<[u8; 6], (u64, f64)> = dnsmasq
            .leases()
            .into_iter()
            .map(|l| (l.mac, (l.expires_unix, 0.0)))
            .collect();
        let mut max_gap: f64 = 0.0;
        let mut renewals = 0;
        let stop_flood = Arc::new(AtomicBool::new(false));
        let flood = {
            let stop = stop_flood.clone();
            let owned = owned.clone();
            let targets = targets.clone();
            let ns = flooder.path().to_path_buf();
            std::thread::spawn(move || send_flood(&ns, "fl1", rate, &targets, &owned, &stop))
        };
        let cpu0 = pid.map_or(0, bench::cpu_ms_of);
        let mut cpu_prev = cpu0;
        let mut cpu_peak: f64 = 0.0;
        let mut rss = Vec::new();
        let mut next = started + Duration::from_secs(1);
        while started.elapsed() < secs {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            next += Duration::from_secs(1);
            if let Some(p) = pid {
                let c = bench::cpu_ms_of(p);
                cpu_peak = cpu_peak.max((c - cpu_prev) as f64 / 10.0);
                cpu_prev = c;
                rss.push(bench::footprint_of(p).0);
            }
            let now = started.elapsed().as_secs_f64();
            for l in dnsmasq.leases() {
                let e = last_seen.entry(l.mac).or_insert((l.expires_unix, 0.0));
                if l.expires_unix > e.0 {
                    renewals += 1;
                    max_gap = max_gap.max(now - e.1);
                    *e = (l.expires_unix, now);
                }
            }
        }
        let elapsed = started.elapsed();
        stop_flood.store(true, Ordering::SeqCst);
        let (sent, sender_cpu_ms) = flood.join().expect("flooder");
        bare_stop.store(true, Ordering::SeqCst);
        for b in bare {
            b.join().expect("bare receiver");
        }
        let now = started.elapsed().as_secs_f64();
        if who != Receiver::Bare {
            // A lease not renewed since the phase began counts its whole gap.
            for (_, at) in last_seen.values() {
                max_gap = max_gap.max(now - at);
            }
        }
        let cpu_ms = match pid {
            Some(p) => bench::cpu_ms_of(p) - cpu0,
            None => bare_cpu.load(Ordering::SeqCst),
        };
        let cpu_pct = cpu_ms as f64 / elapsed.as_secs_f64() / 10.0;
        let achieved = sent.iter().sum::<u64>() as f64 / elapsed.as_secs_f64();
        let counters = match (&before, daemon.as_ref()) {
            (Some(b), Some(_)) => {
                std::thread::sleep(COUNTER_SETTLE);
                let after = counters(metrics);
                after
                    .iter()
                    .map(|(k, v)| (k.clone(), v - b.get(k).copied().unwrap_or(0.0)))
                    .filter(|(_, v)| *v != 0.0)
                    .collect()
            }
            _ => BTreeMap::new(),
        };
        progress!(
            "{}: offered {rate} pps, achieved {achieved:.0} pps; CPU {cpu_pct:.1} % (peak {cpu_peak:.0} %); \
             {renewals} renewals, longest gap {max_gap:.1} s",
            who.name()
        );
        phases.push(Phase {
            who,
            offered: rate,
            achieved,
            sent,
            sender_cpu_ms,
            cpu_pct,
            cpu_peak,
            rss_first: rss.first().copied().unwrap_or(0),
            rss_last: rss.last().copied().unwrap_or(0),
            rss_max: rss.iter().copied().max().unwrap_or(0),
            renewals,
            max_gap: if who == Receiver::Bare { 0.0 } else { max_gap },
            counters,
        });
    }
    stop_sniff.store(true, Ordering::SeqCst);
    let _ = sniffer.join();
    if let Some(d) = &daemon {
        for (n, c) in lab.clients.iter().enumerate() {
            let _ = d.cni("DEL", &format!("flood-{n}"), c);
            let _ = c.ns.exec_output(&["ip", "addr", "flush", "dev", &c.ifname]);
        }
    }
    drop(daemon);
    drop(dnsmasq);
    phases
}

/// An `AF_PACKET` raw socket for `proto` bound to `ifname` in the calling
/// thread's namespace, with a 100 ms receive timeout.
fn packet_socket(ifname: &str, proto: u16) -> OwnedFd {
    let ifindex = nix::net::if_::if_nametoindex(ifname)
        .unwrap_or_else(|e| panic!("no interface {ifname}: {e}"));
    xdhcp_tests::netns::packet_socket_here(ifindex, proto, Some(Duration::from_millis(100)))
        .unwrap_or_else(|e| panic!("AF_PACKET socket on {ifname}: {e}"))
}

/// CPU time of the calling thread, in ms.
fn thread_cpu_ms() -> u64 {
    // SAFETY: getrusage fills the struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &raw mut ru);
        ru
    };
    let ms = |t: libc::timeval| t.tv_sec as u64 * 1000 + t.tv_usec as u64 / 1000;
    ms(ru.ru_utime) + ms(ru.ru_stime)
}

/// Reads the pods' DHCP requests on `ifname` in `ns` and keeps the latest xid
/// per client MAC.
fn sniff(ns: &Path, ifname: &str, owned: &Mutex<HashMap<[u8; 6], u32>>, stop: &AtomicBool) {
    let ifname = ifname.to_owned();
    xdhcp::sys::netns::run_in_netns(ns, move || {
        let fd = packet_socket(&ifname, libc::ETH_P_IP as u16);
        let mut buf = [0u8; 2048];
        while !stop.load(Ordering::SeqCst) {
            // SAFETY: reading into a buffer we own.
            let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            let Ok(n) = usize::try_from(n) else { continue };
            // Ethernet 14, IPv4 (IHL from the header), UDP 8, BOOTP.
            if n < 14 + 20 + 8 + 44 || buf[23] != 17 {
                continue;
            }
            let ip = 14 + usize::from(buf[14] & 0x0f) * 4;
            let udp_src = u16::from_be_bytes([buf[ip], buf[ip + 1]]);
            let bootp = ip + 8;
            if udp_src != 68 || n < bootp + 34 || buf[bootp] != 1 {
                continue;
            }
            let xid = u32::from_be_bytes(buf[bootp + 4..bootp + 8].try_into().expect("4 bytes"));
            let mac: [u8; 6] = buf[bootp + 28..bootp + 34].try_into().expect("6 bytes");
            owned.lock().expect("owned xids").insert(mac, xid);
        }
    })
    .expect("sniffer in the server namespace");
}

/// One frame of each kind per target, built once; the sender patches xids.
struct Frames {
    /// [kind][target] → frame.
    frames: [Vec<Vec<u8>>; 4],
}

/// Offset of the BOOTP xid in a reply frame.
const XID_AT: usize = 14 + 20 + 8 + 4;

fn ipv4_udp(
    dst_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = Vec::with_capacity(42 + payload.len());
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&FLOOD_MAC);
    f.extend_from_slice(&[0x08, 0x00]);
    let total = (20 + 8 + payload.len()) as u16;
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let mut sum: u32 = ip
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    // UDP checksum 0: none (allowed over IPv4).
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    f
}

/// A BOOTREPLY of DHCP message type `kind` for `mac`/`ip` from `FAKE_SERVER`.
fn reply(mac: [u8; 6], ip: Ipv4Addr, kind: u8) -> Vec<u8> {
    let mut b = vec![0u8; 236];
    b[0] = 2;
    b[1] = 1;
    b[2] = 6;
    b[16..20].copy_from_slice(&ip.octets());
    b[28..34].copy_from_slice(&mac);
    b.extend_from_slice(&[99, 130, 83, 99]);
    b.extend_from_slice(&[53, 1, kind]);
    b.extend_from_slice(&[54, 4]);
    b.extend_from_slice(&FAKE_SERVER.octets());
    b.extend_from_slice(&[51, 4, 0, 0, 0x0e, 0x10]);
    b.extend_from_slice(&[1, 4, 255, 255, 255, 0]);
    b.push(255);
    b.resize(300, 0);
    b
}

impl Frames {
    fn new(targets: &[([u8; 6], Ipv4Addr)]) -> Frames {
        let each = |f: &dyn Fn([u8; 6], Ipv4Addr) -> Vec<u8>| {
            targets.iter().map(|(m, i)| f(*m, *i)).collect::<Vec<_>>()
        };
        Frames {
            frames: [
                each(&|m, i| ipv4_udp(m, FAKE_SERVER, i, 9999, 68, &[0x5a; 64])),
                each(&|m, i| ipv4_udp(m, FAKE_SERVER, i, 67, 68, &reply(m, i, 5)[..100])),
                each(&|m, i| ipv4_udp(m, FAKE_SERVER, i, 67, 68, &reply(m, i, 5))),
                each(&|m, i| ipv4_udp(m, FAKE_SERVER, i, 67, 68, &reply(m, i, 2))),
            ],
        }
    }
}

/// Sends the four kinds in turn to the targets in turn at `rate` frames/s
/// (0: none) until `stop`; returns the frames sent per kind and the
/// sender's CPU time (ms).
fn send_flood(
    ns: &Path,
    ifname: &str,
    rate: u64,
    targets: &[([u8; 6], Ipv4Addr)],
    owned: &Mutex<HashMap<[u8; 6], u32>>,
    stop: &AtomicBool,
) -> ([u64; 4], u64) {
    let ifname = ifname.to_owned();
    xdhcp::sys::netns::run_in_netns(ns, move || {
        let mut sent = [0u64; 4];
        if rate == 0 {
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(50));
            }
            return (sent, thread_cpu_ms());
        }
        let fd = packet_socket(&ifname, libc::ETH_P_IP as u16);
        let mut frames = Frames::new(targets);
        let mut xids: Vec<Option<u32>> = vec![None; targets.len()];
        let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
        let started = Instant::now();
        let mut refreshed: Option<Instant> = None;
        let mut n: u64 = 0;
        while !stop.load(Ordering::SeqCst) {
            if refreshed.is_none_or(|r| r.elapsed() >= Duration::from_millis(100)) {
                refreshed = Some(Instant::now());
                let o = owned.lock().expect("owned xids");
                for (t, (mac, _)) in targets.iter().enumerate() {
                    xids[t] = o.get(mac).copied();
                }
            }
            let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
            if n >= due {
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            while n < due {
                let kind = (n % 4) as usize;
                let t = ((n / 4) % targets.len() as u64) as usize;
                let frame = &mut frames.frames[kind][t];
                match kind {
                    2 => {
                        // xorshift: a fresh random xid per frame.
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        frame[XID_AT..XID_AT + 4].copy_from_slice(&(rng as u32).to_be_bytes());
                    }
                    3 => {
                        if let Some(x) = xids[t] {
                            frame[XID_AT..XID_AT + 4].copy_from_slice(&x.to_be_bytes());
                        }
                    }
                    _ => {}
                }
                // SAFETY: sending a buffer we own on a socket we own.
                let rc =
                    unsafe { libc::send(fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
                if rc < 0 {
                    // A full queue: count nothing, let the pacing catch up.
                    break;
                }
                sent[kind] += 1;
                n += 1;
            }
        }
        (sent, thread_cpu_ms())
    })
    .expect("flooder in its namespace")
}

/// Reads every frame on `ifname` in `ns` until `stop`; adds its CPU time to `cpu`.
fn bare_receive(ns: &Path, ifname: &str, stop: &AtomicBool, cpu: &AtomicU64) {
    let ifname = ifname.to_owned();
    xdhcp::sys::netns::run_in_netns(ns, move || {
        let fd = packet_socket(&ifname, libc::ETH_P_ALL as u16);
        let mut buf = [0u8; 2048];
        while !stop.load(Ordering::SeqCst) {
            // SAFETY: reading into a buffer we own.
            let _ = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        }
        cpu.fetch_add(thread_cpu_ms(), Ordering::SeqCst);
    })
    .expect("bare receiver in the pod namespace");
}

#[allow(clippy::too_many_lines, reason = "one table")]
fn report(phases: &[Phase], secs: u64) {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Junk to UDP 68 on leased interfaces: xdhcp vs. upstream `dhcp` ({}) vs. a bare receiver\n",
        bench::upstream().display()
    );
    let _ = writeln!(
        md,
        "Same testbed, same run: {PODS} pods leased from dnsmasq (`--no-ping`, {LEASE_SECS} s leases, \
         T1 {T1_SECS} s) on a lab bridge; a flooder namespace on an uplink-like port of the bridge \
         sends, paced from one `AF_PACKET` socket, in turn: non-DHCP UDP to 68, DHCP cut at 100 bytes, \
         DHCPACKs with random xids, DHCPOFFERs with the xid each pod last sent — to the pods' MACs and \
         addresses. {secs} s per rate. CPU is the receiver's (user + system, % of one core, from \
         `/proc/<pid>/stat`; the bare receiver's threads by `getrusage`); softirq work done on the \
         sender's CPU is in nobody's figure. Renewals as the server saw them; a missed renewal shows \
         as a gap past T1 + 5 s. Machine: {} cores.\n",
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get)
    );
    let _ = writeln!(
        md,
        "| receiver | offered pps | achieved pps | CPU % (peak) | RSS KiB first → last (max) | renewals / longest gap (s) | vs. upstream | vs. floor |\n|---|---|---|---|---|---|---|---|"
    );
    let find = |w: Receiver, rate: u64| phases.iter().find(|p| p.who == w && p.offered == rate);
    for p in phases {
        let up = find(Receiver::Daemon(Impl::Upstream), p.offered);
        let floor = find(Receiver::Bare, p.offered);
        let ratio = |o: Option<&Phase>| match o {
            Some(o) if o.who != p.who && o.cpu_pct > 0.05 => {
                format!("{:.2}×", p.cpu_pct / o.cpu_pct)
            }
            Some(o) if o.who != p.who => "(other ≈ 0)".to_owned(),
            _ => String::new(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {:.1} ({}) | {} → {} ({}) | {} | {} | {} |",
            p.who.name(),
            p.offered,
            p.achieved,
            p.cpu_pct,
            if p.who == Receiver::Bare {
                "–".to_owned()
            } else {
                format!("{:.0}", p.cpu_peak)
            },
            p.rss_first,
            p.rss_last,
            p.rss_max,
            if p.who == Receiver::Bare {
                "–".to_owned()
            } else {
                format!("{} / {:.1}", p.renewals, p.max_gap)
            },
            ratio(up),
            ratio(floor),
        );
    }
    let _ = writeln!(
        md,
        "\nFrames sent per kind (non-DHCP / malformed / random-xid ACK / owned-xid OFFER) and the \
         flooder's own CPU; for xdhcp, what its counters say happened to them (deltas over the \
         phase; `kernel_frames` are the eBPF program's outcomes on the pod interfaces, \
         `dropped_replies` the engine's):\n"
    );
    for p in phases.iter().filter(|p| p.offered > 0) {
        let _ = writeln!(
            md,
            "- {} at {} pps: sent {} / {} / {} / {} (total {}), flooder CPU {} ms{}",
            p.who.name(),
            p.offered,
            p.sent[0],
            p.sent[1],
            p.sent[2],
            p.sent[3],
            p.sent.iter().sum::<u64>(),
            p.sender_cpu_ms,
            if p.counters.is_empty() {
                String::new()
            } else {
                format!(
                    "; counters: {}",
                    p.counters
                        .iter()
                        .map(|(k, v)| format!("`{k}` +{v:.0}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        );
    }
    println!("\n{md}");
    if let Some(path) = bench::results_path("flood-cpu.svg") {
        let mut series: Vec<Series> = Vec::new();
        for w in [
            Receiver::Daemon(Impl::Upstream),
            Receiver::Daemon(Impl::Xdhcp),
            Receiver::Bare,
        ] {
            let points: Vec<(f64, f64)> = phases
                .iter()
                .filter(|p| p.who == w)
                .map(|p| (p.achieved / 1000.0, p.cpu_pct))
                .collect();
            if !points.is_empty() {
                series.push(Series {
                    label: w.name().to_owned(),
                    points,
                });
            }
        }
        bench::plot_lines(
            &path,
            "Receiver CPU against the junk frame rate on UDP 68",
            "achieved rate (thousand frames/s)",
            "CPU (% of one core)",
            &series,
        );
        let _ = writeln!(md, "\n![CPU against flood rate](flood-cpu.svg)");
    }
    bench::write_result("flood.md", &md);
}
