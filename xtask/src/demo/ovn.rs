//! The demo on a node built as OVN-Kubernetes builds one: Open vSwitch and
//! OVN in namespaces and directories of the demo's own.
//!
//! ```text
//!  pods (pod1…, virt-launcher-vm1)     xdemo-<pid>-node                          xdemo-<pid>-dhcp
//!  net1 ──veth── <sandbox>_<n> on br-int ─patch─ br-phys ── eth1 ──veth── s0 (192.0.2.1, dnsmasq)
//!                 ovs-vswitchd (userspace datapath), ovn-controller, the xdhcp agent
//! ```
//!
//! `ovsdb-server` serves the node's `Open_vSwitch` database and OVN's
//! northbound and southbound ones; `ovn-northd` translates; `ovn-controller`
//! wires the localnet logical switch (a `localnet` port on physical network
//! `physnet1`, which `ovn-bridge-mappings` maps to `br-phys`, whose port
//! `eth1` is the node's "NIC"). Bridges use the userspace (`netdev`)
//! datapath: it needs no openvswitch kernel module. Each pod's port on
//! `br-int` carries the `external_ids` OVN-Kubernetes' CNI writes
//! (`xdhcp_testbed::ovn`, shared with the tests' lab), and its IPAM is the
//! xdhcp thin plugin installed as `dhcp`, with the agent's socket as
//! `daemonSocketPath`. The agent gets no `--uplink`: it reads `eth1` from
//! OVS.
//!
//! One thing: the demo on an OVS + OVN node, its numbered steps in the
//! order a newcomer reads them (a script, long because each step checks
//! its own outcome).

use std::{
    fmt, fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use serde_json::{Value, json};
use xdhcp_testbed::ovn;

use super::{
    Args, Checks, CniCall, Shared, add_ns, del_ns, dnsmasq_line, in_ns, locked, netns_exec,
    print_leasefile, query, running, show, show_uplinks, spawn, step, stop, wait_for,
};
use crate::cmd;

/// Open vSwitch or OVN could not be started here: the demo shows the
/// Linux-bridge variant instead, saying why.
#[derive(Debug)]
pub(super) struct NoOvs(String);

impl fmt::Display for NoOvs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NoOvs {}

const PHYSNET: &str = "physnet1";
const PROVIDER_BRIDGE: &str = "br-phys";
/// The provider bridge's NIC (in the node namespace).
const UPLINK: &str = "eth1";
/// The DHCP server's end of the wire.
const SERVER_IF: &str = "s0";
const SERVER_IP: &str = "192.0.2.1";
const SWITCH: &str = "localnet1";
const LOCALNET_PORT: &str = "localnet1_ovn_localnet_port";
/// The Kubernetes namespace of every workload, and the NAD.
const K8S_NS: &str = "demo";
const NAD: &str = "demo/localnet1";
/// The interface of a secondary network inside a pod.
const POD_IF: &str = "net1";
const VM_MAC: &str = "02:00:00:00:30:01";
/// The VM's launcher pod and its UID (the pod object's, which OVN-Kubernetes
/// writes on the pod's port as `iface-id-ver`).
const LAUNCHER: &str = "virt-launcher-vm1";
const LAUNCHER_UID: &str = "00000000-0000-4000-8000-0000000000f1";
/// The agent's metrics, inside the node namespace.
const METRICS: &str = "127.0.0.1:9464";
/// What the rogue server hands out as router: an address it controls.
const ROGUE_ROUTER: &str = "192.0.2.66";

/// What the OVS node needs, from the program table.
const NEEDS: &[&str] = &[
    "ovsdb-tool",
    "ovsdb-server",
    "ovs-vsctl",
    "ovs-vswitchd",
    "ovn-northd",
    "ovn-controller",
    "ovn-nbctl",
    "vswitch.ovsschema",
    "ovn-nb.ovsschema",
    "ovn-sb.ovsschema",
    "ethtool",
    "busybox",
    "nft",
];

/// Why Open vSwitch cannot run here, known before starting anything.
pub(super) fn why_not() -> Option<String> {
    for name in NEEDS {
        let exe = cmd::executable(name);
        if !Path::new(exe).exists() {
            let package = xdhcp_testbed::programs::find(name)
                .and_then(xdhcp_testbed::programs::Program::package)
                .unwrap_or("?");
            return Some(format!(
                "{exe} is missing: package {package}, which `cargo xtask setup` installs"
            ));
        }
    }
    // The userspace datapath makes each bridge's own port a tap device.
    if !Path::new("/dev/net/tun").exists() {
        return Some("no /dev/net/tun, which the userspace datapath needs".to_owned());
    }
    None
}

/// A workload wired on the localnet.
struct Pod {
    name: String,
    ns: String,
    /// The host end of its veth: its port on `br-int`.
    host_ifname: String,
    /// The sandbox id: the CNI container id.
    sandbox: String,
    uid: String,
}

/// The running node: namespaces, daemon directories.
struct Node<'a> {
    lab: &'a Shared,
    /// The demo's directory (logs, the agent's state).
    dir: PathBuf,
    /// OVS's and OVN's run, database and log directory.
    ovs_dir: PathBuf,
    /// The node's namespace: ovs-vswitchd, ovn-controller, the agent.
    ns: String,
    dhcp_ns: String,
    pods: usize,
}

