//! What the agent checks of a request before it acts on it: the caller
//! and every name the request carries are the caller's word, so each is
//! checked again here, where it is used, whatever the plugin checked.
//!
//! - the pod: scheduled to this agent's node ([`on_this_node`]);
//! - `CNI_NETNS`: one of the shapes the plugin accepts (the protocol
//!   crate's own check, shared), a namespace file, and neither the agent's
//!   own network namespace nor the host's ([`check_netns`]);
//! - the peer of the socket: root, or a uid the agent was told to trust
//!   ([`peer_allowed`]);
//! - the network config's DHCP guard: it may tighten the guard, never
//!   loosen it beyond the agent's flags ([`guard_policy`]).
//!
//! `docs/security.md` says why each check is there.

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::sync::OnceLock;

use crate::cni::config::DhcpGuardSpec;
use crate::cni::env::{NetnsPathError, check_netns_shape, check_nsfs};
use crate::kube::PodInfo;
use crate::ops::context::Agent;
use crate::ops::error::{Error, Refusal};

/// The agent's own network namespace.
const OWN_NETNS: &str = "/proc/self/ns/net";
/// The host's network namespace (pid 1's; with the host network, the
/// agent's own as well).
const HOST_NETNS: &str = "/proc/1/ns/net";

/// Refuse a pod that is not scheduled to this agent's node (with the
/// cluster backend, which knows the node; the embedded store has none).
#[expect(
    clippy::result_large_err,
    reason = "a failed CNI operation is rare; its error goes straight to the socket"
)]
pub(crate) fn on_this_node(agent: &Agent, info: &PodInfo) -> Result<(), Error> {
    let Some(ours) = agent.pod_api.node() else {
        return Ok(());
    };
    info.check_node(ours).map_err(|source| {
        agent.metrics().failure("refused");
        tracing::warn!(error = %source, "ADD refused: the pod is not on this node");
        Error::Kube { source }
    })
}

/// Check the `CNI_NETNS` of a request: `sent` is the path as the caller
/// sent it (its shape is checked), `opened` the path the agent will open
/// (`sent` behind `--host-prefix`). A path that does not exist passes
/// here (the ADD fails opening it; a DEL tolerates it); one that exists
/// must be a namespace file, and neither the agent's nor the host's network
/// namespace.
pub(crate) fn check_netns(sent: &Path, opened: &Path) -> Result<(), Refusal> {
    check_netns_against(sent, opened, forbidden_netns())
}

/// The namespaces no request may name: pid 1's and the agent's own, read
/// once (two path walks through `/proc` on every request showed in the
/// agent's CPU profile), at the agent's start, before any trip into a
/// pod's namespace could have moved the thread `/proc/self` names; they do
/// not change while the agent runs.
pub(crate) fn forbidden_netns() -> &'static [Forbidden; 2] {
    static FORBIDDEN: OnceLock<[Forbidden; 2]> = OnceLock::new();
    FORBIDDEN.get_or_init(|| {
        [
            Forbidden::read(Path::new(HOST_NETNS), "the host's network namespace"),
            Forbidden::read(Path::new(OWN_NETNS), "the agent's own network namespace"),
        ]
    })
}

/// A namespace a request may not name: its identity (device, inode), if
/// the agent could read it, and what it is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Forbidden {
    identity: Option<(u64, u64)>,
    which: &'static str,
}

impl Forbidden {
    /// The namespace at `path`. One the agent cannot read is not one it
    /// could be told to act in through that path either: it forbids
    /// nothing.
    pub(crate) fn read(path: &Path, which: &'static str) -> Self {
        Self {
            identity: identity(path).ok(),
            which,
        }
    }
}

/// A file's device and inode: a namespace's identity.
fn identity(path: &Path) -> std::io::Result<(u64, u64)> {
    std::fs::metadata(path).map(|m| (m.dev(), m.ino()))
}

