//! An OVS + OVN node lab, wired like an OVN-Kubernetes node with a localnet
//! network: `ovsdb-server` (the node's `Open_vSwitch` database), the OVN
//! northbound and southbound databases, `ovn-northd`, `ovs-vswitchd` and
//! `ovn-controller`, every one with run, database and log directories of the
//! lab's own (a temporary directory, also in `OVS_RUNDIR`/`OVS_DBDIR`/
//! `OVS_LOGDIR`/`OVN_RUNDIR`/…, so nothing reaches the host's).
//!
//! ```text
//!  pod netns               node netns (ovs-vswitchd, ovn-controller)        server netns
//!  eth0 ──veth── <host if> on br-int ─patch─ br-phys ── eth1 ──veth── s0 (192.0.2.1, dnsmasq)
//! ```
//!
//! By default ([`OvnLab::start`]) the bridges use the userspace datapath
//! (`datapath_type=netdev`; a host without the openvswitch kernel module
//! has no other) and `eth1` is a veth to the server's namespace.
//! [`OvnLab::start_with`] takes the kernel datapath (`datapath_type=system`,
//! the module is loaded first) and real NICs instead of that veth
//! ([`LabLink::Nics`]: moved into the node and server namespaces and renamed
//! `eth1` and `s0`, so everything else is the same). `br-int` is the integration
//! bridge; `ovn-bridge-mappings=physnet1:br-phys` maps the localnet's
//! physical network to the provider bridge, whose port `eth1` is the
//! node's "NIC". The logical switch has a localnet port (`type=localnet`,
//! `addresses=unknown`, `network_name=physnet1`), so ovn-controller adds the
//! patch ports between the bridges. Each pod is a namespace whose `eth0` is
//! a veth to a `br-int` port carrying the `external_ids` OVN-Kubernetes'
//! CNI writes, bound to a logical port with the pod's MAC (MAC only, as for
//! DHCP).
//!
//! Dropping the lab stops the daemons (newest first) and removes the
//! namespaces and the directory, also when the test fails.
//!
//! Two nodes under one OVN central, Geneve between them: [`two_nodes`].

pub mod flood;
pub mod two_nodes;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use xdhcp_testbed::ovn;

use crate::netns::{NetNs, Veth, format_mac, netns_exec, run};
use crate::program;
use crate::servers::{Process, wait_until};

/// How long the daemons get to come up and wire a port.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The datapath of the lab's bridges (`Bridge.datapath_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LabDatapath {
    /// `netdev`: `ovs-vswitchd` switches in userspace, reading its ports
    /// through packet sockets.
    #[default]
    Netdev,
    /// `system`: the openvswitch kernel module switches; `ovs-vswitchd`
    /// programs it over netlink.
    System,
}

impl LabDatapath {
    /// The `datapath_type` value.
    pub fn ovs_name(self) -> &'static str {
        match self {
            Self::Netdev => "netdev",
            Self::System => "system",
        }
    }
}

/// What links the provider bridge's port to the server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LabLink {
    /// A veth pair between the node and server namespaces.
    #[default]
    Veth,
    /// Two NICs of the initial namespace on one wire (for example the
    /// VM tier's two virtio-net NICs on one qemu hub), named by MAC:
    /// `uplink` becomes the node's `eth1`, `server` the server's `s0`.
    /// Deleting the namespaces gives them back to the initial one.
    Nics { uplink: [u8; 6], server: [u8; 6] },
}

/// How [`OvnLab::start_with`] builds the lab.
#[derive(Debug, Clone, Copy, Default)]
pub struct OvnLabOptions {
    pub datapath: LabDatapath,
    pub link: LabLink,
}

