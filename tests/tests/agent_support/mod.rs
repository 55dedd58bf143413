//! Shared by the CNI and restart tests: the `xdhcp` binary, an agent process
//! guard, a `CNI_PATH` directory, and plugin invocation.

#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

pub use xdhcp_tests::PluginOutput;
use xdhcp_tests::{NetNs, OvnLab, PluginCall, Process, wait_until};

/// The `xdhcp` (full agent) binary of this workspace, built once per test
/// binary; or `$XDHCP_BIN` when set (the VM tier runs test binaries in a
/// guest that sees the build tree read-only, so it builds the binary
/// beforehand).
pub fn xdhcp_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("XDHCP_BIN") {
            return PathBuf::from(bin);
        }
        build_bin("xdhcp", "xdhcp")
    })
    .clone()
}

/// The thin plugin binary (`xdhcp-plugin`, installed as `dhcp` and
/// `xdhcp`), built once per test binary; or `$XDHCP_PLUGIN_BIN` when set.
pub fn plugin_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("XDHCP_PLUGIN_BIN") {
            return PathBuf::from(bin);
        }
        build_bin("xdhcp-plugin", "xdhcp-plugin")
    })
    .clone()
}

/// The plain binary `name` of `package`, as `cargo test` builds it for the
/// package's own integration tests: same package selection and feature set
/// as the rest of the test build (`TEST_BUILD_PACKAGES`, with which the
/// agent carries its `test-hooks`, as the fault tests need), so nothing is
/// compiled twice (a `cargo build -p` here would resolve features for one
/// package and rebuild most of the tree). Fresh after `cargo xtask test`'s
/// `cargo test`; otherwise this builds it.
fn build_bin(package: &str, name: &str) -> PathBuf {
    let mut cargo = Command::new(env!("CARGO"));
    // What cargo set for this test process (its package's name, manifest
    // directory, OUT_DIR…) is not the outer build's environment: build
    // scripts that watch those variables (ring's) would rerun and the outer
    // and inner builds would rebuild each other's artifacts.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if xdhcp_testbed::programs::is_cargo_target_env(&key) {
            cargo.env_remove(&*key);
        }
    }
    let out = cargo
        .arg("test")
        .args(xdhcp_testbed::TEST_BUILD_PACKAGES)
        .args(["--no-run", "--message-format=json-render-diagnostics"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run cargo test --no-run for the xdhcp binaries");
    assert!(out.status.success(), "building the {name} binary failed");
    let wanted = format!("#{package}@");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|m| {
            m["reason"] == "compiler-artifact"
                && m["package_id"]
                    .as_str()
                    .is_some_and(|p| p.contains(&wanted))
                && m["target"]["name"] == name
                && m["target"]["kind"][0] == "bin"
                && m["profile"]["test"] == false
        })
        .and_then(|m| m["executable"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| panic!("cargo test --no-run built no plain {name} binary of {package}"))
}

/// A `CNI_PATH` directory laid out as installed: the thin plugin binary as
/// `xdhcp` and `dhcp`, the agent binary beside them as `xdhcp-agent` (what
/// `dhcp daemon` hands over to), Debian's `bridge` and `macvlan`.
pub struct CniPath {
    pub dir: tempfile::TempDir,
}

impl CniPath {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("xdt-cni-")
            .tempdir()
            .unwrap();
        let bin = plugin_bin();
        std::os::unix::fs::symlink(&bin, dir.path().join("xdhcp")).unwrap();
        std::os::unix::fs::symlink(&bin, dir.path().join("dhcp")).unwrap();
        std::os::unix::fs::symlink(
            xdhcp_bin(),
            dir.path().join(xdhcp_plugin::invocation::AGENT_NAME),
        )
        .unwrap();
        for p in ["bridge", "macvlan"] {
            let src = xdhcp_tests::program(&format!("cni/{p}"));
            std::os::unix::fs::symlink(src, dir.path().join(p)).unwrap();
        }
        Self { dir }
    }

    pub fn plugin(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The xdhcp plugin as a runtime runs it for lab pod `c`: `cmd` for
    /// container `id` on its interface, with network configuration `conf`.
    pub fn xdhcp(
        &self,
        cmd: &str,
        id: &str,
        c: &xdhcp_tests::LabClient,
        conf: &str,
    ) -> PluginOutput {
        invoke(
            &self.plugin("xdhcp"),
            None,
            cmd,
            id,
            Some(c.ns.path()),
            &c.ifname,
            self.dir.path(),
            conf,
        )
    }
}

/// An `xdhcp agent` process in embedded mode with its own socket and state.
pub struct AgentProcess {
    pub process: Process,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub log: PathBuf,
    extra: Vec<String>,
    /// A bpffs of the test's own on the agent's `--bpffs-dir`, when asked
    /// for: unmounted after the process stops (which releases every pin).
    bpffs: Option<BpffsMount>,
    _dir: Option<tempfile::TempDir>,
}

/// A private bpffs mounted on `path`, unmounted (lazily) on drop.
pub struct BpffsMount {
    pub path: PathBuf,
}

impl BpffsMount {
    pub fn new(path: &Path) -> Self {
        std::fs::create_dir_all(path).expect("the bpffs mount point");
        nix::mount::mount(
            Some("bpf"),
            path,
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .expect("mount -t bpf (needs root)");
        Self {
            path: path.to_path_buf(),
        }
    }
}

impl Drop for BpffsMount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH);
    }
}