impl Node<'_> {
    fn path(&self, name: &str) -> PathBuf {
        self.ovs_dir.join(name)
    }

    fn db_socket(&self) -> PathBuf {
        self.path("db.sock")
    }

    /// Every OVS and OVN program gets the demo's directories.
    fn env(&self, c: &mut Command) {
        for var in ovn::DIR_VARS {
            c.env(var, &self.ovs_dir);
        }
    }

    fn vsctl<S: AsRef<str>>(&self, args: &[S]) -> Result<String> {
        let mut c = cmd::program("ovs-vsctl");
        self.env(&mut c);
        c.arg(format!("--db=unix:{}", self.db_socket().display()))
            .arg("--no-wait")
            .args(args.iter().map(AsRef::as_ref));
        let out = cmd::output(&mut c)?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn nbctl<S: AsRef<str>>(&self, args: &[S]) -> Result<String> {
        let mut c = cmd::program("ovn-nbctl");
        self.env(&mut c);
        c.arg(format!("--db=unix:{}", self.path("ovnnb.sock").display()))
            .args(args.iter().map(AsRef::as_ref));
        let out = cmd::output(&mut c)?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Starts daemon `name` with the demo's directories, a pid file and a
    /// log file; a daemon that exits at once means OVS cannot run here.
    fn daemon(&self, name: &str, mut c: Command) -> Result<u32> {
        self.env(&mut c);
        c.arg(format!(
            "--pidfile={}",
            self.path(&format!("{name}.pid")).display()
        ))
        .arg("--no-chdir")
        .arg(format!("--log-file={}", self.log_path(name).display()))
        .stdout(Stdio::null())
        .stderr(fs::File::create(self.path(&format!("{name}.stderr")))?);
        let pid = spawn(self.lab, &mut c)?;
        std::thread::sleep(Duration::from_millis(100));
        if !running(self.lab, pid)? {
            let stderr =
                fs::read_to_string(self.path(&format!("{name}.stderr"))).unwrap_or_default();
            let log = fs::read_to_string(self.log_path(name)).unwrap_or_default();
            let last = stderr
                .lines()
                .chain(log.lines())
                .rfind(|l| !l.trim().is_empty())
                .unwrap_or("no message")
                .to_owned();
            return Err(NoOvs(format!("{name} exited at once: {last}")).into());
        }
        Ok(pid)
    }

    fn log_path(&self, name: &str) -> PathBuf {
        // The demo's failure report reads the node's logs from its directory.
        self.dir.join(format!("{name}.log"))
    }

    fn ovsdb_server(&self, db: &str, sock: &Path) -> Result<()> {
        let mut c = cmd::program("ovsdb-server");
        c.arg(self.path(&format!("{db}.db")))
            .arg(format!("--remote=punix:{}", sock.display()))
            .arg(format!(
                "--unixctl={}",
                self.path(&format!("{db}.ctl")).display()
            ));
        self.daemon(&format!("ovsdb-server-{db}"), c)?;
        wait_quietly(Duration::from_secs(10), || {
            std::os::unix::net::UnixStream::connect(sock).is_ok()
        })
        .map_err(|()| NoOvs(format!("ovsdb-server ({db}) opened no socket in 10 s")).into())
    }

    /// The node's NIC `eth1`, a veth to the server's `s0` (192.0.2.1/24).
    fn wire_server(&self) -> Result<()> {
        in_ns(
            &self.ns,
            &[
                "ip",
                "link",
                "add",
                UPLINK,
                "type",
                "veth",
                "peer",
                "name",
                SERVER_IF,
                "netns",
                &self.dhcp_ns,
            ],
        )?;
        for (ns, ifname) in [(&self.ns, UPLINK), (&self.dhcp_ns, SERVER_IF)] {
            in_ns(ns, &["ip", "link", "set", ifname, "up"])?;
            Node::offload_off(ns, ifname)?;
        }
        in_ns(
            &self.dhcp_ns,
            &["ip", "addr", "add", "192.0.2.1/24", "dev", SERVER_IF],
        )?;
        Ok(())
    }

    /// A veth end's tx checksum offload off. A veth hands a packet on with
    /// its UDP checksum still to be filled in; the userspace datapath
    /// reads it through a packet socket and sends it on as it is, so the
    /// far end gets a bad checksum and drops it (OVS documents this for
    /// veths on the userspace datapath; with offload on, no DHCP client
    /// here gets a lease).
    fn offload_off(ns: &str, ifname: &str) -> Result<()> {
        in_ns(ns, &["ethtool", "-K", ifname, "tx", "off"]).map(|_| ())
    }

    /// Wires workload `name` as OVN-Kubernetes' CNI does for a localnet
    /// network: a namespace whose `net1` (MAC `if_mac`) is a veth to a
    /// `br-int` port carrying the pod's `external_ids`, and a logical port
    /// with MAC `port_mac`; waits until ovn-controller has bound it.
    /// Wires pod `name` (its interface `if_mac`, its logical port
    /// `port_mac`); `uid` its pod UID, else one made up.
    fn wire_pod(
        &mut self,
        role: &str,
        name: &str,
        (if_mac, port_mac): (&str, &str),
        uid: Option<&str>,
    ) -> Result<Pod> {
        self.pods += 1;
        let n = self.pods;
        let ns = add_ns(self.lab, role)?;
        let sandbox = ovn::sandbox_id(n);
        let host_ifname = ovn::host_ifname(&sandbox, n + 3);
        let uid = uid.map_or_else(
            || format!("00000000-0000-4000-8000-{n:012x}"),
            str::to_owned,
        );
        in_ns(
            &self.ns,
            &[
                "ip",
                "link",
                "add",
                &host_ifname,
                "type",
                "veth",
                "peer",
                "name",
                POD_IF,
                "netns",
                &ns,
            ],
        )?;
        in_ns(&ns, &["ip", "link", "set", POD_IF, "address", if_mac])?;
        in_ns(&ns, &["ip", "link", "set", POD_IF, "up"])?;
        in_ns(&self.ns, &["ip", "link", "set", &host_ifname, "up"])?;
        Self::offload_off(&ns, POD_IF)?;
        Self::offload_off(&self.ns, &host_ifname)?;
        let iface_id = ovn::logical_port(NAD, K8S_NS, name);
        let port = ovn::PodPort {
            host_ifname: &host_ifname,
            iface_id: &iface_id,
            uid: &uid,
            mac: port_mac,
            sandbox: &sandbox,
            pod_if_name: POD_IF,
            nad: NAD,
        };
        self.nbctl(&port.lsp_add_args(SWITCH))?;
        self.vsctl(&port.add_port_args())?;
        wait_for(
            &format!("ovn-controller to bind {name}'s port {host_ifname}"),
            Duration::from_secs(20),
            || {
                Ok(self
                    .vsctl(&[
                        "--if-exists",
                        "get",
                        "interface",
                        &host_ifname,
                        "external_ids:ovn-installed",
                    ])?
                    .trim()
                    == "\"true\"")
            },
        )?;
        Ok(Pod {
            name: name.to_owned(),
            ns,
            host_ifname,
            sandbox,
            uid,
        })
    }
}

/// Polls `check` every 50 ms for up to `timeout`, silently.
fn wait_quietly(timeout: Duration, mut check: impl FnMut() -> bool) -> Result<(), ()> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if check() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(())
}

