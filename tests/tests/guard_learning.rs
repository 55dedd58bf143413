//! Passive learning of a VM guest's own DHCP, end to end in namespaces,
//! with real Debian DHCP clients as the guest and the **in-process fake API
//! server** (`xdhcp_tests::fake_apiserver`, driven by the agent's real
//! `kube::Client`; it is not a cluster).
//!
//! Topology (bridge binding): the guest namespace's `eth0` (the VM's MAC)
//! → veth → bridge `k6t-eth0` in the launcher pod's namespace → the pod
//! interface `eth0` → its veth peer `c0`, a port of bridge `br0` in the
//! node namespace → dnsmasq or Kea on `br0`. The agent runs in-process
//! inside the node namespace (every thread it starts inherits it), so the
//! guard goes on `c0`; it runs with `--kube=on` and a kubeconfig naming the
//! fake API server, which listens on the node namespace's loopback and
//! holds the launcher pod and the VMI. The `pod-networks` annotation is read
//! back from the fake server, and its PATCH requests are counted.
//!
//! The VM ADD runs the one-shot discovery (client id `01:<MAC>`); then the
//! guest's client leases for itself, and the entry must end at the address
//! the guest holds, within a second of the guest's ACK: `dhcpcd` with its
//! DUID gets another address (its learned update survives a 409 Conflict
//! from a concurrent writer; its renewal of the same address writes
//! nothing; its RELEASE, `dhcpcd -k`, drops the learned binding while the
//! entry keeps that address), `udhcpc` (client id `01:<MAC>`) the same one (nothing
//! written), `dhclient` (no client id) whatever the server gives it; its
//! RELEASE (`dhclient -r`) drops the learned binding while the entry keeps
//! the last address (nothing written). Each against dnsmasq and against Kea.
//!
//! Two more with dhcpcd as it runs in a guest (a daemon, ARP probing on):
//! killed without releasing (SIGKILL), its short Kea lease runs out and the
//! learned binding goes at expiry (from the table, the agent's state file
//! and the metrics) while the entry keeps the address, nothing written; and
//! acknowledged an address another host on the segment already holds
//! (dnsmasq's fixed address for its client id), it finds it with its ARP
//! probe and DECLINEs it: the agent drops the binding, puts the entry back
//! where it was, and follows the next address dnsmasq gives.
//!
//! One where a host on the segment forges unicast ACKs for the VM's MAC,
//! naming an address of its choosing: they answer no REQUEST of the guest,
//! so they are counted and ignored (the entry, the pod and the binding
//! table untouched), and the guest's own exchange afterwards still moves
//! the entry.
//!
//! And one with the server behind a live uplink (the node's `up0`, a port
//! of `br0`; the server in its own namespace): the one-shot discovery's
//! replies are consumed at the uplink, the guest's own pass it unchanged,
//! and the guard on the VM's port learns the guest's address from them.
//!
//! And one dual-stack VM, whose ADD (before the launcher's interface is
//! bridged, as at a sandbox's creation) reports a DHCPv4 and a DHCPv6
//! address in one entry: the guest's own IPv4 address replaces the
//! one-shot's there, and the IPv6 address stays beside it.
//!
//! Every guest client runs in a private mount namespace whose
//! `/var/lib/dhcpcd` and `/run` are the test's own directories: dhcpcd's
//! DUID, lease file, pid file and control socket never touch this machine's
//! (checked), and two dhcpcd in parallel tests do not collide.
//!
//! Needs root; fails, never skips, without it.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use xdhcp::bindings::{Binding, BindingSource, PATH_BINDINGS};
use xdhcp::cli::KubeMode;
use xdhcp::cni::config;
use xdhcp::rpc::{self, CniRequest};
use xdhcp_tests::agent::ThreadAgent;
use xdhcp_tests::fake_apiserver::{Fault, Op};
use xdhcp_tests::guest::GuestFs;
use xdhcp_tests::{
    Dnsmasq, DnsmasqConfig, Kea, KeaConfig, Lab, NetNs, StandInApi, Veth, parse_mac, wait_until,
};

const NS: &str = "tenant";
const NAD: &str = "dhcpnet";
const POD: &str = "virt-launcher-vm1";
const VM_MAC: &str = "02:00:00:00:30:01";
const POD_NETWORKS: &str = "k8s.ovn.org/pod-networks";
/// An annotation a concurrent writer sets (the 409 case).
const OTHER: &str = "example.com/written-meanwhile";

/// The in-process fake API server (not a cluster), listening on the node
/// namespace's loopback (the agent's threads live in that namespace), on
/// its own runtime; and a kubeconfig naming it.
struct Api(StandInApi);

impl std::ops::Deref for Api {
    type Target = StandInApi;

    fn deref(&self) -> &StandInApi {
        &self.0
    }
}

impl Api {
    fn start_in(node: &Path) -> Self {
        Self(StandInApi::start_in(node))
    }

    /// The launcher pod's `pod-networks` annotation, parsed.
    fn networks(&self) -> Option<Value> {
        serde_json::from_str(&self.server.annotation(NS, POD, POD_NETWORKS)?).ok()
    }

    /// The address this network's `pod-networks` entry reports.
    fn reported(&self) -> Option<Ipv4Addr> {
        let doc = self.networks()?;
        let ip = doc[format!("{NS}/{NAD}")]["ip_addresses"][0].as_str()?;
        ip.split('/').next()?.parse().ok()
    }

    fn patches(&self) -> usize {
        self.server.count(Op::PatchPod)
    }

    /// PATCH requests answered 409 Conflict.
    fn conflicts(&self) -> usize {
        self.server
            .requests()
            .iter()
            .filter(|r| r.op == Some(Op::PatchPod) && r.status == 409)
            .count()
    }
}

/// An in-process agent on its own thread inside `node`, stopped on drop.
struct NodeAgent(ThreadAgent);

impl NodeAgent {
    /// With `uplinks` (`--uplink` values) attached at start; the agent is
    /// ready only once each is live, so the VM's ADD finds them.
    fn start(node: &Path, kubeconfig: &Path, uplinks: &[&str]) -> Self {
        let agent = ThreadAgent::start(Some(node), "xdt-learn-agent-", |args| {
            // On the node namespace's own loopback: no other test's.
            args.metrics_addr = Some(METRICS);
            args.kube = KubeMode::On;
            args.kubeconfig = Some(kubeconfig.to_path_buf());
            args.uplinks = uplinks
                .iter()
                .map(|u| u.parse().expect("an --uplink value"))
                .collect();
        });
        if !uplinks.is_empty() {
            agent.wait_uplinks_live(Duration::from_secs(10), "the agent's");
        }
        Self(agent)
    }

    fn add(&self, req: &CniRequest) -> rpc::CniResult {
        self.0.add(req).expect("VM ADD succeeds")
    }

    fn bindings(&self) -> Vec<Binding> {
        self.client().get(PATH_BINDINGS).expect("binding table")
    }

    /// The learned-binding file in the agent's state directory, as written.
    fn learned_file(&self) -> String {
        std::fs::read_to_string(self.state_dir.join("learned-bindings.json")).unwrap_or_default()
    }
}

impl std::ops::Deref for NodeAgent {
    type Target = ThreadAgent;

    fn deref(&self) -> &ThreadAgent {
        &self.0
    }
}

/// The agent's `/metrics`, in the node namespace.
const METRICS: std::net::SocketAddr =
    std::net::SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 9561);

/// The exposition lines of the agent's `/metrics` starting with `prefix`.
fn metric_lines(node: &Path, prefix: &str) -> Vec<String> {
    xdhcp_tests::agent::metric_lines(node, METRICS, prefix)
}

/// The DHCP server on the node's bridge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Srv {
    Dnsmasq,
    Kea,
}

/// A running server of either kind (kept alive for the test).
#[expect(
    dead_code,
    reason = "a Kea is only held so that it runs until the test ends"
)]
enum Running {
    Dnsmasq(Dnsmasq),
    Kea(Kea),
}

