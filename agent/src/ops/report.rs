//! What follows a bound lease on every ADD path (a pod, a VM on its pod
//! netdev, a VM through the VFIO handoff), written once: report the address
//! in the pod's `pod-networks` entry, wait for the lease's record to be on
//! disk, and undo both when either fails — all within the one deadline an
//! ADD has ([`Deadline`]), which bounds every Kubernetes call an ADD makes
//! — and the CNI result the ADD answers.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use tracing::warn;
use xdhcp_engine::Lease;

use crate::cni::config::NetworkConfig;
use crate::cni::types::{CniResult, DnsConfig, IpConfig, Ipv4Cidr, RouteConfig};
use crate::kube::{PodApiError, PodNetworkEntry, PodStore, WriteGuard};
use crate::lease::apply;
use crate::lease::persist::{Durable, LeaseRecord, PodRef, WorkloadKind};
use crate::lease::registry::Handle;
use crate::metrics::{AddPhase, Metrics};
use crate::ops::context::Agent;
use crate::ops::error::{Error, LeaseFate};
use crate::rpc::CniRequest;
use crate::sys::sync::lock;
use crate::workload::MacAddr;

/// How long ADD waits for the first lease record to reach the disk; an ADD
/// whose record is not durable by then fails (and gives the lease back).
const PERSIST_WAIT: Duration = Duration::from_secs(10);

/// The one deadline of an ADD (`add.rs` fixes it): just inside the
/// plugin's wait, so the plugin always hears the outcome and the runtime
/// never sees a timeout while the agent goes on to finish (or undo) the
/// ADD. Every Kubernetes call an ADD makes, on every path, and its wait for
/// the lease record end by then.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    at: tokio::time::Instant,
    /// The whole budget, for errors.
    budget: Duration,
}

impl Deadline {
    /// A deadline `budget` from now.
    pub(crate) fn after(budget: Duration) -> Self {
        Self {
            at: tokio::time::Instant::now() + budget,
            budget,
        }
    }

    /// What is left of it.
    pub(crate) fn left(self) -> Duration {
        self.at
            .saturating_duration_since(tokio::time::Instant::now())
    }

    /// Run a Kubernetes call `what` until the deadline.
    pub(crate) async fn kube<T>(
        self,
        metrics: &Metrics,
        what: impl FnOnce() -> String,
        call: impl std::future::Future<Output = Result<T, PodApiError>>,
    ) -> Result<T, Error> {
        // Boxed: the API calls' futures are large and ADD's future holds them.
        let Ok(r) = tokio::time::timeout_at(self.at, Box::pin(call)).await else {
            metrics.failure("kube_api");
            return Err(Error::KubeDeadline {
                what: what(),
                deadline: self.budget,
            });
        };
        r.map_err(|e| kube_error(metrics, e))
    }
}

/// A failed Kubernetes call, counted.
pub(crate) fn kube_error(metrics: &Metrics, source: PodApiError) -> Error {
    metrics.failure("kube_api");
    Error::Kube { source }
}

/// Where a pod ADD's time went inside the agent, in µs per step: logged
/// with "ADD done" and observed as `xdhcp_add_phase_seconds`
/// ([`Phases::observe`]; the request read and the answer are the socket's,
/// `daemon/server.rs`).
#[derive(Debug)]
pub(crate) struct Phases {
    started: std::time::Instant,
    last: std::time::Instant,
    /// Lock and pod lookup.
    pub(crate) who: u64,
    /// The trip into the pod namespace (sender, receiver, the removal
    /// watch's socket, the routes to protect; the veth peer's lookup made
    /// ready, asked beside the exchange).
    pub(crate) open: u64,
    /// The DHCP guard's attach: a VM's after the open (it needs the VM's
    /// MAC); a pod's alongside the acquisition, so not part of the sum of
    /// the others, which falls short of the total by any wait for the
    /// guard after the DORA.
    pub(crate) guard: u64,
    /// The whole acquisition: the lease task's start to its first outcome
    /// (the sum of the five below and the task's spawn).
    pub(crate) dora: u64,
    /// Reading the routes to protect, when the open had not.
    pub(crate) protect: u64,
    /// Waiting for one of the network's acquisition slots.
    pub(crate) slot: u64,
    /// The lease task's start to its first DISCOVER on the wire (with
    /// the wait for the host port's qdisc, `Link::hold_first_send`).
    pub(crate) start: u64,
    /// That DISCOVER to the REQUEST for the offer taken.
    pub(crate) offer: u64,
    /// That REQUEST to the ACK.
    pub(crate) ack: u64,
    /// Configuring the address (`"apply": true`).
    pub(crate) apply: u64,
    /// The `pod-networks` entry.
    pub(crate) report: u64,
    /// The waits for the lease record to be on disk: before the address
    /// is configured, and what is left of it before the answer.
    pub(crate) durable: u64,
}

