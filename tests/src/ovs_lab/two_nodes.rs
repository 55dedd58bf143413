//! Two OVN chassis on one provider segment, as two OVN-Kubernetes nodes
//! of one cluster are: one OVN central (the northbound and southbound
//! databases and `ovn-northd`), and per node its own `ovsdb-server`,
//! `ovs-vswitchd` (userspace datapath) and `ovn-controller` with a
//! chassis name of its own, in a namespace of its own with run, database
//! and log directories of its own (an `ovs-vswitchd` keeps its bridges'
//! management sockets in its run directory, so two never share one).
//!
//! ```text
//!        node-a netns                                   node-b netns
//!  pods ── br-int ─patch─ br-phys ── eth1        eth1 ── br-phys ─patch─ br-int ── pods
//!            │                        │            │                        │
//!          geneve ── br-tun ── gnv0 ══╪════════════╪══ gnv0 ── br-tun ── geneve
//!                  172.31.0.1/24      │            │     172.31.0.2/24
//!          mgmt0 10.98.0.1/24 ════════╪════════════╪══ mgmt0 10.98.0.2/24
//!                                     pa ─ s0 ─ pb   (segment netns: Linux bridge
//!                                    192.0.2.1/24     s0, the DHCP server's)
//! ```
//!
//! Each node's `ovn-encap-ip` is the address of its `br-tun` (a netdev
//! bridge whose port is one end of a veth between the nodes): the
//! userspace datapath sends Geneve by its own route table (learned from the
//! node's kernel routes) and its own ARP cache, out of the bridge that
//! holds the route. Both provider bridges map `physnet1` and their `eth1`
//! are ports of the segment's bridge `s0`, where the server is: a localnet
//! port's traffic leaves each node on its own `eth1`, as on real nodes.
//! `mgmt0` is a plain kernel link for what is not OVS's (the stand-in API
//! server one node's agent serves the other).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use xdhcp_testbed::ovn;

use super::{OvnLab, OvnPod, checksum_offload_off, env, ovn_installed, strs};
use crate::netns::{Bridge, NetNs, Veth, format_mac, netns_exec, run};
use crate::program;
use crate::servers::{Process, wait_until};

const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The bridge of each node's tunnel endpoint.
pub const TUNNEL_BRIDGE: &str = "br-tun";

/// One node of [`TwoNodes`].
#[derive(Debug)]
pub struct OvnNode {
    /// Where the node's `ovs-vswitchd`, `ovn-controller` (and agent) run.
    pub ns: NetNs,
    /// The chassis name (`external_ids:system-id`): the Kubernetes node name.
    pub chassis: String,
    /// The node's Geneve endpoint (`ovn-encap-ip`).
    pub encap_ip: Ipv4Addr,
    /// The node's address on `mgmt0`.
    pub mgmt_ip: Ipv4Addr,
    pods: Vec<OvnPod>,
    dir: PathBuf,
}

impl OvnNode {
    /// The node's `Open_vSwitch` database socket.
    pub fn db_socket(&self) -> PathBuf {
        self.dir.join("db.sock")
    }

    /// The node's directory (its databases, sockets and logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn env(&self, cmd: &mut Command) {
        env(cmd, &self.dir);
    }

    /// `ovs-vsctl --no-wait` on the node's database; returns stdout.
    #[track_caller]
    pub fn vsctl(&self, args: &[&str]) -> String {
        super::vsctl(&self.dir, &self.db_socket(), args)
    }

    #[track_caller]
    fn vsctl_owned(&self, args: &[String]) -> String {
        self.vsctl(&strs(args))
    }

    /// `ovs-appctl` on the node's `ovs-vswitchd`; stdout, empty when it
    /// fails.
    pub fn appctl(&self, args: &[&str]) -> String {
        let mut cmd = Command::new(program("ovs-appctl"));
        self.env(&mut cmd);
        let out = cmd
            .arg(format!(
                "--target={}",
                self.dir.join("ovs-vswitchd.ctl").display()
            ))
            .args(args)
            .output();
        match out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
            _ => String::new(),
        }
    }

    /// The log of daemon `name` of the node (empty if none yet).
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// The node's pods, in the order they were added.
    pub fn pods(&self) -> &[OvnPod] {
        &self.pods
    }

    /// The `remote_ip` of each Geneve port ovn-controller made on `br-int`.
    pub fn geneve_remotes(&self) -> Vec<String> {
        self.vsctl(&[
            "--bare",
            "--columns=options",
            "find",
            "interface",
            "type=geneve",
        ])
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|kv| kv.strip_prefix("remote_ip="))
                .map(|ip| ip.trim_matches('"').to_owned())
        })
        .collect()
    }
}

