//! Command-line flags of `xdhcp agent`, `xdhcp leases`, `xdhcp status`, and
//! the two operator commands' rendering.
//!
//! Every path is a flag (defaults in `docs/dhcp-ipam-localnet.md`, Agent
//! flags); every DHCP timing knob maps
//! onto [`xdhcp_engine::ClientConfig`] (defaults are the engine's, RFC 2131).
//!
//! One thing: the command line, as flags, and as the operator commands'
//! client side and rendering.

pub mod upstream;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::cni::config::DEFAULT_SOCKET;
pub use crate::kube::KubeMode;
use crate::rpc::{AgentStatus, LeaseView};

/// xdhcp: `DHCPv4` IPAM for OVN-Kubernetes localnet networks. With
/// `CNI_COMMAND` set, the same binary is the CNI IPAM plugin.
#[derive(Debug, Parser)]
#[command(
    name = "xdhcp",
    version,
    about,
    long_about = None,
    after_help = "Also: `xdhcp daemon [flags]` (or `dhcp daemon` when installed as dhcp) runs the agent \
        with the upstream dhcp daemon's flags (-socketpath, -hostprefix, -pidfile, -broadcast, \
        -timeout, -resendmax, -resendtimeout); `dhcp daemon -h` lists them."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node agent (DHCP leases, CNI socket, metrics).
    Agent(Box<AgentArgs>),
    /// Print the lease table of a running agent.
    Leases(ClientArgs),
    /// Print the status of a running agent: datapath, attach modes, counters.
    Status(ClientArgs),
    /// Print the binding table of a running agent: MAC, IP, workload port,
    /// expiry, and whether the agent leased or learned it.
    Bindings(ClientArgs),
    /// Remove every eBPF pin the agent leaves under its bpffs directory: the
    /// capture links (which detaches the capture programs) and the maps.
    /// For uninstalling: a stopping agent leaves them for the next one to
    /// take over; run this once the agent is gone from the node for good.
    Unpin(UnpinArgs),
}

/// Flags of `xdhcp unpin`.
#[derive(Debug, Clone, Args)]
pub struct UnpinArgs {
    /// The agent's `--bpffs-dir`.
    #[arg(long, default_value = "/sys/fs/bpf/xdhcp")]
    pub bpffs_dir: PathBuf,
}

/// `xdhcp unpin`: remove the pins, say what went.
pub fn unpin_text(a: &UnpinArgs) -> anyhow::Result<String> {
    use anyhow::Context as _;
    let removed = crate::datapath::ebpf::unpin_all(&a.bpffs_dir)
        .with_context(|| format!("removing the pins under {}", a.bpffs_dir.display()))?;
    let mut out = String::new();
    for p in &removed {
        let _ = writeln!(out, "removed {}", p.display());
    }
    let _ = writeln!(
        out,
        "{} pin(s) removed from {}",
        removed.len(),
        a.bpffs_dir.display()
    );
    Ok(out)
}

/// Flags of the operator commands.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// Agent socket.
    #[arg(long, env = "XDHCP_SOCKET", default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub use crate::settings::{
    AgentArgs, AttachChoice, DatapathChoice, ExpiredPolicy, GuardChoice, InvalidUplink, Uplink,
};

/// Render the lease table of `xdhcp leases`.
pub fn render_leases(rows: &[LeaseView], now_unix_ms: u64) -> String {
    let headers = [
        "POD",
        "INTERFACE",
        "FAMILY",
        "MAC",
        "IP",
        "SERVER",
        "STATE",
        "PATH",
        "EXPIRES IN",
    ];
    let mut table: Vec<[String; 9]> = rows
        .iter()
        .map(|r| {
            [
                r.pod
                    .clone()
                    .unwrap_or_else(|| format!("({})", short_id(&r.container_id))),
                r.ifname.clone(),
                if r.family.is_empty() {
                    "ipv4".into()
                } else {
                    r.family.clone()
                },
                r.mac.clone(),
                match (r.address, r.address6) {
                    (Some(a), _) => a.to_string(),
                    (None, Some(a)) => a.to_string(),
                    (None, None) => "-".into(),
                },
                r.server.map_or_else(|| "-".into(), |s| s.to_string()),
                r.state.clone(),
                if r.path.is_empty() {
                    "-".into()
                } else {
                    r.path.clone()
                },
                r.expires_unix_ms
                    .map_or_else(|| "-".into(), |e| human_remaining(e, now_unix_ms)),
            ]
        })
        .collect();
    table.sort();
    let mut widths = headers.map(str::len);
    for row in &table {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let mut l = String::new();
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(c);
            } else {
                let _ = write!(l, "{c:<w$}  ");
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&headers);
    for row in &table {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        line(&cells);
    }
    if rows.is_empty() {
        out.push_str("(no leases)\n");
    }
    out
}