/// Builds the node: databases, switch, northd, controller, bridges, the
/// localnet; the server's wire. Any failure here is [`NoOvs`].
fn start_node<'a>(lab: &'a Shared, dir: &Path) -> Result<Node<'a>> {
    let ovs_dir = dir.join("ovs");
    fs::create_dir_all(&ovs_dir).with_context(|| format!("creating {}", ovs_dir.display()))?;
    let node = Node {
        lab,
        dir: dir.to_owned(),
        ovs_dir,
        ns: add_ns(lab, "node")?,
        dhcp_ns: add_ns(lab, "dhcp")?,
        pods: 0,
    };
    node.wire_server()?;

    for (db, schema) in [
        ("conf", "vswitch.ovsschema"),
        ("ovnnb", "ovn-nb.ovsschema"),
        ("ovnsb", "ovn-sb.ovsschema"),
    ] {
        cmd::output(
            cmd::program("ovsdb-tool")
                .arg("create")
                .arg(node.path(&format!("{db}.db")))
                .arg(cmd::executable(schema)),
        )
        .map_err(|e| NoOvs(format!("{e:#}")))?;
        let sock = if db == "conf" {
            node.db_socket()
        } else {
            node.path(&format!("{db}.sock"))
        };
        node.ovsdb_server(db, &sock)?;
    }
    node.vsctl(&["init"])?;
    println!("  ovsdb-server: Open_vSwitch, OVN_Northbound, OVN_Southbound");

    // In the node's namespace: the userspace datapath opens the node's
    // interfaces by name there. `--disable-system`: never the kernel
    // datapath.
    let mut vswitchd = netns_exec(&node.ns, cmd::executable("ovs-vswitchd"));
    vswitchd
        .arg(format!("unix:{}", node.db_socket().display()))
        .arg("--disable-system")
        .arg(format!(
            "--unixctl={}",
            node.path("ovs-vswitchd.ctl").display()
        ));
    node.daemon("ovs-vswitchd", vswitchd)?;
    let mut northd = cmd::program("ovn-northd");
    northd
        .arg(format!(
            "--ovnnb-db=unix:{}",
            node.path("ovnnb.sock").display()
        ))
        .arg(format!(
            "--ovnsb-db=unix:{}",
            node.path("ovnsb.sock").display()
        ))
        .arg(format!(
            "--unixctl={}",
            node.path("ovn-northd.ctl").display()
        ));
    node.daemon("ovn-northd", northd)?;

    node.vsctl(&ovn::add_bridge_args(ovn::INTEGRATION_BRIDGE, "netdev"))?;
    node.vsctl(&ovn::add_bridge_args(PROVIDER_BRIDGE, "netdev"))?;
    node.vsctl(&ovn::node_settings_args(
        "demo-node",
        &format!("unix:{}", node.path("ovnsb.sock").display()),
        &format!("{PHYSNET}:{PROVIDER_BRIDGE}"),
    ))?;
    node.vsctl(&["add-port", PROVIDER_BRIDGE, UPLINK])?;
    // Its control socket goes to OVN_RUNDIR (23.03 has no --unixctl).
    let mut controller = netns_exec(&node.ns, cmd::executable("ovn-controller"));
    controller.arg(format!("unix:{}", node.db_socket().display()));
    node.daemon("ovn-controller", controller)?;
    println!(
        "  ovs-vswitchd (userspace datapath), ovn-northd, ovn-controller; bridges {} and {PROVIDER_BRIDGE} (port {UPLINK})",
        ovn::INTEGRATION_BRIDGE
    );

    node.nbctl(&["ls-add", SWITCH])?;
    node.nbctl(&ovn::localnet_port_args(SWITCH, LOCALNET_PORT, PHYSNET))?;
    let mappings = node.vsctl(&[
        "get",
        "open_vswitch",
        ".",
        "external_ids:ovn-bridge-mappings",
    ])?;
    println!(
        "  logical switch {SWITCH} with a localnet port on {PHYSNET}; ovn-bridge-mappings={}",
        mappings.trim()
    );
    Ok(node)
}

