//! How an OVN-Kubernetes node wires a localnet network, as data: the
//! names and `external_ids` the OVS + OVN node lab of the tests
//! (`xdhcp_tests::OvnLab`) and `cargo xtask demo` both write, so the two
//! cannot drift apart. Pure functions returning the arguments of
//! `ovs-vsctl` and `ovn-nbctl`; the callers run them.
//!
//! Read in OVN-Kubernetes' own source (`go-controller/pkg/cni/helper_linux.go`,
//! `ConfigureOVS`): a pod's host-side port on `br-int` carries the logical
//! port (`iface-id`), the pod's UID (`iface-id-ver`), its MAC
//! (`attached_mac`), the sandbox id, the interface name in the pod
//! (`pod-if-name`) and, on a secondary network, the network and NAD names.

/// The variables that put every OVS and OVN program's run, database, log
/// and configuration directories somewhere of the caller's own (so nothing
/// reaches the host's `/var/run/openvswitch` or `/etc/openvswitch`).
pub const DIR_VARS: &[&str] = &[
    "OVS_RUNDIR",
    "OVS_DBDIR",
    "OVS_LOGDIR",
    "OVS_SYSCONFDIR",
    "OVN_RUNDIR",
    "OVN_DBDIR",
    "OVN_LOGDIR",
    "OVN_SYSCONFDIR",
];

/// The integration bridge, where pods' ports are.
pub const INTEGRATION_BRIDGE: &str = "br-int";

/// The logical switch port OVN-Kubernetes names for a pod on a secondary
/// network: the NAD key with `/` and `-` turned into `.`, then
/// `_<namespace>_<pod>`.
pub fn logical_port(nad: &str, namespace: &str, pod: &str) -> String {
    format!("{}_{namespace}_{pod}", nad.replace(['/', '-'], "."))
}

/// The name OVN-Kubernetes gives a secondary network: the NAD key with `/`
/// as `_`.
pub fn network_name(nad: &str) -> String {
    nad.replace('/', "_")
}

/// A sandbox (container) id: 64 hex digits, the `n`th of a caller.
pub fn sandbox_id(n: usize) -> String {
    format!("5a4db0c{n:02x}{}", "e".repeat(55))
}

/// The host end of a pod's veth on a secondary network: the sandbox id cut
/// short, `_`, a number (OVN-Kubernetes uses the interface's index).
pub fn host_ifname(sandbox: &str, n: usize) -> String {
    format!("{}_{n}", &sandbox[..13.min(sandbox.len())])
}

/// A pod's port on `br-int` as OVN-Kubernetes' CNI writes it.
#[derive(Debug, Clone, Copy)]
pub struct PodPort<'a> {
    /// The host end of the pod's veth (the port's name).
    pub host_ifname: &'a str,
    /// The logical switch port ([`logical_port`]).
    pub iface_id: &'a str,
    /// The pod's UID.
    pub uid: &'a str,
    /// `aa:bb:…`: the MAC the logical port carries.
    pub mac: &'a str,
    pub sandbox: &'a str,
    /// The interface's name inside the pod (`net1` for the first
    /// secondary network).
    pub pod_if_name: &'a str,
    /// The NAD key, `<namespace>/<name>`.
    pub nad: &'a str,
}

impl PodPort<'_> {
    /// `ovs-vsctl` arguments adding the port to `br-int` with its
    /// `external_ids` (transient: OVS forgets it on restart, as OVN-K asks).
    pub fn add_port_args(&self) -> Vec<String> {
        let mut args = vec![
            "add-port".to_owned(),
            INTEGRATION_BRIDGE.to_owned(),
            self.host_ifname.to_owned(),
            "other_config:transient=true".to_owned(),
            "--".to_owned(),
            "set".to_owned(),
            "interface".to_owned(),
            self.host_ifname.to_owned(),
        ];
        args.extend([
            format!("external_ids:iface-id={}", self.iface_id),
            format!("external_ids:iface-id-ver={}", self.uid),
            format!("external_ids:attached_mac=\"{}\"", self.mac),
            format!("external_ids:sandbox={}", self.sandbox),
            format!("external_ids:pod-if-name={}", self.pod_if_name),
            format!(
                "external_ids:\"k8s.ovn.org/network\"={}",
                network_name(self.nad)
            ),
            format!("external_ids:\"k8s.ovn.org/nad\"=\"{}\"", self.nad),
        ]);
        args
    }

    /// `ovn-nbctl` arguments adding the logical port on `switch` with the
    /// pod's MAC (MAC only: the address comes from DHCP).
    pub fn lsp_add_args(&self, switch: &str) -> Vec<String> {
        [
            "lsp-add",
            switch,
            self.iface_id,
            "--",
            "lsp-set-addresses",
            self.iface_id,
            self.mac,
            "--",
            "set",
            "logical_switch_port",
            self.iface_id,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .chain([format!("options:iface-id-ver={}", self.uid)])
        .collect()
    }
}

