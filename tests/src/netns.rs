//! Network namespace, veth and bridge guards.
//!
//! Everything a test creates lives inside network namespaces named
//! `xdt-<pid>-<n>`; nothing is ever created in the host namespace (veth pairs
//! are created directly inside their namespaces with `ip -n`). Dropping a
//! guard removes what it created, also while a test panics. [`sweep_leftovers`]
//! removes namespaces left behind by test processes that no longer exist.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Once;
use std::sync::atomic::{AtomicU32, Ordering};

/// Prefix of every namespace the harness creates.
pub const PREFIX: &str = "xdt-";

static COUNTER: AtomicU32 = AtomicU32::new(0);
static SWEEP: Once = Once::new();

/// A fresh name `xdt-<pid>-<n>`, unique across parallel tests and processes.
pub fn unique_name() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{PREFIX}{}-{n}", std::process::id())
}

/// Runs `cmd`, returning its output whether or not it succeeded.
///
/// Panics only if the program cannot be started (missing binary): tests must
/// fail loudly when a prerequisite is absent.
#[track_caller]
pub fn output(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (is it installed?)"))
}

/// Runs `cmd` and panics with its stderr unless it exits successfully.
#[track_caller]
pub fn run(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ip <args>` run in the current (test runner's) namespace; only ever used
/// with `-n <our netns>` or `netns` subcommands.
fn ip(args: &[&str]) -> Command {
    let mut cmd = Command::new(crate::program("ip"));
    cmd.args(args);
    cmd
}

/// `ip netns exec <ns> <exe>`: the one place the harness runs a program
/// inside a namespace. `exe` is a table program ([`crate::program`]) or a
/// binary this workspace built.
pub fn netns_exec(ns: &str, exe: &Path) -> Command {
    let mut cmd = ip(&["netns", "exec", ns]);
    cmd.arg(exe);
    cmd
}

/// True if a process with this pid exists.
fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Deletes namespaces named `xdt-<pid>-<n>` whose creating process is gone.
///
/// Only names with our exact prefix and shape are touched; namespaces of test
/// processes that are still running (parallel test binaries) are left alone.
/// Called automatically by [`NetNs::new`] once per process.
pub fn sweep_leftovers() {
    let out = output(&mut ip(&["netns", "list"]));
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some((pid, n)) = rest.split_once('-') else {
            continue;
        };
        let (Ok(pid), Ok(_)) = (pid.parse::<u32>(), n.parse::<u32>()) else {
            continue;
        };
        if pid != std::process::id() && !pid_alive(pid) {
            kill_netns_processes(name);
            let _ = output(&mut ip(&["netns", "del", name]));
        }
    }
}

/// SIGKILLs every process whose network namespace is `name`.
fn kill_netns_processes(name: &str) {
    let out = output(&mut ip(&["netns", "pids", name]));
    for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        if let Ok(pid) = pid.parse::<i32>() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// A named network namespace (`ip netns add`), deleted on drop together with
/// every interface in it; processes still running in it are killed.
#[derive(Debug)]
pub struct NetNs {
    name: String,
    path: PathBuf,
}

impl NetNs {
    /// Creates a namespace with a unique name and brings `lo` up.
    #[track_caller]
    pub fn new() -> Self {
        SWEEP.call_once(sweep_leftovers);
        let name = unique_name();
        run(&mut ip(&["netns", "add", &name]));
        let ns = Self {
            path: PathBuf::from(format!("/var/run/netns/{name}")),
            name,
        };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// Turns IPv6 off in this namespace, for the links created in it from
    /// now on and the ones already there (`net.ipv6.conf.{default,all}.
    /// disable_ipv6`, written from a thread inside the namespace: the
    /// `net` sysctls are the writer's namespace's).
    #[track_caller]
    pub fn disable_ipv6(&self) {
        self.run_in(|| {
            for conf in ["default", "all"] {
                std::fs::write(format!("/proc/sys/net/ipv6/conf/{conf}/disable_ipv6"), "1")
                    .expect("turn IPv6 off");
            }
        });
    }

    /// The namespace name (`ip netns` name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/var/run/netns/<name>`, as `CNI_NETNS` and [`xdhcp::sys::netns`] take it.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A [`Command`] running the table program `program`
    /// ([`crate::program`]) inside this namespace (`ip netns exec <name>
    /// <path>`); add arguments and spawn it.
    #[track_caller]
    pub fn command(&self, program: &str) -> Command {
        netns_exec(&self.name, crate::program(program))
    }

    /// A tokio [`tokio::process::Command`] running the table program
    /// `program` inside this namespace.
    #[track_caller]
    pub fn tokio_command(&self, program: &str) -> tokio::process::Command {
        tokio::process::Command::from(self.command(program))
    }

    /// Runs `args[0] args[1..]` inside the namespace; panics on failure; returns stdout.
    #[track_caller]
    pub fn exec(&self, args: &[&str]) -> String {
        let (program, rest) = args.split_first().expect("exec needs a program");
        run(self.command(program).args(rest))
    }

    /// Runs `args` inside the namespace and returns its output whatever the exit status.
    #[track_caller]
    pub fn exec_output(&self, args: &[&str]) -> Output {
        let (program, rest) = args.split_first().expect("exec needs a program");
        output(self.command(program).args(rest))
    }

    /// `ip -n <name> <args>`; panics on failure; returns stdout.
    #[track_caller]
    pub fn ip(&self, args: &[&str]) -> String {
        let mut cmd = ip(&["-n", &self.name]);
        cmd.args(args);
        run(&mut cmd)
    }

    /// Adds `addr/prefix` to `ifname`.
    #[track_caller]
    pub fn add_addr(&self, ifname: &str, addr: Ipv4Addr, prefix: u8) {
        self.ip(&["addr", "add", &format!("{addr}/{prefix}"), "dev", ifname]);
    }

    /// Sets `ifname` up.
    #[track_caller]
    pub fn link_up(&self, ifname: &str) {
        self.ip(&["link", "set", ifname, "up"]);
    }

    /// Deletes `ifname` (and its veth peer, wherever that lives).
    #[track_caller]
    pub fn link_del(&self, ifname: &str) {
        self.ip(&["link", "del", ifname]);
    }

    /// The MAC address of `ifname`.
    #[track_caller]
    pub fn mac(&self, ifname: &str) -> [u8; 6] {
        let json = self.link_json(ifname);
        let text = json["address"]
            .as_str()
            .unwrap_or_else(|| panic!("no address for {ifname} in {}: {json}", self.name));
        parse_mac(text).unwrap_or_else(|| panic!("bad MAC {text:?} for {ifname}"))
    }

    /// The interface index of `ifname` inside this namespace.
    #[track_caller]
    pub fn ifindex(&self, ifname: &str) -> u32 {
        let json = self.link_json(ifname);
        json["ifindex"]
            .as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .unwrap_or_else(|| panic!("no ifindex for {ifname} in {}: {json}", self.name))
    }

    /// IPv4 addresses (with prefix length) configured on `ifname`.
    #[track_caller]
    pub fn ipv4_addrs(&self, ifname: &str) -> Vec<(Ipv4Addr, u8)> {
        let out = self.ip(&["-j", "-4", "addr", "show", "dev", ifname]);
        let json: serde_json::Value = serde_json::from_str(&out).expect("ip -j addr output");
        let mut addrs = Vec::new();
        for link in json.as_array().into_iter().flatten() {
            for info in link["addr_info"].as_array().into_iter().flatten() {
                let (Some(local), Some(prefix)) =
                    (info["local"].as_str(), info["prefixlen"].as_u64())
                else {
                    continue;
                };
                if let (Ok(a), Ok(p)) = (local.parse(), u8::try_from(prefix)) {
                    addrs.push((a, p));
                }
            }
        }
        addrs
    }

    /// The IPv4 routing table (`ip -4 route show`), one route per line.
    #[track_caller]
    pub fn routes(&self) -> String {
        self.ip(&["-4", "route", "show"])
    }

    /// True if `ifname` exists in this namespace.
    pub fn has_link(&self, ifname: &str) -> bool {
        output(&mut ip(&["-n", &self.name, "link", "show", "dev", ifname]))
            .status
            .success()
    }

    #[track_caller]
    fn link_json(&self, ifname: &str) -> serde_json::Value {
        let out = self.ip(&["-j", "link", "show", "dev", ifname]);
        let json: serde_json::Value = serde_json::from_str(&out).expect("ip -j link output");
        json.get(0)
            .cloned()
            .unwrap_or_else(|| panic!("{ifname} not found in {}", self.name))
    }

    /// Runs `f` on a dedicated thread inside this namespace ([`xdhcp::sys::netns::run_in_netns`]).
    #[track_caller]
    pub fn run_in<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        xdhcp::sys::netns::run_in_netns(&self.path, f)
            .unwrap_or_else(|e| panic!("run in {}: {e}", self.name))
    }

    /// An `AF_PACKET` socket bound to device `ifindex` of this namespace
    /// (made inside it): see [`packet_socket_here`].
    #[track_caller]
    pub fn packet_socket(
        &self,
        ifindex: u32,
        protocol: u16,
        recv_timeout: Option<std::time::Duration>,
    ) -> std::os::fd::OwnedFd {
        let name = self.name.clone();
        self.run_in(move || {
            packet_socket_here(ifindex, protocol, recv_timeout)
                .unwrap_or_else(|e| panic!("AF_PACKET socket on {ifindex} in {name}: {e}"))
        })
    }

    /// Sends `frame` whole out of `ifname` of this namespace, from a
    /// packet socket made for it.
    #[track_caller]
    pub fn send_frame(&self, ifname: &str, frame: &[u8]) {
        let sock = self.packet_socket(self.ifindex(ifname), libc::ETH_P_ALL as u16, None);
        crate::frames::send(&sock, frame);
    }

    /// Runs the future from `f` on a current-thread tokio runtime inside this namespace.
    #[track_caller]
    pub fn block_on_in<T, Fut>(&self, f: impl FnOnce() -> Fut + Send + 'static) -> T
    where
        T: Send + 'static,
        Fut: std::future::Future<Output = T>,
    {
        xdhcp::sys::netns::block_on_in_netns(&self.path, f)
            .unwrap_or_else(|e| panic!("block_on in {}: {e}", self.name))
    }
}

