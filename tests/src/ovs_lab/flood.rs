//! The DHCP guard's rate limit as the lab's tests check it on either
//! datapath: a served pod floods DISCOVERs under its own MAC, and the real
//! server behind the provider bridge sees at most the port's burst and
//! rate.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use super::OvnPod;
use crate::bench::metric_count;
use crate::{Dnsmasq, NetNs, wait_until};

/// The guard's defaults, which the lab's networks do not change.
pub const RATE: u64 = xdhcp_common::guard::GUARD_DEFAULT_RATE as u64;
pub const BURST: u64 = xdhcp_common::guard::GUARD_DEFAULT_BURST as u64;

/// The agent's metrics at `addr` in `node` (the guard's counters are
/// copied there every 2 s).
#[track_caller]
pub fn scrape(node: &NetNs, addr: SocketAddr) -> String {
    let mut text = None;
    wait_until(Duration::from_secs(10), || {
        text = node.run_in(move || crate::bench::http_get(addr, "/metrics"));
        text.is_some()
    });
    text.expect("the agent's metrics server answers")
}

/// `(passed client messages, dropped for reason)` of guarded port `port`.
pub fn guard_figures(node: &NetNs, metrics: SocketAddr, port: &str, reason: &str) -> (u64, u64) {
    let m = scrape(node, metrics);
    (
        metric_count(
            &m,
            "xdhcp_guard_passed_client_frames",
            &format!(r#"port="{port}""#),
        ),
        metric_count(
            &m,
            "xdhcp_guard_dropped_frames",
            &format!(r#"port="{port}",reason="{reason}""#),
        ),
    )
}

/// Counts, in `ns`, DHCP server messages from `from` that its IP stack
/// receives (an nftables counter at prerouting): a rogue server's, heard
/// or not ([`server_messages_seen`]).
#[track_caller]
pub fn count_server_messages(ns: &NetNs, from: Ipv4Addr) {
    crate::nft::add_counter(
        ns,
        ROGUE_COUNTER,
        "prerouting priority -400",
        &["ip", "saddr", &from.to_string(), "udp", "sport", "67"],
    );
}

/// What [`count_server_messages`] counted so far.
#[track_caller]
pub fn server_messages_seen(ns: &NetNs) -> u64 {
    crate::nft::counted(ns, ROGUE_COUNTER)
}

const ROGUE_COUNTER: &str = "inet xdt_rogue";

/// Sends DISCOVERs from `pod` under its own MAC, each with its own xid, for
/// `how_long`; returns how many and the time from first to last. (Made-up
/// MACs, a pool starvation attempt, are dropped outright as spoofed: a
/// workload port has one client, `guard_netns.rs`.)
pub fn flood(pod: &OvnPod, how_long: Duration) -> (u64, Duration) {
    let ifindex = pod.ns.ifindex(&pod.ifname);
    let tx = pod.ns.packet_socket(ifindex, libc::ETH_P_ALL as u16, None);
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < how_long {
        let n = sent.to_be_bytes();
        let xid = 0xf100_0000 | u32::from_be_bytes([0, n[5], n[6], n[7]]);
        crate::frames::send(&tx, &crate::frames::discover(pod.mac, pod.mac, xid));
        sent += 1;
        std::thread::sleep(Duration::from_micros(500));
    }
    (sent, start.elapsed())
}

/// DISCOVERs from `pod`'s MAC that `dnsmasq` has logged.
pub fn discovers_seen(dnsmasq: &Dnsmasq, pod: &OvnPod) -> u64 {
    let own = crate::format_mac(pod.mac);
    dnsmasq
        .log()
        .lines()
        .filter(|l| l.contains("DHCPDISCOVER(") && l.contains(&own))
        .count() as u64
}

/// Floods DISCOVERs from `pod` for `how_long` ([`flood`]); how many
/// `dnsmasq` saw, how many were sent, and for how long.
pub fn flood_seen(dnsmasq: &Dnsmasq, pod: &OvnPod, how_long: Duration) -> (u64, u64, Duration) {
    let before = discovers_seen(dnsmasq, pod);
    let (sent, took) = flood(pod, how_long);
    // dnsmasq logs each DISCOVER it reads; give it a moment for the last.
    std::thread::sleep(Duration::from_secs(1));
    (discovers_seen(dnsmasq, pod) - before, sent, took)
}

/// At most this many DISCOVERs pass a port of `burst` and `rate` in
/// `took`: the burst, the rate over that time (rounded up), and one more
/// for the clock's tick.
pub fn allowance(burst: u64, rate: u64, took: Duration) -> u64 {
    let ms = u64::try_from(took.as_millis()).expect("milliseconds");
    burst + (rate * ms).div_ceil(1000) + 1
}

/// Floods DISCOVERs from served `pod` for `how_long` and checks that
/// `dnsmasq` (the real server behind the provider bridge) saw at most the
/// port's burst and rate of them, at least the burst, and that the guard
/// (metrics at `metrics` in the lab's node) counted every one as passed or
/// dropped for the rate. The flood must outrun the allowance fourfold, or
/// it shows nothing.
#[track_caller]
pub fn assert_flood_held_to_rate(
    lab: &super::OvnLab,
    pod: &OvnPod,
    dnsmasq: &Dnsmasq,
    metrics: SocketAddr,
    how_long: Duration,
) {
    let (seen, sent, elapsed) = flood_seen(dnsmasq, pod, how_long);
    let allowed = allowance(BURST, RATE, elapsed);
    assert!(
        sent >= 4 * allowed,
        "the flood sent only {sent} (allowed {allowed})"
    );
    assert!(
        seen <= allowed,
        "the server saw {seen} of {sent} DISCOVERs in {elapsed:?} (at most {allowed})"
    );
    assert!(seen >= BURST, "the server saw the burst at least: {seen}");
    // Counted: every DISCOVER of the flood passed or was dropped for the
    // rate, and what passed is what the port allows.
    let (mut passed, mut dropped) = (0, 0);
    assert!(
        wait_until(Duration::from_secs(10), || {
            (passed, dropped) = guard_figures(&lab.node, metrics, &pod.host_ifname, "rate");
            // The pod's own DORA passed the guard before the flood.
            passed + dropped >= sent
        }),
        "passed {passed} + dropped {dropped} of {sent}"
    );
    assert!(dropped >= sent - allowed, "dropped {dropped} of {sent}");
    assert!(passed <= allowed + 4, "passed {passed} (allowed {allowed})");
}
