//! `cargo xtask bench dataplane`: TCP throughput across a veth pair between
//! two network namespaces (iperf3), with nothing attached, with the TC
//! program, with native XDP and with generic XDP on the receiving veth, in one
//! run, and with the DHCP guard on it as on a pod's port's host end (TC
//! ingress; a pod's port does not learn, so no egress program). The programs run in observe mode (every frame is classified; none is
//! DHCP).
//!
//! Then the same through a node uplink: the traffic enters a "node"
//! namespace on its uplink `up0` (a veth), crosses the Linux bridge there
//! and reaches a pod's veth, as a localnet network's traffic does; measured
//! with nothing attached and with the uplink program on `up0` (TC, the
//! veth default, and generic XDP), in intercept mode as the agent runs it.
//!
//! Noise control, for a small machine shared with other work (a 2-core VM
//! where other builds run): each attached setup is measured in many short
//! **paired trials**, one bare run and one attached run back to back, their
//! order alternating from pair to pair (bare first, then attached first),
//! and the pairs of all setups interleaved, so drift of the machine's load
//! hits both halves of a pair alike and every setup alike. A pair gives one
//! ratio, attached / bare; a setup is reported as the **median of its
//! ratios with their interquartile range** (the middle half of the pairs),
//! beside the median Gbit/s of each side. Each iperf3 run leaves out its
//! first second (TCP slow start, `-O 1`); one iperf3 server runs for all of
//! them; the client and the server are pinned to CPUs 0 and 1 (`-A 0,1`)
//! when the machine has two, so that the scheduler does not move them
//! within a run.
//!
//! Usage: `bench_dataplane [seconds-per-run] [pairs]` (default 1 s, 20
//! pairs per setup). Needs root and iperf3.
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
    Attached(AttachMode),
    /// The DHCP guard on the receiving veth, as on a pod's port's host end
    /// (TC ingress only: a pod's port does not learn).
    Guard,
}

impl Setup {
    fn name(self) -> String {
        match self {
            Self::Attached(m) => m.to_string(),
            Self::Guard => "dhcp guard".to_owned(),
        }
    }
}

/// An iperf3 server in `server` for the whole measurement, and the client
/// side of it.
struct Iperf<'a> {
    _server: Process,
    client: &'a NetNs,
    secs: u64,
    pin: bool,
}

impl<'a> Iperf<'a> {
    fn start(server: &NetNs, client: &'a NetNs, secs: u64) -> Self {
        let mut srv = server.command("iperf3");
        srv.args(["-s", "-B", &SERVER_IP.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        Self {
            _server: Process::spawn("iperf3 server", srv),
            client,
            secs,
            pin: std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2),
        }
    }

    /// One run; returns received Gbit/s.
    fn run(&self) -> Result<f64> {
        let mut last = String::new();
        // The first run waits until the server listens (the client retries on refusal).
        for _ in 0..50 {
            let mut cmd = self.client.command("iperf3");
            cmd.args(["-c", &SERVER_IP.to_string(), "-t", &self.secs.to_string()])
                .args(["-O", "1", "-J"]);
            if self.pin {
                cmd.args(["-A", "0,1"]);
            }
            let out = cmd.output().context("running iperf3 (is it installed?)")?;
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
}

/// The `q` quantile (0..=1) of `v`, linearly interpolated between the
/// closest ranks.
fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return f64::NAN;
    }
    #[expect(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a rank among a few dozen samples"
    )]
    let (lo, frac) = {
        let pos = q.clamp(0.0, 1.0) * (s.len() - 1) as f64;
        (pos.floor() as usize, pos - pos.floor())
    };
    let hi = (lo + 1).min(s.len() - 1);
    s[lo] + (s[hi] - s[lo]) * frac
}

/// One attached setup's paired trials: bare and attached Gbit/s, pair by pair.
#[derive(Default)]
struct Pairs {
    bare: Vec<f64>,
    attached: Vec<f64>,
}

impl Pairs {
    fn ratios(&self) -> Vec<f64> {
        self.attached
            .iter()
            .zip(&self.bare)
            .map(|(a, b)| a / b)
            .collect()
    }
}

/// The figures of one setup: median of the pair ratios and its quartiles.
struct Figure {
    median: f64,
    q1: f64,
    q3: f64,
}

impl Figure {
    fn of(p: &Pairs) -> Self {
        let r = p.ratios();
        Self {
            median: quantile(&r, 0.5),
            q1: quantile(&r, 0.25),
            q3: quantile(&r, 0.75),
        }
    }

    /// The verdict against a floor (a fraction of bare).
    fn against(&self, floor: f64) -> &'static str {
        if self.q1 >= floor {
            "met (the whole interquartile range is above it)"
        } else if self.median >= floor {
            "met by the median; the interquartile range reaches below"
        } else if self.q3 >= floor {
            "MISSED by the median; the interquartile range reaches above"
        } else {
            "MISSED (the whole interquartile range is below it)"
        }
    }
}