/// Ask the agent at `a.socket` for `path` (the one blocking client of the
/// socket); its error is the agent's CNI message.
fn ask<R: serde::de::DeserializeOwned>(a: &ClientArgs, path: &str) -> anyhow::Result<R> {
    crate::rpc::Client::new(a.socket.clone(), Duration::from_secs(10))
        .get(path)
        .map_err(|e| anyhow::anyhow!(e.into_cni().msg))
}

/// `xdhcp leases`: ask the agent, render the table (or JSON).
pub fn leases_text(a: &ClientArgs) -> anyhow::Result<String> {
    let rows: Vec<LeaseView> = ask(a, crate::rpc::PATH_LEASES)?;
    if a.json {
        Ok(serde_json::to_string_pretty(&rows)? + "\n")
    } else {
        Ok(render_leases(&rows, now_unix_ms()))
    }
}

/// `xdhcp bindings`: ask the agent, render the table (or JSON).
pub fn bindings_text(a: &ClientArgs) -> anyhow::Result<String> {
    let rows: Vec<crate::bindings::BindingRow> = ask(a, crate::bindings::PATH_BINDINGS)?;
    if a.json {
        Ok(serde_json::to_string_pretty(&rows)? + "\n")
    } else {
        Ok(crate::bindings::render(&rows, now_unix_ms()))
    }
}

/// `xdhcp status`: ask the agent, render the summary (or JSON).
pub fn status_text(a: &ClientArgs) -> anyhow::Result<String> {
    let s: AgentStatus = ask(a, crate::rpc::PATH_STATUS)?;
    if a.json {
        Ok(serde_json::to_string_pretty(&s)? + "\n")
    } else {
        Ok(render_status(&s))
    }
}

/// Render `xdhcp status`.
pub fn render_status(s: &AgentStatus) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "agent:        xdhcp {} ({})",
        s.version,
        if s.ready { "ready" } else { "not ready" }
    );
    let _ = writeln!(out, "socket:       {}", s.socket.display());
    let _ = writeln!(
        out,
        "state dir:    {} (recovered: {})",
        s.state_dir.display(),
        s.state_recovered
    );
    let _ = writeln!(out, "pod API:      {}", s.pod_api);
    let _ = write!(out, "datapath:     {}", s.datapath);
    if let Some(n) = &s.datapath_note {
        let _ = write!(out, " ({n})");
    }
    out.push('\n');
    if let Some(d) = &s.degraded {
        let _ = writeln!(out, "degraded:     {d}");
    }
    let _ = write!(out, "leases:       {}", s.leases);
    if !s.leases_by_family.is_empty() {
        let by: Vec<String> = s
            .leases_by_family
            .iter()
            .map(|(family, n)| format!("{family} {n}"))
            .collect();
        let _ = write!(out, " ({})", by.join(", "));
    }
    out.push('\n');
    if !s.interfaces.is_empty() {
        out.push_str("interfaces:\n");
        for i in &s.interfaces {
            let ns = i
                .netns
                .as_ref()
                .map_or_else(|| "host".into(), |p| p.display().to_string());
            let _ = writeln!(
                out,
                "  {:<16} {:<10} {:<12} {ns}",
                short_id(&i.container_id),
                i.ifname,
                i.attach
            );
        }
    }
    let src = &s.uplink_source;
    if !src.kind.is_empty() {
        let mut line = format!("uplinks from: {}", src.kind);
        if let Some(db) = &src.ovsdb {
            let _ = write!(line, " ({}", db.display());
            if let Some(state) = &src.state {
                let _ = write!(line, ", {state}");
            }
            if let Some(reason) = &src.reason {
                let _ = write!(line, ": {reason}");
            }
            line.push(')');
        }
        let _ = writeln!(out, "{line}");
    }
    if !s.uplinks.is_empty() {
        out.push_str("uplinks:\n");
        for u in &s.uplinks {
            let _ = writeln!(
                out,
                "  {:<16} {:<16} {:<6} {:<8} {:<12} replies {}",
                u.ifname,
                u.physnet.as_deref().unwrap_or("-"),
                if u.source.is_empty() { "-" } else { &u.source },
                u.state,
                u.mode.as_deref().unwrap_or("-"),
                u.replies
            );
        }
    }
    render_ports(&mut out, s);
    if !s.counters.is_empty() {
        out.push_str("counters:\n");
        for (k, v) in &s.counters {
            let _ = writeln!(out, "  {k:<32} {v}");
        }
    }
    if s.annotations.as_object().is_some_and(|o| !o.is_empty()) {
        out.push_str("annotations (embedded store):\n");
        let pretty = serde_json::to_string_pretty(&s.annotations).unwrap_or_default();
        for l in pretty.lines() {
            let _ = writeln!(out, "  {l}");
        }
    }
    out
}

