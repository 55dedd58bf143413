//! What the benchmark binaries (`src/bin/bench_*.rs`) share: the two IPAM
//! daemons (xdhcp's agent and the upstream CNI `dhcp` daemon) started and
//! invoked as a runtime would, process CPU and memory from `/proc`, the
//! agent's Prometheus counters, progress lines and SVG plots.
//!
//! Nothing here asserts a timing; the binaries report figures side by side.
#![expect(clippy::print_stderr, reason = "benchmark progress goes to stderr")]

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::{
    CNI_PLUGIN_DIR,
    netns::LabClient,
    plugin::PluginCall,
    servers::{Process, wait_until},
};

/// Debian's upstream `dhcp` plugin, from the program table.
pub fn upstream() -> &'static Path {
    crate::program("cni/dhcp")
}

/// One progress line on stderr, stamped with the seconds since the first
/// one, so a long benchmark shows where it is.
#[macro_export]
macro_rules! progress {
    ($($arg:tt)*) => {
        $crate::bench::progress_line(&format!($($arg)*))
    };
}

/// See [`progress!`].
pub fn progress_line(text: &str) {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let t = START.get_or_init(Instant::now).elapsed();
    eprintln!("[{:>7.1} s] {text}", t.as_secs_f64());
}

/// Which IPAM implementation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Impl {
    Upstream,
    Xdhcp,
}

impl Impl {
    pub fn name(self) -> &'static str {
        match self {
            Impl::Upstream => "upstream dhcp",
            Impl::Xdhcp => "xdhcp",
        }
    }
}

/// Both implementations, or only one with `XDHCP_BENCH_ONLY=xdhcp|upstream`
/// (for iterating; the published tables need both).
pub fn impls() -> Vec<Impl> {
    match std::env::var("XDHCP_BENCH_ONLY").as_deref() {
        Ok("xdhcp") => vec![Impl::Xdhcp],
        Ok("upstream") => vec![Impl::Upstream],
        _ => vec![Impl::Upstream, Impl::Xdhcp],
    }
}

/// The release agent binary (`cargo xtask bench` sets `XDHCP_BIN`).
pub fn xdhcp_bin() -> PathBuf {
    PathBuf::from(
        std::env::var_os("XDHCP_BIN")
            .expect("XDHCP_BIN: path of the release xdhcp binary (cargo xtask bench sets it)"),
    )
}

/// The thin plugin binary (`cargo xtask bench` sets `XDHCP_PLUGIN_BIN`),
/// what a node installs as `/opt/cni/bin/xdhcp`: the runtime execs it for
/// every CNI call. Without it the agent binary is the plugin (it answers
/// the same, from a larger binary).
pub fn xdhcp_plugin_bin() -> Option<PathBuf> {
    std::env::var_os("XDHCP_PLUGIN_BIN").map(PathBuf::from)
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
}

/// How to start a daemon.
#[derive(Default)]
pub struct DaemonOptions {
    /// Extra flags for `xdhcp agent` (ignored for upstream).
    pub agent_args: Vec<String>,
    /// Keep state (the agent's lease records) here instead of a fresh
    /// temporary directory: a restarted agent finds what the last one left.
    pub state_in: Option<PathBuf>,
    /// Serve the agent's `/metrics` on this address.
    pub metrics: Option<SocketAddr>,
    /// `RUST_LOG` for the agent (default: `XDHCP_BENCH_RUST_LOG`, else `warn`).
    pub rust_log: Option<String>,
    /// Do not wait until the daemon serves (the caller times its start).
    pub no_wait: bool,
    /// Run the agent inside this network namespace (a node's, whose
    /// uplinks `agent_args` may name); the upstream daemon runs where the
    /// benchmark does either way (it enters each pod's namespace itself).
    pub node_ns: Option<String>,
    /// The Open vSwitch database the agent reads its uplinks from (a lab's
    /// own); none: a socket that does not exist.
    pub ovsdb: Option<PathBuf>,
    /// Invoke xdhcp's plugin with the upstream plugin's config (`"type":
    /// "dhcp"`, `daemonSocketPath`), as a node that swapped the binary but
    /// kept its network configs does; otherwise xdhcp's own (`"type":
    /// "xdhcp"`, `socketPath`). The upstream plugin gets its own either way.
    pub upstream_dialect: bool,
    /// More fields of xdhcp's own `ipam` object (e.g. `"family": "ipv6"`);
    /// not with `upstream_dialect`.
    pub ipam_extra: Option<serde_json::Map<String, serde_json::Value>>,
}

