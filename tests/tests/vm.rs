//! KubeVirt VM pods through the agent (in-process, `xdhcp::daemon::run`)
//! against a real dnsmasq in network namespaces: one-shot discovery, the VFIO
//! handoff, the MAC chain and the `pod-networks` report.
//!
//! - Bridge binding: a virt-launcher-like namespace whose pod interface
//!   `net1` is enslaved to bridge `k6t-net1` together with tap `tap1`. The
//!   ADD discovers the VM's address with the VMI's MAC and reports it
//!   (CNI result, `k8s.ovn.org/pod-networks` in the embedded store) without
//!   configuring it; DEL sends no RELEASE. A second launcher namespace, the
//!   live-migration target, gets the same MAC and address by asking for the
//!   address the VMI status reports (INIT-REBOOT: a REQUEST, no DISCOVER).
//! - VFIO passthrough: the agent runs inside a namespace that plays the
//!   node's host namespace, holding the VF netdev (a veth to the lab bridge);
//!   a fake sysfs tree shows the VF bound to `vfio-pci`, and a fake kernel
//!   makes the netdev appear under the device's `net/` dir once the driver's
//!   `bind` file is written. The ADD hands the VF off, runs the DORA on that
//!   netdev with the VM's MAC, and leaves the tree on `vfio-pci`. (The kernel
//!   semantics of bind/unbind, failures at every step and the journal are
//!   covered by `tests/vfio.rs`; this file covers the daemon's use of them.)
//!
//! VM identity comes from the embedded pod store (`--kube=off`) seeded with
//! the launcher pod's labels and the VMI, the way an operator (or a test)
//! exercises the VM path without a cluster.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use xdhcp::cli::{AgentArgs, DatapathChoice, KubeMode};
use xdhcp::cni::config;
use xdhcp::cni::types::code;
use xdhcp::rpc::{self, ClientError, CniRequest, LeaseView};
use xdhcp_tests::agent::ThreadAgent;
use xdhcp_tests::tmpfs::Tmpfs;
use xdhcp_tests::{
    Dnsmasq, DnsmasqConfig, Lab, NetNs, Process, StandInApi, format_mac, wait_until,
};

const NS: &str = "tenant";
const POD_NETWORKS: &str = "k8s.ovn.org/pod-networks";

/// An agent on its own thread (optionally inside a network namespace, which
/// is then the agent's "host" namespace), stopped on drop.
struct TestAgent(ThreadAgent);

impl TestAgent {
    /// `seed`: the embedded pod store document, written before start.
    fn start(netns: Option<&Path>, seed: &Value, tweak: impl FnOnce(&mut AgentArgs)) -> Self {
        Self(ThreadAgent::start(netns, "xdt-vm-agent-", |args| {
            std::fs::write(
                args.state_dir.join("pod-networks.json"),
                serde_json::to_vec_pretty(seed).unwrap(),
            )
            .unwrap();
            args.kube = KubeMode::Off;
            tweak(args);
        }))
    }

    fn post(&self, path: &str, req: &CniRequest) -> Result<Value, ClientError> {
        self.client().post(path, req)
    }

    fn leases(&self) -> Vec<LeaseView> {
        self.client().get(rpc::PATH_LEASES).expect("lease table")
    }

    fn store_path(&self) -> PathBuf {
        self.state_dir.join("pod-networks.json")
    }

    fn store(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.store_path()).unwrap()).unwrap()
    }

    /// Replace the store document (atomically, as the agent reads it per call).
    fn set_store(&self, doc: &Value) {
        let tmp = self.dir.path().join("pod-networks.json.new");
        std::fs::write(&tmp, serde_json::to_vec_pretty(doc).unwrap()).unwrap();
        std::fs::rename(&tmp, self.store_path()).unwrap();
    }

    /// This network's entry of the pod's `k8s.ovn.org/pod-networks`, if any.
    fn network_entry(&self, pod: &str, key: &str) -> Option<Value> {
        let store = self.store();
        let ann = store["pods"][format!("{NS}/{pod}")]["annotations"][POD_NETWORKS].as_str()?;
        let doc: Value = serde_json::from_str(ann).expect("annotation is JSON");
        doc.get(key).cloned()
    }
}

impl std::ops::Deref for TestAgent {
    type Target = ThreadAgent;

    fn deref(&self) -> &ThreadAgent {
        &self.0
    }
}

