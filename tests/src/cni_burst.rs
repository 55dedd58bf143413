//! Bursts of concurrent CNI ADDs through a daemon's plugin and the floor
//! under them (as many plugin execs that do no DHCP, plus the server's own
//! exchanges straight from this process): what `cargo xtask bench cni` and
//! `bench kea1000` measure.
#![expect(clippy::print_stderr, reason = "benchmark progress goes to stderr")]

use std::{
    fmt::Write as _,
    path::Path,
    time::{Duration, Instant},
};

use xdhcp::datapath::{afpacket::AfPacketReceiver, rawsock::RawSender};
use xdhcp_engine::{Client, ClientConfig, Event, MessageKind, PacketSource};

use crate::{bench::Daemon, netns::LabClient, servers::ServerLease};

fn unix_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros()
}

fn unix_ms() -> u128 {
    crate::bench::unix_ms()
}

/// The server's lease database as it stands (its guard's `leases()`).
pub type Leases<'a> = &'a dyn Fn() -> Vec<ServerLease>;

/// Waits until the server holds no lease for `clients` — every RELEASE
/// processed and its lease database rewritten — so that no round, floor or
/// ADD, queues behind the previous one's releases (dnsmasq rewrites and
/// fsyncs its lease file for each). Gives up after 10 s, saying so.
pub fn settle(leases: Leases<'_>, clients: &[LabClient]) {
    let held = || {
        leases()
            .iter()
            .filter(|l| clients.iter().any(|c| c.mac == l.mac))
            .count()
    };
    if !crate::servers::wait_until(Duration::from_secs(10), || held() == 0) {
        eprintln!(
            "  the server still holds {} of {} leases 10 s after their release",
            held(),
            clients.len()
        );
    }
}

/// CPU time, as `/proc` counts it: one process's (every thread, user and
/// system) and the whole machine's (every CPU's time not idle).
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuTime {
    pub process: Duration,
    pub machine: Duration,
}

impl CpuTime {
    /// Now, for process `pid` (zero when it cannot be read).
    pub fn now(pid: Option<u32>) -> Self {
        let ticks = ticks_of_clock();
        let machine = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| {
                let cpu = s.lines().next()?.strip_prefix("cpu ")?.to_owned();
                let f: Vec<u64> = cpu
                    .split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect();
                // user nice system idle iowait irq softirq steal …: busy is
                // all but idle and iowait (guest time is inside user).
                let busy: u64 = f.iter().take(8).sum::<u64>() - f.get(3)? - f.get(4)?;
                Some(ticks(busy))
            })
            .unwrap_or_default();
        let process = pid
            .and_then(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
            .and_then(|s| {
                // After the command's closing parenthesis: state is field 3,
                // utime and stime fields 14 and 15.
                let f: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
                let n: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
                Some(ticks(n))
            })
            .unwrap_or_default();
        Self { process, machine }
    }

    /// What was spent from `earlier` to `self`.
    #[must_use]
    pub fn since(self, earlier: Self) -> Self {
        Self {
            process: self.process.saturating_sub(earlier.process),
            machine: self.machine.saturating_sub(earlier.machine),
        }
    }
}

/// One clock tick of `/proc`'s CPU times: the resolution of [`CpuTime`].
pub fn clock_tick() -> Duration {
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Duration::from_nanos(1_000_000_000 / u64::try_from(hz).ok().filter(|&h| h > 0).unwrap_or(100))
}

/// `/proc`'s CPU times (in clock ticks) as durations.
fn ticks_of_clock() -> impl Fn(u64) -> Duration {
    let tick = clock_tick();
    move |n| tick.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX))
}

