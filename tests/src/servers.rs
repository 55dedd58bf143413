//! DHCP server guards: dnsmasq, ISC Kea and ISC dhcpd, each started inside a
//! test namespace with a fully explicit configuration, its lease database and
//! log in a private temporary directory, and killed on drop.
//!
//! When a test panics, the guard's drop prints the tail of the server log to
//! stderr so the failure can be diagnosed from the test output.

use std::fmt::Write as _;
use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::netns::{NetNs, netns_exec, parse_mac};
use crate::program;

/// How long servers get to come up.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// A child process that is terminated (SIGTERM, then SIGKILL) on drop.
#[derive(Debug)]
pub struct Process {
    child: Option<Child>,
    what: String,
}

impl Process {
    /// Spawns `cmd` (stdin from /dev/null); panics if it cannot start.
    #[track_caller]
    pub fn spawn(what: &str, mut cmd: Command) -> Self {
        let child = cmd
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what} ({cmd:?}): {e} (is it installed?)"));
        Self {
            child: Some(child),
            what: what.to_owned(),
        }
    }

    /// Spawns `cmd` with stdout and stderr appended to `log`.
    #[track_caller]
    pub fn spawn_logged(what: &str, mut cmd: Command, log: &Path) -> Self {
        let file = File::options()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("open {}: {e}", log.display()));
        let err = file.try_clone().expect("dup log fd");
        cmd.stdout(file).stderr(err);
        Self::spawn(what, cmd)
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// True if the process has not exited.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Sends `sig` to the process (no-op once it is reaped).
    pub fn signal(&self, sig: Signal) {
        if let Some(child) = &self.child {
            let _ = kill(Pid::from_raw(child.id() as i32), sig);
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL; returns true if it exited on SIGTERM.
    pub fn stop(&mut self, grace: Duration) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    /// What this process is (for messages).
    pub fn what(&self) -> &str {
        &self.what
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(2));
    }
}

/// Reads a file to a string; missing file → empty.
fn read_lossy(path: &Path) -> String {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// How long a test waits for an agent it started to report itself ready.
///
/// Generous on purpose: in the 6.1 guest, which qemu emulates in software,
/// one start-up (exec of the binary, the verifier's load of the programs,
/// reading Open vSwitch) has taken 30 s on a busy host. The waits end as soon
/// as the agent is ready, or has stopped, so a healthy run never pays it.
pub const AGENT_READY_WITHIN: Duration = Duration::from_mins(2);

/// Polls `cond` every 20 ms until it is true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[expect(
    clippy::print_stderr,
    reason = "test harness: show the server log when a test fails"
)]
fn dump_log_on_panic(what: &str, log: &Path) {
    if std::thread::panicking() {
        let text = read_lossy(log);
        let tail: Vec<&str> = text.lines().rev().take(60).collect();
        eprintln!("---- last lines of {what} log {} ----", log.display());
        for line in tail.iter().rev() {
            eprintln!("{line}");
        }
        eprintln!("---- end of {what} log ----");
    }
}

/// One lease as seen by a server's lease database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerLease {
    /// Leased address.
    pub ip: Ipv4Addr,
    /// Client hardware address.
    pub mac: [u8; 6],
    /// Client identifier as the server prints it (hex with colons), if any.
    pub client_id: Option<String>,
    /// Hostname, if the client sent one.
    pub hostname: Option<String>,
    /// Expiry as UNIX seconds (0 = infinite for dnsmasq).
    pub expires_unix: u64,
}

// ---------------------------------------------------------------- dnsmasq

/// dnsmasq configuration for [`Dnsmasq::start`]. Every field becomes an
/// explicit command-line flag; no config file is read.
#[derive(Debug, Clone)]
pub struct DnsmasqConfig {
    /// Interface to serve (in the server namespace).
    pub interface: String,
    /// First and last address of the dynamic range.
    pub range: (Ipv4Addr, Ipv4Addr),
    /// Netmask sent to clients.
    pub netmask: Ipv4Addr,
    /// Lease time in seconds (dnsmasq enforces a minimum of 120).
    pub lease_secs: u32,
    /// Option 58 (T1) in seconds, for quick renewals.
    pub t1_secs: Option<u32>,
    /// Option 59 (T2) in seconds.
    pub t2_secs: Option<u32>,
    /// `--no-ping` (skip the ~3 s ICMP probe per new address).
    pub no_ping: bool,
    /// `--dhcp-authoritative` (NAK unknown leases at once).
    pub authoritative: bool,
    /// Option 3; `None` sends no router option.
    pub router: Option<Ipv4Addr>,
    /// Option 6.
    pub dns: Vec<Ipv4Addr>,
    /// Option 15.
    pub domain: Option<String>,
    /// Extra raw flags appended last (e.g. `--dhcp-option=121,...`).
    pub extra_args: Vec<String>,
    /// Keep the lease file and log on tmpfs (`/dev/shm`). dnsmasq fsyncs its
    /// lease file on every change, which on a disk dominates DORA latency;
    /// benchmarks that measure the client want this.
    pub on_tmpfs: bool,
}

impl Default for DnsmasqConfig {
    fn default() -> Self {
        Self {
            interface: crate::netns::Lab::BRIDGE.to_owned(),
            range: (Ipv4Addr::new(192, 0, 2, 10), Ipv4Addr::new(192, 0, 2, 250)),
            netmask: Ipv4Addr::new(255, 255, 255, 0),
            lease_secs: 120,
            t1_secs: None,
            t2_secs: None,
            no_ping: true,
            authoritative: true,
            router: Some(Ipv4Addr::new(192, 0, 2, 1)),
            dns: vec![Ipv4Addr::new(192, 0, 2, 53)],
            domain: None,
            extra_args: Vec::new(),
            on_tmpfs: false,
        }
    }
}

