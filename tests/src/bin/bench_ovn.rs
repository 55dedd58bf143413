//! `cargo xtask bench ovn`: a pod's ADD through OVN side by side with the
//! bridge lab, and the time from a bridge-mapping change to an attached
//! uplink, in one run.
//!
//! 1. The bridge lab `cargo xtask bench cni` uses (a pod veth into a Linux
//!    bridge, the server behind the bridge's uplink port `up0`, the agent in
//!    the bridge's namespace with `--uplink physnet1=up0`), and the OVS +
//!    OVN node lab of the tests (`xdhcp_tests::OvnLab`: userspace datapath,
//!    a localnet logical switch, the pod on `br-int` wired as
//!    OVN-Kubernetes wires it, the server behind the provider bridge, the
//!    agent in the node's namespace finding the uplink in OVS with no
//!    `--uplink`). Against dnsmasq `--no-ping` in each.
//! 2. In each lab, alternating round by round so load on the machine hits
//!    both alike: the floor — the server's own DORA, the xdhcp engine over
//!    raw sockets from the pod's namespace through that lab's path (no CNI,
//!    no agent involved) — and one ADD through the thin plugin (exec, the
//!    agent, its DORA, the guard going on the pod's port), then its DEL
//!    (untimed). `XDHCP_BENCH_ROUNDS` rounds (default 30), after one
//!    unmeasured round. Reported: medians and p90s, each lab's ADD ÷ its
//!    own floor, and OVN ÷ bridge.
//! 3. In the OVN lab, a second provider bridge (`br-phys2`, port `eth2`)
//!    mapped and unmapped in `ovn-bridge-mappings` 20 times: the time from
//!    the `ovs-vsctl` command's start (and from its return) until `xdhcp
//!    status` shows `eth2` live with its program attached, and until it is
//!    gone again after the unmapping.
//!
//! Where an ADD's time goes in each lab: the agent's own
//! `xdhcp_add_phase_seconds` (sum and count per phase, scraped from its
//! `/metrics` before and after the measured rounds), as a mean per phase;
//! the `guard` phase (the DHCP guard going on the pod's port: TC in the
//! bridge lab, XDP on the userspace datapath) runs beside the exchange.
//!
//! Nothing here asserts a timing. Written to `$XDHCP_BENCH_RESULTS/ovn.md`.
#![expect(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark report"
)]
#![expect(
    clippy::cast_precision_loss,
    reason = "round counts far below 2^52 turned into ratios"
)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use xdhcp::rpc::{self, AgentStatus, Client};
use xdhcp_tests::bench::{
    Daemon, DaemonOptions, Impl, free_local_addr, http_get, server_doras, xdhcp_bin,
};
use xdhcp_tests::netns::{Lab, NetNs};
use xdhcp_tests::servers::{Dnsmasq, DnsmasqConfig};
use xdhcp_tests::{CNI_PLUGIN_DIR, OvnLab, PluginCall, parse_mac, progress};

/// The phases an ADD's time is shown in, in the order they happen.
const PHASES: [&str; 13] = xdhcp_tests::bench::ADD_PHASES;

/// `xdhcp_add_phase_seconds` per phase: (sum in seconds, count), from the
/// agent's `/metrics` text.
fn phase_sums(metrics: &str) -> BTreeMap<String, (f64, u64)> {
    let mut out: BTreeMap<String, (f64, u64)> = BTreeMap::new();
    for line in metrics.lines() {
        let (sum, rest) = if let Some(r) = line.strip_prefix("xdhcp_add_phase_seconds_sum{") {
            (true, r)
        } else if let Some(r) = line.strip_prefix("xdhcp_add_phase_seconds_count{") {
            (false, r)
        } else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let Some(phase) = labels
            .split(',')
            .find_map(|l| l.strip_prefix("phase=\"")?.strip_suffix('"'))
        else {
            continue;
        };
        let e = out.entry(phase.to_owned()).or_default();
        if sum {
            e.0 = value.trim().parse().unwrap_or(0.0);
        } else {
            e.1 = value.trim().parse().unwrap_or(0);
        }
    }
    out
}