/// The lab, the guest namespace behind the launcher's bridge, the server,
/// and the agent after the VM's ADD.
struct Vm {
    agent: NodeAgent,
    api: Api,
    guest: NetNs,
    _guest_link: Veth,
    server: Running,
    lab: Lab,
    one_shot: Ipv4Addr,
    req: CniRequest,
    /// The guest clients' own `/var/lib/dhcpcd` (`db/`) and `/run` (`run/`).
    guest_fs: GuestFs,
}

impl Vm {
    /// A guest client: the table program `program` inside the guest
    /// namespace and a private mount namespace (`unshare --mount`, so the
    /// binds never reach this machine) whose `/var/lib/dhcpcd` and `/run`
    /// are [`Vm::guest_fs`]'s directories, bound before the client starts.
    /// `/run` is replaced only once inside the guest's network namespace,
    /// which `ip netns exec` has found under it already.
    fn client(&self, program: &str) -> std::process::Command {
        self.guest_fs.client(&self.guest, program)
    }
}

/// This machine's dhcpcd state a guest client would write without its
/// private mount namespace: which of those files exist, and their contents.
#[derive(Debug, PartialEq, Eq)]
struct HostDhcpcd(Vec<(PathBuf, Option<Vec<u8>>)>);

impl HostDhcpcd {
    fn snapshot() -> Self {
        let files = [
            "/var/lib/dhcpcd/duid",
            "/var/lib/dhcpcd/eth0.lease",
            "/run/dhcpcd",
        ]
        .into_iter()
        .map(|p| {
            let p = PathBuf::from(p);
            let content = if p.is_dir() {
                Some(Vec::new())
            } else {
                std::fs::read(&p).ok()
            };
            (p, content)
        })
        .collect();
        Self(files)
    }

    /// Checked once the test's guests are gone.
    fn assert_unchanged(&self) {
        assert_eq!(&Self::snapshot(), self, "this machine's dhcpcd state");
    }
}

fn vm_with_guest(srv: Srv) -> Vm {
    vm_with_server(|lab| match srv {
        Srv::Dnsmasq => Running::Dnsmasq(Dnsmasq::start(&lab.server, DnsmasqConfig::default())),
        Srv::Kea => Running::Kea(Kea::start(&lab.server, KeaConfig::default())),
    })
}

/// The VM and its guest, with the server `start` runs on the lab.
fn vm_with_server(start: impl FnOnce(&Lab) -> Running) -> Vm {
    vm_on(Lab::with_clients(1), start)
}

fn vm_on(lab: Lab, start: impl FnOnce(&Lab) -> Running) -> Vm {
    let server = start(&lab);
    let launcher = &lab.clients[0];
    let (guest, link) = bridge_guest(launcher);

    let key = format!("{NS}/{NAD}");
    let api = Api::start_in(lab.server.path());
    let uid = api.server.add_pod(
        NS,
        POD,
        &[
            ("kubevirt.io", "virt-launcher"),
            ("vm.kubevirt.io/name", "vm1"),
        ],
        &[],
    );
    api.server.put_vmi(vmi(&key));
    let uplink = format!("physnet1={}", Lab::UPLINK);
    let uplinks: &[&str] = if lab.uplink.is_some() {
        &[&uplink]
    } else {
        &[]
    };
    let agent = NodeAgent::start(lab.server.path(), &api.kubeconfig, uplinks);
    let conf = json!({
        "cniVersion": "1.0.0", "name": NAD, "type": "ovn-k8s-cni-overlay",
        "topology": "localnet", "netAttachDefName": key, "ipam": {"type": "dhcp"}
    });
    let req = CniRequest {
        container_id: "c-vm1".to_owned(),
        ifname: "eth0".to_owned(),
        netns: Some(launcher.ns.path().to_path_buf()),
        args: [
            ("K8S_POD_NAMESPACE".to_owned(), NS.to_owned()),
            ("K8S_POD_NAME".to_owned(), POD.to_owned()),
            ("K8S_POD_UID".to_owned(), uid),
        ]
        .into(),
        config: config::parse(conf.to_string().as_bytes()).unwrap(),
    };
    let r = agent.add(&req);
    let one_shot = r.ips[0].address.addr;
    assert_eq!(
        api.reported(),
        Some(one_shot),
        "the ADD reported its one-shot address"
    );
    // The VM's port is guarded: the lease's binding names it.
    let leased: Vec<_> = agent
        .bindings()
        .into_iter()
        .filter(|b| b.source == BindingSource::Leased)
        .collect();
    assert_eq!(leased.len(), 1, "{leased:?}");
    assert_eq!(leased[0].mac, VM_MAC);
    assert_eq!(
        leased[0].port.as_deref(),
        Some(launcher.port()),
        "{leased:?}"
    );
    let guest_fs = GuestFs::new();
    Vm {
        agent,
        api,
        guest,
        _guest_link: link,
        server,
        lab,
        one_shot,
        req,
        guest_fs,
    }
}

/// Bridge binding: the launcher's pod interface and the guest's link (a
/// new namespace whose `eth0` has the VM's MAC) on one bridge.
fn bridge_guest(launcher: &xdhcp_tests::LabClient) -> (NetNs, Veth) {
    let guest = NetNs::new();
    let mac = parse_mac(VM_MAC).unwrap();
    let link = Veth::with_mac(&launcher.ns, "tapg", &guest, "eth0", mac);
    launcher
        .ns
        .ip(&["link", "add", "k6t-eth0", "type", "bridge"]);
    launcher
        .ns
        .ip(&["link", "set", "eth0", "master", "k6t-eth0"]);
    launcher
        .ns
        .ip(&["link", "set", "tapg", "master", "k6t-eth0"]);
    for i in ["k6t-eth0", "tapg", "eth0"] {
        launcher.ns.link_up(i);
    }
    guest.link_up("eth0");
    (guest, link)
}

/// The VMI `vm1`, its interface `dhcpnet` on the NAD `key` with the VM's
/// MAC.
fn vmi(key: &str) -> Value {
    xdhcp_tests::fake_apiserver::vmi((NS, "vm1"), true, ("dhcpnet", key, VM_MAC))
}

/// Waits up to a second for the entry to report `ip`.
fn reported_within_a_second(vm: &Vm, ip: Ipv4Addr) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        if vm.api.reported() == Some(ip) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn learned(vm: &Vm) -> Vec<Binding> {
    vm.agent
        .bindings()
        .into_iter()
        .filter(|b| b.source == BindingSource::Learned)
        .collect()
}

/// A script a client runs on each state change: records the bound address.
fn recorder(dir: &Path, var: &str, when: &str) -> (PathBuf, PathBuf) {
    let script = dir.join("script");
    let out = dir.join("bound");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncase \"$reason$1\" in *{when}*) echo \"${var}\" > {} ;; esac\nexit 0\n",
            out.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (script, out)
}

fn read_ip(path: &Path) -> Ipv4Addr {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("the client recorded no lease ({e})"))
        .trim()
        .parse()
        .expect("an IPv4 address")
}

/// Runs dhcpcd once in the guest (it leases, runs its script, exits
/// without releasing); the address it was bound to.
fn run_dhcpcd(vm: &Vm, dir: &Path) -> Ipv4Addr {
    let conf = dhcpcd_conf(dir);
    // BOUND for a fresh lease; REBIND/REBOOT/RENEW when it asks again for
    // the lease it kept (one `case` pattern list).
    let (script, out) = recorder(dir, "new_ip_address", "BOUND*|*REBIND*|*REBOOT*|*RENEW");
    let _ = std::fs::remove_file(&out);
    let status = vm
        .client("dhcpcd")
        .args(["-1", "-4", "-B", "-t", "20", "-f"])
        .arg(&conf)
        .arg("-c")
        .arg(&script)
        .arg("eth0")
        .status()
        .expect("run dhcpcd");
    assert!(status.success(), "dhcpcd failed");
    read_ip(&out)
}