impl DnsmasqConfig {
    /// The default configuration with T1 `t1_secs` and T2 100 s: the lease
    /// renews every `t1_secs` and never rebinds in a test's time.
    pub fn renewing_every(t1_secs: u32) -> Self {
        Self {
            t1_secs: Some(t1_secs),
            t2_secs: Some(100),
            ..Self::default()
        }
    }
}

/// A dnsmasq DHCP server (DNS disabled) running in a namespace.
#[derive(Debug)]
pub struct Dnsmasq {
    process: Process,
    ns_name: String,
    dir: tempfile::TempDir,
    config: DnsmasqConfig,
}

/// The address of the tests' rogue DHCP server ([`Dnsmasq::rogue`]).
pub const ROGUE_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);

impl Dnsmasq {
    /// A rogue DHCP server: a real dnsmasq in `ns` on `ifname`, which gets
    /// [`ROGUE_IP`]/24, serving 198.51.100.10–50 of its own with no DNS
    /// server and `router` as the router.
    #[track_caller]
    pub fn rogue(ns: &NetNs, ifname: &str, router: Option<Ipv4Addr>) -> Self {
        ns.add_addr(ifname, ROGUE_IP, 24);
        Self::start(
            ns,
            DnsmasqConfig {
                interface: ifname.to_owned(),
                range: (
                    Ipv4Addr::new(198, 51, 100, 10),
                    Ipv4Addr::new(198, 51, 100, 50),
                ),
                router,
                dns: Vec::new(),
                ..DnsmasqConfig::default()
            },
        )
    }

    /// Starts dnsmasq in `ns` and waits until its DHCP service is up.
    #[track_caller]
    pub fn start(ns: &NetNs, config: DnsmasqConfig) -> Self {
        let mut builder = tempfile::Builder::new();
        builder.prefix("xdt-dnsmasq-");
        let dir = if config.on_tmpfs {
            builder.tempdir_in("/dev/shm")
        } else {
            builder.tempdir()
        }
        .expect("tempdir");
        let process = Self::spawn(ns.name(), dir.path(), &config);
        let mut server = Self {
            process,
            ns_name: ns.name().to_owned(),
            dir,
            config,
        };
        server.wait_ready();
        server
    }

    /// Path of the lease file.
    pub fn lease_file(&self) -> PathBuf {
        self.dir.path().join("dnsmasq.leases")
    }

    /// Path of the log file.
    pub fn log_file(&self) -> PathBuf {
        self.dir.path().join("dnsmasq.log")
    }

    /// The configuration it was started with.
    pub fn config(&self) -> &DnsmasqConfig {
        &self.config
    }

    fn args(dir: &Path, c: &DnsmasqConfig) -> Vec<String> {
        let mut args = vec![
            "--no-daemon".to_owned(),
            "--conf-file=/dev/null".to_owned(),
            "--port=0".to_owned(),
            "--user=root".to_owned(),
            "--group=root".to_owned(),
            format!("--pid-file={}", dir.join("dnsmasq.pid").display()),
            format!("--interface={}", c.interface),
            "--bind-interfaces".to_owned(),
            "--except-interface=lo".to_owned(),
            format!(
                "--dhcp-range={},{},{},{}",
                c.range.0, c.range.1, c.netmask, c.lease_secs
            ),
            format!("--dhcp-leasefile={}", dir.join("dnsmasq.leases").display()),
            "--log-dhcp".to_owned(),
            format!("--log-facility={}", dir.join("dnsmasq.log").display()),
        ];
        if c.no_ping {
            args.push("--no-ping".to_owned());
        }
        if c.authoritative {
            args.push("--dhcp-authoritative".to_owned());
        }
        match c.router {
            Some(r) => args.push(format!("--dhcp-option=option:router,{r}")),
            None => args.push("--dhcp-option=option:router".to_owned()),
        }
        if !c.dns.is_empty() {
            let list: Vec<String> = c.dns.iter().map(ToString::to_string).collect();
            args.push(format!(
                "--dhcp-option=option:dns-server,{}",
                list.join(",")
            ));
        }
        if let Some(d) = &c.domain {
            args.push(format!("--dhcp-option=option:domain-name,{d}"));
        }
        if let Some(t1) = c.t1_secs {
            args.push(format!("--dhcp-option=option:T1,{t1}"));
        }
        if let Some(t2) = c.t2_secs {
            args.push(format!("--dhcp-option=option:T2,{t2}"));
        }
        args.extend(c.extra_args.iter().cloned());
        args
    }

    #[track_caller]
    fn spawn(ns_name: &str, dir: &Path, config: &DnsmasqConfig) -> Process {
        let mut cmd = netns_exec(ns_name, program("dnsmasq"));
        cmd.args(Self::args(dir, config));
        Process::spawn_logged("dnsmasq", cmd, &dir.join("dnsmasq.stderr"))
    }

    /// Waits until the log shows the DHCP range is served; panics with the
    /// log if dnsmasq exits or does not come up.
    #[track_caller]
    pub fn wait_ready(&mut self) {
        let log = self.log_file();
        let ok = wait_until(READY_TIMEOUT, || {
            read_lossy(&log).contains("DHCP, IP range") || !self.process.is_running()
        });
        assert!(
            ok && self.process.is_running(),
            "dnsmasq did not come up in {}: log:\n{}\nstderr:\n{}",
            self.ns_name,
            read_lossy(&log),
            read_lossy(&self.dir.path().join("dnsmasq.stderr"))
        );
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        read_lossy(&self.log_file())
    }

