//! The agent (in-process, `xdhcp::daemon::run` with `--kube=on`) against a
//! real dnsmasq in network namespaces and the **in-process fake API server**
//! (`xdhcp_tests::fake_apiserver`: pods GET/PATCH, VMIs and migrations GET,
//! driven by the real `kube::Client`; it is not a cluster). Tests are named
//! `*_fake_apiserver`.
//!
//! - An ADD that goes stale while its address is acquired writes nothing to
//!   `k8s.ovn.org/pod-networks` and gives the pod's lease back: the sandbox's
//!   network namespace removed before the write, the pod deleted and
//!   recreated under the same name (before the read, or between the read
//!   and the patch). The fake server holds the agent's request at the exact
//!   point, the test changes the world, then lets it go.
//! - A live-migration target launcher pod asks for the address the source
//!   launcher pod reported (no guest agent, so no address in the VMI
//!   status): the source found through the migration object, its
//!   `pod-networks` entry read, the address asked for with INIT-REBOOT (a
//!   REQUEST, no DISCOVER) under the MAC the VMI status reports; the source
//!   itself leased with its pod interface's MAC (nothing else known).

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::mount::{MntFlags, MsFlags};
use serde_json::{Value, json};
use xdhcp::cli::{DatapathChoice, KubeMode};
use xdhcp::cni::config;
use xdhcp::cni::types::code;
use xdhcp::rpc::{ClientError, CniRequest, CniResult};
use xdhcp_tests::agent::InProcessAgent;
use xdhcp_tests::fake_apiserver::Op;
use xdhcp_tests::{Dnsmasq, DnsmasqConfig, Lab, NetNs, StandInApi, format_mac, wait_until};

const NS: &str = "tenant";
const NAD: &str = "localnet-dhcp";
const POD_NETWORKS: &str = "k8s.ovn.org/pod-networks";
const HOLD_WAIT: Duration = Duration::from_secs(40);

fn key() -> String {
    format!("{NS}/{NAD}")
}

/// The fake API server on its own runtime (the test thread blocks on the
/// agent).
struct Api(StandInApi);

impl std::ops::Deref for Api {
    type Target = StandInApi;

    fn deref(&self) -> &StandInApi {
        &self.0
    }
}

impl Api {
    fn start() -> Self {
        Self(StandInApi::start())
    }

    fn agent(&self) -> InProcessAgent {
        InProcessAgent::start_with(|a| {
            a.kube = KubeMode::On;
            a.kubeconfig = Some(self.kubeconfig.clone());
            a.datapath = DatapathChoice::Afpacket;
        })
    }

    /// The pod's `pod-networks` annotation, parsed (`{}` when absent).
    fn networks(&self, pod: &str) -> Value {
        self.server
            .annotation(NS, pod, POD_NETWORKS)
            .map_or_else(|| json!({}), |a| serde_json::from_str(&a).unwrap())
    }
}

/// A second path for a namespace, as a container runtime gives a sandbox
/// (`/var/run/netns/<id>`): a bind mount the test can remove while the
/// namespace itself lives on.
struct SandboxPath(PathBuf);