/// A running IPAM daemon and how to invoke its plugin.
pub struct Daemon {
    pub which: Impl,
    pub process: Process,
    pub socket: PathBuf,
    pub plugin: PathBuf,
    pub log: PathBuf,
    /// See [`DaemonOptions::upstream_dialect`].
    upstream_dialect: bool,
    /// See [`DaemonOptions::ipam_extra`].
    ipam_extra: Option<serde_json::Map<String, serde_json::Value>>,
    _dir: Option<tempfile::TempDir>,
}

impl Daemon {
    /// Starts `which` in a fresh directory and waits until it serves.
    pub fn start(which: Impl, xdhcp: &Path) -> Daemon {
        Self::start_with(which, xdhcp, &DaemonOptions::default())
    }

    /// Starts `which` as `opts` say.
    pub fn start_with(which: Impl, xdhcp: &Path, opts: &DaemonOptions) -> Daemon {
        let (tmp, dir) = if let Some(d) = &opts.state_in {
            std::fs::create_dir_all(d).expect("state directory");
            (None, d.clone())
        } else {
            let t = tempfile::Builder::new()
                .prefix("xdt-bench-")
                .tempdir()
                .expect("tempdir");
            let p = t.path().to_path_buf();
            (Some(t), p)
        };
        let socket = dir.join("ipam.sock");
        // `XDHCP_BENCH_LOG_DIR`: keep the daemons' logs there (the agent at
        // `XDHCP_BENCH_RUST_LOG`, default `warn`) to see where time goes.
        let log = std::env::var_os("XDHCP_BENCH_LOG_DIR").map_or_else(
            || dir.join(format!("daemon-{}.log", unix_ms())),
            |d| {
                PathBuf::from(d).join(format!(
                    "{}-{}.log",
                    which.name().replace(' ', "-"),
                    unix_ms()
                ))
            },
        );
        let (process, plugin) = match which {
            Impl::Upstream => {
                // After a kill its socket file stays, and the daemon then
                // refuses to start ("bind: address already in use"); remove
                // it as a service manager's pre-start step would.
                let _ = std::fs::remove_file(&socket);
                let mut cmd = Command::new(upstream());
                cmd.arg("daemon").arg("-socketpath").arg(&socket);
                (
                    Process::spawn_logged("upstream dhcp daemon", cmd, &log),
                    upstream().to_path_buf(),
                )
            }
            Impl::Xdhcp => {
                let mut cmd = crate::agent_command_reading(
                    opts.node_ns.as_deref(),
                    xdhcp,
                    &socket,
                    &dir,
                    opts.ovsdb.as_deref(),
                );
                cmd.env(
                    "RUST_LOG",
                    opts.rust_log.clone().unwrap_or_else(|| {
                        std::env::var("XDHCP_BENCH_RUST_LOG").unwrap_or_else(|_| "warn".into())
                    }),
                );
                if let Some(m) = opts.metrics {
                    cmd.arg("--metrics-addr").arg(m.to_string());
                }
                cmd.args(&opts.agent_args);
                (
                    Process::spawn_logged("xdhcp agent", cmd, &log),
                    xdhcp_plugin_bin().unwrap_or_else(|| xdhcp.to_path_buf()),
                )
            }
        };
        let d = Daemon {
            which,
            process,
            socket,
            plugin,
            log,
            upstream_dialect: opts.upstream_dialect,
            ipam_extra: opts.ipam_extra.clone(),
            _dir: tmp,
        };
        if !opts.no_wait {
            d.wait_serving(Duration::from_secs(30));
        }
        d
    }