    /// Waits until the log contains `needle`, returns whether it did.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> bool {
        wait_until(timeout, || self.log().contains(needle))
    }

    /// Number of occurrences of `needle` in the log.
    pub fn count_in_log(&self, needle: &str) -> usize {
        self.log().matches(needle).count()
    }

    /// Current leases from the lease file
    /// (`<expiry> <mac> <ip> <hostname|*> <client-id|*>` per line).
    ///
    /// dnsmasq rewrites the file in place after every ACK or RELEASE
    /// (`ftruncate` to 0, then the leases, then an fsync): a read right after
    /// a logged ACK can land in between and find no lease at all, and on a
    /// loaded disk the empty file can last longer than two reads apart. So
    /// the file is read until two reads 10 ms apart agree; an empty file is
    /// only believed once it has stayed empty for 200 ms.
    pub fn leases(&self) -> Vec<ServerLease> {
        let path = self.lease_file();
        let mut text = read_lossy(&path);
        let mut empty_since: Option<std::time::Instant> = None;
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(10));
            let again = read_lossy(&path);
            let settled = again == text;
            text = again;
            if !settled {
                empty_since = None;
                continue;
            }
            if !text.trim().is_empty() {
                break;
            }
            let since = *empty_since.get_or_insert_with(std::time::Instant::now);
            if since.elapsed() >= Duration::from_millis(200) {
                break;
            }
        }
        parse_dnsmasq_leases(&text)
    }

    /// The lease for `mac`, if any.
    pub fn lease_for(&self, mac: [u8; 6]) -> Option<ServerLease> {
        self.leases().into_iter().find(|l| l.mac == mac)
    }

    /// SIGKILL the server (lease file and log are kept).
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Sends `sig` to the server (SIGSTOP holds its answers back in its
    /// socket's queue; SIGCONT lets them go).
    pub fn signal(&self, sig: Signal) {
        self.process.signal(sig);
    }

    /// Stops the server (SIGTERM): the server is down until [`Dnsmasq::restart`].
    pub fn stop(&mut self) {
        self.process.stop(Duration::from_secs(2));
    }

    /// Starts the server again with the same config, lease file and log,
    /// stopping it first as an operator's restart does (SIGTERM, then
    /// SIGKILL after 2 s): dnsmasq rewrites its whole lease file in place
    /// at every change, so a SIGKILL landing mid-rewrite loses leases — a
    /// server losing its database, not a restart.
    #[track_caller]
    pub fn restart(&mut self) {
        self.process.stop(Duration::from_secs(2));
        // The ready line is already in the log; wait for one more. Counted
        // before the spawn: a server quick to start would otherwise have
        // written its line before the count, and the wait never end.
        let before = self.count_in_log("DHCP, IP range");
        self.process = Self::spawn(&self.ns_name, self.dir.path(), &self.config);
        let log = self.log_file();
        let ok = wait_until(READY_TIMEOUT, || {
            read_lossy(&log).matches("DHCP, IP range").count() > before
                || !self.process.is_running()
        });
        assert!(
            ok && self.process.is_running(),
            "dnsmasq restart failed:\n{}",
            self.log()
        );
    }

    /// Restart with an empty lease file: the server forgets every lease.
    #[track_caller]
    pub fn restart_forgetting_leases(&mut self) {
        self.process.kill();
        std::fs::write(self.lease_file(), b"").expect("truncate dnsmasq lease file");
        self.restart();
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        dump_log_on_panic("dnsmasq", &self.log_file());
    }
}

/// Parses a dnsmasq lease file.
pub fn parse_dnsmasq_leases(text: &str) -> Vec<ServerLease> {
    let mut leases = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [expiry, mac, ip, host, client_id, ..] = fields[..] else {
            continue;
        };
        let (Ok(expires_unix), Some(mac), Ok(ip)) = (expiry.parse(), parse_mac(mac), ip.parse())
        else {
            continue;
        };
        let opt = |s: &str| (s != "*").then(|| s.to_owned());
        leases.push(ServerLease {
            ip,
            mac,
            client_id: opt(client_id),
            hostname: opt(host),
            expires_unix,
        });
    }
    leases
}

/// A DHCPv6 server's own address `addr` (no DAD) on `ifname` of `ns`
/// (already there is fine: a second server in the same namespace).
///
/// Returns once the interface's own link-local address is usable, or after
/// 3 s: while it is tentative (duplicate address detection, 1–2 s after
/// the link came up) the kernel answers a client's link-local address from
/// the global one, and the server's REPLYs would come from one source
/// first and another later, as no settled server's do (guest learning
/// checks where they come from).
fn give_server_address6(ns: &NetNs, ifname: &str, addr: &str) {
    ns.ip(&["-6", "addr", "replace", addr, "dev", ifname, "nodad"]);
    crate::wait_until(std::time::Duration::from_secs(3), || {
        ns.ip(&[
            "-6",
            "-o",
            "addr",
            "show",
            "dev",
            ifname,
            "scope",
            "link",
            "tentative",
        ])
        .trim()
        .is_empty()
    });
}

/// dnsmasq serving DHCPv6 only, on the lab's server interface.
pub struct Dnsmasq6 {
    process: Process,
    dir: tempfile::TempDir,
}