/// The workload ports of `s`: those the guard is on, and those captured
/// on their host side.
fn render_ports(out: &mut String, s: &AgentStatus) {
    if !s.guarded_ports.is_empty() {
        out.push_str("guarded ports (identity from):\n");
        for p in &s.guarded_ports {
            let _ = write!(
                out,
                "  {:<16} {:<5} {:<12} {:<6} {:<24} {:<36} {}",
                p.port,
                p.identity,
                short_id(&p.container_id),
                if p.ifname.is_empty() { "-" } else { &p.ifname },
                p.network.as_deref().unwrap_or("-"),
                p.pod_uid.as_deref().unwrap_or("-"),
                if p.learning { "learning" } else { "-" },
            );
            // The guard's drops on the port, by family and reason.
            for (reason, n) in &p.drops {
                let _ = write!(out, " {reason}={n}");
            }
            out.push('\n');
        }
    }
    if !s.port_captures.is_empty() {
        out.push_str("ports captured on their host side (found in OVS):\n");
        for p in &s.port_captures {
            let _ = writeln!(
                out,
                "  {:<16} {:<17} {:<24} {:<8} {:<9} replies {}",
                p.port,
                p.mac,
                p.network.as_deref().unwrap_or("-"),
                p.state,
                p.hook.as_deref().unwrap_or("-"),
                p.replies
            );
        }
    }
}