/// The `pod-networks` store seeded with what a cluster would know of the
/// VM: its launcher pod (labels, UID) and its VMI (a bridge-bound interface
/// on the localnet with the VM's MAC). Without a cluster this store is the
/// node's pods: the agent finds the launcher's port's pod here by its UID.
fn seed_store(state: &Path) -> Result<()> {
    fs::create_dir_all(state)?;
    let seed = json!({
        "pods": {
            format!("{K8S_NS}/{LAUNCHER}"): {
                "uid": LAUNCHER_UID,
                "labels": {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": "vm1"}
            }
        },
        "vmis": {
            format!("{K8S_NS}/vm1"): {
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": {"name": "vm1", "namespace": K8S_NS},
                "spec": {
                    "networks": [
                        {"name": "default", "pod": {}},
                        {"name": "localnet", "multus": {"networkName": NAD}}
                    ],
                    "domain": {"devices": {"interfaces": [
                        {"name": "default", "masquerade": {}},
                        {"name": "localnet", "bridge": {}, "macAddress": VM_MAC}
                    ]}}
                }
            }
        }
    });
    fs::write(
        state.join("pod-networks.json"),
        serde_json::to_vec_pretty(&seed)?,
    )
    .context("seeding the pod store")
}

/// The address the `pod-networks` entry of `pod` reports for the NAD.
fn reported(state: &Path, pod: &str) -> Option<String> {
    let store: Value =
        serde_json::from_slice(&fs::read(state.join("pod-networks.json")).ok()?).ok()?;
    let ann = store["pods"][format!("{K8S_NS}/{pod}")]["annotations"]["k8s.ovn.org/pod-networks"]
        .as_str()?;
    let doc: Value = serde_json::from_str(ann).ok()?;
    doc[NAD]["ip_addresses"][0].as_str().map(str::to_owned)
}

/// What ovnkube-node writes once its own one-shot for a VM has leased `ip`:
/// the launcher pod's `pod-networks` entry of the NAD (`ipam_mode: dhcp`).
fn write_one_shot_entry(state: &Path, pod: &str, ip: &str) -> Result<()> {
    let path = state.join("pod-networks.json");
    let mut store: Value = serde_json::from_slice(&fs::read(&path)?)?;
    let entry = json!({ NAD: {
        "ip_addresses": [format!("{ip}/24")], "mac_address": VM_MAC,
        "gateway_ips": [SERVER_IP], "role": "secondary", "ipam_mode": "dhcp"
    }});
    store["pods"][format!("{K8S_NS}/{pod}")]["annotations"]["k8s.ovn.org/pod-networks"] =
        Value::String(entry.to_string());
    // As the agent writes the store: whole, then renamed over it.
    let tmp = path.with_extension("json.demo");
    fs::write(&tmp, serde_json::to_vec_pretty(&store)?)?;
    fs::rename(&tmp, &path).context("writing the pod store")
}

/// What ovnkube-controller does on every change of a VM pod's entry: the
/// logical port's `addresses` and `port_security` pinned to its MAC and
/// the entry's address, so OVN passes nothing else to or from the port.
fn pin_port(node: &Node<'_>, lsp: &str, ip: &str) -> Result<()> {
    let pinned = format!("{VM_MAC} {ip}");
    node.nbctl(&[
        "lsp-set-addresses",
        lsp,
        &pinned,
        "--",
        "lsp-set-port-security",
        lsp,
        &pinned,
    ])?;
    println!("  ovnkube-controller: port {lsp} pinned to {pinned}");
    Ok(())
}

/// The agent's Prometheus text, read inside the node namespace.
fn metrics(node_ns: &str) -> Result<String> {
    in_ns(
        node_ns,
        &[
            "busybox",
            "wget",
            "-q",
            "-O",
            "-",
            &format!("http://{METRICS}/metrics"),
        ],
    )
}

/// The sum of the samples of `name` whose labels contain every one of `labels`.
fn metric_sum(text: &str, name: &str, labels: &[&str]) -> u64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            let (metric, rest) = key.split_once('{').unwrap_or((key, ""));
            (metric == name && labels.iter().all(|w| rest.contains(w)))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .map(|v| v as u64)
        .sum()
}