impl Dnsmasq6 {
    /// Serves `fd00:6::100`–`1ff` (300 s leases, DNS `fd00:6::53`) on
    /// [`Lab::SERVER_IF`](crate::Lab::SERVER_IF) of `ns`, given
    /// `fd00:6::1/64`; returns once it serves.
    pub fn start(ns: &NetNs) -> Self {
        Self::start_with(ns, &[])
    }

    /// [`Dnsmasq6::start`] with `extra` arguments (`--enable-ra`: router
    /// advertisements of the range's /64, managed, with itself as the
    /// default router).
    pub fn start_with(ns: &NetNs, extra: &[&str]) -> Self {
        Self::start_on(
            ns,
            crate::Lab::SERVER_IF,
            "fd00:6::1/64",
            "fd00:6::100,fd00:6::1ff",
            extra,
        )
    }

    /// dnsmasq serving DHCPv6 on `ifname` of `ns`, given address `addr`
    /// (with its prefix length), leasing `range` (`first,last` of that
    /// /64), with `extra` arguments; returns once it serves. A rogue server
    /// in a pod is one.
    pub fn start_on(ns: &NetNs, ifname: &str, addr: &str, range: &str, extra: &[&str]) -> Self {
        give_server_address6(ns, ifname, addr);
        let dir = tempfile::Builder::new()
            .prefix("xdt-dnsmasq6-")
            .tempdir()
            .unwrap();
        let mut cmd = netns_exec(ns.name(), program("dnsmasq"));
        cmd.args([
            "--no-daemon",
            "--conf-file=/dev/null",
            "--port=0",
            "--user=root",
            "--group=root",
            "--bind-interfaces",
            "--except-interface=lo",
            "--dhcp-authoritative",
            "--log-dhcp",
        ])
        .arg(format!("--interface={ifname}"))
        .arg(format!("--dhcp-range={range},64,300"))
        .arg("--dhcp-option=option6:dns-server,[fd00:6::53]")
        .args(extra)
        .arg(format!("--pid-file={}", dir.path().join("pid").display()))
        .arg(format!(
            "--dhcp-leasefile={}",
            dir.path().join("leases").display()
        ))
        .arg(format!(
            "--log-facility={}",
            dir.path().join("log").display()
        ));
        let process = Process::spawn_logged("dnsmasq (DHCPv6)", cmd, &dir.path().join("stderr"));
        let me = Self { process, dir };
        assert!(
            wait_until(Duration::from_secs(10), || me.log().contains("DHCPv6")),
            "dnsmasq did not start serving DHCPv6:\n{}\n{}",
            me.log(),
            std::fs::read_to_string(me.dir.path().join("stderr")).unwrap_or_default()
        );
        me
    }

    /// dnsmasq's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// The lease file's address lines (the `duid` line of the server's own
    /// DUID aside).
    pub fn leases(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("leases"))
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.starts_with("duid "))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Dnsmasq6 {
    fn drop(&mut self) {
        self.process.kill();
    }
}

// ---------------------------------------------------------------- Kea

/// Kea DHCPv4 configuration for [`Kea::start`].
#[derive(Debug, Clone)]
pub struct KeaConfig {
    /// Interface to serve.
    pub interface: String,
    /// Subnet in CIDR form.
    pub subnet: String,
    /// Pool first and last address.
    pub pool: (Ipv4Addr, Ipv4Addr),
    /// valid-lifetime in seconds.
    pub valid_lifetime: u32,
    /// renew-timer (T1) in seconds.
    pub renew_timer: u32,
    /// rebind-timer (T2) in seconds.
    pub rebind_timer: u32,
    /// Option 3.
    pub router: Option<Ipv4Addr>,
    /// Option 6.
    pub dns: Vec<Ipv4Addr>,
    /// `authoritative` (NAK requests for unknown leases).
    pub authoritative: bool,
    /// Extra `option-data` entries for the subnet (Kea JSON objects).
    pub extra_option_data: Vec<serde_json::Value>,
}

impl Default for KeaConfig {
    fn default() -> Self {
        Self {
            interface: crate::netns::Lab::BRIDGE.to_owned(),
            subnet: "192.0.2.0/24".to_owned(),
            pool: (Ipv4Addr::new(192, 0, 2, 100), Ipv4Addr::new(192, 0, 2, 250)),
            valid_lifetime: 60,
            renew_timer: 10,
            rebind_timer: 20,
            router: Some(Ipv4Addr::new(192, 0, 2, 1)),
            dns: vec![Ipv4Addr::new(192, 0, 2, 53)],
            authoritative: true,
            extra_option_data: Vec::new(),
        }
    }
}

/// A `kea-dhcp4` server with a memfile lease database in a temp dir.
#[derive(Debug)]
pub struct Kea {
    process: Process,
    ns_name: String,
    dir: tempfile::TempDir,
    config: KeaConfig,
}