fn launcher_pod(vmi: &str) -> Value {
    json!({"labels": {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": vmi}})
}

/// A VMI with a masquerade pod network and one secondary interface `iface`
/// on the NAD `nad_key`, with `mac` in its spec.
fn vmi_doc(name: &str, iface: &str, nad_key: &str, mac: &str) -> Value {
    xdhcp_tests::fake_apiserver::vmi((NS, name), true, (iface, nad_key, mac))
}

fn request(
    container: &str,
    pod: &str,
    netns: &Path,
    ifname: &str,
    config_json: &Value,
) -> CniRequest {
    CniRequest {
        container_id: container.to_owned(),
        ifname: ifname.to_owned(),
        netns: Some(netns.to_path_buf()),
        args: [
            ("K8S_POD_NAMESPACE".to_owned(), NS.to_owned()),
            ("K8S_POD_NAME".to_owned(), pod.to_owned()),
            ("K8S_POD_UID".to_owned(), format!("uid-{pod}")),
        ]
        .into(),
        config: config::parse(config_json.to_string().as_bytes()).expect("test config is valid"),
    }
}

/// The NAD config OVN-Kubernetes generates for a DHCP localnet network.
fn localnet_config(nad: &str, device_id: Option<&str>) -> Value {
    let mut c = json!({
        "cniVersion": "1.0.0", "name": nad, "type": "ovn-k8s-cni-overlay",
        "topology": "localnet", "role": "secondary", "physicalNetworkName": "physnet",
        "netAttachDefName": format!("{NS}/{nad}"),
        "ipam": {"type": "dhcp"}
    });
    if let Some(d) = device_id {
        c["deviceID"] = json!(d);
    }
    c
}

/// dnsmasq log lines of `kind` (`DHCPDISCOVER`, ...) for `mac`.
fn log_count(d: &Dnsmasq, kind: &str, mac: &str) -> usize {
    d.log()
        .lines()
        .filter(|l| l.contains(&format!("{kind}(")) && l.contains(mac))
        .count()
}

/// The DHCP frames (UDP 67/68) crossing an interface while it runs
/// (tcpdump; used on the lab side of a client's link, where every frame the
/// agent sends arrives).
struct DhcpCapture {
    process: Process,
    file: PathBuf,
    _dir: tempfile::TempDir,
}

impl DhcpCapture {
    fn start(ns: &NetNs, ifname: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("xdt-pcap-")
            .tempdir()
            .unwrap();
        let file = dir.path().join("dhcp.pcap");
        let log = dir.path().join("tcpdump.log");
        let mut cmd = ns.command("tcpdump");
        cmd.args(["--immediate-mode", "-i", ifname, "-n", "-U", "-w"])
            .arg(&file)
            .args(["udp", "port", "67", "or", "udp", "port", "68"]);
        let process = Process::spawn_logged("tcpdump", cmd, &log);
        let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            wait_until(Duration::from_secs(5), || read_log()
                .contains("listening on")),
            "tcpdump did not start on {ifname} in {}: {}",
            ns.name(),
            read_log()
        );
        Self {
            process,
            file,
            _dir: dir,
        }
    }

    /// Stop; one summary line per captured frame.
    fn finish(mut self) -> Vec<String> {
        self.process.stop(Duration::from_secs(3));
        let out = std::process::Command::new(xdhcp_tests::program("tcpdump"))
            .args(["-n", "-r"])
            .arg(&self.file)
            .output()
            .expect("run tcpdump -r");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// Make `ns` look like a virt-launcher with bridge binding: `pod_if` and a
/// tap enslaved to bridge `k6t-<pod_if>`.
fn bridge_binding(ns: &NetNs, pod_if: &str) {
    let br = format!("k6t-{pod_if}");
    ns.ip(&["link", "add", &br, "type", "bridge"]);
    ns.ip(&["link", "set", pod_if, "master", &br]);
    ns.ip(&["tuntap", "add", "dev", "tap1", "mode", "tap"]);
    ns.ip(&["link", "set", "tap1", "master", &br]);
    ns.link_up(&br);
    ns.link_up("tap1");
    ns.link_up(pod_if);
}

fn assert_no_ipv4(ns: &NetNs, ifnames: &[&str]) {
    for i in ifnames {
        assert!(
            ns.ipv4_addrs(i).is_empty(),
            "{i} in {} got an address: {:?}",
            ns.name(),
            ns.ipv4_addrs(i)
        );
    }
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario: source ADD, DEL, migration target ADD, each with its checks"
)]
fn bridge_binding_vm_one_shot_no_release_and_migration_keeps_mac_and_address() {
    const VM_MAC: &str = "02:00:00:00:20:08";
    const NAD: &str = "localnet-dhcp";
    let key = format!("{NS}/{NAD}");
    let mut lab = Lab::with_clients(0);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    lab.add_client("net1");
    let src = &lab.clients[0];
    bridge_binding(&src.ns, "net1");
    assert_ne!(format_mac(src.mac), VM_MAC);

    let mut seed = json!({
        "pods": {format!("{NS}/virt-launcher-vm1-src"): launcher_pod("vm1")},
        "vmis": {format!("{NS}/vm1"): vmi_doc("vm1", "dhcpnet", &key, VM_MAC)}
    });
    let agent = TestAgent::start(None, &seed, |a| a.datapath = DatapathChoice::Auto);

    // ADD on the migration source.
    let req = request(
        "ctr-src",
        "virt-launcher-vm1-src",
        src.ns.path(),
        "net1",
        &localnet_config(NAD, None),
    );
    let r = agent.add(&req).expect("VM ADD succeeds");
    let ip = r.ips[0].address.addr;
    assert_eq!(r.ips[0].address.prefix_len, 24);
    assert_eq!(r.ips[0].gateway, Some(lab.server_ip));
    // The lease is the VM's (its MAC), not the pod interface's.
    let lease = dnsmasq
        .lease_for(xdhcp_tests::parse_mac(VM_MAC).unwrap())
        .unwrap_or_else(|| panic!("dnsmasq has no lease for {VM_MAC}:\n{}", dnsmasq.log()));
    assert_eq!(lease.ip, ip);
    assert!(dnsmasq.lease_for(src.mac).is_none());
    assert_eq!(log_count(&dnsmasq, "DHCPDISCOVER", VM_MAC), 1);
    // Never configured on the pod interface (nor the bridge or tap).
    assert_no_ipv4(&src.ns, &["net1", "k6t-net1", "tap1"]);
    // Reported: the pod-networks entry, byte-for-byte the OKEP's shape.
    let entry = agent
        .network_entry("virt-launcher-vm1-src", &key)
        .expect("pod-networks entry written");
    assert_eq!(
        entry,
        json!({"ip_addresses": [format!("{ip}/24")], "mac_address": VM_MAC,
               "gateway_ips": ["192.0.2.1"], "role": "secondary", "ipam_mode": "dhcp"})
    );
    let table = agent.leases();
    assert_eq!(table.len(), 1, "{table:?}");
    assert_eq!(table[0].workload, "vm:vm1");
    assert_eq!(table[0].state, "OneShot");
    assert_eq!(table[0].mac, VM_MAC);
    // No lease maintenance: the one exchange stays the only one.
    let acks = log_count(&dnsmasq, "DHCPACK", VM_MAC);
    assert_eq!(acks, 1);

    // DEL: nothing on the wire (no RELEASE), the server keeps the lease;
    // the entry goes.
    let cap = DhcpCapture::start(&lab.server, src.port());
    let _ = agent.post(rpc::PATH_DEL, &req).expect("DEL");
    std::thread::sleep(Duration::from_millis(1500));
    let sent = cap.finish();
    assert!(sent.is_empty(), "a VM DEL sent DHCP frames: {sent:?}");
    assert!(
        !dnsmasq.log().contains("DHCPRELEASE"),
        "a VM DEL must not release:\n{}",
        dnsmasq.log()
    );
    assert_eq!(
        dnsmasq
            .lease_for(xdhcp_tests::parse_mac(VM_MAC).unwrap())
            .map(|l| l.ip),
        Some(ip),
        "the VM's lease must stay on the server"
    );
    assert!(agent.network_entry("virt-launcher-vm1-src", &key).is_none());
    assert!(agent.leases().is_empty());

    // Live migration: a new launcher namespace, the VMI status now reports
    // the interface's MAC and address.
    lab.add_client("net1");
    let (src, dst) = (&lab.clients[0], &lab.clients[1]);
    bridge_binding(&dst.ns, "net1");
    assert_ne!(dst.mac, src.mac);
    seed["pods"][format!("{NS}/virt-launcher-vm1-dst")] = launcher_pod("vm1");
    seed["vmis"][format!("{NS}/vm1")]["status"] = json!({"interfaces": [
        {"name": "default", "ipAddress": "10.128.0.7", "mac": "0a:58:0a:80:00:07"},
        {"name": "dhcpnet", "interfaceName": "eth1", "mac": VM_MAC,
         "ipAddress": ip.to_string(), "ipAddresses": [ip.to_string()]}
    ]});
    agent.set_store(&seed);
    let discovers = log_count(&dnsmasq, "DHCPDISCOVER", VM_MAC);
    let requests = log_count(&dnsmasq, "DHCPREQUEST", VM_MAC);
    let req2 = request(
        "ctr-dst",
        "virt-launcher-vm1-dst",
        dst.ns.path(),
        "net1",
        &localnet_config(NAD, None),
    );
    let cap = DhcpCapture::start(&lab.server, dst.port());
    let r2 = agent.add(&req2).expect("migration target ADD succeeds");
    // The capture (on the lab side of the target's link) sees the exchange.
    let seen = cap.finish();
    assert!(
        seen.iter()
            .any(|l| l.contains(&format!("Request from {VM_MAC}"))),
        "{seen:?}"
    );
    assert_eq!(r2.ips[0].address.addr, ip, "same address after migration");
    assert_eq!(
        log_count(&dnsmasq, "DHCPDISCOVER", VM_MAC),
        discovers,
        "the target asks for the known address (INIT-REBOOT), no DISCOVER:\n{}",
        dnsmasq.log()
    );
    assert_eq!(log_count(&dnsmasq, "DHCPREQUEST", VM_MAC), requests + 1);
    assert!(
        dnsmasq
            .log()
            .lines()
            .any(|l| l.contains("DHCPREQUEST(") && l.contains(&ip.to_string()))
    );
    assert_no_ipv4(&dst.ns, &["net1", "k6t-net1", "tap1"]);
    let entry = agent
        .network_entry("virt-launcher-vm1-dst", &key)
        .expect("target entry");
    assert_eq!(entry["mac_address"], VM_MAC, "same MAC after migration");
    assert_eq!(entry["ip_addresses"], json!([format!("{ip}/24")]));
    let cap = DhcpCapture::start(&lab.server, dst.port());
    let _ = agent.post(rpc::PATH_DEL, &req2).expect("target DEL");
    std::thread::sleep(Duration::from_millis(500));
    let sent = cap.finish();
    assert!(sent.is_empty(), "a VM DEL sent DHCP frames: {sent:?}");
    assert!(!dnsmasq.log().contains("DHCPRELEASE"));
}

#[test]
fn migration_target_whose_reported_address_is_refused_falls_back_to_discover() {
    const VM_MAC: &str = "02:00:00:00:20:0d";
    const NAD: &str = "localnet-dhcp";
    let key = format!("{NS}/{NAD}");
    let mut lab = Lab::with_clients(0);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    lab.add_client("net1");
    let c = &lab.clients[0];
    bridge_binding(&c.ns, "net1");
    // The VMI reports an address from another network (the VM moved
    // between subnets, or the status is stale): the server NAKs it.
    let mut vmi = vmi_doc("vm4", "dhcpnet", &key, VM_MAC);
    vmi["status"] = json!({"interfaces": [
        {"name": "dhcpnet", "mac": VM_MAC, "ipAddress": "198.51.100.7"}
    ]});
    let seed = json!({
        "pods": {format!("{NS}/virt-launcher-vm4-x"): launcher_pod("vm4")},
        "vmis": {format!("{NS}/vm4"): vmi}
    });
    let agent = TestAgent::start(None, &seed, |a| a.datapath = DatapathChoice::Afpacket);
    let req = request(
        "ctr-nak",
        "virt-launcher-vm4-x",
        c.ns.path(),
        "net1",
        &localnet_config(NAD, None),
    );
    let r = agent.add(&req).expect("ADD falls back to DISCOVER");
    let ip = r.ips[0].address.addr;
    assert_eq!(ip.octets()[..3], [192, 0, 2], "{ip}");
    assert!(
        log_count(&dnsmasq, "DHCPNAK", VM_MAC) >= 1,
        "{}",
        dnsmasq.log()
    );
    assert_eq!(
        log_count(&dnsmasq, "DHCPDISCOVER", VM_MAC),
        1,
        "{}",
        dnsmasq.log()
    );
    assert_eq!(
        dnsmasq
            .lease_for(xdhcp_tests::parse_mac(VM_MAC).unwrap())
            .map(|l| l.ip),
        Some(ip)
    );
    assert_no_ipv4(&c.ns, &["net1"]);
}

/// The same VM path with `--kube=on` and `--kubeconfig` pointing at an
/// in-process fake API server (not a cluster) driven by the real
/// `kube::Client`: the pod and VMI come from the API, the entry is patched
/// next to the pod's `default` entry, DEL removes only it, and an ADD whose
/// `K8S_POD_UID` is not the pod's (a recreated pod) writes nothing.
#[test]
fn vm_pod_via_the_fake_api_server_patches_pod_networks_and_refuses_a_recreated_pod() {
    const VM_MAC: &str = "02:00:00:00:20:0c";
    const NAD: &str = "localnet-dhcp";
    const POD: &str = "virt-launcher-vm3-x";
    let key = format!("{NS}/{NAD}");
    let server = StandInApi::start();
    let default_entry = json!({"default": {"ip_addresses": ["10.128.0.9/23"],
        "mac_address": "0a:58:0a:80:00:09", "gateway_ips": ["10.128.0.1"], "role": "primary"}});
    let uid = server.add_pod(
        NS,
        POD,
        &[
            ("kubevirt.io", "virt-launcher"),
            ("vm.kubevirt.io/name", "vm3"),
        ],
        &[(POD_NETWORKS, &default_entry.to_string())],
    );
    server.put_vmi(vmi_doc("vm3", "dhcpnet", &key, VM_MAC));
    let kubeconfig = server.kubeconfig.clone();

    let mut lab = Lab::with_clients(0);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    lab.add_client("net1");
    let c = &lab.clients[0];
    bridge_binding(&c.ns, "net1");
    let agent = TestAgent::start(None, &json!({}), |a| {
        a.kube = KubeMode::On;
        a.kubeconfig = Some(kubeconfig.clone());
        a.datapath = DatapathChoice::Afpacket;
    });

    let mut req = request(
        "ctr-kube",
        POD,
        c.ns.path(),
        "net1",
        &localnet_config(NAD, None),
    );
    req.args.insert("K8S_POD_UID".into(), uid.clone());
    let r = agent.add(&req).expect("VM ADD with the API");
    let ip = r.ips[0].address.addr;
    assert_eq!(
        dnsmasq
            .lease_for(xdhcp_tests::parse_mac(VM_MAC).unwrap())
            .map(|l| l.ip),
        Some(ip)
    );
    assert_no_ipv4(&c.ns, &["net1"]);
    let annotation = || -> Value {
        serde_json::from_str(
            &server
                .annotation(NS, POD, POD_NETWORKS)
                .expect("annotation"),
        )
        .expect("the annotation is JSON")
    };
    let ann = annotation();
    assert_eq!(
        ann["default"], default_entry["default"],
        "default entry kept"
    );
    assert_eq!(
        ann[&key],
        json!({"ip_addresses": [format!("{ip}/24")], "mac_address": VM_MAC,
               "gateway_ips": ["192.0.2.1"], "role": "secondary", "ipam_mode": "dhcp"})
    );
    let _ = agent.post(rpc::PATH_DEL, &req).expect("DEL");
    let ann = annotation();
    assert!(ann.get(&key).is_none(), "{ann}");
    assert_eq!(ann["default"], default_entry["default"]);
    assert!(!dnsmasq.log().contains("DHCPRELEASE"));

    // The runtime asks for a pod UID the API no longer has (recreated).
    let mut stale = request(
        "ctr-stale",
        POD,
        c.ns.path(),
        "net1",
        &localnet_config(NAD, None),
    );
    stale.args.insert(
        "K8S_POD_UID".into(),
        "00000000-0000-4000-8000-00000000dead".into(),
    );
    let e = agent.add(&stale).unwrap_err().into_cni();
    assert_eq!(e.code, code::KUBE_API, "{e:?}");
    assert!(
        e.msg.contains("recreated") && e.msg.contains(POD),
        "{}",
        e.msg
    );
    let ann = annotation();
    assert!(
        ann.get(&key).is_none(),
        "nothing written for a stale UID: {ann}"
    );
    assert!(agent.leases().is_empty(), "{:?}", agent.leases());
    drop(agent);
    drop(server);
}

// ------------------------------------------------------- IPv6, dual stack

/// The ADD's config of an IPv6 (`family` `ipv6`) or dual-stack (`dual`)
/// localnet network, asking for `"apply": true`, which a VM's discovery
/// ignores.
fn localnet_config6(nad: &str, family: &str) -> Value {
    json!({
        "cniVersion": "1.1.0", "name": nad, "type": "ovn-k8s-cni-overlay",
        "topology": "localnet", "role": "secondary", "physicalNetworkName": "physnet",
        "netAttachDefName": format!("{NS}/{nad}"),
        "ipam": {"type": "xdhcp", "family": family, "apply": true, "timeout": "20s",
                 "ipv6": {"prefixLength": 64, "gateway": "fd00:6::1"}}
    })
}

/// The DUID-LL (type 3, hardware type 1) of `mac`, as the servers write it.
fn duid_ll(mac: &str) -> String {
    format!("00:03:00:01:{mac}")
}

/// Whether `addr` is on `ifname` in `ns`.
fn has_address6(ns: &NetNs, ifname: &str, addr: std::net::Ipv6Addr) -> bool {
    ns.ip(&["-6", "addr", "show", "dev", ifname])
        .contains(&format!("{addr}/"))
}

/// A VM on an IPv6 network (its launcher's `net1` as the VM's device,
/// before virt-launcher bridges it: the ADD comes at the sandbox's
/// creation) gets a one-shot DHCPv6 discovery with its own DUID-LL and
/// IAID: Kea binds the address to the VM's MAC, not the launcher
/// interface's; the address is reported (result, entry with the VM's MAC,
/// `xdhcp leases`), never configured on the launcher's interface though the
/// network asks for `apply`, and CHECK passes without it. The agent runs
/// in the node's namespace, so the guard goes on the launcher's port with
/// the VM's MAC (which the interface's is not). A migration target's ADD
/// (another launcher, the same VM) while the source still runs gets the
/// same address; DELs send no RELEASE: Kea still holds the binding.
#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario: source ADD, CHECK, migration target ADD, both DELs, each with its checks"
)]
fn a_vm_on_an_ipv6_network_gets_its_duids_address_never_released_and_kept_across_migration() {
    const VM_MAC: &str = "02:00:00:00:20:61";
    const NAD: &str = "localnet-v6";
    let key = format!("{NS}/{NAD}");
    let mut lab = Lab::builder()
        .server_behind_uplink()
        .client_ifname("net1")
        .build();
    let kea = xdhcp_tests::Kea6::start(lab.dhcp_ns());
    lab.add_client("net1");
    let (src, dst) = (&lab.clients[0], &lab.clients[1]);
    assert_ne!(format_mac(src.mac), VM_MAC);
    assert_ne!(format_mac(dst.mac), VM_MAC);
    let seed = json!({
        "pods": {
            format!("{NS}/virt-launcher-vm6-src"): launcher_pod("vm6"),
            format!("{NS}/virt-launcher-vm6-dst"): launcher_pod("vm6"),
        },
        "vmis": {format!("{NS}/vm6"): vmi_doc("vm6", "dhcpnet", &key, VM_MAC)}
    });
    let agent = TestAgent::start(Some(lab.server.path()), &seed, |a| {
        a.datapath = DatapathChoice::Afpacket;
    });

    let req = request(
        "ctr-v6-src",
        "virt-launcher-vm6-src",
        src.ns.path(),
        "net1",
        &localnet_config6(NAD, "ipv6"),
    );
    let r = agent.add(&req).expect("VM ADD on an IPv6 network");
    assert!(r.ips.is_empty(), "{r:?}");
    let a6 = r.ips6[0].address;
    assert_eq!(a6.prefix_len, 64);
    let ip6 = a6.addr;
    assert!(
        (0xfd00_0006_0000_0000_0000_0000_0000_0100..=0xfd00_0006_0000_0000_0000_0000_0000_01ff)
            .contains(&u128::from(ip6)),
        "{ip6} is not in the server's range"
    );
    // Bound to the VM's DUID-LL and IAID, never to the launcher's.
    let vm_mac = xdhcp_tests::parse_mac(VM_MAC).unwrap();
    let held = kea.leases();
    let lease = held
        .iter()
        .find(|l| l.address == ip6)
        .unwrap_or_else(|| panic!("Kea holds no lease for {ip6}: {held:?}\n{}", kea.log()));
    assert_eq!(lease.duid, duid_ll(VM_MAC), "not the VM's DUID-LL");
    assert_eq!(lease.iaid, xdhcp_engine::v6::iaid_from_mac(vm_mac));
    assert!(
        held.iter().all(|l| l.duid != duid_ll(&format_mac(src.mac))),
        "a lease for the launcher's own DUID: {held:?}"
    );
    // Reported, not configured.
    assert!(!has_address6(&src.ns, "net1", ip6), "{ip6} on net1");
    let entry = agent
        .network_entry("virt-launcher-vm6-src", &key)
        .expect("pod-networks entry written");
    assert_eq!(
        entry,
        json!({"ip_addresses": [format!("{ip6}/64")], "mac_address": VM_MAC,
               "gateway_ips": ["fd00:6::1"], "role": "secondary", "ipam_mode": "dhcp"})
    );
    let table = agent.leases();
    assert_eq!(table.len(), 1, "{table:?}");
    assert_eq!(
        (
            table[0].workload.as_str(),
            table[0].state.as_str(),
            table[0].family.as_str(),
            table[0].mac.as_str()
        ),
        ("vm:vm6", "OneShot", "ipv6", VM_MAC),
        "{table:?}"
    );
    let _ = agent
        .post(rpc::PATH_CHECK, &req)
        .expect("CHECK of a VM's IPv6 discovery");
    // The guard is on the launcher's port, with a VM's policy.
    let guarded = agent.status().guarded_ports;
    assert!(
        guarded.iter().any(|p| p.port == src.port() && p.learning),
        "{guarded:?}"
    );

    // The migration target, while the source still runs: the same DUID and
    // IAID, the same binding.
    let req2 = request(
        "ctr-v6-dst",
        "virt-launcher-vm6-dst",
        dst.ns.path(),
        "net1",
        &localnet_config6(NAD, "ipv6"),
    );
    let r2 = agent.add(&req2).expect("migration target ADD");
    assert_eq!(r2.ips6[0].address, a6, "same address after migration");
    let entry2 = agent
        .network_entry("virt-launcher-vm6-dst", &key)
        .expect("target entry");
    assert_eq!(entry2, entry, "the target reports what the source did");
    assert!(
        !has_address6(&dst.ns, "net1", ip6),
        "{ip6} on the target's net1"
    );
    let vm_leases: Vec<_> = kea
        .leases()
        .into_iter()
        .filter(|l| l.duid == duid_ll(VM_MAC))
        .collect();
    assert_eq!(vm_leases.len(), 1, "one binding for the VM: {vm_leases:?}");

    // DELs: no RELEASE, the server keeps the VM's binding; the entries go.
    let _ = agent.post(rpc::PATH_DEL, &req).expect("source DEL");
    let _ = agent.post(rpc::PATH_DEL, &req2).expect("target DEL");
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        kea.leases()
            .iter()
            .any(|l| l.address == ip6 && l.duid == duid_ll(VM_MAC)),
        "a VM DEL must not release: {:?}\n{}",
        kea.leases(),
        kea.log()
    );
    assert!(agent.network_entry("virt-launcher-vm6-src", &key).is_none());
    assert!(agent.network_entry("virt-launcher-vm6-dst", &key).is_none());
    assert!(agent.leases().is_empty(), "{:?}", agent.leases());
}