/// `ovn-nbctl` arguments adding the localnet port `port` of `switch`,
/// mapped to physical network `physnet` (`addresses=unknown`: every MAC
/// behind the wire).
pub fn localnet_port_args(switch: &str, port: &str, physnet: &str) -> Vec<String> {
    [
        "lsp-add",
        switch,
        port,
        "--",
        "lsp-set-type",
        port,
        "localnet",
        "--",
        "lsp-set-addresses",
        port,
        "unknown",
        "--",
        "lsp-set-options",
        port,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([format!("network_name={physnet}")])
    .collect()
}

/// `ovs-vsctl` arguments adding bridge `name` on `datapath` (`netdev`, the
/// userspace datapath, or `system`, the kernel's); the integration bridge
/// also gets `fail_mode=secure` and no in-band control, as ovn-controller
/// expects.
pub fn add_bridge_args(name: &str, datapath: &str) -> Vec<String> {
    let mut args: Vec<String> = ["add-br", name, "--", "set", "bridge", name]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    args.push(format!("datapath_type={datapath}"));
    if name == INTEGRATION_BRIDGE {
        args.push("fail_mode=secure".to_owned());
        args.push("other_config:disable-in-band=true".to_owned());
    }
    args
}

/// `ovs-vsctl` arguments setting the `Open_vSwitch` row's OVN settings:
/// chassis name, southbound database, encapsulation, and the bridge
/// mappings (`physnet:bridge,…`).
pub fn node_settings_args(chassis: &str, southbound: &str, mappings: &str) -> Vec<String> {
    vec![
        "set".to_owned(),
        "open_vswitch".to_owned(),
        ".".to_owned(),
        format!("external_ids:system-id={chassis}"),
        format!("external_ids:ovn-remote=\"{southbound}\""),
        "external_ids:ovn-encap-type=geneve".to_owned(),
        "external_ids:ovn-encap-ip=127.0.0.1".to_owned(),
        format!("external_ids:ovn-bridge-mappings=\"{mappings}\""),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_ovn_kubernetes_own() {
        assert_eq!(
            logical_port("lab-ns/localnet-1", "lab-ns", "pod1"),
            "lab.ns.localnet.1_lab-ns_pod1"
        );
        assert_eq!(network_name("lab-ns/localnet1"), "lab-ns_localnet1");
        let sandbox = sandbox_id(1);
        assert_eq!(sandbox.len(), 64);
        let host = host_ifname(&sandbox, 4);
        assert_eq!(host, "5a4db0c01eeee_4");
        assert!(host.len() <= 15, "an interface name has at most 15 bytes");
    }

    #[test]
    fn a_pod_port_carries_every_external_id_ovn_kubernetes_writes() {
        let port = PodPort {
            host_ifname: "5a4db0c01eeee_4",
            iface_id: "ns.net_ns_pod",
            uid: "uid-1",
            mac: "0a:58:c0:00:02:05",
            sandbox: "s",
            pod_if_name: "net1",
            nad: "ns/net",
        };
        let args = port.add_port_args();
        assert_eq!(&args[..3], ["add-port", "br-int", "5a4db0c01eeee_4"]);
        for id in [
            "iface-id=ns.net_ns_pod",
            "iface-id-ver=uid-1",
            "attached_mac=\"0a:58:c0:00:02:05\"",
            "sandbox=s",
            "pod-if-name=net1",
            "\"k8s.ovn.org/network\"=ns_net",
            "\"k8s.ovn.org/nad\"=\"ns/net\"",
        ] {
            assert!(
                args.contains(&format!("external_ids:{id}")),
                "{id} missing: {args:?}"
            );
        }
        assert_eq!(
            port.lsp_add_args("sw").last().map(String::as_str),
            Some("options:iface-id-ver=uid-1")
        );
    }

    #[test]
    fn only_the_integration_bridge_is_fail_secure() {
        assert!(add_bridge_args("br-int", "netdev").contains(&"fail_mode=secure".to_owned()));
        let phys = add_bridge_args("br-phys", "netdev");
        assert!(phys.contains(&"datapath_type=netdev".to_owned()));
        assert!(!phys.iter().any(|a| a.starts_with("fail_mode")));
    }
}