/// The report of one topology: a row per attached setup.
fn report(
    title: &str,
    setups: &[Setup],
    pairs: &[Pairs],
    secs: u64,
    n: usize,
) -> Result<(String, Vec<Figure>)> {
    let mut out = String::new();
    writeln!(out)?;
    writeln!(
        out,
        "bench dataplane: iperf3 TCP {title}; {n} paired trials per setup of {secs} s each \
         (first second left out), bare and attached back to back in alternating order"
    )?;
    writeln!(
        out,
        "{:<12} {:>11} {:>15} {:>17} {:>19}",
        "setup", "bare Gbit/s", "setup Gbit/s", "median % of bare", "IQR of % of bare"
    )?;
    let mut figures = Vec::new();
    for (setup, p) in setups.iter().zip(pairs) {
        let f = Figure::of(p);
        writeln!(
            out,
            "{:<12} {:>11.2} {:>15.2} {:>16.1}% {:>10.1} .. {:.1}%",
            setup.name(),
            quantile(&p.bare, 0.5),
            quantile(&p.attached, 0.5),
            100.0 * f.median,
            100.0 * f.q1,
            100.0 * f.q3
        )?;
        figures.push(f);
    }
    Ok((out, figures))
}

/// Measures each of `setups` (attached ones: not `Bare`) in `n` paired
/// trials against bare, the pairs of all setups interleaved, each pair's
/// order alternating; `attach`/`detach` put a setup's program on and off
/// where the data flows.
fn measure(
    dp: &mut Datapath,
    setups: &[Setup],
    n: usize,
    label: &str,
    mut iperf_once: impl FnMut() -> Result<f64>,
    mut attach: impl FnMut(&mut Datapath, Setup) -> Result<()>,
    mut detach: impl FnMut(&mut Datapath, Setup) -> Result<()>,
) -> Result<Vec<Pairs>> {
    let mut pairs: Vec<Pairs> = setups.iter().map(|_| Pairs::default()).collect();
    for k in 0..n {
        for (i, &setup) in setups.iter().enumerate() {
            let mut one = |attached: bool, dp: &mut Datapath| -> Result<f64> {
                if attached {
                    attach(dp, setup)?;
                }
                let gbps = iperf_once();
                if attached {
                    detach(dp, setup)?;
                }
                gbps
            };
            let attached_first = k % 2 == 1;
            let first = one(attached_first, dp)?;
            let second = one(!attached_first, dp)?;
            let (bare, att) = if attached_first {
                (second, first)
            } else {
                (first, second)
            };
            println!(
                "pair {}/{n} {label} {:<12} bare {bare:>6.2} attached {att:>6.2} Gbit/s ({:.1} %)",
                k + 1,
                setup.name(),
                100.0 * att / bare
            );
            pairs[i].bare.push(bare);
            pairs[i].attached.push(att);
        }
    }
    Ok(pairs)
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
        .map_or(Ok(1), |s| s.parse())
        .context("seconds")?;
    let n: usize = args.next().map_or(Ok(20), |s| s.parse()).context("pairs")?;
    if n < 4 {
        bail!("at least 4 pairs (quartiles)");
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
        Setup::Attached(AttachMode::Tc),
        Setup::Guard,
        Setup::Attached(AttachMode::XdpGeneric),
        Setup::Attached(AttachMode::XdpNative),
    ];
    let guard = std::cell::RefCell::new(Guard::load().context("loading the DHCP guard")?);
    let iperf = Iperf::start(&server, &client, secs);
    let pairs = measure(
        &mut dp,
        &setups,
        n,
        "veth",
        || iperf.run(),
        |dp, setup| match setup {
            Setup::Attached(mode) => {
                exact(&dp.attach(&target, Some(mode), CaptureMode::Observe)?, mode)
            }
            Setup::Guard => {
                guard.borrow_mut().attach(&target, &PortPolicy::default())?;
                Ok(())
            }
        },
        |dp, setup| match setup {
            Setup::Attached(_) => Ok(dp.detach(&target)?),
            Setup::Guard => Ok(guard.borrow_mut().detach(&target)?),
        },
    )?;
    drop(iperf);
    let tc = |dp: &mut Datapath| {
        exact(
            &dp.attach(&target, Some(AttachMode::Tc), CaptureMode::Observe)?,
            AttachMode::Tc,
        )
    };
    let passed = sees_the_data_path(&mut dp, tc, |dp| Ok(dp.detach(&target)?), &client)?;
    let (mut out, figures) = report("over veth", &setups, &pairs, secs, n)?;
    writeln!(out)?;
    for (setup, what) in [
        (
            Setup::Attached(AttachMode::Tc),
            "default choice for veth (tc)",
        ),
        (Setup::Guard, "DHCP guard on a workload port"),
    ] {
        if let Some(i) = setups.iter().position(|s| *s == setup) {
            let f = &figures[i];
            writeln!(
                out,
                "target: {what} >= 97 % of bare: median {:.1} %, IQR {:.1} .. {:.1} % -> {}",
                100.0 * f.median,
                100.0 * f.q1,
                100.0 * f.q3,
                f.against(0.97)
            )?;
        }
    }
    writeln!(
        out,
        "probe frames (UDP 67 -> 68, too short for DHCP) the programs classified on the measured path: {passed} of {PROBES}"
    )?;

    out.push_str(&through_uplink(&mut dp, secs, n)?);
    print!("{out}");
    if let Some(dir) = std::env::var_os("XDHCP_BENCH_RESULTS") {
        let path = std::path::PathBuf::from(dir).join("dataplane.md");
        std::fs::write(&path, format!("```text\n{out}```\n"))
            .with_context(|| format!("writing {}", path.display()))?;
        println!("written to {}", path.display());
    }
    Ok(())
}