/// The lab: see the module documentation. Dropping it stops the daemons
/// (newest first) and removes the namespaces and the directory, also when
/// the test fails.
#[derive(Debug)]
pub struct TwoNodes {
    /// `node-a` and `node-b`.
    pub nodes: [OvnNode; 2],
    /// The provider segment: bridge [`OvnLab::SERVER_IF`] at
    /// [`OvnLab::SERVER_IP`]/24, where the DHCP server runs.
    pub segment: NetNs,
    overlay: Vec<NetNs>,
    links: Vec<Veth>,
    _bridge: Bridge,
    daemons: Vec<Process>,
    dir: tempfile::TempDir,
}

impl TwoNodes {
    pub const NODES: [&'static str; 2] = ["node-a", "node-b"];

    /// Starts the central, both nodes and their links, and the localnet
    /// switch ([`OvnLab::LOGICAL_SWITCH`] with its localnet port); waits
    /// until each chassis has a Geneve port to the other.
    #[track_caller]
    pub fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("xdt-ovn2-")
            .tempdir()
            .expect("tempdir");
        let segment = NetNs::new();
        let bridge = Bridge::new(&segment, OvnLab::SERVER_IF);
        let mut links = Vec::new();
        let mut nodes = Vec::new();
        for (i, name) in Self::NODES.iter().enumerate() {
            let node_dir = dir.path().join(name);
            std::fs::create_dir(&node_dir).expect("node directory");
            let ns = NetNs::new();
            let peer = format!("p{i}");
            links.push(Veth::new(&ns, OvnLab::UPLINK, &segment, &peer));
            checksum_offload_off(&ns, OvnLab::UPLINK);
            checksum_offload_off(&segment, &peer);
            bridge.attach(&peer);
            let n = u8::try_from(i + 1).expect("two nodes");
            nodes.push(OvnNode {
                ns,
                chassis: (*name).to_owned(),
                encap_ip: Ipv4Addr::new(172, 31, 0, n),
                mgmt_ip: Ipv4Addr::new(10, 98, 0, n),
                pods: Vec::new(),
                dir: node_dir,
            });
        }
        segment.add_addr(OvnLab::SERVER_IF, OvnLab::SERVER_IP, 24);
        let [a, b]: [OvnNode; 2] = nodes.try_into().expect("two nodes");
        for (ifname, n) in [("gnv0", 0), ("mgmt0", 1)] {
            links.push(Veth::new(&a.ns, ifname, &b.ns, ifname));
            checksum_offload_off(&a.ns, ifname);
            checksum_offload_off(&b.ns, ifname);
            if n == 1 {
                a.ns.add_addr(ifname, a.mgmt_ip, 24);
                b.ns.add_addr(ifname, b.mgmt_ip, 24);
            }
        }
        let central = dir.path().join("central");
        std::fs::create_dir(&central).expect("central directory");
        let mut lab = Self {
            nodes: [a, b],
            segment,
            overlay: Vec::new(),
            links,
            _bridge: bridge,
            daemons: Vec::new(),
            dir,
        };
        for (db, schema) in [("ovnnb", "ovn-nb.ovsschema"), ("ovnsb", "ovn-sb.ovsschema")] {
            lab.ovsdb_server(&central, db, schema, &central.join(format!("{db}.sock")));
        }
        let mut northd = Command::new(program("ovn-northd"));
        northd
            .arg(format!(
                "--ovnnb-db=unix:{}",
                central.join("ovnnb.sock").display()
            ))
            .arg(format!(
                "--ovnsb-db=unix:{}",
                central.join("ovnsb.sock").display()
            ))
            .arg(format!(
                "--unixctl={}",
                central.join("ovn-northd.ctl").display()
            ));
        lab.daemon(&central, "ovn-northd", northd);
        for i in 0..2 {
            lab.start_node(i);
        }
        lab.nbctl(&["ls-add", OvnLab::LOGICAL_SWITCH]);
        lab.nbctl_owned(&ovn::localnet_port_args(
            OvnLab::LOGICAL_SWITCH,
            OvnLab::LOCALNET_PORT,
            OvnLab::PHYSNET,
        ));
        for i in 0..2 {
            let (node, other) = (&lab.nodes[i], &lab.nodes[1 - i]);
            let want = other.encap_ip.to_string();
            assert!(
                wait_until(READY_TIMEOUT, || node.geneve_remotes().contains(&want)),
                "{} has no Geneve port to {want}: {:?}\n{}",
                node.chassis,
                node.geneve_remotes(),
                node.log("ovn-controller")
            );
        }
        lab
    }

