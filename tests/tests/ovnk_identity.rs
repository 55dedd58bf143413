//! A plain pod's ADD exactly as ovnkube-node makes it — the `dhcp` plugin,
//! the config cut down to `{"type":"dhcp"}` under OVN-Kubernetes' network
//! name, an empty `CNI_ARGS` — names its pod anyway: the agent finds the
//! pod from Open vSwitch (the interface's host end → its `br-int` port →
//! `iface-id`, `iface-id-ver`, `k8s.ovn.org/nad`, `sandbox`) and the pod
//! object through its watch of the node's pods.
//!
//! On the OVS + OVN node lab (`xdhcp_tests::OvnLab`), with the **stand-in
//! API server** (`xdhcp_tests::fake_apiserver`: an in-process HTTP server
//! driven by the agent's real kube client, listening inside the lab's node
//! namespace where the agent runs; it is not a cluster). Shown:
//!
//! - `xdhcp leases --json` names the pod (namespace/name and UID) and the
//!   NAD, `xdhcp bindings` and the metrics' binding series name the pod; the
//!   pod came from the node-scoped watch (a list and a watch with
//!   `fieldSelector=spec.nodeName=<node>`, no read of the pod), and the
//!   agent wrote no `pod-networks` entry (ovnkube-node writes it);
//! - a GC whose valid list lacks the attachment keeps it: OVS still shows
//!   its port for the same sandbox and pod UID;
//! - a stale sandbox's ADD is refused with a CNI error that says so: a
//!   sandbox id OVS does not show on the port, and a pod recreated under
//!   the same name (its UID no longer the port's).
//!
//! Needs root; fails, never skips, without it.

mod agent_support;

use std::time::Duration;

use agent_support::{CniPath, NodeAgent, ovnk_call_as};
use serde_json::{Value, json};
use xdhcp_tests::fake_apiserver::{NODE, Op};
use xdhcp_tests::{Dnsmasq, DnsmasqConfig, NetNs, OvnLab, StandInApi, parse_mac, wait_until};

/// Where the agent serves its metrics, inside the lab's node namespace.
const METRICS: &str = "127.0.0.1:9465";

/// The stand-in API server, listening in `node` (on its own runtime: the
/// test thread blocks on the plugin), and a kubeconfig naming it.
struct Api(StandInApi);

impl std::ops::Deref for Api {
    type Target = StandInApi;

    fn deref(&self) -> &StandInApi {
        &self.0
    }
}

impl Api {
    fn start_in(node: &NetNs) -> Self {
        Self(StandInApi::start_in(node.path()))
    }

    /// Store pod `lab-ns/<name>` with `uid`, on the agent's node.
    fn put_pod(&self, name: &str, uid: &str) {
        self.server.put_pod(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "lab-ns", "uid": uid},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "registry.invalid/c"}]}
        }));
    }
}

fn agent_on(lab: &OvnLab, api: &Api) -> NodeAgent {
    let db = lab.db_socket();
    let kubeconfig = api.kubeconfig.clone();
    NodeAgent::start(
        &lab.node,
        &[
            "--ovsdb",
            db.to_str().unwrap(),
            "--kube",
            "on",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--node-name",
            NODE,
            "--metrics-addr",
            METRICS,
        ],
    )
}

/// Wait until the agent has listed the node's pods and watches them.
fn wait_watching(api: &Api, agent: &NodeAgent) {
    assert!(
        wait_until(Duration::from_secs(10), || {
            api.server.count(Op::ListPods) > 0 && api.server.count(Op::WatchPods) > 0
        }),
        "the agent does not watch the node's pods:\n{}",
        agent.log()
    );
}

fn scrape(node: &NetNs) -> String {
    let addr: std::net::SocketAddr = METRICS.parse().expect("an address");
    let mut text = None;
    wait_until(Duration::from_secs(5), || {
        text = node.run_in(move || xdhcp_tests::bench::http_get(addr, "/metrics"));
        text.is_some()
    });
    text.expect("the agent's metrics server answers")
}

