//! Manual smoke tool: drive the engine over plain UDP sockets against a real
//! server (no raw sockets, no eBPF). The BROADCAST flag is set so replies
//! reach port 68 before the interface has an address; once BOUND the leased
//! address is added to `IFACE` with `ip` so RENEW/RELEASE can be unicast from
//! it. Run inside a network namespace of your own:
//!
//! ```text
//! ip netns exec NS cargo run -p xdhcp-engine --example udp_client -- IFACE [release]
//! ```
//!
//! `XDHCP_REQUEST=a.b.c.d` starts in INIT-REBOOT for that address. It prints
//! every transmit and event, waits for one renewal when the server
//! hands out a short T1, then releases (with `release`) or exits.
#![expect(clippy::print_stdout, reason = "a command-line smoke tool")]

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use xdhcp_engine::{Client, ClientConfig, Destination, Event, PacketSource, State};

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

fn main() {
    let mut args = std::env::args().skip(1);
    let iface = args.next().expect("usage: udp_client IFACE [release]");
    let release = args.next().as_deref() == Some("release");
    let cfg = ClientConfig {
        chaddr: mac_of(&iface),
        hostname: Some("xdhcp-smoke".into()),
        broadcast_flag: true,
        retransmit: xdhcp_engine::Retransmit {
            renew_min_interval: Duration::from_secs(2),
            ..xdhcp_engine::Retransmit::default()
        },
        ..ClientConfig::default()
    };
    let cfg = ClientConfig {
        // XDHCP_REQUEST=a.b.c.d starts in INIT-REBOOT asking for it.
        requested_ip: std::env::var("XDHCP_REQUEST")
            .ok()
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().expect("XDHCP_REQUEST is not an IPv4 address")),
        ..cfg
    };
    cfg.validate().expect("config");
    let sock = UdpSocket::bind("0.0.0.0:68").expect("bind :68");
    sock.set_broadcast(true).expect("SO_BROADCAST");
    let mut client = Client::new(cfg, Instant::now(), u64::from(std::process::id()));
    let mut renewed = false;
    let mut buf = vec![0u8; 4096];
    loop {
        while let Some(t) = client.poll_transmit() {
            let dst = match t.dst {
                Destination::Broadcast => Ipv4Addr::BROADCAST,
                Destination::Unicast { ip, .. } => ip,
            };
            println!(
                "send {:?} xid={:#x} src={} dst={dst}",
                t.kind, t.xid, t.src_ip
            );
            if let Err(e) = sock.send_to(&t.payload, SocketAddrV4::new(dst, 67)) {
                println!("send failed: {e}");
            }
        }
        while let Some(ev) = client.poll_event() {
            println!("event {ev:?}");
            match ev {
                Event::Bound(l) => {
                    let cidr = format!("{}/{}", l.address, l.prefix_len);
                    let st = Command::new("ip")
                        .args(["addr", "add", &cidr, "dev", &iface])
                        .status();
                    println!("ip addr add {cidr}: {st:?}");
                }
                Event::Renewed(_) | Event::Changed { .. } => renewed = true,
                Event::Failed(e) => {
                    println!("failed: {e}");
                    return;
                }
                _ => {}
            }
        }
        if client.state() == State::Bound && (renewed || client.lease_timers().is_none()) {
            if release {
                client.release(Instant::now());
                while let Some(t) = client.poll_transmit() {
                    if let Destination::Unicast { ip, .. } = t.dst {
                        println!("send {:?} src={} dst={ip}", t.kind, t.src_ip);
                        sock.send_to(&t.payload, SocketAddrV4::new(ip, 67))
                            .expect("send RELEASE");
                    }
                }
            }
            println!("stats {:?}", client.stats());
            return;
        }
        let wait = client
            .poll_timeout()
            .map_or(Duration::from_secs(1), |t| {
                t.saturating_duration_since(Instant::now())
            })
            .max(Duration::from_millis(1));
        sock.set_read_timeout(Some(wait)).expect("timeout");
        if let Ok((n, std::net::SocketAddr::V4(from))) = sock.recv_from(&mut buf) {
            client.set_wall_clock_unix_ms(unix_ms());
            let src = PacketSource {
                src_mac: [0; 6],
                src_ip: *from.ip(),
            };
            let r = client.handle_packet(Instant::now(), src, &buf[..n]);
            println!("recv {n} bytes from {from}: {r:?} -> {}", client.state());
        } else {
            client.set_wall_clock_unix_ms(unix_ms());
            client.handle_timeout(Instant::now());
        }
    }
}
