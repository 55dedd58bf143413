//! `cargo xtask bench dataplane`: TCP throughput across a veth pair between
//! two network namespaces (iperf3), with nothing attached, with the TC
//! program, with native XDP and with generic XDP on the receiving veth, in one
//! run, and with the DHCP guard (TC ingress and egress) on it as on a
//! workload port's host end. The programs run in observe mode (every frame is classified; none is
//! DHCP).
//!
//! Then the same through a node uplink: the traffic enters a "node"
//! namespace on its uplink `up0` (a veth), crosses the Linux bridge there
//! and reaches a pod's veth, as a localnet network's traffic does; measured
//! with nothing attached and with the uplink program on `up0` (TC, the
//! veth default, and generic XDP), in intercept mode as the agent runs it.
//!
//! Noise control, for a small machine shared with other work: every round
//! measures all four setups back to back, in an order rotated from round to
//! round; each iperf3 run leaves out its first second (TCP slow start,
//! `-O 1`); and each attached setup is judged by the median over rounds of
//! its throughput divided by the bare throughput of the same round (a paired
//! ratio: drift between rounds cancels out), reported with the spread of
//! those ratios.
//!
//! Usage: `bench_dataplane [seconds-per-run] [rounds]` (default 4 s, 9 rounds). Needs root and iperf3.
#![expect(clippy::print_stdout, reason = "benchmark CLI prints its report")]

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::time::Duration;

use std::fmt::Write as _;

use anyhow::{Context as _, Result, bail};
use xdhcp::datapath::AttachMode;
use xdhcp::datapath::ebpf::{AttachTarget, CaptureMode, Datapath, Guard, PortPolicy, Role};
use xdhcp_tests::{Bridge, NetNs, Process, Veth};

const SERVER_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 2);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Setup {
    Bare,
    Attached(AttachMode),
    /// The DHCP guard (TC ingress and egress) on the receiving veth, as on
    /// a workload port's host end.
    Guard,
}

impl Setup {
    fn name(self) -> String {
        match self {
            Self::Bare => "bare".to_owned(),
            Self::Attached(m) => m.to_string(),
            Self::Guard => "dhcp guard".to_owned(),
        }
    }
}