impl Kea {
    /// Writes the JSON config, starts `kea-dhcp4` in `ns` and waits until it serves.
    #[track_caller]
    pub fn start(ns: &NetNs, config: KeaConfig) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("xdt-kea-")
            .tempdir()
            .expect("tempdir");
        let json = Self::config_json(dir.path(), &config);
        std::fs::write(
            dir.path().join("kea-dhcp4.json"),
            serde_json::to_vec_pretty(&json).expect("serialize kea config"),
        )
        .expect("write kea config");
        let process = Self::spawn(ns.name(), dir.path());
        let mut server = Self {
            process,
            ns_name: ns.name().to_owned(),
            dir,
            config,
        };
        server.wait_ready(0);
        server
    }

    /// The generated Kea configuration document.
    pub fn config_json(dir: &Path, c: &KeaConfig) -> serde_json::Value {
        let mut options = Vec::new();
        if let Some(r) = c.router {
            options.push(serde_json::json!({"name": "routers", "data": r.to_string()}));
        }
        if !c.dns.is_empty() {
            let list: Vec<String> = c.dns.iter().map(ToString::to_string).collect();
            options
                .push(serde_json::json!({"name": "domain-name-servers", "data": list.join(", ")}));
        }
        options.extend(c.extra_option_data.iter().cloned());
        serde_json::json!({
            "Dhcp4": {
                "interfaces-config": {
                    "interfaces": [c.interface],
                    "dhcp-socket-type": "raw",
                },
                "lease-database": {
                    "type": "memfile",
                    "persist": true,
                    "name": dir.join("kea-leases4.csv"),
                    "lfc-interval": 0,
                },
                "control-socket": {
                    "socket-type": "unix",
                    "socket-name": dir.join("kea4-ctrl.sock"),
                },
                "authoritative": c.authoritative,
                "valid-lifetime": c.valid_lifetime,
                "renew-timer": c.renew_timer,
                "rebind-timer": c.rebind_timer,
                "subnet4": [{
                    "id": 1,
                    "subnet": c.subnet,
                    "pools": [{"pool": format!("{} - {}", c.pool.0, c.pool.1)}],
                    "option-data": options,
                }],
                "loggers": [{
                    "name": "kea-dhcp4",
                    "output_options": [{"output": dir.join("kea.log"), "flush": true}],
                    "severity": "DEBUG",
                    "debuglevel": 50,
                }],
            }
        })
    }

    #[track_caller]
    fn spawn(ns_name: &str, dir: &Path) -> Process {
        let mut cmd = netns_exec(ns_name, program("kea-dhcp4"));
        cmd.arg("-c")
            .arg(dir.join("kea-dhcp4.json"))
            .env("KEA_PIDFILE_DIR", dir)
            .env("KEA_LOCKFILE_DIR", dir)
            .env("KEA_LOGGER_DESTINATION", dir.join("kea.log"));
        Process::spawn_logged("kea-dhcp4", cmd, &dir.join("kea.stderr"))
    }

    /// Waits until the log shows `DHCP4_STARTED` more than `seen` times.
    #[track_caller]
    fn wait_ready(&mut self, seen: usize) {
        let log = self.log_file();
        let ok = wait_until(READY_TIMEOUT, || {
            read_lossy(&log).matches("DHCP4_STARTED").count() > seen || !self.process.is_running()
        });
        assert!(
            ok && self.process.is_running(),
            "kea-dhcp4 did not come up in {}: log:\n{}\nstderr:\n{}",
            self.ns_name,
            read_lossy(&log),
            read_lossy(&self.dir.path().join("kea.stderr"))
        );
    }

    /// Path of the memfile lease CSV.
    pub fn lease_file(&self) -> PathBuf {
        self.dir.path().join("kea-leases4.csv")
    }

    /// Path of the log file.
    pub fn log_file(&self) -> PathBuf {
        self.dir.path().join("kea.log")
    }

    /// The configuration it was started with.
    pub fn config(&self) -> &KeaConfig {
        &self.config
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        read_lossy(&self.log_file())
    }

    /// Waits until the log contains `needle`.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> bool {
        wait_until(timeout, || self.log().contains(needle))
    }

    /// Number of occurrences of `needle` in the log.
    pub fn count_in_log(&self, needle: &str) -> usize {
        self.log().matches(needle).count()
    }

    /// Active leases: the memfile CSV is append-only, so the last row per
    /// address wins; rows with `valid_lifetime` 0 (deleted/released) or a
    /// non-default state (declined, expired-reclaimed) are not active.
    pub fn leases(&self) -> Vec<ServerLease> {
        parse_kea_leases(&read_lossy(&self.lease_file()))
    }

    /// The lease for `mac`, if any.
    pub fn lease_for(&self, mac: [u8; 6]) -> Option<ServerLease> {
        self.leases().into_iter().find(|l| l.mac == mac)
    }

    /// SIGKILL the server.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Stops the server (SIGTERM) until [`Kea::restart`].
    pub fn stop(&mut self) {
        self.process.stop(Duration::from_secs(3));
    }

    /// Starts the server again with the same config and lease file,
    /// stopping it first as an operator's restart does (SIGTERM, then
    /// SIGKILL after 3 s).
    #[track_caller]
    pub fn restart(&mut self) {
        self.process.stop(Duration::from_secs(3));
        let seen = self.count_in_log("DHCP4_STARTED");
        self.process = Self::spawn(&self.ns_name, self.dir.path());
        self.wait_ready(seen);
    }

    /// Restart with an empty lease database: the server forgets every lease.
    #[track_caller]
    pub fn restart_forgetting_leases(&mut self) {
        self.process.kill();
        let _ = std::fs::remove_file(self.lease_file());
        self.restart();
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }
}

impl Drop for Kea {
    fn drop(&mut self) {
        dump_log_on_panic("kea-dhcp4", &self.log_file());
    }
}

