//! Pod vs. VM detection and the VM MAC resolution chain.
//!
//! Everything here is pure: it takes labels, owner names and VMI documents
//! that the caller fetched (from the API server or the embedded store) and
//! decides. Nothing here talks to Kubernetes.
//!
//! # Which pods are VMs
//! A pod is a KubeVirt VM pod when it carries the label `vm.kubevirt.io/name`
//! (what the OVN-Kubernetes design names) or `kubevirt.io=virt-launcher`
//! (what KubeVirt's `kubevirt.IsPodOwnedByVirtualMachine` helper checks and
//! what virt-controller sets on every launcher pod). Every other pod is a
//! plain pod.
//!
//! # Which VMI a VM pod belongs to
//! The VMI name is taken, in this order, from
//! 1. the label `vm.kubevirt.io/name` (virt-controller sets it to the VMI name),
//! 2. the pod's controller owner reference of kind `VirtualMachineInstance`
//!    (only [`classify_pod`] sees owner references),
//! 3. the label `kubevirt.io/domain` (conventionally the VMI name; templates
//!    carry it and KubeVirt copies VMI labels to the launcher pod).
//!
//! A launcher pod that carries none of them still classifies as a VM (so it
//! never takes the plain-pod path that would configure the address and start
//! KubeVirt's in-pod DHCP server) with an empty `vmi_name`; no VMI is looked
//! up for it and its MAC falls back to the pod interface MAC.
//!
//! # Live-migration targets
//! KubeVirt's migration controller creates the target launcher pod with the
//! label `kubevirt.io/migrationJobUID` (the UID of the
//! `VirtualMachineInstanceMigration`) and the annotation
//! `kubevirt.io/migrationJobName` (its name); no other launcher pod carries
//! them. The pod the VM runs in (the source) is named by the migration's
//! `status.migrationState.sourcePod`, which the controller sets while the
//! migration is pending, before it creates the target pod. The VMI's own
//! `status.migrationState` (`migrationUid`, `sourcePod`, `targetPod`) is
//! written only at hand-off, once the target pod is ready, so at the
//! target's CNI ADD it still describes the previous migration, if any: the
//! VM then runs in that migration's target pod when it completed, in its
//! source pod when it failed ([`migration_source_pod`]).
//!
//! On a target the VM keeps the address the source pod reported: the
//! one-shot DORA asks for the first IPv4 address of the source pod's
//! `k8s.ovn.org/pod-networks` entry for the same network (INIT-REBOOT), else
//! for the address the VMI status reports (a guest agent's), else for none
//! ([`vm_identity`]). The MAC chain gains one step there: the source
//! entry's `mac_address` comes after the VMI's spec and status MACs, before
//! the target pod interface's own MAC (the guest's NIC keeps its MAC across
//! the migration; the target pod's interface is new).
//!
//! One thing: the identity of a workload (pod or VM, and the VM's MAC and
//! previous address), pure functions and their tests.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Label virt-controller sets to the VMI name on every launcher pod.
pub const LABEL_VM_NAME: &str = "vm.kubevirt.io/name";
/// KubeVirt's application label (`kubevirtv1.AppLabel`).
pub const LABEL_KUBEVIRT_APP: &str = "kubevirt.io";
/// Value of [`LABEL_KUBEVIRT_APP`] on launcher pods.
pub const VIRT_LAUNCHER: &str = "virt-launcher";
/// Conventional label holding the VMI (domain) name.
pub const LABEL_DOMAIN: &str = "kubevirt.io/domain";
/// Label virt-controller sets on a migration target launcher pod: the UID of
/// the `VirtualMachineInstanceMigration` (`kubevirtv1.MigrationJobLabel`).
pub const LABEL_MIGRATION_JOB_UID: &str = "kubevirt.io/migrationJobUID";
/// Annotation virt-controller sets on a migration target launcher pod: the
/// migration's name (`kubevirtv1.MigrationJobNameAnnotation`).
pub const ANNOTATION_MIGRATION_JOB_NAME: &str = "kubevirt.io/migrationJobName";

/// A launcher pod that is the target of a live migration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationTarget {
    /// UID of the `VirtualMachineInstanceMigration`.
    pub migration_uid: String,
    /// Its name, when the pod carries it.
    pub migration_name: Option<String>,
}

/// Whether a pod is a migration target, from KubeVirt's own markers (the
/// `kubevirt.io/migrationJobUID` label, with the name annotation beside it).
pub fn migration_target(
    labels: &BTreeMap<String, String>,
    migration_job_name: Option<&str>,
) -> Option<MigrationTarget> {
    let uid = labels
        .get(LABEL_MIGRATION_JOB_UID)
        .filter(|u| !u.trim().is_empty())?;
    Some(MigrationTarget {
        migration_uid: uid.clone(),
        migration_name: migration_job_name
            .filter(|n| !n.trim().is_empty())
            .map(str::to_owned),
    })
}

/// What the agent needs from a `VirtualMachineInstanceMigration`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MigrationInfo {
    /// `metadata.uid`.
    pub uid: Option<String>,
    /// `status.migrationState.sourcePod`.
    pub source_pod: Option<String>,
    /// `spec.vmiName`: the VMI it migrates.
    #[serde(default)]
    pub vmi_name: Option<String>,
    /// `status.migrationState.targetPod`: the target launcher pod, once
    /// the controller has created it.
    #[serde(default)]
    pub target_pod: Option<String>,
}

impl MigrationInfo {
    /// Extract the fields from a `kubevirt.io/v1`
    /// `VirtualMachineInstanceMigration` document.
    pub fn from_json(doc: &Json) -> Result<MigrationInfo, VmiParseError> {
        let empty = serde_json::Map::new();
        let root = obj(doc, "$")?.unwrap_or(&empty);
        let meta = obj(root.get("metadata").unwrap_or(&Json::Null), "metadata")?.unwrap_or(&empty);
        let status = obj(root.get("status").unwrap_or(&Json::Null), "status")?.unwrap_or(&empty);
        let state = obj(
            status.get("migrationState").unwrap_or(&Json::Null),
            "status.migrationState",
        )?
        .unwrap_or(&empty);
        let spec = obj(root.get("spec").unwrap_or(&Json::Null), "spec")?.unwrap_or(&empty);
        Ok(MigrationInfo {
            uid: string(meta.get("uid"), "metadata.uid")?,
            source_pod: string(state.get("sourcePod"), "status.migrationState.sourcePod")?
                .filter(|p| !p.is_empty()),
            vmi_name: string(spec.get("vmiName"), "spec.vmiName")?.filter(|p| !p.is_empty()),
            target_pod: string(state.get("targetPod"), "status.migrationState.targetPod")?
                .filter(|p| !p.is_empty()),
        })
    }
}