/// The CPU cells of a report for the rounds of one burst size (`n` ADDs
/// each): the daemon's CPU per ADD, and the machine's busy time over the
/// rounds' wall time on every core; "–" where the rounds took fewer than
/// 20 of `/proc`'s clock ticks of it (too coarse to say).
pub fn cpu_cells<'a>(bursts: impl IntoIterator<Item = &'a Burst>, n: usize) -> (String, String) {
    let (mut daemon, mut machine, mut wall, mut rounds) =
        (Duration::ZERO, Duration::ZERO, Duration::ZERO, 0u32);
    for b in bursts {
        daemon += b.cpu.process;
        machine += b.cpu.machine;
        wall += b.wall;
        rounds += 1;
    }
    let coarse = clock_tick() * 20;
    let adds = f64::from(rounds) * f64::from(u32::try_from(n).unwrap_or(u32::MAX));
    let per_add = if daemon >= coarse && adds > 0.0 {
        format!("{:.2} ms", daemon.as_secs_f64() * 1000.0 / adds)
    } else {
        "–".to_owned()
    };
    let cores = std::thread::available_parallelism()
        .ok()
        .and_then(|c| u32::try_from(c.get()).ok())
        .unwrap_or(1);
    let busy = if machine >= coarse {
        format!(
            "{:.0} %",
            100.0 * machine.as_secs_f64() / (wall.as_secs_f64() * f64::from(cores)).max(1e-9)
        )
    } else {
        "–".to_owned()
    };
    (per_add, busy)
}

/// One burst of ADDs: its wall time and each ADD's own.
pub struct Burst {
    pub wall: Duration,
    /// The CPU the daemon and the machine spent during the burst.
    pub cpu: CpuTime,
    /// The successful ADDs' own latencies, sorted.
    pub lat: Vec<Duration>,
    pub failed: usize,
    pub first_error: Option<String>,
}