/// µs, saturated.
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Phases {
    pub(crate) fn start() -> Self {
        let now = std::time::Instant::now();
        Self {
            started: now,
            last: now,
            who: 0,
            open: 0,
            guard: 0,
            dora: 0,
            protect: 0,
            slot: 0,
            start: 0,
            offer: 0,
            ack: 0,
            apply: 0,
            report: 0,
            durable: 0,
        }
    }

    /// µs since the previous lap.
    pub(crate) fn lap(&mut self) -> u64 {
        let now = std::time::Instant::now();
        let d = now.duration_since(self.last);
        self.last = now;
        micros(d)
    }

    pub(crate) fn total(&self) -> u64 {
        micros(self.started.elapsed())
    }

    /// The acquisition's own steps.
    pub(crate) fn acquired(&mut self, a: &crate::lease::acquire::Acquired) {
        self.protect = micros(a.protect);
        self.slot = micros(a.slot);
        self.start = micros(a.exchange.start);
        self.offer = micros(a.exchange.offer);
        self.ack = micros(a.exchange.ack);
        self.apply = micros(a.exchange.apply);
        self.durable = micros(a.exchange.durable);
    }

    /// [`Phases::acquired`] for a first IPv6 lease (nothing to protect:
    /// an IPv6 lease adds no route through the interface).
    pub(crate) fn acquired6(&mut self, a: &crate::lease::v6::Acquired6) {
        self.slot = micros(a.slot);
        self.start = micros(a.exchange.start);
        self.offer = micros(a.exchange.offer);
        self.ack = micros(a.exchange.ack);
        self.apply = micros(a.exchange.apply);
        self.durable = micros(a.exchange.durable);
    }

    /// Each step as its phase, in order.
    pub(crate) fn each(&self) -> [(AddPhase, u64); 11] {
        [
            (AddPhase::Lookup, self.who),
            (AddPhase::Open, self.open),
            (AddPhase::Guard, self.guard),
            (AddPhase::Protect, self.protect),
            (AddPhase::Slot, self.slot),
            (AddPhase::Start, self.start),
            (AddPhase::Offer, self.offer),
            (AddPhase::Ack, self.ack),
            (AddPhase::Apply, self.apply),
            (AddPhase::Report, self.report),
            (AddPhase::Persist, self.durable),
        ]
    }

    /// Observe every step in `xdhcp_add_phase_seconds`.
    pub(crate) fn observe(&self, metrics: &Metrics) {
        for (phase, us) in self.each() {
            metrics.add_phase(phase, Duration::from_micros(us));
        }
    }
}

/// Where an ADD reports its address: the pod and its `pod-networks` key
/// (neither, for an ADD that names no pod: nothing is written).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReportTo<'a> {
    pub(crate) pod: Option<&'a PodRef>,
    pub(crate) key: Option<&'a str>,
}

/// A lease an ADD has bound, and whether giving it back releases it.
pub(crate) struct Bound<'a> {
    pub(crate) handle: &'a Handle,
    pub(crate) lease: &'a Lease,
    pub(crate) mac: [u8; 6],
    /// The pod's network namespace: gone by the time of the write means
    /// the ADD is stale.
    pub(crate) netns: Option<&'a std::path::Path>,
    /// Pods' leases are released when given back; VMs' never are.
    pub(crate) release: bool,
}

/// End an ADD's bound lease: RELEASE (pods), forget it, remove its record,
/// and take its address off the pod interface (`apply`).
async fn give_back(agent: &Arc<Agent>, req: &CniRequest, b: &Bound<'_>) {
    agent.leases.abandon(b.handle, b.release).await;
    unapply(req, b.lease, b.release).await;
}