/// A VMI's `status.migrationState`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct VmiMigrationState {
    /// `migrationUid`.
    pub migration_uid: Option<String>,
    /// `sourcePod`.
    pub source_pod: Option<String>,
    /// `targetPod`.
    pub target_pod: Option<String>,
    /// `completed`.
    pub completed: bool,
    /// `failed`.
    pub failed: bool,
}

/// Where the name of a migration's source pod came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourcePodFrom {
    /// The migration's `status.migrationState.sourcePod`.
    Migration,
    /// The VMI's `status.migrationState` for this migration (after hand-off).
    VmiMigrationState,
    /// The VMI's `status.migrationState` of the previous migration: the pod
    /// the VM has run in since.
    PreviousMigration,
}

/// The pod the VM runs in while `target` is prepared (module docs): the
/// migration's `sourcePod` when the migration read is this one, else the
/// VMI's `migrationState` when it is this migration's, else the pod the
/// previous, finished migration left the VM in. Never `own_pod`.
pub fn migration_source_pod(
    target: &MigrationTarget,
    own_pod: &str,
    migration: Option<&MigrationInfo>,
    vmi_state: Option<&VmiMigrationState>,
) -> Option<(String, SourcePodFrom)> {
    let usable = |p: &Option<String>| p.clone().filter(|p| !p.is_empty() && p != own_pod);
    if let Some(m) = migration.filter(|m| m.uid.as_deref() == Some(target.migration_uid.as_str()))
        && let Some(p) = usable(&m.source_pod)
    {
        return Some((p, SourcePodFrom::Migration));
    }
    let state = vmi_state?;
    if state.migration_uid.as_deref() == Some(target.migration_uid.as_str()) {
        return usable(&state.source_pod).map(|p| (p, SourcePodFrom::VmiMigrationState));
    }
    let now_in = match (state.completed, state.failed) {
        (_, true) => &state.source_pod,
        (true, false) => &state.target_pod,
        (false, false) => return None,
    };
    usable(now_in).map(|p| (p, SourcePodFrom::PreviousMigration))
}

impl MigrationInfo {
    /// Whether this migration names pod `pod` of VMI `vmi` as its target:
    /// it migrates `vmi` (when it says), and its target pod, once named,
    /// is `pod`. A pod that only carries a migration's label is no target
    /// of it.
    pub fn names_target(&self, pod: &str, vmi: &str) -> bool {
        self.vmi_name.as_deref().is_none_or(|v| v == vmi)
            && self.target_pod.as_deref().is_none_or(|t| t == pod)
    }
}

/// What the source pod of a migration reported for this network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceReport {
    /// The source pod's name.
    pub pod: String,
    /// The entry's `mac_address`, when it is a MAC.
    pub mac: Option<MacAddr>,
    /// The first IPv4 address of the entry's `ip_addresses`.
    pub address: Option<Ipv4Addr>,
    /// That address's prefix length, when the entry gives one.
    #[serde(default)]
    pub prefix_len: Option<u8>,
    /// The first IPv4 address of the entry's `gateway_ips`.
    #[serde(default)]
    pub gateway: Option<Ipv4Addr>,
}

impl SourceReport {
    /// From the source pod's `pod-networks` entry (`mac_address`,
    /// `ip_addresses` in CIDR form, `gateway_ips`); unparsable fields are
    /// left out.
    pub fn from_entry(
        pod: &str,
        mac_address: &str,
        ip_addresses: &[String],
        gateway_ips: &[String],
    ) -> SourceReport {
        let first = ip_addresses
            .iter()
            .find(|a| matches!(ip_lenient(a), Some(IpAddr::V4(_))));
        let v4 = |a: &String| match ip_lenient(a) {
            Some(IpAddr::V4(v4)) => Some(v4),
            _ => None,
        };
        SourceReport {
            pod: pod.to_owned(),
            mac: mac_address.parse().ok(),
            address: first.and_then(v4),
            prefix_len: first
                .and_then(|a| a.split_once('/'))
                .and_then(|(_, len)| len.parse().ok())
                .filter(|len| *len <= 32),
            gateway: gateway_ips.iter().find_map(v4),
        }
    }
}

/// What kind of workload a pod is, which decides the DHCP behaviour.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Workload {
    /// A plain pod: full DORA and lease maintenance in the pod netns, for the
    /// pod's life.
    Pod,
    /// A KubeVirt virt-launcher pod: one-shot discovery; the address is
    /// reported, never configured on the pod interface, never renewed.
    Vm {
        /// Name of the VMI in the pod's namespace; empty when no source names
        /// it (see the module docs).
        vmi_name: String,
    },
}

impl Workload {
    /// Whether this is a VM pod.
    pub fn is_vm(&self) -> bool {
        matches!(self, Workload::Vm { .. })
    }
}

/// Classify a pod from its labels alone (module docs: sources 1 and 3).
pub fn classify(labels: &BTreeMap<String, String>) -> Workload {
    classify_pod(labels, None)
}

/// Classify a pod from its labels and the name of its controlling
/// `VirtualMachineInstance` owner reference, if it has one.
pub fn classify_pod(labels: &BTreeMap<String, String>, owner_vmi: Option<&str>) -> Workload {
    let named = labels.get(LABEL_VM_NAME).filter(|v| !v.is_empty());
    let launcher = labels.get(LABEL_KUBEVIRT_APP).map(String::as_str) == Some(VIRT_LAUNCHER);
    if named.is_none() && !launcher {
        return Workload::Pod;
    }
    let vmi_name = named
        .map(String::as_str)
        .or(owner_vmi.filter(|o| !o.is_empty()))
        .or(labels
            .get(LABEL_DOMAIN)
            .map(String::as_str)
            .filter(|d| !d.is_empty()))
        .unwrap_or_default()
        .to_owned();
    Workload::Vm { vmi_name }
}

