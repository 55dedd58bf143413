//! Prometheus metrics (registry prefix `xdhcp`) and the `/metrics`,
//! `/healthz`, `/readyz` router.
//!
//! Labels are bounded: lease states, engine drop reasons and error labels are
//! `&'static str` from fixed sets, never user input.
//!
//! One thing: the agent's metrics and the HTTP router that serves them
//! (about 610 lines of code; the rest is its tests).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// DORA latency buckets, seconds: a veth DORA takes ~1 ms, a congested
/// server or a ping-before-offer dnsmasq seconds.
pub(crate) const DORA_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Buckets of one step of an ADD, seconds: most steps take tens of
/// microseconds to a few milliseconds; a queued or retransmitted
/// exchange, seconds.
pub(crate) const ADD_PHASE_BUCKETS: &[f64] = &[
    0.000_05, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0,
];

/// One step of an ADD in the agent, from the plugin's request to the
/// answer (the `phase` label of `xdhcp_add_phase_seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum AddPhase {
    /// The request read off the socket: the connection's accept to the
    /// ADD's start.
    Request,
    /// The attachment's lock and the pod's lookup.
    Lookup,
    /// The trip into the pod's namespace: sockets, veth peer, routes to
    /// protect.
    Open,
    /// The DHCP guard's attach (beside the exchange for a pod).
    Guard,
    /// Reading the routes to protect when the open had not.
    Protect,
    /// Waiting for one of the network's acquisition slots.
    Slot,
    /// The lease task's start to its first DISCOVER on the wire.
    Start,
    /// The first DISCOVER to the REQUEST for the offer taken.
    Offer,
    /// That REQUEST to the ACK.
    Ack,
    /// Configuring the address (`"apply": true`).
    Apply,
    /// The `pod-networks` entry.
    Report,
    /// The waits for the lease record to be on disk: before the address
    /// is configured, and what is left of it before the answer.
    Persist,
    /// The result back to the socket: the ADD's end to its answer.
    Answer,
}