/// Report a bound lease's address (pods and VMs alike) and wait for its
/// record to be on disk, within the ADD's deadline: the CNI result the ADD
/// answers. If either fails, the lease is given back and the ADD fails.
pub(crate) async fn report_and_record(
    agent: &Arc<Agent>,
    req: &CniRequest,
    to: ReportTo<'_>,
    b: &Bound<'_>,
    deadline: Deadline,
    phases: &mut Phases,
) -> Result<CniResult, Error> {
    // Report the address within the ADD's deadline, unless the ADD went
    // stale.
    if let (Some(p), Some(key)) = (to.pod, to.key)
        && let Err(e) = deadline
            .kube(
                agent.metrics(),
                || {
                    format!(
                        "writing the pod-networks entry of pod {}/{}",
                        p.namespace, p.name
                    )
                },
                report_address(&*agent.pod_api, p, key, b.lease, b.mac, b.netns),
            )
            .await
    {
        // The pod cannot use an unreported address: give it back (pods,
        // unless another attachment holds the same address).
        let record = lock(&b.handle.live).record.clone();
        let e = abandon_unreported(agent, &record, b.handle, b.lease, e).await;
        if let Error::NotReported {
            fate: LeaseFate::Released,
            ..
        } = &e
        {
            unapply(req, b.lease, true).await;
        }
        return Err(e);
    }
    phases.report = phases.lap();
    // Answer only once the lease's record is in place (a restart must
    // resume it; the store makes it durable moments later, off this
    // path); a lease that could not be recorded is given back and the ADD
    // fails.
    let unrecorded = unrecorded(b.handle, deadline).await;
    phases.durable = phases.durable.saturating_add(phases.lap());
    if let Some(reason) = unrecorded {
        give_back(agent, req, b).await;
        return Err(unreport(agent, to, deadline, reason).await);
    }
    Ok(cni_result(b.lease, &req.config))
}

/// The CNI result for a lease.
pub(crate) fn cni_result(lease: &Lease, config: &NetworkConfig) -> CniResult {
    let routes = apply::routes(lease)
        .into_iter()
        .filter_map(|(dst, gw)| {
            Some(RouteConfig::new(
                Ipv4Cidr::parse(&dst).ok()?,
                gw,
                config.ipam.route_priority,
            ))
        })
        .collect();
    CniResult {
        cni_version: config.cni_version.clone(),
        ips: vec![IpConfig {
            version: None,
            address: Ipv4Cidr {
                addr: lease.address,
                prefix_len: lease.prefix_len,
            },
            gateway: lease.default_gateway(),
        }],
        ips6: Vec::new(),
        routes,
        routes6: Vec::new(),
        dns: DnsConfig {
            nameservers: lease.dns_servers.iter().map(|&a| a.into()).collect(),
            domain: lease.domain_name.clone(),
            search: lease.search.clone(),
        },
    }
    .for_version(&config.cni_version)
}

/// Why the attachment's record is not on disk, after waiting for it within
/// the ADD's deadline; `None` once it is.
pub(crate) async fn unrecorded(handle: &Handle, deadline: Deadline) -> Option<String> {
    let wait = PERSIST_WAIT.min(deadline.left());
    match handle.persisted(wait).await {
        Durable::Saved => None,
        Durable::Failed(e) => Some(crate::rpc::format_chain(&*e)),
        Durable::Pending => Some(format!(
            "the write did not finish within {wait:?} (or the lease ended before it was written)"
        )),
    }
}

/// An ADD whose lease could not be recorded (and was given back): remove
/// the address it reported, and name the state directory in its error.
pub(crate) async fn unreport(
    agent: &Agent,
    to: ReportTo<'_>,
    deadline: Deadline,
    reason: String,
) -> Error {
    if let (Some(p), Some(key)) = (to.pod, to.key)
        && let Err(e) = deadline
            .kube(
                agent.metrics(),
                || {
                    format!(
                        "removing the pod-networks entry of pod {}/{}",
                        p.namespace, p.name
                    )
                },
                agent
                    .pod_api
                    .remove_network_entry(&p.namespace, &p.name, key),
            )
            .await
    {
        warn!(error = %crate::rpc::format_chain(&e),
            "could not remove the pod-networks entry of an ADD whose lease was not recorded");
    }
    Error::Persist {
        dir: agent.args.state_dir.clone(),
        reason,
    }
}