/// An Ethernet MAC address.
///
/// Parses `aa:bb:cc:dd:ee:ff` and `aa-bb-cc-dd-ee-ff` in either case;
/// formats lowercase with colons (the form Kubernetes annotations use).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The raw octets.
    pub fn octets(self) -> [u8; 6] {
        self.0
    }
}

impl From<[u8; 6]> for MacAddr {
    fn from(octets: [u8; 6]) -> Self {
        MacAddr(octets)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            o[0], o[1], o[2], o[3], o[4], o[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MacAddr({self})")
    }
}

/// A string that is not a MAC address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid MAC address {input:?}: expected six hex octets separated by ':' or '-'")]
pub struct MacParseError {
    /// The rejected input.
    pub input: String,
}

impl FromStr for MacAddr {
    type Err = MacParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || MacParseError {
            input: s.to_owned(),
        };
        let sep = if s.contains('-') { '-' } else { ':' };
        let mut out = [0u8; 6];
        let mut parts = s.split(sep);
        for slot in &mut out {
            let part = parts.next().ok_or_else(err)?;
            if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(err());
            }
            *slot = u8::from_str_radix(part, 16).map_err(|_| err())?;
        }
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(MacAddr(out))
    }
}

impl Serialize for MacAddr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Where the MAC used for a VM's one-shot DORA came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MacSource {
    /// `spec.domain.devices.interfaces[].macAddress` of the VMI (user-set, stable).
    VmiSpec,
    /// `status.interfaces[].mac` of the VMI (what the guest used before a migration).
    VmiStatus,
    /// `mac_address` of the migration source pod's `pod-networks` entry.
    MigrationSource,
    /// The pod interface's own MAC (first boot, nothing else known).
    PodInterface,
}

impl fmt::Display for MacSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MacSource::VmiSpec => "vmi-spec",
            MacSource::VmiStatus => "vmi-status",
            MacSource::MigrationSource => "migration-source",
            MacSource::PodInterface => "pod-interface",
        })
    }
}

/// KubeVirt's MAC resolution chain (KubeVirt PR #16697): VMI spec MAC, else
/// VMI status MAC, else the pod interface MAC.
pub fn resolve_vm_mac(
    spec: Option<MacAddr>,
    status: Option<MacAddr>,
    pod_iface: MacAddr,
) -> (MacAddr, MacSource) {
    match (spec, status) {
        (Some(mac), _) => (mac, MacSource::VmiSpec),
        (None, Some(mac)) => (mac, MacSource::VmiStatus),
        (None, None) => (pod_iface, MacSource::PodInterface),
    }
}

/// One entry of a VMI's `spec.networks`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmiNetwork {
    /// `name`, which ties the network to a `spec.domain.devices.interfaces[].name`.
    pub name: String,
    /// `multus.networkName`: a NAD as `name` (VMI namespace) or `namespace/name`.
    pub multus_network_name: Option<String>,
}

/// One entry of a VMI's `spec.domain.devices.interfaces`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmiSpecInterface {
    /// Interface name (matches a network name).
    pub name: String,
    /// `macAddress`, when the user pinned one.
    pub mac: Option<MacAddr>,
}

/// One entry of a VMI's `status.interfaces`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmiStatusInterface {
    /// `name`: the spec interface it reports on (absent for guest-only NICs).
    pub name: Option<String>,
    /// `mac` as reported by the guest agent / virt-handler.
    pub mac: Option<MacAddr>,
    /// `ipAddress` and `ipAddresses`, deduplicated, in the order reported.
    pub ips: Vec<IpAddr>,
}

/// What the agent needs from a `VirtualMachineInstance`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct VmiInfo {
    /// `metadata.uid`: what a launcher pod's controller owner reference
    /// must name.
    #[serde(default)]
    pub uid: Option<String>,
    /// `status.migrationState`, when set.
    #[serde(default)]
    pub migration_state: Option<VmiMigrationState>,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `spec.networks`.
    pub networks: Vec<VmiNetwork>,
    /// `spec.domain.devices.interfaces`.
    pub spec_interfaces: Vec<VmiSpecInterface>,
    /// `status.interfaces`.
    pub status_interfaces: Vec<VmiStatusInterface>,
}

/// A VMI document that does not have the shape `kubevirt.io/v1` defines.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VmiParseError {
    /// A field has the wrong JSON type.
    #[error("VMI field {field} is not a {expected}")]
    WrongType {
        /// JSON path of the field.
        field: String,
        /// The expected JSON type.
        expected: &'static str,
    },
    /// A MAC field does not hold a MAC address.
    #[error("VMI field {field}: {source}")]
    BadMac {
        /// JSON path of the field.
        field: String,
        /// What was wrong with it.
        #[source]
        source: MacParseError,
    },
}

type Json = serde_json::Value;

fn obj<'a>(
    v: &'a Json,
    field: &str,
) -> Result<Option<&'a serde_json::Map<String, Json>>, VmiParseError> {
    match v {
        Json::Null => Ok(None),
        Json::Object(m) => Ok(Some(m)),
        _ => Err(VmiParseError::WrongType {
            field: field.to_owned(),
            expected: "object",
        }),
    }
}

fn arr<'a>(v: Option<&'a Json>, field: &str) -> Result<&'a [Json], VmiParseError> {
    match v {
        None | Some(Json::Null) => Ok(&[]),
        Some(Json::Array(a)) => Ok(a),
        Some(_) => Err(VmiParseError::WrongType {
            field: field.to_owned(),
            expected: "array",
        }),
    }
}

fn string(v: Option<&Json>, field: &str) -> Result<Option<String>, VmiParseError> {
    match v {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(VmiParseError::WrongType {
            field: field.to_owned(),
            expected: "string",
        }),
    }
}