impl AgentProcess {
    pub fn start(extra: &[&str]) -> Self {
        Self::start_with(extra, false, &[])
    }

    /// [`AgentProcess::start`] with `env` set for this first process only
    /// (a restart starts without it).
    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_with(extra, false, env)
    }

    /// [`AgentProcess::start`] with a bpffs of the test's own mounted on
    /// its `--bpffs-dir`, so the agent pins its maps and links there: see
    /// [`AgentProcess::pin_dir`].
    pub fn start_pinned(extra: &[&str]) -> Self {
        Self::start_with(extra, true, &[])
    }

    /// Where the agent pins (a bpffs only when started pinned).
    pub fn pin_dir(&self) -> PathBuf {
        self.state_dir
            .parent()
            .expect("the state dir is in the test's directory")
            .join("bpffs")
    }

    fn start_with(extra: &[&str], pinned: bool, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("xdt-agent-")
            .tempdir()
            .unwrap();
        // The agent's `--bpffs-dir` is `<dir>/bpffs`.
        let bpffs = pinned.then(|| BpffsMount::new(&dir.path().join("bpffs")));
        let socket = dir.path().join("run/xdhcp.sock");
        let state_dir = dir.path().join("state");
        let log = dir.path().join("agent.log");
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        let process = Self::spawn(&socket, &state_dir, &log, &extra, env);
        let me = Self {
            process,
            socket,
            state_dir,
            log,
            extra,
            bpffs,
            _dir: Some(dir),
        };
        me.wait_ready();
        me
    }

    fn spawn(
        socket: &Path,
        state_dir: &Path,
        log: &Path,
        extra: &[String],
        env: &[(&str, &str)],
    ) -> Process {
        let dir = state_dir
            .parent()
            .expect("the state dir is in the test's directory");
        let mut cmd = xdhcp_tests::agent_command(&xdhcp_bin(), socket, dir);
        cmd.args(extra)
            .env("RUST_LOG", "info,xdhcp=debug")
            .envs(env.iter().copied());
        Process::spawn_logged("xdhcp agent", cmd, log)
    }

    pub fn wait_ready(&self) {
        let ok = wait_until(xdhcp_tests::AGENT_READY_WITHIN, || {
            let out = Command::new(xdhcp_bin())
                .args(["status", "--json", "--socket"])
                .arg(&self.socket)
                .env_remove("CNI_COMMAND")
                .output()
                .expect("run xdhcp status");
            out.status.success()
                && serde_json::from_slice::<serde_json::Value>(&out.stdout)
                    .is_ok_and(|v| v["ready"] == true)
        });
        assert!(ok, "agent not ready:\n{}", self.log());
    }

    /// SIGKILL, then start again on the same socket and state dir.
    pub fn kill_and_restart(&mut self) {
        self.kill_and_restart_after(Duration::ZERO);
    }

    /// SIGKILL, stay down for `down`, then start again on the same socket
    /// and state dir.
    pub fn kill_and_restart_after(&mut self, down: Duration) {
        self.process.kill();
        std::thread::sleep(down);
        self.process = Self::spawn(&self.socket, &self.state_dir, &self.log, &self.extra, &[]);
        self.wait_ready();
    }

    /// SIGKILL, then start again on the same socket and state dir with
    /// `env` set, without waiting for it to be ready.
    pub fn kill_and_start_with_env(&mut self, env: &[(&str, &str)]) {
        self.process.kill();
        self.process = Self::spawn(&self.socket, &self.state_dir, &self.log, &self.extra, env);
    }

    /// Start again on the same socket and state dir, the previous process
    /// stopped or killed already.
    pub fn start_again(&mut self) {
        self.process = Self::spawn(&self.socket, &self.state_dir, &self.log, &self.extra, &[]);
        self.wait_ready();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `xdhcp <cmd> --socket <socket>` output.
    pub fn cli(&self, cmd: &str, json: bool) -> String {
        let mut c = Command::new(xdhcp_bin());
        c.arg(cmd).arg("--socket").arg(&self.socket);
        if json {
            c.arg("--json");
        }
        let out = c.env_remove("CNI_COMMAND").output().expect("run xdhcp cli");
        assert!(
            out.status.success(),
            "xdhcp {cmd} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// The thin plugin alone as a runtime calls an IPAM plugin: `cmd` for
/// container `id` on `eth0` of `pod`, with network configuration `conf`
/// (no `CNI_PATH` it could use: the plugin needs none).
pub fn ipam_only(cmd: &str, id: &str, pod: &NetNs, conf: &str) -> PluginOutput {
    invoke(
        &plugin_bin(),
        None,
        cmd,
        id,
        Some(pod.path()),
        "eth0",
        Path::new("/nonexistent"),
        conf,
    )
}

/// Invoke a CNI plugin, optionally from inside `node` (so main plugins that
/// create bridges and veths work in a test namespace, never on the host).
#[expect(
    clippy::too_many_arguments,
    reason = "mirrors the CNI environment one variable per argument"
)]
pub fn invoke(
    plugin: &Path,
    node: Option<&NetNs>,
    command: &str,
    container_id: &str,
    netns: Option<&Path>,
    ifname: &str,
    cni_path: &Path,
    config: &str,
) -> PluginOutput {
    let cni_args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={container_id}");
    PluginCall {
        plugin,
        node_ns: node.map(NetNs::name),
        command,
        container_id,
        netns,
        ifname,
        cni_path,
        cni_args: &cni_args,
        config,
    }
    .run()
    .unwrap_or_else(|e| panic!("cannot run {}: {e}", plugin.display()))
}

/// `xdhcp agent` on the eBPF datapath, in embedded mode (unless `extra`
/// names `--kube`), running inside a
/// test's node namespace (`ip netns exec`), so the uplinks and ports it
/// attaches to are the test's, never this machine's.
pub struct NodeAgent {
    process: Process,
    pub socket: PathBuf,
    log: PathBuf,
    dir: tempfile::TempDir,
}

impl NodeAgent {
    pub fn start(node: &NetNs, extra: &[&str]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("xdt-agent-")
            .tempdir()
            .unwrap();
        Self::start_in(node, extra, dir)
    }

    /// Stops the agent (SIGTERM) and starts another on its state.
    pub fn restart(self, node: &NetNs, extra: &[&str]) -> Self {
        Self::start_in(node, extra, self.stop())
    }

    /// Stops the agent (SIGTERM) and hands back its directory, state and
    /// log included.
    pub fn stop(self) -> tempfile::TempDir {
        drop(self.process);
        self.dir
    }

    /// Kills the agent (SIGKILL: no clean-up of any kind) and hands back
    /// its directory.
    pub fn kill(mut self) -> tempfile::TempDir {
        self.process.kill();
        self.dir
    }

    /// The agent's directory: its state, log and `--bpffs-dir` (`bpffs`)
    /// are in it.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn start_in(node: &NetNs, extra: &[&str], dir: tempfile::TempDir) -> Self {
        Self::start_in_with(node, extra, &[], dir)
    }

    /// [`NodeAgent::start`] with `env` set for the agent (its test hooks).
    pub fn start_with_env(node: &NetNs, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("xdt-agent-")
            .tempdir()
            .unwrap();
        Self::start_in_with(node, extra, env, dir)
    }

    fn start_in_with(
        node: &NetNs,
        extra: &[&str],
        env: &[(&str, &str)],
        dir: tempfile::TempDir,
    ) -> Self {
        let socket = dir.path().join("run/xdhcp.sock");
        let log = dir.path().join("agent.log");
        let mut cmd = xdhcp_tests::netns_exec(node.name(), &xdhcp_bin());
        cmd.arg("agent");
        // Embedded mode unless the test names another.
        if !extra.contains(&"--kube") {
            cmd.args(["--kube", "off"]);
        }
        cmd.args(["--datapath", "ebpf", "--socket"])
            .arg(&socket)
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--bpffs-dir")
            .arg(dir.path().join("bpffs"))
            .args(extra)
            .env_remove("CNI_COMMAND")
            .env("RUST_LOG", "info,xdhcp=debug")
            .envs(env.iter().copied());
        // Never this machine's Open vSwitch, unless the test names one.
        if !extra.contains(&"--ovsdb") {
            cmd.arg("--ovsdb").arg(dir.path().join("no-ovsdb.sock"));
        }
        let process = Process::spawn_logged("xdhcp agent", cmd, &log);
        let mut me = Self {
            process,
            socket,
            log,
            dir,
        };
        let mut stopped = false;
        let ready = wait_until(xdhcp_tests::AGENT_READY_WITHIN, || {
            stopped = !me.process.is_running();
            stopped
                || me
                    .try_status()
                    .is_some_and(|s| s.ready || s.degraded.is_some())
        });
        assert!(!stopped, "the agent stopped during start-up:\n{}", me.log());
        assert!(ready, "agent not ready:\n{}", me.log());
        me
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn cli(&self, cmd: &str) -> Option<String> {
        let out = Command::new(xdhcp_bin())
            .args([cmd, "--json", "--socket"])
            .arg(&self.socket)
            .env_remove("CNI_COMMAND")
            .output()
            .expect("run the xdhcp cli");
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn try_status(&self) -> Option<xdhcp::rpc::AgentStatus> {
        self.cli("status")
            .and_then(|s| serde_json::from_str(&s).ok())
    }

    pub fn status(&self) -> xdhcp::rpc::AgentStatus {
        self.try_status()
            .unwrap_or_else(|| panic!("xdhcp status failed:\n{}", self.log()))
    }

    pub fn leases(&self) -> Vec<xdhcp::rpc::LeaseView> {
        serde_json::from_str(&self.cli("leases").expect("xdhcp leases")).expect("lease JSON")
    }

    pub fn counter(&self, name: &str) -> u64 {
        self.status().counters.get(name).copied().unwrap_or(0)
    }

    /// Waits until the (first) uplink is attached; fails with `what`.
    pub fn wait_uplink_live(&self, within: Duration, what: &str) {
        assert!(
            wait_until(within, || self.uplink_state() == "live"),
            "{what}: {:?}\n{}",
            self.try_status(),
            self.log()
        );
    }

    /// Waits until the (only) lease expires later than `expiry`: renewed.
    pub fn wait_renewed(&self, expiry: Option<u64>, within: Duration, what: &str) {
        assert!(
            wait_until(within, || self.leases()[0].expires_unix_ms > expiry),
            "{what}: {:?}\n{}",
            self.leases(),
            self.log()
        );
    }

    /// Every lease's expiry as the agent knows it, by MAC.
    pub fn expiries(&self) -> Vec<(String, Option<u64>)> {
        let mut e: Vec<_> = self
            .leases()
            .into_iter()
            .map(|l| (l.mac, l.expires_unix_ms))
            .collect();
        e.sort();
        e
    }

    /// Waits until every lease in `before` (from [`NodeAgent::expiries`])
    /// has renewed (its expiry moved on) and is bound again; fails with
    /// `what`.
    #[track_caller]
    pub fn wait_every_lease_renewed(
        &self,
        before: &[(String, Option<u64>)],
        within: Duration,
        what: &str,
    ) {
        assert!(
            wait_until(within, || {
                let now = self.leases();
                before.iter().all(|(mac, expiry)| {
                    now.iter()
                        .any(|l| &l.mac == mac && l.expires_unix_ms > *expiry && l.state == "Bound")
                })
            }),
            "not every lease renewed {what}: {before:?} -> {:?}\n{}",
            self.leases(),
            self.log()
        );
    }

    /// Waits until the OVS uplink source is in `state` (`connected`,
    /// `unavailable`, ...).
    #[track_caller]
    pub fn wait_ovs_source(&self, state: &str, within: Duration) {
        assert!(
            wait_until(within, || self.try_status().is_some_and(|s| s
                .uplink_source
                .state
                .as_deref()
                == Some(state))),
            "the OVS source is not {state}: {:?}\n{}",
            self.try_status().map(|s| s.uplink_source),
            self.log()
        );
    }

    /// The uplink `ifname` as `xdhcp status` shows it, once it is live.
    pub fn live_uplink(&self, ifname: &str) -> Option<xdhcp::rpc::UplinkStatus> {
        self.try_status()?
            .uplinks
            .into_iter()
            .find(|u| u.ifname == ifname && u.state == "live")
    }

    /// Waits until the uplink `ifname` is live and returns it.
    #[track_caller]
    pub fn wait_live_uplink(&self, ifname: &str, within: Duration) -> xdhcp::rpc::UplinkStatus {
        let mut found = None;
        wait_until(within, || {
            found = self.live_uplink(ifname);
            found.is_some()
        });
        found.unwrap_or_else(|| {
            panic!(
                "{ifname} not live in {within:?}: {:?}\n{}",
                self.try_status(),
                self.log()
            )
        })
    }

    /// A second provider bridge `br-phys2` (port `eth2`, a veth to the
    /// server's `s1`) added to `lab` at run time: unmapped it is no uplink;
    /// mapped as `physnet2` (one OVSDB transaction sent from the test,
    /// [`OvnLab::set_bridge_mappings_now`]) the agent reports it live, and
    /// its program is then on `eth2` as the kernel shows it (at XDP or TC);
    /// its mapping removed, the kernel shows no program (looked at with `ip`
    /// and `tc`, whose start-up is in that figure), and the lab's own uplink
    /// stays. The agent runs with `lab`'s database and its uplink is live.
    /// Returns the two times measured from the transaction's sending: the
    /// callers print them. They are figures, not pass marks (a loaded
    /// machine or an emulated guest stretches them); each wait gives up
    /// after 5 s.
    #[track_caller]
    pub fn check_mapping_added_at_run_time(&self, lab: &mut OvnLab) -> (Duration, Duration) {
        lab.add_provider_bridge("br-phys2", "eth2", "s1");
        let lab = &*lab;
        // The uplink program, at XDP or at TC ingress (the attach mode is
        // the datapath's and the device's: XDP on a veth of a userspace
        // datapath, TC on one of the kernel datapath).
        let attached_on = |ifname: &str| {
            lab.node
                .ip(&["-d", "link", "show", "dev", ifname])
                .contains("prog/xdp")
                || lab
                    .node
                    .exec(&["tc", "filter", "show", "dev", ifname, "ingress"])
                    .contains("xdhcp")
        };
        // A bridge nobody maps is no uplink.
        std::thread::sleep(Duration::from_millis(300));
        assert!(self.live_uplink("eth2").is_none());
        let before = lab.bridge_mappings();

        // Timed from the transaction's sending to the agent's word that
        // the program is attached (it says so once the kernel took it),
        // then checked in the kernel.
        let sent = lab.set_bridge_mappings_now(&format!("{before},physnet2:br-phys2"));
        let mut added = None;
        wait_until(Duration::from_secs(5), || {
            let live = self.live_uplink("eth2").is_some();
            if live {
                added = Some(sent.elapsed());
            }
            live
        });
        let added = added.unwrap_or_else(|| {
            panic!(
                "eth2 not live in 5 s: {:?}\n{}",
                self.try_status(),
                self.log()
            )
        });
        assert!(
            attached_on("eth2"),
            "the agent reports eth2 live, the kernel shows no program on it\n{}",
            self.log()
        );
        let up = self.wait_live_uplink("eth2", Duration::from_secs(5));
        assert_eq!(up.physnet.as_deref(), Some("physnet2"), "{up:?}");
        assert_eq!(up.bridge.as_deref(), Some("br-phys2"), "{up:?}");
        assert_eq!(up.source, "ovs");
        assert!(self.live_uplink(OvnLab::UPLINK).is_some());

        // The mapping goes: so does the program, and the first uplink stays.
        let sent = lab.set_bridge_mappings_now(&before);
        let detached = wait_until(Duration::from_secs(5), || !attached_on("eth2"));
        let removed = sent.elapsed();
        assert!(detached, "{:?}\n{}", self.try_status(), self.log());
        assert!(
            wait_until(Duration::from_secs(5), || self
                .status()
                .uplinks
                .iter()
                .all(|u| u.ifname != "eth2")),
            "{:?}",
            self.try_status()
        );
        assert!(self.live_uplink(OvnLab::UPLINK).is_some());
        assert_eq!(self.status().degraded, None);
        (added, removed)
    }

    pub fn uplink_state(&self) -> String {
        self.status()
            .uplinks
            .first()
            .map(|u| u.state.clone())
            .unwrap_or_default()
    }
}

/// Debian's `bridge` plugin run from inside `node`, putting `pod`'s `eth0`
/// on `bridge` with xdhcp IPAM through the agent at `socket`; its DEL
/// deletes the veth before it calls IPAM DEL.
pub fn bridge_plugin(
    cni: &CniPath,
    node: &NetNs,
    pod: &NetNs,
    bridge: &str,
    socket: &Path,
    cmd: &str,
    id: &str,
) -> PluginOutput {
    let conf = format!(
        r#"{{"cniVersion":"1.0.0","name":"xnet","type":"bridge","bridge":"{bridge}",
            "isGateway":false,"ipMasq":false,
            "ipam":{{"type":"xdhcp","socketPath":"{}","timeout":"15s"}}}}"#,
        socket.display()
    );
    invoke(
        &cni.plugin("bridge"),
        Some(node),
        cmd,
        id,
        Some(pod.path()),
        "eth0",
        cni.dir.path(),
        &conf,
    )
}