/// [`check_netns`] against the `forbidden` namespaces given.
pub(crate) fn check_netns_against(
    sent: &Path,
    opened: &Path,
    forbidden: &[Forbidden],
) -> Result<(), Refusal> {
    check_netns_shape(sent).map_err(|source| Refusal::Netns { source })?;
    match check_nsfs(opened) {
        Ok(()) => {}
        Err(NetnsPathError::Missing { .. }) => return Ok(()),
        Err(source) => return Err(Refusal::Netns { source }),
    }
    let target = identity(opened).map_err(|source| Refusal::NetnsIdentity {
        path: opened.to_path_buf(),
        source,
    })?;
    match forbidden.iter().find(|f| f.identity == Some(target)) {
        Some(f) => Err(Refusal::ForbiddenNetns {
            path: sent.to_path_buf(),
            which: f.which,
        }),
        None => Ok(()),
    }
}

/// The DHCP guard a network's ports get. The network config (a
/// NetworkAttachmentDefinition, which a tenant may write in its own
/// namespace) may tighten the guard, never loosen it: `trusted` holds only
/// for a network the agent's flags name (`--dhcp-guard-trusted-network`,
/// as `netAttachDefName` or the config's `name`), and the rate and burst
/// are capped at `--dhcp-guard-max-rate` and `--dhcp-guard-max-burst`.
pub(crate) fn guard_policy(
    asked: &DhcpGuardSpec,
    network: &str,
    trusted_networks: &[String],
    max_rate: u32,
    max_burst: u32,
) -> DhcpGuardSpec {
    DhcpGuardSpec {
        trusted: asked.trusted && trusted_networks.iter().any(|n| n == network),
        rate: asked.rate.min(max_rate),
        burst: asked.burst.min(max_burst),
    }
}

/// The device plugins' allocations, from the kubelet's checkpoint
/// (`kubelet_internal_checkpoint`, written when a pod is admitted, before
/// its sandbox and so before any CNI ADD): which pod UID holds each device
/// id, and every device id a plugin registered. The SR-IOV device plugin's
/// device ids are the VFs' PCI addresses.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Allocations {
    /// Device id → the pod UIDs it is allocated to.
    by_device: std::collections::BTreeMap<String, Vec<String>>,
    /// Every device id a plugin registered.
    registered: std::collections::BTreeSet<String>,
}

impl Allocations {
    /// Parse the checkpoint (its `Data`: `PodDeviceEntries` with `PodUID`
    /// and `DeviceIDs`, a list or a map of NUMA node to list, and
    /// `RegisteredDevices`); anything else in it is ignored.
    pub(crate) fn parse(text: &str) -> Result<Self, serde_json::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Ids {
            List(Vec<String>),
            ByNuma(std::collections::BTreeMap<String, Vec<String>>),
        }
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Entry {
            #[serde(rename = "PodUID")]
            pod_uid: String,
            #[serde(rename = "DeviceIDs")]
            device_ids: Ids,
        }
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Data {
            #[serde(default)]
            pod_device_entries: Vec<Entry>,
            #[serde(default)]
            registered_devices: std::collections::BTreeMap<String, Vec<String>>,
        }
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Checkpoint {
            data: Data,
        }
        let c: Checkpoint = serde_json::from_str(text)?;
        let mut out = Allocations::default();
        for e in c.data.pod_device_entries {
            let ids = match e.device_ids {
                Ids::List(l) => l,
                Ids::ByNuma(m) => m.into_values().flatten().collect(),
            };
            for id in ids {
                out.registered.insert(id.clone());
                out.by_device.entry(id).or_default().push(e.pod_uid.clone());
            }
        }
        out.registered
            .extend(c.data.registered_devices.into_values().flatten());
        Ok(out)
    }

    /// `Ok` when `pci` may be handed off for pod `pod_uid`: a device no
    /// plugin registered is no plugin's to check; a registered one must be
    /// allocated to that pod. `Err` says why not.
    pub(crate) fn check(&self, pci: &str, pod_uid: Option<&str>) -> Result<(), String> {
        if !self.registered.contains(pci) {
            return Ok(());
        }
        let holders = self
            .by_device
            .get(pci)
            .map(Vec::as_slice)
            .unwrap_or_default();
        match pod_uid {
            Some(uid) if holders.iter().any(|h| h == uid) => Ok(()),
            _ if holders.is_empty() => Err("a device plugin's device allocated to no pod".into()),
            _ => Err(format!("allocated to pod UID {}", holders.join(", "))),
        }
    }
}