impl SandboxPath {
    fn new(ns: &NetNs) -> Self {
        let path = PathBuf::from(format!("/var/run/netns/{}-sandbox", ns.name()));
        std::fs::File::create(&path).unwrap();
        nix::mount::mount(
            Some(ns.path()),
            &path,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap_or_else(|e| {
            panic!(
                "bind-mount {} on {}: {e}",
                ns.path().display(),
                path.display()
            )
        });
        SandboxPath(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    /// What the runtime does when it tears the sandbox down.
    fn remove(&self) {
        let _ = nix::mount::umount2(&self.0, MntFlags::MNT_DETACH);
        let _ = std::fs::remove_file(&self.0);
    }
}

impl Drop for SandboxPath {
    fn drop(&mut self) {
        self.remove();
    }
}

/// The NAD config OVN-Kubernetes generates for a DHCP localnet network.
fn localnet_config() -> Value {
    json!({
        "cniVersion": "1.0.0", "name": NAD, "type": "ovn-k8s-cni-overlay",
        "topology": "localnet", "role": "secondary", "physicalNetworkName": "physnet",
        "netAttachDefName": key(), "ipam": {"type": "dhcp"}
    })
}

fn request(container: &str, pod: &str, uid: &str, netns: &Path, ifname: &str) -> CniRequest {
    CniRequest {
        container_id: container.to_owned(),
        ifname: ifname.to_owned(),
        netns: Some(netns.to_path_buf()),
        args: [
            ("K8S_POD_NAMESPACE".to_owned(), NS.to_owned()),
            ("K8S_POD_NAME".to_owned(), pod.to_owned()),
            ("K8S_POD_UID".to_owned(), uid.to_owned()),
        ]
        .into(),
        config: config::parse(localnet_config().to_string().as_bytes()).unwrap(),
    }
}

/// Run the ADD on another thread; `during` runs once the fake server holds
/// the agent's request, which is then let go.
fn add_while_held(
    agent: &InProcessAgent,
    held: xdhcp_tests::fake_apiserver::Held,
    req: &CniRequest,
    during: impl FnOnce(),
) -> Result<CniResult, ClientError> {
    std::thread::scope(|s| {
        let add = s.spawn(|| agent.add(req));
        assert!(
            held.wait(HOLD_WAIT),
            "the agent never made the held request"
        );
        during();
        held.release();
        add.join().expect("the ADD thread panicked")
    })
}

/// The server forgot the lease: a RELEASE from `mac` reached it.
fn assert_released(dnsmasq: &Dnsmasq, mac: [u8; 6]) {
    let m = format_mac(mac);
    assert!(
        wait_until(Duration::from_secs(5), || dnsmasq.lease_for(mac).is_none()
            && dnsmasq
                .log()
                .lines()
                .any(|l| l.contains("DHCPRELEASE(") && l.contains(&m))),
        "no RELEASE from {m} reached dnsmasq:\n{}",
        dnsmasq.log()
    );
}

const DEFAULT_ENTRY: &str = r#"{"default":{"ip_addresses":["10.128.0.9/23"],"mac_address":"0a:58:0a:80:00:09","gateway_ips":["10.128.0.1"],"role":"primary"}}"#;

/// The agent serves only pods of its own node (`--node-name`): an ADD
/// naming a pod scheduled to another node is refused before any DHCP and
/// any write, naming both nodes; the same attachment for a pod of this
/// node is served.
#[test]
fn add_for_a_pod_of_another_node_is_refused_before_any_dhcp_fake_apiserver() {
    let api = Api::start();
    api.server.put_pod(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "elsewhere", "namespace": NS, "uid": "u-else"},
        "spec": {"nodeName": "node-b", "containers": [{"name": "c", "image": "registry.invalid/c"}]}
    }));
    let here = api.server.add_pod(NS, "here", &[], &[]);
    let lab = Lab::with_clients(1);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let c = &lab.clients[0];
    let agent = api.agent();

    let req = request("ctr-else", "elsewhere", "u-else", c.ns.path(), &c.ifname);
    let err = agent
        .add(&req)
        .expect_err("a pod of another node must be refused")
        .into_cni();
    assert_eq!(err.code, code::KUBE_API, "{err:?}");
    assert!(
        err.msg.contains("node-b")
            && err.msg.contains(xdhcp_tests::fake_apiserver::NODE)
            && err.msg.contains("tenant/elsewhere"),
        "{}",
        err.msg
    );
    assert_eq!(api.server.count(Op::PatchPod), 0);
    assert_eq!(
        dnsmasq_count(&dnsmasq, "DHCPDISCOVER", c.mac),
        0,
        "{}",
        dnsmasq.log()
    );
    assert!(agent.leases().is_empty(), "{:?}", agent.leases());

    let req = request("ctr-here", "here", &here, c.ns.path(), &c.ifname);
    agent.add(&req).expect("a pod of this node is served");
    assert!(api.networks("here").get(key()).is_some());
}