/// `n` concurrent ADDs on clients `0..n`, container ids `<tag>-<i>`.
pub fn burst(d: &Daemon, clients: &[LabClient], tag: &str) -> Burst {
    let cpu_before = CpuTime::now(d.process.pid());
    let started = Instant::now();
    let t0 = unix_us();
    let timed: Vec<(u128, u128, Result<Duration, String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(i, c)| {
                s.spawn(move || {
                    let a = unix_us();
                    let r = d.cni("ADD", &format!("{tag}-{i}"), c);
                    (a, unix_us(), r)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("ADD thread"))
            .collect()
    });
    let wall = started.elapsed();
    let cpu = CpuTime::now(d.process.pid()).since(cpu_before);
    if let Some(dir) = std::env::var_os("XDHCP_BENCH_LOG_DIR") {
        // When each plugin ran, relative to the burst's start (µs).
        let mut text = format!("start {t0}\n");
        for (i, (a, b, _)) in timed.iter().enumerate() {
            let _ = writeln!(text, "{tag}-{i} {} {}", a - t0, b - t0);
        }
        let name = format!("{}-{tag}-{t0}.txt", d.which.name().replace(' ', "-"));
        let _ = std::fs::write(Path::new(&dir).join(name), text);
    }
    let results: Vec<Result<Duration, String>> = timed.into_iter().map(|(_, _, r)| r).collect();
    let failed: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    let mut lat: Vec<Duration> = results
        .iter()
        .filter_map(|r| r.as_ref().ok().copied())
        .collect();
    lat.sort();
    Burst {
        wall,
        cpu,
        lat,
        failed: failed.len(),
        first_error: failed.first().map(|s| (*s).clone()),
    }
}

/// `n` concurrent plugin execs that do no DHCP at all (`CNI_COMMAND=VERSION`,
/// same environment and stdin as an ADD): what exec alone costs on this
/// machine, the exec part of the floor under a burst of `n` ADDs.
pub fn exec_floor(d: &Daemon, clients: &[LabClient]) -> Duration {
    let started = Instant::now();
    std::thread::scope(|s| {
        for (i, c) in clients.iter().enumerate() {
            s.spawn(move || {
                if let Err(e) = d.cni("VERSION", &format!("floor-{i}"), c) {
                    eprintln!("  VERSION failed: {e}");
                }
            });
        }
    });
    started.elapsed()
}

/// The server's own exchanges: one DORA per client straight from this
/// process — the xdhcp engine over raw/`AF_PACKET` sockets opened
/// beforehand in each client's namespace, no CNI, no plugin exec, no agent
/// — one after another (wall time from the first DISCOVER to the last
/// ACK), and its failures; every lease released after; the fastest of
/// `passes` such runs (a chain of 4·n wake-ups, each at the
/// scheduler's mercy on a loaded machine, varied up to 5× between
/// consecutive runs where the concurrent ADDs vary far less). Back to back
/// because that is this client's fastest: dnsmasq serves one packet at a
/// time, and the same DORAs fired all at once from here took 7–15× longer
/// on the development VM (every broadcast floods every bridge port and
/// some are lost, costing a retransmission).
pub fn raw_dora_burst(
    clients: &[LabClient],
    leases: Leases<'_>,
    passes: usize,
) -> (Duration, usize) {
    raw_dora_passes(clients, leases, passes, None)
        .into_iter()
        .min_by_key(|&(wall, failed)| (failed, wall))
        .expect("at least one pass")
}

/// [`raw_dora_burst`]'s every pass (its wall time and failures), each
/// started once `gate` lets it (when given: another burst started beside
/// it waits at the same gate, so both run at once).
pub fn raw_dora_passes(
    clients: &[LabClient],
    leases: Leases<'_>,
    passes: usize,
    gate: Option<&std::sync::Barrier>,
) -> Vec<(Duration, usize)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let mut socks = Vec::with_capacity(clients.len());
        for c in clients {
            let tx = RawSender::open_async(c.ns.path(), &c.ifname)
                .await
                .expect("raw sender in the client namespace");
            let rx = AfPacketReceiver::open_async(c.ns.path(), &c.ifname)
                .await
                .expect("AF_PACKET receiver in the client namespace");
            // As the agent does: each socket takes only its client's replies.
            rx.only_for(c.mac)
                .expect("narrow the receiver to its client");
            socks.push((tx, rx, c.mac));
        }
        let mut runs = Vec::with_capacity(passes);
        for pass in 0..passes {
            if let Some(gate) = gate {
                gate.wait();
            }
            let started = Instant::now();
            let mut failed = 0;
            let mut bound = Vec::with_capacity(socks.len());
            for (i, (tx, rx, mac)) in socks.iter().enumerate() {
                let cfg = ClientConfig {
                    chaddr: *mac,
                    ..ClientConfig::default()
                };
                let seed = 0x5eed + (pass * socks.len() + i) as u64;
                let mut client = Client::new(cfg, Instant::now(), seed);
                if until_bound(tx, rx, &mut client).await {
                    bound.push((client, i));
                } else {
                    failed += 1;
                }
            }
            let wall = started.elapsed();
            // Released only once every client is bound, as the CNI bursts'
            // DELs come after them.
            for (mut client, i) in bound {
                release_now(&mut client, &socks[i].0);
            }
            settle(leases, clients);
            runs.push((wall, failed));
        }
        runs
    })
}

pub fn release_now(client: &mut Client, tx: &RawSender) {
    client.set_wall_clock_unix_ms(unix_ms() as u64);
    client.release(Instant::now());
    while let Some(t) = client.poll_transmit() {
        if t.kind == MessageKind::Release {
            let _ = tx.send_transmit(&t);
        }
    }
}