/// Hand off VF `pci` for pod `pod_uid` only if the kubelet's device
/// checkpoint at `checkpoint` allows it ([`Allocations::check`]). No
/// checkpoint there (no kubelet, or not mounted): nothing to check against,
/// and the handoff goes on.
pub(crate) fn device_of_pod(
    checkpoint: &Path,
    pci: &str,
    pod_uid: Option<&str>,
) -> Result<(), Refusal> {
    let text = match std::fs::read_to_string(checkpoint) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::debug!(checkpoint = %checkpoint.display(),
                "no kubelet device checkpoint: the VF's allocation is not checked");
            return Ok(());
        }
        Err(source) => {
            return Err(Refusal::Checkpoint {
                path: checkpoint.to_path_buf(),
                source,
            });
        }
    };
    let allocations = Allocations::parse(&text).map_err(|e| Refusal::Checkpoint {
        path: checkpoint.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    allocations
        .check(pci, pod_uid)
        .map_err(|why| Refusal::NotThePodsDevice {
            pci: pci.to_owned(),
            pod_uid: pod_uid.map(str::to_owned),
            why,
            checkpoint: checkpoint.to_path_buf(),
        })
}

/// Whether a socket peer with `uid` may use the agent socket: root, or one
/// of the `--socket-allow-uid` values.
pub(crate) fn peer_allowed(uid: u32, allowed: &[u32]) -> bool {
    uid == 0 || allowed.contains(&uid)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// A namespace path the caller sends in the shape of a pod's but that
    /// names the agent's own namespace (its pid's `ns/net`; here also the
    /// host's) is refused; so is any shape the plugin refuses, and a file
    /// that is no namespace.
    #[test]
    fn the_agents_own_namespace_and_odd_paths_are_refused() {
        let me = PathBuf::from(format!("/proc/{}/ns/net", std::process::id()));
        let e = check_netns(&me, &me).unwrap_err();
        assert!(matches!(&e, Refusal::ForbiddenNetns { .. }), "{e}");
        let e = check_netns_against(&me, &me, &[Forbidden::read(Path::new(OWN_NETNS), "own")])
            .unwrap_err();
        assert!(
            matches!(&e, Refusal::ForbiddenNetns { which, .. } if *which == "own"),
            "{e}"
        );
        for bad in [
            "/etc/passwd",
            "/proc/self/ns/net",
            "/run/netns/../../etc/passwd",
        ] {
            let e = check_netns(Path::new(bad), Path::new(bad)).unwrap_err();
            assert!(matches!(e, Refusal::Netns { .. }), "{bad}: {e}");
        }
        // A right shape whose file is not a namespace (behind a prefix).
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("run/netns/pod");
        std::fs::create_dir_all(fake.parent().unwrap()).unwrap();
        std::fs::write(&fake, b"").unwrap();
        let e = check_netns(Path::new("/run/netns/pod"), &fake).unwrap_err();
        assert!(
            matches!(
                &e,
                Refusal::Netns {
                    source: NetnsPathError::NotNsfs { .. }
                }
            ),
            "{e}"
        );
        // A missing namespace is left to the operation (a DEL tolerates it).
        let gone = dir.path().join("run/netns/gone");
        check_netns(Path::new("/run/netns/gone"), &gone).unwrap();
    }

    /// The comparison is by namespace identity, not by path: a namespace
    /// reached through another path is the same namespace.
    #[test]
    fn forbidden_namespaces_are_compared_by_identity() {
        let me = PathBuf::from(format!("/proc/{}/ns/net", std::process::id()));
        let e = check_netns_against(
            &me,
            &me,
            &[Forbidden::read(
                Path::new("/proc/thread-self/ns/net"),
                "the test's namespace",
            )],
        )
        .unwrap_err();
        assert!(matches!(e, Refusal::ForbiddenNetns { .. }), "{e}");
        // Compared with nothing, or with a namespace the agent could not
        // read, the same path passes.
        check_netns_against(&me, &me, &[]).unwrap();
        let unread = Forbidden::read(Path::new("/proc/no-such-pid/ns/net"), "unread");
        check_netns_against(&me, &me, &[unread]).unwrap();
    }

    #[test]
    fn root_and_configured_uids_may_use_the_socket() {
        assert!(peer_allowed(0, &[]));
        assert!(!peer_allowed(1000, &[]));
        assert!(peer_allowed(1000, &[1000]));
        assert!(!peer_allowed(1001, &[1000]));
    }

    /// A tenant's NetworkAttachmentDefinition asks for a trusted port and
    /// the highest rate: it gets neither unless the agent's flags say so;
    /// it may still ask for less.
    #[test]
    fn the_network_config_cannot_loosen_the_guard() {
        let asked = DhcpGuardSpec {
            trusted: true,
            rate: 10_000,
            burst: 10_000,
        };
        let got = guard_policy(&asked, "tenant/net", &[], 20, 10);
        assert_eq!(
            got,
            DhcpGuardSpec {
                trusted: false,
                rate: 20,
                burst: 10
            }
        );
        let named = guard_policy(&asked, "tenant/net", &["tenant/net".to_owned()], 20, 10);
        assert!(named.trusted);
        let tighter = DhcpGuardSpec {
            trusted: false,
            rate: 2,
            burst: 1,
        };
        assert_eq!(guard_policy(&tighter, "tenant/net", &[], 20, 10), tighter);
    }

    /// The kubelet's checkpoint as it is written (v2: device ids by NUMA
    /// node): a VF allocated to the pod is its; one allocated to another
    /// pod, or a plugin's VF allocated to none, is not; a VF no plugin
    /// registered is not checked.
    #[test]
    fn a_vf_is_handed_off_only_for_the_pod_it_is_allocated_to() {
        let text = r#"{"Data":{"PodDeviceEntries":[
            {"PodUID":"uid-vm1","ContainerName":"compute","ResourceName":"intel.com/sriov",
             "DeviceIDs":{"-1":["0000:3b:02.1"]},"AllocResp":"e30="},
            {"PodUID":"uid-old","ContainerName":"c","ResourceName":"intel.com/sriov",
             "DeviceIDs":["0000:3b:02.3"],"AllocResp":"e30="}],
            "RegisteredDevices":{"intel.com/sriov":["0000:3b:02.1","0000:3b:02.2","0000:3b:02.3"]}},
            "Checksum":1}"#;
        let a = Allocations::parse(text).unwrap();
        a.check("0000:3b:02.1", Some("uid-vm1")).unwrap();
        let e = a.check("0000:3b:02.1", Some("uid-attacker")).unwrap_err();
        assert!(e.contains("uid-vm1"), "{e}");
        assert!(a.check("0000:3b:02.1", None).is_err());
        assert!(a.check("0000:3b:02.2", Some("uid-vm1")).is_err());
        a.check("0000:3b:02.3", Some("uid-old")).unwrap();
        a.check("0000:5e:00.7", Some("uid-any")).unwrap();

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet_internal_checkpoint");
        device_of_pod(&path, "0000:3b:02.1", Some("uid-attacker")).unwrap();
        std::fs::write(&path, text).unwrap();
        let e = device_of_pod(&path, "0000:3b:02.1", Some("uid-attacker")).unwrap_err();
        assert!(matches!(e, Refusal::NotThePodsDevice { .. }), "{e}");
        std::fs::write(&path, "{").unwrap();
        assert!(matches!(
            device_of_pod(&path, "0000:3b:02.1", Some("uid-vm1")),
            Err(Refusal::Checkpoint { .. })
        ));
    }
}
