//! The lease actor: one tokio task per attachment drives the sans-IO engine
//! with tokio time against the lease's port ([`crate::datapath::port`]:
//! frames out, replies and changes of path in — which socket, ring or
//! uplink serves it is the port's business), has every lease change
//! persisted and the address applied when asked (as effects a store writer
//! and an applier carry out: [`crate::lease::effects`]), and ends on DEL,
//! on interface removal, or (one-shot VM discovery) at BOUND.
//!
//! One thing: the lease's event loop and the handlers of its inputs.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info, warn};
use xdhcp_engine::{
    AcquireError, Client, Event, Heard, Lease, LostReason, Mode, PacketSource, State,
};

use crate::datapath::RxFrame;
use crate::datapath::capture::CapturePath;
use crate::datapath::link::LinkError;
use crate::datapath::port::{Input, LeasePort, Port};
use crate::lease::effects::{Effect, Effects};
use crate::lease::live::{Command, EngineState, Exchange, ExchangeClock, Live, Outcome};
use crate::lease::persist::{Durable, LeaseRecord, WorkloadKind};
pub(crate) use crate::lease::services::Services;
use crate::sys::clock::now_unix_ms;
use crate::sys::sync::lock;

/// How a maintained lease waits before trying again after an acquisition
/// failed with nobody waiting on it (a resumed lease).
const REACQUIRE_DELAY: Duration = Duration::from_secs(10);

/// Everything a lease task owns.
pub(crate) struct Task<P: LeasePort = Port> {
    pub(crate) svc: Arc<Services>,
    /// Who carries out what the task asks of the world: the store writer
    /// and the applier (`svc`, but for a test).
    pub(crate) effects: Arc<dyn Effects>,
    pub(crate) client: Client,
    /// Where the lease's frames go out and its replies come in.
    pub(crate) port: P,
    pub(crate) live: Arc<Mutex<Live>>,
    pub(crate) cmds: mpsc::Receiver<Command>,
    pub(crate) waiter: Option<oneshot::Sender<Outcome>>,
    pub(crate) started: Instant,
    /// Where the first acquisition's time goes, for the ADD waiting on it.
    pub(crate) clock: ExchangeClock,
    /// Whether the first lease is on disk.
    pub(crate) persisted: watch::Sender<Durable>,
    /// The record written while an ADD's first REQUEST is out.
    pub(crate) ahead: Option<Ahead>,
    /// The xid of the reply the engine last took: the transaction a
    /// `renewed` line names. Not `Client::xid` once the events are read:
    /// an ACK that finds the lease already past its new T1 (a transaction
    /// answered late, an adopted one counted from when it may have left)
    /// opens the next renewal at once, under a new xid.
    pub(crate) answered: Option<u32>,
}

/// A record written ahead of the first ACK: it names the address the
/// REQUEST is out for, so a restart that finds it asks for that address
/// again (INIT-REBOOT). The disk's `fsync`s run while the server answers,
/// instead of between the ACK and the ADD's answer.
pub(crate) struct Ahead {
    address: std::net::Ipv4Addr,
    write: tokio::task::JoinHandle<Durable>,
}

/// How a task ended, for the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The record stays known (shutdown, stopped by a command, one-shot).
    Kept,
    /// The interface is gone: forget the attachment and its record.
    Gone,
    /// The interface is gone but the lease is held and its uplink known:
    /// keep the record (no task) so DEL can still RELEASE it there.
    Parked,
}

impl<P: LeasePort> Task<P> {
    fn record(&self) -> LeaseRecord {
        lock(&self.live).record.clone()
    }

    /// Persist off the runtime's worker threads (the store fsyncs); what
    /// became of the write.
    async fn persist_async(&self) -> Durable {
        self.carry(Effect::Persist(Box::new(self.record()))).await
    }

    /// The full record after the ADD answered on the one written ahead.
    async fn persist_full_after_answer(&self) {
        #[cfg(feature = "test-hooks")]
        // Tests: a kill between the ADD's answer and the full record.
        tokio::time::sleep(crate::sys::test_delay::from_env(
            "XDHCP_TEST_FULL_RECORD_DELAY_MS",
        ))
        .await;
        self.persist_async().await;
    }

    /// [`Task::persist_async`] for the record an ADD's answer waits for: in
    /// place when this returns, durable moments later.
    async fn persist_visible(&self) -> Durable {
        self.carry(Effect::PersistVisible(Box::new(self.record())))
            .await
    }

    /// Have `effect` carried out, and wait for it.
    async fn carry(&self, effect: Effect) -> Durable {
        self.svc.settled(self.effects.clone().start(effect)).await
    }

    /// While an ADD waits for its first lease: once the REQUEST for an
    /// offered address is out, write the record naming that address in the
    /// background (after any earlier one: one write per record at a time).
    async fn write_ahead(&mut self) {
        let Some(address) = self.client.requesting() else {
            return;
        };
        if self.waiter.is_none() || self.ahead.as_ref().is_some_and(|a| a.address == address) {
            return;
        }
        self.settle_ahead().await;
        let mut rec = self.record();
        rec.requested = Some(address);
        rec.requested_from = self.client.requesting_from();
        let write = self
            .effects
            .clone()
            .start(Effect::PersistVisible(Box::new(rec)));
        self.ahead = Some(Ahead { address, write });
    }

    /// Tell the ADD waiting for the first lease (if one still is) how it
    /// went.
    fn tell(
        &mut self,
        applied: Result<(), Arc<crate::netlink::NetlinkError>>,
        lease: &Lease,
        exchange: Exchange,
    ) {
        if let Some(w) = self.waiter.take() {
            let _ = w.send(match applied {
                Ok(()) => Outcome::Bound(lease.clone(), exchange),
                Err(e) => Outcome::ApplyFailed(e),
            });
        }
    }

    /// Whether the agent configures the lease on the interface: `apply`
    /// asked, on a pod's interface in a namespace (a VM's address belongs
    /// to the guest).
    fn configures(&self) -> bool {
        let l = lock(&self.live);
        l.record.network.ipam.apply
            && !matches!(l.record.workload, WorkloadKind::Vm { .. })
            && self.port.netns().is_some()
    }

    /// Wait for the write ahead, if one is out: the address it recorded,
    /// and whether it is on disk.
    async fn settle_ahead(&mut self) -> Option<(std::net::Ipv4Addr, Durable)> {
        let ahead = self.ahead.take()?;
        Some((ahead.address, self.svc.settled(ahead.write).await))
    }

    /// Persist now, on this thread (the task's last steps).
    fn persist(&self) {
        self.effects
            .clone()
            .now(Effect::Persist(Box::new(self.record())));
    }

    fn set_state(&self, state: State) {
        let mut l = lock(&self.live);
        let state = EngineState::V4(state);
        if l.state != state {
            self.svc
                .metrics
                .lease_state(Some(l.state.metric()), Some(state.metric()));
            l.state = state;
        }
    }

    /// The lease as it is now, with the xids its next renewal and
    /// rebinding will carry (written with it: a restarted agent adopts the
    /// one it finds sent).
    fn set_lease(&self, lease: Option<Lease>) {
        let planned = lease.as_ref().and(self.client.planned_xids());
        let mut l = lock(&self.live);
        l.set_lease(lease);
        l.record.planned_xids = planned;
    }