#[test]
fn add_whose_sandbox_netns_is_removed_before_the_write_reports_nothing_and_releases_fake_apiserver()
{
    let api = Api::start();
    let uid = api.server.add_pod(
        NS,
        "web",
        &[("app", "web")],
        &[(POD_NETWORKS, DEFAULT_ENTRY)],
    );
    let lab = Lab::with_clients(1);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let c = &lab.clients[0];
    let sandbox = SandboxPath::new(&c.ns);
    let agent = api.agent();

    // The ADD reads the pod once to learn who it is, then once more to
    // write the entry: hold that second read.
    let held = api.server.hold(Op::GetPod, 1);
    let req = request("ctr-gone", "web", &uid, sandbox.path(), &c.ifname);
    let err = add_while_held(&agent, held, &req, || {
        // The DORA is done (the write comes after it): the server has the lease.
        assert!(dnsmasq.lease_for(c.mac).is_some(), "{}", dnsmasq.log());
        sandbox.remove();
    })
    .expect_err("an ADD whose sandbox is gone must fail")
    .into_cni();
    assert_eq!(err.code, code::KUBE_API, "{err:?}");
    assert!(
        err.msg.contains("network namespace")
            && err.msg.contains("is gone")
            && err.msg.contains("tenant/web")
            && err.msg.contains("released"),
        "{}",
        err.msg
    );
    // Nothing was written: the read was the last request about the pod.
    assert_eq!(api.server.count(Op::PatchPod), 0);
    assert_eq!(
        api.networks("web"),
        serde_json::from_str::<Value>(DEFAULT_ENTRY).unwrap()
    );
    // The address went back to the server, and the agent forgot it.
    assert_released(&dnsmasq, c.mac);
    assert!(agent.leases().is_empty(), "{:?}", agent.leases());
    assert!(api.server.unexpected().is_empty());
}

#[test]
fn add_whose_pod_is_recreated_reports_nothing_and_releases_fake_apiserver() {
    let api = Api::start();
    let uid1 = api.server.add_pod(NS, "web", &[("app", "web")], &[]);
    let lab = Lab::with_clients(1);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let c = &lab.clients[0];
    let agent = api.agent();

    // 1. The pod is deleted and recreated (same name, new UID) while the
    //    address is acquired, before the write's read.
    let held = api.server.hold(Op::GetPod, 1);
    let req = request("ctr-old", "web", &uid1, c.ns.path(), &c.ifname);
    let mut uid2 = String::new();
    let err = add_while_held(&agent, held, &req, || {
        api.server.delete_pod(NS, "web");
        uid2 = api.server.add_pod(NS, "web", &[("app", "web")], &[]);
    })
    .expect_err("an ADD for a recreated pod must fail")
    .into_cni();
    assert_ne!(uid1, uid2);
    assert_eq!(err.code, code::KUBE_API, "{err:?}");
    assert!(
        err.msg.contains("recreated")
            && err.msg.contains(&uid1)
            && err.msg.contains(&uid2)
            && err.msg.contains("released"),
        "{}",
        err.msg
    );
    assert_eq!(api.server.count(Op::PatchPod), 0);
    assert_eq!(api.networks("web"), json!({}), "the new pod got nothing");
    assert_released(&dnsmasq, c.mac);
    assert!(agent.leases().is_empty(), "{:?}", agent.leases());

    // 2. Recreated between the write's read and its patch: the patch
    //    carries the UID (and the resourceVersion) it read, the server
    //    refuses it, the retry reads the new pod and stops.
    let held = api.server.hold(Op::PatchPod, 0);
    let req = request("ctr-mid", "web", &uid2, c.ns.path(), &c.ifname);
    let mut uid3 = String::new();
    let err = add_while_held(&agent, held, &req, || {
        api.server.delete_pod(NS, "web");
        uid3 = api.server.add_pod(NS, "web", &[("app", "web")], &[]);
    })
    .expect_err("an ADD for a pod recreated before its patch must fail")
    .into_cni();
    assert_eq!(err.code, code::KUBE_API, "{err:?}");
    assert!(
        err.msg.contains("recreated") && err.msg.contains(&uid3),
        "{}",
        err.msg
    );
    let patches: Vec<_> = api
        .server
        .requests()
        .into_iter()
        .filter(|r| r.op == Some(Op::PatchPod))
        .collect();
    assert_eq!(patches.len(), 1, "{patches:#?}");
    assert_eq!(patches[0].status, 409, "{patches:#?}");
    let body = patches[0].body.as_ref().unwrap();
    assert_eq!(body["metadata"]["uid"], json!(uid2), "{body}");
    assert_eq!(api.networks("web"), json!({}), "the new pod got nothing");
    assert_released(&dnsmasq, c.mac);

    // 3. The same pod, not recreated: reported.
    let req = request("ctr-ok", "web", &uid3, c.ns.path(), &c.ifname);
    let r = agent.add(&req).expect("ADD for the live pod");
    let entry = &api.networks("web")[key()];
    assert_eq!(
        entry["ip_addresses"],
        json!([format!("{}/24", r.ips[0].address.addr)]),
        "{entry}"
    );
    assert!(api.server.unexpected().is_empty());
}