    /// Waits until the daemon serves CNI requests: xdhcp binds its socket
    /// first and answers once the datapath and recovery are done (CNI
    /// STATUS says when); the upstream daemon serves as soon as it accepts
    /// connections.
    pub fn wait_serving(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        assert!(
            wait_until(timeout, || self.socket.exists()),
            "{} did not create its socket; log:\n{}",
            self.which.name(),
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
        assert!(
            wait_until(deadline.saturating_duration_since(Instant::now()), || self
                .ready()),
            "{} did not become ready; log:\n{}",
            self.which.name(),
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    /// True once the daemon serves.
    pub fn ready(&self) -> bool {
        match self.which {
            Impl::Upstream => std::os::unix::net::UnixStream::connect(&self.socket).is_ok(),
            Impl::Xdhcp => {
                let conf = serde_json::json!({"cniVersion": "1.1.0", "name": "benchnet",
                    "ipam": {"type": "xdhcp", "socketPath": self.socket}})
                .to_string();
                let Ok(mut child) = Command::new(&self.plugin)
                    .env("CNI_COMMAND", "STATUS")
                    .env("CNI_PATH", CNI_PLUGIN_DIR)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                else {
                    return false;
                };
                let fed = child
                    .stdin
                    .take()
                    .is_some_and(|mut i| i.write_all(conf.as_bytes()).is_ok());
                child.wait().is_ok_and(|s| s.success()) && fed
            }
        }
    }

    /// The network config both plugins are invoked with.
    pub fn config(&self) -> String {
        let ipam = match self.which {
            Impl::Xdhcp if !self.upstream_dialect => {
                let mut ipam = serde_json::json!({"type": "xdhcp", "socketPath": self.socket});
                if let (Some(extra), Some(map)) = (&self.ipam_extra, ipam.as_object_mut()) {
                    map.extend(extra.clone());
                }
                ipam
            }
            Impl::Upstream | Impl::Xdhcp => {
                serde_json::json!({"type": "dhcp", "daemonSocketPath": self.socket})
            }
        };
        serde_json::json!({"cniVersion": "1.0.0", "name": "benchnet", "type": "macvlan", "ipam": ipam})
            .to_string()
    }

    /// Runs one plugin command for `client`; returns its wall time.
    pub fn cni(&self, command: &str, id: &str, client: &LabClient) -> Result<Duration, String> {
        let config = self.config();
        let cni_args = format!("K8S_POD_NAMESPACE=bench;K8S_POD_NAME={id}");
        let started = Instant::now();
        let out = PluginCall {
            plugin: &self.plugin,
            node_ns: None,
            command,
            container_id: id,
            netns: Some(client.ns.path()),
            ifname: &client.ifname,
            cni_path: Path::new(CNI_PLUGIN_DIR),
            cni_args: &cni_args,
            config: &config,
        }
        .run()
        .map_err(|e| format!("exec {}: {e}", self.plugin.display()))?;
        let elapsed = started.elapsed();
        if out.ok {
            Ok(elapsed)
        } else {
            Err(format!(
                "{} {command} {id}: {}",
                self.which.name(),
                out.text()
            ))
        }
    }

    /// CPU time (user + system) the daemon process has used, in ms.
    pub fn cpu_ms(&self) -> u64 {
        self.process.pid().map_or(0, cpu_ms_of)
    }

    /// (RSS in KiB, OS threads) of the daemon process.
    pub fn footprint(&self) -> (u64, u64) {
        footprint_of(self.process.pid().expect("daemon running"))
    }
}

/// Puts each pod's leased address (as the server's lease file has it) on its
/// interface, as the main CNI plugin does after IPAM: a renewal's ACK is
/// unicast to that address, and the server must resolve it with ARP.
pub fn configure_leased(
    clients: &[LabClient],
    leases: &[crate::servers::ServerLease],
    prefix_len: u8,
) -> usize {
    let by_mac: std::collections::HashMap<[u8; 6], std::net::Ipv4Addr> =
        leases.iter().map(|l| (l.mac, l.ip)).collect();
    let mut n = 0;
    for c in clients {
        if let Some(ip) = by_mac.get(&c.mac) {
            c.ns.add_addr(&c.ifname, *ip, prefix_len);
            n += 1;
        }
    }
    n
}

/// CPU time (user + system) process `pid` has used, in ms (0 once gone).
pub fn cpu_ms_of(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the parenthesised command name: utime and stime are the 12th and
    // 13th fields, in clock ticks (USER_HZ, 100 on Linux).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse::<u64>().ok())
        .sum();
    ticks * 10
}

/// (RSS in KiB, OS threads) of process `pid` (zeros once gone).
pub fn footprint_of(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("Threads:"))
}

/// A free TCP port on 127.0.0.1 (bound, then released) for an agent's
/// metrics endpoint.
pub fn free_local_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr")
}

/// `GET path` over plain HTTP/1.0; the body, or `None` when nothing answers
/// (yet) or the status is not 200.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.to_owned())
        .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_owned()))
}