/// One iperf3 run; returns received Gbit/s.
fn iperf(server: &NetNs, client: &NetNs, secs: u64) -> Result<f64> {
    let mut srv = server.command("iperf3");
    srv.args(["-s", "-1", "-B", &SERVER_IP.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _server = Process::spawn("iperf3 server", srv);
    // Wait until the server listens (the client retries on refusal).
    let mut last = String::new();
    for _ in 0..50 {
        let out = client
            .command("iperf3")
            .args(["-c", &SERVER_IP.to_string(), "-t", &secs.to_string()])
            .args(["-O", "1", "-J"])
            .output()
            .context("running iperf3 (is it installed?)")?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            let json: serde_json::Value =
                serde_json::from_str(&text).context("iperf3 -J output")?;
            if let Some(bps) = json["end"]["sum_received"]["bits_per_second"].as_f64() {
                return Ok(bps / 1e9);
            }
            // An aborted test (e.g. the server was not listening yet) has no totals.
            last = format!(
                "no end.sum_received.bits_per_second in: {}",
                &text[..text.len().min(400)]
            );
        } else {
            last = text;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("iperf3 client kept failing: {last}")
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Medians and paired ratios to bare (`results[0]`), one row per setup.
fn report(
    title: &str,
    setups: &[Setup],
    results: &[Vec<f64>],
    secs: u64,
    runs: usize,
) -> Result<(String, Vec<f64>)> {
    let mut out = String::new();
    writeln!(out)?;
    writeln!(
        out,
        "bench dataplane: iperf3 TCP {title}, {runs} rounds x {secs} s (first second left \
         out), median Gbit/s and median of per-round ratios to bare"
    )?;
    writeln!(
        out,
        "{:<12} {:>12} {:>14} {:>18}",
        "setup", "Gbit/s", "% of bare", "ratio min..max"
    )?;
    let ratios: Vec<Vec<f64>> = results
        .iter()
        .map(|r| r.iter().zip(&results[0]).map(|(x, b)| x / b).collect())
        .collect();
    let mut paired = Vec::new();
    for (i, setup) in setups.iter().enumerate() {
        let m = median(&mut results[i].clone());
        let mut r = ratios[i].clone();
        let pr = median(&mut r);
        paired.push(pr);
        writeln!(
            out,
            "{:<12} {m:>12.2} {:>13.1}% {:>8.1}..{:.1} %",
            setup.name(),
            100.0 * pr,
            100.0 * r[0],
            100.0 * r[r.len() - 1]
        )?;
    }
    Ok((out, paired))
}

/// Measures `setups` (`Setup::Bare` first) `runs` times each, in an order
/// rotated from round to round; `attach`/`detach` put the program of a
/// setup other than `Bare` on and off where the data flows.
fn measure(
    dp: &mut Datapath,
    setups: &[Setup],
    runs: usize,
    label: &str,
    mut iperf_once: impl FnMut() -> Result<f64>,
    mut attach: impl FnMut(&mut Datapath, Setup) -> Result<()>,
    mut detach: impl FnMut(&mut Datapath, Setup) -> Result<()>,
) -> Result<Vec<Vec<f64>>> {
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); setups.len()];
    for run in 0..runs {
        // Rotate the order each run so drift on the shared machine hits every setup alike.
        for k in 0..setups.len() {
            let i = (k + run) % setups.len();
            let setup = setups[i];
            if setup != Setup::Bare {
                attach(dp, setup)?;
            }
            let gbps = iperf_once()?;
            if setup != Setup::Bare {
                detach(dp, setup)?;
            }
            println!(
                "run {}/{runs} {label} {:<12} {gbps:>8.2} Gbit/s",
                run + 1,
                setup.name()
            );
            results[i].push(gbps);
        }
    }
    Ok(results)
}

fn exact(att: &xdhcp::datapath::ebpf::Attachment, mode: AttachMode) -> Result<()> {
    if att.mode != mode {
        bail!(
            "asked for {mode}, got {} ({:?})",
            att.mode,
            att.native_refused
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let secs: u64 = args
        .next()
        .map_or(Ok(4), |s| s.parse())
        .context("seconds")?;
    let runs: usize = args.next().map_or(Ok(9), |s| s.parse()).context("rounds")?;
    if runs == 0 {
        bail!("at least one round");
    }
    Command::new(xdhcp_tests::program("iperf3"))
        .arg("--version")
        .output()
        .context("iperf3 does not run")?;

    let server = NetNs::new();
    let client = NetNs::new();
    let _veth = Veth::new(&server, "bench0", &client, "bench1");
    server.add_addr("bench0", SERVER_IP, 24);
    client.add_addr("bench1", CLIENT_IP, 24);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .context("tokio runtime")?;
    let _guard = rt.enter();
    let mut dp = Datapath::load().context("loading the eBPF object (run as root)")?;
    // Data flows client -> server: attach on the server's veth end (its ingress).
    let target = AttachTarget {
        ifname: "bench0".to_owned(),
        netns: Some(server.path().to_path_buf()),
    };
    let setups = [
        Setup::Bare,
        Setup::Attached(AttachMode::Tc),
        Setup::Attached(AttachMode::XdpNative),
        Setup::Attached(AttachMode::XdpGeneric),
        Setup::Guard,
    ];
    let guard = std::cell::RefCell::new(Guard::load().context("loading the DHCP guard")?);
    let results = measure(
        &mut dp,
        &setups,
        runs,
        "veth",
        || iperf(&server, &client, secs),
        |dp, setup| match setup {
            Setup::Attached(mode) => {
                exact(&dp.attach(&target, Some(mode), CaptureMode::Observe)?, mode)
            }
            Setup::Guard => {
                guard.borrow_mut().attach(&target, &PortPolicy::default())?;
                Ok(())
            }
            Setup::Bare => Ok(()),
        },
        |dp, setup| match setup {
            Setup::Attached(_) => Ok(dp.detach(&target)?),
            Setup::Guard => Ok(guard.borrow_mut().detach(&target)?),
            Setup::Bare => Ok(()),
        },
    )?;
    let passed = dp.counters()?.passed_not_dhcp;
    if passed == 0 {
        bail!("the programs classified no packets: not attached where the data flows?");
    }
    let (mut out, paired) = report("over veth", &setups, &results, secs, runs)?;
    let tc = paired[1];
    writeln!(out)?;
    writeln!(
        out,
        "target: default choice for veth (tc) >= 97 % of bare: {:.1} % -> {}",
        100.0 * tc,
        if tc >= 0.97 { "met" } else { "MISSED" }
    )?;
    if let Some(i) = setups.iter().position(|s| *s == Setup::Guard) {
        let g = paired[i];
        writeln!(
            out,
            "target: DHCP guard on a workload port >= 97 % of bare: {:.1} % -> {}",
            100.0 * g,
            if g >= 0.97 { "met" } else { "MISSED" }
        )?;
    }
    writeln!(out, "frames classified by the programs: {passed}")?;

    out.push_str(&through_uplink(&mut dp, secs, runs)?);
    print!("{out}");
    if let Some(dir) = std::env::var_os("XDHCP_BENCH_RESULTS") {
        let path = std::path::PathBuf::from(dir).join("dataplane.md");
        std::fs::write(&path, format!("```text\n{out}```\n"))
            .with_context(|| format!("writing {}", path.display()))?;
        println!("written to {}", path.display());
    }
    Ok(())
}

/// The uplink topology: ext (client) -> `up0` [node: `br0`] `pod0` -> pod
/// (server), bare and with the uplink program on `up0`; the report.
fn through_uplink(dp: &mut Datapath, secs: u64, runs: usize) -> Result<String> {
    let pod = NetNs::new();
    let node = NetNs::new();
    let ext = NetNs::new();
    let _pod_veth = Veth::new(&node, "pod0", &pod, "bench0");
    let _up_veth = Veth::new(&node, "up0", &ext, "bench1");
    let br = Bridge::new(&node, "br0");
    br.attach("pod0");
    br.attach("up0");
    pod.add_addr("bench0", SERVER_IP, 24);
    ext.add_addr("bench1", CLIENT_IP, 24);
    let uplink = AttachTarget {
        ifname: "up0".to_owned(),
        netns: Some(node.path().to_path_buf()),
    };
    let up_setups = [
        Setup::Bare,
        Setup::Attached(AttachMode::Tc),
        Setup::Attached(AttachMode::XdpGeneric),
    ];
    let before = dp.counters()?.passed_not_dhcp;
    let up_results = measure(
        dp,
        &up_setups,
        runs,
        "uplink",
        || iperf(&pod, &ext, secs),
        |dp, setup| {
            let Setup::Attached(mode) = setup else {
                bail!("the uplink is measured bare or with the uplink program only")
            };
            let att = dp.attach_as(Role::Uplink, &uplink, Some(mode), CaptureMode::Intercept)?;
            exact(&att, mode)
        },
        |dp, _| Ok(dp.detach(&uplink)?),
    )?;
    let up_passed = dp.counters()?.passed_not_dhcp - before;
    if up_passed == 0 {
        bail!("the uplink program classified no packets: not attached where the data flows?");
    }
    let (up_out, up_paired) = report(
        "through a node uplink (veth into a bridge, on to a pod's veth)",
        &up_setups,
        &up_results,
        secs,
        runs,
    )?;
    let mut out = up_out;
    writeln!(
        out,
        "uplink program (tc, the veth default): {:.1} % of the bare uplink path; frames \
         classified: {up_passed}",
        100.0 * up_paired[1]
    )?;
    Ok(out)
}