/// Probe datagrams per check of where the programs sit.
const PROBES: u64 = 5;

/// How many of [`PROBES`] UDP 67 -> 68 datagrams, too short to be DHCP,
/// sent from `from` to the server's address, the programs counted as
/// malformed while `attach` had them on the measured path: proof that they
/// sit where the data flows (a frame that is not DHCP is counted nowhere).
/// An error when they saw none.
fn sees_the_data_path(
    dp: &mut Datapath,
    attach: impl FnOnce(&mut Datapath) -> Result<()>,
    detach: impl FnOnce(&mut Datapath) -> Result<()>,
    from: &NetNs,
) -> Result<u64> {
    attach(dp)?;
    let before = dp.counters()?.malformed;
    from.run_in(|| -> Result<()> {
        let sock = std::net::UdpSocket::bind((CLIENT_IP, 67)).context("bind UDP 67")?;
        for _ in 0..PROBES {
            sock.send_to(&[0u8; 8], (SERVER_IP, 68))
                .context("send a probe")?;
        }
        Ok(())
    })?;
    // The frames pass the program as the send returns, or once the
    // server's address is resolved: a moment.
    let mut seen = 0;
    for _ in 0..100 {
        seen = dp.counters()?.malformed - before;
        if seen >= PROBES {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    detach(dp)?;
    if seen == 0 {
        bail!("the programs classified no probe: not attached where the data flows?");
    }
    Ok(seen)
}

/// The uplink topology: ext (client) -> `up0` [node: `br0`] `pod0` -> pod
/// (server), bare and with the uplink program on `up0`; the report.
fn through_uplink(dp: &mut Datapath, secs: u64, n: usize) -> Result<String> {
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
        Setup::Attached(AttachMode::Tc),
        Setup::Attached(AttachMode::XdpGeneric),
    ];
    let iperf = Iperf::start(&pod, &ext, secs);
    let up_pairs = measure(
        dp,
        &up_setups,
        n,
        "uplink",
        || iperf.run(),
        |dp, setup| {
            let Setup::Attached(mode) = setup else {
                bail!("the uplink is measured bare or with the uplink program only")
            };
            let att = dp.attach_as(Role::Uplink, &uplink, Some(mode), CaptureMode::Intercept)?;
            exact(&att, mode)
        },
        |dp, _| Ok(dp.detach(&uplink)?),
    )?;
    drop(iperf);
    let probe = |dp: &mut Datapath| -> Result<()> {
        let att = dp.attach_as(
            Role::Uplink,
            &uplink,
            Some(AttachMode::Tc),
            CaptureMode::Intercept,
        )?;
        exact(&att, AttachMode::Tc)
    };
    let up_passed = sees_the_data_path(dp, probe, |dp| Ok(dp.detach(&uplink)?), &ext)?;
    let (up_out, up_figures) = report(
        "through a node uplink (veth into a bridge, on to a pod's veth)",
        &up_setups,
        &up_pairs,
        secs,
        n,
    )?;
    let mut out = up_out;
    let f = &up_figures[0];
    writeln!(
        out,
        "uplink program (tc, the veth default): median {:.1} % of the bare uplink path, \
         IQR {:.1} .. {:.1} %; probe frames classified: {up_passed} of {PROBES}",
        100.0 * f.median,
        100.0 * f.q1,
        100.0 * f.q3
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quartiles_of_paired_ratios() {
        assert!((quantile(&[3.0, 1.0, 2.0], 0.5) - 2.0).abs() < 1e-12);
        assert!((quantile(&[1.0, 2.0, 3.0, 4.0], 0.25) - 1.75).abs() < 1e-12);
        assert!((quantile(&[1.0, 2.0, 3.0, 4.0], 0.75) - 3.25).abs() < 1e-12);
        // Ratios pair by pair: a drift that hits both halves of a pair cancels.
        let p = Pairs {
            bare: vec![10.0, 5.0, 8.0, 2.0],
            attached: vec![9.9, 4.95, 7.92, 1.98],
        };
        let f = Figure::of(&p);
        assert!((f.median - 0.99).abs() < 1e-9 && (f.q3 - f.q1).abs() < 1e-9);
        assert!(f.against(0.97).starts_with("met (the whole"));
        assert!(f.against(0.995).starts_with("MISSED (the whole"));
    }
}