impl Default for NetNs {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        kill_netns_processes(&self.name);
        // Deleting a namespace with a process still exiting in it can race;
        // retry briefly so nothing is left behind.
        for _ in 0..20 {
            let out = output(&mut ip(&["netns", "del", &self.name]));
            if out.status.success() || !self.path.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// Formats a MAC as `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(mac: [u8; 6]) -> String {
    let parts: Vec<String> = mac.iter().map(|b| format!("{b:02x}")).collect();
    parts.join(":")
}

/// A veth pair with one end in each of two namespaces (which may be the same).
/// Both ends are up. Dropped: the pair is deleted (if its namespace still exists).
#[derive(Debug)]
pub struct Veth {
    ns_a: String,
    /// Interface name in the first namespace.
    pub a: String,
    /// Interface name in the second namespace.
    pub b: String,
}

impl Veth {
    /// Creates `a_name` in `a` paired with `b_name` in `b`, both up.
    #[track_caller]
    pub fn new(a: &NetNs, a_name: &str, b: &NetNs, b_name: &str) -> Self {
        a.ip(&[
            "link",
            "add",
            a_name,
            "type",
            "veth",
            "peer",
            "name",
            b_name,
            "netns",
            b.name(),
        ]);
        let veth = Self {
            ns_a: a.name().to_owned(),
            a: a_name.to_owned(),
            b: b_name.to_owned(),
        };
        a.link_up(a_name);
        b.link_up(b_name);
        veth
    }

