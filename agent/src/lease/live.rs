//! What the rest of the daemon sees of a running lease: its live view, the
//! commands it takes, and the outcome an ADD waits for.

use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use xdhcp_engine::{AcquireError, Lease, MessageKind, State, v6};

use crate::datapath::capture::CapturePath;
use crate::datapath::link::LinkError;
use crate::lease::persist::{LeaseRecord, WorkloadKind};
use crate::rpc::LeaseView;
use crate::workload::MacAddr;

/// What ADD waits for.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The lease, and where the task's time went getting it.
    Bound(Lease, Exchange),
    Failed(AcquireError),
    /// The interface could not be used.
    LinkFailed(LinkError),
    /// The interface was deleted during the acquisition.
    Removed,
    /// Bound, but `"apply": true` could not configure the lease on the
    /// interface (a route there already, say); what was added is taken
    /// off again.
    ApplyFailed(std::sync::Arc<crate::netlink::NetlinkError>),
    /// The agent is shutting down.
    Cancelled,
}

/// Where a first acquisition's time went inside its lease task: the
/// phases of an ADD the task sees (the ADD's `xdhcp_add_phase_seconds`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Exchange {
    /// From the port's open (the link made operational, the guard's
    /// `clsact` on its host port) to the task's first frame on the wire: the
    /// DISCOVER (or an INIT-REBOOT's REQUEST).
    pub(crate) start: Duration,
    /// From that first frame to the REQUEST for the offer taken: the
    /// server's OFFER and any retransmission or restart on the way.
    pub(crate) offer: Duration,
    /// From that REQUEST to the ACK.
    pub(crate) ack: Duration,
    /// From the ACK to the record naming the address on disk (most often
    /// the one written while the REQUEST was out, done by then).
    pub(crate) durable: Duration,
    /// Configuring the address on the interface (`"apply": true`).
    pub(crate) apply: Duration,
}

/// The task's stopwatch for [`Exchange`], sans-IO: told when each frame
/// goes out and when the lease is bound, in the caller's clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExchangeClock {
    started: Instant,
    first_sent: Option<Instant>,
    request_sent: Option<Instant>,
}

impl ExchangeClock {
    /// A stopwatch started at `now` (the task's start).
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            started: now,
            first_sent: None,
            request_sent: None,
        }
    }

    /// A frame of `kind` went out at `now`. The first frame ends the
    /// start; the first REQUEST after a DISCOVER ends the offer (a
    /// DISCOVER after it, the engine starting over, opens a new one).
    pub(crate) fn sent(&mut self, kind: MessageKind, now: Instant) {
        self.step(
            kind == MessageKind::Discover,
            kind == MessageKind::Request,
            now,
        );
    }

    /// [`ExchangeClock::sent`] for a DHCPv6 message: a SOLICIT opens the
    /// offer phase as a DISCOVER does (its ADVERTISE is the offer; with
    /// Rapid Commit its REPLY binds and the offer phase stays empty), a
    /// REQUEST ends it.
    pub(crate) fn sent6(&mut self, kind: v6::MessageKind, now: Instant) {
        self.step(
            kind == v6::MessageKind::Solicit,
            kind == v6::MessageKind::Request,
            now,
        );
    }

    fn step(&mut self, starts_over: bool, request: bool, now: Instant) {
        self.first_sent.get_or_insert(now);
        if starts_over {
            self.request_sent = None;
        } else if request {
            self.request_sent.get_or_insert(now);
        }
    }

    /// The lease was bound at `bound`, its record on disk by `recorded`,
    /// and it was configured (or not) by `applied`: the phases.
    pub(crate) fn bound(&self, bound: Instant, recorded: Instant, applied: Instant) -> Exchange {
        let first = self.first_sent.unwrap_or(self.started);
        let request = self.request_sent.unwrap_or(first).max(first);
        let recorded = recorded.max(bound);
        Exchange {
            start: first.saturating_duration_since(self.started),
            offer: request.saturating_duration_since(first),
            ack: bound.saturating_duration_since(request),
            durable: recorded.saturating_duration_since(bound),
            apply: applied.saturating_duration_since(recorded),
        }
    }
}

/// Commands to a running lease task.
#[derive(Debug)]
pub(crate) enum Command {
    /// End the lease: RELEASE first when `release`; ack when done.
    Stop {
        release: bool,
        ack: oneshot::Sender<()>,
    },
}