    fn set_path(&self, path: CapturePath) {
        lock(&self.live).capture = path;
    }

    /// The capture moved the lease to `path`. A renewal in flight is asked
    /// for again now on the new path, not at its next retransmission a
    /// minute away: on a fallback, the path was lost before the agent
    /// noticed (a link detached, a full ring) and its reply may have gone to
    /// the pod's stack meanwhile; on a move to the ring buffer, its reply
    /// may have crossed the switch (a restarted agent taking the previous
    /// one's pinned links over while the lease waits on its own receiver).
    ///
    /// Not for a transaction adopted from the previous agent, on a move to
    /// the ring: its xid stayed owned in the kernel all along, so its reply
    /// was kept in the ring for this lease, not lost.
    fn moved_to(&mut self, path: CapturePath) {
        let kept = self.client.adopted().is_some() && path != CapturePath::AfPacketFallback;
        if path != CapturePath::AfPacketPending && !kept {
            self.client.retransmit_now(Instant::now());
        }
        self.set_path(path);
    }
}

/// Run the task to its end.
///
/// Every held lease keeps this future resident, so its state sits in one
/// heap box and the rarely taken long awaits (address configuration, the
/// end of the task) are boxed where they happen (see
/// `docs/performance-notes.md`).
pub(crate) fn run<P: LeasePort>(task: Task<P>) -> impl Future<Output = Ended> + Send {
    drive(Box::new(task))
}

#[tracing::instrument(skip_all, fields(container = %lock(&task.live).record.container_id, ifname = %task.port.ifname()))]
async fn drive<P: LeasePort>(mut task: Box<Task<P>>) -> Ended {
    let token = task.svc.token.clone();
    let oneshot = task.client.config().mode == Mode::OneShot;
    let mut stop_ack: Option<oneshot::Sender<()>> = None;
    let mut reacquire_at: Option<Instant> = None;
    // Maintained leases end as soon as their interface is deleted (pod gone,
    // or the main plugin's DEL removed it first), not at the next send: the
    // link's removal watch, subscribed when the link was opened.
    if oneshot {
        task.port.drop_watch();
    }
    let end_reason;
    loop {
        // Outputs first: frames to send, then events.
        if let Err(e) = flush(&mut task).await {
            end_reason = End::Link(e);
            break;
        }
        if let Some(end) = drain_events(&mut task, oneshot, &mut reacquire_at).await {
            end_reason = end;
            break;
        }
        if !oneshot {
            task.write_ahead().await;
        }
        task.set_state(task.client.state());
        // A held lease asks for the ring buffer (one-shot discoveries end at
        // BOUND: nothing to move); one resumed on its uplink follows that.
        if !oneshot && task.client.lease().is_some() {
            match task.port.take_ring().await {
                Ok(Some(path)) => task.set_path(path),
                Ok(None) => {}
                Err(e) => {
                    end_reason = End::Link(e);
                    break;
                }
            }
        }
        if !task.client.state().expects_reply() {
            task.port.release_xid();
        }
        // Bound with nothing to send until T1: hold no packet socket.
        if !oneshot && task.client.state() == State::Bound {
            task.port.idle_tx();
        }
        let deadline = match (task.client.poll_timeout(), reacquire_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = token.cancelled() => {
                end_reason = End::Shutdown;
                break;
            }
            cmd = task.cmds.recv() => match cmd {
                Some(Command::Stop { release, ack }) => {
                    stop_ack = Some(ack);
                    end_reason = if release { End::Release } else { End::Forget };
                    break;
                }
                // All handles dropped: the agent forgot us.
                None => {
                    end_reason = End::Forget;
                    break;
                }
            },
            input = task.port.next() => match input {
                Ok(Input::Frame(f)) => handle_frame(&mut task, &f),
                Ok(Input::CaptureChanged) => match task.port.follow_capture().await {
                    Ok(Some(path)) => task.moved_to(path),
                    Ok(None) => {}
                    Err(e) => {
                        end_reason = End::Link(e);
                        break;
                    }
                },
                Ok(Input::Removed) => {
                    end_reason = End::Removed;
                    break;
                }
                Err(e) => {
                    end_reason = End::Link(e);
                    break;
                }
            },
            () = sleep => {
                let now = Instant::now();
                task.client.set_wall_clock_unix_ms(now_unix_ms());
                if reacquire_at.is_some_and(|r| r <= now) {
                    reacquire_at = None;
                    task.client.restart(now);
                } else {
                    task.client.handle_timeout(now);
                }
            }
        }
    }
    end(&mut task, end_reason, stop_ack).await
}

/// The task's last steps: [`finish`], then the RELEASE's second copy if
/// one went.
async fn end<P: LeasePort>(
    task: &mut Task<P>,
    end: End,
    stop_ack: Option<oneshot::Sender<()>>,
) -> Ended {
    // A record written ahead lands before whatever ends the task removes
    // or rewrites it.
    task.settle_ahead().await;
    let (ended, again) = finish(task, end, stop_ack);
    if !again.is_empty() {
        release_again(task, &again).await;
    }
    ended
}

/// The shortest and longest wait before a RELEASE goes out a second time.
const RELEASE_AGAIN_MS: std::ops::RangeInclusive<u64> = 500..=1500;

/// How long a RELEASE waits before its copy goes out: a draw from
/// [`RELEASE_AGAIN_MS`], so a burst of DELs does not send its copies in one
/// burst too.
pub(crate) fn release_again_delay() -> Duration {
    let (low, high) = (*RELEASE_AGAIN_MS.start(), *RELEASE_AGAIN_MS.end());
    Duration::from_millis(low + crate::sys::clock::seed() % (high - low + 1))
}

/// Send the RELEASE `again` once more, a moment after the first (the DEL
/// was answered already: it waits for the first copy only).
///
/// A server answers no DHCPRELEASE (RFC 2131 §4.4.6), so the client never
/// learns that one arrived; a server whose socket overflows under a burst
/// (hundreds of DELs and renewals at once) drops it and keeps the lease
/// until it expires. The copy is the same message, under the same xid (the
/// client's choice for the transaction, RFC 2131 §4.4.6): a server that
/// had the first holds no lease for it any more and ignores it. At shutdown
/// the copy goes at once. When the pod's interface or namespace is gone by
/// then, the port sends it through the uplink the lease's replies came by,
/// as a DEL after the interface went does.
async fn release_again<P: LeasePort>(task: &mut Task<P>, again: &[xdhcp_engine::Transmit]) {
    tokio::select! {
        () = tokio::time::sleep(release_again_delay()) => {}
        () = task.svc.token.cancelled() => {}
    }
    for t in again {
        match task.port.send_release(t) {
            Ok(()) => debug!(xid = t.xid, "RELEASE sent again"),
            Err(e) => {
                task.svc.metrics.failure("release_again");
                debug!(error = %crate::rpc::format_chain(&e), "the RELEASE's second copy could not be sent");
            }
        }
    }
}