/// A VMI whose secondary interface `dhcpnet` on the NAD has no MAC in its
/// spec (KubeVirt then gives the guest the pod interface's MAC).
fn vmi(status: Option<Value>) -> Value {
    let mut v = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "vm1", "namespace": NS},
        "spec": {
            "networks": [
                {"name": "default", "pod": {}},
                {"name": "dhcpnet", "multus": {"networkName": key()}}
            ],
            "domain": {"devices": {"interfaces": [
                {"name": "default", "masquerade": {}},
                {"name": "dhcpnet", "bridge": {}}
            ]}}
        }
    });
    if let Some(s) = status {
        v["status"] = s;
    }
    v
}

fn dnsmasq_count(d: &Dnsmasq, kind: &str, mac: [u8; 6]) -> usize {
    let m = format_mac(mac);
    d.log()
        .lines()
        .filter(|l| l.contains(&format!("{kind}(")) && l.contains(&m))
        .count()
}

#[test]
fn migration_target_asks_for_the_address_the_source_pod_reported_fake_apiserver() {
    const SRC: &str = "virt-launcher-vm1-src";
    const DST: &str = "virt-launcher-vm1-dst";
    const MIG_UID: &str = "6d0b8f0e-0000-4000-8000-00000000m1g1";
    let api = Api::start();
    let launcher = [
        ("kubevirt.io", "virt-launcher"),
        ("vm.kubevirt.io/name", "vm1"),
    ];
    let src_uid = api.server.add_pod(NS, SRC, &launcher, &[]);
    // First boot: nothing in the VMI status yet.
    api.server.put_vmi(vmi(None));
    // IPv6 off: the VM's MAC is the source pod interface's own, so that
    // interface's router solicitations and MLD reports would move the
    // bridge's entry for it back to the source port, where a reply to the
    // target would then go.
    let mut lab = Lab::builder().clients(1).without_ipv6().build();
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let agent = api.agent();

    // The source: no MAC in the spec or the status, so the pod
    // interface's own MAC (the MAC chain's last step).
    let src = &lab.clients[0];
    let src_mac = src.mac;
    let r = agent
        .add(&request(
            "ctr-src",
            SRC,
            &src_uid,
            src.ns.path(),
            &src.ifname,
        ))
        .expect("source ADD");
    let ip = r.ips[0].address.addr;
    assert_eq!(dnsmasq.lease_for(src_mac).map(|l| l.ip), Some(ip));
    assert_eq!(dnsmasq_count(&dnsmasq, "DHCPDISCOVER", src_mac), 1);
    let src_entry = api.networks(SRC)[key()].clone();
    assert_eq!(src_entry["mac_address"], json!(format_mac(src_mac)));
    assert_eq!(src_entry["ip_addresses"], json!([format!("{ip}/24")]));
    assert!(
        src.ns.ipv4_addrs(&src.ifname).is_empty(),
        "a VM's address is never configured"
    );

    // The VM runs; virt-handler reports its interface's MAC. No guest
    // agent: no address in the status.
    api.server.put_vmi(vmi(Some(json!({"interfaces": [
        {"name": "dhcpnet", "interfaceName": "eth1", "mac": format_mac(src_mac)}
    ]}))));
    // KubeVirt migrates it: the migration object (whose status names the
    // source pod while it is pending), and the target launcher pod it creates.
    api.server.put_vmim(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
        "metadata": {"name": "mig1", "namespace": NS, "uid": MIG_UID},
        "spec": {"vmiName": "vm1"},
        "status": {"phase": "Scheduling", "migrationState": {"sourcePod": SRC}}
    }));
    let mut target_labels = launcher.to_vec();
    target_labels.push(("kubevirt.io/migrationJobUID", MIG_UID));
    let dst_uid = api.server.add_pod(
        NS,
        DST,
        &target_labels,
        &[("kubevirt.io/migrationJobName", "mig1")],
    );
    lab.add_client("eth0");
    let dst = &lab.clients[1];
    assert_ne!(dst.mac, src_mac);

    let discovers = dnsmasq_count(&dnsmasq, "DHCPDISCOVER", src_mac);
    let requests = dnsmasq_count(&dnsmasq, "DHCPREQUEST", src_mac);
    let r2 = agent
        .add(&request(
            "ctr-dst",
            DST,
            &dst_uid,
            dst.ns.path(),
            &dst.ifname,
        ))
        .expect("migration target ADD");
    assert_eq!(r2.ips[0].address.addr, ip, "the VM keeps its address");
    assert_eq!(
        dnsmasq_count(&dnsmasq, "DHCPDISCOVER", src_mac),
        discovers,
        "the target asks for the reported address (INIT-REBOOT), no DISCOVER:\n{}",
        dnsmasq.log()
    );
    assert_eq!(
        dnsmasq_count(&dnsmasq, "DHCPREQUEST", src_mac),
        requests + 1
    );
    assert!(
        dnsmasq
            .log()
            .lines()
            .any(|l| l.contains("DHCPREQUEST(") && l.contains(&ip.to_string())),
        "{}",
        dnsmasq.log()
    );
    // The status MAC (the guest's), not the target pod interface's.
    assert!(dnsmasq.lease_for(dst.mac).is_none(), "{}", dnsmasq.log());
    let dst_entry = api.networks(DST)[key()].clone();
    assert_eq!(dst_entry["mac_address"], json!(format_mac(src_mac)));
    assert_eq!(dst_entry["ip_addresses"], json!([format!("{ip}/24")]));
    // Found through the migration object; the source's entry untouched.
    assert_eq!(api.server.count(Op::GetVmim), 1);
    assert_eq!(api.networks(SRC)[key()], src_entry);
    assert!(dst.ns.ipv4_addrs(&dst.ifname).is_empty());
    assert!(api.server.unexpected().is_empty());
}