/// The state of an attachment's engine, of either family.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum EngineState {
    V4(State),
    V6(xdhcp_engine::v6::State),
}

impl EngineState {
    /// Bounded label for metrics.
    pub(crate) fn label(self) -> &'static str {
        match self {
            EngineState::V4(s) => s.label(),
            EngineState::V6(s) => s.label(),
        }
    }

    /// The `xdhcp_leases` gauge's labels: the family and the state.
    pub(crate) fn metric(self) -> (&'static str, &'static str) {
        let family = match self {
            EngineState::V4(_) => "ipv4",
            EngineState::V6(_) => "ipv6",
        };
        (family, self.label())
    }
}

impl From<State> for EngineState {
    fn from(s: State) -> Self {
        EngineState::V4(s)
    }
}

impl From<xdhcp_engine::v6::State> for EngineState {
    fn from(s: xdhcp_engine::v6::State) -> Self {
        EngineState::V6(s)
    }
}

/// As the engine's own state prints (`Bound`, `Soliciting`, …).
impl std::fmt::Debug for EngineState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineState::V4(s) => s.fmt(f),
            EngineState::V6(s) => s.fmt(f),
        }
    }
}

/// Live, shared view of one attachment (for `leases`, `status`, CHECK).
#[derive(Debug, Clone)]
pub(crate) struct Live {
    pub(crate) record: LeaseRecord,
    pub(crate) state: EngineState,
    pub(crate) capture: CapturePath,
    /// Expiry, wall clock ms.
    pub(crate) expires_unix_ms: Option<u64>,
}

impl Live {
    /// The view of a freshly known attachment.
    pub(crate) fn new(
        record: LeaseRecord,
        state: impl Into<EngineState>,
        capture: CapturePath,
    ) -> Self {
        let expires_unix_ms = match &record.lease6 {
            Some(l) => expiry6_ms(l),
            None => record.lease.as_ref().and_then(expiry_ms),
        };
        Self {
            record,
            state: state.into(),
            capture,
            expires_unix_ms,
        }
    }

    /// The `xdhcp leases` row.
    pub(crate) fn view(&self) -> LeaseView {
        let r = &self.record;
        LeaseView {
            container_id: r.container_id.clone(),
            ifname: r.ifname.clone(),
            pod: r
                .pod
                .as_ref()
                .map(|p| format!("{}/{}", p.namespace, p.name)),
            network: r.network.name.clone(),
            workload: match &r.workload {
                WorkloadKind::Pod => "pod".to_owned(),
                WorkloadKind::Vm { vmi } => format!("vm:{vmi}"),
            },
            mac: MacAddr(r.mac).to_string(),
            address: r.lease.as_ref().map(|l| crate::cni::types::Ipv4Cidr {
                addr: l.address,
                prefix_len: l.prefix_len,
            }),
            family: r.family().label().to_owned(),
            address6: r.lease6.as_ref().map(|l| {
                let a = crate::lease::apply::address6(&r.network, l, r.router6);
                crate::cni::types::Ipv6Cidr {
                    addr: a.address,
                    prefix_len: a.prefix_len,
                }
            }),
            server: r.lease.as_ref().map(|l| l.server_id),
            state: if matches!(r.workload, WorkloadKind::Vm { .. })
                && (r.lease.is_some() || r.lease6.is_some())
            {
                "OneShot".to_owned()
            } else {
                format!("{:?}", self.state)
            },
            path: self.capture.to_string(),
            expires_unix_ms: self.expires_unix_ms,
            pod_uid: r.pod.as_ref().and_then(|p| p.uid.clone()),
            nad: r.network.net_attach_def_name.clone(),
        }
    }

    /// Replace the lease (and its expiry).
    pub(crate) fn set_lease(&mut self, lease: Option<Lease>) {
        self.expires_unix_ms = lease.as_ref().and_then(expiry_ms);
        if lease.is_some() {
            self.record.requested = None;
            self.record.requested_from = None;
        }
        self.record.lease = lease;
        self.record.updated_unix_ms = crate::sys::clock::now_unix_ms();
    }

    /// Replace the `DHCPv6` lease (and its expiry).
    pub(crate) fn set_lease6(&mut self, lease: Option<xdhcp_engine::v6::Lease>) {
        self.expires_unix_ms = lease.as_ref().and_then(expiry6_ms);
        self.record.lease6 = lease.map(Box::new);
        self.record.updated_unix_ms = crate::sys::clock::now_unix_ms();
    }
}