/// A VM on a dual-stack network, through the stand-in API server driven by
/// the real `kube::Client`: one ADD runs both one-shot discoveries with the
/// VM's MAC (dnsmasq's DHCPv4 lease names the VM's MAC, its DHCPv6 lease
/// the VM's DUID-LL), answers with one result carrying both, and patches
/// one entry with both addresses, both gateways and the VM's MAC beside
/// the pod's `default` entry; nothing is configured. A migration target
/// gets both addresses again; no DEL releases either.
#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario: source ADD, migration target ADD, both DELs, each with its checks"
)]
fn a_dual_stack_vm_gets_both_addresses_in_one_result_and_entry_fake_apiserver() {
    const VM_MAC: &str = "02:00:00:00:20:62";
    const NAD: &str = "localnet-dual";
    const SRC: &str = "virt-launcher-vm7-src";
    const DST: &str = "virt-launcher-vm7-dst";
    let key = format!("{NS}/{NAD}");
    let server = StandInApi::start();
    let default_entry = json!({"default": {"ip_addresses": ["10.128.0.9/23"],
        "mac_address": "0a:58:0a:80:00:09", "gateway_ips": ["10.128.0.1"], "role": "primary"}});
    let labels = [
        ("kubevirt.io", "virt-launcher"),
        ("vm.kubevirt.io/name", "vm7"),
    ];
    let uids = [SRC, DST].map(|pod| {
        server.add_pod(
            NS,
            pod,
            &labels,
            &[(POD_NETWORKS, &default_entry.to_string())],
        )
    });
    server.put_vmi(vmi_doc("vm7", "dhcpnet", &key, VM_MAC));
    let kubeconfig = server.kubeconfig.clone();

    let mut lab = Lab::builder()
        .server_behind_uplink()
        .client_ifname("net1")
        .build();
    let dnsmasq = Dnsmasq::start(
        lab.dhcp_ns(),
        DnsmasqConfig {
            interface: Lab::SERVER_IF.to_owned(),
            ..DnsmasqConfig::default()
        },
    );
    let dnsmasq6 = xdhcp_tests::Dnsmasq6::start(lab.dhcp_ns());
    lab.add_client("net1");
    let (src, dst) = (&lab.clients[0], &lab.clients[1]);
    let agent = TestAgent::start(None, &json!({}), |a| {
        a.kube = KubeMode::On;
        a.kubeconfig = Some(kubeconfig.clone());
        a.datapath = DatapathChoice::Afpacket;
    });
    let annotation = |pod: &str| -> Value {
        serde_json::from_str(
            &server
                .annotation(NS, pod, POD_NETWORKS)
                .expect("annotation"),
        )
        .expect("the annotation is JSON")
    };
    let dual_req = |container: &str, pod: &str, uid: &str, ns: &NetNs| {
        let mut req = request(
            container,
            pod,
            ns.path(),
            "net1",
            &localnet_config6(NAD, "dual"),
        );
        req.args.insert("K8S_POD_UID".into(), uid.to_owned());
        req
    };

    let req = dual_req("ctr-dual-src", SRC, &uids[0], &src.ns);
    let r = agent.add(&req).expect("VM ADD on a dual-stack network");
    let (a4, a6) = (r.ips[0].address, r.ips6[0].address);
    assert_eq!(a4.prefix_len, 24);
    assert_eq!(r.ips[0].gateway, Some(lab.server_ip));
    assert_eq!(a6.prefix_len, 64);
    // Both bound to the VM's identity.
    let vm_mac = xdhcp_tests::parse_mac(VM_MAC).unwrap();
    assert_eq!(dnsmasq.lease_for(vm_mac).map(|l| l.ip), Some(a4.addr));
    assert!(dnsmasq.lease_for(src.mac).is_none());
    let leases6 = dnsmasq6.leases();
    let line = leases6
        .lines()
        .find(|l| l.contains(&format!(" {} ", a6.addr)))
        .unwrap_or_else(|| panic!("dnsmasq holds no lease for {}:\n{leases6}", a6.addr));
    assert!(
        line.ends_with(&duid_ll(VM_MAC)),
        "not the VM's DUID-LL: {line}"
    );
    assert!(
        !leases6.contains(&duid_ll(&format_mac(src.mac))),
        "a lease for the launcher's own DUID:\n{leases6}"
    );
    // One entry with both, beside the default one; nothing configured.
    let ann = annotation(SRC);
    assert_eq!(
        ann["default"], default_entry["default"],
        "default entry kept"
    );
    assert_eq!(
        ann[&key],
        json!({"ip_addresses": [a4.to_string(), a6.to_string()], "mac_address": VM_MAC,
               "gateway_ips": ["192.0.2.1", "fd00:6::1"], "role": "secondary",
               "ipam_mode": "dhcp"})
    );
    assert_no_ipv4(&src.ns, &["net1"]);
    assert!(!has_address6(&src.ns, "net1", a6.addr));
    let mut rows: Vec<(String, String)> = agent
        .leases()
        .into_iter()
        .map(|l| (l.family, l.state))
        .collect();
    rows.sort();
    assert_eq!(
        rows,
        [
            ("ipv4".to_owned(), "OneShot".to_owned()),
            ("ipv6".to_owned(), "OneShot".to_owned())
        ]
    );

    // The migration target: both addresses again, while the source runs.
    let req2 = dual_req("ctr-dual-dst", DST, &uids[1], &dst.ns);
    let r2 = agent.add(&req2).expect("migration target ADD");
    assert_eq!((r2.ips[0].address, r2.ips6[0].address), (a4, a6));
    assert_eq!(annotation(DST)[&key], ann[&key]);
    assert_no_ipv4(&dst.ns, &["net1"]);
    assert!(!has_address6(&dst.ns, "net1", a6.addr));

    // No DEL releases either lease.
    let _ = agent.post(rpc::PATH_DEL, &req).expect("source DEL");
    let _ = agent.post(rpc::PATH_DEL, &req2).expect("target DEL");
    std::thread::sleep(Duration::from_secs(2));
    assert!(!dnsmasq.log().contains("DHCPRELEASE"), "{}", dnsmasq.log());
    assert!(
        !dnsmasq6.log().contains("DHCPRELEASE"),
        "{}",
        dnsmasq6.log()
    );
    assert_eq!(dnsmasq.lease_for(vm_mac).map(|l| l.ip), Some(a4.addr));
    assert!(dnsmasq6.leases().contains(&format!(" {} ", a6.addr)));
    for pod in [SRC, DST] {
        let ann = annotation(pod);
        assert!(ann.get(&key).is_none(), "{ann}");
        assert_eq!(ann["default"], default_entry["default"]);
    }
    assert!(agent.leases().is_empty(), "{:?}", agent.leases());
    drop(agent);
    drop(server);
}