enum End {
    Shutdown,
    Release,
    Forget,
    Link(LinkError),
    /// The interface was deleted (netlink `RTM_DELLINK`).
    Removed,
    /// One-shot discovery finished (VM) or acquisition failed for an ADD.
    Done,
}

/// Send what the engine has to send through the port.
async fn flush<P: LeasePort>(task: &mut Task<P>) -> Result<(), LinkError> {
    let mut out = Vec::new();
    while let Some(t) = task.client.poll_transmit() {
        out.push(t);
    }
    let kinds: Vec<_> = if task.waiter.is_some() {
        out.iter().map(|t| t.kind).collect()
    } else {
        Vec::new()
    };
    let sent = task.port.send(out).await;
    // A send may move the lease's receiver (an xid the kernel would not
    // own sends it to its own `AF_PACKET` receiver, and back).
    let path = task.port.path();
    if lock(&task.live).capture != *path {
        task.set_path(path.clone());
    }
    let now = Instant::now();
    for kind in kinds {
        task.clock.sent(kind, now);
    }
    sent
}

fn handle_frame<P: LeasePort>(task: &mut Task<P>, f: &RxFrame) {
    // A reply through an uplink moves the lease there for good: its
    // record names the uplink (a restart resumes it there).
    if let Some(uplink) = task.port.on_reply(f) {
        let mut l = lock(&task.live);
        l.record.uplink = Some(uplink);
        l.capture = task.port.path().clone();
    }
    let now = Instant::now();
    let src = PacketSource {
        src_mac: f.headers.src_mac,
        src_ip: f.headers.src_ip,
    };
    task.client.set_wall_clock_unix_ms(now_unix_ms());
    tracing::trace!(via = ?f.via, src = %f.headers.src_ip, len = f.payload.len(), "reply");
    let xid = task.client.xid();
    let was_bound = task.client.state() == State::Bound;
    match task.client.handle_packet(now, src, &f.payload) {
        Ok(()) => {
            task.answered = Some(xid);
            if !was_bound && task.client.state() == State::Bound {
                task.port.bound_by(f);
            }
        }
        Err(reason) => {
            task.svc.metrics.dropped(reason.label(), 1);
            debug!(reason = reason.label(), src = %f.headers.src_ip, "reply dropped");
        }
    }
    // Optional options the engine dropped as malformed (the lease went on).
    for (option, n) in task.client.take_malformed_options() {
        task.svc.metrics.malformed_option(option.label(), n);
    }
}

async fn drain_events<P: LeasePort>(
    task: &mut Task<P>,
    oneshot: bool,
    reacquire_at: &mut Option<Instant>,
) -> Option<End> {
    while let Some(ev) = task.client.poll_event() {
        match ev {
            Event::Bound(lease) => {
                let secs = task.started.elapsed().as_secs_f64();
                task.svc.metrics.dora(secs);
                let path = lock(&task.live).capture.metric_label();
                task.svc.metrics.bound_by_path(path);
                let xid = task.answered.take().unwrap_or_else(|| task.client.xid());
                info!(address = %lease.address, prefix = lease.prefix_len, server = %lease.server_id,
                    lease_secs = lease.lease_time.as_secs(), ms = (secs * 1000.0) as u64, xid, "bound");
                log_rejected(&lease);
                let bound_at = Instant::now();
                task.set_lease(Some(lease.clone()));
                task.set_state(task.client.state());
                // An ADD's lease the agent does not configure is told to the
                // ADD now, while its record is still being written (the
                // one written ahead while the REQUEST was out is most often
                // still out: the ACK comes within a millisecond): the ADD
                // writes the `pod-networks` entry meanwhile, and answers
                // only once `persisted` says the record is in place.
                if !oneshot && !task.configures() {
                    let exchange = task.clock.bound(bound_at, bound_at, Instant::now());
                    task.tell(Ok(()), &lease, exchange);
                }
                // Nothing goes on the interface that a restart would not
                // know of: the record naming the address is in place first
                // (the one written ahead, else the full one), for the next
                // agent to read; the store makes it durable moments later.
                // A crash between the two would leave an address no
                // record, and so no DEL, takes off the pod, where the
                // server gives it to another once the lease runs out.
                let ahead = matches!(task.settle_ahead().await,
                    Some((address, Durable::Saved)) if address == lease.address);
                let durable = if ahead {
                    Durable::Saved
                } else {
                    task.persist_visible().await
                };
                let recorded_at = Instant::now();
                let applied = Box::pin(apply_if_asked(task, &lease, How::Configure)).await;
                let exchange = task.clock.bound(bound_at, recorded_at, Instant::now());
                debug!(
                    start_us = exchange.start.as_micros(),
                    offer_us = exchange.offer.as_micros(),
                    ack_us = exchange.ack.as_micros(),
                    durable_us = exchange.durable.as_micros(),
                    apply_us = exchange.apply.as_micros(),
                    "first exchange"
                );
                // An ADD not told yet is told now; either way it answers
                // only once `persisted` is set.
                task.tell(applied, &lease, exchange);
                task.persisted.send_replace(durable);
                // Written ahead with this address: the full record follows.
                if ahead {
                    task.persist_full_after_answer().await;
                }
                if oneshot {
                    return Some(End::Done);
                }
            }
            Event::Renewed(lease) => {
                task.svc.metrics.renewal();
                let xid = task.answered.take().unwrap_or_else(|| task.client.xid());
                info!(address = %lease.address, server = %lease.server_id,
                    lease_secs = lease.lease_time.as_secs(), xid, "renewed");
                task.set_lease(Some(lease.clone()));
                // A failed write is logged and counted; the previous record
                // stays on disk, whole, and the next change writes again.
                task.persist_async().await;
                // With `apply`, every renewal puts back what the interface
                // lacks of the lease's configuration (read first; a
                // configured interface is not written to): the kernel
                // flushes a link's routes when it is taken down, and
                // nothing else would restore them.
                let _ = Box::pin(apply_if_asked(task, &lease, How::Repair)).await;
            }
            Event::Changed { old, new } => {
                task.svc.metrics.renewal();
                let xid = task.answered.take().unwrap_or_else(|| task.client.xid());
                warn!(old = %old.address, new = %new.address, xid, "lease parameters changed; renewed");
                log_rejected(&new);
                task.set_lease(Some(new.clone()));
                task.persist_async().await;
                // Another address (or prefix) replaces the old one on the
                // interface, never joins it.
                if moved(&old, &new) {
                    Box::pin(unapply_if_asked(task, &old)).await;
                }
                // No ADD waits here: a failure is logged and counted.
                let _ = Box::pin(apply_if_asked(task, &new, How::Configure)).await;
            }
            Event::Lost { reason } => {
                task.svc.metrics.failure(lost_label(reason));
                warn!(reason = reason.label(), "lease lost; acquiring again");
                let old = lock(&task.live).record.lease.clone();
                if let Some(lease) = old {
                    Box::pin(unapply_if_asked(task, &lease)).await;
                }
                task.set_lease(None);
                task.persist_async().await;
                task.started = Instant::now();
            }
            Event::Nak { server, message } => {
                task.svc.metrics.nak();
                info!(%server, message = message.as_deref().unwrap_or(""), "DHCPNAK");
            }
            Event::Failed(err) => {
                task.svc.metrics.failure(acquire_label(&err));
                if let Some(w) = task.waiter.take() {
                    let _ = w.send(Outcome::Failed(err));
                    return Some(End::Done);
                }
                warn!(error = %err, retry_in_s = REACQUIRE_DELAY.as_secs(), "could not reacquire the lease");
                *reacquire_at = Some(Instant::now() + REACQUIRE_DELAY);
            }
        }
    }
    None
}