/// dhcpcd's configuration in `dir`: the distribution's defaults that matter
/// (DUID client id; ARP probing of an acknowledged address, on unless
/// `noarp`), no hooks (the script replaces them: nothing touches this
/// machine's files).
fn dhcpcd_conf(dir: &Path) -> PathBuf {
    let conf = dir.join("dhcpcd.conf");
    std::fs::write(&conf, "duid\npersistent\nrequire dhcp_server_identifier\n").unwrap();
    conf
}

/// dhcpcd running in the guest (foreground, not one-shot), so that
/// `dhcpcd -k` can ask it to release; killed on drop if still running.
struct DhcpcdDaemon {
    child: std::process::Child,
    bound: Ipv4Addr,
}

impl DhcpcdDaemon {
    fn start(vm: &Vm, dir: &Path) -> Self {
        Self::start_with(vm, dir, &[])
    }

    /// With `extra` flags before the interface name.
    fn start_with(vm: &Vm, dir: &Path, extra: &[&str]) -> Self {
        let conf = dhcpcd_conf(dir);
        let (script, out) = recorder(dir, "new_ip_address", "BOUND*|*REBIND*|*REBOOT*|*RENEW");
        let _ = std::fs::remove_file(&out);
        let child = vm
            .client("dhcpcd")
            .args(["-4", "-B", "-t", "20", "-f"])
            .arg(&conf)
            .arg("-c")
            .arg(&script)
            .args(extra)
            .arg("eth0")
            .spawn()
            .expect("start dhcpcd");
        let mut me = Self {
            child,
            bound: Ipv4Addr::UNSPECIFIED,
        };
        // Polled while the script may still be writing it.
        assert!(
            wait_until(Duration::from_secs(20), || std::fs::read_to_string(&out)
                .is_ok_and(|t| t.trim().parse::<Ipv4Addr>().is_ok())),
            "dhcpcd bound no lease"
        );
        me.bound = read_ip(&out);
        me
    }
}

