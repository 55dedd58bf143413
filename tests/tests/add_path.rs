//! The ADD path with the agent where a node runs it: in the node's
//! namespace, beside the bridge its pods' veths hang off.

mod agent_support;

use std::time::Duration;

use agent_support::NodeAgent;
use xdhcp::rpc::{self, CniRequest};
use xdhcp_tests::{Dnsmasq, DnsmasqConfig, Lab, NetNs};

/// Pods whose interface the main plugin hands over down (macvlan, bridge)
/// each get their lease from their first DISCOVER. The agent brings the
/// interface up; the kernel makes the veth's far end — the bridge port —
/// forward only once its link watcher has handled the carrier coming on,
/// under the RTNL lock, and a DISCOVER sent before is dropped at the
/// bridge without a word (a third of such ADDs or more on a busy node). The
/// agent's first retransmission is 30 s away here, beyond the ADD's 10 s
/// timeout, so an ADD whose first DISCOVER was dropped fails.
#[test]
fn pods_handed_over_down_are_leased_from_their_first_discover() {
    let lab = Lab::builder().server_behind_uplink().clients(0).build();
    let _dnsmasq = Dnsmasq::start(
        lab.dhcp_ns(),
        DnsmasqConfig {
            interface: lab.dhcp_ifname().into(),
            ..DnsmasqConfig::default()
        },
    );
    let agent = NodeAgent::start(
        &lab.server,
        &["--retransmit-initial", "30s", "--retransmit-jitter", "0s"],
    );
    let client = rpc::Client::new(&agent.socket, Duration::from_secs(30));
    let conf = r#"{"cniVersion":"1.0.0","name":"net1","type":"macvlan","ipam":{"type":"xdhcp","timeout":"10s"}}"#;
    let mut pods = Vec::new();
    for i in 0..6 {
        let pod = NetNs::new();
        let port = format!("cd{i}");
        lab.server.ip(&[
            "link",
            "add",
            &port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            pod.name(),
        ]);
        lab.bridge.attach(&port);
        lab.server.link_up(&port);
        let req = CniRequest {
            container_id: format!("pod-down-{i}"),
            ifname: "eth0".to_owned(),
            netns: Some(pod.path().to_path_buf()),
            args: [
                ("K8S_POD_NAMESPACE".to_owned(), "default".to_owned()),
                ("K8S_POD_NAME".to_owned(), format!("pod-down-{i}")),
            ]
            .into(),
            config: xdhcp::cni::config::parse(conf.as_bytes()).expect("a valid config"),
        };
        if let Err(e) = client.post::<_, serde_json::Value>(rpc::PATH_ADD, &req) {
            panic!(
                "ADD {i} of a pod handed over down: {}\n{}",
                e.into_cni().msg,
                agent.log()
            );
        }
        pods.push((pod, req));
    }
    for (_, req) in &pods {
        let _: serde_json::Value = client.post(rpc::PATH_DEL, req).expect("DEL");
    }
}