/// The failure label of a lost lease.
fn lost_label(reason: LostReason) -> &'static str {
    match reason {
        LostReason::Expired => "lease_expired",
        LostReason::Nak { .. } => "lease_nak",
        LostReason::Declined => "lease_declined",
    }
}

/// The failure label of an acquisition that ended without a lease.
fn acquire_label(err: &AcquireError) -> &'static str {
    match err.heard() {
        Heard::Nak => "acquire_nak",
        Heard::OffersWithoutAck => "acquire_no_ack",
        Heard::InvalidReplies => "acquire_invalid_replies",
        Heard::Nothing => "acquire_no_reply",
    }
}

fn log_rejected(lease: &Lease) {
    for r in &lease.rejected_routes {
        warn!(route = ?r, "option-121 route refused by policy");
    }
}

/// Take `lease`'s address and routes off the pod interface (`"apply":
/// true`).
async fn unapply_if_asked<P: LeasePort>(task: &Task<P>, lease: &Lease) {
    let (apply, metric) = {
        let l = lock(&task.live);
        let ipam = &l.record.network.ipam;
        (ipam.apply, ipam.route_priority)
    };
    let Some(netns) = task.port.netns().map(std::path::Path::to_path_buf) else {
        return;
    };
    if !apply {
        return;
    }
    task.carry(Effect::Unapply {
        netns,
        ifname: task.port.ifname().to_owned(),
        lease: lease.clone(),
        metric,
    })
    .await;
}

/// Whether `new` puts another address, or the same with another prefix,
/// on the interface than `old` did.
fn moved(old: &Lease, new: &Lease) -> bool {
    old.address != new.address || old.prefix_len != new.prefix_len
}

/// How [`apply_if_asked`] configures a lease.
#[derive(Debug, Clone, Copy)]
enum How {
    /// All of it, taken off again if a step fails ([`Effect::Apply`]).
    Configure,
    /// Only what the interface lacks ([`Effect::Repair`]).
    Repair,
}

/// Configure the lease on the interface when the network asks for it
/// (`"apply": true`); a failure is logged, counted and returned (the first
/// lease's ADD fails with it).
async fn apply_if_asked<P: LeasePort>(
    task: &Task<P>,
    lease: &Lease,
    how: How,
) -> Result<(), Arc<crate::netlink::NetlinkError>> {
    if !task.configures() {
        return Ok(());
    }
    let metric = lock(&task.live).record.network.ipam.route_priority;
    let Some(netns) = task.port.netns().map(std::path::Path::to_path_buf) else {
        return Ok(());
    };
    let (ifname, lease) = (task.port.ifname().to_owned(), lease.clone());
    let done = task.effects.clone().address(match how {
        How::Configure => Effect::Apply {
            netns,
            ifname,
            lease,
            metric,
        },
        How::Repair => Effect::Repair {
            netns,
            ifname,
            lease,
            metric,
        },
    });
    match done.await {
        Ok(applied) => applied,
        Err(e) => {
            warn!(error = %e, "the task configuring the leased address failed");
            Ok(())
        }
    }
}

/// End the task: what became of the attachment, and the RELEASEs sent
/// (to go once more: [`release_again`]). Whoever waits on the stop is
/// answered here.
fn finish<P: LeasePort>(
    task: &mut Task<P>,
    end: End,
    stop_ack: Option<oneshot::Sender<()>>,
) -> (Ended, Vec<xdhcp_engine::Transmit>) {
    let rec = task.record();
    let mut ended = Ended::Kept;
    let mut sent = Vec::new();
    match end {
        End::Shutdown => {
            // Persist and keep the lease: a restart resumes it.
            task.persist();
            if let Some(w) = task.waiter.take() {
                let _ = w.send(Outcome::Cancelled);
            }
        }
        End::Release => {
            task.client.set_wall_clock_unix_ms(now_unix_ms());
            task.client.release(Instant::now());
            while let Some(t) = task.client.poll_transmit() {
                match task.port.send_release(&t) {
                    Ok(()) => {
                        if rec.lease.is_some() {
                            info!("released");
                        }
                        sent.push(t);
                    }
                    Err(e) => warn!(error = %e, "RELEASE could not be sent"),
                }
            }
        }
        End::Forget | End::Done => {}
        End::Removed if parkable(&rec) => {
            info!(uplink = ?rec.uplink.as_ref().map(|u| &u.ifname),
                "interface removed; the lease is kept until DEL, which releases it through the uplink");
            ended = Ended::Parked;
        }
        End::Removed => {
            info!("interface removed; the lease ends here (no RELEASE possible)");
            if let Some(w) = task.waiter.take() {
                let _ = w.send(Outcome::Removed);
            }
            ended = Ended::Gone;
        }
        End::Link(e) => {
            if e.is_interface_gone() && parkable(&rec) {
                info!(error = %e, "interface removed; the lease is kept until DEL, which releases it through the uplink");
                ended = Ended::Parked;
            } else if e.is_interface_gone() {
                info!(error = %e, "interface removed; the lease ends here (no RELEASE possible)");
                ended = Ended::Gone;
            } else {
                warn!(error = %e, "link failure; the lease ends here");
            }
            if let Some(w) = task.waiter.take() {
                let _ = w.send(Outcome::LinkFailed(e));
            }
        }
    }
    // The path that served the lease stays in its view (a finished one-shot
    // discovery reports how it was captured).
    task.port.close();
    if ended == Ended::Gone {
        task.effects.clone().now(Effect::Remove {
            container_id: rec.container_id.clone(),
            ifname: rec.ifname.clone(),
            family: rec.lease_family,
        });
    }
    if ended == Ended::Parked {
        // The record names the uplink (a restart finds it too).
        task.persist();
        task.set_path(CapturePath::Idle);
    }
    let state = lock(&task.live).state;
    task.svc.metrics.lease_state(Some(state.metric()), None);
    if let Some(a) = stop_ack {
        let _ = a.send(());
    }
    (ended, sent)
}