/// The link between the node and the server, kept for the lab's lifetime.
#[derive(Debug)]
enum UplinkLink {
    Veth(#[expect(dead_code, reason = "held for its Drop")] Veth),
    /// Moved NICs: the namespaces' deletion hands them back.
    Nics,
}

/// A pod of the lab.
#[derive(Debug)]
pub struct OvnPod {
    /// The pod's namespace.
    pub ns: NetNs,
    /// The pod's interface (in [`OvnPod::ns`]).
    pub ifname: String,
    /// The host end of its veth: a port of `br-int` (in the node namespace).
    pub host_ifname: String,
    pub mac: [u8; 6],
    /// The logical switch port (`external_ids:iface-id`).
    pub iface_id: String,
    /// The pod UID (`external_ids:iface-id-ver`).
    pub uid: String,
    /// The sandbox id (`external_ids:sandbox`): the CNI container id of
    /// the pod's ADD.
    pub sandbox: String,
    _veth: Veth,
}

/// A DHCP server's port on the logical switch itself ([`OvnLab::add_server_port`]).
#[derive(Debug)]
pub struct OvnServerPort {
    /// The server's namespace, its interface [`OvnLab::SERVER_IF`] at
    /// [`OvnLab::SERVER_IP`].
    pub ns: NetNs,
    /// The host end of its veth: a port of `br-int`.
    pub host_ifname: String,
    _veth: Veth,
}

/// The lab: see the module documentation.
#[derive(Debug)]
pub struct OvnLab {
    /// Where `ovs-vswitchd` and `ovn-controller` run: the node's
    /// interfaces (`eth1`, the pods' host ends, the bridges' own ports).
    pub node: NetNs,
    /// The DHCP server's namespace, behind the provider bridge.
    pub server: NetNs,
    pods: Vec<OvnPod>,
    server_ports: Vec<OvnServerPort>,
    datapath: LabDatapath,
    _uplink: UplinkLink,
    /// The links of providers added at run time ([`OvnLab::add_provider`]).
    providers: Vec<Veth>,
    /// Stopped newest first on drop.
    daemons: Vec<Process>,
    dir: tempfile::TempDir,
}

impl OvnLab {
    pub const INTEGRATION_BRIDGE: &'static str = ovn::INTEGRATION_BRIDGE;
    pub const PROVIDER_BRIDGE: &'static str = "br-phys";
    pub const PHYSNET: &'static str = "physnet1";
    /// The provider bridge's NIC (in the node namespace).
    pub const UPLINK: &'static str = "eth1";
    /// The server's end of the uplink (in the server namespace).
    pub const SERVER_IF: &'static str = "s0";
    pub const SERVER_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
    pub const LOGICAL_SWITCH: &'static str = "localnet1";
    pub const LOCALNET_PORT: &'static str = "localnet1_ovn_localnet_port";
    /// The NetworkAttachmentDefinition the pods' ports name.
    pub const NAD: &'static str = "lab-ns/localnet1";
    /// The network name OVN-Kubernetes writes for it.
    pub const NETWORK: &'static str = "lab-ns_localnet1";
    pub const CHASSIS: &'static str = "lab-node";

    /// Starts every daemon and builds the bridges (userspace datapath), the
    /// logical switch and the server's link (a veth); panics (with the
    /// daemons' logs left in place until drop) if something does not come
    /// up.
    #[track_caller]
    pub fn start() -> Self {
        Self::start_with(OvnLabOptions::default())
    }

    /// [`OvnLab::start`] with the datapath and the server's link of
    /// `options`.
    #[track_caller]
    pub fn start_with(options: OvnLabOptions) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("xdt-ovnlab-")
            .tempdir()
            .expect("tempdir");
        if options.datapath == LabDatapath::System {
            // ovs-vswitchd does not load the module itself (ovs-ctl does).
            run(Command::new(program("modprobe")).arg("openvswitch"));
        }
        let node = NetNs::new();
        let server = NetNs::new();
        let uplink = match options.link {
            LabLink::Veth => {
                UplinkLink::Veth(Veth::new(&node, Self::UPLINK, &server, Self::SERVER_IF))
            }
            LabLink::Nics { uplink, server: s } => {
                move_nic(uplink, &node, Self::UPLINK);
                move_nic(s, &server, Self::SERVER_IF);
                UplinkLink::Nics
            }
        };
        if options.datapath == LabDatapath::Netdev {
            checksum_offload_off(&node, Self::UPLINK);
            checksum_offload_off(&server, Self::SERVER_IF);
        }
        server.add_addr(Self::SERVER_IF, Self::SERVER_IP, 24);
        let mut lab = Self {
            node,
            server,
            pods: Vec::new(),
            server_ports: Vec::new(),
            datapath: options.datapath,
            _uplink: uplink,
            providers: Vec::new(),
            daemons: Vec::new(),
            dir,
        };
        for (db, schema) in [
            ("conf", "vswitch.ovsschema"),
            ("ovnnb", "ovn-nb.ovsschema"),
            ("ovnsb", "ovn-sb.ovsschema"),
        ] {
            run(Command::new(program("ovsdb-tool"))
                .arg("create")
                .arg(lab.path(&format!("{db}.db")))
                .arg(program(schema)));
            lab.ovsdb_server(db);
        }
        lab.vsctl(&["init"]);