    /// Like [`Veth::new`] with a fixed MAC on the `b` end (set before it comes up).
    #[track_caller]
    pub fn with_mac(a: &NetNs, a_name: &str, b: &NetNs, b_name: &str, b_mac: [u8; 6]) -> Self {
        a.ip(&[
            "link",
            "add",
            a_name,
            "type",
            "veth",
            "peer",
            "name",
            b_name,
            "address",
            &format_mac(b_mac),
            "netns",
            b.name(),
        ]);
        let veth = Self {
            ns_a: a.name().to_owned(),
            a: a_name.to_owned(),
            b: b_name.to_owned(),
        };
        a.link_up(a_name);
        b.link_up(b_name);
        veth
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        // Fails harmlessly if the namespace (and with it the pair) is already gone.
        let _ = output(&mut ip(&["-n", &self.ns_a, "link", "del", &self.a]));
    }
}

/// A Linux bridge inside a namespace, up; deleted on drop.
#[derive(Debug)]
pub struct Bridge {
    ns: String,
    /// Bridge interface name.
    pub name: String,
}

impl Bridge {
    /// Creates bridge `name` in `ns` and brings it up.
    #[track_caller]
    pub fn new(ns: &NetNs, name: &str) -> Self {
        ns.ip(&["link", "add", name, "type", "bridge"]);
        let br = Self {
            ns: ns.name().to_owned(),
            name: name.to_owned(),
        };
        ns.link_up(name);
        br
    }