/// busybox `udhcpc` once on `ifname` in `ns`, as a workload's own DHCP
/// client: (address, server, router) it bound, if any. `client_id`: its
/// option 61 in hex (else udhcpc's default, `01:<MAC>`).
fn udhcpc(
    dir: &Path,
    ns: &str,
    ifname: &str,
    client_id: Option<&str>,
) -> Result<Option<[String; 3]>> {
    let script = dir.join(format!("udhcpc-{ns}.sh"));
    let out = dir.join(format!("udhcpc-{ns}.bound"));
    let _ = fs::remove_file(&out);
    fs::write(
        &script,
        format!(
            "#!/bin/sh\n[ \"$1\" = bound ] && echo \"$ip $serverid $router\" > {}\nexit 0\n",
            out.display()
        ),
    )?;
    fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let mut c = netns_exec(ns, cmd::executable("busybox"));
    c.args([
        "udhcpc", "-f", "-q", "-n", "-t", "3", "-T", "1", "-A", "1", "-i", ifname, "-s",
    ])
    .arg(&script);
    if let Some(id) = client_id {
        c.args(["-x", &format!("0x3d:{id}")]);
    }
    let status = c
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("running udhcpc")?;
    if !status.success() {
        return Ok(None);
    }
    let text = fs::read_to_string(&out).unwrap_or_default();
    let mut it = text.split_whitespace().map(str::to_owned);
    Ok(Some([
        it.next().unwrap_or_default(),
        it.next().unwrap_or_default(),
        it.next().unwrap_or_else(|| "-".to_owned()),
    ]))
}