fn mac(v: Option<&Json>, field: &str) -> Result<Option<MacAddr>, VmiParseError> {
    match string(v, field)? {
        None => Ok(None),
        Some(s) if s.is_empty() => Ok(None),
        Some(s) => s.parse().map(Some).map_err(|source| VmiParseError::BadMac {
            field: field.to_owned(),
            source,
        }),
    }
}

/// Parses an IP that may carry a prefix length (`10.0.0.5/24`); anything
/// else that is not an address (KubeVirt reports what the guest agent says)
/// is skipped rather than failing the whole document.
fn ip_lenient(s: &str) -> Option<IpAddr> {
    s.split('/').next().and_then(|a| a.parse().ok())
}

/// A VMI's `status.migrationState`, when set.
fn migration_state(v: Option<&Json>) -> Result<Option<VmiMigrationState>, VmiParseError> {
    let Some(m) = v
        .map(|v| obj(v, "status.migrationState"))
        .transpose()?
        .flatten()
    else {
        return Ok(None);
    };
    let flag = |k: &str| match m.get(k) {
        None | Some(Json::Null) => Ok(false),
        Some(Json::Bool(b)) => Ok(*b),
        Some(_) => Err(VmiParseError::WrongType {
            field: format!("status.migrationState.{k}"),
            expected: "boolean",
        }),
    };
    let text = |k: &str| {
        string(m.get(k), &format!("status.migrationState.{k}")).map(|v| v.filter(|v| !v.is_empty()))
    };
    Ok(Some(VmiMigrationState {
        migration_uid: text("migrationUid")?,
        source_pod: text("sourcePod")?,
        target_pod: text("targetPod")?,
        completed: flag("completed")?,
        failed: flag("failed")?,
    }))
}

impl VmiInfo {
    /// Extract the fields the agent uses from a `kubevirt.io/v1`
    /// `VirtualMachineInstance` JSON document (the whole object, or the
    /// `data` of a `DynamicObject` with `metadata` supplied separately).
    pub fn from_json(namespace: &str, name: &str, doc: &Json) -> Result<VmiInfo, VmiParseError> {
        let empty = serde_json::Map::new();
        let root = obj(doc, "$")?.unwrap_or(&empty);
        let spec = obj(root.get("spec").unwrap_or(&Json::Null), "spec")?.unwrap_or(&empty);
        let status = obj(root.get("status").unwrap_or(&Json::Null), "status")?.unwrap_or(&empty);

        let mut networks = Vec::new();
        for (i, n) in arr(spec.get("networks"), "spec.networks")?
            .iter()
            .enumerate()
        {
            let field = format!("spec.networks[{i}]");
            let Some(n) = obj(n, &field)? else { continue };
            let Some(name) = string(n.get("name"), &format!("{field}.name"))? else {
                continue;
            };
            let multus = match n.get("multus") {
                Some(m) => obj(m, &format!("{field}.multus"))?,
                None => None,
            };
            let multus_network_name = match multus {
                Some(m) => string(m.get("networkName"), &format!("{field}.multus.networkName"))?,
                None => None,
            };
            networks.push(VmiNetwork {
                name,
                multus_network_name,
            });
        }

        let domain =
            obj(spec.get("domain").unwrap_or(&Json::Null), "spec.domain")?.unwrap_or(&empty);
        let devices = obj(
            domain.get("devices").unwrap_or(&Json::Null),
            "spec.domain.devices",
        )?
        .unwrap_or(&empty);
        let mut spec_interfaces = Vec::new();
        for (i, it) in arr(devices.get("interfaces"), "spec.domain.devices.interfaces")?
            .iter()
            .enumerate()
        {
            let field = format!("spec.domain.devices.interfaces[{i}]");
            let Some(it) = obj(it, &field)? else { continue };
            let Some(name) = string(it.get("name"), &format!("{field}.name"))? else {
                continue;
            };
            let mac = mac(it.get("macAddress"), &format!("{field}.macAddress"))?;
            spec_interfaces.push(VmiSpecInterface { name, mac });
        }

        let mut status_interfaces = Vec::new();
        for (i, it) in arr(status.get("interfaces"), "status.interfaces")?
            .iter()
            .enumerate()
        {
            let field = format!("status.interfaces[{i}]");
            let Some(it) = obj(it, &field)? else { continue };
            let name = string(it.get("name"), &format!("{field}.name"))?;
            let mac = mac(it.get("mac"), &format!("{field}.mac"))?;
            let mut ips = Vec::new();
            if let Some(ip) = string(it.get("ipAddress"), &format!("{field}.ipAddress"))?
                .as_deref()
                .and_then(ip_lenient)
            {
                ips.push(ip);
            }
            for (j, ip) in arr(it.get("ipAddresses"), &format!("{field}.ipAddresses"))?
                .iter()
                .enumerate()
            {
                let ip = string(Some(ip), &format!("{field}.ipAddresses[{j}]"))?;
                if let Some(ip) = ip.as_deref().and_then(ip_lenient)
                    && !ips.contains(&ip)
                {
                    ips.push(ip);
                }
            }
            status_interfaces.push(VmiStatusInterface { name, mac, ips });
        }

        let migration_state = migration_state(status.get("migrationState"))?;

        let uid = match root.get("metadata") {
            Some(m) => obj(m, "metadata")?.and_then(|m| m.get("uid").and_then(Json::as_str)),
            None => None,
        };
        Ok(VmiInfo {
            uid: uid.map(str::to_owned),
            migration_state,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            networks,
            spec_interfaces,
            status_interfaces,
        })
    }