    /// Enslaves `ifname` (in the bridge's namespace) to the bridge.
    #[track_caller]
    pub fn attach(&self, ifname: &str) {
        run(&mut ip(&[
            "-n", &self.ns, "link", "set", ifname, "master", &self.name,
        ]));
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = output(&mut ip(&["-n", &self.ns, "link", "del", &self.name]));
    }
}

/// A lab client: its own namespace with interface [`LabClient::ifname`]
/// connected to the lab bridge; the interface is up and has no address.
#[derive(Debug)]
pub struct LabClient {
    /// Dropped before `ns` so the veth goes first.
    veth: Veth,
    /// The client namespace.
    pub ns: NetNs,
    /// Interface name inside `ns` (`eth0`).
    pub ifname: String,
    /// MAC of the client interface.
    pub mac: [u8; 6],
    /// Ifindex of the client interface inside `ns`.
    pub ifindex: u32,
}

impl LabClient {
    /// Name of the bridge port (in the server namespace) this client hangs off.
    pub fn port(&self) -> &str {
        &self.veth.a
    }
}

/// A test network: a server namespace holding bridge `br0` with the server
/// address, and `n` client namespaces each connected by a veth to `br0`.
///
/// ```text
///  [client ns 0: eth0] ──veth── c0 ┐
///  [client ns 1: eth0] ──veth── c1 ├─ br0 192.0.2.1/24   (server ns: run dnsmasq/kea here)
///  ...                             ┘
/// ```
///
/// With [`LabBuilder::server_behind_uplink`] the bridge's namespace is a
/// node's and the server has its own, reached through the node's uplink
/// [`Lab::UPLINK`] (a port of `br0`), as on a node whose localnet bridge
/// has a NIC into the physical network:
///
/// ```text
///  [client ns i: eth0] ──veth── ci ┐
///                                  ├─ br0   (node ns: no address)
///                             up0 ─┘
///                              │ veth
///                       [dhcp ns: s0 192.0.2.1/24]
/// ```
#[derive(Debug)]
pub struct Lab {
    /// Clients (dropped first).
    pub clients: Vec<LabClient>,
    /// The server's own namespace and its link to the bridge, when the
    /// server is behind an uplink.
    pub uplink: Option<LabUplink>,
    /// The bridge in the server namespace.
    pub bridge: Bridge,
    /// The bridge's namespace: the DHCP server listens on [`Lab::BRIDGE`]
    /// here, unless it is behind an uplink ([`Lab::dhcp_ns`]).
    pub server: NetNs,
    /// IPv6 off in every namespace, those [`Lab::add_client`] adds
    /// later too ([`LabBuilder::without_ipv6`]).
    pub without_ipv6: bool,
    /// Server address on the bridge.
    pub server_ip: Ipv4Addr,
    /// Prefix length of the lab subnet.
    pub prefix_len: u8,
}

/// The DHCP server's namespace behind the lab's uplink.
#[derive(Debug)]
pub struct LabUplink {
    /// [`Lab::UPLINK`] (a bridge port) to [`Lab::SERVER_IF`] in `ns`;
    /// dropped before the namespace.
    _veth: Veth,
    /// The server's namespace.
    pub ns: NetNs,
}

/// Builder for [`Lab`].
#[derive(Debug, Clone)]
pub struct LabBuilder {
    clients: usize,
    server_ip: Ipv4Addr,
    prefix_len: u8,
    client_ifname: String,
    behind_uplink: bool,
    without_ipv6: bool,
}

impl Default for LabBuilder {
    fn default() -> Self {
        Self {
            clients: 1,
            server_ip: Ipv4Addr::new(192, 0, 2, 1),
            prefix_len: 24,
            client_ifname: "eth0".to_owned(),
            without_ipv6: false,
            behind_uplink: false,
        }
    }
}

impl LabBuilder {
    /// Number of client namespaces (default 1).
    #[must_use]
    pub fn clients(mut self, n: usize) -> Self {
        self.clients = n;
        self
    }