        lab.start_vswitchd();

        let mut northd = Command::new(program("ovn-northd"));
        northd
            .arg(format!(
                "--ovnnb-db=unix:{}",
                lab.path("ovnnb.sock").display()
            ))
            .arg(format!(
                "--ovnsb-db=unix:{}",
                lab.path("ovnsb.sock").display()
            ));
        lab.daemon("ovn-northd", northd, true);

        lab.configure_node();

        // ovn-controller 23.03 has no --unixctl: its control socket goes
        // to OVN_RUNDIR.
        let mut controller = netns_exec(lab.node.name(), program("ovn-controller"));
        controller.arg(format!("unix:{}", lab.db_socket().display()));
        lab.daemon("ovn-controller", controller, false);

        lab.nbctl(&["ls-add", Self::LOGICAL_SWITCH]);
        lab.nbctl_owned(&ovn::localnet_port_args(
            Self::LOGICAL_SWITCH,
            Self::LOCALNET_PORT,
            Self::PHYSNET,
        ));

        lab.vsctl(&["add-port", Self::PROVIDER_BRIDGE, Self::UPLINK]);
        lab
    }

    /// Starts `ovs-vswitchd` on the node's database. The node's daemons run
    /// in its namespace: the userspace datapath opens the node's interfaces
    /// by name there, the kernel datapath (`ovs-system`) is created there.
    /// `--disable-system`: never touch the kernel datapath when the lab does
    /// not use it.
    #[track_caller]
    fn start_vswitchd(&mut self) {
        let mut vswitchd = netns_exec(self.node.name(), program("ovs-vswitchd"));
        vswitchd.arg(format!("unix:{}", self.db_socket().display()));
        if self.datapath == LabDatapath::Netdev {
            vswitchd.arg("--disable-system");
        }
        self.daemon("ovs-vswitchd", vswitchd, true);
    }

    /// Kills `ovs-vswitchd` and the node's `ovsdb-server` with SIGKILL, as
    /// a crash (or an OOM kill) would: the userspace datapath stops
    /// forwarding and the database socket goes away. The OVN daemons keep
    /// running and reconnect once [`OvnLab::start_ovs`] brings them back.
    #[track_caller]
    pub fn kill_ovs(&mut self) {
        for what in ["ovs-vswitchd", "ovsdb-server (conf)"] {
            let i = self
                .daemons
                .iter()
                .position(|p| p.what() == what)
                .unwrap_or_else(|| panic!("{what} is not running in the lab"));
            self.daemons.remove(i).kill();
        }
    }

    /// Starts the node's `ovsdb-server` and `ovs-vswitchd` again on the
    /// database they left (bridges, ports, mappings and all), and waits
    /// until ovn-controller has put every pod's flows back into `br-int`
    /// (each pod's MAC in its flow table).
    #[track_caller]
    pub fn start_ovs(&mut self) {
        self.ovsdb_server("conf");
        self.start_vswitchd();
        let macs: Vec<String> = self.pods.iter().map(|p| format_mac(p.mac)).collect();
        let rewired = wait_until(READY_TIMEOUT, || {
            let flows = self.ofctl(&["dump-flows", Self::INTEGRATION_BRIDGE]);
            macs.iter().all(|m| flows.contains(m.as_str()))
        });
        assert!(
            rewired,
            "ovn-controller did not rewire br-int in {READY_TIMEOUT:?}: {}",
            self.log("ovn-controller")
        );
    }