/// The mean of each phase over the ADDs between two scrapes, in ms
/// (`None`: no ADD observed it).
fn phase_means(
    before: &BTreeMap<String, (f64, u64)>,
    after: &BTreeMap<String, (f64, u64)>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .filter_map(|(phase, (sum, count))| {
            let (s0, c0) = before.get(phase).copied().unwrap_or_default();
            let n = count.saturating_sub(c0);
            (n > 0).then(|| (phase.clone(), (sum - s0) * 1000.0 / n as f64))
        })
        .collect()
}

/// The agent's `/metrics`, fetched from the namespace it runs in.
fn scrape(ns: &NetNs, metrics: SocketAddr) -> BTreeMap<String, (f64, u64)> {
    ns.run_in(move || http_get(metrics, "/metrics"))
        .map(|t| phase_sums(&t))
        .unwrap_or_default()
}

/// Mapping changes timed in the OVN lab.
const MAPPING_ROUNDS: usize = 20;

fn rounds() -> usize {
    std::env::var("XDHCP_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(30)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// One lab's pod, as both labs have one.
struct Target<'a> {
    /// The namespace the pod's host-side port (and the agent) is in.
    node: &'a NetNs,
    /// The pod's host-side port.
    port: String,
    pod_ns: &'a Path,
    ifname: String,
    mac: [u8; 6],
}

/// One plugin command for the pod; its wall time.
fn cni(d: &Daemon, command: &str, id: &str, t: &Target<'_>) -> Result<Duration, String> {
    let config = d.config();
    let cni_args = format!("K8S_POD_NAMESPACE=bench;K8S_POD_NAME={id}");
    let started = Instant::now();
    let out = PluginCall {
        plugin: &d.plugin,
        node_ns: None,
        command,
        container_id: id,
        netns: Some(t.pod_ns),
        ifname: &t.ifname,
        cni_path: Path::new(CNI_PLUGIN_DIR),
        cni_args: &cni_args,
        config: &config,
    }
    .run()
    .map_err(|e| format!("exec {}: {e}", d.plugin.display()))?;
    let took = started.elapsed();
    if out.ok {
        Ok(took)
    } else {
        Err(format!("{command} {id}: {}", out.text()))
    }
}

/// The pod's port made fresh again, as a new pod's is: the guard, detached
/// at DEL, leaves its `clsact` qdisc (see `bench_cni`'s `fresh_ports`).
fn fresh_port(t: &Target<'_>) {
    let _ = t
        .node
        .exec_output(&["tc", "qdisc", "del", "dev", &t.port, "clsact"]);
}

/// (floor DORAs, ADDs) measured so far in one lab.
#[derive(Default)]
struct Figures {
    floor: Vec<Duration>,
    add: Vec<Duration>,
    failed: usize,
}

impl Figures {
    fn sort(&mut self) {
        self.floor.sort();
        self.add.sort();
    }
}

/// One round in one lab: a DORA of the server's own, then an ADD (timed)
/// and its DEL.
fn round(d: &Daemon, t: &Target<'_>, i: usize, into: &mut Figures) {
    into.floor
        .extend(server_doras(t.pod_ns, &t.ifname, t.mac, 1));
    let id = format!("ovnbench-{i}");
    match cni(d, "ADD", &id, t) {
        Ok(took) => into.add.push(took),
        Err(e) => {
            eprintln!("  ADD failed: {e}");
            into.failed += 1;
        }
    }
    let _ = cni(d, "DEL", &id, t);
    fresh_port(t);
}

fn status(socket: &Path) -> Option<AgentStatus> {
    Client::new(socket, Duration::from_secs(2))
        .get(rpc::PATH_STATUS)
        .ok()
}

fn live(socket: &Path, ifname: &str) -> bool {
    status(socket).is_some_and(|s| {
        s.uplinks
            .iter()
            .any(|u| u.ifname == ifname && u.state == "live" && u.bpf_link.is_some())
    })
}

fn gone(socket: &Path, ifname: &str) -> bool {
    status(socket).is_some_and(|s| s.uplinks.iter().all(|u| u.ifname != ifname))
}

/// Polls `check` every 200 µs; the time it took, or `None` after 5 s.
fn time_until(from: Instant, mut check: impl FnMut() -> bool) -> Option<Duration> {
    while from.elapsed() < Duration::from_secs(5) {
        if check() {
            return Some(from.elapsed());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    None
}

/// (from the command's start, from its return) until attached; and until
/// detached after the mapping goes.
struct Mapping {
    attached: Vec<Duration>,
    attached_after_return: Vec<Duration>,
    detached: Vec<Duration>,
    missed: usize,
}

fn mapping_changes(lab: &mut OvnLab, socket: &Path) -> Mapping {
    lab.add_provider_bridge("br-phys2", "eth2", "s1");
    let before = lab.bridge_mappings();
    let with = format!("{before},physnet2:br-phys2");
    let mut m = Mapping {
        attached: Vec::new(),
        attached_after_return: Vec::new(),
        detached: Vec::new(),
        missed: 0,
    };
    for _ in 0..MAPPING_ROUNDS {
        let t0 = Instant::now();
        lab.set_bridge_mappings(&with);
        let returned = Instant::now();
        match time_until(t0, || live(socket, "eth2")) {
            Some(took) => {
                m.attached.push(took);
                m.attached_after_return
                    .push(took.saturating_sub(returned - t0));
            }
            None => m.missed += 1,
        }
        let t0 = Instant::now();
        lab.set_bridge_mappings(&before);
        match time_until(t0, || gone(socket, "eth2")) {
            Some(took) => m.detached.push(took),
            None => m.missed += 1,
        }
    }
    m.attached.sort();
    m.attached_after_return.sort();
    m.detached.sort();
    m
}

fn dnsmasq_config(interface: &str) -> DnsmasqConfig {
    DnsmasqConfig {
        interface: interface.to_owned(),
        range: (Ipv4Addr::new(192, 0, 2, 10), Ipv4Addr::new(192, 0, 2, 250)),
        lease_secs: 3600,
        no_ping: true,
        ..DnsmasqConfig::default()
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "one linear script: two labs, their agents, the rounds, the table"
)]
fn main() {
    let xdhcp = xdhcp_bin();
    xdhcp_tests::netns::sweep_leftovers();
    let rounds = rounds();

    progress!("bridge lab: a pod veth into a Linux bridge, the server behind its uplink up0");
    let bridge = Lab::builder().clients(1).server_behind_uplink().build();
    let _bridge_server = Dnsmasq::start(bridge.dhcp_ns(), dnsmasq_config(bridge.dhcp_ifname()));
    let bridge_metrics = free_local_addr();
    let bridge_agent = Daemon::start_with(
        Impl::Xdhcp,
        &xdhcp,
        &DaemonOptions {
            node_ns: Some(bridge.server.name().to_owned()),
            agent_args: vec!["--uplink".to_owned(), format!("physnet1={}", Lab::UPLINK)],
            metrics: Some(bridge_metrics),
            ..DaemonOptions::default()
        },
    );
    let client = &bridge.clients[0];
    let bridge_pod = Target {
        node: &bridge.server,
        port: client.port().to_owned(),
        pod_ns: client.ns.path(),
        ifname: client.ifname.clone(),
        mac: client.mac,
    };

    progress!("OVN lab: ovsdb-server, ovs-vswitchd (userspace datapath), OVN, a localnet switch");
    let mut ovn = OvnLab::start();
    let _ovn_server = Dnsmasq::start(&ovn.server, dnsmasq_config(OvnLab::SERVER_IF));
    ovn.add_pod("pod1", parse_mac("0a:58:c0:00:02:05").expect("a MAC"));
    let ovn_metrics = free_local_addr();
    let ovn_agent = Daemon::start_with(
        Impl::Xdhcp,
        &xdhcp,
        &DaemonOptions {
            node_ns: Some(ovn.node.name().to_owned()),
            ovsdb: Some(ovn.db_socket()),
            metrics: Some(ovn_metrics),
            ..DaemonOptions::default()
        },
    );
    assert!(
        time_until(Instant::now(), || live(&ovn_agent.socket, OvnLab::UPLINK)).is_some(),
        "the agent did not attach at {} from OVS",
        OvnLab::UPLINK
    );
    let pod = &ovn.pods()[0];
    let ovn_pod = Target {
        node: &ovn.node,
        port: pod.host_ifname.clone(),
        pod_ns: pod.ns.path(),
        ifname: pod.ifname.clone(),
        mac: pod.mac,
    };

    progress!("one unmeasured round in each lab, then {rounds} rounds, alternating");
    let (mut bridge_figs, mut ovn_figs) = (Figures::default(), Figures::default());
    round(&bridge_agent, &bridge_pod, 0, &mut Figures::default());
    round(&ovn_agent, &ovn_pod, 0, &mut Figures::default());
    let bridge_phases0 = scrape(&bridge.server, bridge_metrics);
    let ovn_phases0 = scrape(&ovn.node, ovn_metrics);
    for i in 1..=rounds {
        round(&bridge_agent, &bridge_pod, i, &mut bridge_figs);
        round(&ovn_agent, &ovn_pod, i, &mut ovn_figs);
        if i % 10 == 0 {
            progress!("  {i} of {rounds}");
        }
    }
    let bridge_phases = phase_means(&bridge_phases0, &scrape(&bridge.server, bridge_metrics));
    let ovn_phases = phase_means(&ovn_phases0, &scrape(&ovn.node, ovn_metrics));
    bridge_figs.sort();
    ovn_figs.sort();
    // Where the ADDs were served: the uplink in both labs.
    let path_of = |d: &Daemon, t: &Target<'_>| {
        let id = "ovnbench-path";
        let _ = cni(d, "ADD", id, t);
        let path = Client::new(&d.socket, Duration::from_secs(2))
            .get::<Vec<rpc::LeaseView>>(rpc::PATH_LEASES)
            .ok()
            .and_then(|v| v.first().map(|l| l.path.clone()))
            .unwrap_or_default();
        let _ = cni(d, "DEL", id, t);
        path
    };
    let bridge_path = path_of(&bridge_agent, &bridge_pod);
    let ovn_path = path_of(&ovn_agent, &ovn_pod);

    progress!("mapping a second provider bridge in and out, {MAPPING_ROUNDS} times");
    let socket: PathBuf = ovn_agent.socket.clone();
    drop(ovn_pod);
    let mapping = mapping_changes(&mut ovn, &socket);

    let mut md = String::new();
    let _ = writeln!(
        md,
        "# A pod's ADD through OVN and through the bridge lab; a mapping change to an attached uplink\n"
    );
    let _ = writeln!(
        md,
        "One run, {} cores. dnsmasq `--no-ping` in both labs. Bridge lab: the pod's veth on a Linux bridge, \
         the server behind its uplink port, agent `--uplink physnet1=up0`. OVN lab: Open vSwitch \
         (userspace datapath) and OVN, the pod on `br-int` as OVN-Kubernetes wires it, the server behind \
         the provider bridge, the agent finding the uplink in OVS (no `--uplink`). \
         Floor: the server's own DORA from the pod's namespace through the same path (xdhcp's engine over \
         raw sockets: no CNI, no agent). Per round, in each lab: one floor DORA, then one ADD (the thin \
         plugin's exec, the agent, its DORA, the guard on the pod's port) and its DEL; {rounds} rounds \
         after one unmeasured one, the labs alternating. Lease paths: bridge `{bridge_path}`, OVN `{ovn_path}`.\n",
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get)
    );
    let _ = writeln!(
        md,
        "| measure | bridge lab | OVN lab (userspace datapath) | OVN ÷ bridge |\n|---|---|---|---|"
    );
    let row = |md: &mut String, what: &str, bv: f64, ov: f64, unit: &str| {
        let _ = writeln!(
            md,
            "| {what} | {bv:.2}{unit} | {ov:.2}{unit} | {:.2}× |",
            ov / bv.max(1e-9)
        );
    };
    for (label, p) in [("median", 0.5), ("p90", 0.9)] {
        row(
            &mut md,
            &format!("floor: the server's own DORA, {label} (ms)"),
            ms(percentile(&bridge_figs.floor, p)),
            ms(percentile(&ovn_figs.floor, p)),
            "",
        );
        row(
            &mut md,
            &format!("single ADD, {label} (ms)"),
            ms(percentile(&bridge_figs.add, p)),
            ms(percentile(&ovn_figs.add, p)),
            "",
        );
    }
    let ratio = |f: &Figures| ms(percentile(&f.add, 0.5)) / ms(percentile(&f.floor, 0.5)).max(1e-9);
    row(
        &mut md,
        "single ADD median ÷ its lab's floor median",
        ratio(&bridge_figs),
        ratio(&ovn_figs),
        "×",
    );
    let _ = writeln!(
        md,
        "| ADDs failed / floor DORAs that did not bind (of {rounds}) | {} / {} | {} / {} | |",
        bridge_figs.failed,
        rounds - bridge_figs.floor.len(),
        ovn_figs.failed,
        rounds - ovn_figs.floor.len()
    );
    let _ = writeln!(
        md,
        "\n## Where an ADD's time goes, per phase (the agent's `xdhcp_add_phase_seconds`)\n\n\
         Mean over the measured ADDs, in ms. `guard` (the DHCP guard going on the pod's port: a TC \
         filter in the bridge lab, XDP in the OVN lab) runs beside `slot` … `ack`, the exchange; \
         a phase no ADD went through is left out.\n"
    );
    let _ = writeln!(
        md,
        "| phase | bridge lab (ms) | OVN lab (ms) |\n|---|---|---|"
    );
    for phase in PHASES {
        let (b, o) = (bridge_phases.get(phase), ovn_phases.get(phase));
        if b.is_none() && o.is_none() {
            continue;
        }
        let cell = |v: Option<&f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
        let _ = writeln!(md, "| {phase} | {} | {} |", cell(b), cell(o));
    }
    let _ = writeln!(
        md,
        "\n## `ovn-bridge-mappings` changed → uplink attached (OVN lab)\n\n\
         A second provider bridge `br-phys2` (port `eth2`) mapped as `physnet2` and unmapped again, \
         {MAPPING_ROUNDS} times; `xdhcp status` polled every 0.2 ms. `ovs-vsctl --no-wait` itself took \
         the difference between the first two rows.\n"
    );
    let _ = writeln!(
        md,
        "| measure | median (ms) | p90 (ms) | max (ms) |\n|---|---|---|---|"
    );
    for (what, v) in [
        (
            "mapping added (from `ovs-vsctl`'s start) → eth2 live, program attached",
            &mapping.attached,
        ),
        (
            "mapping added (from `ovs-vsctl`'s return) → eth2 live",
            &mapping.attached_after_return,
        ),
        (
            "mapping removed (from `ovs-vsctl`'s start) → eth2 gone",
            &mapping.detached,
        ),
    ] {
        let _ = writeln!(
            md,
            "| {what} | {:.1} | {:.1} | {:.1} |",
            ms(percentile(v, 0.5)),
            ms(percentile(v, 0.9)),
            ms(v.last().copied().unwrap_or_default())
        );
    }
    let _ = writeln!(
        md,
        "\nChanges not followed within 5 s: {} of {}.",
        mapping.missed,
        2 * MAPPING_ROUNDS
    );
    println!("\n{md}");
    xdhcp_tests::bench::write_result("ovn.md", &md);
    drop(ovn_agent);
    drop(bridge_agent);
}