/// The phases of an ADD's time as the agent observes them
/// (`xdhcp_add_phase_seconds`, label `phase`), in the order they happen.
pub const ADD_PHASES: [&str; 13] = [
    "request", "lookup", "open", "guard", "protect", "slot", "start", "offer", "ack", "apply",
    "report", "persist", "answer",
];

/// Asserts that every one of [`ADD_PHASES`] was observed `times` times in
/// `text` (the agent's `/metrics`).
///
/// # Panics
/// Naming the first phase that was not, with the whole text.
#[track_caller]
pub fn assert_add_phases_observed(text: &str, times: u64) {
    for phase in ADD_PHASES {
        let count = metric_count(
            text,
            "xdhcp_add_phase_seconds_count",
            &format!("phase=\"{phase}\""),
        );
        assert_eq!(count, times, "phase {phase}:\n{text}");
    }
}

/// The seconds `text` (the agent's `/metrics`) sums for ADD phase `phase`.
pub fn add_phase_sum(text: &str, phase: &str) -> f64 {
    metric(
        text,
        "xdhcp_add_phase_seconds_sum",
        &format!("phase=\"{phase}\""),
    )
}

/// The sum of every sample of metric `name` in a Prometheus exposition
/// whose labels contain `label` (e.g. `state="bound"`; empty: any).
pub fn metric(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            let (metric_name, labels) = key.split_once('{').unwrap_or((key, ""));
            (metric_name == name && labels.contains(label))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        // Not `sum()`: a float sum of nothing is -0.0, printed "-0".
        .fold(0.0, |total, v| total + v)
}

/// [`metric`] for counters and gauges that hold whole numbers: the sum as
/// an integer (panics, naming the series, on anything else).
pub fn metric_count(text: &str, name: &str, label: &str) -> u64 {
    let v = metric(text, name, label);
    assert!(v >= 0.0 && v.fract() == 0.0, "{name}{{{label}}} = {v}");
    // Checked above: a whole, non-negative number.
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "checked above"
    )]
    let n = v as u64;
    n
}

/// The server's own DORA, the floor under an ADD: `rounds` DORAs one after
/// another from interface `ifname` in namespace `netns` with client MAC
/// `mac`, by the xdhcp engine over raw and `AF_PACKET` sockets opened
/// beforehand: no CNI, no plugin exec, no agent. Each bound lease is
/// released at once. The DORAs that bound, each its own time, sorted.
pub fn server_doras(netns: &Path, ifname: &str, mac: [u8; 6], rounds: usize) -> Vec<Duration> {
    use xdhcp::datapath::{afpacket::AfPacketReceiver, rawsock::RawSender};
    use xdhcp_engine::{Client, ClientConfig, Event, MessageKind, PacketSource};

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let tx = RawSender::open_async(netns, ifname)
            .await
            .expect("raw sender in the client namespace");
        let rx = AfPacketReceiver::open_async(netns, ifname)
            .await
            .expect("AF_PACKET receiver in the client namespace");
        rx.only_for(mac).expect("narrow the receiver to its client");
        let wall = || unix_ms() as u64;
        let mut each = Vec::with_capacity(rounds);
        for i in 0..rounds {
            let cfg = ClientConfig {
                chaddr: mac,
                ..ClientConfig::default()
            };
            let started = Instant::now();
            let mut client = Client::new(cfg, started, 0xd0_7a + i as u64);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            let bound = loop {
                while let Some(t) = client.poll_transmit() {
                    let _ = tx.send_transmit(&t);
                }
                let mut done = None;
                while let Some(ev) = client.poll_event() {
                    match ev {
                        Event::Bound(_) => done = Some(true),
                        Event::Failed(_) => done = Some(false),
                        _ => {}
                    }
                }
                if let Some(d) = done {
                    break d;
                }
                let timer = client
                    .poll_timeout()
                    .map_or(deadline, tokio::time::Instant::from_std)
                    .min(deadline);
                tokio::select! {
                    frame = rx.recv() => {
                        let Ok(frame) = frame else { break false };
                        client.set_wall_clock_unix_ms(wall());
                        let src = PacketSource { src_mac: frame.headers.src_mac, src_ip: frame.headers.src_ip };
                        let _ = client.handle_packet(Instant::now(), src, &frame.payload);
                    }
                    () = tokio::time::sleep_until(timer) => {
                        if tokio::time::Instant::now() >= deadline {
                            break false;
                        }
                        client.set_wall_clock_unix_ms(wall());
                        client.handle_timeout(Instant::now());
                    }
                }
            };
            if bound {
                each.push(started.elapsed());
                client.set_wall_clock_unix_ms(wall());
                client.release(Instant::now());
                while let Some(t) = client.poll_transmit() {
                    if t.kind == MessageKind::Release {
                        let _ = tx.send_transmit(&t);
                    }
                }
                // Let the server settle the release before the next DORA.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        each.sort();
        each
    })
}