/// Drives `client` to `Bound` (true) or gives up after 10 s (false).
pub async fn until_bound(tx: &RawSender, rx: &AfPacketReceiver, client: &mut Client) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        while let Some(t) = client.poll_transmit() {
            if tx.send_transmit(&t).is_err() {
                return false;
            }
        }
        while let Some(ev) = client.poll_event() {
            match ev {
                Event::Bound(_) => return true,
                Event::Failed(_) => return false,
                _ => {}
            }
        }
        let timer = client
            .poll_timeout()
            .map_or(deadline, tokio::time::Instant::from_std)
            .min(deadline);
        tokio::select! {
            frame = rx.recv() => {
                let Ok(frame) = frame else { return false };
                client.set_wall_clock_unix_ms(unix_ms() as u64);
                let src = PacketSource { src_mac: frame.headers.src_mac, src_ip: frame.headers.src_ip };
                let _ = client.handle_packet(Instant::now(), src, &frame.payload);
            }
            () = tokio::time::sleep_until(timer) => {
                if tokio::time::Instant::now() >= deadline {
                    return false;
                }
                client.set_wall_clock_unix_ms(unix_ms() as u64);
                client.handle_timeout(Instant::now());
            }
        }
    }
}

pub fn del_all(d: &Daemon, clients: &[LabClient], tag: &str) {
    std::thread::scope(|s| {
        for (i, c) in clients.iter().enumerate() {
            s.spawn(move || {
                let _ = d.cni("DEL", &format!("{tag}-{i}"), c);
            });
        }
    });
}

/// The link-local address of `ifname` in the calling thread's namespace,
/// once past duplicate address detection.
fn link_local_here(ifname: &str) -> Option<std::net::Ipv6Addr> {
    let table = std::fs::read_to_string("/proc/thread-self/net/if_inet6").ok()?;
    table.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // address, ifindex, prefix length, scope (0x20 = link), flags, name;
        // flag 0x40 is tentative.
        let flags = u32::from_str_radix(f.get(4)?, 16).ok()?;
        (f.len() == 6 && f[5] == ifname && f[3] == "20" && flags & 0x40 == 0)
            .then(|| {
                u128::from_str_radix(f[0], 16)
                    .ok()
                    .map(std::net::Ipv6Addr::from)
            })
            .flatten()
    })
}

/// Waits (at most 10 s) until every client's interface has a usable
/// link-local address: a `DHCPv6` client sends from it.
pub fn wait_link_local(clients: &[LabClient]) -> bool {
    crate::servers::wait_until(Duration::from_secs(10), || {
        clients.iter().all(|c| {
            let name = c.ifname.clone();
            c.ns.run_in(move || link_local_here(&name)).is_some()
        })
    })
}

/// The `DHCPv6` twin of [`raw_dora_burst`]: `clients.len()` concurrent
/// exchanges (SOLICIT, ADVERTISE, REQUEST, REPLY; or SOLICIT and REPLY with
/// `rapid_commit`) of xdhcp's v6 engine as a bare client over a UDP socket
/// in each pod's namespace — no CNI, no plugin, no agent — each under its
/// pod's DUID-LL, until every one is bound; then (untimed) each releases.
/// The fastest of `passes` runs, and how many exchanges failed in it.
pub fn v6_exchange_burst(
    clients: &[LabClient],
    passes: usize,
    rapid_commit: bool,
) -> (Duration, usize) {
    v6_exchange_passes(clients, passes, rapid_commit, None)
        .into_iter()
        .min_by_key(|&(took, _)| took)
        .unwrap_or((Duration::ZERO, clients.len()))
}