/// Whether a lease whose interface is gone can still be released at DEL: a
/// pod's held lease whose replies came through an uplink.
fn parkable(rec: &LeaseRecord) -> bool {
    rec.lease.is_some() && rec.uplink.is_some() && rec.workload == WorkloadKind::Pod
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::port::is_transient_send_error;

    /// The lease task against a fake port: no socket, namespace or root.
    mod against_a_fake_port {
        use std::net::Ipv4Addr;

        use dhcproto::v4::{
            Decodable as _, Decoder, DhcpOption, Encodable as _, Encoder, Message, MessageType,
            Opcode,
        };
        use xdhcp_engine::{ClientConfig, MessageKind, Transmit};

        use super::*;
        use tokio_util::sync::CancellationToken;

        use crate::datapath::RxPath;
        use crate::datapath::capture::Capture;
        use crate::datapath::frame::FrameHeaders;
        use crate::metrics::Health;
        use crate::metrics::Metrics;
        use crate::model::UplinkRef;
        use crate::rpc::CniRequest;
        use crate::store::LeaseKey;

        const MAC: [u8; 6] = [2, 0, 0, 0, 0, 7];
        const SERVER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
        const ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 50);

        /// A port that hands the test every frame the task sends and gives
        /// the task the replies the test queues.
        struct FakePort {
            sent: mpsc::UnboundedSender<Transmit>,
            replies: mpsc::UnboundedReceiver<RxFrame>,
            path: CapturePath,
            /// A namespace path only named (never entered: [`Noting`]
            /// carries out no address change).
            netns: Option<std::path::PathBuf>,
            /// The Ethernet source of each reply the task said bound it.
            bound_by: Arc<Mutex<Vec<[u8; 6]>>>,
        }

        impl LeasePort for FakePort {
            #[expect(
                clippy::unnecessary_literal_bound,
                reason = "the trait's signature: a real port lends its link's name"
            )]
            fn ifname(&self) -> &str {
                "eth0"
            }
            fn netns(&self) -> Option<&std::path::Path> {
                self.netns.as_deref()
            }
            fn drop_watch(&mut self) {}
            fn idle_tx(&mut self) {}
            fn path(&self) -> &CapturePath {
                &self.path
            }
            async fn take_ring(&mut self) -> Result<Option<CapturePath>, LinkError> {
                Ok(None)
            }
            async fn follow_capture(&mut self) -> Result<Option<CapturePath>, LinkError> {
                Ok(None)
            }
            async fn next(&mut self) -> Result<Input, LinkError> {
                match self.replies.recv().await {
                    Some(f) => Ok(Input::Frame(f)),
                    None => std::future::pending().await,
                }
            }
            fn on_reply(&mut self, _: &RxFrame) -> Option<UplinkRef> {
                None
            }
            fn bound_by(&mut self, f: &RxFrame) {
                lock(&self.bound_by).push(f.headers.src_mac);
            }
            async fn send(&mut self, out: Vec<Transmit>) -> Result<(), LinkError> {
                for t in out {
                    let _ = self.sent.send(t);
                }
                Ok(())
            }
            fn send_release(&mut self, t: &Transmit) -> Result<(), LinkError> {
                let _ = self.sent.send(t.clone());
                Ok(())
            }
            fn release_xid(&mut self) {}
            fn close(&mut self) {}
        }

        /// A carrier that notes every effect the task asks for and has the
        /// real store writer and applier carry it out.
        #[derive(Debug)]
        struct Noting {
            real: Arc<Services>,
            seen: Mutex<Vec<Effect>>,
            /// The address the record on disk named at each address change.
            on_disk_at_address: Mutex<Vec<Option<Ipv4Addr>>>,
        }

        impl Effects for Noting {
            /// A write lands 30 ms late (a slow disk): what waits for it
            /// shows, what does not is caught.
            fn start(self: Arc<Self>, effect: Effect) -> tokio::task::JoinHandle<Durable> {
                lock(&self.seen).push(effect.clone());
                let real = self.real.clone();
                tokio::spawn(async move {
                    if matches!(effect, Effect::Persist(_) | Effect::PersistVisible(_)) {
                        tokio::time::sleep(Duration::from_millis(30)).await;
                    }
                    real.start(effect).await.expect("the write task")
                })
            }
            fn now(self: Arc<Self>, effect: Effect) -> Durable {
                lock(&self.seen).push(effect.clone());
                self.real.clone().now(effect)
            }
            /// Notes the change and what the disk held at that moment; makes
            /// none (the namespace is only a name).
            fn address(
                self: Arc<Self>,
                effect: Effect,
            ) -> tokio::task::JoinHandle<Result<(), Arc<crate::netlink::NetlinkError>>>
            {
                let on_disk = self
                    .real
                    .store
                    .load(&LeaseKey::new("c1", "eth0").unwrap())
                    .unwrap()
                    .and_then(|r| r.lease.map(|l| l.address).or(r.requested));
                lock(&self.on_disk_at_address).push(on_disk);
                lock(&self.seen).push(effect);
                tokio::spawn(async { Ok(()) })
            }
        }

        /// The server's `ty` answer to the client's message `to`.
        fn reply(to: &Transmit, ty: MessageType) -> RxFrame {
            let req = Message::decode(&mut Decoder::new(&to.payload)).unwrap();
            let mut m = Message::new_with_id(
                req.xid(),
                Ipv4Addr::UNSPECIFIED,
                ADDR,
                Ipv4Addr::UNSPECIFIED,
                Ipv4Addr::UNSPECIFIED,
                req.chaddr(),
            );
            m.set_opcode(Opcode::BootReply);
            let o = m.opts_mut();
            o.insert(DhcpOption::MessageType(ty));
            o.insert(DhcpOption::ServerIdentifier(SERVER));
            o.insert(DhcpOption::AddressLeaseTime(120));
            o.insert(DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)));
            let mut payload = Vec::new();
            m.encode(&mut Encoder::new(&mut payload)).unwrap();
            RxFrame {
                ifindex: 2,
                ts_ns: 0,
                headers: FrameHeaders {
                    src_mac: [2, 0, 0, 0, 0, 1],
                    dst_mac: MAC,
                    vlan: None,
                    src_ip: SERVER,
                    dst_ip: Ipv4Addr::BROADCAST,
                    src_port: 67,
                    dst_port: 68,
                },
                payload,
                via: RxPath::AfPacket,
            }
        }

        fn request(apply: bool) -> CniRequest {
            let text = r#"{"containerId":"c1","ifname":"eth0","netns":null,"args":{},"config":{
                    "cniVersion":"1.0.0","name":"localnet","socketPath":"/s","ipam":{
                    "ipamType":"xdhcp","apply":APPLY,"clientId":{"kind":"mac"},
                    "hostname":{"kind":"podname"},"allowDefaultRouteOverride":false,
                    "protectedPrefixes":[],"routePriority":null}}}"#;
            serde_json::from_str(&text.replace("APPLY", &apply.to_string())).unwrap()
        }

        /// A lease task on a [`FakePort`], and the test's ends of its
        /// channels: what it sends, the replies fed to it, its commands,
        /// whether its first lease is on disk.
        struct Harness {
            task: Task<FakePort>,
            live: Arc<Mutex<Live>>,
            sent: mpsc::UnboundedReceiver<Transmit>,
            replies: mpsc::UnboundedSender<RxFrame>,
            cmd_tx: mpsc::Sender<Command>,
            durable: watch::Receiver<Durable>,
            bound_by: Arc<Mutex<Vec<[u8; 6]>>>,
        }

        fn harness(
            svc: Arc<Services>,
            effects: Arc<dyn Effects>,
            client: Client,
            record: LeaseRecord,
            netns: Option<std::path::PathBuf>,
            waiter: Option<oneshot::Sender<Outcome>>,
        ) -> Harness {
            let live = Arc::new(Mutex::new(Live::new(
                record,
                client.state(),
                CapturePath::AfPacket,
            )));
            let (sent_tx, sent) = mpsc::unbounded_channel();
            let (replies, replies_rx) = mpsc::unbounded_channel();
            let (cmd_tx, cmds) = mpsc::channel(2);
            let (persisted, durable) = watch::channel(Durable::Pending);
            let bound_by = Arc::new(Mutex::new(Vec::new()));
            let task = Task {
                svc,
                effects,
                client,
                port: FakePort {
                    sent: sent_tx,
                    replies: replies_rx,
                    path: CapturePath::AfPacket,
                    netns,
                    bound_by: bound_by.clone(),
                },
                live: live.clone(),
                cmds,
                waiter,
                started: Instant::now(),
                clock: ExchangeClock::new(Instant::now()),
                persisted,
                ahead: None,
                answered: None,
            };
            Harness {
                task,
                live,
                sent,
                replies,
                cmd_tx,
                durable,
                bound_by,
            }
        }

        /// A pod's fresh lease task (`apply` as asked, its namespace only a
        /// name) whose effects `effects` carries out, with an ADD waiting
        /// for its first lease: the harness, and the ADD's end.
        fn pod_lease(
            svc: &Arc<Services>,
            effects: Arc<dyn Effects>,
            apply: bool,
        ) -> (Harness, oneshot::Receiver<Outcome>) {
            let config = ClientConfig {
                chaddr: MAC,
                ..ClientConfig::default()
            };
            let client = Client::new(config, Instant::now(), 7);
            let record = crate::ops::network::fresh_record(
                &request(apply),
                None,
                WorkloadKind::Pod,
                (MAC, crate::model::Family::Ipv4),
                None,
            );
            let (waiter, outcome) = oneshot::channel();
            let h = harness(
                svc.clone(),
                effects,
                client,
                record,
                Some("/var/run/netns/xdhcp-unit-test-pod".into()),
                Some(waiter),
            );
            (h, outcome)
        }

        /// A carrier whose record writes wait until the test opens `gate`
        /// (a disk as slow as the test wants); addresses it only pretends
        /// to configure.
        #[derive(Debug)]
        struct Held {
            real: Arc<Services>,
            gate: watch::Receiver<bool>,
        }

        impl Effects for Held {
            fn start(self: Arc<Self>, effect: Effect) -> tokio::task::JoinHandle<Durable> {
                let real = self.real.clone();
                let mut gate = self.gate.clone();
                tokio::spawn(async move {
                    if matches!(effect, Effect::Persist(_) | Effect::PersistVisible(_)) {
                        let _ = gate.wait_for(|open| *open).await;
                    }
                    real.start(effect).await.expect("the write task")
                })
            }
            fn now(self: Arc<Self>, effect: Effect) -> Durable {
                self.real.clone().now(effect)
            }
            fn address(
                self: Arc<Self>,
                _: Effect,
            ) -> tokio::task::JoinHandle<Result<(), Arc<crate::netlink::NetlinkError>>>
            {
                tokio::spawn(async { Ok(()) })
            }
        }

        /// Without `apply`, the ADD is told of its lease at the ACK, while
        /// the record naming it is still being written (it writes the
        /// `pod-networks` entry meanwhile, and answers only once
        /// `persisted` says the record is in place); with `apply`, only
        /// once the record is in place, since the address goes on the
        /// interface first.
        #[tokio::test]
        async fn without_apply_the_add_is_told_of_its_lease_while_the_record_is_written() {
            for apply in [false, true] {
                let dir = tempfile::tempdir().unwrap();
                let svc = services(dir.path());
                let (gate_tx, gate) = watch::channel(false);
                let held = Arc::new(Held {
                    real: svc.clone(),
                    gate,
                });
                let (h, mut outcome) = pod_lease(&svc, held, apply);
                let Harness {
                    task,
                    mut sent,
                    replies,
                    cmd_tx: _cmd_tx,
                    durable,
                    ..
                } = h;
                let _ended = tokio::spawn(run(task));
                let discover = sent.recv().await.unwrap();
                replies.send(reply(&discover, MessageType::Offer)).unwrap();
                let request = sent.recv().await.unwrap();
                assert_eq!(request.kind, MessageKind::Request);
                replies.send(reply(&request, MessageType::Ack)).unwrap();
                if apply {
                    let early =
                        tokio::time::timeout(Duration::from_millis(200), &mut outcome).await;
                    assert!(
                        early.is_err(),
                        "with apply, the ADD was told while its record was held"
                    );
                } else {
                    let told = tokio::time::timeout(Duration::from_secs(10), &mut outcome).await;
                    let Ok(Ok(Outcome::Bound(lease, _))) = told else {
                        panic!("the ADD was not told of its lease while its record was held");
                    };
                    assert_eq!(lease.address, ADDR);
                }
                assert!(
                    matches!(*durable.borrow(), Durable::Pending),
                    "apply={apply}: the record was said to be in place while its write was held"
                );
                gate_tx.send(true).unwrap();
                let mut durable = durable;
                durable
                    .wait_for(|d| matches!(d, Durable::Saved))
                    .await
                    .unwrap();
                if apply {
                    let Ok(Outcome::Bound(lease, _)) = outcome.await else {
                        panic!("with apply, the ADD was not told once the record was in place");
                    };
                    assert_eq!(lease.address, ADDR);
                }
            }
        }

        /// A maintained lease driven against the fake port (`apply` as
        /// asked, its namespace only a name): its DORA, the ADD told of the
        /// lease, its record on disk naming the address, and a RELEASE from
        /// that address when DEL stops it. What it asked of the world, and
        /// what the disk held at each address change.
        async fn drive(apply: bool) -> (Vec<Effect>, Vec<Option<Ipv4Addr>>) {
            let dir = tempfile::tempdir().unwrap();
            let svc = services(dir.path());
            let noting = Arc::new(Noting {
                real: svc.clone(),
                seen: Mutex::new(Vec::new()),
                on_disk_at_address: Mutex::new(Vec::new()),
            });
            let (
                Harness {
                    task,
                    live,
                    mut sent,
                    replies,
                    cmd_tx,
                    mut durable,
                    bound_by,
                },
                outcome,
            ) = pod_lease(&svc, noting.clone(), apply);
            let ended = tokio::spawn(run(task));

            let discover = sent.recv().await.unwrap();
            assert_eq!(discover.kind, MessageKind::Discover);
            replies.send(reply(&discover, MessageType::Offer)).unwrap();
            let request = sent.recv().await.unwrap();
            assert_eq!(request.kind, MessageKind::Request);
            assert_eq!(request.xid, discover.xid);
            // A forged ACK the engine drops (another transaction's, from
            // another MAC) binds nothing, so it names no server MAC for
            // the network's next DISCOVER; the server's own ACK does.
            let mut forged = reply(&request, MessageType::Ack);
            forged.payload[4] ^= 0xff;
            forged.headers.src_mac = [2, 0, 0, 0, 0, 0x66];
            replies.send(forged).unwrap();
            replies.send(reply(&request, MessageType::Ack)).unwrap();

            let Ok(Outcome::Bound(lease, _)) = outcome.await else {
                panic!("the ADD was not told of a lease");
            };
            assert_eq!(*lock(&bound_by), [[2, 0, 0, 0, 0, 1]]);
            assert_eq!((lease.address, lease.prefix_len), (ADDR, 24));
            durable
                .wait_for(|d| matches!(d, Durable::Saved))
                .await
                .unwrap();
            let on_disk = svc
                .store
                .load(&LeaseKey::new("c1", "eth0").unwrap())
                .unwrap()
                .expect("the record is on disk");
            // Durable as soon as the record written ahead (while the
            // REQUEST was out) names the address; the full one follows.
            assert_eq!(
                on_disk.lease.map(|l| l.address).or(on_disk.requested),
                Some(ADDR)
            );
            assert_eq!(lock(&live).state, EngineState::V4(State::Bound));

            let (ack, stopped) = oneshot::channel();
            cmd_tx
                .send(Command::Stop { release: true, ack })
                .await
                .unwrap();
            stopped.await.unwrap();
            let release = sent.recv().await.unwrap();
            assert_eq!(release.kind, MessageKind::Release);
            assert_eq!(release.src_ip, ADDR);
            assert!(matches!(ended.await.unwrap(), Ended::Kept));
            let seen = lock(&noting.seen).clone();
            let on_disk = lock(&noting.on_disk_at_address).clone();
            (seen, on_disk)
        }

        /// A log line's writer: every line into one shared buffer.
        #[derive(Clone, Default)]
        struct LogSink(Arc<Mutex<Vec<u8>>>);

        impl std::io::Write for LogSink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                lock(&self.0).extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }

        impl LogSink {
            /// Every line logged on this thread (at `info`) from now until
            /// the guard is dropped.
            fn set_default() -> (Self, tracing::subscriber::DefaultGuard) {
                let sink = Self::default();
                let writer = sink.clone();
                let subscriber = tracing_subscriber::fmt()
                    .with_writer(move || writer.clone())
                    .with_ansi(false)
                    .with_max_level(tracing::Level::INFO)
                    .finish();
                (sink, tracing::subscriber::set_default(subscriber))
            }
        }

        /// The services of a lease task on `AF_PACKET`, its store in `dir`.
        fn services(dir: &std::path::Path) -> Arc<Services> {
            let metrics = Arc::new(Metrics::new());
            Arc::new(Services {
                metrics: metrics.clone(),
                capture: Arc::new(Capture::af_packet(
                    None,
                    metrics,
                    Arc::new(Health::default()),
                )),
                store: crate::lease::persist::open(dir).unwrap(),
                token: CancellationToken::new(),
            })
        }

        /// A lease of `ADDR` from `SERVER` (2 min, T1 10 s, T2 100 s)
        /// acquired at `acquired_unix_ms`.
        fn held_lease(acquired_unix_ms: u64) -> Lease {
            Lease {
                address: ADDR,
                prefix_len: 24,
                server_id: SERVER,
                server_mac: None,
                routers: Vec::new(),
                routes: Vec::new(),
                dns_servers: Vec::new(),
                domain_name: None,
                search: Vec::new(),
                mtu: None,
                lease_time: Duration::from_mins(2),
                t1: Duration::from_secs(10),
                t2: Duration::from_secs(100),
                acquired_unix_ms,
                rejected_routes: Vec::new(),
            }
        }

        /// The server's ACK to transaction `xid`, with T1 and T2 of its own.
        fn ack(xid: u32, t1_secs: u32, t2_secs: u32) -> RxFrame {
            let request = Transmit {
                payload: {
                    let m = Message::new_with_id(
                        xid,
                        ADDR,
                        Ipv4Addr::UNSPECIFIED,
                        Ipv4Addr::UNSPECIFIED,
                        Ipv4Addr::UNSPECIFIED,
                        &MAC,
                    );
                    let mut p = Vec::new();
                    m.encode(&mut Encoder::new(&mut p)).unwrap();
                    p
                },
                xid,
                src_ip: ADDR,
                dst: xdhcp_engine::Destination::Broadcast,
                kind: MessageKind::Request,
            };
            let mut f = reply(&request, MessageType::Ack);
            let mut m = Message::decode(&mut Decoder::new(&f.payload)).unwrap();
            m.opts_mut().insert(DhcpOption::Renewal(t1_secs));
            m.opts_mut().insert(DhcpOption::Rebinding(t2_secs));
            f.payload.clear();
            m.encode(&mut Encoder::new(&mut f.payload)).unwrap();
            f
        }

        /// A renewal adopted from the previous agent long after it left
        /// (its REQUEST went unanswered there): the lease counts from when
        /// that REQUEST may have left, so the ACK finds it past its new T1
        /// and the next renewal goes out at once, under a new xid. The
        /// `renewed` line names the transaction the ACK answered — the one
        /// the server's log names — not the one just opened: read against
        /// the server's ACKs, a restart's renewals must not look lost.
        #[tokio::test]
        async fn a_renewal_answered_past_its_new_t1_is_logged_with_the_answered_xid() {
            let (sink, _log) = LogSink::set_default();

            let dir = tempfile::tempdir().unwrap();
            let svc = services(dir.path());
            let now = Instant::now();
            let now_ms = now_unix_ms();
            // Past T1 by 40 s: the previous agent's renewal left then.
            let lease = held_lease(now_ms - 50_000);
            let plan = xdhcp_engine::PlannedXids {
                renew: 0x0adb_0001,
                rebind: 0x0adb_0002,
            };
            let config = ClientConfig {
                chaddr: MAC,
                ..ClientConfig::default()
            };
            let mut client =
                Client::resume_planned(config, lease.clone(), Some(plan), now, now_ms, 9);
            assert!(client.adopt_sent(now, plan.renew, Duration::from_secs(3)));
            let mut record = crate::ops::network::fresh_record(
                &request(false),
                None,
                WorkloadKind::Pod,
                (MAC, crate::model::Family::Ipv4),
                None,
            );
            record.lease = Some(lease);
            record.planned_xids = Some(plan);
            let Harness {
                task,
                mut sent,
                replies,
                cmd_tx,
                ..
            } = harness(svc.clone(), svc.clone(), client, record, None, None);
            let ended = tokio::spawn(run(task));

            replies.send(ack(plan.renew, 10, 100)).unwrap();
            let next = sent.recv().await.unwrap();
            assert_eq!(next.kind, MessageKind::Request);
            assert_ne!(
                next.xid, plan.renew,
                "the ACK found the lease past its new T1: a new renewal at once"
            );
            let renewed = tokio::time::timeout(Duration::from_secs(5), async {
                loop {
                    let text = String::from_utf8_lossy(&lock(&sink.0)).into_owned();
                    if let Some(line) = text.lines().find(|l| l.contains(" renewed ")) {
                        break line.to_owned();
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await
            .expect("a renewed line");
            assert!(
                renewed.contains(&format!("xid={}", plan.renew)),
                "names the answered transaction: {renewed}"
            );
            assert!(
                !renewed.contains(&format!("xid={}", next.xid)),
                "not the one opened after it: {renewed}"
            );

            let (ack, stopped) = oneshot::channel();
            cmd_tx
                .send(Command::Stop {
                    release: false,
                    ack,
                })
                .await
                .unwrap();
            stopped.await.unwrap();
            assert!(matches!(ended.await.unwrap(), Ended::Kept));
        }

        /// A DEL's RELEASE goes out, the DEL is answered, and the same
        /// message (same xid: the client's one transaction) goes out once
        /// more a moment later (0.5–1.5 s): a server whose socket dropped
        /// the first still lets the lease go, and the DEL never waits for
        /// the copy. No third.
        #[tokio::test(start_paused = true)]
        async fn a_release_goes_out_again_a_moment_after_the_del_is_answered() {
            let dir = tempfile::tempdir().unwrap();
            let svc = services(dir.path());
            let now = Instant::now();
            let now_ms = now_unix_ms();
            let lease = held_lease(now_ms);
            let config = ClientConfig {
                chaddr: MAC,
                ..ClientConfig::default()
            };
            let client = Client::resume(config, lease.clone(), now, now_ms, 11);
            let mut record = crate::ops::network::fresh_record(
                &request(false),
                None,
                WorkloadKind::Pod,
                (MAC, crate::model::Family::Ipv4),
                None,
            );
            record.lease = Some(lease);
            let Harness {
                task,
                mut sent,
                cmd_tx,
                ..
            } = harness(svc.clone(), svc.clone(), client, record, None, None);
            let ended = tokio::spawn(run(task));

            let (ack, stopped) = oneshot::channel();
            cmd_tx
                .send(Command::Stop { release: true, ack })
                .await
                .unwrap();
            stopped.await.unwrap();
            let answered = tokio::time::Instant::now();
            let first = sent
                .try_recv()
                .expect("the RELEASE went out before the DEL's answer");
            assert_eq!((first.kind, first.src_ip), (MessageKind::Release, ADDR));
            assert!(
                sent.try_recv().is_err(),
                "only one copy before the DEL is answered"
            );

            assert!(matches!(ended.await.unwrap(), Ended::Kept));
            let waited = answered.elapsed();
            assert!(
                (Duration::from_millis(500)..=Duration::from_millis(1500)).contains(&waited),
                "the copy went {waited:?} after the answer"
            );
            let second = sent.try_recv().expect("the RELEASE went out a second time");
            assert_eq!(second, first, "the same message, under the same xid");
            assert!(
                matches!(
                    sent.try_recv(),
                    Err(mpsc::error::TryRecvError::Disconnected)
                ),
                "no third copy: the task ended"
            );
        }

        /// Without `apply`, the lease asks two writes of the world — the
        /// record naming the REQUEST's address while the ACK is awaited,
        /// then the lease — and nothing else (no address; nothing at the
        /// RELEASE).
        #[tokio::test]
        async fn a_lease_binds_persists_and_releases_through_its_port() {
            let (seen, _) = drive(false).await;
            let [Effect::PersistVisible(ahead), Effect::Persist(bound)] = &seen[..] else {
                panic!("{seen:#?}");
            };
            assert_eq!((ahead.requested, ahead.lease.as_ref()), (Some(ADDR), None));
            // The server the REQUEST went to: a DEL that finds no lease
            // releases the address there.
            assert_eq!(ahead.requested_from, Some(SERVER));
            assert_eq!(
                (
                    bound.requested,
                    bound.requested_from,
                    bound.lease.as_ref().map(|l| l.address)
                ),
                (None, None, Some(ADDR))
            );
            assert_eq!(
                (bound.container_id.as_str(), bound.ifname.as_str()),
                ("c1", "eth0")
            );
        }

        /// With `apply`, the address goes on the interface only once the
        /// record naming it is on disk: an agent killed in between leaves
        /// no address that no record (and so no DEL) would take off again.
        #[tokio::test]
        async fn an_address_is_configured_only_once_its_record_is_on_disk() {
            let (seen, on_disk) = drive(true).await;
            let kinds: Vec<&str> = seen
                .iter()
                .map(|e| match e {
                    Effect::Persist(_) | Effect::PersistVisible(_) => "persist",
                    Effect::Apply { .. } => "apply",
                    _ => "other",
                })
                .collect();
            assert_eq!(&kinds[..3], ["persist", "apply", "persist"], "{seen:#?}");
            assert_eq!(on_disk, [Some(ADDR)], "what the disk held at the apply");
        }
    }

    fn io(errno: i32) -> LinkError {
        LinkError::Io {
            op: "send a frame",
            ifname: "eth0".to_owned(),
            netns: None,
            source: std::io::Error::from_raw_os_error(errno),
        }
    }

    /// Size of the future a function returns, without calling it.
    fn future_size<A, F>(_: fn(A) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    #[test]
    fn a_changed_lease_moves_the_address_only_for_another_address_or_prefix() {
        use std::net::Ipv4Addr;
        let lease = |a: [u8; 4], prefix_len| Lease {
            address: Ipv4Addr::from(a),
            prefix_len,
            server_id: Ipv4Addr::new(192, 0, 2, 1),
            server_mac: None,
            routers: vec![Ipv4Addr::new(192, 0, 2, 1)],
            routes: Vec::new(),
            dns_servers: Vec::new(),
            domain_name: None,
            search: Vec::new(),
            mtu: None,
            lease_time: Duration::from_mins(2),
            t1: Duration::from_mins(1),
            t2: Duration::from_secs(105),
            acquired_unix_ms: 0,
            rejected_routes: Vec::new(),
        };
        let old = lease([192, 0, 2, 10], 24);
        assert!(moved(&old, &lease([192, 0, 2, 11], 24)));
        assert!(moved(&old, &lease([192, 0, 2, 10], 22)));
        let mut routers = lease([192, 0, 2, 10], 24);
        routers.routers = vec![Ipv4Addr::new(192, 0, 2, 254)];
        assert!(!moved(&old, &routers), "new routers keep the address");
    }

    #[test]
    fn the_resident_lease_future_stays_small() {
        // One of these per held lease, for the lease's lifetime.
        let size = future_size(run::<Port>);
        assert!(size <= 4096, "the lease future is {size} bytes");
    }

    #[test]
    fn a_full_send_queue_loses_one_frame_not_the_lease() {
        assert!(is_transient_send_error(&io(libc::ENOBUFS)));
        assert!(is_transient_send_error(&io(libc::EAGAIN)));
        assert!(is_transient_send_error(&io(libc::ENOMEM)));
    }

    #[test]
    fn other_send_errors_still_end_the_lease() {
        assert!(!is_transient_send_error(&io(libc::EPERM)));
        assert!(!is_transient_send_error(&io(libc::EINVAL)));
        let gone = LinkError::InterfaceGone {
            ifname: "eth0".to_owned(),
            netns: None,
            source: std::io::Error::from_raw_os_error(libc::ENODEV),
        };
        assert!(!is_transient_send_error(&gone));
    }
}
