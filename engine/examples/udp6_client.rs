//! Manual smoke tool for the `DHCPv6` engine: drive it over a plain UDP
//! socket against a real server (no raw sockets, no eBPF). The socket is
//! bound to `IFACE`'s link-local address, port 546; messages go to
//! `ff02::1:2` port 547 (or a server's unicast address). Once bound, the
//! leased address is added to `IFACE` as a /128 with `ip` (DHCPv6 carries
//! no prefix length). Run inside a network namespace of your own:
//!
//! ```text
//! ip netns exec NS cargo run -p xdhcp-engine --example udp6_client -- IFACE [renew] [release]
//! ```
//!
//! It prints every transmission and event; with `renew` it waits for one
//! renewal (the server must hand out a short T1), with `release` it releases
//! at the end. `XDHCP_RAPID_COMMIT=1` asks for Rapid Commit.
//! `XDHCP_LEASE_FILE=PATH` keeps the lease there as JSON and, when the file
//! exists at start, resumes it (a REBIND, or a CONFIRM with
//! `XDHCP_CONFIRM=1`) as an agent restart would.
#![expect(clippy::print_stdout, reason = "a command-line smoke tool")]

use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use xdhcp_engine::v6::{Client, ClientConfig, Event, Lease, ResumeMode, State};

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn mac_of(iface: &str) -> [u8; 6] {
    let text = std::fs::read_to_string(format!("/sys/class/net/{iface}/address"))
        .unwrap_or_else(|e| panic!("cannot read the MAC of {iface}: {e}"));
    let mut mac = [0u8; 6];
    for (i, part) in text.trim().split(':').enumerate().take(6) {
        mac[i] = u8::from_str_radix(part, 16).expect("bad MAC");
    }
    mac
}

/// The interface's index and link-local address, from `/proc/net/if_inet6`.
fn link_local(iface: &str) -> (u32, Ipv6Addr) {
    let table = std::fs::read_to_string("/proc/net/if_inet6").expect("/proc/net/if_inet6");
    for line in table.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // address, ifindex, prefix length, scope (0x20 = link), flags, name
        if f.len() == 6 && f[5] == iface && f[3] == "20" {
            let ifindex = u32::from_str_radix(f[1], 16).expect("ifindex");
            let addr = u128::from_str_radix(f[0], 16).expect("address");
            return (ifindex, Ipv6Addr::from(addr));
        }
    }
    panic!("{iface} has no link-local address yet (DAD still running?)");
}

/// Configure what an event says; `true` when the run is over.
fn on_event(iface: &str, e: &Event, held: &mut Option<Lease>, renewed: &mut bool) -> bool {
    match e {
        Event::Bound(l) | Event::Changed { new: l, .. } => {
            let status = Command::new("ip")
                .args(["-6", "addr", "replace", &format!("{}/128", l.address)])
                .args(["dev", iface, "nodad"])
                .status()
                .expect("ip");
            assert!(status.success(), "ip addr replace failed");
            *held = Some(l.clone());
        }
        Event::Renewed(_) => *renewed = true,
        Event::Released => {
            if let Some(l) = held {
                let _ = Command::new("ip")
                    .args(["-6", "addr", "del", &format!("{}/128", l.address)])
                    .args(["dev", iface])
                    .status();
            }
            return true;
        }
        Event::Failed(_) => return true,
        Event::Lost { .. } => {}
    }
    false
}

/// A new client, or one resuming the lease stored in `lease_file`.
fn client(cfg: ClientConfig, t0: Instant, seed: u64, lease_file: Option<&str>) -> Client {
    let stored: Option<Lease> = lease_file
        .and_then(|p| std::fs::read(p).ok())
        .map(|b| serde_json::from_slice(&b).expect("stored lease"));
    if let Some(l) = stored {
        println!("resuming {l:?}");
        return Client::resume(cfg, l, t0, unix_ms(), seed);
    }
    let mut c = Client::new(cfg, t0, seed);
    c.set_wall_clock_unix_ms(unix_ms());
    c.handle_timeout(t0);
    c
}

fn main() {
    let mut iface = None;
    let (mut renew, mut release) = (false, false);
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "renew" => renew = true,
            "release" => release = true,
            _ => iface = Some(a),
        }
    }
    let iface = iface.expect("usage: udp6_client IFACE [renew] [release]");
    let (ifindex, ll) = link_local(&iface);
    let cfg = ClientConfig {
        mac: mac_of(&iface),
        rapid_commit: std::env::var("XDHCP_RAPID_COMMIT").is_ok_and(|v| v == "1"),
        resume: if std::env::var("XDHCP_CONFIRM").is_ok_and(|v| v == "1") {
            ResumeMode::Confirm
        } else {
            ResumeMode::Rebind
        },
        ..ClientConfig::default()
    };
    cfg.validate().expect("config");
    let sock = UdpSocket::bind(SocketAddrV6::new(ll, 546, 0, ifindex)).expect("bind [ll]:546");
    // The destination's scope id picks the interface for ff02::1:2.
    let t0 = Instant::now();
    let seed = u64::from(ifindex) ^ unix_ms();
    let lease_file = std::env::var("XDHCP_LEASE_FILE").ok();
    let mut c = client(cfg, t0, seed, lease_file.as_deref());
    println!(
        "DUID {:02x?} IAID {:#010x} on {iface} ({ll})",
        c.duid(),
        c.iaid()
    );
    let mut renewed = false;
    // The lease as last configured (the engine drops it before RELEASE).
    let mut held = None;
    let mut buf = [0u8; 1500];
    loop {
        while let Some(t) = c.poll_transmit() {
            let dst = SocketAddrV6::new(t.dst.address(), 547, 0, ifindex);
            println!(
                "{:>8.3}s -> {} xid {:#08x} to {}",
                t0.elapsed().as_secs_f64(),
                t.kind,
                t.xid,
                t.dst.address()
            );
            sock.send_to(&t.payload, dst).expect("send");
        }
        while let Some(e) = c.poll_event() {
            println!("{:>8.3}s event {e:?}", t0.elapsed().as_secs_f64());
            if let (Some(p), Some(l)) = (&lease_file, c.lease()) {
                std::fs::write(p, serde_json::to_vec(l).expect("json")).expect("write lease");
            }
            if on_event(&iface, &e, &mut held, &mut renewed) {
                return;
            }
        }
        if c.state() == State::Bound && (renewed || !renew) {
            if release {
                c.release(Instant::now());
                continue;
            }
            println!("bound: {:?}", c.lease());
            return;
        }
        let wait = c
            .poll_timeout()
            .map_or(Duration::from_secs(1), |t| {
                t.saturating_duration_since(Instant::now())
            })
            .max(Duration::from_millis(1));
        sock.set_read_timeout(Some(wait)).expect("timeout");
        match sock.recv_from(&mut buf) {
            Ok((n, SocketAddr::V6(src))) => {
                c.set_wall_clock_unix_ms(unix_ms());
                let r = c.handle_packet(Instant::now(), *src.ip(), &buf[..n]);
                println!(
                    "{:>8.3}s <- {n} bytes from {} type {}: {r:?}",
                    t0.elapsed().as_secs_f64(),
                    src.ip(),
                    buf[0]
                );
            }
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("recv: {e}"),
        }
        // Early or late calls are harmless: fire whatever is due.
        c.set_wall_clock_unix_ms(unix_ms());
        c.handle_timeout(Instant::now());
    }
}