    /// `ovs-ofctl` on the node's `ovs-vswitchd`; stdout, empty when it
    /// fails (the switch not up yet).
    pub fn ofctl(&self, args: &[&str]) -> String {
        let mut cmd = Command::new(program("ovs-ofctl"));
        self.env(&mut cmd);
        let out = cmd.args(args).output();
        match out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
            _ => String::new(),
        }
    }

    /// The node's bridges (on the lab's datapath) and the `Open_vSwitch`
    /// row's OVN settings: chassis name, southbound database, encapsulation
    /// and the bridge mapping of the localnet's physical network.
    #[track_caller]
    fn configure_node(&self) {
        let datapath = self.datapath.ovs_name();
        self.vsctl_owned(&ovn::add_bridge_args(Self::INTEGRATION_BRIDGE, datapath));
        self.vsctl_owned(&ovn::add_bridge_args(Self::PROVIDER_BRIDGE, datapath));
        self.vsctl_owned(&ovn::node_settings_args(
            Self::CHASSIS,
            &format!("unix:{}", self.path("ovnsb.sock").display()),
            &format!("{}:{}", Self::PHYSNET, Self::PROVIDER_BRIDGE),
        ));
    }

    /// The lab directory's `name`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The node's `Open_vSwitch` database socket.
    pub fn db_socket(&self) -> PathBuf {
        self.path("db.sock")
    }

    /// The environment every OVS and OVN program of the lab gets: its
    /// directories are the lab's.
    fn env(&self, cmd: &mut Command) {
        env(cmd, self.dir.path());
    }

    /// Starts `ovsdb-server` on `<db>.db`, serving `<db>.sock`
    /// (`conf` serves the node's database on `db.sock`), and waits for it.
    #[track_caller]
    fn ovsdb_server(&mut self, db: &str) {
        let sock = if db == "conf" {
            self.db_socket()
        } else {
            self.path(&format!("{db}.sock"))
        };
        let mut cmd = Command::new(program("ovsdb-server"));
        cmd.arg(self.path(&format!("{db}.db")))
            .arg(format!("--remote=punix:{}", sock.display()))
            .arg(format!(
                "--unixctl={}",
                self.path(&format!("{db}.ctl")).display()
            ));
        let what = format!("ovsdb-server ({db})");
        self.daemon_named(&what, db, cmd, false);
        assert!(
            wait_until(READY_TIMEOUT, || std::os::unix::net::UnixStream::connect(
                &sock
            )
            .is_ok()),
            "{what} did not open {}: {}",
            sock.display(),
            self.log(db)
        );
    }

    /// Starts a daemon with the lab's environment, `--pidfile`, `--no-chdir`
    /// and `--log-file` in the lab directory (and `--unixctl` there when
    /// `unixctl`).
    #[track_caller]
    fn daemon(&mut self, what: &str, cmd: Command, unixctl: bool) {
        let mut cmd = cmd;
        if unixctl {
            cmd.arg(format!(
                "--unixctl={}",
                self.path(&format!("{what}.ctl")).display()
            ));
        }
        self.daemon_named(what, what, cmd, true);
    }

    #[track_caller]
    fn daemon_named(&mut self, what: &str, name: &str, mut cmd: Command, check: bool) {
        self.env(&mut cmd);
        cmd.arg(format!(
            "--pidfile={}",
            self.path(&format!("{name}.pid")).display()
        ))
        .arg("--no-chdir")
        .arg(format!(
            "--log-file={}",
            self.path(&format!("{name}.log")).display()
        ));
        let stderr = self.path(&format!("{name}.stderr"));
        let mut p = Process::spawn_logged(what, cmd, &stderr);
        if check {
            std::thread::sleep(Duration::from_millis(100));
            assert!(
                p.is_running(),
                "{what} exited: {}{}",
                std::fs::read_to_string(&stderr).unwrap_or_default(),
                self.log(name)
            );
        }
        self.daemons.push(p);
    }

    /// The log of daemon `name` (empty if none yet).
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(&format!("{name}.log"))).unwrap_or_default()
    }

    /// `ovs-vsctl --no-wait` on the node's database; returns stdout.
    #[track_caller]
    pub fn vsctl(&self, args: &[&str]) -> String {
        vsctl(self.dir.path(), &self.db_socket(), args)
    }

    /// `ovn-nbctl` on the northbound database; returns stdout.
    #[track_caller]
    pub fn nbctl(&self, args: &[&str]) -> String {
        nbctl(self.dir.path(), args)
    }

    #[track_caller]
    fn vsctl_owned(&self, args: &[String]) -> String {
        self.vsctl(&strs(args))
    }

    #[track_caller]
    fn nbctl_owned(&self, args: &[String]) -> String {
        self.nbctl(&strs(args))
    }

    /// Adds a pod on the localnet as OVN-Kubernetes' CNI does for a
    /// secondary network: a namespace whose `eth0` (MAC `mac`) is a veth to
    /// a `br-int` port with the pod's `external_ids`, and a logical switch
    /// port with the MAC only; waits until ovn-controller has wired it
    /// (`external_ids:ovn-installed`).
    #[track_caller]
    pub fn add_pod(&mut self, pod: &str, mac: [u8; 6]) -> &OvnPod {
        let n = self.pods.len();
        let ns = NetNs::new();
        let sandbox = ovn::sandbox_id(n);
        let host_ifname = ovn::host_ifname(&sandbox, n + 3);
        let ifname = "eth0".to_owned();
        let veth = Veth::with_mac(&self.node, &host_ifname, &ns, &ifname, mac);
        if self.datapath == LabDatapath::Netdev {
            checksum_offload_off(&self.node, &host_ifname);
            checksum_offload_off(&ns, &ifname);
        }
        let iface_id = ovn::logical_port(Self::NAD, "lab-ns", pod);
        let uid = format!("00000000-0000-4000-8000-{:012x}", n + 1);
        let mac_text = format_mac(mac);
        let port = ovn::PodPort {
            host_ifname: &host_ifname,
            iface_id: &iface_id,
            uid: &uid,
            mac: &mac_text,
            sandbox: &sandbox,
            pod_if_name: &ifname,
            nad: Self::NAD,
        };
        self.nbctl_owned(&port.lsp_add_args(Self::LOGICAL_SWITCH));
        self.vsctl_owned(&port.add_port_args());
        let installed = ovn_installed(|a| self.vsctl(a), &host_ifname);
        assert!(
            installed,
            "ovn-controller did not wire {host_ifname} in {READY_TIMEOUT:?}: {}",
            self.log("ovn-controller")
        );
        self.pods.push(OvnPod {
            ns,
            ifname,
            host_ifname,
            mac,
            iface_id,
            uid,
            sandbox,
            _veth: veth,
        });
        &self.pods[n]
    }

    /// Adds a DHCP server as a workload of the node, on the logical switch
    /// itself: a namespace whose [`OvnLab::SERVER_IF`] (MAC `mac`,
    /// [`OvnLab::SERVER_IP`]/24) is a veth to a `br-int` port bound to a
    /// logical switch port with that MAC. The port carries `iface-id`
    /// alone, no pod identity: it is of no network the agent serves (a
    /// server the guard would police otherwise). With the bridge mappings
    /// cleared ([`OvnLab::set_bridge_mappings`] with `""`), the pods reach
    /// this server only, over `br-int`, and the node has no uplink. Waits
    /// until ovn-controller has wired it.
    #[track_caller]
    pub fn add_server_port(&mut self, mac: [u8; 6]) -> &OvnServerPort {
        let n = self.server_ports.len();
        let ns = NetNs::new();
        let host_ifname = format!("srv{n}_h");
        let veth = Veth::with_mac(&self.node, &host_ifname, &ns, Self::SERVER_IF, mac);
        if self.datapath == LabDatapath::Netdev {
            checksum_offload_off(&self.node, &host_ifname);
            checksum_offload_off(&ns, Self::SERVER_IF);
        }
        ns.add_addr(Self::SERVER_IF, Self::SERVER_IP, 24);
        let lsp = format!("lab-server-{n}");
        let mac_text = format_mac(mac);
        self.nbctl(&[
            "lsp-add",
            Self::LOGICAL_SWITCH,
            &lsp,
            "--",
            "lsp-set-addresses",
            &lsp,
            &mac_text,
        ]);
        self.vsctl(&[
            "add-port",
            Self::INTEGRATION_BRIDGE,
            &host_ifname,
            "--",
            "set",
            "interface",
            &host_ifname,
            &format!("external_ids:iface-id={lsp}"),
        ]);
        let installed = ovn_installed(|a| self.vsctl(a), &host_ifname);
        assert!(
            installed,
            "ovn-controller did not wire {host_ifname} in {READY_TIMEOUT:?}: {}",
            self.log("ovn-controller")
        );
        self.server_ports.push(OvnServerPort {
            ns,
            host_ifname,
            _veth: veth,
        });
        &self.server_ports[n]
    }

    /// Removes pod `index`'s port from `br-int`, as OVN-Kubernetes' CNI
    /// does at DEL; its veth stays.
    #[track_caller]
    pub fn remove_pod_port(&self, index: usize) {
        let host_ifname = &self.pods[index].host_ifname;
        self.vsctl(&["del-port", Self::INTEGRATION_BRIDGE, host_ifname]);
    }

    /// Adds a provider bridge for a second physical network, as an
    /// operator would at run time: `bridge` (the lab's datapath) whose port
    /// `nic` (in the node namespace) is a veth to `server_if` in the
    /// server's namespace. Not mapped yet: see
    /// [`OvnLab::set_bridge_mappings`].
    #[track_caller]
    pub fn add_provider_bridge(&mut self, bridge: &str, nic: &str, server_if: &str) {
        let veth = Veth::new(&self.node, nic, &self.server, server_if);
        if self.datapath == LabDatapath::Netdev {
            checksum_offload_off(&self.node, nic);
            checksum_offload_off(&self.server, server_if);
        }
        self.providers.push(veth);
        let datapath_type = format!("datapath_type={}", self.datapath.ovs_name());
        self.vsctl(&[
            "add-br",
            bridge,
            "--",
            "set",
            "bridge",
            bridge,
            &datapath_type,
            "--",
            "add-port",
            bridge,
            nic,
        ]);
    }

    /// `external_ids:ovn-bridge-mappings` of the node.
    #[track_caller]
    pub fn bridge_mappings(&self) -> String {
        self.vsctl(&[
            "get",
            "open_vswitch",
            ".",
            "external_ids:ovn-bridge-mappings",
        ])
        .trim()
        .trim_matches('"')
        .to_owned()
    }

    /// Sets `external_ids:ovn-bridge-mappings` (`physnet:bridge,…`).
    #[track_caller]
    pub fn set_bridge_mappings(&self, mappings: &str) {
        self.vsctl(&[
            "set",
            "open_vswitch",
            ".",
            &format!("external_ids:ovn-bridge-mappings=\"{mappings}\""),
        ]);
    }

    /// Sets `ovn-bridge-mappings` as [`OvnLab::set_bridge_mappings`] does,
    /// in one OVSDB transaction sent from this process, and returns when
    /// it was sent: no `ovs-vsctl` to start first (under the VM tier's
    /// software emulation that alone takes over half a second), so what
    /// follows the change can be timed from the change itself. Returns
    /// once the database has committed it.
    #[track_caller]
    pub fn set_bridge_mappings_now(&self, mappings: &str) -> std::time::Instant {
        let sock = self.db_socket();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let op = serde_json::json!({
            "op": "mutate",
            "table": "Open_vSwitch",
            "where": [],
            "mutations": [
                ["external_ids", "delete", ["set", ["ovn-bridge-mappings"]]],
                ["external_ids", "insert", ["map", [["ovn-bridge-mappings", mappings]]]],
            ],
        });
        let (sent, reply) = rt.block_on(async {
            let (client, _events) = xdhcp_ovsdb::Client::connect(&sock)
                .await
                .expect("connect to the lab's database");
            let sent = std::time::Instant::now();
            let reply = client
                .call("transact", serde_json::json!([xdhcp_ovsdb::VSWITCH_DB, op]))
                .await
                .expect("the mapping's transaction");
            (sent, reply)
        });
        let results = reply.as_array().expect("transact results");
        assert!(
            results.iter().all(|r| r.get("error").is_none()) && results.len() == 1,
            "the mapping's transaction failed: {reply}"
        );
        sent
    }

    /// The datapath of the lab's bridges.
    pub fn datapath(&self) -> LabDatapath {
        self.datapath
    }

    /// The pods, in the order they were added.
    pub fn pods(&self) -> &[OvnPod] {
        &self.pods
    }

    /// The directory of the lab's files (databases, sockets, logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// Moves the initial namespace's interface with `mac` into `ns` as