/// dnsmasq in `ns` on `ifname`, logging to `<name>.log`, leases in
/// `<name>.leases`; `extra` its DHCP settings. Its pid.
fn dnsmasq(
    lab: &Shared,
    dir: &Path,
    ns: &str,
    ifname: &str,
    name: &str,
    extra: &[&str],
) -> Result<u32> {
    spawn(
        lab,
        netns_exec(ns, cmd::executable("dnsmasq"))
            .args(["--no-daemon", "--conf-file=/dev/null", "--port=0"])
            .arg(format!("--interface={ifname}"))
            .args(["--bind-interfaces", "--no-ping", "--log-dhcp"])
            .args(extra)
            .arg(format!(
                "--dhcp-leasefile={}",
                dir.join(format!("{name}.leases")).display()
            ))
            .arg(format!(
                "--pid-file={}",
                dir.join(format!("{name}.pid")).display()
            ))
            .arg(format!(
                "--log-facility={}",
                dir.join(format!("{name}.log")).display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
}

/// Counts, in `ns`, the DHCP server frames from `from` that reach its
/// stack (an nftables counter at prerouting).
fn count_frames_from(ns: &str, from: &str) -> Result<()> {
    in_ns(ns, &["nft", "add", "table", "inet", "xdemo"])?;
    in_ns(
        ns,
        &[
            "nft",
            "add",
            "chain",
            "inet",
            "xdemo",
            "seen",
            "{ type filter hook prerouting priority -400; }",
        ],
    )?;
    in_ns(
        ns,
        &[
            "nft", "add", "rule", "inet", "xdemo", "seen", "ip", "saddr", from, "udp", "sport",
            "67", "counter",
        ],
    )
    .map(|_| ())
}

fn frames_seen(ns: &str) -> Result<u64> {
    let text = in_ns(ns, &["nft", "list", "table", "inet", "xdemo"])?;
    text.split_whitespace()
        .skip_while(|w| *w != "packets")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .context("the nftables counter")
}

fn log_lines(path: &Path, needle: &str) -> Vec<String> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .map(|l| dnsmasq_line(l).to_owned())
        .collect()
}

/// The rows of `xdhcp leases --json`.
fn lease_rows(xdhcp: &Path, sock: &Path) -> Result<Vec<Value>> {
    Ok(query(xdhcp, "leases", sock)?
        .as_array()
        .cloned()
        .unwrap_or_default())
}

#[expect(
    clippy::too_many_lines,
    reason = "the demo reads top to bottom as the steps it prints"
)]
pub(super) fn run(
    args: &Args,
    lab: &Shared,
    xdhcp: &Path,
    plugin: &Path,
    checks: &mut Checks,
) -> Result<()> {
    let dir = locked(lab)?.dir.clone();
    let started = Instant::now();

    step(
        1,
        "building an OVN-Kubernetes node: Open vSwitch (userspace datapath) and OVN, a localnet network, a DHCP server on the wire",
    );
    let mut node = start_node(lab, &dir)?;

    step(
        2,
        "starting dnsmasq behind the provider bridge (range 192.0.2.100-150, lease 2 min, T1 10 s, T2 20 s)",
    );
    dnsmasq(
        lab,
        &dir,
        &node.dhcp_ns,
        SERVER_IF,
        "dnsmasq",
        &[
            "--dhcp-range=192.0.2.100,192.0.2.150,255.255.255.0,2m",
            "--dhcp-authoritative",
            "--dhcp-option=option:router,192.0.2.1",
            "--dhcp-option=option:T1,10",
            "--dhcp-option=option:T2,20",
        ],
    )?;
    let leases = dir.join("dnsmasq.leases");
    let dns_log = dir.join("dnsmasq.log");

    step(
        3,
        "starting the xdhcp agent in the node with no --uplink: it reads the uplinks from OVS",
    );
    let sock = dir.join("xdhcp.sock");
    let state = dir.join("state");
    seed_store(&state)?;
    let agent_log = fs::File::create(dir.join("agent.log")).context("creating agent.log")?;
    spawn(
        lab,
        netns_exec(&node.ns, xdhcp)
            .args(["agent", "--kube", "off", "--socket"])
            .arg(&sock)
            .arg("--state-dir")
            .arg(&state)
            // The demo's own directory, not a bpffs: nothing is pinned and
            // the host's /sys/fs/bpf is left alone.
            .arg("--bpffs-dir")
            .arg(dir.join("bpffs"))
            .arg("--ovsdb")
            .arg(node.db_socket())
            .args(["--metrics-addr", METRICS])
            .stdout(agent_log.try_clone().context("agent log")?)
            .stderr(agent_log),
    )?;
    println!(
        "  $ xdhcp agent --kube off --ovsdb {} --metrics-addr {METRICS}   (no --uplink)",
        node.db_socket().display()
    );
    wait_for(
        &format!("the agent to attach at {UPLINK}"),
        Duration::from_secs(20),
        || {
            Ok(sock.exists()
                && query(xdhcp, "status", &sock).is_ok_and(|s| {
                    s["uplinks"].as_array().is_some_and(|u| {
                        u.iter()
                            .any(|u| u["ifname"] == UPLINK && u["state"] == "live")
                    })
                }))
        },
    )?;
    println!("  $ xdhcp status");
    show_uplinks(xdhcp, &sock)?;
    let status = query(xdhcp, "status", &sock)?;
    let up = status["uplinks"]
        .as_array()
        .and_then(|u| u.iter().find(|u| u["ifname"] == UPLINK).cloned())
        .unwrap_or_default();
    checks.expect(
        up["source"] == "ovs" && up["physnet"] == PHYSNET && up["bridge"] == PROVIDER_BRIDGE,
        &format!("{UPLINK} found in OVS as {PHYSNET}'s uplink on {PROVIDER_BRIDGE}"),
    );

    // The CNI plugin as the DaemonSet installs it: the thin plugin as `dhcp`.
    let cni_bin = dir.join("cni-bin");
    fs::create_dir_all(&cni_bin)?;
    let dhcp_plugin = cni_bin.join("dhcp");
    let _ = fs::remove_file(&dhcp_plugin);
    std::os::unix::fs::symlink(plugin, &dhcp_plugin).context("installing the plugin")?;
    let cni_path = cni_bin.display().to_string();
    // A localnet NAD's config, with the agent's socket where the upstream
    // daemon's would be.
    let conf = json!({
        "cniVersion": "1.1.0", "name": "localnet1", "type": "ovn-k8s-cni-overlay",
        "topology": "localnet", "role": "secondary", "physicalNetworkName": PHYSNET,
        "netAttachDefName": NAD,
        "ipam": {"type": "dhcp", "daemonSocketPath": sock}
    })
    .to_string();
    let node_ns = node.ns.clone();
    let ipam = |command: &str, pod: &Pod| -> Result<String> {
        CniCall {
            node_ns: Some(&node_ns),
            plugin: &dhcp_plugin,
            command,
            container_id: &pod.sandbox,
            netns: &format!("/var/run/netns/{}", pod.ns),
            ifname: POD_IF,
            cni_path: &cni_path,
            cni_args: &format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE={K8S_NS};K8S_POD_NAME={};K8S_POD_UID={}",
                pod.name, pod.uid
            ),
            conf: &conf,
        }
        .run()
    };
    // ADD, then the address applied in the pod as OVN-Kubernetes does.
    let add = |pod: &Pod, apply: bool| -> Result<(String, String)> {
        let t = Instant::now();
        let out = ipam("ADD", pod)?;
        let ms = t.elapsed().as_millis();
        let result: Value =
            serde_json::from_str(&out).with_context(|| format!("the plugin printed: {out}"))?;
        let addr = result["ips"][0]["address"]
            .as_str()
            .unwrap_or("?")
            .to_owned();
        let gw = result["ips"][0]["gateway"]
            .as_str()
            .unwrap_or("-")
            .to_owned();
        if apply {
            in_ns(&pod.ns, &["ip", "addr", "add", &addr, "dev", POD_IF])?;
        }
        println!(
            "  {}: {POD_IF} {addr} gateway {gw}  (ADD {ms} ms)",
            pod.name
        );
        Ok((addr, gw))
    };

    step(
        4,
        "two pods wired as OVN-Kubernetes wires them, each ADD through `dhcp` IPAM: the OFFER and ACK are taken at the uplink",
    );
    let pod1 = node.wire_pod(
        "pod1",
        "pod1",
        ("0a:58:c0:00:02:11", "0a:58:c0:00:02:11"),
        None,
    )?;
    let pod2 = node.wire_pod(
        "pod2",
        "pod2",
        ("0a:58:c0:00:02:12", "0a:58:c0:00:02:12"),
        None,
    )?;
    // ovn-controller patches the localnet into br-int once a port of the
    // switch is bound on this chassis.
    println!(
        "  ports of {PROVIDER_BRIDGE}: {}",
        node.vsctl(&["list-ports", PROVIDER_BRIDGE])?
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(", ")
    );
    let (addr1, _) = add(&pod1, true)?;
    let (addr2, _) = add(&pod2, true)?;
    println!("  $ xdhcp leases");
    show(xdhcp, "leases", &sock)?;
    let rows = lease_rows(xdhcp, &sock)?;
    checks.expect(
        rows.len() == 2 && rows.iter().all(|r| r["path"] == format!("uplink:{UPLINK}")),
        &format!("both leases' PATH is uplink:{UPLINK}: their replies never reached the pods"),
    );
    let replies = query(xdhcp, "status", &sock)?["uplinks"][0]["replies"]
        .as_u64()
        .unwrap_or(0);
    println!("  replies captured at {UPLINK} so far: {replies}");
    let ip1 = addr1.split('/').next().unwrap_or_default().to_owned();
    let ip2 = addr2.split('/').next().unwrap_or_default().to_owned();

    step(
        5,
        "a rogue DHCP server in pod1 (router 192.0.2.66); pod3 runs a DHCP client of its own",
    );
    let rogue = dnsmasq(
        lab,
        &dir,
        &pod1.ns,
        POD_IF,
        "rogue",
        &[
            "--dhcp-range=192.0.2.200,192.0.2.220,255.255.255.0,2m",
            "--dhcp-authoritative",
            &format!("--dhcp-option=option:router,{ROGUE_ROUTER}"),
        ],
    )?;
    let rogue_log = dir.join("rogue.log");
    wait_for(
        "the rogue dnsmasq to listen",
        Duration::from_secs(5),
        || Ok(fs::read_to_string(&rogue_log).is_ok_and(|l| l.contains("DHCP, IP range"))),
    )?;
    let pod3 = node.wire_pod(
        "pod3",
        "pod3",
        ("0a:58:c0:00:02:13", "0a:58:c0:00:02:13"),
        None,
    )?;
    count_frames_from(&pod3.ns, &ip1)?;
    let bound = udhcpc(&dir, &pod3.ns, POD_IF, None)?;
    let (got, server, router) = bound.as_ref().map_or(("-", "-", "-"), |[a, s, r]| {
        (a.as_str(), s.as_str(), r.as_str())
    });
    println!("  pod3's own client (busybox udhcpc) bound {got} from {server}, router {router}");
    let offers = log_lines(&rogue_log, "DHCPOFFER").len();
    println!("  the rogue in pod1 sent {offers} OFFER(s)");
    // The agent copies the guard's counters into its metrics every 2 s.
    let port_label = format!("port=\"{}\"", pod1.host_ifname);
    let mut dropped = 0;
    let _ = wait_for(
        "the guard's count in the agent's metrics",
        Duration::from_secs(5),
        || {
            dropped = metric_sum(
                &metrics(&node.ns)?,
                "xdhcp_guard_dropped_frames",
                &[&port_label, "reason=\"server\""],
            );
            Ok(offers > 0 && dropped >= 1)
        },
    );
    println!(
        "  the guard on pod1's port {}: {dropped} server frame(s) dropped (xdhcp_guard_dropped_frames)",
        pod1.host_ifname
    );
    let reached = frames_seen(&pod3.ns)?;
    println!("  frames from the rogue that reached pod3: {reached}");
    checks.expect(
        server == SERVER_IP && router == SERVER_IP,
        "pod3's client took its lease and router from the real server",
    );
    checks.expect(
        offers >= 1 && dropped >= 1,
        "the rogue answered and the guard counted its OFFERs as dropped",
    );
    checks.expect(reached == 0, "none of the rogue's frames reached pod3");
    stop(lab, rogue)?;
    println!("  rogue stopped");

    step(
        6,
        "a KubeVirt VM as OVN-Kubernetes serves it: no ADD reaches the agent; ovnkube-node's one-shot pins the port, the guest's own DHCP client still gets its address",
    );
    let launcher = node.wire_pod(
        "vm1",
        LAUNCHER,
        ("0a:58:c0:00:02:30", VM_MAC),
        Some(LAUNCHER_UID),
    )?;
    let lsp = ovn::logical_port(NAD, K8S_NS, LAUNCHER);
    // The launcher's bridge binding: net1 and the guest's link on k6t-net1.
    let guest_ns = add_ns(lab, "vm1-guest")?;
    for args in [
        &["ip", "link", "add", "k6t-net1", "type", "bridge"][..],
        &["ip", "link", "set", POD_IF, "master", "k6t-net1"],
        &[
            "ip", "link", "add", "tap0", "type", "veth", "peer", "name", "eth0", "netns", &guest_ns,
        ],
        &["ip", "link", "set", "tap0", "master", "k6t-net1"],
        &["ip", "link", "set", "tap0", "up"],
        &["ip", "link", "set", "k6t-net1", "up"],
    ] {
        in_ns(&launcher.ns, args)?;
    }
    in_ns(&guest_ns, &["ip", "link", "set", "eth0", "address", VM_MAC])?;
    in_ns(&guest_ns, &["ip", "link", "set", "eth0", "up"])?;
    Node::offload_off(&guest_ns, "eth0")?;
    Node::offload_off(&launcher.ns, "tap0")?;
    // Found in OVS (iface-id-ver = the launcher's UID), its pod a VMI's:
    // the VM policy, before any DHCP.
    let vm_policy = wait_for(
        "the agent to guard the VM's port as a VM's",
        Duration::from_secs(10),
        || {
            Ok(query(xdhcp, "status", &sock)?["guardedPorts"]
                .as_array()
                .is_some_and(|ports| {
                    ports.iter().any(|p| {
                        p["port"] == launcher.host_ifname.as_str() && p["learning"] == true
                    })
                }))
        },
    );
    println!("  xdhcp status, guarded ports (port, identity from, pod UID, policy):");
    for p in query(xdhcp, "status", &sock)?["guardedPorts"]
        .as_array()
        .into_iter()
        .flatten()
    {
        println!(
            "    {:<16} {:<5} {:<36} {}",
            p["port"].as_str().unwrap_or("-"),
            p["identity"].as_str().unwrap_or("-"),
            p["podUid"].as_str().unwrap_or("-"),
            if p["learning"] == true {
                "learning"
            } else {
                "-"
            },
        );
    }
    checks.expect(
        vm_policy.is_ok(),
        "the VM's port, found in OVS with no ADD, is guarded as a VM's (learning, broadcast rewrite)",
    );
    println!("  ovnkube-node's one-shot for the VM (client id 01:<MAC>), then its entry:");
    let one_shot =
        udhcpc(&dir, &guest_ns, "eth0", None)?.map_or_else(|| "-".to_owned(), |[a, _, _]| a);
    println!("  the one-shot leased {one_shot}");
    write_one_shot_entry(&state, LAUNCHER, &one_shot)?;
    pin_port(&node, &lsp, &one_shot)?;
    println!(
        "  the guest boots and runs its own DHCP client (its own client id, as a DUID-based client sends)"
    );
    let guest = udhcpc(
        &dir,
        &guest_ns,
        "eth0",
        Some("ff00000001000100000000cafe0001"),
    )?;
    let guest_ip = guest
        .as_ref()
        .map_or("-", |[a, _, _]| a.as_str())
        .to_owned();
    println!(
        "  the guest bound {guest_ip} (the server broadcast its answers: the agent set the flag on the guest's requests)"
    );
    let learned = wait_for(
        "the guest's address to be reported in pod-networks",
        Duration::from_secs(5),
        || {
            Ok(reported(&state, LAUNCHER)
                .is_some_and(|e| e.split('/').next() == Some(guest_ip.as_str())))
        },
    );
    if let Err(e) = &learned {
        println!("  {e:#}");
    }
    show(xdhcp, "bindings", &sock)?;
    let entry = reported(&state, LAUNCHER);
    println!(
        "  pod-networks[{NAD}] of {LAUNCHER}: {} (the one-shot's was {one_shot})",
        entry.as_deref().unwrap_or("-")
    );
    checks.expect(
        guest.is_some() && guest_ip != one_shot && learned.is_ok(),
        "the guest got its own address through the pinned port, and the entry moved to it",
    );
    pin_port(&node, &lsp, &guest_ip)?;
    in_ns(
        &guest_ns,
        &[
            "ip",
            "addr",
            "add",
            &format!("{guest_ip}/24"),
            "dev",
            "eth0",
        ],
    )?;
    let reached = wait_for(
        "the guest to reach the DHCP server's host",
        Duration::from_secs(5),
        || {
            Ok(netns_exec(&guest_ns, cmd::executable("busybox"))
                .args(["ping", "-c", "1", "-W", "1", SERVER_IP])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()?
                .success())
        },
    );
    let rows = lease_rows(xdhcp, &sock)?;
    checks.expect(
        reached.is_ok() && rows.iter().all(|r| r["workload"] == "pod"),
        &format!("the guest pings {SERVER_IP} from {guest_ip} through OVN; the agent holds no lease for the VM"),
    );

    step(7, "the renewal at T1 (10 s), through the uplink");
    let renewed = |ip: &str| {
        log_lines(&dns_log, "DHCPACK(s0)")
            .iter()
            .filter(|l| l.contains(&format!(" {ip} ")))
            .count()
            >= 2
    };
    wait_for(
        "both pods' renewals",
        Duration::from_secs(args.renewal_wait_secs),
        || Ok(renewed(&ip1) && renewed(&ip2)),
    )?;
    for ip in [&ip1, &ip2] {
        if let Some(l) = log_lines(&dns_log, "DHCPREQUEST(s0)")
            .iter()
            .rfind(|l| l.contains(&format!(" {ip} ")))
        {
            println!("  dnsmasq: {l}");
        }
        if let Some(l) = log_lines(&dns_log, "DHCPACK(s0)")
            .iter()
            .rfind(|l| l.contains(&format!(" {ip} ")))
        {
            println!("  dnsmasq: {l}");
        }
    }
    show(xdhcp, "leases", &sock)?;
    let rows = lease_rows(xdhcp, &sock)?;
    checks.expect(
        rows.iter()
            .filter(|r| r["workload"] == "pod")
            .all(|r| r["path"] == format!("uplink:{UPLINK}") && r["state"] == "Bound"),
        "renewed, bound, still on the uplink",
    );

    step(
        8,
        "pod2 goes: its port and veth first, then the IPAM DEL: the RELEASE leaves through the uplink",
    );
    node.vsctl(&["del-port", ovn::INTEGRATION_BRIDGE, &pod2.host_ifname])?;
    node.nbctl(&["lsp-del", &ovn::logical_port(NAD, K8S_NS, "pod2")])?;
    del_ns(lab, &pod2.ns)?;
    println!(
        "  port {} and namespace {} removed",
        pod2.host_ifname, pod2.ns
    );
    ipam("DEL", &pod2)?;
    println!("  IPAM DEL for pod2 answered");
    let released = wait_for(
        "dnsmasq to drop pod2's lease",
        Duration::from_secs(10),
        || {
            Ok(
                !log_lines(&dns_log, &format!("DHCPRELEASE(s0) {ip2} ")).is_empty()
                    && !fs::read_to_string(&leases)
                        .unwrap_or_default()
                        .contains(&format!(" {ip2} ")),
            )
        },
    );
    for l in log_lines(&dns_log, "DHCPRELEASE") {
        println!("  dnsmasq: {l}");
    }
    println!("  dnsmasq's lease file:");
    print_leasefile(&leases);
    checks.expect(
        released.is_ok(),
        &format!("the server honoured pod2's RELEASE ({ip2} gone from its leases)"),
    );
    show(xdhcp, "leases", &sock)?;
    println!(
        "\n  the steps took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