/// Folds a Kea memfile lease CSV into the active leases.
///
/// Columns: `address,hwaddr,client_id,valid_lifetime,expire,subnet_id,
/// fqdn_fwd,fqdn_rev,hostname,state,user_context[,pool_id]`.
pub fn parse_kea_leases(text: &str) -> Vec<ServerLease> {
    let mut by_ip: std::collections::BTreeMap<Ipv4Addr, Option<ServerLease>> =
        std::collections::BTreeMap::new();
    for line in text.lines().skip_while(|l| l.starts_with("address")) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 10 {
            continue;
        }
        let Ok(ip) = f[0].parse::<Ipv4Addr>() else {
            continue;
        };
        let valid: u64 = f[3].parse().unwrap_or(0);
        let state: u32 = f[9].parse().unwrap_or(u32::MAX);
        let active = valid != 0 && state == 0;
        let lease = match (active, parse_mac(f[1])) {
            (true, Some(mac)) => Some(ServerLease {
                ip,
                mac,
                client_id: (!f[2].is_empty()).then(|| f[2].to_owned()),
                hostname: (!f[8].is_empty()).then(|| f[8].to_owned()),
                expires_unix: f[4].parse().unwrap_or(0),
            }),
            _ => None,
        };
        by_ip.insert(ip, lease);
    }
    by_ip.into_values().flatten().collect()
}

// ---------------------------------------------------------------- Kea DHCPv6

/// `kea-dhcp6` serving `fd00:6::100`–`1ff` (300 s valid, 150 s preferred)
/// on [`Lab::SERVER_IF`](crate::Lab::SERVER_IF) of a namespace, given
/// `fd00:6::1/64`, its leases in a memfile CSV.
pub struct Kea6 {
    process: Process,
    dir: tempfile::TempDir,
}

/// One IPv6 address lease of a Kea memfile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerLease6 {
    pub address: std::net::Ipv6Addr,
    /// The client's DUID, as Kea writes it (hex, colon-separated).
    pub duid: String,
    pub iaid: u32,
}

/// How a [`Kea6`] serves beyond its defaults.
#[derive(Debug, Clone, Copy, Default)]
pub struct Kea6Options {
    /// The Preference option in every ADVERTISE: 255 tells a client to
    /// request at once instead of collecting ADVERTISEs for its first
    /// retransmission time (RFC 8415 §18.2.1).
    pub preference: Option<u8>,
    /// Answer a SOLICIT that asks for Rapid Commit with a REPLY.
    pub rapid_commit: bool,
    /// Log warnings only (a benchmark's server), not every packet.
    pub quiet: bool,
    /// T1, T2, preferred and valid lifetimes in seconds, instead of 100,
    /// 200, 150 and 300 (a test that waits for a renewal).
    pub timers: Option<[u32; 4]>,
}

impl Kea6 {
    /// Writes the config, starts `kea-dhcp6` in `ns` and waits until it
    /// serves.
    #[track_caller]
    pub fn start(ns: &NetNs) -> Self {
        Self::start_with(ns, Kea6Options::default())
    }

    /// [`Kea6::start`] serving as `opts` says.
    #[track_caller]
    pub fn start_with(ns: &NetNs, opts: Kea6Options) -> Self {
        give_server_address6(ns, crate::Lab::SERVER_IF, "fd00:6::1/64");
        // Kea binds the interface's link-local address, which must be past
        // duplicate address detection by then.
        let ready = wait_until(Duration::from_secs(10), || {
            let shown = ns.ip(&["-6", "addr", "show", "dev", crate::Lab::SERVER_IF]);
            shown.contains("scope link") && !shown.contains("tentative")
        });
        assert!(
            ready,
            "no usable link-local address on the server's interface"
        );
        let dir = tempfile::Builder::new()
            .prefix("xdt-kea6-")
            .tempdir()
            .expect("tempdir");
        let d = dir.path();
        let timers = opts.timers.unwrap_or([100, 200, 150, 300]);
        let mut options = vec![serde_json::json!({ "name": "dns-servers", "data": "fd00:6::53" })];
        if let Some(p) = opts.preference {
            // Not in a client's Option Request: sent only when always sent.
            options.push(
                serde_json::json!({ "name": "preference", "data": p.to_string(), "always-send": true }),
            );
        }
        let json = serde_json::json!({
            "Dhcp6": {
                "interfaces-config": { "interfaces": [crate::Lab::SERVER_IF] },
                // Its DUID not written to /var/lib/kea: nothing outside the
                // test's directory.
                "server-id": {
                    "type": "EN", "enterprise-id": 2495,
                    "identifier": "786468637036", "persist": false,
                },
                "data-directory": d,
                "lease-database": {
                    "type": "memfile", "persist": true,
                    "name": d.join("kea-leases6.csv"), "lfc-interval": 0,
                },
                "preferred-lifetime": timers[2],
                "valid-lifetime": timers[3],
                "renew-timer": timers[0],
                "rebind-timer": timers[1],
                "subnet6": [{
                    "id": 1,
                    "subnet": "fd00:6::/64",
                    "interface": crate::Lab::SERVER_IF,
                    "pools": [{ "pool": "fd00:6::100 - fd00:6::1ff" }],
                    "option-data": options,
                    "rapid-commit": opts.rapid_commit,
                }],
                "loggers": [{
                    "name": "kea-dhcp6",
                    "output_options": [{ "output": d.join("kea.log"), "flush": true }],
                    "severity": if opts.quiet { "INFO" } else { "DEBUG" },
                    "debuglevel": if opts.quiet { 0 } else { 50 },
                }],
            }
        });
        std::fs::write(
            d.join("kea-dhcp6.json"),
            serde_json::to_vec_pretty(&json).expect("serialize kea config"),
        )
        .expect("write kea config");
        let mut cmd = netns_exec(ns.name(), program("kea-dhcp6"));
        cmd.arg("-c")
            .arg(d.join("kea-dhcp6.json"))
            .env("KEA_PIDFILE_DIR", d)
            .env("KEA_LOCKFILE_DIR", d)
            .env("KEA_LOGGER_DESTINATION", d.join("kea.log"));
        let process = Process::spawn_logged("kea-dhcp6", cmd, &d.join("kea.stderr"));
        let mut me = Self { process, dir };
        let ok = wait_until(READY_TIMEOUT, || {
            me.log().contains("DHCP6_STARTED") || !me.process.is_running()
        });
        assert!(
            ok && me.process.is_running(),
            "kea-dhcp6 did not come up in {}: log:\n{}\nstderr:\n{}",
            ns.name(),
            me.log(),
            read_lossy(&me.dir.path().join("kea.stderr"))
        );
        me
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        read_lossy(&self.dir.path().join("kea.log"))
    }

