//! One tokio task per attachment: drives the sans-IO engine with tokio time,
//! the raw-socket sender and the capture path, persists every lease change,
//! applies the address when asked, and ends on DEL, on interface removal, or
//! (one-shot VM discovery) at BOUND.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};
use xdhcp_engine::{AcquireError, Client, Event, Lease, Mode, PacketSource, State};

use super::link::{Link, LinkError, mac_string};
use super::persist::{self, LeaseRecord, WorkloadKind};
use super::{Agent, apply};
use crate::cli::now_unix_ms;
use crate::datapath::RxFrame;
use crate::rpc::LeaseView;

/// How long a maintained lease waits before trying again after an
/// acquisition failed with nobody waiting on it (a resumed lease).
const REACQUIRE_DELAY: Duration = Duration::from_secs(10);
/// When a held lease moves from `AF_PACKET` to the eBPF ring buffer.
const EBPF_ATTACH_DELAY: Duration = Duration::from_millis(500);
/// Spread of that move over leases, in milliseconds.
const EBPF_ATTACH_JITTER_MS: u64 = 1500;

/// eBPF attaches in flight at once, agent-wide. They serialize on the
/// loader's lock anyway; without this each waiting one held a thread of the
/// (bounded) blocking pool, and the store writes of new leases queued
/// behind them.
static ATTACH_SLOTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// What ADD waits for.
#[derive(Debug)]
pub enum Outcome {
    Bound(Lease),
    Failed(AcquireError),
    /// The interface disappeared or could not be used.
    LinkFailed(String),
    /// The agent is shutting down.
    Cancelled,
}

/// Commands to a running lease task.
#[derive(Debug)]
pub enum Command {
    /// End the lease: RELEASE first when `release`; ack when done.
    Stop {
        release: bool,
        ack: oneshot::Sender<()>,
    },
}

/// Live, shared view of one attachment (for `leases`, `status`, CHECK).
#[derive(Debug, Clone)]
pub struct Live {
    pub record: LeaseRecord,
    pub state: State,
    pub attach: String,
    /// Expiry, wall clock ms.
    pub expires_unix_ms: Option<u64>,
}

impl Live {
    /// The `xdhcp leases` row.
    pub fn view(&self) -> LeaseView {
        let r = &self.record;
        LeaseView {
            container_id: r.container_id.clone(),
            ifname: r.ifname.clone(),
            pod: r
                .pod
                .as_ref()
                .map(|p| format!("{}/{}", p.namespace, p.name)),
            network: r.config.name.clone(),
            workload: match &r.workload {
                WorkloadKind::Pod => "pod".to_owned(),
                WorkloadKind::Vm { vmi } => format!("vm:{vmi}"),
            },
            mac: mac_string(r.mac),
            address: r.lease.as_ref().map(|l| crate::cni::types::Ipv4Cidr {
                addr: l.address,
                prefix_len: l.prefix_len,
            }),
            server: r.lease.as_ref().map(|l| l.server_id),
            state: if matches!(r.workload, WorkloadKind::Vm { .. }) && r.lease.is_some() {
                "OneShot".to_owned()
            } else {
                format!("{:?}", self.state)
            },
            expires_unix_ms: self.expires_unix_ms,
        }
    }
}

/// Expiry of `lease` on the wall clock (None when infinite).
pub fn expiry_ms(lease: &Lease) -> Option<u64> {
    (!lease.is_infinite()).then(|| lease.acquired_unix_ms + lease.lease_time.as_millis() as u64)
}

/// Everything a lease task owns.
pub struct Task {
    pub agent: Arc<Agent>,
    pub generation: u64,
    pub client: Client,
    pub link: Link,
    pub live: Arc<Mutex<Live>>,
    pub frames: mpsc::Receiver<RxFrame>,
    pub frames_tx: mpsc::Sender<RxFrame>,
    pub cmds: mpsc::Receiver<Command>,
    pub waiter: Option<oneshot::Sender<Outcome>>,
    /// eBPF ifindex for xid ownership, when capture is eBPF.
    pub ebpf_ifindex: Option<u32>,
    /// eBPF attach still running in the background (`AF_PACKET` until then).
    pub pending_attach: Option<super::PendingAttach>,
    /// Attach eBPF once a lease is held.
    pub defer_ebpf: bool,
    /// Cancels a background attach that has not started yet.
    pub attach_cancel: tokio_util::sync::CancellationToken,
    pub started: Instant,
    /// Set once the first lease is on disk.
    pub persisted: tokio::sync::watch::Sender<bool>,
}

impl Task {
    fn record(&self) -> LeaseRecord {
        lock(&self.live).record.clone()
    }