    /// One node's database, switch, bridges, tunnel endpoint and
    /// controller.
    #[track_caller]
    fn start_node(&mut self, i: usize) {
        let dir = self.nodes[i].dir.clone();
        let sock = self.nodes[i].db_socket();
        self.ovsdb_server(&dir, "conf", "vswitch.ovsschema", &sock);
        let node = &self.nodes[i];
        node.vsctl(&["init"]);
        let mut vswitchd = netns_exec(node.ns.name(), program("ovs-vswitchd"));
        vswitchd
            .arg(format!("unix:{}", sock.display()))
            .arg("--disable-system")
            .arg(format!(
                "--unixctl={}",
                dir.join("ovs-vswitchd.ctl").display()
            ));
        let ns_name = node.ns.name().to_owned();
        self.daemon(&dir, "ovs-vswitchd", vswitchd);
        let node = &self.nodes[i];
        for bridge in [
            ovn::INTEGRATION_BRIDGE,
            OvnLab::PROVIDER_BRIDGE,
            TUNNEL_BRIDGE,
        ] {
            node.vsctl_owned(&ovn::add_bridge_args(bridge, "netdev"));
        }
        node.vsctl(&["add-port", TUNNEL_BRIDGE, "gnv0"]);
        node.vsctl(&["add-port", OvnLab::PROVIDER_BRIDGE, OvnLab::UPLINK]);
        // The bridge's own interface holds the endpoint: the userspace
        // datapath routes Geneve out of the bridge with the route.
        assert!(
            wait_until(READY_TIMEOUT, || node.ns.has_link(TUNNEL_BRIDGE)),
            "{TUNNEL_BRIDGE} did not appear: {}",
            node.log("ovs-vswitchd")
        );
        node.ns.add_addr(TUNNEL_BRIDGE, node.encap_ip, 24);
        node.ns.link_up(TUNNEL_BRIDGE);
        let central = self.dir.path().join("central");
        node.vsctl_owned(&ovn::node_settings_args(
            &node.chassis,
            &format!("unix:{}", central.join("ovnsb.sock").display()),
            &format!("{}:{}", OvnLab::PHYSNET, OvnLab::PROVIDER_BRIDGE),
        ));
        node.vsctl(&[
            "set",
            "open_vswitch",
            ".",
            &format!("external_ids:ovn-encap-ip={}", node.encap_ip),
            &format!("external_ids:hostname={}", node.chassis),
        ]);
        let mut controller = netns_exec(&ns_name, program("ovn-controller"));
        controller.arg(format!("unix:{}", sock.display()));
        self.daemon(&dir, "ovn-controller", controller);
    }

    /// Starts `ovsdb-server` on `<dir>/<db>.db` (created from `schema`),
    /// serving `sock`, and waits for it.
    #[track_caller]
    fn ovsdb_server(&mut self, dir: &Path, db: &str, schema: &str, sock: &Path) {
        let file = dir.join(format!("{db}.db"));
        run(Command::new(program("ovsdb-tool"))
            .arg("create")
            .arg(&file)
            .arg(program(schema)));
        let mut cmd = Command::new(program("ovsdb-server"));
        cmd.arg(&file)
            .arg(format!("--remote=punix:{}", sock.display()))
            .arg(format!(
                "--unixctl={}",
                dir.join(format!("{db}.ctl")).display()
            ));
        self.daemon(dir, db, cmd);
        assert!(
            wait_until(READY_TIMEOUT, || std::os::unix::net::UnixStream::connect(
                sock
            )
            .is_ok()),
            "ovsdb-server ({db}) did not open {}",
            sock.display()
        );
    }