    /// Server address and prefix on the bridge (default 192.0.2.1/24).
    #[must_use]
    pub fn server_ip(mut self, ip: Ipv4Addr, prefix_len: u8) -> Self {
        self.server_ip = ip;
        self.prefix_len = prefix_len;
        self
    }

    /// Interface name inside each client namespace (default `eth0`).
    #[must_use]
    pub fn client_ifname(mut self, name: &str) -> Self {
        name.clone_into(&mut self.client_ifname);
        self
    }

    /// Put the server in its own namespace behind the uplink
    /// [`Lab::UPLINK`], a port of the bridge (see [`Lab`]).
    #[must_use]
    pub fn server_behind_uplink(mut self) -> Self {
        self.behind_uplink = true;
        self
    }

    /// IPv6 off in every namespace of the lab before its links exist: no
    /// link-local addresses, so no router solicitations, DAD or MLD reports,
    /// each of which a bridge with a thousand ports floods to every port
    /// (the kernel's input backlog then drops packets machine-wide, DHCP
    /// ones among them). For the benches with hundreds of clients.
    #[must_use]
    pub fn without_ipv6(mut self) -> Self {
        self.without_ipv6 = true;
        self
    }

    /// Creates the namespaces, bridge and veths.
    #[track_caller]
    pub fn build(self) -> Lab {
        let new_ns = || Lab::new_ns(self.without_ipv6);
        let server = new_ns();
        let bridge = Bridge::new(&server, Lab::BRIDGE);
        let uplink = if self.behind_uplink {
            let ns = new_ns();
            let veth = Veth::new(&server, Lab::UPLINK, &ns, Lab::SERVER_IF);
            bridge.attach(Lab::UPLINK);
            ns.add_addr(Lab::SERVER_IF, self.server_ip, self.prefix_len);
            Some(LabUplink { _veth: veth, ns })
        } else {
            server.add_addr(Lab::BRIDGE, self.server_ip, self.prefix_len);
            None
        };
        let mut clients = Vec::with_capacity(self.clients);
        for i in 0..self.clients {
            clients.push(Lab::make_client(
                &server,
                new_ns(),
                &bridge,
                &format!("c{i}"),
                &self.client_ifname,
            ));
        }
        Lab {
            clients,
            uplink,
            bridge,
            server,
            without_ipv6: self.without_ipv6,
            server_ip: self.server_ip,
            prefix_len: self.prefix_len,
        }
    }
}

impl Lab {
    /// Name of the bridge in the server namespace.
    pub const BRIDGE: &'static str = "br0";
    /// The bridge port toward the server, with
    /// [`LabBuilder::server_behind_uplink`].
    pub const UPLINK: &'static str = "up0";
    /// The server's interface in its own namespace, with
    /// [`LabBuilder::server_behind_uplink`].
    pub const SERVER_IF: &'static str = "s0";