/// Take a released lease's address off the pod interface again (`apply`):
/// an ADD that fails after BOUND leaves the pod without the address.
pub(crate) async fn unapply(req: &CniRequest, lease: &Lease, released: bool) {
    if released
        && req.config.ipam.apply
        && let Some(ns) = &req.netns
        && let Err(e) =
            apply::deconfigure(ns, &req.ifname, lease, req.config.ipam.route_priority).await
    {
        warn!(error = %crate::rpc::format_chain(&e), "could not remove the address of a failed ADD");
    }
}

/// Write the `pod-networks` entry for a learned lease (pods and VMs
/// alike). Nothing is written when the ADD went stale while the lease was
/// acquired: the pod's UID is not the one the ADD started with (the pod was
/// deleted and recreated under the same name), or the sandbox's network
/// namespace `netns` is gone (torn down or superseded). Both are checked
/// after every read of the pod, right before the patch.
pub(crate) async fn report_address(
    pods: &dyn PodStore,
    pod: &PodRef,
    key: &str,
    lease: &Lease,
    mac: [u8; 6],
    netns: Option<&std::path::Path>,
) -> Result<(), PodApiError> {
    let entry = PodNetworkEntry::dhcp(
        lease.address,
        lease.prefix_len,
        MacAddr(mac),
        &lease.default_gateway().into_iter().collect::<Vec<_>>(),
    );
    write_entry(pods, pod, key, entry, netns).await
}

/// Write `entry` as the pod's `pod-networks` entry `key`, refused when the
/// ADD has gone stale (another pod of the name, another sandbox).
async fn write_entry(
    pods: &dyn PodStore,
    pod: &PodRef,
    key: &str,
    entry: PodNetworkEntry,
    netns: Option<&std::path::Path>,
) -> Result<(), PodApiError> {
    let guard = WriteGuard {
        uid: pod.uid.clone(),
        netns: netns.map(std::path::Path::to_path_buf),
    };
    pods.set_network_entry_guarded(&pod.namespace, &pod.name, &guard, key, entry)
        .await
}

/// Write the `pod-networks` entry for a pod's `DHCPv6` lease, as
/// [`report_address`] does for IPv4 (the same stale-ADD checks): the
/// address `a` as configured (its prefix length, its gateway when it has
/// one; see [`crate::lease::v6::address6`]).
pub(crate) async fn report_address6(
    pods: &dyn PodStore,
    pod: &PodRef,
    key: &str,
    a: crate::lease::apply::Address6,
    mac: [u8; 6],
    netns: Option<&std::path::Path>,
) -> Result<(), PodApiError> {
    let entry = PodNetworkEntry::dhcp6(a.address, a.prefix_len, MacAddr(mac), a.gateway);
    write_entry(pods, pod, key, entry, netns).await
}

/// Write the `pod-networks` entry of a dual-stack attachment: both its
/// addresses (`lease`'s and `a6`, as configured) in one entry, with the
/// same stale-ADD checks as [`report_address`].
pub(crate) async fn report_address_dual(
    pods: &dyn PodStore,
    pod: &PodRef,
    key: &str,
    (lease, a6): (&Lease, crate::lease::apply::Address6),
    mac: [u8; 6],
    netns: Option<&std::path::Path>,
) -> Result<(), PodApiError> {
    let entry = PodNetworkEntry::dhcp_dual(
        (lease.address, lease.prefix_len, lease.default_gateway()),
        (a6.address, a6.prefix_len, a6.gateway),
        MacAddr(mac),
    );
    write_entry(pods, pod, key, entry, netns).await
}