    /// Find the VMI interface attached to the network whose annotation key is
    /// `network_key` (`"<nad-namespace>/<nad-name>"`).
    ///
    /// A VMI network matches when its `multus.networkName` equals the key, or
    /// is a bare NAD name that, qualified with the VMI's namespace, equals it.
    /// The match carries the spec MAC, the status MAC and the first IPv4
    /// address the status reports for that interface.
    pub fn interface_for_network(&self, network_key: &str) -> Option<VmiInterfaceMatch> {
        let network = self.networks.iter().find(|n| {
            n.multus_network_name.as_deref().is_some_and(|nn| {
                nn == network_key
                    || (!nn.contains('/')
                        && network_key
                            .split_once('/')
                            .is_some_and(|(ns, name)| ns == self.namespace && name == nn))
            })
        })?;
        let spec_mac = self
            .spec_interfaces
            .iter()
            .find(|i| i.name == network.name)
            .and_then(|i| i.mac);
        let status = self
            .status_interfaces
            .iter()
            .find(|s| s.name.as_deref() == Some(network.name.as_str()));
        let status_mac = status.and_then(|s| s.mac);
        let status_ipv4 = status.and_then(|s| {
            s.ips.iter().find_map(|ip| match ip {
                IpAddr::V4(v4) => Some(*v4),
                IpAddr::V6(_) => None,
            })
        });
        Some(VmiInterfaceMatch {
            name: network.name.clone(),
            spec_mac,
            status_mac,
            status_ipv4,
        })
    }
}

/// The VMI interface attached to one network, as [`VmiInfo::interface_for_network`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmiInterfaceMatch {
    /// Interface (= VMI network) name.
    pub name: String,
    /// `spec.domain.devices.interfaces[].macAddress`.
    pub spec_mac: Option<MacAddr>,
    /// `status.interfaces[].mac`.
    pub status_mac: Option<MacAddr>,
    /// First IPv4 address in `status.interfaces[]`: the one-shot DORA asks
    /// for it (INIT-REBOOT), so a VM on a live-migration target keeps its
    /// address.
    pub status_ipv4: Option<Ipv4Addr>,
}

impl VmiInterfaceMatch {
    /// [`resolve_vm_mac`] applied to this interface.
    pub fn resolve_mac(&self, pod_iface: MacAddr) -> (MacAddr, MacSource) {
        resolve_vm_mac(self.spec_mac, self.status_mac, pod_iface)
    }
}

/// Where the address a VM's one-shot DORA asks for came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AddressSource {
    /// The migration source pod's `pod-networks` entry (what was reported).
    MigrationSource,
    /// The VMI's `status.interfaces[]` (a guest agent's report).
    VmiStatus,
}

/// The identity of a VM's one-shot DORA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmIdentity {
    /// The MAC (and so the client identifier) to ask with.
    pub mac: MacAddr,
    /// Where it came from.
    pub mac_source: MacSource,
    /// The address to ask for (INIT-REBOOT), and where it came from.
    pub requested: Option<(Ipv4Addr, AddressSource)>,
}