    /// The namespace the DHCP server runs in.
    pub fn dhcp_ns(&self) -> &NetNs {
        self.uplink.as_ref().map_or(&self.server, |u| &u.ns)
    }

    /// The interface the DHCP server listens on, in [`Lab::dhcp_ns`].
    pub fn dhcp_ifname(&self) -> &'static str {
        if self.uplink.is_some() {
            Self::SERVER_IF
        } else {
            Self::BRIDGE
        }
    }

    /// A builder with defaults: one client, 192.0.2.1/24, `eth0`.
    pub fn builder() -> LabBuilder {
        LabBuilder::default()
    }

    /// Shorthand for `Lab::builder().clients(n).build()`.
    #[track_caller]
    pub fn with_clients(n: usize) -> Self {
        Self::builder().clients(n).build()
    }

    /// Adds one more client namespace with interface `ifname`.
    #[track_caller]
    pub fn add_client(&mut self, ifname: &str) -> &LabClient {
        let port = format!("c{}", self.clients.len());
        let ns = Self::new_ns(self.without_ipv6);
        let client = Self::make_client(&self.server, ns, &self.bridge, &port, ifname);
        self.clients.push(client);
        self.clients.last().expect("just pushed")
    }

    /// A new namespace of a lab, IPv6 off in it if the lab has it off.
    #[track_caller]
    fn new_ns(without_ipv6: bool) -> NetNs {
        let ns = NetNs::new();
        if without_ipv6 {
            ns.disable_ipv6();
        }
        ns
    }

    #[track_caller]
    fn make_client(
        server: &NetNs,
        ns: NetNs,
        bridge: &Bridge,
        port: &str,
        ifname: &str,
    ) -> LabClient {
        let veth = Veth::new(server, port, &ns, ifname);
        bridge.attach(port);
        let mac = ns.mac(ifname);
        let ifindex = ns.ifindex(ifname);
        LabClient {
            veth,
            ns,
            ifname: ifname.to_owned(),
            mac,
            ifindex,
        }
    }

    /// MAC of the server's bridge interface.
    #[track_caller]
    pub fn server_mac(&self) -> [u8; 6] {
        self.dhcp_ns().mac(self.dhcp_ifname())
    }

    /// Drops every DHCPACK the server sends (dnsmasq and the agent's engine
    /// write option 53 first, so the message type sits at a fixed offset of
    /// the UDP payload): the server answers DISCOVER, commits the REQUEST,
    /// and its ACK never leaves. Restored when the guard drops.
    #[track_caller]
    pub fn drop_server_acks(&self) -> AckDrop {
        // UDP header (8) + BOOTP fixed part (236) + magic cookie (4) = byte
        // 248 of the transport header: option 53, length 1, DHCPACK (5).
        AckDrop {
            _rule: NftDrop::add(
                self.dhcp_ns(),
                "inet",
                "xdt_ack_drop",
                "output",
                &["udp", "sport", "67", "@th,1984,24", "0x350105"],
            ),
        }
    }