/// The migration object cannot be read (the agent's RBAC predates it, or
/// it is gone): the VMI's `status.migrationState` of the previous, completed
/// migration names the pod the VM runs in, and the target asks for what
/// that pod reported. The VMI's spec MAC is pinned (the chain's first step).
#[test]
fn migration_target_finds_the_source_through_the_previous_migration_fake_apiserver() {
    const VM_MAC: &str = "02:00:00:00:20:31";
    const SRC: &str = "virt-launcher-vm2-b";
    const DST: &str = "virt-launcher-vm2-c";
    let api = Api::start();
    let launcher = [
        ("kubevirt.io", "virt-launcher"),
        ("vm.kubevirt.io/name", "vm2"),
    ];
    let mut doc = vmi(None);
    doc["metadata"]["name"] = json!("vm2");
    doc["spec"]["domain"]["devices"]["interfaces"][1]["macAddress"] = json!(VM_MAC);
    api.server.put_vmi(doc.clone());
    let src_uid = api.server.add_pod(NS, SRC, &launcher, &[]);
    let mut lab = Lab::with_clients(1);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let agent = api.agent();
    let src = &lab.clients[0];
    let ip = agent
        .add(&request("ctr-b", SRC, &src_uid, src.ns.path(), &src.ifname))
        .expect("source ADD")
        .ips[0]
        .address
        .addr;
    let vm_mac = xdhcp_tests::parse_mac(VM_MAC).unwrap();
    assert_eq!(dnsmasq.lease_for(vm_mac).map(|l| l.ip), Some(ip));

    // The VM came to pod b by an earlier migration (a → b, completed); the
    // new one (b → c) has not been handed off yet, and no guest agent runs.
    doc["status"] = json!({"migrationState": {"migrationUid": "mig-uid-1",
        "sourcePod": "virt-launcher-vm2-a", "targetPod": SRC, "completed": true}});
    api.server.put_vmi(doc);
    let mut target_labels = launcher.to_vec();
    target_labels.push(("kubevirt.io/migrationJobUID", "mig-uid-2"));
    let dst_uid = api.server.add_pod(
        NS,
        DST,
        &target_labels,
        &[("kubevirt.io/migrationJobName", "mig2")],
    );
    api.server
        .inject(Op::GetVmim, xdhcp_tests::fake_apiserver::Fault::Status(403));
    lab.add_client("eth0");
    let dst = &lab.clients[1];
    let discovers = dnsmasq_count(&dnsmasq, "DHCPDISCOVER", vm_mac);
    let r = agent
        .add(&request("ctr-c", DST, &dst_uid, dst.ns.path(), &dst.ifname))
        .expect("migration target ADD");
    assert_eq!(r.ips[0].address.addr, ip);
    assert_eq!(
        dnsmasq_count(&dnsmasq, "DHCPDISCOVER", vm_mac),
        discovers,
        "INIT-REBOOT, no DISCOVER:\n{}",
        dnsmasq.log()
    );
    assert_eq!(api.server.count(Op::GetVmim), 1);
    assert_eq!(api.networks(DST)[key()]["mac_address"], json!(VM_MAC));
    assert!(api.server.unexpected().is_empty());
}