impl Drop for DhcpcdDaemon {
    fn drop(&mut self) {
        // It exits by itself after a release; otherwise stop it.
        if !wait_until(Duration::from_secs(5), || {
            self.child.try_wait().is_ok_and(|s| s.is_some())
        }) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// dhcpcd leases once in the guest: its DUID earns it another address
/// than the one-shot's, and the entry reports that address within a second.
fn dhcpcd_moves_the_entry(vm: &Vm, dir: &Path) -> Ipv4Addr {
    let guest_ip = run_dhcpcd(vm, dir);
    assert_ne!(
        guest_ip, vm.one_shot,
        "the server gives the DUID client another address"
    );
    assert!(
        reported_within_a_second(vm, guest_ip),
        "the entry reports {:?}, the guest holds {guest_ip}",
        vm.api.reported()
    );
    guest_ip
}

/// The one learned binding: the guest's `ip`, the VM's MAC, on its port.
fn assert_learned_one(vm: &Vm, ip: Ipv4Addr) -> Binding {
    let l = learned(vm);
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!((l[0].ip, l[0].mac.as_str()), (ip.into(), VM_MAC));
    assert_eq!(l[0].port.as_deref(), Some(vm.lab.clients[0].port()));
    l[0].clone()
}

fn dhcpcd_guest(srv: Srv) {
    let host_before = HostDhcpcd::snapshot();
    let vm = vm_with_guest(srv);
    let dir = tempfile::tempdir().unwrap();
    // Another client writes the pod just before the learned update's PATCH
    // is served: that PATCH fails its resourceVersion precondition (409),
    // and the update must still land, next to the other writer's change.
    let patches_after_add = vm.api.patches();
    vm.api.server.inject(
        Op::PatchPod,
        Fault::ConcurrentWrite {
            key: OTHER.to_owned(),
            value: "kept".to_owned(),
        },
    );
    let guest_ip = dhcpcd_moves_the_entry(&vm, dir.path());
    assert_eq!(vm.api.server.pending_faults(), 0, "the conflict was served");
    assert_eq!(vm.api.conflicts(), 1, "{:?}", vm.api.server.requests());
    assert_eq!(
        vm.api.server.annotation(NS, POD, OTHER).as_deref(),
        Some("kept"),
        "the concurrent writer's change survives the retried update"
    );
    let entry = &vm.api.networks().unwrap()[format!("{NS}/{NAD}")];
    assert_eq!(entry["mac_address"], VM_MAC, "{entry}");
    let l = assert_learned_one(&vm, guest_ip);
    assert!(l.expires_unix_ms.is_some());
    assert!(vm.api.server.unexpected().is_empty());

    // The guest comes back and asks for its address again (dhcpcd keeps its
    // DUID and lease): the same address, so nothing is written.
    let patches = vm.api.patches();
    assert_eq!(
        patches,
        patches_after_add + 2,
        "the learned update: one 409, one accepted"
    );
    let again = run_dhcpcd(&vm, dir.path());
    assert_eq!(again, guest_ip, "the renewal keeps the address");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(vm.api.patches(), patches, "a renewal writes nothing");
    assert_eq!(vm.api.reported(), Some(guest_ip));

    // The guest's client, running this time, gives its lease back
    // (`dhcpcd -k` asks the running dhcpcd to RELEASE): the learned binding
    // goes, the entry keeps the last address the guest held (not the
    // one-shot's), and nothing is written.
    let daemon = DhcpcdDaemon::start(&vm, dir.path());
    assert_eq!(
        daemon.bound, guest_ip,
        "the restarted client keeps the address"
    );
    let status = vm
        .client("dhcpcd")
        .args(["-4", "-k", "eth0"])
        .status()
        .expect("run dhcpcd -k");
    assert!(status.success(), "dhcpcd -k failed");
    assert!(
        wait_until(Duration::from_secs(1), || learned(&vm).is_empty()),
        "the RELEASE left {:?}",
        learned(&vm)
    );
    drop(daemon);
    assert_eq!(vm.api.reported(), Some(guest_ip));
    assert_eq!(vm.api.patches(), patches, "a RELEASE writes nothing");
    // It comes back (its lease file gone with the release, it asks for no
    // address): the entry follows whatever it is given; given the address
    // the entry already reports (dnsmasq's choice), nothing is rewritten.
    let back = run_dhcpcd(&vm, dir.path());
    assert!(
        reported_within_a_second(&vm, back),
        "the entry reports {:?}, the guest holds {back}",
        vm.api.reported()
    );
    assert!(wait_until(Duration::from_secs(1), || learned(&vm)
        .iter()
        .any(|b| b.ip == back)));
    if back == guest_ip {
        std::thread::sleep(Duration::from_secs(1));
        assert_eq!(vm.api.patches(), patches, "coming back writes nothing");
    }

    // The VM's DEL takes its port's guard and its learned binding away.
    vm.agent
        .client()
        .post::<_, Value>(rpc::PATH_DEL, &vm.req)
        .expect("DEL");
    assert!(learned(&vm).is_empty(), "{:?}", learned(&vm));
    assert!(vm.agent.bindings().is_empty());
    // dhcpcd's DUID and lease went to the test's directory, never here.
    assert!(vm.guest_fs.path().join("db/duid").exists());
    drop(vm);
    host_before.assert_unchanged();
}

fn udhcpc_guest(srv: Srv) {
    let vm = vm_with_guest(srv);
    let patches = vm.api.patches();
    let dir = tempfile::tempdir().unwrap();
    let (script, out) = recorder(dir.path(), "ip", "bound");
    let status = vm
        .client("busybox")
        .args([
            "udhcpc", "-f", "-q", "-n", "-t", "5", "-T", "1", "-i", "eth0", "-s",
        ])
        .arg(&script)
        .status()
        .expect("run udhcpc");
    assert!(status.success(), "udhcpc failed");
    let guest_ip = read_ip(&out);
    // Same client id as the one-shot: the same address, nothing to change.
    assert_eq!(guest_ip, vm.one_shot);
    assert!(wait_until(Duration::from_secs(1), || !learned(&vm).is_empty()));
    assert_eq!(vm.api.reported(), Some(vm.one_shot));
    assert_eq!(vm.api.patches(), patches, "nothing is written");
    assert_eq!(learned(&vm)[0].ip, guest_ip);
}

fn dhclient_guest(srv: Srv) {
    let vm = vm_with_guest(srv);
    let dir = tempfile::tempdir().unwrap();
    let (script, out) = recorder(dir.path(), "new_ip_address", "BOUND");
    let status = vm
        .client("dhclient")
        .args(["-4", "-1", "-sf"])
        .arg(&script)
        .arg("-lf")
        .arg(dir.path().join("leases"))
        .arg("-pf")
        .arg(dir.path().join("pid"))
        .arg("eth0")
        .status()
        .expect("run dhclient");
    assert!(status.success(), "dhclient failed");
    let guest_ip = read_ip(&out);
    assert!(
        reported_within_a_second(&vm, guest_ip),
        "the entry reports {:?}, the guest holds {guest_ip}",
        vm.api.reported()
    );
    assert!(wait_until(Duration::from_secs(1), || learned(&vm)
        .iter()
        .any(|b| b.ip == guest_ip)));

    // The guest gives its lease back: the learned binding goes; the entry
    // keeps the last address the guest held, so nothing is written.
    // dhclient sends its RELEASE over a UDP socket, from the address it
    // holds: configure it, as its distribution script would have.
    vm.guest
        .ip(&["addr", "add", &format!("{guest_ip}/24"), "dev", "eth0"]);
    let patches = vm.api.patches();
    let status = vm
        .client("dhclient")
        .args(["-4", "-v", "-r", "-sf"])
        .arg(&script)
        .arg("-lf")
        .arg(dir.path().join("leases"))
        .arg("-pf")
        .arg(dir.path().join("pid"))
        .arg("eth0")
        .status()
        .expect("run dhclient -r");
    assert!(status.success(), "dhclient -r failed");
    assert!(
        wait_until(Duration::from_secs(1), || learned(&vm).is_empty()),
        "the RELEASE left {:?}",
        learned(&vm)
    );
    assert_eq!(vm.api.reported(), Some(guest_ip));
    assert_eq!(vm.api.patches(), patches, "a RELEASE writes nothing");
}

/// The address each accepted PATCH of the launcher pod wrote into this
/// network's `pod-networks` entry, in order.
fn written(vm: &Vm) -> Vec<Ipv4Addr> {
    fn entry_ip(v: &Value) -> Option<Ipv4Addr> {
        match v {
            Value::String(text) => {
                let doc: Value = serde_json::from_str(text).ok()?;
                let ip = doc.get(format!("{NS}/{NAD}"))?["ip_addresses"][0].as_str()?;
                ip.split('/').next()?.parse().ok()
            }
            Value::Array(a) => a.iter().find_map(entry_ip),
            Value::Object(o) => o.values().find_map(entry_ip),
            _ => None,
        }
    }
    vm.api
        .server
        .requests()
        .iter()
        .filter(|r| r.op == Some(Op::PatchPod) && (200..300).contains(&r.status))
        .filter_map(|r| r.body.as_ref().and_then(entry_ip))
        .collect()
}

/// The learned lease of the expiry test: short, so that it runs out in the
/// test; its T1 comes well after dhcpcd reports BOUND (its ARP probe takes
/// about 6 s after the ACK), so the client is killed before it renews.
const SHORT_LEASE_SECS: u32 = 24;

#[test]
fn dhcpcd_guest_killed_without_release_its_learned_binding_goes_at_expiry_kea_fake_apiserver() {
    let host_before = HostDhcpcd::snapshot();
    let vm = vm_with_server(|lab| {
        Running::Kea(Kea::start(
            &lab.server,
            KeaConfig {
                valid_lifetime: SHORT_LEASE_SECS,
                renew_timer: SHORT_LEASE_SECS / 2,
                rebind_timer: SHORT_LEASE_SECS * 7 / 8,
                ..KeaConfig::default()
            },
        ))
    });
    let node = vm.lab.server.path().to_path_buf();
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = DhcpcdDaemon::start(&vm, dir.path());
    let guest_ip = daemon.bound;
    assert!(
        reported_within_a_second(&vm, guest_ip),
        "the entry reports {:?}, the guest holds {guest_ip}",
        vm.api.reported()
    );
    let l = learned(&vm);
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!(l[0].ip, guest_ip);
    let expires = l[0]
        .expires_unix_ms
        .expect("a learned lease with a lease time");
    // The binding table in the metrics: one learned row, with its address.
    let info = format!(r#"ip="{guest_ip}",port="{}""#, vm.lab.clients[0].port());
    assert!(
        wait_until(Duration::from_secs(5), || {
            metric_lines(&node, r#"xdhcp_bindings{source="learned"}"#)
                == [r#"xdhcp_bindings{source="learned"} 1"#]
                && metric_lines(&node, "xdhcp_binding_info{")
                    .iter()
                    .any(|l| l.contains(&info) && l.contains(r#"source="learned""#))
        }),
        "{:?}",
        metric_lines(&node, "xdhcp_binding")
    );

    // The guest's client dies without a word (no RELEASE).
    let patches = vm.api.patches();
    daemon.child.kill().expect("SIGKILL dhcpcd");
    daemon.child.wait().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(learned(&vm).len(), 1, "the binding outlives its client");
    assert!(vm.agent.learned_file().contains(VM_MAC));

    // Its lease runs out at the server: the learned binding goes, from the
    // table, from the state file (the expiry sweep) and from the metrics.
    assert!(
        wait_until(
            Duration::from_secs(u64::from(SHORT_LEASE_SECS) + 10),
            || learned(&vm).is_empty()
        ),
        "still learned: {:?}",
        learned(&vm)
    );
    assert!(
        xdhcp::cli::now_unix_ms() >= expires,
        "gone at its expiry, not before"
    );
    assert!(
        wait_until(Duration::from_secs(10), || !vm
            .agent
            .learned_file()
            .contains(VM_MAC)),
        "the state file keeps it: {}",
        vm.agent.learned_file()
    );
    assert!(
        wait_until(Duration::from_secs(5), || {
            metric_lines(&node, r#"xdhcp_bindings{source="learned"}"#)
                == [r#"xdhcp_bindings{source="learned"} 0"#]
                && !metric_lines(&node, "xdhcp_binding_info{")
                    .iter()
                    .any(|l| l.contains(&info))
        }),
        "{:?}",
        metric_lines(&node, "xdhcp_binding")
    );
    // The entry keeps the last address the guest held; nothing is written.
    assert_eq!(vm.api.reported(), Some(guest_ip));
    assert_eq!(vm.api.patches(), patches, "an expiry writes nothing");
    drop(daemon);
    drop(vm);
    host_before.assert_unchanged();
}

/// The client id the declining guest sends (`dhcpcd -I`), for which
/// dnsmasq has a fixed address another host on the segment already holds.
const DECLINER_ID: &str = "00:78:64:68:63:70";
const TAKEN: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 77);

#[test]
fn dhcpcd_guest_declines_an_address_in_use_the_entry_goes_back_then_follows_dnsmasq_fake_apiserver()
{
    let host_before = HostDhcpcd::snapshot();
    // The second lab namespace on the node's bridge holds the address.
    let lab = Lab::with_clients(2);
    let squatter = &lab.clients[1];
    squatter.ns.add_addr(&squatter.ifname, TAKEN, 24);
    let vm = vm_on(lab, |lab| {
        Running::Dnsmasq(Dnsmasq::start(
            &lab.server,
            DnsmasqConfig {
                extra_args: vec![format!("--dhcp-host=id:{DECLINER_ID},{TAKEN}")],
                ..DnsmasqConfig::default()
            },
        ))
    });
    assert_ne!(
        vm.one_shot, TAKEN,
        "the one-shot's client id is not the fixed one"
    );
    let before = written(&vm).len();
    let dir = tempfile::tempdir().unwrap();
    // dhcpcd probes an acknowledged address with ARP by default (the
    // configuration has no `noarp`, the command line no `-A`): the
    // squatter answers, dhcpcd DECLINEs and starts over.
    let daemon = DhcpcdDaemon::start_with(&vm, dir.path(), &["-I", DECLINER_ID]);
    let guest_ip = daemon.bound;
    let Running::Dnsmasq(dnsmasq) = &vm.server else {
        unreachable!("the server is dnsmasq")
    };
    let log = dnsmasq.log();
    assert!(
        log.contains(&format!("DHCPACK(br0) {TAKEN}"))
            && log.contains(&format!("DHCPDECLINE(br0) {TAKEN}")),
        "dhcpcd was given {TAKEN} and declined it:\n{log}"
    );
    assert_ne!(guest_ip, TAKEN);
    assert_ne!(guest_ip, vm.one_shot);
    assert!(
        reported_within_a_second(&vm, guest_ip),
        "the entry reports {:?}, the guest holds {guest_ip}",
        vm.api.reported()
    );
    // The entry went where the ACK said, back to where it was at the
    // DECLINE (never staying on an address the guest refused), then on to
    // the address the guest holds.
    assert_eq!(
        written(&vm)[before..],
        [TAKEN, vm.one_shot, guest_ip],
        "{:?}",
        vm.api.server.requests()
    );
    let l = learned(&vm);
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!(l[0].ip, guest_ip, "no binding for the declined address");
    assert_eq!(l[0].replaced, Some(vm.one_shot.into()));
    drop(daemon);
    drop(vm);
    host_before.assert_unchanged();
}

#[test]
fn dhcpcd_guest_moves_the_entry_through_a_409_renew_and_release_write_nothing_dnsmasq_fake_apiserver()
 {
    dhcpcd_guest(Srv::Dnsmasq);
}

#[test]
fn dhcpcd_guest_moves_the_entry_through_a_409_renew_and_release_write_nothing_kea_fake_apiserver() {
    dhcpcd_guest(Srv::Kea);
}

#[test]
fn udhcpc_guest_keeping_the_address_changes_nothing_dnsmasq_fake_apiserver() {
    udhcpc_guest(Srv::Dnsmasq);
}

#[test]
fn udhcpc_guest_keeping_the_address_changes_nothing_kea_fake_apiserver() {
    udhcpc_guest(Srv::Kea);
}

#[test]
fn dhclient_guest_entry_reports_its_address_its_release_drops_the_binding_dnsmasq_fake_apiserver() {
    dhclient_guest(Srv::Dnsmasq);
}

#[test]
fn dhclient_guest_entry_reports_its_address_its_release_drops_the_binding_kea_fake_apiserver() {
    dhclient_guest(Srv::Kea);
}

/// The server behind a live uplink (its own namespace, reached through the
/// node's `up0`, a port of `br0`): the one-shot discovery's OFFER and ACK
/// are the agent's, consumed at the uplink; the guest's own are not, so the
/// uplink passes them unchanged, the guest leases, and the guard on the
/// VM's port learns the address from them.
#[test]
fn dhcpcd_guest_behind_a_live_uplink_is_learned_from_the_replies_it_passes_dnsmasq_fake_apiserver()
{
    let lab = Lab::builder().server_behind_uplink().build();
    let vm = vm_on(lab, |lab| {
        Running::Dnsmasq(Dnsmasq::start(
            lab.dhcp_ns(),
            DnsmasqConfig {
                interface: lab.dhcp_ifname().into(),
                ..DnsmasqConfig::default()
            },
        ))
    });
    let s = vm.agent.status();
    let up = &s.uplinks[0];
    assert_eq!(
        (up.state.as_str(), up.mode.as_deref()),
        ("live", Some("tc"))
    );
    assert!(up.replies >= 2, "the one-shot's replies: {up:?}");
    assert!(s.counters["kernel.dropped_owned"] >= 2, "{:?}", s.counters);
    let passed = s.counters["kernel.unowned_uncaptured"];

    let dir = tempfile::tempdir().unwrap();
    let guest_ip = dhcpcd_moves_the_entry(&vm, dir.path());
    assert_learned_one(&vm, guest_ip);
    // The guest's OFFER and ACK passed the uplink uncopied: no lease owns them.
    let s = vm.agent.status();
    assert!(
        s.counters["kernel.unowned_uncaptured"] >= passed + 2,
        "{:?}",
        s.counters
    );
    assert_eq!(s.uplinks[0].replies, up.replies, "{:?}", s.uplinks);
    assert!(
        metric_lines(vm.lab.server.path(), "xdhcp_uplink_attached")
            .iter()
            .any(|l| l.contains(r#"uplink="up0""#) && l.ends_with(" 1")),
        "{:?}",
        metric_lines(vm.lab.server.path(), "xdhcp_uplink")
    );
}

/// A host on the segment (here the node's bridge itself, as any unguarded
/// machine on the physical network could) that wants the VM's address.
const FORGER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x66, 0x66];
const FORGER_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 251);
/// The address the forger wants the entry to report.
const WANTED: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 66);

/// Sends on the node's bridge a unicast ACK for the VM's MAC that answers
/// nothing the guest sent: `xid` from no REQUEST, `yiaddr` the forger's
/// choice, the real server's identifier, the forger's own sources.
fn forge_ack(vm: &Vm, xid: u32) {
    use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode};
    use dhcproto::{Encodable as _, Encoder};
    use std::os::fd::AsRawFd as _;
    use xdhcp::datapath::frame::{FrameHeaders, build_udp_frame};

    let mac = parse_mac(VM_MAC).unwrap();
    let mut m = Message::default();
    m.set_opcode(Opcode::BootReply)
        .set_xid(xid)
        .set_chaddr(&mac)
        .set_yiaddr(WANTED);
    let o = m.opts_mut();
    o.insert(DhcpOption::MessageType(MessageType::Ack));
    o.insert(DhcpOption::ServerIdentifier(vm.lab.server_ip));
    o.insert(DhcpOption::AddressLeaseTime(3600));
    o.insert(DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)));
    o.insert(DhcpOption::Router(vec![FORGER_IP]));
    let mut payload = Vec::new();
    m.encode(&mut Encoder::new(&mut payload)).unwrap();
    let frame = build_udp_frame(
        &FrameHeaders {
            src_mac: FORGER_MAC,
            dst_mac: mac,
            vlan: None,
            src_ip: FORGER_IP,
            dst_ip: WANTED,
            src_port: 67,
            dst_port: 68,
        },
        &payload,
    );
    let node = &vm.lab.server;
    let sock = node.packet_socket(node.ifindex(Lab::BRIDGE), libc::ETH_P_ALL as u16, None);
    // SAFETY: sending a buffer on a bound packet socket.
    let n = unsafe { libc::send(sock.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
    assert_eq!(
        n,
        frame.len() as isize,
        "send: {}",
        std::io::Error::last_os_error()
    );
}

/// The refusals of guest learning for `reason`, from the agent's metrics.
fn refused(vm: &Vm, reason: &str) -> u64 {
    metric_lines(vm.lab.server.path(), "xdhcp_learn_refused_total")
        .iter()
        .find(|l| l.contains(&format!(r#"reason="{reason}""#)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// A forged unicast ACK for the VM's MAC, from a host on the segment,
/// passes the guard's egress like any reply towards the VM, and used to
/// move the entry (and with it the port security) to the address it named.
/// It answers no REQUEST of the guest: it is counted and ignored, nothing
/// is written, nothing is learned; the guest's own exchange afterwards
/// still moves the entry.
#[test]
fn a_forged_ack_from_the_segment_moves_nothing_the_guests_exchange_still_does_dnsmasq_fake_apiserver()
 {
    let host_before = HostDhcpcd::snapshot();
    let vm = vm_with_guest(Srv::Dnsmasq);
    let patches = vm.api.patches();
    // The guest's link has been up since the ADD: the bridge knows the
    // VM's MAC behind the port, so the forgeries go out of it (and would
    // be flooded there anyway).
    for xid in 0..5 {
        forge_ack(&vm, 0x0bad_0000 + xid);
    }
    assert!(
        wait_until(Duration::from_secs(2), || refused(&vm, "unsolicited") >= 5),
        "the forgeries were not seen and refused: {:?}",
        metric_lines(vm.lab.server.path(), "xdhcp_learn")
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        vm.api.reported(),
        Some(vm.one_shot),
        "the forgery moved the entry"
    );
    assert_eq!(vm.api.patches(), patches, "the forgery wrote the pod");
    assert!(learned(&vm).is_empty(), "{:?}", learned(&vm));

    // The guest's own exchange is learned and moves the entry.
    let dir = tempfile::tempdir().unwrap();
    let guest_ip = dhcpcd_moves_the_entry(&vm, dir.path());
    assert_ne!(guest_ip, WANTED);
    assert_learned_one(&vm, guest_ip);
    drop(vm);
    host_before.assert_unchanged();
}

/// A dual-stack VM: its ADD (at the sandbox's creation, before
/// virt-launcher bridges the pod interface with the guest's link) runs the
/// one-shot DHCPv4 and DHCPv6 discoveries and reports both addresses in
/// one entry. Then dhcpcd in the guest, with its DUID, leases another IPv4
/// address: the entry follows it and keeps the VM's IPv6 address beside
/// it, each family's gateway with it.
#[test]
fn a_dual_stack_vms_entry_follows_the_guests_ipv4_and_keeps_its_ipv6_dnsmasq_fake_apiserver() {
    let host_before = HostDhcpcd::snapshot();
    let (vm, _v6, a6) = dual_stack_vm();
    let key = format!("{NS}/{NAD}");
    let dir = tempfile::tempdir().unwrap();
    let guest_ip = dhcpcd_moves_the_entry(&vm, dir.path());
    assert_eq!(
        vm.api.networks().expect("the entry")[&key]["ip_addresses"],
        json!([format!("{guest_ip}/24"), format!("{a6}/64")]),
        "the guest's IPv4 address replaces the one-shot's, the IPv6 one stays"
    );
    assert_eq!(
        vm.api.networks().expect("the entry")[&key]["gateway_ips"],
        json!(["192.0.2.1", "fd00:6::1"])
    );
    assert_learned_one(&vm, guest_ip);
    drop(vm);
    host_before.assert_unchanged();
}

/// A dual-stack VM after its ADD (at the sandbox's creation, before
/// virt-launcher bridges the pod interface with the guest's link): one
/// entry with its one-shot DHCPv4 and DHCPv6 addresses, dnsmasq serving
/// both families on the node's bridge (DHCPv6 from `fd00:6::100` to
/// `fd00:6::1ff`); the DHCPv6 server, and the one-shot's IPv6 address.
fn dual_stack_vm() -> (Vm, xdhcp_tests::Dnsmasq6, std::net::Ipv6Addr) {
    dual_stack_vm_on(Lab::with_clients(1))
}

/// [`dual_stack_vm`] on `lab`, the VM's launcher its first client.
fn dual_stack_vm_on(lab: Lab) -> (Vm, xdhcp_tests::Dnsmasq6, std::net::Ipv6Addr) {
    vm_of_family(lab, "dual")
}

/// [`dual_stack_vm_on`] on a network of `family`, `dual` or `ipv6` (then
/// the VM has no IPv4 address: [`Vm::one_shot`] is unspecified).
fn vm_of_family(lab: Lab, family: &str) -> (Vm, xdhcp_tests::Dnsmasq6, std::net::Ipv6Addr) {
    let v4 = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let v6 = xdhcp_tests::Dnsmasq6::start_on(
        &lab.server,
        Lab::BRIDGE,
        "fd00:6::1/64",
        "fd00:6::100,fd00:6::1ff",
        &[],
    );
    let key = format!("{NS}/{NAD}");
    let api = Api::start_in(lab.server.path());
    let uid = api.server.add_pod(
        NS,
        POD,
        &[
            ("kubevirt.io", "virt-launcher"),
            ("vm.kubevirt.io/name", "vm1"),
        ],
        &[],
    );
    api.server.put_vmi(vmi(&key));
    let agent = NodeAgent::start(lab.server.path(), &api.kubeconfig, &[]);
    let launcher = &lab.clients[0];
    let conf = json!({
        "cniVersion": "1.1.0", "name": NAD, "type": "ovn-k8s-cni-overlay",
        "topology": "localnet", "netAttachDefName": key,
        "ipam": {"type": "xdhcp", "family": family, "timeout": "20s",
                 "ipv6": {"prefixLength": 64, "gateway": "fd00:6::1"}}
    });
    let req = CniRequest {
        container_id: "c-vm1".to_owned(),
        ifname: "eth0".to_owned(),
        netns: Some(launcher.ns.path().to_path_buf()),
        args: [
            ("K8S_POD_NAMESPACE".to_owned(), NS.to_owned()),
            ("K8S_POD_NAME".to_owned(), POD.to_owned()),
            ("K8S_POD_UID".to_owned(), uid),
        ]
        .into(),
        config: config::parse(conf.to_string().as_bytes()).unwrap(),
    };
    let r = agent.add(&req);
    let one_shot = r.ips.first().map(|ip| ip.address);
    let a6 = r.ips6[0].address;
    let entry = || api.networks().expect("the entry")[&key].clone();
    let reported: Vec<String> = one_shot
        .iter()
        .map(ToString::to_string)
        .chain([a6.to_string()])
        .collect();
    assert_eq!(entry()["ip_addresses"], json!(reported));
    let (guest, link) = bridge_guest(launcher);
    let vm = Vm {
        agent,
        api,
        guest,
        _guest_link: link,
        server: Running::Dnsmasq(v4),
        lab,
        one_shot: one_shot.map_or(Ipv4Addr::UNSPECIFIED, |a| a.addr),
        req,
        guest_fs: GuestFs::new(),
    };
    (vm, v6, a6.addr)
}

/// The entry's addresses, as `ip_addresses` lists them.
fn entry_addresses(vm: &Vm) -> Value {
    vm.api.networks().expect("the entry")[&format!("{NS}/{NAD}")]["ip_addresses"].clone()
}

/// The binding table as the agent serves it, each row with its family.
fn binding_rows(vm: &Vm) -> Vec<xdhcp::bindings::BindingRow> {
    vm.agent.client().get(PATH_BINDINGS).expect("binding table")
}

/// dhcpcd runs DHCPv6 once in the dual-stack VM's guest; the address it
/// bound (its DUID-LLT is another client to dnsmasq than the VM's DUID-LL
/// the one-shot used: another address than `a6`). Within two seconds the
/// entry reports it beside the one-shot's IPv4 address, and the binding
/// table lists it, learned, family `ipv6`.
fn dhcpcd6_moves_the_entry(vm: &Vm, a6: std::net::Ipv6Addr) -> std::net::Ipv6Addr {
    let guest6 = vm
        .guest_fs
        .dhcpcd6_once(&vm.guest, "eth0", 20)
        .expect("dhcpcd bound a DHCPv6 address");
    assert_ne!(guest6, a6, "dnsmasq gives the guest's DUID another address");
    let want = if vm.one_shot.is_unspecified() {
        json!([format!("{guest6}/64")])
    } else {
        json!([format!("{}/24", vm.one_shot), format!("{guest6}/64")])
    };
    assert!(
        wait_until(Duration::from_secs(2), || entry_addresses(vm) == want),
        "the entry reports {}, the guest holds {guest6}",
        entry_addresses(vm)
    );
    let rows = binding_rows(vm);
    let learned6: Vec<_> = rows
        .iter()
        .filter(|r| r.binding.source == BindingSource::Learned)
        .collect();
    assert_eq!(learned6.len(), 1, "{rows:?}");
    let row = learned6[0];
    assert_eq!(
        (
            row.binding.ip,
            row.binding.mac.as_str(),
            row.family.as_str()
        ),
        (guest6.into(), VM_MAC, "ipv6")
    );
    assert_eq!(row.binding.port.as_deref(), Some(vm.lab.clients[0].port()));
    assert!(row.binding.expires_unix_ms.is_some(), "{row:?}");
    let table = xdhcp::bindings::render(&rows, crate_now_ms());
    assert!(
        table.lines().any(|l| l.contains(" ipv6 ")
            && l.contains(&guest6.to_string())
            && l.contains(" learned ")),
        "{table}"
    );
    guest6
}

fn crate_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A dual-stack VM whose guest runs its own DHCPv6 client (dhcpcd, with
/// its DUID-LLT: another client to the server than the VM's DUID-LL):
/// dnsmasq gives it another IPv6 address than the one-shot's, and the
/// entry's IPv6 address follows it, the IPv4 one staying; the binding
/// table lists it as learned, family `ipv6`, and the learned-binding file
/// keeps it for the next agent.
#[test]
fn a_dual_stack_vms_dhcpcd6_guest_moves_the_entrys_ipv6_address_dnsmasq_fake_apiserver() {
    let host_before = HostDhcpcd::snapshot();
    let (vm, _v6, a6) = dual_stack_vm();
    let guest6 = dhcpcd6_moves_the_entry(&vm, a6);
    assert!(
        wait_until(Duration::from_secs(3), || vm
            .agent
            .learned_file()
            .contains(&guest6.to_string())),
        "the learned-binding file: {}",
        vm.agent.learned_file()
    );
    drop(vm);
    host_before.assert_unchanged();
}

/// The guest's IPv6 link-local address (EUI-64 of the VM's MAC).
const GUEST_LL: std::net::Ipv6Addr =
    std::net::Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0xff, 0xfe00, 0x3001);

/// Sends on the node's bridge a DHCPv6 REPLY to the VM's MAC that answers
/// nothing the guest sent: transaction id `xid` from no REQUEST, a DUID of
/// the forger's choosing for the client and the server, an address of its
/// choosing inside the network's prefix, from the forger's own sources.
fn forge_reply6(vm: &Vm, xid: u32, addr: std::net::Ipv6Addr) {
    forge_reply6_as(vm, xid, addr, &[&[0, 3, 0, 1][..], &FORGER_MAC].concat());
}

/// [`forge_reply6`] with `server` (a DUID) as its Server Identifier, for
/// the VM's DUID-LL and IAID 1.
fn forge_reply6_as(vm: &Vm, xid: u32, addr: std::net::Ipv6Addr, server: &[u8]) {
    reply6_from(
        vm,
        xid,
        addr,
        server,
        (FORGER_MAC, "fe80::6666".parse().unwrap()),
    );
}

/// Sends on the node's bridge a DHCPv6 REPLY to the VM's MAC for the VM's
/// DUID-LL and IAID 1, binding `addr`, transaction `xid`, with `server`
/// (a DUID) as its Server Identifier, from the Ethernet and IPv6 sources
/// `from`.
fn reply6_from(
    vm: &Vm,
    xid: u32,
    addr: std::net::Ipv6Addr,
    server: &[u8],
    from: ([u8; 6], std::net::Ipv6Addr),
) {
    use dhcproto::v6::{DhcpOption, MessageType};

    let mac = parse_mac(VM_MAC).unwrap();
    let payload = xdhcp_tests::frames::dhcp6(MessageType::Reply, xid, mac, (addr, 3600), |o| {
        o.insert(DhcpOption::ServerId(server.to_vec()));
    });
    let frame = xdhcp_tests::frames::to_guest6(from, (mac, GUEST_LL), &payload);
    vm.lab.server.send_frame(Lab::BRIDGE, &frame);
}

/// Forged DHCPv6 REPLYs to the VM's MAC from a host on the segment, each
/// naming an address inside the network's prefix, pass the guard's egress
/// like any reply towards the VM: they answer no message of the guest, so
/// they are counted (`unsolicited`) and ignored, nothing written, nothing
/// learned; the guest's own DHCPv6 exchange afterwards still moves the
/// entry.
#[test]
fn a_forged_dhcpv6_reply_from_the_segment_moves_nothing_the_guests_exchange_still_does_dnsmasq_fake_apiserver()
 {
    let host_before = HostDhcpcd::snapshot();
    let (vm, _v6, a6) = dual_stack_vm();
    let before = refused(&vm, "unsolicited");
    let patches = vm.api.patches();
    let entry = entry_addresses(&vm);
    let wanted: std::net::Ipv6Addr = "fd00:6::1ee".parse().unwrap();
    for xid in 0..5 {
        forge_reply6(&vm, 0x00ba_d000 + xid, wanted);
    }
    assert!(
        wait_until(Duration::from_secs(2), || refused(&vm, "unsolicited")
            >= before + 5),
        "the forgeries were not seen and refused: {:?}",
        metric_lines(vm.lab.server.path(), "xdhcp_learn")
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(entry_addresses(&vm), entry, "the forgery moved the entry");
    assert_eq!(vm.api.patches(), patches, "the forgery wrote the pod");
    assert!(learned(&vm).is_empty(), "{:?}", learned(&vm));

    let guest6 = dhcpcd6_moves_the_entry(&vm, a6);
    assert_ne!(guest6, wanted);
    drop(vm);
    host_before.assert_unchanged();
}

/// The VM's DHCPv6 lease record: the one-shot's `lease6`, with the
/// server's DUID (its REPLY's Server Identifier) and where that REPLY came
/// from.
fn vm_lease6(vm: &Vm) -> Value {
    let files = xdhcp_tests::agent::lease_record_files(&vm.agent.0.state_dir);
    files
        .iter()
        .map(|f| serde_json::from_slice::<Value>(&std::fs::read(f).unwrap()).unwrap())
        .find_map(|r| {
            (r["containerId"] == "c-vm1" && !r["lease6"].is_null()).then(|| r["lease6"].clone())
        })
        .unwrap_or_else(|| panic!("no DHCPv6 lease record for the VM in {files:?}"))
}

/// Sends from the guest's interface a DHCPv6 REQUEST of the VM's DUID-LL
/// for `addr`, transaction `xid`, naming a server that is not the
/// network's (the network's server leaves it unanswered: it stays in
/// flight for its whole window).
fn guest_request6(vm: &Vm, xid: u32, addr: std::net::Ipv6Addr) {
    let nobody = [0, 3, 0, 1, 2, 0, 0, 0, 0x99, 0x99];
    guest_sends6(vm, dhcproto::v6::MessageType::Request, xid, addr, &nobody);
}

/// Sends from the guest's interface a DHCPv6 client message of `kind`
/// from the VM's DUID-LL, IAID 1, naming `addr` and the server `server`
/// (a DUID), transaction `xid`.
fn guest_sends6(
    vm: &Vm,
    kind: dhcproto::v6::MessageType,
    xid: u32,
    addr: std::net::Ipv6Addr,
    server: &[u8],
) {
    use dhcproto::v6::DhcpOption;

    let mac = parse_mac(VM_MAC).unwrap();
    let payload = xdhcp_tests::frames::dhcp6(kind, xid, mac, (addr, 0), |o| {
        o.insert(DhcpOption::ServerId(server.to_vec()));
        o.insert(DhcpOption::ElapsedTime(0));
    });
    let frame = xdhcp_tests::frames::from_guest6((mac, GUEST_LL), &payload);
    vm.guest.send_frame("eth0", &frame);
}

/// A host on the segment that learned the network's server's DUID (it is
/// in every REPLY and ADVERTISE) answers the guest's REQUEST in flight
/// with it — the right transaction, the guest's DUID and IAID, an address
/// inside the prefix that no one holds — but from its own link-local
/// address and MAC. The VM's lease recorded where the server's REPLY came
/// from, so the forgery is refused (`server_source`): nothing written,
/// nothing learned; the guest's own exchange afterwards still moves the
/// entry. (The test plays the guest's REQUEST itself, to a server that
/// does not answer it, so that no real REPLY can close the exchange before
/// the forgery arrives.)
#[test]
fn a_forged_dhcpv6_reply_with_the_servers_duid_from_another_source_is_refused_dnsmasq_fake_apiserver()
 {
    let host_before = HostDhcpcd::snapshot();
    let (vm, _v6, a6) = dual_stack_vm();
    let lease6 = vm_lease6(&vm);
    let duid: Vec<u8> = serde_json::from_value(lease6["server_id"].clone()).unwrap();
    let source = &lease6["server_source"];
    assert!(
        source["ip"]
            .as_str()
            .is_some_and(|ip| ip.starts_with("fe80:")),
        "the VM's lease records no link-local source for the server's REPLY: {lease6}"
    );
    let before = refused(&vm, "server_source");
    let patches = vm.api.patches();
    let entry = entry_addresses(&vm);
    let wanted: std::net::Ipv6Addr = "fd00:6::1ef".parse().unwrap();
    let xid = 0x00c0_ffee;
    guest_request6(&vm, xid, wanted);
    // The REQUEST reaches the agent before the answer to it.
    std::thread::sleep(Duration::from_millis(300));
    forge_reply6_as(&vm, xid, wanted, &duid);
    assert!(
        wait_until(Duration::from_secs(3), || refused(&vm, "server_source")
            > before),
        "the forgery was not refused as server_source: {:?}; the entry reports {}",
        metric_lines(vm.lab.server.path(), "xdhcp_learn"),
        entry_addresses(&vm)
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(entry_addresses(&vm), entry, "the forgery moved the entry");
    assert_eq!(vm.api.patches(), patches, "the forgery wrote the pod");
    assert!(learned(&vm).is_empty(), "{:?}", learned(&vm));

    let guest6 = dhcpcd6_moves_the_entry(&vm, a6);
    assert_ne!(guest6, wanted);
    drop(vm);
    host_before.assert_unchanged();
}

/// A guest DECLINEs the IPv6 address its server's REPLY gave it (its
/// duplicate address detection found it in use): it never held it, so the
/// entry, which the REPLY had moved there, goes back to the address it
/// reported before (the VM's one-shot's), the IPv4 one untouched, and no
/// binding is left for the declined address. (The test plays the guest's
/// REQUEST and DECLINE and the server's REPLY, from the server's own
/// sources and with its DUID: a guest's real exchange, whose DAD failure
/// is not the point here.)
#[test]
fn a_guest_declining_its_ipv6_address_puts_the_entrys_previous_one_back_dnsmasq_fake_apiserver() {
    let host_before = HostDhcpcd::snapshot();
    let (vm, _v6, a6) = dual_stack_vm();
    let lease6 = vm_lease6(&vm);
    let duid: Vec<u8> = serde_json::from_value(lease6["server_id"].clone()).unwrap();
    let source = &lease6["server_source"];
    let from_ip: std::net::Ipv6Addr = source["ip"].as_str().unwrap().parse().unwrap();
    let from_mac: [u8; 6] = serde_json::from_value(source["mac"].clone())
        .unwrap_or_else(|_| vm.lab.server.mac(Lab::BRIDGE));
    let before = json!([format!("{}/24", vm.one_shot), format!("{a6}/64")]);
    assert_eq!(entry_addresses(&vm), before);

    let given: std::net::Ipv6Addr = "fd00:6::1e7".parse().unwrap();
    let xid = 0x00de_c1e0;
    guest_request6(&vm, xid, given);
    // The REQUEST reaches the agent before the answer to it.
    std::thread::sleep(Duration::from_millis(300));
    reply6_from(&vm, xid, given, &duid, (from_mac, from_ip));
    let moved = json!([format!("{}/24", vm.one_shot), format!("{given}/64")]);
    assert!(
        wait_until(Duration::from_secs(3), || entry_addresses(&vm) == moved),
        "the REPLY did not move the entry: {}; {:?}",
        entry_addresses(&vm),
        metric_lines(vm.lab.server.path(), "xdhcp_learn")
    );

    guest_sends6(
        &vm,
        dhcproto::v6::MessageType::Decline,
        xid + 1,
        given,
        &duid,
    );
    assert!(
        wait_until(Duration::from_secs(3), || entry_addresses(&vm) == before),
        "the entry stays at the declined address: {}",
        entry_addresses(&vm)
    );
    let rows = binding_rows(&vm);
    assert!(
        rows.iter()
            .all(|r| r.binding.ip != std::net::IpAddr::from(given)),
        "a binding is left for the declined address: {rows:?}"
    );
    drop(vm);
    host_before.assert_unchanged();
}

/// A dual-stack VM's guest configures static global addresses itself
/// (`ip -6 addr add`, duplicate address detection on, as by default): one
/// inside the network's prefix is reported in the entry beside the VM's
/// two leased addresses, and listed by `xdhcp bindings` (source `dad`,
/// family `ipv6`); one that a pod on the same network leased is refused
/// (`address_taken`) and reported nowhere.
#[test]
fn a_dual_stack_vms_guest_static_ipv6_address_is_reported_a_neighbours_is_refused_dnsmasq_fake_apiserver()
 {
    let (vm, _v6, a6) = dual_stack_vm_on(Lab::with_clients(2));
    // A pod on the same network, on the second client: its DHCPv6 lease
    // is another binding of the network.
    let uid = vm.api.server.add_pod(NS, "pod2", &[], &[]);
    let mut req = vm.req.clone();
    req.container_id = "c-pod2".to_owned();
    req.netns = Some(vm.lab.clients[1].ns.path().to_path_buf());
    req.args = [
        ("K8S_POD_NAMESPACE".to_owned(), NS.to_owned()),
        ("K8S_POD_NAME".to_owned(), "pod2".to_owned()),
        ("K8S_POD_UID".to_owned(), uid),
    ]
    .into();
    let neighbour = vm.agent.add(&req).ips6[0].address.addr;

    let own: std::net::Ipv6Addr = "fd00:6::abc".parse().unwrap();
    vm.guest
        .ip(&["-6", "addr", "add", &format!("{own}/64"), "dev", "eth0"]);
    let want = json!([
        format!("{}/24", vm.one_shot),
        format!("{a6}/64"),
        format!("{own}/64")
    ]);
    assert!(
        wait_until(Duration::from_secs(3), || entry_addresses(&vm) == want),
        "the entry reports {}",
        entry_addresses(&vm)
    );
    let rows = binding_rows(&vm);
    let dad: Vec<_> = rows
        .iter()
        .filter(|r| r.binding.source == BindingSource::Dad)
        .collect();
    assert_eq!(dad.len(), 1, "{rows:?}");
    assert_eq!(
        (
            dad[0].binding.ip,
            dad[0].binding.mac.as_str(),
            dad[0].family.as_str()
        ),
        (own.into(), VM_MAC, "ipv6")
    );
    assert_eq!(
        dad[0].binding.port.as_deref(),
        Some(vm.lab.clients[0].port())
    );

    let taken = refused(&vm, "address_taken");
    let patches = vm.api.patches();
    vm.guest.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{neighbour}/64"),
        "dev",
        "eth0",
    ]);
    assert!(
        wait_until(Duration::from_secs(3), || refused(&vm, "address_taken")
            > taken),
        "the neighbour's address was not refused: {:?}",
        metric_lines(vm.lab.server.path(), "xdhcp_learn")
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        entry_addresses(&vm),
        want,
        "the neighbour's address is reported"
    );
    assert_eq!(vm.api.patches(), patches);
    assert!(
        binding_rows(&vm)
            .iter()
            .all(|r| r.binding.ip != std::net::IpAddr::V6(neighbour) || r.binding.mac != VM_MAC),
        "{:?}",
        binding_rows(&vm)
    );
}

/// A VM on an IPv6-only network: its entry has the one-shot's DHCPv6
/// address alone, and the guest's own `dhcpcd -6` moves it (no IPv4
/// address to keep).
#[test]
fn an_ipv6_vms_dhcpcd6_guest_moves_its_entry_dnsmasq_fake_apiserver() {
    let host_before = HostDhcpcd::snapshot();
    let (vm, _v6, a6) = vm_of_family(Lab::with_clients(1), "ipv6");
    dhcpcd6_moves_the_entry(&vm, a6);
    drop(vm);
    host_before.assert_unchanged();
}