    /// Cuts the server's unicast DHCP path: frames to the server's MAC with
    /// UDP destination port 67 are dropped at the bridge (nftables, bridge
    /// family, input hook — before both dnsmasq's UDP socket and Kea's raw
    /// socket see them). RENEW (unicast) then goes unanswered while REBIND
    /// and DISCOVER (broadcast) still work. Restored when the guard drops.
    #[track_caller]
    pub fn cut_server_unicast(&self) -> UnicastCut {
        assert!(
            self.uplink.is_none(),
            "the cut is made at the bridge's input: the server must be on the bridge"
        );
        let mac = format_mac(self.server_mac());
        UnicastCut(NftDrop::add(
            &self.server,
            "bridge",
            "xdt_unicast_cut",
            "input",
            &["ether", "daddr", &mac, "udp", "dport", "67"],
        ))
    }
}

/// An nftables table in a namespace with one chain on one hook and one
/// rule that counts and drops what `matches`; deleted on drop.
#[derive(Debug)]
struct NftDrop {
    ns: String,
    family: &'static str,
    table: &'static str,
}

impl NftDrop {
    #[track_caller]
    fn add(
        ns: &NetNs,
        family: &'static str,
        table: &'static str,
        hook: &str,
        matches: &[&str],
    ) -> Self {
        let nft = |args: &[&str]| {
            run(netns_exec(ns.name(), crate::program("nft")).args(args));
        };
        nft(&["add", "table", family, table]);
        let chain = format!("{{ type filter hook {hook} priority 0; }}");
        nft(&["add", "chain", family, table, "c", &chain]);
        let rule = [
            &["add", "rule", family, table, "c"],
            matches,
            &["counter", "drop"],
        ]
        .concat();
        nft(&rule);
        Self {
            ns: ns.name().to_owned(),
            family,
            table,
        }
    }

    /// How many packets the rule dropped so far.
    #[track_caller]
    fn dropped(&self) -> u64 {
        let out = run(netns_exec(&self.ns, crate::program("nft")).args([
            "list",
            "table",
            self.family,
            self.table,
        ]));
        out.split_whitespace()
            .skip_while(|w| *w != "packets")
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for NftDrop {
    fn drop(&mut self) {
        let _ = output(netns_exec(&self.ns, crate::program("nft")).args([
            "delete",
            "table",
            self.family,
            self.table,
        ]));
    }
}

/// Guard of [`Lab::drop_server_acks`]; the server's ACKs flow again on drop.
#[derive(Debug)]
pub struct AckDrop {
    _rule: NftDrop,
}

/// Guard of [`Lab::cut_server_unicast`]; restores the path on drop.
#[derive(Debug)]
pub struct UnicastCut(NftDrop);

impl UnicastCut {
    /// How many frames were dropped so far.
    #[track_caller]
    pub fn dropped(&self) -> u64 {
        self.0.dropped()
    }
}

/// An `AF_PACKET` raw socket bound to device `ifindex` of the calling
/// thread's namespace, receiving `protocol` (an Ethernet type in host order:
/// `ETH_P_ALL` for every frame — on a bridge port only taps see frames, the
/// bridge consumes them before protocol-specific sockets — or 0 to send
/// only), reads bounded by `recv_timeout`.
pub fn packet_socket_here(
    ifindex: u32,
    protocol: u16,
    recv_timeout: Option<std::time::Duration>,
) -> std::io::Result<std::os::fd::OwnedFd> {
    use xdhcp::datapath::rawsock::{bind_packet, packet_socket};
    let fd = packet_socket(protocol.to_be(), false)?;
    bind_packet(&fd, ifindex, protocol.to_be())?;
    if let Some(t) = recv_timeout {
        let tv = nix::sys::time::TimeVal::from(libc::timeval {
            tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_usec: libc::suseconds_t::from(t.subsec_micros()),
        });
        nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::ReceiveTimeout, &tv)?;
    }
    Ok(fd)
}