    /// The address leases the memfile holds now (the last line of each
    /// address wins; a released or expired one is not held).
    pub fn leases(&self) -> Vec<ServerLease6> {
        parse_kea6_leases(&read_lossy(&self.dir.path().join("kea-leases6.csv")))
    }
}

impl Drop for Kea6 {
    fn drop(&mut self) {
        dump_log_on_panic("kea-dhcp6", &self.dir.path().join("kea.log"));
        self.process.kill();
    }
}

/// Kea's DHCPv6 memfile (`address,duid,valid_lifetime,expire,subnet_id,
/// pref_lifetime,lease_type,iaid,prefix_len,…,state,…`): the address
/// leases held, the last line of each address winning; a line with valid
/// lifetime 0 or a state other than 0 (declined, expired-reclaimed) is a
/// lease not held.
pub fn parse_kea6_leases(text: &str) -> Vec<ServerLease6> {
    let mut by_addr: std::collections::BTreeMap<std::net::Ipv6Addr, Option<ServerLease6>> =
        std::collections::BTreeMap::new();
    for line in text.lines().skip_while(|l| l.starts_with("address")) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 14 {
            continue;
        }
        let Ok(address) = f[0].parse::<std::net::Ipv6Addr>() else {
            continue;
        };
        let valid: u64 = f[2].parse().unwrap_or(0);
        let state: u32 = f[13].parse().unwrap_or(u32::MAX);
        let held = valid != 0 && state == 0 && f[6] == "0";
        by_addr.insert(
            address,
            held.then(|| ServerLease6 {
                address,
                duid: f[1].to_owned(),
                iaid: f[7].parse().unwrap_or(0),
            }),
        );
    }
    by_addr.into_values().flatten().collect()
}

// ---------------------------------------------------------------- ISC dhcpd

/// ISC dhcpd configuration for [`Dhcpd::start`].
#[derive(Debug, Clone)]
pub struct DhcpdConfig {
    /// Interface to serve.
    pub interface: String,
    /// Subnet address and netmask.
    pub subnet: (Ipv4Addr, Ipv4Addr),
    /// Range first and last address.
    pub range: (Ipv4Addr, Ipv4Addr),
    /// default-lease-time / max-lease-time in seconds.
    pub lease_secs: u32,
    /// Option 3.
    pub router: Option<Ipv4Addr>,
    /// `authoritative;`
    pub authoritative: bool,
    /// Extra statements placed inside the subnet block.
    pub extra: String,
}

impl Default for DhcpdConfig {
    fn default() -> Self {
        Self {
            interface: crate::netns::Lab::BRIDGE.to_owned(),
            subnet: (Ipv4Addr::new(192, 0, 2, 0), Ipv4Addr::new(255, 255, 255, 0)),
            range: (Ipv4Addr::new(192, 0, 2, 100), Ipv4Addr::new(192, 0, 2, 250)),
            lease_secs: 60,
            router: Some(Ipv4Addr::new(192, 0, 2, 1)),
            authoritative: true,
            extra: String::new(),
        }
    }
}

/// An ISC `dhcpd` in the foreground, config/leases/pid in a temp dir.
#[derive(Debug)]
pub struct Dhcpd {
    process: Process,
    dir: tempfile::TempDir,
}

impl Dhcpd {
    /// Writes `dhcpd.conf`, starts `dhcpd -4 -f -d` in `ns` and waits until it serves.
    #[track_caller]
    pub fn start(ns: &NetNs, config: &DhcpdConfig) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("xdt-dhcpd-")
            .tempdir()
            .expect("tempdir");
        let mut conf = String::new();
        let c = config;
        let _ = writeln!(
            conf,
            "default-lease-time {};\nmax-lease-time {};",
            c.lease_secs, c.lease_secs
        );
        if c.authoritative {
            conf.push_str("authoritative;\n");
        }
        let _ = writeln!(conf, "subnet {} netmask {} {{", c.subnet.0, c.subnet.1);
        let _ = writeln!(conf, "  range {} {};", c.range.0, c.range.1);
        if let Some(r) = c.router {
            let _ = writeln!(conf, "  option routers {r};");
        }
        let _ = writeln!(conf, "  {}\n}}", c.extra);
        std::fs::write(dir.path().join("dhcpd.conf"), conf).expect("write dhcpd.conf");
        std::fs::write(dir.path().join("dhcpd.leases"), b"").expect("create dhcpd.leases");
        let mut cmd = netns_exec(ns.name(), program("dhcpd"));
        cmd.args(["-4", "-f", "-d", "-cf"])
            .arg(dir.path().join("dhcpd.conf"))
            .arg("-lf")
            .arg(dir.path().join("dhcpd.leases"))
            .arg("-pf")
            .arg(dir.path().join("dhcpd.pid"))
            .arg(&c.interface);
        let mut process = Process::spawn_logged("dhcpd", cmd, &dir.path().join("dhcpd.log"));
        let log = dir.path().join("dhcpd.log");
        let ok = wait_until(READY_TIMEOUT, || {
            read_lossy(&log).contains("Sending on") || !process.is_running()
        });
        assert!(
            ok && process.is_running(),
            "dhcpd did not come up in {}:\n{}",
            ns.name(),
            read_lossy(&log)
        );
        Self { process, dir }
    }

    /// Path of the log file (dhcpd's stderr).
    pub fn log_file(&self) -> PathBuf {
        self.dir.path().join("dhcpd.log")
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        read_lossy(&self.log_file())
    }

    /// Waits until the log contains `needle`.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> bool {
        wait_until(timeout, || self.log().contains(needle))
    }

    /// Active leases from `dhcpd.leases` (last block per address wins;
    /// `binding state active` only).
    pub fn leases(&self) -> Vec<ServerLease> {
        parse_dhcpd_leases(&read_lossy(&self.dir.path().join("dhcpd.leases")))
    }

    /// Stops the server.
    pub fn stop(&mut self) {
        self.process.stop(Duration::from_secs(2));
    }
}