    /// Starts a daemon with `dir` as every OVS and OVN directory, its
    /// pidfile and log there.
    #[track_caller]
    fn daemon(&mut self, dir: &Path, name: &str, mut cmd: Command) {
        env(&mut cmd, dir);
        cmd.arg(format!(
            "--pidfile={}",
            dir.join(format!("{name}.pid")).display()
        ))
        .arg("--no-chdir")
        .arg(format!(
            "--log-file={}",
            dir.join(format!("{name}.log")).display()
        ));
        let stderr = dir.join(format!("{name}.stderr"));
        let mut p = Process::spawn_logged(name, cmd, &stderr);
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            p.is_running(),
            "{name} ({}) exited: {}",
            dir.display(),
            std::fs::read_to_string(&stderr).unwrap_or_default()
        );
        self.daemons.push(p);
    }

    /// The central's directory (northbound and southbound sockets).
    pub fn central_dir(&self) -> PathBuf {
        self.dir.path().join("central")
    }

    /// `ovn-nbctl` on the northbound database; returns stdout.
    #[track_caller]
    pub fn nbctl(&self, args: &[&str]) -> String {
        super::nbctl(&self.central_dir(), args)
    }

    #[track_caller]
    fn nbctl_owned(&self, args: &[String]) -> String {
        self.nbctl(&strs(args))
    }

    /// Adds a pod on node `node`'s `br-int` as OVN-Kubernetes' CNI does
    /// for a secondary localnet network (as [`OvnLab::add_pod`]), its
    /// logical port bound to that node (`options:requested-chassis`, as
    /// ovnkube-controller sets it to the pod's node) and its UID `uid`;
    /// waits until the node's ovn-controller has wired it.
    #[track_caller]
    pub fn add_pod(&mut self, node: usize, pod: &str, uid: &str, mac: [u8; 6]) -> &OvnPod {
        let central = self.central_dir();
        let chassis = self.nodes[node].chassis.clone();
        let n = self.nodes[node].pods.len();
        let ns = NetNs::new();
        let sandbox = ovn::sandbox_id(n + 16 * node);
        let host_ifname = ovn::host_ifname(&sandbox, n + 3);
        let ifname = "eth0".to_owned();
        let at = &self.nodes[node];
        let veth = Veth::with_mac(&at.ns, &host_ifname, &ns, &ifname, mac);
        checksum_offload_off(&at.ns, &host_ifname);
        checksum_offload_off(&ns, &ifname);
        let iface_id = ovn::logical_port(OvnLab::NAD, "lab-ns", pod);
        let mac_text = format_mac(mac);
        let port = ovn::PodPort {
            host_ifname: &host_ifname,
            iface_id: &iface_id,
            uid,
            mac: &mac_text,
            sandbox: &sandbox,
            pod_if_name: &ifname,
            nad: OvnLab::NAD,
        };
        let mut args = port.lsp_add_args(OvnLab::LOGICAL_SWITCH);
        args.push(format!("options:requested-chassis={chassis}"));
        self.nbctl_owned(&args);
        at.vsctl_owned(&port.add_port_args());
        let installed = ovn_installed(|a| at.vsctl(a), &host_ifname);
        assert!(
            installed,
            "{chassis}'s ovn-controller did not wire {host_ifname} in {READY_TIMEOUT:?}: {}\n{}",
            at.log("ovn-controller"),
            central.display()
        );
        let node = &mut self.nodes[node];
        node.pods.push(OvnPod {
            ns,
            ifname,
            host_ifname,
            mac,
            iface_id,
            uid: uid.to_owned(),
            sandbox,
            _veth: veth,
        });
        &node.pods[n]
    }

    /// Removes pod `index` of node `node` from its `br-int`, as
    /// OVN-Kubernetes' CNI does at DEL; its veth stays.
    #[track_caller]
    pub fn remove_pod_port(&self, node: usize, index: usize) {
        let at = &self.nodes[node];
        at.vsctl(&[
            "del-port",
            ovn::INTEGRATION_BRIDGE,
            &at.pods[index].host_ifname,
        ]);
    }

    /// Shows that the Geneve tunnel carries traffic: a logical switch of
    /// its own with no localnet port (an overlay: its only path between
    /// the chassis is the tunnel), a port on each node (10.77.0.1 and
    /// .2), and a ping from node A's to node B's. Whether it answered.
    #[track_caller]
    pub fn overlay_ping(&mut self) -> bool {
        const SWITCH: &str = "overlay1";
        self.nbctl(&["ls-add", SWITCH]);
        for i in 0..2 {
            let n = u8::try_from(i + 1).expect("two nodes");
            let mac = [0x02, 0x77, 0, 0, 0, n];
            let lsp = format!("overlay-{n}");
            let ns = NetNs::new();
            let host = format!("ovl{n}_h");
            let at = &self.nodes[i];
            let link = Veth::with_mac(&at.ns, &host, &ns, "eth0", mac);
            checksum_offload_off(&at.ns, &host);
            checksum_offload_off(&ns, "eth0");
            ns.add_addr("eth0", Ipv4Addr::new(10, 77, 0, n), 24);
            let addresses = format!("{} 10.77.0.{n}", format_mac(mac));
            self.nbctl(&[
                "lsp-add",
                SWITCH,
                &lsp,
                "--",
                "lsp-set-addresses",
                &lsp,
                &addresses,
            ]);
            at.vsctl(&[
                "add-port",
                ovn::INTEGRATION_BRIDGE,
                &host,
                "--",
                "set",
                "interface",
                &host,
                &format!("external_ids:iface-id={lsp}"),
            ]);
            let installed = ovn_installed(|a| at.vsctl(a), &host);
            assert!(
                installed,
                "{host} was not wired: {}",
                at.log("ovn-controller")
            );
            self.overlay.push(ns);
            self.links.push(link);
        }
        self.overlay[0]
            .command("busybox")
            .args(["ping", "-c", "2", "-W", "2", "10.77.0.2"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for TwoNodes {
    fn drop(&mut self) {
        while let Some(mut p) = self.daemons.pop() {
            p.stop(Duration::from_secs(2));
        }
    }
}