/// Expiry of a `DHCPv6` lease on the wall clock (None when infinite).
pub(crate) fn expiry6_ms(lease: &xdhcp_engine::v6::Lease) -> Option<u64> {
    xdhcp_engine::v6::lease::finite(lease.valid_secs)
        .map(|d| lease.acquired_unix_ms.saturating_add(d.as_millis() as u64))
}

/// Expiry of `lease` on the wall clock (None when infinite).
pub(crate) fn expiry_ms(lease: &Lease) -> Option<u64> {
    (!lease.is_infinite()).then(|| lease.acquired_unix_ms + lease.lease_time.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A DORA's frames split the task's time at the first DISCOVER and at
    /// the REQUEST; a retransmitted DISCOVER stays in the offer phase.
    #[test]
    fn a_dora_is_split_at_its_first_discover_and_its_request() {
        let t0 = Instant::now();
        let mut c = ExchangeClock::new(t0);
        c.sent(MessageKind::Discover, t0 + MS);
        c.sent(MessageKind::Discover, t0 + 5 * MS);
        c.sent(MessageKind::Request, t0 + 7 * MS);
        c.sent(MessageKind::Request, t0 + 8 * MS);
        let e = c.bound(t0 + 10 * MS, t0 + 11 * MS, t0 + 13 * MS);
        assert_eq!(
            e,
            Exchange {
                start: MS,
                offer: 6 * MS,
                ack: 3 * MS,
                durable: MS,
                apply: 2 * MS,
            }
        );
    }

    /// A NAK's restart (a DISCOVER after a REQUEST) puts the first
    /// exchange's REQUEST and its answer into the offer phase.
    #[test]
    fn a_restart_after_a_nak_counts_toward_the_offer() {
        let t0 = Instant::now();
        let mut c = ExchangeClock::new(t0);
        c.sent(MessageKind::Discover, t0 + MS);
        c.sent(MessageKind::Request, t0 + 2 * MS);
        c.sent(MessageKind::Discover, t0 + 60 * MS);
        c.sent(MessageKind::Request, t0 + 62 * MS);
        let e = c.bound(t0 + 63 * MS, t0 + 63 * MS, t0 + 63 * MS);
        assert_eq!(
            (e.start, e.offer, e.ack, e.apply),
            (MS, 61 * MS, MS, Duration::ZERO)
        );
    }

    /// A DHCPv6 exchange splits as a DORA does: at the first SOLICIT and
    /// at the REQUEST for the ADVERTISE taken; RENEWs and the like go in
    /// no phase of their own.
    #[test]
    fn a_dhcpv6_exchange_is_split_at_its_first_solicit_and_its_request() {
        let t0 = Instant::now();
        let mut c = ExchangeClock::new(t0);
        c.sent6(v6::MessageKind::Solicit, t0 + 2 * MS);
        c.sent6(v6::MessageKind::Solicit, t0 + 4 * MS);
        c.sent6(v6::MessageKind::Request, t0 + 6 * MS);
        c.sent6(v6::MessageKind::Renew, t0 + 7 * MS);
        let e = c.bound(t0 + 9 * MS, t0 + 9 * MS, t0 + 10 * MS);
        assert_eq!(
            (e.start, e.offer, e.ack, e.durable, e.apply),
            (2 * MS, 4 * MS, 3 * MS, Duration::ZERO, MS)
        );
    }

    /// With Rapid Commit the SOLICIT's REPLY binds: the wait for it is the
    /// ack, and there is no offer phase.
    #[test]
    fn a_rapid_commit_exchange_has_no_offer_phase() {
        let t0 = Instant::now();
        let mut c = ExchangeClock::new(t0);
        c.sent6(v6::MessageKind::Solicit, t0 + MS);
        let e = c.bound(t0 + 4 * MS, t0 + 4 * MS, t0 + 4 * MS);
        assert_eq!((e.start, e.offer, e.ack), (MS, Duration::ZERO, 3 * MS));
    }

    /// An INIT-REBOOT sends a REQUEST first: no offer phase.
    #[test]
    fn an_init_reboot_has_no_offer_phase() {
        let t0 = Instant::now();
        let mut c = ExchangeClock::new(t0);
        c.sent(MessageKind::Request, t0 + 2 * MS);
        let e = c.bound(t0 + 3 * MS, t0 + 3 * MS, t0 + 3 * MS);
        assert_eq!((e.start, e.offer, e.ack), (2 * MS, Duration::ZERO, MS));
    }
}