/// MAC, its source and the address to request for a VM's one-shot DORA,
/// given the (optional) VMI, the pod interface MAC and, on a migration
/// target, what the source pod reported (module docs).
///
/// Without a VMI, or without an interface on `network_key`, the source
/// report and then the pod interface MAC are used.
pub fn vm_identity(
    vmi: Option<&VmiInfo>,
    network_key: &str,
    pod_iface: MacAddr,
    source: Option<&SourceReport>,
) -> VmIdentity {
    let m = vmi.and_then(|v| v.interface_for_network(network_key));
    let (spec, status) = m
        .as_ref()
        .map_or((None, None), |m| (m.spec_mac, m.status_mac));
    let (mac, mac_source) = match (spec, status, source.and_then(|s| s.mac)) {
        (Some(mac), ..) => (mac, MacSource::VmiSpec),
        (None, Some(mac), _) => (mac, MacSource::VmiStatus),
        (None, None, Some(mac)) => (mac, MacSource::MigrationSource),
        (None, None, None) => (pod_iface, MacSource::PodInterface),
    };
    let requested = source
        .and_then(|s| s.address)
        .map(|a| (a, AddressSource::MigrationSource))
        .or_else(|| {
            m.as_ref()
                .and_then(|m| m.status_ipv4)
                .map(|a| (a, AddressSource::VmiStatus))
        });
    VmIdentity {
        mac,
        mac_source,
        requested,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn m(s: &str) -> MacAddr {
        s.parse().unwrap()
    }

    #[test]
    fn plain_pod_without_kubevirt_labels() {
        assert_eq!(classify(&labels(&[])), Workload::Pod);
        assert_eq!(classify(&labels(&[("app", "web")])), Workload::Pod);
        // The app label with another value is not a launcher.
        assert_eq!(
            classify(&labels(&[("kubevirt.io", "virt-handler")])),
            Workload::Pod
        );
        // The domain label alone does not make a VM pod.
        assert_eq!(
            classify(&labels(&[("kubevirt.io/domain", "vm1")])),
            Workload::Pod
        );
        // An empty name label is no name.
        assert_eq!(
            classify(&labels(&[("vm.kubevirt.io/name", "")])),
            Workload::Pod
        );
    }

    #[test]
    fn vm_name_label_classifies_vm() {
        assert_eq!(
            classify(&labels(&[("vm.kubevirt.io/name", "fedora")])),
            Workload::Vm {
                vmi_name: "fedora".into()
            }
        );
    }

    #[test]
    fn launcher_label_classifies_vm_and_name_sources_in_order() {
        let l = labels(&[
            ("kubevirt.io", "virt-launcher"),
            ("vm.kubevirt.io/name", "by-label"),
            ("kubevirt.io/domain", "by-domain"),
        ]);
        assert_eq!(
            classify_pod(&l, Some("by-owner")),
            Workload::Vm {
                vmi_name: "by-label".into()
            }
        );
        let l = labels(&[
            ("kubevirt.io", "virt-launcher"),
            ("kubevirt.io/domain", "by-domain"),
        ]);
        assert_eq!(
            classify_pod(&l, Some("by-owner")),
            Workload::Vm {
                vmi_name: "by-owner".into()
            }
        );
        assert_eq!(
            classify_pod(&l, None),
            Workload::Vm {
                vmi_name: "by-domain".into()
            }
        );
        let l = labels(&[("kubevirt.io", "virt-launcher")]);
        let w = classify_pod(&l, None);
        assert!(w.is_vm());
        assert_eq!(
            w,
            Workload::Vm {
                vmi_name: String::new()
            }
        );
    }

    #[test]
    fn mac_parse_and_format() {
        let mac = m("02:00:00:00:20:08");
        assert_eq!(mac.0, [2, 0, 0, 0, 0x20, 8]);
        assert_eq!(mac.to_string(), "02:00:00:00:20:08");
        assert_eq!(m("0A-58-0A-DC-02-12").to_string(), "0a:58:0a:dc:02:12");
        assert_eq!(m("AA:bb:CC:dd:EE:ff").to_string(), "aa:bb:cc:dd:ee:ff");
        for bad in [
            "",
            "02:00:00:00:20",
            "02:00:00:00:20:08:09",
            "02:00:00:00:20:8",
            "02:00:00:00:20:0g",
            "02:00-00:00:20:08",
            "0200.0000.2008",
            "+2:00:00:00:20:08",
            "02:00:00:00:20:08:",
        ] {
            let err = bad.parse::<MacAddr>().unwrap_err();
            assert_eq!(err.input, bad);
        }
    }

    #[test]
    fn mac_serde_round_trip() {
        let mac = m("02:00:00:00:20:08");
        let s = serde_json::to_string(&mac).unwrap();
        assert_eq!(s, "\"02:00:00:00:20:08\"");
        assert_eq!(serde_json::from_str::<MacAddr>(&s).unwrap(), mac);
        assert!(serde_json::from_str::<MacAddr>("\"nope\"").is_err());
    }

    #[test]
    fn resolve_every_combination() {
        let spec = m("02:00:00:00:00:01");
        let status = m("02:00:00:00:00:02");
        let pod = m("02:00:00:00:00:03");
        assert_eq!(
            resolve_vm_mac(Some(spec), Some(status), pod),
            (spec, MacSource::VmiSpec)
        );
        assert_eq!(
            resolve_vm_mac(Some(spec), None, pod),
            (spec, MacSource::VmiSpec)
        );
        assert_eq!(
            resolve_vm_mac(None, Some(status), pod),
            (status, MacSource::VmiStatus)
        );
        assert_eq!(
            resolve_vm_mac(None, None, pod),
            (pod, MacSource::PodInterface)
        );
        assert_eq!(MacSource::VmiStatus.to_string(), "vmi-status");
    }

    fn vmi_doc() -> Json {
        json!({
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm1", "namespace": "tenant"},
            "spec": {
                "domain": {"devices": {"interfaces": [
                    {"name": "default", "masquerade": {}},
                    {"name": "dhcp-net", "bridge": {}, "macAddress": "02:00:00:00:20:08"},
                    {"name": "other", "sriov": {}},
                    {"name": "bare", "bridge": {}}
                ]}},
                "networks": [
                    {"name": "default", "pod": {}},
                    {"name": "dhcp-net", "multus": {"networkName": "default/ovn-localnet-dhcp"}},
                    {"name": "other", "multus": {"networkName": "vfio-net"}},
                    {"name": "bare", "multus": {"networkName": "infra/bare-net"}}
                ]
            },
            "status": {"interfaces": [
                {"name": "default", "mac": "0a:58:0a:dc:02:12", "ipAddress": "10.220.2.18"},
                {"name": "dhcp-net", "mac": "02:00:00:00:99:99",
                 "ipAddress": "fd00::5", "ipAddresses": ["fd00::5", "10.1.192.213/24"]},
                {"name": "other", "mac": "02:00:00:00:30:01", "ipAddresses": ["not-an-ip", "192.0.2.9"]},
                {"interfaceName": "guest-only", "mac": "02:00:00:00:40:01"}
            ]}
        })
    }

    #[test]
    fn vmi_from_json_extracts_fields() {
        let vmi = VmiInfo::from_json("tenant", "vm1", &vmi_doc()).unwrap();
        assert_eq!(vmi.networks.len(), 4);
        assert_eq!(vmi.networks[0].multus_network_name, None);
        assert_eq!(vmi.spec_interfaces[1].mac, Some(m("02:00:00:00:20:08")));
        assert_eq!(vmi.spec_interfaces[0].mac, None);
        assert_eq!(vmi.status_interfaces.len(), 4);
        assert_eq!(vmi.status_interfaces[3].name, None);
        assert_eq!(
            vmi.status_interfaces[1].ips,
            vec![
                "fd00::5".parse::<IpAddr>().unwrap(),
                "10.1.192.213".parse::<IpAddr>().unwrap()
            ]
        );
        assert_eq!(
            vmi.status_interfaces[2].ips,
            vec!["192.0.2.9".parse::<IpAddr>().unwrap()]
        );
    }

    #[test]
    fn vmi_from_json_rejects_bad_shapes() {
        let bad_mac = json!({"spec": {"domain": {"devices": {"interfaces": [
            {"name": "x", "macAddress": "zz:00:00:00:00:00"}]}}}});
        let err = VmiInfo::from_json("ns", "v", &bad_mac).unwrap_err();
        assert!(
            matches!(&err, VmiParseError::BadMac { field, .. } if field == "spec.domain.devices.interfaces[0].macAddress"),
            "{err}"
        );
        let wrong = json!({"spec": {"networks": {"name": "x"}}});
        let err = VmiInfo::from_json("ns", "v", &wrong).unwrap_err();
        assert_eq!(
            err,
            VmiParseError::WrongType {
                field: "spec.networks".into(),
                expected: "array"
            }
        );
        // An empty document is a VMI with nothing known.
        let vmi = VmiInfo::from_json("ns", "v", &json!({})).unwrap();
        assert!(vmi.networks.is_empty() && vmi.status_interfaces.is_empty());
    }

    #[test]
    fn interface_match_by_qualified_name() {
        let vmi = VmiInfo::from_json("tenant", "vm1", &vmi_doc()).unwrap();
        let got = vmi
            .interface_for_network("default/ovn-localnet-dhcp")
            .unwrap();
        assert_eq!(got.name, "dhcp-net");
        assert_eq!(got.spec_mac, Some(m("02:00:00:00:20:08")));
        assert_eq!(got.status_mac, Some(m("02:00:00:00:99:99")));
        assert_eq!(got.status_ipv4, Some(Ipv4Addr::new(10, 1, 192, 213)));
        assert_eq!(
            got.resolve_mac(m("02:00:00:00:00:03")),
            (m("02:00:00:00:20:08"), MacSource::VmiSpec)
        );
    }

    #[test]
    fn interface_match_by_bare_name_in_vmi_namespace() {
        let vmi = VmiInfo::from_json("tenant", "vm1", &vmi_doc()).unwrap();
        let got = vmi.interface_for_network("tenant/vfio-net").unwrap();
        assert_eq!(got.name, "other");
        assert_eq!(got.spec_mac, None);
        assert_eq!(got.status_mac, Some(m("02:00:00:00:30:01")));
        assert_eq!(got.status_ipv4, Some(Ipv4Addr::new(192, 0, 2, 9)));
        assert_eq!(
            got.resolve_mac(m("02:00:00:00:00:03")),
            (m("02:00:00:00:30:01"), MacSource::VmiStatus)
        );
        // A bare name only matches in the VMI's own namespace.
        assert!(vmi.interface_for_network("elsewhere/vfio-net").is_none());
    }

    /// The tuple form of [`VmIdentity`], for compact assertions.
    fn ident(
        vmi: Option<&VmiInfo>,
        key: &str,
        pod: MacAddr,
        source: Option<&SourceReport>,
    ) -> (MacAddr, MacSource, Option<(Ipv4Addr, AddressSource)>) {
        let v = vm_identity(vmi, key, pod, source);
        (v.mac, v.mac_source, v.requested)
    }

    #[test]
    fn interface_without_status_uses_pod_mac() {
        let vmi = VmiInfo::from_json("tenant", "vm1", &vmi_doc()).unwrap();
        let got = vmi.interface_for_network("infra/bare-net").unwrap();
        assert_eq!(got.name, "bare");
        assert_eq!(
            (got.spec_mac, got.status_mac, got.status_ipv4),
            (None, None, None)
        );
        let pod = m("02:00:00:00:00:03");
        assert_eq!(
            ident(Some(&vmi), "infra/bare-net", pod, None),
            (pod, MacSource::PodInterface, None)
        );
    }

    #[test]
    fn vm_identity_without_vmi_or_network() {
        let vmi = VmiInfo::from_json("tenant", "vm1", &vmi_doc()).unwrap();
        let pod = m("02:00:00:00:00:03");
        assert_eq!(
            ident(None, "default/ovn-localnet-dhcp", pod, None),
            (pod, MacSource::PodInterface, None)
        );
        assert_eq!(
            ident(Some(&vmi), "tenant/unknown", pod, None),
            (pod, MacSource::PodInterface, None)
        );
        assert_eq!(
            ident(Some(&vmi), "default/ovn-localnet-dhcp", pod, None),
            (
                m("02:00:00:00:20:08"),
                MacSource::VmiSpec,
                Some((Ipv4Addr::new(10, 1, 192, 213), AddressSource::VmiStatus))
            )
        );
    }

    fn report(mac: Option<&str>, address: Option<[u8; 4]>) -> SourceReport {
        SourceReport {
            pod: "virt-launcher-vm1-src".into(),
            mac: mac.map(m),
            address: address.map(Ipv4Addr::from),
            prefix_len: address.map(|_| 24),
            gateway: None,
        }
    }

    #[test]
    fn a_migration_target_asks_for_what_the_source_reported() {
        let vmi = VmiInfo::from_json("tenant", "vm1", &vmi_doc()).unwrap();
        let pod = m("02:00:00:00:00:03");
        let src = report(Some("02:00:00:00:77:77"), Some([192, 0, 2, 50]));
        // The source's address wins over the VMI status address; the spec
        // MAC still comes first.
        assert_eq!(
            ident(Some(&vmi), "default/ovn-localnet-dhcp", pod, Some(&src)),
            (
                m("02:00:00:00:20:08"),
                MacSource::VmiSpec,
                Some((Ipv4Addr::new(192, 0, 2, 50), AddressSource::MigrationSource))
            )
        );
        // Status MAC before the source's MAC.
        assert_eq!(
            ident(Some(&vmi), "tenant/vfio-net", pod, Some(&src)),
            (
                m("02:00:00:00:30:01"),
                MacSource::VmiStatus,
                Some((Ipv4Addr::new(192, 0, 2, 50), AddressSource::MigrationSource))
            )
        );
        // Neither spec nor status MAC: the source's MAC, not the new pod
        // interface's.
        assert_eq!(
            ident(Some(&vmi), "infra/bare-net", pod, Some(&src)),
            (
                m("02:00:00:00:77:77"),
                MacSource::MigrationSource,
                Some((Ipv4Addr::new(192, 0, 2, 50), AddressSource::MigrationSource))
            )
        );
        assert_eq!(
            ident(None, "infra/bare-net", pod, Some(&src)).1,
            MacSource::MigrationSource
        );
        // A source entry without an address: the VMI status address, then none.
        let bare = report(None, None);
        assert_eq!(
            ident(Some(&vmi), "default/ovn-localnet-dhcp", pod, Some(&bare)).2,
            Some((Ipv4Addr::new(10, 1, 192, 213), AddressSource::VmiStatus))
        );
        assert_eq!(
            ident(Some(&vmi), "infra/bare-net", pod, Some(&bare)),
            (pod, MacSource::PodInterface, None)
        );
    }

    #[test]
    fn source_report_from_an_entry() {
        let r = SourceReport::from_entry(
            "p",
            "02:00:00:00:20:08",
            &["fd00::5/64".into(), "10.1.192.213/24".into()],
            &["fd00::1".into(), "10.1.192.1".into()],
        );
        assert_eq!(r.mac, Some(m("02:00:00:00:20:08")));
        assert_eq!(r.address, Some(Ipv4Addr::new(10, 1, 192, 213)));
        assert_eq!(r.prefix_len, Some(24));
        assert_eq!(r.gateway, Some(Ipv4Addr::new(10, 1, 192, 1)));
        let r = SourceReport::from_entry("p", "", &["garbage".into()], &[]);
        assert_eq!(
            (r.mac, r.address, r.prefix_len, r.gateway),
            (None, None, None, None)
        );
        let r = SourceReport::from_entry("p", "", &["192.0.2.5/99".into()], &[]);
        assert_eq!(
            (r.address, r.prefix_len),
            (Some(Ipv4Addr::new(192, 0, 2, 5)), None)
        );
    }

    #[test]
    fn migration_targets_are_recognised_by_kubevirts_label() {
        let l = labels(&[
            ("kubevirt.io", "virt-launcher"),
            ("kubevirt.io/migrationJobUID", "mig-uid"),
        ]);
        assert_eq!(
            migration_target(&l, Some("mig1")),
            Some(MigrationTarget {
                migration_uid: "mig-uid".into(),
                migration_name: Some("mig1".into())
            })
        );
        assert_eq!(
            migration_target(&l, Some("")).and_then(|t| t.migration_name),
            None
        );
        // The name annotation alone, or an empty label, is no target.
        let plain = labels(&[("kubevirt.io", "virt-launcher")]);
        assert_eq!(migration_target(&plain, Some("mig1")), None);
        let empty = labels(&[("kubevirt.io/migrationJobUID", " ")]);
        assert_eq!(migration_target(&empty, None), None);
    }

    fn state(uid: &str, src: &str, dst: &str, completed: bool, failed: bool) -> VmiMigrationState {
        VmiMigrationState {
            migration_uid: Some(uid.into()),
            source_pod: Some(src.into()).filter(|s: &String| !s.is_empty()),
            target_pod: Some(dst.into()).filter(|s: &String| !s.is_empty()),
            completed,
            failed,
        }
    }

    #[test]
    fn the_source_pod_of_a_migration() {
        let t = MigrationTarget {
            migration_uid: "m2".into(),
            migration_name: Some("mig2".into()),
        };
        let me = "launcher-c";
        let mig = |uid: &str, src: Option<&str>| MigrationInfo {
            uid: Some(uid.into()),
            source_pod: src.map(str::to_owned),
            ..MigrationInfo::default()
        };
        // The migration's own status names it.
        assert_eq!(
            migration_source_pod(&t, me, Some(&mig("m2", Some("launcher-b"))), None),
            Some(("launcher-b".into(), SourcePodFrom::Migration))
        );
        // Another migration's object (a reused name) is ignored.
        assert_eq!(
            migration_source_pod(&t, me, Some(&mig("m1", Some("launcher-a"))), None),
            None
        );
        // After hand-off, the VMI's state for this migration.
        let ours = state("m2", "launcher-b", me, false, false);
        assert_eq!(
            migration_source_pod(&t, me, Some(&mig("m2", None)), Some(&ours)),
            Some(("launcher-b".into(), SourcePodFrom::VmiMigrationState))
        );
        // The previous migration completed: the VM runs in its target pod.
        let done = state("m1", "launcher-a", "launcher-b", true, false);
        assert_eq!(
            migration_source_pod(&t, me, None, Some(&done)),
            Some(("launcher-b".into(), SourcePodFrom::PreviousMigration))
        );
        // It failed: the VM stayed in its source pod.
        let failed = state("m1", "launcher-a", "launcher-x", true, true);
        assert_eq!(
            migration_source_pod(&t, me, None, Some(&failed)),
            Some(("launcher-a".into(), SourcePodFrom::PreviousMigration))
        );
        // Unfinished, or naming ourselves: unknown.
        let running = state("m1", "launcher-a", "launcher-b", false, false);
        assert_eq!(migration_source_pod(&t, me, None, Some(&running)), None);
        let odd = state("m1", "launcher-a", me, true, false);
        assert_eq!(migration_source_pod(&t, me, None, Some(&odd)), None);
        assert_eq!(migration_source_pod(&t, me, None, None), None);
    }

    #[test]
    fn migration_documents_parse() {
        let vmim = json!({"metadata": {"name": "mig2", "uid": "m2"},
            "status": {"phase": "Scheduling", "migrationState": {"sourcePod": "launcher-b"}}});
        assert_eq!(
            MigrationInfo::from_json(&vmim).unwrap(),
            MigrationInfo {
                uid: Some("m2".into()),
                source_pod: Some("launcher-b".into()),
                ..MigrationInfo::default()
            }
        );
        assert_eq!(
            MigrationInfo::from_json(&json!({"metadata": {"uid": "m2"}})).unwrap(),
            MigrationInfo {
                uid: Some("m2".into()),
                ..MigrationInfo::default()
            }
        );
        assert!(MigrationInfo::from_json(&json!({"status": {"migrationState": []}})).is_err());
        let mut doc = vmi_doc();
        doc["status"]["migrationState"] = json!({"migrationUid": "m1", "sourcePod": "a",
            "targetPod": "b", "completed": true, "targetNode": "n2"});
        let vmi = VmiInfo::from_json("tenant", "vm1", &doc).unwrap();
        assert_eq!(
            vmi.migration_state,
            Some(state("m1", "a", "b", true, false))
        );
        doc["status"]["migrationState"]["failed"] = json!("yes");
        let err = VmiInfo::from_json("tenant", "vm1", &doc).unwrap_err();
        assert_eq!(
            err,
            VmiParseError::WrongType {
                field: "status.migrationState.failed".into(),
                expected: "boolean"
            }
        );
        assert_eq!(
            VmiInfo::from_json("tenant", "vm1", &vmi_doc())
                .unwrap()
                .migration_state,
            None
        );
    }

    /// A pod that carries a migration's label is its target only when the
    /// migration object agrees: same VMI, and (once named) the same pod.
    #[test]
    fn a_migration_names_its_target() {
        let doc = serde_json::json!({
            "metadata": {"uid": "m-1"},
            "spec": {"vmiName": "vm1"},
            "status": {"migrationState": {"sourcePod": "launcher-a", "targetPod": "launcher-b"}}
        });
        let m = MigrationInfo::from_json(&doc).unwrap();
        assert_eq!(m.vmi_name.as_deref(), Some("vm1"));
        assert!(m.names_target("launcher-b", "vm1"));
        assert!(!m.names_target("impostor", "vm1"), "another pod");
        assert!(!m.names_target("launcher-b", "vm2"), "another VMI");
        // Before the controller names its target pod, the VMI still has to match.
        let pending = MigrationInfo {
            target_pod: None,
            ..m
        };
        assert!(pending.names_target("launcher-b", "vm1"));
        assert!(!pending.names_target("launcher-b", "vm2"));
    }
}