fn short_id(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

fn human_remaining(expires_ms: u64, now_ms: u64) -> String {
    if expires_ms <= now_ms {
        return "expired".into();
    }
    let s = (expires_ms - now_ms) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// Most runtime worker threads, whatever the node's core count: the agent's
/// work is I/O-bound and light per lease.
pub const MAX_WORKER_THREADS: usize = 4;
/// Most OS threads in the runtime's blocking pool (store fsyncs, eBPF
/// attaches, counter snapshots). Tokio's default of 512 let a burst of ADDs
/// grow the agent by one thread per lease in flight, each with a stack and,
/// under glibc, a share of a malloc arena that is never given back.
pub const BLOCKING_THREADS: usize = 8;
/// How long an idle blocking thread lingers (tokio's default is 10 s).
const BLOCKING_KEEP_ALIVE: Duration = Duration::from_secs(2);
/// Name of every runtime thread (workers and blocking pool).
pub const RUNTIME_THREAD_NAME: &str = "xdhcp-rt";
/// Least time between two returns of freed heap pages to the kernel.
const TRIM_INTERVAL: Duration = Duration::from_secs(1);

/// The agent's tokio runtime: a constant number of OS threads, independent
/// of the lease count — at most [`MAX_WORKER_THREADS`] workers plus
/// [`BLOCKING_THREADS`] blocking threads. Under glibc it also caps malloc
/// arenas at the worker count (see [`limit_malloc_arenas`]) and gives freed
/// heap pages back when a worker goes idle (see [`trim_heap_when_idle`]).
/// Call it before any other thread exists.
pub fn agent_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let workers = std::thread::available_parallelism()
        .map_or(1, std::num::NonZero::get)
        .min(MAX_WORKER_THREADS);
    limit_malloc_arenas(workers);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .max_blocking_threads(BLOCKING_THREADS)
        .thread_keep_alive(BLOCKING_KEEP_ALIVE)
        .thread_name(RUNTIME_THREAD_NAME)
        .on_thread_park(trim_heap_when_idle)
        .enable_all()
        .build()
}

/// Give freed heap pages back to the kernel, at most once per
/// [`TRIM_INTERVAL`]; called by runtime workers as they go idle.
///
/// glibc returns memory only from the top of a heap; the pages freed in the
/// middle by a burst of ADDs (requests, replies, namespace trips, store
/// writes, all short-lived and interleaved with the leases' long-lived
/// state) stay resident otherwise. A trim costs a few ms right after a burst,
/// µs otherwise; figures and the allocator comparison:
/// `docs/performance-notes.md`.
pub fn trim_heap_when_idle() {
    #[cfg(target_env = "gnu")]
    {
        use std::sync::OnceLock;
        use std::sync::atomic::{AtomicU64, Ordering};
        static START: OnceLock<std::time::Instant> = OnceLock::new();
        static LAST_MS: AtomicU64 = AtomicU64::new(0);
        let now = START.get_or_init(std::time::Instant::now).elapsed();
        let now_ms = u64::try_from(now.as_millis()).unwrap_or(u64::MAX);
        let last = LAST_MS.load(Ordering::Relaxed);
        let due = now_ms.saturating_sub(last) >= TRIM_INTERVAL.as_millis() as u64;
        // One worker trims; the others see the new stamp and go to sleep.
        if due
            && LAST_MS
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            // SAFETY: malloc_trim only releases free heap pages; it takes the
            // allocator's own locks.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    }
}

/// Cap glibc's malloc arenas at `n` unless `MALLOC_ARENA_MAX` says otherwise.
///
/// glibc gives threads up to 8 arenas per core; lease work hops between the
/// runtime workers, the blocking pool and the short-lived namespace threads,
/// so each lease's allocations end up spread over many arenas and the freed
/// space stays mapped in all of them (figures: `docs/performance-notes.md`).
/// Other C libraries: nothing to do.
pub fn limit_malloc_arenas(n: usize) {
    #[cfg(target_env = "gnu")]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        let n = i32::try_from(n.max(1)).unwrap_or(i32::MAX);
        // SAFETY: mallopt only adjusts allocator parameters; it is called
        // before the runtime's threads exist.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, n);
        }
    }
    #[cfg(not(target_env = "gnu"))]
    let _ = n;
}