/// One line of a plot.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// A line chart as SVG at `path`: one line per series (with its points
/// marked), axes from the data, both starting at zero.
pub fn plot_lines(path: &Path, title: &str, x_label: &str, y_label: &str, series: &[Series]) {
    use plotters::prelude::*;
    let pts = series.iter().flat_map(|s| s.points.iter());
    let x_max = pts.clone().map(|p| p.0).fold(0.0_f64, f64::max) * 1.05;
    let y_max = pts.map(|p| p.1).fold(0.0_f64, f64::max) * 1.1;
    let (x_max, y_max) = (x_max.max(1e-9), y_max.max(1e-9));
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    let draw = || -> Result<(), Box<dyn std::error::Error + '_>> {
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
        let colours = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK];
        for (i, s) in series.iter().enumerate() {
            let c = colours[i % colours.len()];
            chart
                .draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(2)))?
                .label(s.label.clone())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], c.stroke_width(2)));
            chart.draw_series(
                s.points
                    .iter()
                    .map(|&(x, y)| Circle::new((x, y), 3, c.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    };
    match draw() {
        Ok(()) => progress_line(&format!("plot written to {}", path.display())),
        Err(e) => progress_line(&format!("plot {} failed: {e}", path.display())),
    }
}

/// A line chart as SVG at `path` with both axes logarithmic: for figures
/// that span orders of magnitude (a few milliseconds beside seconds), where
/// a linear axis flattens the smaller curve onto zero. Every point must be
/// positive; the axes run from a little under the smallest to a little over
/// the largest value.
pub fn plot_lines_log(path: &Path, title: &str, x_label: &str, y_label: &str, series: &[Series]) {
    use plotters::prelude::*;
    let pts: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|&(x, y)| x > 0.0 && y > 0.0)
        .collect();
    let span = |v: &mut dyn Iterator<Item = f64>| {
        let (lo, hi) = v.fold((f64::INFINITY, 0.0_f64), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
        if lo.is_finite() {
            (lo / 1.5, hi * 1.5)
        } else {
            (0.1, 10.0)
        }
    };
    let (x_min, x_max) = span(&mut pts.iter().map(|p| p.0));
    let (y_min, y_max) = span(&mut pts.iter().map(|p| p.1));
    let root = SVGBackend::new(path, (800, 520)).into_drawing_area();
    let draw = || -> Result<(), Box<dyn std::error::Error + '_>> {
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d((x_min..x_max).log_scale(), (y_min..y_max).log_scale())?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .draw()?;
        let colours = [
            RED,
            BLUE,
            GREEN,
            MAGENTA,
            CYAN,
            BLACK,
            RGBColor(230, 140, 0),
            RGBColor(120, 120, 120),
        ];
        for (i, s) in series.iter().enumerate() {
            let c = colours[i % colours.len()];
            let points: Vec<(f64, f64)> = s
                .points
                .iter()
                .copied()
                .filter(|&(x, y)| x > 0.0 && y > 0.0)
                .collect();
            chart
                .draw_series(LineSeries::new(points.iter().copied(), c.stroke_width(2)))?
                .label(s.label.clone())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], c.stroke_width(2)));
            chart.draw_series(
                points
                    .iter()
                    .map(|&(x, y)| Circle::new((x, y), 3, c.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    };
    match draw() {
        Ok(()) => progress_line(&format!("plot written to {}", path.display())),
        Err(e) => progress_line(&format!("plot {} failed: {e}", path.display())),
    }
}

/// The benchmarks' server for a lab of many pods: dnsmasq on the lab's
/// server interface with a /20 pool (198.18.0.10–198.18.15.250), no ping
/// check, room for 5000 leases, `lease_secs` leases with T1 `t1_secs` (and
/// T2, when given).
pub fn pool_server(
    lab: &crate::netns::Lab,
    lease_secs: u32,
    t1_secs: u32,
    t2_secs: Option<u32>,
) -> crate::servers::Dnsmasq {
    use std::net::Ipv4Addr;
    crate::servers::Dnsmasq::start(
        lab.dhcp_ns(),
        crate::servers::DnsmasqConfig {
            interface: lab.dhcp_ifname().to_owned(),
            range: (
                Ipv4Addr::new(198, 18, 0, 10),
                Ipv4Addr::new(198, 18, 15, 250),
            ),
            netmask: Ipv4Addr::new(255, 255, 240, 0),
            lease_secs,
            t1_secs: Some(t1_secs),
            t2_secs,
            router: Some(Ipv4Addr::new(198, 18, 0, 1)),
            dns: vec![],
            extra_args: vec!["--dhcp-lease-max=5000".to_owned()],
            ..crate::servers::DnsmasqConfig::default()
        },
    )
}

/// The median and the 99th percentile of `v` (nearest rank; `NaN` when
/// empty). With few samples the p99 is the largest.
#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "sample counts far below 2^52; the rank is within the slice"
)]
pub fn median_p99(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |p: f64| {
        if v.is_empty() {
            return f64::NAN;
        }
        let idx = ((v.len() as f64 - 1.0) * p).round() as usize;
        v[idx.min(v.len() - 1)]
    };
    (at(0.5), at(0.99))
}