/// `name`, up. Waits for it: a namespace deleted just before (a previous
/// lab's) hands its NICs back asynchronously, and slowly under emulation.
#[track_caller]
fn move_nic(mac: [u8; 6], ns: &NetNs, name: &str) {
    let mut found = None;
    wait_until(READY_TIMEOUT, || {
        found = netdev_with_mac(mac);
        found.is_some()
    });
    let Some(ifname) = found else {
        panic!(
            "no interface with MAC {} in the initial namespace",
            format_mac(mac)
        );
    };
    run(Command::new(program("ip")).args([
        "link",
        "set",
        "dev",
        &ifname,
        "netns",
        ns.name(),
        "name",
        name,
    ]));
    ns.link_up(name);
}

/// The initial namespace's interface with `mac`, if any.
fn netdev_with_mac(mac: [u8; 6]) -> Option<String> {
    std::fs::read_dir("/sys/class/net")
        .ok()?
        .filter_map(Result::ok)
        .find(|e| {
            std::fs::read_to_string(e.path().join("address"))
                .ok()
                .and_then(|a| crate::netns::parse_mac(a.trim()))
                == Some(mac)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
}

/// Turns tx checksum offload off on `ifname` in `ns`. A veth hands a
/// packet on with its checksum still to be filled in (offloaded); the
/// userspace datapath reads it through a packet socket and sends it on
/// as it is, so the far end gets a bad UDP checksum and drops it. OVS
/// documents this for veths under the userspace datapath. (Measured in
/// this lab: with offload on, `udhcpc` gets no lease.)
#[track_caller]
fn checksum_offload_off(ns: &NetNs, ifname: &str) {
    ns.exec(&["ethtool", "-K", ifname, "tx", "off"]);
}

impl Drop for OvnLab {
    fn drop(&mut self) {
        // The controller and the switch before the databases they use.
        while let Some(mut p) = self.daemons.pop() {
            p.stop(Duration::from_secs(2));
        }
        // Then the pods, the links and the namespaces (fields, in order).
    }
}

/// `ovn::DIR_VARS` (every directory an OVS or OVN program uses) set to the
/// lab directory `dir`.
fn env(cmd: &mut Command, dir: &Path) {
    for var in ovn::DIR_VARS {
        cmd.env(var, dir);
    }
}

/// `ovs-vsctl --no-wait` on database `db` of the lab directory `dir`;
/// returns stdout.
#[track_caller]
fn vsctl(dir: &Path, db: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new(program("ovs-vsctl"));
    env(&mut cmd, dir);
    cmd.arg(format!("--db=unix:{}", db.display()))
        .arg("--no-wait")
        .args(args);
    run(&mut cmd)
}

/// `ovn-nbctl` on the northbound database in the lab directory `dir`;
/// returns stdout.
#[track_caller]
fn nbctl(dir: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new(program("ovn-nbctl"));
    env(&mut cmd, dir);
    cmd.arg(format!("--db=unix:{}", dir.join("ovnnb.sock").display()))
        .args(args);
    run(&mut cmd)
}

/// `args` as the `&str`s the `*ctl` helpers take.
fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// Whether ovn-controller wired `host_ifname` (`ovs-vsctl`, through
/// `vsctl`, finds its `external_ids:ovn-installed`) within
/// [`READY_TIMEOUT`].
fn ovn_installed(vsctl: impl Fn(&[&str]) -> String, host_ifname: &str) -> bool {
    wait_until(READY_TIMEOUT, || {
        vsctl(&[
            "--if-exists",
            "get",
            "interface",
            host_ifname,
            "external_ids:ovn-installed",
        ])
        .trim()
            == "\"true\""
    })
}