/// A VMI whose interface on the NAD has the MAC `mac` pinned in its spec.
fn vmi_with_mac(mac: &str) -> Value {
    let mut v = vmi(None);
    v["spec"]["domain"]["devices"]["interfaces"][1]["macAddress"] = json!(mac);
    v
}

/// The attack: a tenant's pod labelled as the VM's launcher pod, with no
/// owner reference, asks for the VM's identity. A VM pod is one its VMI
/// controls: this one is a plain pod, leased and reported under its own
/// interface's MAC, never the VM's.
#[test]
fn a_pod_labelled_as_a_vms_launcher_is_a_plain_pod_fake_apiserver() {
    const VICTIM_MAC: &str = "02:00:00:00:aa:01";
    let api = Api::start();
    api.server.put_vmi(vmi_with_mac(VICTIM_MAC));
    api.server.put_pod(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "impostor", "namespace": NS, "uid": "u-imp",
                     "labels": {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": "vm1"}},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/c"}]}
    }));
    let lab = Lab::with_clients(1);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let c = &lab.clients[0];
    let agent = api.agent();

    let r = agent
        .add(&request(
            "ctr-imp",
            "impostor",
            "u-imp",
            c.ns.path(),
            &c.ifname,
        ))
        .expect("a plain pod's ADD");
    let entry = api.networks("impostor")[key()].clone();
    assert_eq!(entry["mac_address"], json!(format_mac(c.mac)), "{entry}");
    assert_eq!(
        dnsmasq.lease_for(c.mac).map(|l| l.ip),
        Some(r.ips[0].address.addr)
    );
    assert_eq!(
        dnsmasq_count(&dnsmasq, "DHCPDISCOVER", [2, 0, 0, 0, 0xaa, 1]),
        0
    );
    // A plain pod's lease is kept (a VM's one-shot lease is not).
    assert_eq!(agent.leases().len(), 1, "{:?}", agent.leases());
}

/// The attack with a forged owner: the pod names the VMI as its
/// controller, but not its UID. The ADD is refused before any DHCP and
/// nothing is written.
#[test]
fn a_pod_whose_owner_names_another_vmi_uid_is_refused_fake_apiserver() {
    let api = Api::start();
    api.server.put_vmi(vmi_with_mac("02:00:00:00:aa:01"));
    api.server.put_pod(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "impostor", "namespace": NS, "uid": "u-imp",
                     "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                                          "name": "vm1", "uid": "forged", "controller": true}]},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/c"}]}
    }));
    let lab = Lab::with_clients(1);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let c = &lab.clients[0];
    let agent = api.agent();

    let err = agent
        .add(&request(
            "ctr-imp",
            "impostor",
            "u-imp",
            c.ns.path(),
            &c.ifname,
        ))
        .expect_err("a pod of another VMI UID must be refused")
        .into_cni();
    assert_eq!(err.code, code::INVALID_ENV, "{err:?}");
    assert!(
        err.msg.contains("forged") && err.msg.contains("vm1"),
        "{}",
        err.msg
    );
    assert_eq!(api.server.count(Op::PatchPod), 0);
    assert!(agent.leases().is_empty(), "{:?}", agent.leases());
    assert_eq!(
        dnsmasq_count(&dnsmasq, "DHCPDISCOVER", [2, 0, 0, 0, 0xaa, 1]),
        0
    );
}