// ------------------------------------------------------------------ VFIO

const BDF: &str = "0000:3b:02.2";
const VF_NETDEV: &str = "enp59s0f0v2";

/// A fake sysfs tree with one VF bound to `vfio-pci` and the given driver
/// loaded, plus a fake kernel thread that makes `net/<VF_NETDEV>` appear
/// once the VF's address is written to the kernel driver's `bind` file (as
/// the kernel does, asynchronously). Plain files do not rebind, so the
/// `driver` link stays on `vfio-pci` throughout.
struct FakeVf {
    root: PathBuf,
    dev: PathBuf,
    journal_dir: PathBuf,
    stop: Arc<AtomicBool>,
    /// When set, binding the driver brings no netdev.
    no_netdev: Arc<AtomicBool>,
    /// Whether the journal was on disk when the bind was seen.
    journal_at_bind: Arc<std::sync::Mutex<Option<bool>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeVf {
    fn new(dir: &Path, state_dir: &Path, ids: (u16, u16), driver: &'static str) -> Self {
        let root = dir.join("sys");
        let dev = root.join("devices/pci0000:00").join(BDF);
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("vendor"), format!("0x{:04x}\n", ids.0)).unwrap();
        std::fs::write(dev.join("device"), format!("0x{:04x}\n", ids.1)).unwrap();
        std::fs::write(dev.join("driver_override"), "vfio-pci\n").unwrap();
        std::fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
        symlink(
            format!("../../../devices/pci0000:00/{BDF}"),
            root.join("bus/pci/devices").join(BDF),
        )
        .unwrap();
        for drv in [driver, "vfio-pci"] {
            let d = root.join("bus/pci/drivers").join(drv);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("bind"), "").unwrap();
            std::fs::write(d.join("unbind"), "").unwrap();
        }
        symlink("../../../bus/pci/drivers/vfio-pci", dev.join("driver")).unwrap();

