//! DORA latency of the xdhcp engine over the AF_PACKET transports
//! (raw-socket sender + filtered AF_PACKET receiver), against dnsmasq
//! `--no-ping` (lease file on disk, then on tmpfs: dnsmasq fsyncs it on
//! every change) and Kea on a veth/bridge lab in network namespaces.
//!
//! Each run is a fresh client (new chaddr, new xid) from `Client::new` to the
//! `Bound` event; the lease is released afterwards so the pool never runs
//! dry. Prints median, p90 and p99 per server. Needs root.
//!
//! Usage: `bench_dora [runs]` (default 200).
#![expect(clippy::print_stdout, reason = "benchmark CLI prints its report")]

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use xdhcp::datapath::afpacket::AfPacketReceiver;
use xdhcp::datapath::rawsock::RawSender;
use xdhcp_engine::{Client, ClientConfig, Event, MessageKind, PacketSource};
use xdhcp_tests::{Dnsmasq, DnsmasqConfig, Kea, KeaConfig, Lab};

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// One DORA: returns the time to `Bound`, then releases.
async fn one_dora(
    tx: &RawSender,
    rx: &AfPacketReceiver,
    chaddr: [u8; 6],
    seed: u64,
) -> Result<Duration> {
    let cfg = ClientConfig {
        chaddr,
        broadcast_flag: true,
        ..ClientConfig::default()
    };
    let start = Instant::now();
    let mut client = Client::new(cfg, start, seed);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let took = loop {
        while let Some(t) = client.poll_transmit() {
            tx.send_transmit(&t).context("send")?;
        }
        let mut bound = None;
        while let Some(ev) = client.poll_event() {
            match ev {
                Event::Bound(_) => bound = Some(start.elapsed()),
                Event::Failed(e) => bail!("acquisition failed: {e}"),
                _ => {}
            }
        }
        if let Some(took) = bound {
            break took;
        }
        let timer = client
            .poll_timeout()
            .map_or(deadline, tokio::time::Instant::from_std);
        tokio::select! {
            frame = rx.recv() => {
                let frame = frame.context("receive")?;
                client.set_wall_clock_unix_ms(wall_ms());
                let src = PacketSource { src_mac: frame.headers.src_mac, src_ip: frame.headers.src_ip };
                let _ = client.handle_packet(Instant::now(), src, &frame.payload);
            }
            () = tokio::time::sleep_until(timer.min(deadline)) => {
                if tokio::time::Instant::now() >= deadline {
                    bail!("no lease within 10 s (state {:?})", client.state());
                }
                client.set_wall_clock_unix_ms(wall_ms());
                client.handle_timeout(Instant::now());
            }
        }
    };
    client.set_wall_clock_unix_ms(wall_ms());
    client.release(Instant::now());
    while let Some(t) = client.poll_transmit() {
        if t.kind == MessageKind::Release {
            tx.send_transmit(&t).context("send RELEASE")?;
        }
    }
    Ok(took)
}

/// Nearest-rank percentile, `pct` in 0..=100.
fn percentile(sorted: &[Duration], pct: usize) -> Duration {
    let idx = ((sorted.len() - 1) * pct).div_ceil(100);
    sorted[idx.min(sorted.len() - 1)]
}

async fn series(name: &str, lab: &Lab, runs: usize) -> Result<()> {
    let c = &lab.clients[0];
    let tx = RawSender::open_async(c.ns.path(), &c.ifname).await?;
    let rx = AfPacketReceiver::open_async(c.ns.path(), &c.ifname).await?;
    let mut samples = Vec::with_capacity(runs);
    for i in 0..runs {
        let n = i as u32;
        // A fresh client identity per run (chaddr and client id follow it);
        // frames keep the interface's MAC as their Ethernet source.
        let chaddr = [0x02, 0xbe, 0x00, (n >> 16) as u8, (n >> 8) as u8, n as u8];
        samples.push(one_dora(&tx, &rx, chaddr, u64::from(n) + 1).await?);
    }
    samples.sort_unstable();
    println!(
        "{name:<18} runs={runs:<4} median={:>8.3} ms  p90={:>8.3} ms  p99={:>8.3} ms  max={:>8.3} ms",
        ms(percentile(&samples, 50)),
        ms(percentile(&samples, 90)),
        ms(percentile(&samples, 99)),
        ms(*samples.last().expect("runs > 0")),
    );
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let runs: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()
        .context("runs must be a number")?
        .unwrap_or(200);
    if runs == 0 {
        bail!("runs must be at least 1");
    }
    println!("DORA latency, xdhcp engine over raw socket + AF_PACKET receiver, veth + bridge lab");
    for tmpfs in [false, true] {
        let lab = Lab::with_clients(1);
        let _server = Dnsmasq::start(
            &lab.server,
            DnsmasqConfig {
                no_ping: true,
                on_tmpfs: tmpfs,
                ..DnsmasqConfig::default()
            },
        );
        let name = if tmpfs {
            "dnsmasq (tmpfs)"
        } else {
            "dnsmasq (disk)"
        };
        series(name, &lab, runs).await?;
    }
    {
        let lab = Lab::with_clients(1);
        let _server = Kea::start(&lab.server, KeaConfig::default());
        series("kea memfile", &lab, runs).await?;
    }
    Ok(())
}