/// Puts the address of an ADD's result on `pod`'s interface, as
/// OVN-Kubernetes' CNI does with the IPAM result: a renewal's ACK is sent
/// to the leased address, and the server's ARP for it must be answered.
#[track_caller]
pub fn apply_address(pod: &xdhcp_tests::OvnPod, result: &PluginOutput) {
    let cidr = result.json["ips"][0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no address in {}", result.stdout));
    pod.ns.ip(&["addr", "add", cidr, "dev", &pod.ifname]);
}

/// The `dhcp` plugin called as ovnkube-node calls it for a localnet network
/// in DHCP mode (`invoke.ExecPluginWithResult` in `dhcp_linux.go`): the
/// config OVN-Kubernetes writes, with the agent's socket as
/// `daemonSocketPath` and `extra` appended to it (`,"key":value` pairs, or
/// nothing), `sandbox` as `CNI_CONTAINERID` and an empty `CNI_ARGS`.
pub fn ovnk_call_as(
    cni: &CniPath,
    agent: &NodeAgent,
    pod: &xdhcp_tests::OvnPod,
    sandbox: &str,
    command: &str,
    extra: &str,
) -> PluginOutput {
    let config = format!(
        r#"{{"cniVersion":"1.1.0","ipam":{{"daemonSocketPath":"{}","type":"dhcp"}},"name":"{}","type":"ovn-k8s-cni-overlay"{extra}}}"#,
        agent.socket.display(),
        OvnLab::NETWORK
    );
    PluginCall {
        plugin: &cni.plugin("dhcp"),
        node_ns: None,
        command,
        container_id: sandbox,
        netns: Some(pod.ns.path()),
        ifname: &pod.ifname,
        cni_path: cni.dir.path(),
        cni_args: "",
        config: &config,
    }
    .run()
    .expect("run the dhcp plugin")
}

/// [`ovnk_call_as`] with the pod's own sandbox id (the one on its `br-int`
/// port) and OVN-Kubernetes' config as it is.
pub fn ovnk_call(
    cni: &CniPath,
    agent: &NodeAgent,
    pod: &xdhcp_tests::OvnPod,
    command: &str,
) -> PluginOutput {
    ovnk_call_as(cni, agent, pod, &pod.sandbox, command, "")
}