fn json_of(agent: &NodeAgent, cmd: &str) -> Value {
    serde_json::from_str(&agent.cli(cmd).unwrap_or_else(|| panic!("xdhcp {cmd}")))
        .unwrap_or_else(|e| panic!("xdhcp {cmd} --json: {e}"))
}

fn lab_with_server() -> (OvnLab, Dnsmasq) {
    let lab = OvnLab::start();
    let dnsmasq = Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            interface: OvnLab::SERVER_IF.to_owned(),
            ..DnsmasqConfig::default()
        },
    );
    (lab, dnsmasq)
}

#[test]
fn an_add_without_cni_args_names_its_pod_from_ovs_and_the_node_watch_with_the_stand_in_api_server()
{
    let cni = CniPath::new();
    let (mut lab, dnsmasq) = lab_with_server();
    let api = Api::start_in(&lab.node);
    lab.add_pod("pod1", parse_mac("0a:58:c0:00:02:05").unwrap());
    let (sandbox, uid, mac) = {
        let p = &lab.pods()[0];
        (p.sandbox.clone(), p.uid.clone(), p.mac)
    };
    api.put_pod("pod1", &uid);
    let agent = agent_on(&lab, &api);
    wait_watching(&api, &agent);

    let add = ovnk_call_as(&cni, &agent, &lab.pods()[0], &sandbox, "ADD", "");
    assert!(
        add.ok,
        "ADD: {}\n{}\n{}",
        add.text(),
        agent.log(),
        dnsmasq.log()
    );

    // (a) The lease names the pod, its UID and the NAD.
    let leases = json_of(&agent, "leases");
    let rows = leases.as_array().expect("a lease list");
    assert_eq!(rows.len(), 1, "{leases}");
    let l = &rows[0];
    assert_eq!(l["pod"], "lab-ns/pod1", "{leases}\n{}", agent.log());
    assert_eq!(l["podUid"], uid.as_str(), "{leases}");
    assert_eq!(l["nad"], OvnLab::NAD, "{leases}");
    assert_eq!(l["network"], OvnLab::NETWORK, "{leases}");
    assert_eq!(l["containerId"], sandbox.as_str(), "{leases}");
    // The table names the pod too.
    let table = agent_support_cli_table(&agent);
    assert!(table.contains("lab-ns/pod1"), "{table}");

    // (b) The binding table and its metric series name the pod.
    let bindings = json_of(&agent, "bindings");
    let b = bindings
        .as_array()
        .and_then(|r| r.iter().find(|b| b["source"] == "leased"))
        .unwrap_or_else(|| panic!("no leased binding: {bindings}"));
    assert_eq!(b["pod"], "lab-ns/pod1", "{bindings}");
    assert_eq!(b["mac"], xdhcp_tests::format_mac(mac), "{bindings}");
    let mut text = String::new();
    assert!(
        wait_until(Duration::from_secs(6), || {
            text = scrape(&lab.node);
            text.lines()
                .any(|l| l.starts_with("xdhcp_binding_info{") && l.contains(r#"pod="lab-ns/pod1""#))
        }),
        "no binding series names the pod:\n{text}"
    );

    // (c) The pod came from the node's watch: listed and watched with the
    // node's field selector, never read one by one; and the agent wrote no
    // pod-networks entry (ovnkube-node's to write).
    let reqs = api.server.requests();
    let selector = format!("fieldSelector=spec.nodeName%3D{NODE}");
    for op in [Op::ListPods, Op::WatchPods] {
        assert!(
            reqs.iter()
                .any(|r| r.op == Some(op) && r.uri.contains(&selector)),
            "no {op:?} with {selector}: {:?}",
            reqs.iter().map(|r| &r.uri).collect::<Vec<_>>()
        );
    }
    assert_eq!(api.server.count(Op::GetPod), 0, "{reqs:?}");
    assert_eq!(api.server.count(Op::PatchPod), 0, "{reqs:?}");
    assert!(
        api.server.unexpected().is_empty(),
        "{:?}",
        api.server.unexpected()
    );

    // (d) GC whose valid list lacks the attachment (a runtime's GC knows
    // nothing of ovnkube-node's IPAM call): OVS still shows the port for
    // this sandbox and pod, so the lease stays, unreleased.
    let gc = ovnk_call_as(
        &cni,
        &agent,
        &lab.pods()[0],
        "",
        "GC",
        r#","cni.dev/valid-attachments":[{"containerID":"another-sandbox","ifname":"eth0"}]"#,
    );
    assert!(gc.ok, "GC: {}\n{}", gc.text(), agent.log());
    let after = json_of(&agent, "leases");
    assert_eq!(
        after.as_array().map(Vec::len),
        Some(1),
        "GC dropped it: {after}\n{}",
        agent.log()
    );
    assert!(dnsmasq.lease_for(mac).is_some(), "{}", dnsmasq.log());
}

/// `xdhcp leases` as a table.
fn agent_support_cli_table(agent: &NodeAgent) -> String {
    let out = std::process::Command::new(agent_support::xdhcp_bin())
        .args(["leases", "--socket"])
        .arg(&agent.socket)
        .env_remove("CNI_COMMAND")
        .output()
        .expect("run xdhcp leases");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_stale_sandbox_s_add_is_refused_with_the_stand_in_api_server() {
    let cni = CniPath::new();
    let (mut lab, dnsmasq) = lab_with_server();
    let api = Api::start_in(&lab.node);
    lab.add_pod("pod1", parse_mac("0a:58:c0:00:02:05").unwrap());
    lab.add_pod("pod2", parse_mac("0a:58:c0:00:02:06").unwrap());
    let (pod1_uid, pod2_sandbox) = (lab.pods()[0].uid.clone(), lab.pods()[1].sandbox.clone());
    api.put_pod("pod1", &pod1_uid);
    // pod2 was deleted and recreated under its name since its port was
    // added: the API has another UID.
    api.put_pod("pod2", "11111111-2222-4333-8444-555555555555");
    let agent = agent_on(&lab, &api);
    wait_watching(&api, &agent);

    // A sandbox id OVS does not show on the port: superseded.
    let old = format!("0a1d5a4db0c{}", "0".repeat(53));
    let r = ovnk_call_as(&cni, &agent, &lab.pods()[0], &old, "ADD", "");
    assert!(!r.ok, "a stale sandbox's ADD succeeded: {}", r.stdout);
    let text = r.text();
    assert!(
        text.contains("stale sandbox")
            && text.contains(&old)
            && text.contains(&lab.pods()[0].sandbox),
        "{text}"
    );

    // The port's UID is not the pod's now: the pod was recreated.
    let r = ovnk_call_as(&cni, &agent, &lab.pods()[1], &pod2_sandbox, "ADD", "");
    assert!(!r.ok, "the recreated pod's old ADD succeeded: {}", r.stdout);
    let text = r.text();
    assert!(
        text.contains("stale sandbox")
            && text.contains("lab-ns/pod2")
            && text.contains(&lab.pods()[1].uid)
            && text.contains("11111111-2222-4333-8444-555555555555"),
        "{text}"
    );
    // Neither leased anything.
    assert_eq!(json_of(&agent, "leases").as_array().map(Vec::len), Some(0));
    for mac in [lab.pods()[0].mac, lab.pods()[1].mac] {
        assert!(dnsmasq.lease_for(mac).is_none(), "{}", dnsmasq.log());
    }

    // The current sandbox of pod1 is served.
    let sandbox = lab.pods()[0].sandbox.clone();
    let r = ovnk_call_as(&cni, &agent, &lab.pods()[0], &sandbox, "ADD", "");
    assert!(r.ok, "ADD: {}\n{}", r.text(), agent.log());
}