    /// Persist off the runtime's worker threads (the store fsyncs).
    async fn persist_async(&self) {
        let agent = self.agent.clone();
        let rec = self.record();
        let res = tokio::task::spawn_blocking(move || persist::save(&agent.store, &rec)).await;
        match res {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                self.agent.metrics.failure("persist");
                warn!(error = %e, "could not persist the lease; a restart would lose it");
            }
            Err(e) => warn!(error = %e, "the persist task failed"),
        }
    }

    fn persist(&self) {
        let rec = self.record();
        if let Err(e) = persist::save(&self.agent.store, &rec) {
            self.agent.metrics.failure("persist");
            warn!(container = %rec.container_id, ifname = %rec.ifname, error = %e,
                "could not persist the lease; a restart would lose it");
        }
    }

    fn set_state(&self, state: State) {
        let mut l = lock(&self.live);
        if l.state != state {
            self.agent
                .metrics
                .lease_state(Some(l.state.label()), Some(state.label()));
            l.state = state;
        }
    }

    fn set_lease(&self, lease: Option<Lease>) {
        let mut l = lock(&self.live);
        l.expires_unix_ms = lease.as_ref().and_then(expiry_ms);
        l.record.lease = lease;
    }
}

/// Run the task to its end.
///
/// Every held lease keeps this future resident, so its state sits in one
/// heap box and the rarely taken long awaits (address configuration, the
/// end of the task) are boxed where they happen: 11 KiB per lease before,
/// most of it space reserved for those awaits and a second copy of the task.
pub fn run(task: Task) -> impl Future<Output = ()> + Send {
    drive(Box::new(task))
}

