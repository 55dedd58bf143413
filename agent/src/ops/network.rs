//! The operations' edge to the CNI wire types: the network configuration
//! an ADD is given, as the agent's own [`Network`] (what its lease record
//! keeps), and the record an ADD starts.

use crate::cni::config::{
    ClientIdSpec, DhcpGuardSpec, Family as CniFamily, HostnameSpec, IpamType, NetworkConfig,
};
use crate::lease::persist::LeaseRecord;
use crate::model::{
    ClientIdSetting, Family, GuardSetting, HostnameSetting, Ipam, IpamKind, Ipv6Setting, Network,
    PodRef, Prefix, WorkloadKind,
};
use crate::rpc::CniRequest;
use crate::store::RECORD_VERSION;

impl From<&NetworkConfig> for Network {
    fn from(c: &NetworkConfig) -> Self {
        let i = &c.ipam;
        Self {
            cni_version: c.cni_version.clone(),
            name: c.name.clone(),
            net_attach_def_name: c.net_attach_def_name.clone(),
            socket_path: c.socket_path.clone(),
            device_id: c.device_id.clone(),
            ipam: Ipam {
                ipam_type: match i.ipam_type {
                    IpamType::Xdhcp => IpamKind::Xdhcp,
                    IpamType::Dhcp => IpamKind::Dhcp,
                },
                apply: i.apply,
                client_id: match &i.client_id {
                    ClientIdSpec::Mac => ClientIdSetting::Mac,
                    ClientIdSpec::None => ClientIdSetting::None,
                    ClientIdSpec::Raw(b) => ClientIdSetting::Raw(b.clone()),
                },
                hostname: match &i.hostname {
                    HostnameSpec::PodName => HostnameSetting::PodName,
                    HostnameSpec::Fixed(h) => HostnameSetting::Fixed(h.clone()),
                    HostnameSpec::FromArg(k) => HostnameSetting::FromArg(k.clone()),
                },
                timeout: i.timeout,
                resend_max: i.resend_max,
                allow_default_route_override: i.allow_default_route_override,
                protected_prefixes: i
                    .protected_prefixes
                    .iter()
                    .map(|p| Prefix {
                        addr: p.addr,
                        len: p.prefix_len,
                    })
                    .collect(),
                route_priority: i.route_priority,
                dhcp_guard: GuardSetting {
                    trusted: i.dhcp_guard.trusted,
                    rate: i.dhcp_guard.rate,
                    burst: i.dhcp_guard.burst,
                },
                family: match i.family {
                    CniFamily::Ipv4 => Family::Ipv4,
                    CniFamily::Ipv6 => Family::Ipv6,
                    CniFamily::Dual => Family::Dual,
                },
                ipv6: i.ipv6.map(|v| Ipv6Setting {
                    prefix_length: v.prefix_length,
                    gateway: v.gateway,
                    rapid_commit: v.rapid_commit,
                }),
            },
        }
    }
}

/// The DHCP guard's settings as the guard takes them.
pub(crate) fn guard_spec(g: GuardSetting) -> DhcpGuardSpec {
    DhcpGuardSpec {
        trusted: g.trusted,
        rate: g.rate,
        burst: g.burst,
    }
}

/// The record of an attachment's lease of `family` (`Ipv4` or `Ipv6`) an
/// ADD starts, before the lease: on a dual-stack network it names its
/// family (each of the two leases has a record of its own).
pub(crate) fn fresh_record(
    req: &CniRequest,
    pod: Option<PodRef>,
    workload: WorkloadKind,
    (mac, family): ([u8; 6], Family),
    annotation_key: Option<String>,
) -> LeaseRecord {
    let dual = req.config.ipam.family == CniFamily::Dual;
    LeaseRecord {
        version: RECORD_VERSION,
        container_id: req.container_id.clone(),
        ifname: req.ifname.clone(),
        netns: req.netns.clone(),
        network: Network::from(&req.config),
        args: req.args.clone(),
        pod,
        workload,
        mac,
        annotation_key,
        lease: None,
        updated_unix_ms: 0,
        uplink: None,
        requested: None,
        requested_from: None,
        planned_xids: None,
        lease6: None,
        router6: None,
        lease_family: dual.then_some(family),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The network as the agent keeps it is stored exactly as the CNI
    /// configuration it came from always was: a record of either form reads
    /// as the other.
    #[test]
    fn the_network_is_stored_as_its_configuration_was() {
        let c = crate::cni::config::parse(
            br#"{"cniVersion":"1.1.0","name":"localnet-dhcp","netAttachDefName":"tenant/localnet-dhcp",
                "deviceID":"0000:3b:02.1","ipam":{"type":"dhcp","apply":true,"clientId":"ff:00:11:22",
                "provide":[{"option":"host-name","fromArg":"K8S_POD_NAME"}],"timeout":"45s",
                "resendMax":"1500ms","allowDefaultRouteOverride":true,
                "protectedPrefixes":["10.128.0.0/14"],"priority":200,
                "dhcpGuard":{"trusted":true,"rate":50,"burst":20}}}"#,
        )
        .unwrap();
        let n = Network::from(&c);
        let mut stored = serde_json::to_value(&c).unwrap();
        // A GC-only field, never set at ADD: not kept.
        stored.as_object_mut().unwrap().remove("validAttachments");
        assert_eq!(serde_json::to_value(&n).unwrap(), stored);
        let back: NetworkConfig =
            serde_json::from_value(serde_json::to_value(&n).unwrap()).unwrap();
        assert_eq!(back, c);
        assert_eq!(guard_spec(n.ipam.dhcp_guard), c.ipam.dhcp_guard);
    }

    /// An IPv6 network's family and settings are stored as configured, and
    /// an IPv4 network's record carries neither key.
    #[test]
    fn an_ipv6_network_is_stored_as_its_configuration_was() {
        let c = crate::cni::config::parse(
            br#"{"cniVersion":"1.1.0","name":"v6net","ipam":{"type":"xdhcp","family":"ipv6",
                "ipv6":{"prefixLength":64,"gateway":"fd00::1","rapidCommit":true}}}"#,
        )
        .unwrap();
        let n = Network::from(&c);
        assert_eq!(n.ipam.family, Family::Ipv6);
        assert_eq!(
            n.ipam.ipv6.and_then(|v| v.gateway),
            Some("fd00::1".parse().unwrap())
        );
        let mut stored = serde_json::to_value(&c).unwrap();
        stored.as_object_mut().unwrap().remove("validAttachments");
        assert_eq!(serde_json::to_value(&n).unwrap(), stored);
        let v4 = crate::cni::config::parse(
            br#"{"cniVersion":"1.1.0","name":"n","ipam":{"type":"xdhcp"}}"#,
        )
        .unwrap();
        let v4 = serde_json::to_value(Network::from(&v4)).unwrap();
        assert!(v4["ipam"].get("family").is_none(), "{v4}");
    }
}