impl Drop for Dhcpd {
    fn drop(&mut self) {
        dump_log_on_panic("dhcpd", &self.log_file());
    }
}

/// A dhcpd lease block being read: address, active, MAC, hostname.
type DhcpdBlock = (Ipv4Addr, bool, Option<[u8; 6]>, Option<String>);

/// Parses `lease a.b.c.d { ... }` blocks of a dhcpd lease file.
pub fn parse_dhcpd_leases(text: &str) -> Vec<ServerLease> {
    let mut by_ip: std::collections::BTreeMap<Ipv4Addr, Option<ServerLease>> =
        std::collections::BTreeMap::new();
    let mut current: Option<DhcpdBlock> = None;
    for raw in text.lines() {
        let line = raw.trim().trim_end_matches(';');
        if let Some(rest) = line.strip_prefix("lease ") {
            current = rest
                .trim_end_matches('{')
                .trim()
                .parse()
                .ok()
                .map(|ip| (ip, false, None, None));
        } else if line == "}" {
            if let Some((ip, active, mac, host)) = current.take() {
                let lease = match (active, mac) {
                    (true, Some(mac)) => Some(ServerLease {
                        ip,
                        mac,
                        client_id: None,
                        hostname: host,
                        expires_unix: 0,
                    }),
                    _ => None,
                };
                by_ip.insert(ip, lease);
            }
        } else if let Some(cur) = current.as_mut() {
            if line == "binding state active" {
                cur.1 = true;
            } else if let Some(mac) = line.strip_prefix("hardware ethernet ") {
                cur.2 = parse_mac(mac.trim());
            } else if let Some(h) = line.strip_prefix("client-hostname ") {
                cur.3 = Some(h.trim_matches('"').to_owned());
            }
        }
    }
    by_ip.into_values().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dnsmasq_lease_file_parses() {
        let text = "1700000000 02:00:00:00:00:01 192.0.2.10 pod-a 01:02:00:00:00:00:01\n\
                    0 02:00:00:00:00:02 192.0.2.11 * *\n\
                    garbage line\n";
        let leases = parse_dnsmasq_leases(text);
        assert_eq!(leases.len(), 2);
        assert_eq!(leases[0].ip, Ipv4Addr::new(192, 0, 2, 10));
        assert_eq!(leases[0].hostname.as_deref(), Some("pod-a"));
        assert_eq!(leases[1].client_id, None);
        assert_eq!(leases[1].mac, [2, 0, 0, 0, 0, 2]);
    }

    #[test]
    fn kea_memfile_folds_to_last_row_and_drops_released() {
        let text = "address,hwaddr,client_id,valid_lifetime,expire,subnet_id,fqdn_fwd,fqdn_rev,hostname,state,user_context,pool_id\n\
                    192.0.2.100,02:00:00:00:00:01,01:02:00:00:00:00:01,60,1700000060,1,0,0,,0,,0\n\
                    192.0.2.101,02:00:00:00:00:02,,60,1700000060,1,0,0,h,0,,0\n\
                    192.0.2.100,02:00:00:00:00:01,01:02:00:00:00:00:01,0,0,1,0,0,,0,,0\n\
                    192.0.2.102,02:00:00:00:00:03,,60,1700000060,1,0,0,,1,,0\n";
        let leases = parse_kea_leases(text);
        assert_eq!(leases.len(), 1, "{leases:?}");
        assert_eq!(leases[0].ip, Ipv4Addr::new(192, 0, 2, 101));
        assert_eq!(leases[0].hostname.as_deref(), Some("h"));
    }

    #[test]
    fn dhcpd_lease_blocks_parse() {
        let text = "lease 192.0.2.100 {\n  starts 1 2026/01/01 00:00:00;\n  binding state active;\n  hardware ethernet 02:00:00:00:00:01;\n  client-hostname \"pod\";\n}\n\
                    lease 192.0.2.101 {\n  binding state free;\n  hardware ethernet 02:00:00:00:00:02;\n}\n";
        let leases = parse_dhcpd_leases(text);
        assert_eq!(leases.len(), 1);
        assert_eq!(leases[0].hostname.as_deref(), Some("pod"));
    }
}