pub use crate::sys::clock::now_unix_ms;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::types::Ipv4Cidr;
    use clap::CommandFactory;
    use xdhcp_engine::{ClientConfig, ExpiredLeasePolicy};

    #[test]
    fn uplink_flags_take_an_interface_or_physnet_equals_interface() {
        let cli = Cli::try_parse_from([
            "xdhcp",
            "agent",
            "--uplink",
            "eth1",
            "--uplink",
            "physnet1=bond0",
        ])
        .unwrap();
        let Command::Agent(a) = cli.command else {
            panic!("agent")
        };
        assert_eq!(
            a.uplinks,
            vec![
                Uplink {
                    ifname: "eth1".into(),
                    physnet: None
                },
                Uplink {
                    ifname: "bond0".into(),
                    physnet: Some("physnet1".into())
                },
            ]
        );
        assert_eq!(a.uplinks[1].to_string(), "physnet1=bond0");
        assert!(
            Cli::try_parse_from(["xdhcp", "agent"])
                .map(|c| matches!(c.command, Command::Agent(a) if a.uplinks.is_empty()))
                .unwrap()
        );
    }

    #[test]
    fn bad_uplinks_are_refused_naming_the_value() {
        for bad in [
            "",
            "=eth1",
            "physnet1=",
            "a b=eth1",
            "physnet1=eth1=x",
            "sixteen-bytes-xx",
            "eth0:1",
            "../x",
            "..",
        ] {
            let e = bad.parse::<Uplink>().unwrap_err();
            assert_eq!(e.input, bad);
            assert!(e.to_string().contains("--uplink"), "{e}");
            let err = Cli::try_parse_from(["xdhcp", "agent", "--uplink", bad]).unwrap_err();
            assert!(err.to_string().contains("--uplink"), "{bad}: {err}");
        }
        assert!("fifteen-bytes-x".parse::<Uplink>().is_ok());
    }

    /// Threads of this process named `name`.
    fn threads_named(name: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .expect("/proc/self/task")
            .filter_map(Result::ok)
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name)
            })
            .count()
    }

    #[test]
    fn the_agent_runtime_keeps_a_constant_thread_count_under_blocking_load() {
        let rt = agent_runtime().expect("runtime");
        // 200 blocking jobs at once (a burst of ADDs persisting leases):
        // with tokio's default pool this is 200 threads.
        let peak = rt.block_on(async {
            let jobs: Vec<_> = (0..200)
                .map(|_| {
                    tokio::task::spawn_blocking(|| {
                        std::thread::sleep(Duration::from_millis(5));
                    })
                })
                .collect();
            let mut peak = 0;
            for j in jobs {
                peak = peak.max(threads_named(RUNTIME_THREAD_NAME));
                j.await.expect("blocking job");
            }
            peak
        });
        assert!(peak > 0, "runtime threads are named {RUNTIME_THREAD_NAME}");
        assert!(
            peak <= MAX_WORKER_THREADS + BLOCKING_THREADS,
            "{peak} runtime threads"
        );
    }

    /// Resident set of this process, KiB.
    fn rss_kib() -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .expect("/proc/self/status")
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("VmRSS")
    }

    #[cfg(target_env = "gnu")]
    #[test]
    fn idle_workers_give_freed_heap_pages_back() {
        // In a process of its own: the other tests' allocations would blur
        // this process's RSS.
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--ignored",
                "--exact",
                "cli::tests::trim_in_a_process_of_its_own",
                "--test-threads=1",
                "--nocapture",
            ])
            .output()
            .expect("run the test binary");
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[cfg(target_env = "gnu")]
    #[test]
    #[ignore = "run by idle_workers_give_freed_heap_pages_back in a process of its own"]
    fn trim_in_a_process_of_its_own() {
        // 48 MiB in 1 KiB chunks, then all freed but one chunk in 64: the
        // freed space is spread all over the heap, so glibc keeps it.
        let mut chunks: Vec<Box<[u8; 1024]>> =
            (0..48 * 1024).map(|_| Box::new([1u8; 1024])).collect();
        let kept: Vec<Box<[u8; 1024]>> = chunks.drain(..).step_by(64).collect();
        let before = rss_kib();
        trim_heap_when_idle();
        std::thread::sleep(TRIM_INTERVAL + Duration::from_millis(100));
        trim_heap_when_idle();
        let after = rss_kib();
        assert_eq!(kept.len(), 768);
        assert!(
            before.saturating_sub(after) > 24 * 1024,
            "RSS {before} KiB -> {after} KiB"
        );
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn agent_defaults_follow_the_spec() {
        let a = AgentArgs::with_defaults(DEFAULT_SOCKET.into(), "/var/lib/xdhcp".into());
        assert_eq!(a.socket, PathBuf::from("/run/xdhcp/xdhcp.sock"));
        assert_eq!(a.bpffs_dir, PathBuf::from("/sys/fs/bpf/xdhcp"));
        assert_eq!(a.sysfs_root, PathBuf::from("/sys"));
        assert_eq!(a.kube, KubeMode::Auto);
        assert!(a.metrics_addr.is_none());
        let c = a.client_config();
        let d = ClientConfig::default();
        assert_eq!(c.retransmit, d.retransmit);
        assert_eq!(c.acquire_timeout, d.acquire_timeout);
        assert_eq!(c.max_message_size, d.max_message_size);
    }

    #[test]
    fn vf_driver_is_repeatable_and_checked() {
        let cli = Cli::try_parse_from([
            "xdhcp",
            "agent",
            "--vf-driver",
            "8086:10d3=e1000e",
            "--vf-driver=15b3:101e=mlx5_core",
        ])
        .unwrap();
        let Command::Agent(a) = cli.command else {
            panic!("agent subcommand")
        };
        let shown: Vec<String> = a.vf_driver.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["8086:10d3=e1000e", "15b3:101e=mlx5_core"]);
        assert!(
            AgentArgs::with_defaults(DEFAULT_SOCKET.into(), "/s".into())
                .vf_driver
                .is_empty()
        );
        let err = Cli::try_parse_from(["xdhcp", "agent", "--vf-driver", "8086:10d3"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("VENDOR:DEVICE=DRIVER"), "{err}");
    }

    #[test]
    fn knobs_map_onto_the_engine() {
        let cli = Cli::parse_from([
            "xdhcp",
            "agent",
            "--acquire-timeout",
            "5s",
            "--retransmit-initial",
            "500ms",
            "--retransmit-max",
            "2s",
            "--expired-lease-policy",
            "discover",
            "--max-routes",
            "3",
            "--kube",
            "off",
        ]);
        let Command::Agent(a) = cli.command else {
            panic!("agent")
        };
        assert_eq!(a.kube, KubeMode::Off);
        let c = a.client_config();
        assert_eq!(c.acquire_timeout, Duration::from_secs(5));
        assert_eq!(c.retransmit.initial, Duration::from_millis(500));
        assert_eq!(c.retransmit.max_interval, Duration::from_secs(2));
        assert_eq!(c.expired_lease, ExpiredLeasePolicy::Discover);
        assert_eq!(c.route_policy.max_routes, 3);
        // Unset flags keep the engine's defaults.
        let engine = xdhcp_engine::ClientConfig::default().retransmit;
        assert_eq!(c.retransmit.nak_backoff_initial, engine.nak_backoff_initial);
        assert_eq!(c.retransmit.nak_backoff_max, engine.nak_backoff_max);
        assert!(Cli::try_parse_from(["xdhcp", "agent", "--acquire-timeout", "soon"]).is_err());
    }

    #[test]
    fn lease_table() {
        let rows = vec![LeaseView {
            container_id: "0123456789abcdef".into(),
            ifname: "eth0".into(),
            pod: Some("default/web".into()),
            network: "net1".into(),
            workload: "pod".into(),
            mac: "02:00:00:00:00:01".into(),
            address: Some(Ipv4Cidr::parse("192.0.2.10/24").unwrap()),
            family: "ipv4".into(),
            address6: None,
            server: Some("192.0.2.1".parse().unwrap()),
            state: "Bound".into(),
            path: "tc".into(),
            expires_unix_ms: Some(10_000 + 125_000),
            pod_uid: None,
            nad: None,
        }];
        let t = render_leases(&rows, 10_000);
        let mut lines = t.lines();
        let head = lines.next().unwrap();
        assert!(
            head.starts_with("POD") && head.contains("EXPIRES IN"),
            "{t}"
        );
        let row = lines.next().unwrap();
        for want in [
            "default/web",
            "eth0",
            "ipv4",
            "192.0.2.10/24",
            "192.0.2.1",
            "Bound",
            "2m05s",
        ] {
            assert!(row.contains(want), "{want} missing in {row}");
        }
        // An IPv6 lease: its family and its address (a /128 without a
        // prefix length from the network).
        let v6 = LeaseView {
            family: "ipv6".into(),
            address: None,
            address6: Some(crate::cni::types::Ipv6Cidr::parse("2001:db8::5/128").unwrap()),
            server: None,
            ..rows[0].clone()
        };
        let t = render_leases(&[v6], 10_000);
        let row = t.lines().nth(1).unwrap();
        assert!(
            row.contains("ipv6") && row.contains("2001:db8::5/128"),
            "{row}"
        );
        assert!(render_leases(&[], 0).contains("(no leases)"));
        assert_eq!(human_remaining(5, 10), "expired");
        assert_eq!(human_remaining(7_200_000, 0), "2h00m");
    }
}