/// [`v6_exchange_burst`]'s every pass (its wall time and failures), each
/// started once `gate` lets it (see [`raw_dora_passes`]).
pub fn v6_exchange_passes(
    clients: &[LabClient],
    passes: usize,
    rapid_commit: bool,
    gate: Option<&std::sync::Barrier>,
) -> Vec<(Duration, usize)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut socks = Vec::with_capacity(clients.len());
    for c in clients {
        let (name, ifindex) = (c.ifname.clone(), c.ifindex);
        let sock = c.ns.run_in(move || {
            let ll = link_local_here(&name)?;
            let s =
                std::net::UdpSocket::bind(std::net::SocketAddrV6::new(ll, 546, 0, ifindex)).ok()?;
            s.set_nonblocking(true).ok()?;
            Some(s)
        });
        socks.push(sock);
    }
    let mut runs = Vec::with_capacity(passes);
    for pass in 0..passes {
        if let Some(gate) = gate {
            gate.wait();
        }
        let (took, failed) = rt.block_on(async {
            let socks: Vec<Option<tokio::net::UdpSocket>> = socks
                .iter()
                .map(|s| {
                    s.as_ref()
                        .and_then(|s| s.try_clone().ok())
                        .and_then(|s| tokio::net::UdpSocket::from_std(s).ok())
                })
                .collect();
            let started = Instant::now();
            let mut set = tokio::task::JoinSet::new();
            for (i, (c, s)) in clients.iter().zip(socks).enumerate() {
                let (mac, ifindex) = (c.mac, c.ifindex);
                let seed = (unix_us() as u64) ^ ((pass as u64) << 32) ^ i as u64;
                set.spawn(async move {
                    let s = s?;
                    let mut client = v6_client(mac, rapid_commit, seed);
                    let bound = exchange6(&mut client, &s, ifindex, |c| c.lease().is_some()).await;
                    bound.then_some((client, s, ifindex))
                });
            }
            let mut done = Vec::new();
            while let Some(r) = set.join_next().await {
                done.push(r.ok().flatten());
            }
            let took = started.elapsed();
            let failed = done.iter().filter(|d| d.is_none()).count();
            // Give every lease back before the next pass, untimed.
            let mut set = tokio::task::JoinSet::new();
            for (mut client, s, ifindex) in done.into_iter().flatten() {
                set.spawn(async move {
                    client.release(Instant::now());
                    exchange6(&mut client, &s, ifindex, |c| {
                        c.state() == xdhcp_engine::v6::State::Released
                    })
                    .await;
                });
            }
            while set.join_next().await.is_some() {}
            (took, failed)
        });
        runs.push((took, failed));
    }
    runs
}

fn v6_client(mac: [u8; 6], rapid_commit: bool, seed: u64) -> xdhcp_engine::v6::Client {
    let mut cfg = xdhcp_engine::v6::ClientConfig {
        mac,
        rapid_commit,
        acquire_timeout: Some(Duration::from_secs(10)),
        ..xdhcp_engine::v6::ClientConfig::default()
    };
    // As the agent: no random delay before the first SOLICIT.
    cfg.timeouts.sol_max_delay = Duration::ZERO;
    let now = Instant::now();
    let mut c = xdhcp_engine::v6::Client::new(cfg, now, seed);
    c.handle_timeout(now);
    c
}

/// Drives `client` over `sock` until `done` holds (`true`) or it fails or
/// 10 s pass (`false`).
async fn exchange6(
    client: &mut xdhcp_engine::v6::Client,
    sock: &tokio::net::UdpSocket,
    ifindex: u32,
    done: impl Fn(&xdhcp_engine::v6::Client) -> bool,
) -> bool {
    let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut buf = vec![0u8; 2048];
    loop {
        while let Some(t) = client.poll_transmit() {
            let dst = std::net::SocketAddrV6::new(t.dst.address(), 547, 0, ifindex);
            let _ = sock.send_to(&t.payload, dst).await;
        }
        while client.poll_event().is_some() {}
        if done(client) {
            return true;
        }
        if matches!(
            client.state(),
            xdhcp_engine::v6::State::Failed | xdhcp_engine::v6::State::Released
        ) {
            return false;
        }
        let next = client
            .poll_timeout()
            .map_or(give_up, tokio::time::Instant::from_std)
            .min(give_up);
        tokio::select! {
            got = sock.recv_from(&mut buf) => {
                if let Ok((n, std::net::SocketAddr::V6(from))) = got {
                    let _ = client.handle_packet(Instant::now(), *from.ip(), &buf[..n]);
                }
            }
            () = tokio::time::sleep_until(next) => {
                if tokio::time::Instant::now() >= give_up {
                    return false;
                }
                client.handle_timeout(Instant::now());
            }
        }
    }
}