impl AddPhase {
    /// The `phase` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Request => "request",
            Self::Lookup => "lookup",
            Self::Open => "open",
            Self::Guard => "guard",
            Self::Protect => "protect",
            Self::Slot => "slot",
            Self::Start => "start",
            Self::Offer => "offer",
            Self::Ack => "ack",
            Self::Apply => "apply",
            Self::Report => "report",
            Self::Persist => "persist",
            Self::Answer => "answer",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabel {
    phase: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    family: &'static str,
    state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabel {
    error: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OptionLabel {
    option: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UplinkLabel {
    uplink: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UplinkModeLabel {
    uplink: String,
    mode: &'static str,
    /// The physical network it carries (empty when not known).
    physnet: String,
    /// `flag` (`--uplink`) or `ovs` (read from Open vSwitch).
    source: &'static str,
}

/// Which uplink an `uplink_attached` series is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UplinkLabels {
    pub(crate) uplink: String,
    pub(crate) physnet: String,
    pub(crate) source: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabel {
    path: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GuardLabel {
    /// Host-side interface of the workload port (bounded by the ports on the node).
    port: String,
    reason: &'static str,
    /// `ipv4` (DHCPv4) or `ipv6` (DHCPv6, router advertisements, redirects).
    family: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GuardPassLabel {
    port: String,
    family: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabel {
    source: &'static str,
}

/// One row of the binding table (bounded by the workloads on the node:
/// one leased binding per attachment, one learned per VM port).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BindingLabel {
    mac: String,
    ip: String,
    /// Host end of the workload port; empty when unguarded.
    port: String,
    /// `<namespace>/<name>`; empty when unknown.
    pod: String,
    source: &'static str,
}

/// One guarded port's figures: host-side name, client messages passed by
/// family, drops as (family, reason, count) (the guard's `drops()`).
pub(crate) type GuardPortFigures = (
    String,
    [(&'static str, u64); 2],
    [(&'static str, &'static str, u64); 12],
);

/// The attach modes an uplink's `uplink_attached` series cover.
const ATTACH_MODES: [&str; 3] = ["tc", "xdp-native", "xdp-generic"];

/// The uplink and receive-path metrics, registered in `root`.
fn register_paths(
    root: &mut Registry,
) -> (
    Family<UplinkLabel, Counter>,
    Family<UplinkModeLabel, Gauge>,
    Family<PathLabel, Counter>,
) {
    let uplink_replies = Family::<UplinkLabel, Counter>::default();
    let uplink_attached = Family::<UplinkModeLabel, Gauge>::default();
    let bound_by_path = Family::<PathLabel, Counter>::default();
    root.register(
        "uplink_replies",
        "DHCP replies captured on a node uplink and delivered to their lease, by uplink",
        uplink_replies.clone(),
    );
    root.register(
        "uplink_attached",
        "1 while the capture program is attached to the uplink in this mode (tc, xdp-native, xdp-generic), with the physical network it carries and where it was learnt (flag, ovs)",
        uplink_attached.clone(),
    );
    root.register(
        "bound_by_path",
        "Leases bound, by the receive path that carried the replies (uplink, ebpf, af_packet)",
        bound_by_path.clone(),
    );
    (uplink_replies, uplink_attached, bound_by_path)
}

/// What guest learning counts.
#[derive(Clone, Default)]
struct Learning {
    refused: Family<ReasonLabel, Counter>,
    moves_deferred: Counter,
    events_dropped: Counter,
    records_skipped: Counter,
}

fn register_learning(root: &mut Registry) -> Learning {
    let l = Learning::default();
    root.register(
        "learn_refused",
        "Guest DHCP messages on learning ports that taught nothing because a check refused them, by reason (decode, other_client, unsolicited, not_requested, unknown_network, unknown_server, server_source, outside_prefix, address_taken, too_many)",
        l.refused.clone(),
    );
    root.register(
        "learn_moves_deferred",
        "pod-networks entry moves a port's write rate deferred (the newest target is written when the port has a token)",
        l.moves_deferred.clone(),
    );
    root.register(
        "learn_events_dropped",
        "Observed guest messages dropped because the learning queue was full",
        l.events_dropped.clone(),
    );
    root.register(
        "learn_records_skipped",
        "Guard ring records skipped unread: a frame that is not the message its record says, or a record kind this agent does not read",
        l.records_skipped.clone(),
    );
    l
}

/// All agent metrics.
pub(crate) struct Metrics {
    learning: Learning,
    registry: Registry,
    leases: Family<StateLabel, Gauge>,
    dora_seconds: Histogram,
    add_phases: Family<PhaseLabel, Histogram>,
    add_seconds: Histogram,
    renewals: Counter,
    naks: Counter,
    failures: Family<ErrorLabel, Counter>,
    dropped: Family<ReasonLabel, Counter>,
    malformed_options: Family<OptionLabel, Counter>,
    kernel: Family<OutcomeLabel, Counter>,
    cni_requests: Family<OpLabel, Counter>,
    capture_lost: Family<ReasonLabel, Counter>,
    capture_restored: Family<ReasonLabel, Counter>,
    capture_fallbacks: Counter,
    capture_degraded: Gauge,
    uplink_replies: Family<UplinkLabel, Counter>,
    uplink_attached: Family<UplinkModeLabel, Gauge>,
    bound_by_path: Family<PathLabel, Counter>,
    kernel_last: Mutex<Vec<(&'static str, u64)>>,
    learn_skipped: Family<ReasonLabel, Counter>,
    learn_skipped_last: Mutex<Vec<(&'static str, u64)>>,
    store_barriers: Family<OutcomeLabel, Counter>,
    store_barriers_last: Mutex<Vec<(&'static str, u64)>>,
    guard_dropped: Family<GuardLabel, Gauge<u64, std::sync::atomic::AtomicU64>>,
    guard_passed: Family<GuardPassLabel, Gauge<u64, std::sync::atomic::AtomicU64>>,
    guard_ports: Gauge,
    acquisitions_queued: Gauge,
    bindings: Family<SourceLabel, Gauge>,
    binding_info: Family<BindingLabel, Gauge>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered.
    #[expect(
        clippy::too_many_lines,
        reason = "one registration per metric, in the order of the exposition"
    )]
    pub(crate) fn new() -> Self {
        let mut root = Registry::with_prefix("xdhcp");
        let leases = Family::<StateLabel, Gauge>::default();
        let dora_seconds = Histogram::new(DORA_BUCKETS.iter().copied());
        let add_phases = Family::<PhaseLabel, Histogram>::new_with_constructor(
            (|| Histogram::new(ADD_PHASE_BUCKETS.iter().copied())) as fn() -> Histogram,
        );
        let add_seconds = Histogram::new(ADD_PHASE_BUCKETS.iter().copied());
        let renewals = Counter::default();
        let naks = Counter::default();
        let failures = Family::<ErrorLabel, Counter>::default();
        let dropped = Family::<ReasonLabel, Counter>::default();
        let malformed_options = Family::<OptionLabel, Counter>::default();
        let kernel = Family::<OutcomeLabel, Counter>::default();
        let learn_skipped = Family::<ReasonLabel, Counter>::default();
        let store_barriers = Family::<OutcomeLabel, Counter>::default();
        let cni_requests = Family::<OpLabel, Counter>::default();
        let capture_lost = Family::<ReasonLabel, Counter>::default();
        let capture_restored = Family::<ReasonLabel, Counter>::default();
        let capture_fallbacks = Counter::default();
        let capture_degraded = Gauge::default();
        let (uplink_replies, uplink_attached, bound_by_path) = register_paths(&mut root);
        let learning = register_learning(&mut root);
        let guard_dropped = Family::default();
        let guard_passed = Family::default();
        let guard_ports = Gauge::default();
        let acquisitions_queued = Gauge::default();
        let bindings = Family::<SourceLabel, Gauge>::default();
        let binding_info = Family::<BindingLabel, Gauge>::default();
        root.register(
            "bindings",
            "Rows of the binding table (xdhcp bindings), by source (leased, learned)",
            bindings.clone(),
        );
        root.register(
            "binding_info",
            "1 per row of the binding table: MAC, address, host end of the port, pod, source",
            binding_info.clone(),
        );
        root.register(
            "guard_dropped_frames",
            "DHCP frames (and IPv6 router advertisements and redirects) the guard dropped on a workload port since it was attached, by port, reason (server, rate, spoof, malformed, unclassified; router_advertisement, redirect) and family (ipv4, ipv6)",
            guard_dropped.clone(),
        );
        root.register(
            "guard_passed_client_frames",
            "DHCP client messages the guard passed on a workload port since it was attached, by port and family (ipv4: DHCPv4, ipv6: DHCPv6)",
            guard_passed.clone(),
        );
        root.register(
            "guard_ports",
            "Workload ports under the DHCP guard",
            guard_ports.clone(),
        );
        root.register(
            "acquisitions_queued",
            "New acquisitions waiting for one of their network's slots before their first DISCOVER",
            acquisitions_queued.clone(),
        );
        root.register("leases", "Leases by DHCP client state", leases.clone());
        root.register(
            "dora_duration_seconds",
            "Time from the first DISCOVER (or INIT-REBOOT REQUEST) to BOUND",
            dora_seconds.clone(),
        );
        root.register(
            "add_phase_seconds",
            "Time one step of a pod's ADD took inside the agent, by phase (request, lookup, open, guard, protect, slot, start, offer, ack, apply, report, persist, answer; docs/dhcp-ipam-localnet.md, Metrics and health)",
            add_phases.clone(),
        );
        root.register(
            "add_duration_seconds",
            "A successful ADD inside the agent, from the connection's accept to its answer",
            add_seconds.clone(),
        );
        root.register("renewals", "Leases renewed or rebound", renewals.clone());
        root.register("naks", "DHCPNAKs received", naks.clone());
        root.register(
            "failures",
            "Failed CNI operations and lost leases by error",
            failures.clone(),
        );
        root.register(
            "dropped_replies",
            "DHCP replies dropped by the engine, by reason",
            dropped.clone(),
        );
        root.register(
            "malformed_options",
            "Optional options dropped from accepted replies because malformed, by option code",
            malformed_options.clone(),
        );
        root.register(
            "kernel_frames",
            "eBPF capture program outcomes (summed over CPUs)",
            kernel.clone(),
        );
        root.register(
            "learn_replies_skipped",
            "Replies towards a learning port's client the guard passed in the kernel without handing them to passive learning, by reason (shed_rate: an ACK over the port's bucket; not_learned: a type learning does not use)",
            learn_skipped.clone(),
        );
        root.register(
            "store_barriers",
            "The lease store's durability barriers (fdatasync of a batch of records, fsync of their directory), by outcome (failed counts the batches written for ADDs' answers whose barrier failed: in place, a host crash could lose them; any other save's failure is its caller's error, failures{error=\"persist\"})",
            store_barriers.clone(),
        );
        root.register(
            "cni_requests",
            "CNI requests served, by operation",
            cni_requests.clone(),
        );
        root.register(
            "capture_lost",
            "Kernel capture paths lost under the agent (ring reader failed, link detached, ring full, a lease's xid the kernel would not own), by reason",
            capture_lost.clone(),
        );
        root.register(
            "capture_restored",
            "Kernel capture paths restored after a loss, by reason",
            capture_restored.clone(),
        );
        root.register(
            "capture_fallbacks",
            "Leases moved from the eBPF ring buffer to their own AF_PACKET receiver after a capture loss",
            capture_fallbacks.clone(),
        );
        root.register(
            "capture_degraded",
            "1 while some kernel capture path is lost and leases run on AF_PACKET",
            capture_degraded.clone(),
        );
        Self {
            learning,
            registry: root,
            capture_lost,
            capture_restored,
            capture_fallbacks,
            capture_degraded,
            uplink_replies,
            uplink_attached,
            bound_by_path,
            leases,
            dora_seconds,
            add_phases,
            add_seconds,
            renewals,
            naks,
            failures,
            dropped,
            malformed_options,
            kernel,
            cni_requests,
            kernel_last: Mutex::new(Vec::new()),
            learn_skipped,
            learn_skipped_last: Mutex::new(Vec::new()),
            store_barriers,
            store_barriers_last: Mutex::new(Vec::new()),
            guard_dropped,
            guard_passed,
            guard_ports,
            acquisitions_queued,
            bindings,
            binding_info,
        }
    }

    /// Replaces the binding-table figures with the table `rows` (rows gone
    /// from the table disappear; every source is always reported).
    pub(crate) fn bindings_snapshot(&self, rows: &[crate::bindings::Binding]) {
        use crate::bindings::BindingSource;
        self.binding_info.clear();
        for source in [
            BindingSource::Leased,
            BindingSource::Learned,
            BindingSource::Dad,
        ] {
            let n = rows.iter().filter(|b| b.source == source).count();
            self.bindings
                .get_or_create(&SourceLabel {
                    source: source.label(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        for b in rows {
            self.binding_info
                .get_or_create(&BindingLabel {
                    mac: b.mac.clone(),
                    ip: b.ip.to_string(),
                    port: b.port.clone().unwrap_or_default(),
                    pod: b.pod.clone().unwrap_or_default(),
                    source: b.source.label(),
                })
                .set(1);
        }
    }

    /// Replaces the guard's per-port figures with a fresh snapshot (ports
    /// no longer guarded disappear): (port, passed client messages by
    /// family, drops by family and reason).
    pub(crate) fn guard_snapshot(&self, ports: &[GuardPortFigures]) {
        self.guard_dropped.clear();
        self.guard_passed.clear();
        for (port, passed, drops) in ports {
            for &(family, n) in passed {
                self.guard_passed
                    .get_or_create(&GuardPassLabel {
                        port: port.clone(),
                        family,
                    })
                    .set(n);
            }
            for &(family, reason, n) in drops {
                self.guard_dropped
                    .get_or_create(&GuardLabel {
                        port: port.clone(),
                        reason,
                        family,
                    })
                    .set(n);
            }
        }
        self.guard_ports
            .set(i64::try_from(ports.len()).unwrap_or(i64::MAX));
    }

    /// A lease moved from `from` (None: new) to `to` (None: gone), each a
    /// (family, state) pair: `("ipv4", "bound")`.
    pub(crate) fn lease_state(
        &self,
        from: Option<(&'static str, &'static str)>,
        to: Option<(&'static str, &'static str)>,
    ) {
        if from == to {
            return;
        }
        if let Some((family, state)) = from {
            self.leases
                .get_or_create(&StateLabel { family, state })
                .dec();
        }
        if let Some((family, state)) = to {
            self.leases
                .get_or_create(&StateLabel { family, state })
                .inc();
        }
    }

    /// One acquisition took `secs`.
    pub(crate) fn dora(&self, secs: f64) {
        self.dora_seconds.observe(secs);
    }

    /// A lease was renewed or rebound.
    pub(crate) fn renewal(&self) {
        self.renewals.inc();
    }

    /// A NAK arrived.
    pub(crate) fn nak(&self) {
        self.naks.inc();
    }

    /// An operation failed with a bounded error label.
    pub(crate) fn failure(&self, error: &'static str) {
        self.failures.get_or_create(&ErrorLabel { error }).inc();
    }

    /// A guest's message on a learning port was refused for `reason`.
    pub(crate) fn learn_refused(&self, reason: &'static str) {
        self.learning
            .refused
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// A port's write rate deferred an entry move.
    pub(crate) fn learn_move_deferred(&self) {
        self.learning.moves_deferred.inc();
    }

    /// The learning queue was full: an observed message was dropped.
    pub(crate) fn learn_event_dropped(&self) {
        self.learning.events_dropped.inc();
    }

    /// `n` more guard ring records did not decode and were skipped.
    pub(crate) fn learn_records_skipped(&self, n: u64) {
        self.learning.records_skipped.inc_by(n);
    }

    /// The engine dropped `n` more replies for `reason`.
    pub(crate) fn dropped(&self, reason: &'static str, n: u64) {
        if n > 0 {
            self.dropped
                .get_or_create(&ReasonLabel { reason })
                .inc_by(n);
        }
    }

    /// A kernel capture path was lost (`reader`, `link_detached`, `ring_full`).
    pub(crate) fn capture_lost(&self, reason: &'static str) {
        self.capture_lost
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// A lost kernel capture path works again.
    pub(crate) fn capture_restored(&self, reason: &'static str) {
        self.capture_restored
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// A lease moved to its own `AF_PACKET` receiver after a capture loss.
    pub(crate) fn capture_fallback(&self) {
        self.capture_fallbacks.inc();
    }

    /// A reply captured on `uplink` reached its lease.
    pub(crate) fn uplink_reply(&self, uplink: &str) {
        self.uplink_replies
            .get_or_create(&UplinkLabel {
                uplink: uplink.to_owned(),
            })
            .inc();
    }

    /// The capture program on uplink `u` is attached in `mode` (`None`:
    /// not attached).
    pub(crate) fn set_uplink_attached(&self, u: &UplinkLabels, mode: Option<&'static str>) {
        for m in ATTACH_MODES {
            self.uplink_attached
                .get_or_create(&UplinkModeLabel {
                    uplink: u.uplink.clone(),
                    physnet: u.physnet.clone(),
                    source: u.source,
                    mode: m,
                })
                .set(i64::from(mode == Some(m)));
        }
    }

    /// Uplink `u` is no longer held: its `uplink_attached` series go.
    pub(crate) fn forget_uplink(&self, u: &UplinkLabels) {
        for m in ATTACH_MODES {
            self.uplink_attached.remove(&UplinkModeLabel {
                uplink: u.uplink.clone(),
                physnet: u.physnet.clone(),
                source: u.source,
                mode: m,
            });
        }
    }

    /// A lease bound with its replies carried by `path` (`uplink`, `ebpf`,
    /// `af_packet`).
    pub(crate) fn bound_by_path(&self, path: &'static str) {
        self.bound_by_path.get_or_create(&PathLabel { path }).inc();
    }

    /// Whether some capture path is lost right now.
    /// The gauge of acquisitions waiting for a slot ([`crate::daemon`]'s
    /// pacing keeps it).
    pub(crate) fn acquisitions_queued(&self) -> Gauge {
        self.acquisitions_queued.clone()
    }

    pub(crate) fn set_capture_degraded(&self, degraded: bool) {
        self.capture_degraded.set(i64::from(degraded));
    }

    /// The engine dropped `n` more malformed copies of optional `option`
    /// (`LeaseOption::label`, the option code) and kept the lease.
    pub(crate) fn malformed_option(&self, option: &'static str, n: u64) {
        if n > 0 {
            self.malformed_options
                .get_or_create(&OptionLabel { option })
                .inc_by(n);
        }
    }

    /// One step of an ADD took `d`.
    pub(crate) fn add_phase(&self, phase: AddPhase, d: std::time::Duration) {
        self.add_phases
            .get_or_create(&PhaseLabel {
                phase: phase.label(),
            })
            .observe(d.as_secs_f64());
    }

    /// A successful ADD took `d` inside the agent.
    pub(crate) fn add_done(&self, d: std::time::Duration) {
        self.add_seconds.observe(d.as_secs_f64());
    }

    /// A CNI request was served.
    pub(crate) fn cni_request(&self, op: &'static str) {
        self.cni_requests.get_or_create(&OpLabel { op }).inc();
    }

    /// Fold a snapshot of the kernel counters (monotonic totals) in.
    pub(crate) fn kernel_snapshot(&self, snapshot: &[(&'static str, u64)]) {
        fold_totals(&self.kernel_last, snapshot, |outcome, n| {
            self.kernel
                .get_or_create(&OutcomeLabel { outcome })
                .inc_by(n);
        });
    }

    /// Fold a snapshot of the guard's learning-filter counters (monotonic
    /// totals) in.
    pub(crate) fn learn_skipped_snapshot(&self, snapshot: &[(&'static str, u64)]) {
        fold_totals(&self.learn_skipped_last, snapshot, |reason, n| {
            self.learn_skipped
                .get_or_create(&ReasonLabel { reason })
                .inc_by(n);
        });
    }

    /// Fold the lease store's barrier totals (made, failed; monotonic) in.
    pub(crate) fn store_snapshot(&self, made: u64, failed: u64) {
        fold_totals(
            &self.store_barriers_last,
            &[("ok", made), ("failed", failed)],
            |outcome, n| {
                self.store_barriers
                    .get_or_create(&OutcomeLabel { outcome })
                    .inc_by(n);
            },
        );
    }

    /// The text exposition.
    pub(crate) fn encode(&self) -> String {
        let mut s = String::new();
        // Encoding into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        s
    }
}

/// Adds to counters what each monotonic total in `snapshot` grew by since
/// the totals remembered in `last`, and remembers the new ones.
fn fold_totals(
    last: &Mutex<Vec<(&'static str, u64)>>,
    snapshot: &[(&'static str, u64)],
    mut add: impl FnMut(&'static str, u64),
) {
    let mut last = last
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for &(label, total) in snapshot {
        let prev = last
            .iter()
            .find(|(o, _)| *o == label)
            .map_or(0, |(_, v)| *v);
        if total > prev {
            add(label, total - prev);
        }
        match last.iter_mut().find(|(o, _)| *o == label) {
            Some(slot) => slot.1 = total,
            None => last.push((label, total)),
        }
    }
}

/// Readiness: the datapath is up and persisted leases were recovered; and
/// whether the kernel capture path is degraded (leases served by their
/// `AF_PACKET` fallback).
#[derive(Debug, Default)]
pub(crate) struct Health {
    datapath: AtomicBool,
    recovered: AtomicBool,
    degraded: Mutex<Option<String>>,
}

impl Health {
    /// Record that the receive path is running.
    pub(crate) fn set_datapath_ready(&self) {
        self.datapath.store(true, Ordering::SeqCst);
    }

    /// Record that the lease store was loaded and every lease resumed.
    pub(crate) fn set_recovered(&self) {
        self.recovered.store(true, Ordering::SeqCst);
    }

    /// Whether state recovery finished.
    pub(crate) fn recovered(&self) -> bool {
        self.recovered.load(Ordering::SeqCst)
    }

    /// Record that (`Some(why)`) or no longer (`None`) part of the kernel
    /// capture path is lost. CNI requests are still served (the leases fall
    /// back to `AF_PACKET`), but `/readyz` reports it.
    pub(crate) fn set_degraded(&self, why: Option<String>) {
        *self
            .degraded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = why;
    }

    /// Why the capture path is degraded, if it is.
    pub(crate) fn degraded(&self) -> Option<String> {
        self.degraded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// `Ok` when the agent socket takes ADDs (CNI STATUS), else why not:
    /// once the datapath is attached. The records a starting agent resumes
    /// need not be: an operation on one of theirs waits for it, the rest go
    /// ahead.
    pub(crate) fn takes_adds(&self) -> Result<(), &'static str> {
        if self.datapath.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err("datapath not attached yet")
        }
    }

    /// `Ok` when every lease is resumed too (`/readyz`), else why not.
    pub(crate) fn ready(&self) -> Result<(), &'static str> {
        match (
            self.datapath.load(Ordering::SeqCst),
            self.recovered.load(Ordering::SeqCst),
        ) {
            (true, true) => Ok(()),
            (false, _) => Err("datapath not attached yet"),
            (true, false) => Err("lease state not recovered yet"),
        }
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// `/metrics`, `/healthz` (process alive) and `/readyz` (datapath + state).
pub(crate) fn router(metrics: Arc<Metrics>, health: Arc<Health>) -> Router {
    Router::new()
        .route("/metrics", get(serve_metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(serve_ready))
        .with_state(AppState { metrics, health })
}

async fn serve_metrics(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

async fn serve_ready(State(s): State<AppState>) -> impl IntoResponse {
    match s.health.ready() {
        Ok(()) => match s.health.degraded() {
            None => (StatusCode::OK, "ready\n".to_owned()),
            Some(why) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("degraded: {why}\n"),
            ),
        },
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stores_barrier_totals_are_counted_by_what_they_grew() {
        let m = Metrics::new();
        m.store_snapshot(4, 0);
        m.store_snapshot(6, 1);
        m.store_snapshot(6, 1);
        let text = m.encode();
        assert!(
            text.contains(r#"xdhcp_store_barriers_total{outcome="ok"} 6"#),
            "{text}"
        );
        assert!(
            text.contains(r#"xdhcp_store_barriers_total{outcome="failed"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn the_guards_figures_carry_their_family_and_the_ipv6_reasons() {
        let m = Metrics::new();
        let c = crate::datapath::ebpf::GuardCounters {
            passed_client: 4,
            dropped_server: 1,
            passed_client_v6: 2,
            dropped_server_v6: 5,
            dropped_router_advertisement: 3,
            dropped_redirect: 1,
            ..Default::default()
        };
        m.guard_snapshot(&[("p1".to_owned(), c.passed(), c.drops())]);
        let text = m.encode();
        for line in [
            r#"xdhcp_guard_dropped_frames{port="p1",reason="server",family="ipv4"} 1"#,
            r#"xdhcp_guard_dropped_frames{port="p1",reason="server",family="ipv6"} 5"#,
            r#"xdhcp_guard_dropped_frames{port="p1",reason="router_advertisement",family="ipv6"} 3"#,
            r#"xdhcp_guard_dropped_frames{port="p1",reason="redirect",family="ipv6"} 1"#,
            r#"xdhcp_guard_passed_client_frames{port="p1",family="ipv4"} 4"#,
            r#"xdhcp_guard_passed_client_frames{port="p1",family="ipv6"} 2"#,
            "xdhcp_guard_ports 1",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }

    #[test]
    fn exposition_has_prefixed_metrics() {
        let m = Metrics::new();
        m.lease_state(None, Some(("ipv4", "bound")));
        m.lease_state(None, Some(("ipv4", "bound")));
        m.lease_state(Some(("ipv4", "bound")), Some(("ipv4", "renewing")));
        m.lease_state(None, Some(("ipv6", "bound")));
        m.dora(0.003);
        m.renewal();
        m.nak();
        m.failure("dhcp_timeout");
        m.dropped("wrong_xid", 2);
        m.malformed_option("121", 1);
        m.malformed_option("121", 2);
        m.kernel_snapshot(&[("captured", 5)]);
        m.kernel_snapshot(&[("captured", 7)]);
        m.add_phase(AddPhase::Offer, std::time::Duration::from_micros(700));
        m.add_done(std::time::Duration::from_millis(3));
        let text = m.encode();
        assert!(
            text.contains("xdhcp_add_phase_seconds_bucket{le=\"0.001\",phase=\"offer\"} 1")
                || text.contains("xdhcp_add_phase_seconds_bucket{phase=\"offer\",le=\"0.001\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("xdhcp_add_duration_seconds_count 1"),
            "{text}"
        );
        assert!(
            text.contains(r#"xdhcp_leases{family="ipv4",state="bound"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"xdhcp_leases{family="ipv4",state="renewing"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"xdhcp_leases{family="ipv6",state="bound"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("xdhcp_dora_duration_seconds_bucket{le=\"0.005\"} 1"),
            "{text}"
        );
        assert!(text.contains("xdhcp_renewals_total 1"), "{text}");
        assert!(text.contains("xdhcp_naks_total 1"), "{text}");
        assert!(
            text.contains(r#"xdhcp_failures_total{error="dhcp_timeout"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"xdhcp_dropped_replies_total{reason="wrong_xid"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"xdhcp_malformed_options_total{option="121"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"xdhcp_kernel_frames_total{outcome="captured"} 7"#),
            "{text}"
        );
    }

    #[test]
    fn learning_filter_totals_become_counters() {
        let m = Metrics::new();
        m.learn_skipped_snapshot(&[("shed_rate", 5), ("not_learned", 2)]);
        m.learn_skipped_snapshot(&[("shed_rate", 9), ("not_learned", 2)]);
        let text = m.encode();
        assert!(
            text.contains(r#"xdhcp_learn_replies_skipped_total{reason="shed_rate"} 9"#),
            "{text}"
        );
        assert!(
            text.contains(r#"xdhcp_learn_replies_skipped_total{reason="not_learned"} 2"#),
            "{text}"
        );
    }

    #[test]
    fn learning_refusals_are_counted_by_reason() {
        let m = Metrics::new();
        m.learn_refused("unsolicited");
        m.learn_refused("unsolicited");
        m.learn_refused("address_taken");
        m.learn_move_deferred();
        m.learn_event_dropped();
        m.learn_records_skipped(3);
        let text = m.encode();
        assert!(
            text.contains("xdhcp_learn_records_skipped_total 3"),
            "{text}"
        );
        assert!(
            text.contains(r#"xdhcp_learn_refused_total{reason="unsolicited"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"xdhcp_learn_refused_total{reason="address_taken"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("xdhcp_learn_moves_deferred_total 1"),
            "{text}"
        );
        assert!(
            text.contains("xdhcp_learn_events_dropped_total 1"),
            "{text}"
        );
    }

    #[test]
    fn binding_table_figures_follow_the_table() {
        use crate::bindings::{Binding, BindingSource};
        let row = |mac: &str, ip: [u8; 4], source| Binding {
            mac: mac.to_owned(),
            ip: ip.into(),
            port: Some("c0".to_owned()),
            pod: Some("tenant/vm1".to_owned()),
            expires_unix_ms: None,
            source,
            replaced: None,
        };
        let m = Metrics::new();
        m.bindings_snapshot(&[
            row("02:00:00:00:00:01", [192, 0, 2, 5], BindingSource::Leased),
            row("02:00:00:00:00:02", [192, 0, 2, 6], BindingSource::Leased),
            row("02:00:00:00:00:02", [192, 0, 2, 7], BindingSource::Learned),
        ]);
        let text = m.encode();
        assert!(
            text.contains(r#"xdhcp_bindings{source="leased"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"xdhcp_bindings{source="learned"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"xdhcp_binding_info{mac="02:00:00:00:00:02",ip="192.0.2.7",port="c0",pod="tenant/vm1",source="learned"} 1"#
            ),
            "{text}"
        );
        // The learned row goes (expired, released): its series goes, the count is 0.
        m.bindings_snapshot(&[row(
            "02:00:00:00:00:01",
            [192, 0, 2, 5],
            BindingSource::Leased,
        )]);
        let text = m.encode();
        assert!(
            text.contains(r#"xdhcp_bindings{source="learned"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"xdhcp_bindings{source="leased"} 1"#),
            "{text}"
        );
        assert!(!text.contains("192.0.2.7"), "{text}");
        assert_eq!(text.matches("xdhcp_binding_info{").count(), 1, "{text}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn readyz_flips_when_datapath_and_state_are_up() {
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        let health = Arc::new(Health::default());
        let app = router(Arc::new(Metrics::new()), health.clone());
        let get = |p: &'static str| {
            axum::http::Request::builder()
                .uri(p)
                .body(axum::body::Body::empty())
                .unwrap()
        };
        let r = app.clone().oneshot(get("/readyz")).await.unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        health.set_datapath_ready();
        let r = app.clone().oneshot(get("/readyz")).await.unwrap();
        let body = r.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&body).contains("not recovered"));
        health.set_recovered();
        let r = app.clone().oneshot(get("/readyz")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let r = app.clone().oneshot(get("/healthz")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let r = app.oneshot(get("/metrics")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
}