#[expect(
    clippy::too_many_lines,
    reason = "the lease's event loop: one select over all of its inputs"
)]
#[tracing::instrument(skip_all, fields(container = %lock(&task.live).record.container_id, ifname = %task.link.ifname))]
async fn drive(mut task: Box<Task>) {
    let token = task.agent.token.clone();
    let mut owned_xid: Option<u32> = None;
    let oneshot = task.client.config().mode == Mode::OneShot;
    let mut stop_ack: Option<oneshot::Sender<()>> = None;
    let mut reacquire_at: Option<Instant> = None;
    // Maintained leases end as soon as their interface is deleted (pod gone,
    // or the main plugin's DEL removed it first), not at the next send: the
    // link's removal watch, subscribed when the link was opened.
    if oneshot {
        task.link.drop_watch();
    }
    let end_reason;
    loop {
        // Outputs first: frames to send, then events.
        if let Err(e) = flush(&mut task, &mut owned_xid) {
            end_reason = End::Link(e);
            break;
        }
        if let Some(end) = drain_events(&mut task, oneshot, &mut reacquire_at).await {
            end_reason = end;
            break;
        }
        task.set_state(task.client.state());
        // One-shot discoveries end at BOUND: nothing to move to eBPF.
        if task.defer_ebpf && !oneshot && task.client.lease().is_some() {
            task.defer_ebpf = false;
            let agent = task.agent.clone();
            let target = crate::datapath::ebpf::AttachTarget {
                ifname: task.link.ifname.clone(),
                netns: task.link.netns.clone(),
            };
            // A little later and spread out: a burst of ADDs finishes on
            // AF_PACKET before the attaches (RTNL-heavy) start.
            let delay =
                EBPF_ATTACH_DELAY + Duration::from_millis(super::seed() % EBPF_ATTACH_JITTER_MS);
            let cancel = task.attach_cancel.clone();
            task.pending_attach = Some(tokio::spawn(async move {
                tokio::select! {
                    () = cancel.cancelled() => None,
                    () = tokio::time::sleep(delay) => tokio::select! {
                        () = cancel.cancelled() => None,
                        slot = ATTACH_SLOTS.acquire() => {
                            let _slot = slot.ok();
                            agent.attach_ebpf(target).await
                        }
                    },
                }
            }));
        }
        if !task.client.state().expects_reply() {
            release_xid(&task, &mut owned_xid);
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
            frame = task.frames.recv() => {
                if let Some(f) = frame {
                    handle_frame(&mut task, &f);
                }
            }
            got = task.link.recv() => match got {
                Ok(f) => handle_frame(&mut task, &f),
                Err(e) => {
                    end_reason = End::Link(e);
                    break;
                }
            },
            () = task.link.removed() => {
                end_reason = End::Removed;
                break;
            }
            attached = async {
                match task.pending_attach.as_mut() {
                    Some(p) => p.await,
                    None => std::future::pending().await,
                }
            } => {
                task.pending_attach = None;
                switch_to_ebpf(&mut task, attached.ok().flatten(), owned_xid);
            }
            () = sleep => {
                let now = Instant::now();
                if reacquire_at.is_some_and(|r| r <= now) {
                    reacquire_at = None;
                    task.client.set_wall_clock_unix_ms(now_unix_ms());
                    task.client.restart(now);
                } else {
                    task.client.set_wall_clock_unix_ms(now_unix_ms());
                    task.client.handle_timeout(now);
                }
            }
        }
    }
    Box::pin(finish(task, &end_reason, owned_xid, stop_ack)).await;
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

/// The background eBPF attach finished: take replies from the ring buffer
/// from now on (the current xid is registered in the kernel ownership map)
/// and close the `AF_PACKET` receiver.
fn switch_to_ebpf(
    task: &mut Task,
    attached: Option<(u32, crate::datapath::AttachMode)>,
    owned_xid: Option<u32>,
) {
    let Some((ifindex, mode)) = attached else {
        lock(&task.live).attach = crate::datapath::AttachMode::AfPacket.to_string();
        return;
    };
    task.ebpf_ifindex = Some(ifindex);
    if let Some(x) = owned_xid {
        task.agent
            .rx
            .register(x, task.frames_tx.clone(), Some(ifindex));
    }
    task.link.drop_rx();
    lock(&task.live).attach = mode.to_string();
    debug!(%mode, "capture switched to eBPF");
}

fn handle_frame(task: &mut Task, f: &RxFrame) {
    let now = Instant::now();
    let src = PacketSource {
        src_mac: f.headers.src_mac,
        src_ip: f.headers.src_ip,
    };
    task.client.set_wall_clock_unix_ms(now_unix_ms());
    if let Err(reason) = task.client.handle_packet(now, src, &f.payload) {
        task.agent.metrics.dropped(reason.label(), 1);
        debug!(reason = reason.label(), src = %f.headers.src_ip, "reply dropped");
    }
}

fn flush(task: &mut Task, owned_xid: &mut Option<u32>) -> Result<(), LinkError> {
    while let Some(t) = task.client.poll_transmit() {
        if *owned_xid != Some(t.xid) {
            release_xid(task, owned_xid);
            task.agent
                .rx
                .register(t.xid, task.frames_tx.clone(), task.ebpf_ifindex);
            *owned_xid = Some(t.xid);
        }
        debug!(xid = t.xid, kind = ?t.kind, "send");
        match task.link.send(&t) {
            Ok(()) => {}
            // A full queue on the way out (ENOBUFS: the veth peer's backlog
            // overflowed, e.g. a bridge flooding broadcasts to many pods) is a
            // lost datagram, not a broken link: the engine's retransmission
            // timer sends it again, as for a frame lost on the wire.
            Err(e) if is_transient_send_error(&e) => {
                warn!(xid = t.xid, kind = ?t.kind, error = %e,
                    "frame not sent (queue full); the retransmission timer resends it");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Whether a send failure only lost this one frame (kernel queue or memory
/// pressure) rather than the link.
fn is_transient_send_error(e: &LinkError) -> bool {
    matches!(
        e,
        LinkError::Io { source, .. }
            if matches!(source.raw_os_error(), Some(libc::ENOBUFS | libc::EAGAIN | libc::ENOMEM))
    )
}

fn release_xid(task: &Task, owned_xid: &mut Option<u32>) {
    if let Some(x) = owned_xid.take() {
        task.agent.rx.unregister(x, task.ebpf_ifindex.is_some());
    }
}

async fn drain_events(
    task: &mut Task,
    oneshot: bool,
    reacquire_at: &mut Option<Instant>,
) -> Option<End> {
    while let Some(ev) = task.client.poll_event() {
        match ev {
            Event::Bound(lease) => {
                let secs = task.started.elapsed().as_secs_f64();
                task.agent.metrics.dora(secs);
                info!(address = %lease.address, prefix = lease.prefix_len, server = %lease.server_id,
                    lease_secs = lease.lease_time.as_secs(), ms = (secs * 1000.0) as u64, "bound");
                log_rejected(&lease);
                task.set_lease(Some(lease.clone()));
                task.set_state(task.client.state());
                Box::pin(apply_if_asked(task, &lease)).await;
                // ADD writes the annotation while the store write runs; it
                // answers only once `persisted` is set.
                if let Some(w) = task.waiter.take() {
                    let _ = w.send(Outcome::Bound(lease));
                }
                task.persist_async().await;
                task.persisted.send_replace(true);
                if oneshot {
                    return Some(End::Done);
                }
            }
            Event::Renewed(lease) => {
                task.agent.metrics.renewal();
                info!(address = %lease.address, server = %lease.server_id,
                    lease_secs = lease.lease_time.as_secs(), "renewed");
                task.set_lease(Some(lease));
                task.persist_async().await;
            }
            Event::Changed { old, new } => {
                task.agent.metrics.renewal();
                warn!(old = %old.address, new = %new.address, "lease parameters changed");
                log_rejected(&new);
                task.set_lease(Some(new.clone()));
                task.persist_async().await;
                Box::pin(apply_if_asked(task, &new)).await;
            }
            Event::Lost { reason } => {
                task.agent.metrics.failure(lost_label(reason.label()));
                warn!(reason = reason.label(), "lease lost; acquiring again");
                let (old, apply) = {
                    let l = lock(&task.live);
                    (l.record.lease.clone(), l.record.config.ipam.apply)
                };
                if let (Some(old), Some(ns)) = (old, task.link.netns.clone())
                    && apply
                    && let Err(e) = Box::pin(apply::deconfigure(&ns, &task.link.ifname, &old)).await
                {
                    warn!(error = %e, "could not remove the lost address");
                }
                task.set_lease(None);
                task.persist_async().await;
                task.started = Instant::now();
            }
            Event::Nak { server, message } => {
                task.agent.metrics.nak();
                info!(%server, message = message.as_deref().unwrap_or(""), "DHCPNAK");
            }
            Event::Failed(err) => {
                task.agent.metrics.failure(acquire_label(err.label()));
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

fn lost_label(l: &'static str) -> &'static str {
    match l {
        "expired" => "lease_expired",
        "nak" => "lease_nak",
        "declined" => "lease_declined",
        _ => "lease_lost",
    }
}

fn acquire_label(l: &'static str) -> &'static str {
    match l {
        "nak" => "acquire_nak",
        "no_ack" => "acquire_no_ack",
        "invalid_replies" => "acquire_invalid_replies",
        _ => "acquire_no_reply",
    }
}

fn log_rejected(lease: &Lease) {
    for r in &lease.rejected_routes {
        warn!(route = ?r, "option-121 route refused by policy");
    }
}

async fn apply_if_asked(task: &Task, lease: &Lease) {
    let (apply, vm) = {
        let l = lock(&task.live);
        (
            l.record.config.ipam.apply,
            matches!(l.record.workload, WorkloadKind::Vm { .. }),
        )
    };
    // A VM's address is never configured on the pod interface (SPEC R23).
    if !apply || vm {
        return;
    }
    let Some(ns) = &task.link.netns else { return };
    if let Err(e) = apply::configure(ns, &task.link.ifname, lease).await {
        task.agent.metrics.failure("apply");
        warn!(error = %e, "could not configure the leased address");
    }
}

async fn finish(
    mut task: Box<Task>,
    end: &End,
    mut owned_xid: Option<u32>,
    stop_ack: Option<oneshot::Sender<()>>,
) {
    let rec = task.record();
    match end {
        End::Shutdown => {
            // Persist and keep the lease: a restart resumes it (SPEC R6).
            task.persist();
            if let Some(w) = task.waiter.take() {
                let _ = w.send(Outcome::Cancelled);
            }
        }
        End::Release => {
            task.client.set_wall_clock_unix_ms(now_unix_ms());
            task.client.release(Instant::now());
            if let Err(e) = flush(&mut task, &mut owned_xid) {
                warn!(error = %e, "RELEASE could not be sent");
            } else if rec.lease.is_some() {
                info!("released");
            }
        }
        End::Forget | End::Done => {}
        End::Removed => {
            info!("interface removed; the lease ends here (no RELEASE possible)");
            if let Some(w) = task.waiter.take() {
                let _ = w.send(Outcome::LinkFailed("the interface was deleted".into()));
            }
        }
        End::Link(e) => {
            if e.is_interface_gone() {
                info!(error = %e, "interface removed; the lease ends here (no RELEASE possible)");
            } else {
                warn!(error = %e, "link failure; the lease ends here");
            }
            if let Some(w) = task.waiter.take() {
                let _ = w.send(Outcome::LinkFailed(e.to_string()));
            }
        }
    }
    release_xid(&task, &mut owned_xid);
    task.attach_cancel.cancel();
    if let Some(p) = task.pending_attach.take() {
        // Let a background attach finish so its reference is released below.
        if let Ok(Some((ifindex, _))) = p.await {
            task.ebpf_ifindex = Some(ifindex);
        }
    }
    if task.ebpf_ifindex.is_some() {
        task.agent.detach_capture(&task.link);
    }
    let gone_for_good =
        matches!(end, End::Removed) || matches!(end, End::Link(e) if e.is_interface_gone());
    if gone_for_good {
        task.agent
            .forget(&rec.container_id, &rec.ifname, task.generation);
        if let Err(e) = persist::remove(&task.agent.store, &rec.container_id, &rec.ifname) {
            warn!(error = %e, "could not remove the lease record");
        }
    }
    let state = lock(&task.live).state;
    task.agent.metrics.lease_state(Some(state.label()), None);
    if let Some(a) = stop_ack {
        let _ = a.send(());
    }
}

/// Lock a std mutex, ignoring poisoning (the data is plain values).
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn the_resident_lease_future_stays_small() {
        // One of these per held lease, for the lease's lifetime (measured:
        // 11 072 bytes with the task inline and the long awaits unboxed).
        let size = future_size(run);
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