/// Write the `pod-networks` entry guest learning keeps for a VM: its
/// DHCPv4 address and its DHCPv6 address as the guest holds them (`lease`
/// and `a6`, either of them absent on a single-family network), then the
/// IPv6 addresses the guest configured itself (`configured6`, with `a6`'s
/// prefix length; none without `a6`). No sandbox is named: the pod's UID
/// is checked as for [`report_address`].
pub(crate) async fn report_learned(
    pods: &dyn PodStore,
    pod: &PodRef,
    key: &str,
    (lease, a6): (Option<&Lease>, Option<crate::lease::apply::Address6>),
    configured6: &[std::net::Ipv6Addr],
    mac: [u8; 6],
) -> Result<(), PodApiError> {
    let mac = MacAddr(mac);
    let mut entry = match (lease, a6) {
        (Some(lease), Some(a6)) => PodNetworkEntry::dhcp_dual(
            (lease.address, lease.prefix_len, lease.default_gateway()),
            (a6.address, a6.prefix_len, a6.gateway),
            mac,
        ),
        (Some(lease), None) => PodNetworkEntry::dhcp(
            lease.address,
            lease.prefix_len,
            mac,
            &lease.default_gateway().into_iter().collect::<Vec<_>>(),
        ),
        (None, Some(a6)) => PodNetworkEntry::dhcp6(a6.address, a6.prefix_len, mac, a6.gateway),
        (None, None) => return Ok(()),
    };
    if let Some(a6) = a6 {
        entry.ip_addresses.extend(
            configured6
                .iter()
                .filter(|ip| **ip != a6.address)
                .map(|ip| format!("{ip}/{}", a6.prefix_len)),
        );
    }
    write_entry(pods, pod, key, entry, None).await
}

/// The lease fate rule for an unreported address (pure): VMs keep theirs;
/// a pod releases unless another attachment (`others`: container id, MAC,
/// address) holds the same binding.
pub(crate) fn unreported_fate<'a>(
    vm: bool,
    mac: [u8; 6],
    address: Ipv4Addr,
    others: impl IntoIterator<Item = (&'a str, [u8; 6], Option<Ipv4Addr>)>,
) -> LeaseFate {
    if vm {
        return LeaseFate::KeptForVm;
    }
    match others
        .into_iter()
        .find(|(_, m, a)| *m == mac && *a == Some(address))
    {
        Some((cid, ..)) => LeaseFate::Shared {
            container_id: cid.to_owned(),
        },
        None => LeaseFate::Released,
    }
}