/// The attack on a migration: a launcher pod of the VM (owner and UID
/// right) labelled as the target of a migration that names another target
/// pod does not get the source pod's address asked for; it is an ordinary
/// VM ADD (DISCOVER, no INIT-REBOOT for the source's address).
#[test]
fn a_pod_the_migration_does_not_name_is_no_migration_target_fake_apiserver() {
    const MIG_UID: &str = "6d0b8f0e-0000-4000-8000-00000000m1g2";
    let api = Api::start();
    let src_entry = r#"{"tenant/localnet-dhcp":{"ip_addresses":["192.0.2.200/24"],"mac_address":"02:00:00:00:aa:02","role":"secondary"}}"#;
    api.server.add_pod(
        NS,
        "virt-launcher-vm1-src",
        &[
            ("kubevirt.io", "virt-launcher"),
            ("vm.kubevirt.io/name", "vm1"),
        ],
        &[(POD_NETWORKS, src_entry)],
    );
    api.server.put_vmi(vmi(None));
    api.server.put_vmim(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
        "metadata": {"name": "mig2", "namespace": NS, "uid": MIG_UID},
        "spec": {"vmiName": "vm1"},
        "status": {"phase": "Scheduling", "migrationState": {
            "sourcePod": "virt-launcher-vm1-src", "targetPod": "virt-launcher-vm1-real"}}
    }));
    let uid = api.server.add_pod(
        NS,
        "virt-launcher-vm1-impostor",
        &[
            ("kubevirt.io", "virt-launcher"),
            ("vm.kubevirt.io/name", "vm1"),
            ("kubevirt.io/migrationJobUID", MIG_UID),
        ],
        &[("kubevirt.io/migrationJobName", "mig2")],
    );
    let lab = Lab::with_clients(1);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let c = &lab.clients[0];
    let agent = api.agent();

    agent
        .add(&request(
            "ctr-imp",
            "virt-launcher-vm1-impostor",
            &uid,
            c.ns.path(),
            &c.ifname,
        ))
        .expect("an ordinary VM ADD");
    let log = dnsmasq.log();
    assert!(
        !log.contains("192.0.2.200"),
        "the source's address was asked for:\n{log}"
    );
    assert_eq!(dnsmasq_count(&dnsmasq, "DHCPDISCOVER", c.mac), 1, "{log}");
}

/// A retried ADD of an attachment that holds a lease writes its address
/// again: the first ADD's entry may never have been written (the agent
/// killed between the lease and its report, or the entry lost), and the
/// repeated ADD used to answer success from the lease alone, leaving the
/// pod with an address nobody reported.
#[test]
fn a_repeated_add_reports_the_address_again_fake_apiserver() {
    let api = Api::start();
    let uid = api.server.add_pod(
        NS,
        "web",
        &[("app", "web")],
        &[(POD_NETWORKS, DEFAULT_ENTRY)],
    );
    let lab = Lab::with_clients(1);
    let _dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let c = &lab.clients[0];
    let agent = api.agent();
    let req = request("ctr-web", "web", &uid, c.ns.path(), &c.ifname);
    let first = agent.add(&req).expect("ADD");
    let ip = first.ips[0].address.to_string();
    assert_eq!(api.networks("web")[key()]["ip_addresses"][0], ip);

    // The entry is gone, as after a kill between the lease and the patch.
    let mut pod = api.server.pod(NS, "web").expect("the pod");
    pod["metadata"]["annotations"][POD_NETWORKS] = json!(DEFAULT_ENTRY);
    api.server.put_pod(pod);
    assert!(api.networks("web").get(key()).is_none());

    let patches = api.server.count(Op::PatchPod);
    let again = agent.add(&req).expect("the repeated ADD");
    assert_eq!(again.ips[0].address, first.ips[0].address);
    assert_eq!(api.server.count(Op::PatchPod), patches + 1);
    assert_eq!(
        api.networks("web")[key()]["ip_addresses"][0],
        ip,
        "{}",
        api.networks("web")
    );
    assert!(api.networks("web").get("default").is_some());
    assert_eq!(agent.leases().len(), 1, "{:?}", agent.leases());
}