/// `$XDHCP_BENCH_RESULTS/<name>` if the results directory is set.
pub fn results_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("XDHCP_BENCH_RESULTS").map(|d| PathBuf::from(d).join(name))
}

/// Writes `text` to `$XDHCP_BENCH_RESULTS/<name>` (if set) and says where.
pub fn write_result(name: &str, text: &str) {
    if let Some(p) = results_path(name) {
        std::fs::write(&p, text).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
        progress_line(&format!("written to {}", p.display()));
    }
}

#[cfg(test)]
mod tests {
    use super::{median_p99, metric};

    #[test]
    fn median_and_p99_of_rounds() {
        let (m, p) = median_p99(vec![5.0, 1.0, 3.0, 2.0, 4.0]);
        assert!((m - 3.0).abs() < 1e-9 && (p - 5.0).abs() < 1e-9);
        let many: Vec<f64> = (1..=200).map(f64::from).collect();
        let (m, p) = median_p99(many);
        assert!((m - 101.0).abs() < 1e-9, "{m}");
        assert!((p - 198.0).abs() < 1e-9, "{p}");
        assert!(median_p99(Vec::new()).0.is_nan());
    }

    #[test]
    fn metric_sums_the_matching_samples_and_an_absent_one_is_plain_zero() {
        let text = "# HELP xdhcp_failures_total x\n\
                    xdhcp_failures_total{error=\"a\"} 2\n\
                    xdhcp_failures_total{error=\"b\"} 3\n\
                    xdhcp_renewals_total 7\n";
        assert!((metric(text, "xdhcp_failures_total", "") - 5.0).abs() < f64::EPSILON);
        assert!((metric(text, "xdhcp_failures_total", "error=\"b\"") - 3.0).abs() < f64::EPSILON);
        assert_eq!(format!("{:.0}", metric(text, "xdhcp_naks_total", "")), "0");
    }
}