/// End an attachment whose address was not reported, deciding its lease's
/// fate ([`unreported_fate`]); the error names the fate.
pub(crate) async fn abandon_unreported(
    agent: &Agent,
    record: &LeaseRecord,
    handle: &Handle,
    lease: &Lease,
    source: Error,
) -> Error {
    let cid = &record.container_id;
    let others: Vec<(String, [u8; 6], Option<Ipv4Addr>)> = agent
        .leases
        .all()
        .into_iter()
        .filter(|h| h.generation != handle.generation)
        .map(|h| {
            let l = crate::sys::sync::lock(&h.live);
            (
                l.record.container_id.clone(),
                l.record.mac,
                l.record.lease.as_ref().map(|x| x.address),
            )
        })
        .collect();
    let vm = record.workload != WorkloadKind::Pod;
    let fate = unreported_fate(
        vm,
        record.mac,
        lease.address,
        others.iter().map(|(c, m, a)| (c.as_str(), *m, *a)),
    );
    agent
        .leases
        .abandon(handle, fate == LeaseFate::Released)
        .await;
    tracing::warn!(container = %cid, ifname = %record.ifname, address = %lease.address,
        error = %crate::rpc::format_chain(&source), fate = %fate, "ADD not reported");
    Error::NotReported {
        address: lease.address.into(),
        fate,
        source: Box::new(source),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::kube::annotation::AnnotationError;
    use crate::kube::fake::{FakePods, Hung};

    /// The record tests' lease, with a router.
    fn bound_lease() -> Lease {
        Lease {
            routers: vec![Ipv4Addr::new(192, 0, 2, 1)],
            ..crate::lease::persist::tests::lease()
        }
    }

    /// Every outside call of an ADD ends at the ADD's one deadline: a read
    /// that never answers fails with the deadline named, when it is up (in
    /// virtual time), and is counted as a Kubernetes API failure.
    #[tokio::test(start_paused = true)]
    async fn a_call_that_never_answers_ends_at_the_deadline() {
        let metrics = Metrics::new();
        let pods = FakePods::hung(Hung {
            pods: true,
            ..Hung::default()
        });
        let deadline = Deadline::after(Duration::from_secs(16));
        let t0 = tokio::time::Instant::now();
        let e = deadline
            .kube(
                &metrics,
                || "reading pod tenant/web".to_owned(),
                pods.get_pod("tenant", "web"),
            )
            .await
            .unwrap_err();
        assert_eq!(t0.elapsed(), Duration::from_secs(16));
        assert!(
            matches!(&e, Error::KubeDeadline { what, deadline }
                if what == "reading pod tenant/web" && *deadline == Duration::from_secs(16)),
            "{e:?}"
        );
        assert!(metrics.encode().contains(r#"error="kube_api""#));
        assert_eq!(deadline.left(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_fails_in_time_is_the_apis_error() {
        let metrics = Metrics::new();
        let failed = async {
            Err::<(), _>(PodApiError::Annotation {
                namespace: "tenant".to_owned(),
                name: "web".to_owned(),
                source: AnnotationError::NotJson {
                    source: serde_json::from_str::<serde_json::Value>("{").unwrap_err(),
                },
            })
        };
        let e = Deadline::after(Duration::from_secs(16))
            .kube(&metrics, || "writing".to_owned(), failed)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Kube { .. }), "{e:?}");
    }

    /// The report writes the network's entry (the lease's address, prefix,
    /// gateway, the MAC, `ipam_mode: dhcp`) under the ADD's guard: the pod's
    /// UID and the sandbox's network namespace.
    #[tokio::test]
    async fn the_report_writes_the_entry_under_the_adds_guard() {
        let pods = FakePods::with_pod("tenant", "web", "uid-1");
        let pod = PodRef {
            namespace: "tenant".to_owned(),
            name: "web".to_owned(),
            uid: Some("uid-1".to_owned()),
        };
        let netns = std::path::Path::new("/run/netns/sandbox-1");
        report_address(
            &pods,
            &pod,
            "tenant/localnet",
            &bound_lease(),
            MAC,
            Some(netns),
        )
        .await
        .unwrap();
        let guards = pods.guards();
        let (at, guard) = &guards[0];
        assert_eq!(at, "tenant/web");
        assert_eq!(guard.uid.as_deref(), Some("uid-1"));
        assert_eq!(guard.netns.as_deref(), Some(netns));
        let entry = pods.entry("tenant", "web", "tenant/localnet").unwrap();
        assert_eq!(entry.ip_addresses, ["192.0.2.10/24"]);
        assert_eq!(entry.mac_address, "02:00:00:00:00:01");
        assert_eq!(entry.gateway_ips, ["192.0.2.1"]);
        assert_eq!(entry.ipam_mode.as_deref(), Some("dhcp"));
    }

    const MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);

    #[test]
    fn an_unreported_pod_lease_is_released_unless_another_attachment_holds_it() {
        assert_eq!(unreported_fate(false, MAC, ADDR, []), LeaseFate::Released);
        // Other attachments with another MAC, another address, or none yet.
        let others = [
            ("a", [2, 0, 0, 0, 0, 2], Some(ADDR)),
            ("b", MAC, Some(Ipv4Addr::new(192, 0, 2, 11))),
            ("c", MAC, None),
        ];
        assert_eq!(
            unreported_fate(false, MAC, ADDR, others),
            LeaseFate::Released
        );
        // A newer sandbox of the same pod (same MAC) already holds it.
        let others = [
            ("a", [2, 0, 0, 0, 0, 2], Some(ADDR)),
            ("newer", MAC, Some(ADDR)),
        ];
        assert_eq!(
            unreported_fate(false, MAC, ADDR, others),
            LeaseFate::Shared {
                container_id: "newer".into()
            }
        );
    }

    #[test]
    fn an_unreported_vm_lease_is_kept() {
        assert_eq!(unreported_fate(true, MAC, ADDR, []), LeaseFate::KeptForVm);
        assert!(LeaseFate::KeptForVm.to_string().contains("never released"));
        assert!(LeaseFate::Released.to_string().contains("released"));
    }
}