        let stop = Arc::new(AtomicBool::new(false));
        let no_netdev = Arc::new(AtomicBool::new(false));
        let journal_at_bind = Arc::new(std::sync::Mutex::new(None));
        let journal_dir = xdhcp::vfio::journal_dir(state_dir);
        let thread = {
            let (stop, seen, no_netdev) =
                (stop.clone(), journal_at_bind.clone(), no_netdev.clone());
            let bind = root.join("bus/pci/drivers").join(driver).join("bind");
            let net = dev.join("net").join(VF_NETDEV);
            let journal = journal_dir.join(format!("{BDF}.json"));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if std::fs::read_to_string(&bind).unwrap_or_default().trim() == BDF
                        && !net.exists()
                        && !no_netdev.load(Ordering::Relaxed)
                    {
                        *seen.lock().unwrap() = Some(journal.exists());
                        std::thread::sleep(Duration::from_millis(100));
                        std::fs::create_dir_all(&net).unwrap();
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        Self {
            root,
            dev,
            journal_dir,
            stop,
            no_netdev,
            journal_at_bind,
            thread: Some(thread),
        }
    }

    /// From now on, binding the kernel driver brings no netdev.
    fn never_netdev(&self) {
        self.no_netdev.store(true, Ordering::Relaxed);
    }

    /// Forget earlier handoffs: empty bind/unbind files, no netdev.
    fn reset(&self) {
        for entry in std::fs::read_dir(self.root.join("bus/pci/drivers")).unwrap() {
            let d = entry.unwrap().path();
            std::fs::write(d.join("bind"), "").unwrap();
            std::fs::write(d.join("unbind"), "").unwrap();
        }
        let _ = std::fs::remove_dir_all(self.dev.join("net"));
    }

    fn driver_file(&self, driver: &str, file: &str) -> String {
        std::fs::read_to_string(self.root.join("bus/pci/drivers").join(driver).join(file)).unwrap()
    }

    fn driver_override(&self) -> String {
        std::fs::read_to_string(self.dev.join("driver_override"))
            .unwrap()
            .trim()
            .to_owned()
    }

    fn journal_entries(&self) -> usize {
        std::fs::read_dir(&self.journal_dir).map_or(0, Iterator::count)
    }
}

impl Drop for FakeVf {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn vfio_seed(vm_mac: &str, nad: &str) -> Value {
    let mut vmi = vmi_doc("vm2", "sriovnet", &format!("{NS}/{nad}"), vm_mac);
    vmi["spec"]["domain"]["devices"]["interfaces"][1] =
        json!({"name": "sriovnet", "sriov": {}, "macAddress": vm_mac});
    json!({
        "pods": {format!("{NS}/virt-launcher-vm2-x"): launcher_pod("vm2")},
        "vmis": {format!("{NS}/vm2"): vmi}
    })
}

/// A fake sysfs tree holding one VF at [`BDF`] (`ids`, host driver
/// `driver`, bound to `vfio-pci`) and an agent reading it, started in
/// `netns` on `seed`; `tweak` sees the VF and edits the agent's arguments
/// further. Fields drop in order: the fake kernel, the agent, the tree.
struct VfRig {
    fake: FakeVf,
    agent: TestAgent,
    _tree: tempfile::TempDir,
}

impl VfRig {
    fn start(
        netns: Option<&Path>,
        seed: &Value,
        (ids, driver): ((u16, u16), &'static str),
        tweak: impl FnOnce(&FakeVf, &mut AgentArgs),
    ) -> Self {
        let tree = tempfile::Builder::new()
            .prefix("xdt-vm-sysfs-")
            .tempdir()
            .unwrap();
        let sysfs_root = tree.path().join("sys");
        let mut fake = None;
        let agent = TestAgent::start(netns, seed, |a| {
            let f = FakeVf::new(tree.path(), &a.state_dir, ids, driver);
            a.sysfs_root.clone_from(&sysfs_root);
            tweak(&f, a);
            fake = Some(f);
        });
        Self {
            fake: fake.expect("fake sysfs built"),
            agent,
            _tree: tree,
        }
    }

    /// Nothing was handed off: `vfio-pci` kept the VF, the host driver never
    /// bound it, no journal, no lease.
    #[track_caller]
    fn assert_untouched(&self, host_driver: &str) {
        assert_eq!(self.fake.driver_file("vfio-pci", "unbind"), "");
        assert_eq!(self.fake.driver_file(host_driver, "bind"), "");
        assert_eq!(self.fake.journal_entries(), 0);
        assert!(self.agent.leases().is_empty(), "{:?}", self.agent.leases());
    }
}

/// A node with one VF behind the fake sysfs (`mlx5_core`, bound to
/// `vfio-pci`), its netdev in the lab's client namespace, a dnsmasq, a
/// launcher pod namespace and an agent on it all. Fields drop in order:
/// the agent first.
struct VfioNode {
    rig: VfRig,
    launcher: NetNs,
    dnsmasq: Dnsmasq,
    lab: Lab,
}

impl VfioNode {
    fn start(vm_mac: &str, nad: &str, tweak: impl FnOnce(&mut AgentArgs)) -> Self {
        let lab = Lab::builder().clients(1).client_ifname(VF_NETDEV).build();
        let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
        // The node's host namespace, holding the VF netdev (down, as after
        // a bind).
        let host = &lab.clients[0];
        host.ns.ip(&["link", "set", VF_NETDEV, "down"]);
        let launcher = NetNs::new();
        // The fake kernel watches the agent's journal dir, known once the
        // agent's flags are.
        let rig = VfRig::start(
            Some(host.ns.path()),
            &vfio_seed(vm_mac, nad),
            ((0x15b3, 0x101e), "mlx5_core"),
            |_, a| {
                a.vfio_netdev_timeout = Duration::from_secs(5);
                tweak(a);
            },
        );
        Self {
            rig,
            launcher,
            dnsmasq,
            lab,
        }
    }
}

#[test]
fn vfio_vm_dora_runs_on_the_handed_off_vf_netdev_and_vfio_pci_is_restored() {
    const VM_MAC: &str = "02:00:00:00:20:09";
    const NAD: &str = "localnet-dhcp-vfio";
    let node = VfioNode::start(VM_MAC, NAD, |a| a.datapath = DatapathChoice::Auto);
    let (agent, fake, launcher, dnsmasq, lab) = (
        &node.rig.agent,
        &node.rig.fake,
        &node.launcher,
        &node.dnsmasq,
        &node.lab,
    );
    let host = &lab.clients[0];

    let req = request(
        "ctr-vfio",
        "virt-launcher-vm2-x",
        launcher.path(),
        "net1",
        &localnet_config(NAD, Some(BDF)),
    );
    let r = agent
        .add(&req)
        .unwrap_or_else(|e| panic!("VFIO VM ADD failed: {:?}", e.into_cni()));
    let ip = r.ips[0].address.addr;
    assert_eq!(r.ips[0].gateway, Some(lab.server_ip));

    // The handoff: journaled before the driver bind, netdev waited for,
    // vfio-pci given back, journal gone.
    assert_eq!(*fake.journal_at_bind.lock().unwrap(), Some(true));
    assert_eq!(fake.driver_file("vfio-pci", "unbind"), BDF);
    assert_eq!(fake.driver_file("mlx5_core", "bind"), BDF);
    assert_eq!(fake.driver_override(), "vfio-pci");
    assert_eq!(fake.journal_entries(), 0);

    // The DORA ran on the VF netdev in the agent's namespace, with the VM's
    // MAC (given to the netdev), and configured nothing.
    let lease = dnsmasq
        .lease_for(xdhcp_tests::parse_mac(VM_MAC).unwrap())
        .unwrap_or_else(|| panic!("dnsmasq has no lease for {VM_MAC}:\n{}", dnsmasq.log()));
    assert_eq!(lease.ip, ip);
    assert_eq!(format_mac(host.ns.mac(VF_NETDEV)), VM_MAC);
    assert!(
        host.ns
            .ip(&["link", "show", "dev", VF_NETDEV])
            .contains(",UP"),
        "the VF netdev was not set up"
    );
    assert_no_ipv4(&host.ns, &[VF_NETDEV]);
    assert!(!launcher.has_link("net1"));

    let entry = agent
        .network_entry("virt-launcher-vm2-x", &format!("{NS}/{NAD}"))
        .expect("pod-networks entry written");
    assert_eq!(
        entry,
        json!({"ip_addresses": [format!("{ip}/24")], "mac_address": VM_MAC,
               "gateway_ips": ["192.0.2.1"], "role": "secondary", "ipam_mode": "dhcp"})
    );
    let table = agent.leases();
    assert_eq!(table.len(), 1, "{table:?}");
    assert_eq!(
        (table[0].workload.as_str(), table[0].state.as_str()),
        ("vm:vm2", "OneShot")
    );
    // The reply capture on the VF netdev: the eBPF TC program when the
    // datapath loaded, else AF_PACKET.
    let status: rpc::AgentStatus = agent.client().get(rpc::PATH_STATUS).expect("status");
    let want = if status.datapath == "ebpf" {
        "tc"
    } else {
        "af-packet"
    };
    assert_eq!(status.interfaces[0].attach, want, "{status:?}");
    // A repeated ADD answers from the record: no second handoff.
    std::fs::write(fake.root.join("bus/pci/drivers/mlx5_core/bind"), "").unwrap();
    let again = agent.add(&req).expect("repeated ADD");
    assert_eq!(again.ips, r.ips);
    assert_eq!(fake.driver_file("mlx5_core", "bind"), "");

    // DEL: no RELEASE (the VM owns the lease).
    let _ = agent.post(rpc::PATH_DEL, &req).expect("DEL");
    std::thread::sleep(Duration::from_millis(500));
    assert!(!dnsmasq.log().contains("DHCPRELEASE"), "{}", dnsmasq.log());
    assert!(
        dnsmasq
            .lease_for(xdhcp_tests::parse_mac(VM_MAC).unwrap())
            .is_some()
    );
    assert!(agent.leases().is_empty());
}

/// The VFIO path answers only once the attachment's record is on disk, as
/// every ADD does (a restarted agent answers the VM's CHECK and DEL from
/// it): with the lease directory read-only (a tmpfs the test mounts there),
/// the ADD fails with an I/O error naming the state directory, the
/// `pod-networks` entry it reported is taken back, `vfio-pci` is restored
/// and no attachment is left.
#[test]
fn vfio_vm_add_whose_record_cannot_be_written_fails_naming_the_state_directory() {
    const VM_MAC: &str = "02:00:00:00:20:0b";
    const NAD: &str = "localnet-dhcp-vfio";
    // Declared first: unmounted after the agent has stopped.
    let mut leases_fs: Option<Tmpfs> = None;
    let node = VfioNode::start(VM_MAC, NAD, |a| {
        leases_fs = Some(Tmpfs::mount_at(&a.state_dir.join("leases"), "1m"));
    });
    let (agent, fake, launcher, dnsmasq) = (
        &node.rig.agent,
        &node.rig.fake,
        &node.launcher,
        &node.dnsmasq,
    );
    leases_fs.as_ref().expect("tmpfs mounted").remount(true);

    let req = request(
        "ctr-vfio-ro",
        "virt-launcher-vm2-x",
        launcher.path(),
        "net1",
        &localnet_config(NAD, Some(BDF)),
    );
    let err = agent
        .add(&req)
        .expect_err("a VFIO ADD whose record cannot be written must fail")
        .into_cni();
    assert_eq!(err.code, code::IO_FAILURE, "{err:?}");
    let text = format!("{} {}", err.msg, err.details);
    assert!(
        text.contains(&agent.state_dir.display().to_string()),
        "the error must name the state directory {}: {err:?}",
        agent.state_dir.display()
    );
    // The DORA did run (the server holds the VM's lease, which the VM's
    // guest owns: no RELEASE), then the answer was withheld.
    assert!(
        dnsmasq
            .lease_for(xdhcp_tests::parse_mac(VM_MAC).unwrap())
            .is_some(),
        "{}",
        dnsmasq.log()
    );
    assert!(
        agent
            .network_entry("virt-launcher-vm2-x", &format!("{NS}/{NAD}"))
            .is_none(),
        "the reported address of the failed ADD was left in pod-networks"
    );
    assert_eq!(fake.driver_override(), "vfio-pci");
    assert_eq!(fake.journal_entries(), 0);
    assert!(agent.leases().is_empty(), "{:?}", agent.leases());
    // Off before `node` removes the agent's directory, which a mount in it
    // would keep (the agent holds no lease to write at its stop).
    drop(leases_fs);
}

/// A VM whose VF is passed through with `vfio-pci`, on an IPv6 network and
/// on a dual-stack one: the one-shot discoveries run on the VF's netdev
/// during its driver handoff (`DHCPv6` with the VM's DUID-LL; DHCPv4 beside
/// it on the dual-stack network), with duplicate address detection off on
/// the netdev so the SOLICIT leaves at once; `vfio-pci` is given back, the
/// entry carries the addresses with the VM's MAC, and DEL releases nothing.
#[test]
fn vfio_vm_on_an_ipv6_or_dual_stack_network_discovers_on_the_vf_netdev() {
    const VM_MAC: &str = "02:00:00:00:20:63";
    const NAD: &str = "localnet-v6-vfio";
    for family in ["ipv6", "dual"] {
        let node = VfioNode::start(VM_MAC, NAD, |a| a.datapath = DatapathChoice::Afpacket);
        let (agent, fake, lab) = (&node.rig.agent, &node.rig.fake, &node.lab);
        let server6 = xdhcp_tests::Dnsmasq6::start_on(
            &lab.server,
            lab.dhcp_ifname(),
            "fd00:6::1/64",
            "fd00:6::100,fd00:6::1ff",
            &[],
        );
        let mut config = localnet_config6(NAD, family);
        config["deviceID"] = json!(BDF);
        let req = request(
            &format!("ctr-vfio-{family}"),
            "virt-launcher-vm2-x",
            node.launcher.path(),
            "net1",
            &config,
        );
        let r = agent
            .add(&req)
            .unwrap_or_else(|e| panic!("{family}: VFIO VM ADD failed: {:?}", e.into_cni()));

        // The handoff: the host driver bound, vfio-pci given back.
        assert_eq!(fake.driver_file("mlx5_core", "bind"), BDF, "{family}");
        assert_eq!(fake.driver_override(), "vfio-pci", "{family}");
        assert_eq!(fake.journal_entries(), 0, "{family}");
        // The netdev's link-local address was usable at once.
        let host = &lab.clients[0].ns;
        let dad = host.run_in(|| {
            std::fs::read_to_string(format!("/proc/sys/net/ipv6/conf/{VF_NETDEV}/accept_dad"))
                .unwrap_or_default()
        });
        assert_eq!(dad.trim(), "0", "{family}: DAD left on on the VF netdev");

        // The DHCPv6 lease under the VM's DUID-LL, in the result and the
        // entry; the DHCPv4 one beside it on the dual-stack network.
        let a6 = r.ips6[0].address;
        let leases = server6.leases();
        let line = leases
            .lines()
            .find(|l| l.contains(&a6.addr.to_string()))
            .unwrap_or_else(|| panic!("{family}: dnsmasq holds no lease for {a6}:\n{leases}"));
        assert!(line.contains(&duid_ll(VM_MAC)), "{family}: {line}");
        let mut want = vec![a6.to_string()];
        if family == "dual" {
            let a4 = r.ips[0].address;
            let lease = node
                .dnsmasq
                .lease_for(xdhcp_tests::parse_mac(VM_MAC).unwrap())
                .unwrap_or_else(|| panic!("no DHCPv4 lease for {VM_MAC}"));
            assert_eq!(lease.ip, a4.addr);
            want.insert(0, a4.to_string());
        } else {
            assert!(r.ips.is_empty(), "{:?}", r.ips);
        }
        let entry = agent
            .network_entry("virt-launcher-vm2-x", &format!("{NS}/{NAD}"))
            .expect("pod-networks entry written");
        assert_eq!(entry["ip_addresses"], json!(want), "{family}: {entry}");
        assert_eq!(entry["mac_address"], VM_MAC, "{family}: {entry}");

        // DEL: nothing released (the VM owns its bindings).
        let _ = agent.post(rpc::PATH_DEL, &req).expect("DEL");
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            server6.leases().contains(&a6.addr.to_string()),
            "{family}: the VM's DHCPv6 binding was released"
        );
        assert!(agent.leases().is_empty(), "{family}");
    }
}

#[test]
fn vfio_vm_with_an_unknown_vf_fails_naming_the_ids_and_touches_nothing() {
    const NAD: &str = "localnet-dhcp-vfio";
    let launcher = NetNs::new();
    // virtio-net (0x1af4:0x1041) is no SR-IOV VF any driver row claims.
    let rig = VfRig::start(
        None,
        &vfio_seed("02:00:00:00:20:0a", NAD),
        ((0x1af4, 0x1041), "mlx5_core"),
        |_, a| a.datapath = DatapathChoice::Afpacket,
    );
    let agent = &rig.agent;
    let req = request(
        "ctr-unknown",
        "virt-launcher-vm2-x",
        launcher.path(),
        "net1",
        &localnet_config(NAD, Some(BDF)),
    );
    let e = agent.add(&req).unwrap_err().into_cni();
    assert_eq!(e.code, code::VFIO, "{e:?}");
    assert!(
        e.msg.contains("0x1af4") && e.msg.contains("0x1041") && e.msg.contains(BDF),
        "{}",
        e.msg
    );
    assert!(
        e.msg.contains(&format!("{NS}/virt-launcher-vm2-x")),
        "{}",
        e.msg
    );
    rig.assert_untouched("mlx5_core");

    // A deviceID that is not a PCI address is a clear error too.
    let bad = request(
        "ctr-bad",
        "virt-launcher-vm2-x",
        launcher.path(),
        "net1",
        &localnet_config(NAD, Some("eth7")),
    );
    let e = agent.add(&bad).unwrap_err().into_cni();
    assert_eq!(e.code, code::VFIO, "{e:?}");
    assert!(e.msg.contains("\"eth7\""), "{}", e.msg);
}

/// The attack: a request names a VF on `vfio-pci` that the device plugin
/// allocated to another pod (another VM may be using it). The kubelet's
/// device checkpoint says whose it is: the ADD is refused naming the
/// holder, and nothing is handed off.
#[test]
fn vfio_vm_naming_another_pods_vf_is_refused_and_touches_nothing() {
    const NAD: &str = "localnet-dhcp-vfio";
    let launcher = NetNs::new();
    let dir = tempfile::Builder::new()
        .prefix("xdt-kubelet-")
        .tempdir()
        .unwrap();
    let checkpoint = dir.path().join("kubelet_internal_checkpoint");
    std::fs::write(
        &checkpoint,
        json!({"Data": {
            "PodDeviceEntries": [{"PodUID": "uid-virt-launcher-other-vm", "ContainerName": "compute",
                "ResourceName": "intel.com/sriov", "DeviceIDs": {"0": [BDF]}, "AllocResp": "e30="}],
            "RegisteredDevices": {"intel.com/sriov": [BDF]}},
            "Checksum": 1})
        .to_string(),
    )
    .unwrap();
    let rig = VfRig::start(
        None,
        &vfio_seed("02:00:00:00:20:0b", NAD),
        ((0x15b3, 0x101e), "mlx5_core"),
        |_, a| {
            a.device_checkpoint.clone_from(&checkpoint);
            a.datapath = DatapathChoice::Afpacket;
        },
    );
    let agent = &rig.agent;
    let req = request(
        "ctr-steal",
        "virt-launcher-vm2-x",
        launcher.path(),
        "net1",
        &localnet_config(NAD, Some(BDF)),
    );
    let e = agent.add(&req).unwrap_err().into_cni();
    assert_eq!(e.code, code::INVALID_ENV, "{e:?}");
    assert!(
        e.msg.contains(BDF) && e.msg.contains("uid-virt-launcher-other-vm"),
        "{}",
        e.msg
    );
    rig.assert_untouched("mlx5_core");
}

/// A VFIO VM's ADD whose VMI read hangs (the fake API server holds it for
/// a minute): the ADD fails at its deadline with the API code naming the
/// VMI, as every other ADD path does, and the VF is never handed off. The
/// VFIO path used to make this call with no deadline at all.
#[test]
fn vfio_vm_add_with_a_hung_vmi_read_fails_at_its_deadline_fake_apiserver() {
    use xdhcp_tests::fake_apiserver::{Fault, Op};
    const NAD: &str = "localnet-dhcp-vfio";
    /// The ADD deadline of a network with `"timeout": "2s"`: the plugin
    /// waits 2 s + 15 s; the agent answers one second before.
    const DEADLINE: Duration = Duration::from_secs(16);
    let server = StandInApi::start();
    let seed = vfio_seed("02:00:00:00:20:0d", NAD);
    server.add_pod(
        NS,
        "virt-launcher-vm2-x",
        &[
            ("kubevirt.io", "virt-launcher"),
            ("vm.kubevirt.io/name", "vm2"),
        ],
        &[],
    );
    server.put_vmi(seed["vmis"][format!("{NS}/vm2")].clone());
    server.inject(Op::GetVmi, Fault::Delay(Duration::from_mins(1)));
    let launcher = NetNs::new();
    let rig = VfRig::start(None, &json!({}), ((0x15b3, 0x101e), "mlx5_core"), |_, a| {
        a.kube = KubeMode::On;
        a.kubeconfig = Some(server.kubeconfig.clone());
        a.datapath = DatapathChoice::Afpacket;
    });
    let agent = &rig.agent;
    let mut conf = localnet_config(NAD, Some(BDF));
    conf["ipam"] = json!({"type": "xdhcp", "timeout": "2s"});
    let req = request(
        "ctr-hung",
        "virt-launcher-vm2-x",
        launcher.path(),
        "net1",
        &conf,
    );
    let t0 = std::time::Instant::now();
    let e = agent.add(&req).unwrap_err().into_cni();
    let took = t0.elapsed();
    assert_eq!(e.code, code::KUBE_API, "{e:?}");
    let text = format!("{} {}", e.msg, e.details);
    assert!(
        text.contains("VirtualMachineInstance") && text.contains(&format!("{NS}/vm2")),
        "{e:?}"
    );
    assert!(took < DEADLINE + Duration::from_secs(2), "took {took:?}");
    // The VMI is read before the handoff: the VF never left vfio-pci.
    rig.assert_untouched("mlx5_core");
}

#[test]
fn vfio_vm_failures_inside_the_handoff_still_restore_vfio_pci() {
    const NAD: &str = "localnet-dhcp-vfio";
    // No DHCP server on the lab.
    let lab = Lab::builder().clients(1).client_ifname(VF_NETDEV).build();
    let host = &lab.clients[0];
    let launcher = NetNs::new();
    let rig = VfRig::start(
        Some(host.ns.path()),
        &vfio_seed("02:00:00:00:20:0b", NAD),
        ((0x8086, 0x1889), "iavf"),
        |_, a| {
            a.vfio_netdev_timeout = Duration::from_secs(1);
            a.datapath = DatapathChoice::Afpacket;
        },
    );
    let (agent, fake) = (&rig.agent, &rig.fake);
    let mut conf = localnet_config(NAD, Some(BDF));
    conf["ipam"] = json!({"type": "xdhcp", "timeout": "2s"});
    let req = request(
        "ctr-fail",
        "virt-launcher-vm2-x",
        launcher.path(),
        "net1",
        &conf,
    );
    let assert_restored = |fake: &FakeVf| {
        assert_eq!(fake.driver_override(), "vfio-pci");
        assert_eq!(fake.journal_entries(), 0);
        assert!(agent.leases().is_empty(), "{:?}", agent.leases());
        assert!(
            agent
                .network_entry("virt-launcher-vm2-x", &format!("{NS}/{NAD}"))
                .is_none()
        );
    };

    // Nobody answers: the DORA times out on the VF netdev.
    let e = agent.add(&req).unwrap_err().into_cni();
    assert_eq!(e.code, code::DHCP_TIMEOUT, "{e:?}");
    assert!(e.msg.contains(VF_NETDEV), "{}", e.msg);
    assert_eq!(fake.driver_file("iavf", "bind"), BDF);
    assert_restored(fake);

    // The driver binds but no netdev appears.
    fake.reset();
    fake.never_netdev();
    let e = agent.add(&req).unwrap_err().into_cni();
    assert_eq!(e.code, code::VFIO, "{e:?}");
    assert!(
        e.msg.contains("no netdev") && e.msg.contains("iavf") && e.msg.contains(BDF),
        "{}",
        e.msg
    );
    assert_eq!(fake.driver_file("iavf", "bind"), BDF);
    assert_restored(fake);
}

#[test]
fn agent_start_heals_an_interrupted_handoff_before_serving() {
    let rig = VfRig::start(None, &json!({}), ((0x15b3, 0x101e), "mlx5_core"), |f, a| {
        // Killed right after writing the journal and driver_override.
        std::fs::create_dir_all(&f.journal_dir).unwrap();
        std::fs::write(
            f.journal_dir.join(format!("{BDF}.json")),
            format!(
                r#"{{"bdf":"{BDF}","original_driver":"vfio-pci","intended_driver":"mlx5_core","started_at":1700000000}}"#
            ),
        )
        .unwrap();
        std::fs::write(f.dev.join("driver_override"), "mlx5_core").unwrap();
        a.datapath = DatapathChoice::Afpacket;
    });
    // Ready implies healed: heal runs before the socket is served.
    assert_eq!(rig.fake.driver_override(), "vfio-pci");
    assert_eq!(rig.fake.journal_entries(), 0);
}
