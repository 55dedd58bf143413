//! The lease table: which attachments the agent knows and the leases each
//! holds (one, or on a dual-stack network one per family), the lock that
//! serializes CNI operations on each attachment, and the one way to start
//! and stop a lease task (pods and VMs alike).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedMutexGuard, mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tracing::{error, warn};
use xdhcp_engine::{Client, Mode, State};

use crate::datapath::capture::CapturePath;
use crate::datapath::link::{Link, LinkError};
use crate::datapath::port::{LeasePort as _, Port, PortOwner};
use crate::lease::live::{Command, EngineState, Live, Outcome};
use crate::lease::persist::{self, Durable, LeaseRecord};
use crate::lease::task::{self, Ended, Services, Task};
use crate::model::Family;
use crate::sys::sync::lock;

/// How long a stop waits for a lease task to send RELEASE and end.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// An attachment: container id and interface name. The table holds its
/// leases under it, at most one per family.
pub(crate) type Key = (String, String);

/// A known lease of an attachment: its live view and (while its task
/// runs) a command channel.
#[derive(Debug, Clone)]
pub(crate) struct Handle {
    pub(crate) generation: u64,
    /// The lease's family (`Ipv4` or `Ipv6`; [`LeaseRecord::family`]):
    /// an attachment on a dual-stack network has a handle of each.
    pub(crate) family: Family,
    pub(crate) live: Arc<Mutex<Live>>,
    cmds: Option<mpsc::Sender<Command>>,
    /// Whether the first lease is persisted (ADD waits for it,
    /// overlapping the store write with the annotation write).
    persisted: Option<watch::Receiver<Durable>>,
}

impl Handle {
    /// Wait until the first lease's write has ended (at most `within`):
    /// [`Durable::Saved`] or [`Durable::Failed`], or [`Durable::Pending`]
    /// when it had not ended by then (or the task ended without writing).
    pub(crate) async fn persisted(&self, within: Duration) -> Durable {
        let Some(mut p) = self.persisted.clone() else {
            return Durable::Saved;
        };
        match tokio::time::timeout(within, p.wait_for(|v| !matches!(v, Durable::Pending))).await {
            Ok(Ok(v)) => v.clone(),
            _ => Durable::Pending,
        }
    }
}

/// A registered attachment, and what its task keeps of it.
pub(crate) struct Started {
    pub(crate) handle: Handle,
    pub(crate) cmds: mpsc::Receiver<Command>,
    pub(crate) persisted: watch::Sender<Durable>,
}

/// An ADD's hold on its attachment (see [`Registry::begin`]).
#[derive(Debug)]
pub(crate) struct Begun {
    _lock: OwnedMutexGuard<()>,
    /// The records of the attachment when it already holds its leases (a
    /// repeated ADD): one, or on a dual-stack network one per family;
    /// empty otherwise.
    pub(crate) bound: Vec<LeaseRecord>,
}

/// One lock per attachment, made when an operation first asks for it. A
/// pod's container id is new with every pod, so the locks no one holds or
/// waits for are dropped once the table has doubled since it was last
/// pruned: without that, every pod the node ever ran would keep one.
#[derive(Debug, Default)]
struct KeyLocks {
    locks: HashMap<Key, Arc<tokio::sync::Mutex<()>>>,
    prune_at: usize,
}

impl KeyLocks {
    /// The fewest locks kept before a prune.
    const FLOOR: usize = 64;

    /// The lock of `key` (shared with whoever holds or awaits it).
    fn get(&mut self, key: Key) -> Arc<tokio::sync::Mutex<()>> {
        if self.locks.len() >= self.prune_at.max(Self::FLOOR) {
            // Held or awaited: a guard or a waiter has its own clone.
            self.locks.retain(|_, l| Arc::strong_count(l) > 1);
            self.prune_at = 2 * self.locks.len();
        }
        self.locks.entry(key).or_default().clone()
    }
}

/// A starting agent's recovery of its records, as the operations on
/// attachments see it: the agent socket answers while the records are
/// resumed, so an operation on an attachment whose record is being resumed
/// waits for that record, and every other goes ahead.
#[derive(Debug)]
struct Recovery {
    /// False from [`Registry::begin_recovery`] until every record to resume
    /// is listed and its attachment's lock held ([`Registry::listed`]):
    /// until then no operation can tell whether its attachment has one.
    listed: watch::Sender<bool>,
    /// False until every record is resumed ([`Registry::recovered`]).
    done: watch::Sender<bool>,
    /// The lock of each attachment with records still to be resumed, and
    /// how many (a dual-stack attachment has two). Let go as each
    /// attachment's last is resumed ([`Registry::resumed`]); what an
    /// interrupted recovery did not resume stays held, so no operation
    /// makes a fresh lease over a record still on disk.
    held: Mutex<HashMap<Key, (OwnedMutexGuard<()>, usize)>>,
}

impl Default for Recovery {
    /// Nothing to recover: everything goes ahead.
    fn default() -> Self {
        Self {
            listed: watch::Sender::new(true),
            done: watch::Sender::new(true),
            held: Mutex::new(HashMap::new()),
        }
    }
}

/// The lease table and the lease tasks.
#[derive(Debug)]
pub(crate) struct Registry {
    svc: Arc<Services>,
    /// Each attachment's leases, at most one per family.
    leases: Mutex<HashMap<Key, Vec<Handle>>>,
    key_locks: Mutex<KeyLocks>,
    tasks: Mutex<JoinSet<()>>,
    generation: AtomicU64,
    recovery: Recovery,
}

impl Registry {
    pub(crate) fn new(svc: Arc<Services>) -> Self {
        Self {
            svc,
            leases: Mutex::new(HashMap::new()),
            key_locks: Mutex::new(KeyLocks::default()),
            tasks: Mutex::new(JoinSet::new()),
            generation: AtomicU64::new(1),
            recovery: Recovery::default(),
        }
    }

    /// Recovery starts: operations on attachments wait until the records
    /// to resume are listed ([`Registry::listed`]), then each for its own
    /// record, if it has one. Call before the agent socket answers.
    pub(crate) fn begin_recovery(&self) {
        self.recovery.listed.send_replace(false);
        self.recovery.done.send_replace(false);
    }

    /// Hold the lock of an attachment whose record recovery will resume
    /// (before [`Registry::listed`]), once for each of its records: its
    /// operations wait until [`Registry::resumed`] is told of every one.
    pub(crate) async fn hold_for_recovery(&self, cid: &str, ifname: &str) {
        let key = (cid.to_owned(), ifname.to_owned());
        if let Some((_, records)) = lock(&self.recovery.held).get_mut(&key) {
            *records += 1;
            return;
        }
        let m = lock(&self.key_locks).get(key.clone());
        let guard = m.lock_owned().await;
        lock(&self.recovery.held).insert(key, (guard, 1));
    }

    /// Every record to resume is listed and held: operations on other
    /// attachments go ahead.
    pub(crate) fn listed(&self) {
        self.recovery.listed.send_replace(true);
    }

    /// A record of this attachment is resumed (or forgotten): once its
    /// last is, its operations go ahead.
    pub(crate) fn resumed(&self, cid: &str, ifname: &str) {
        let key = (cid.to_owned(), ifname.to_owned());
        let mut held = lock(&self.recovery.held);
        if let Some((_, records)) = held.get_mut(&key) {
            *records -= 1;
            if *records == 0 {
                held.remove(&key);
            }
        }
    }

    /// Every record is resumed.
    pub(crate) fn recovered(&self) {
        self.recovery.listed.send_replace(true);
        self.recovery.done.send_replace(true);
    }

    /// Wait until every record is resumed (an operation that looks at every
    /// attachment, GC).
    pub(crate) async fn wait_recovered(&self) {
        let mut done = self.recovery.done.subscribe();
        let _ = done.wait_for(|d| *d).await;
    }

    /// Begin an ADD of an attachment: take its lock (held as long as the
    /// returned [`Begun`]) and, when it already holds its leases (a
    /// repeated ADD), their records; when any of its tasks is still
    /// without a lease, or a dual-stack attachment holds one family only
    /// (the other's record could not be resumed), every one is stopped
    /// (without RELEASE: the fresh ADD asks the same servers again with
    /// the same identity).
    pub(crate) async fn begin(&self, cid: &str, ifname: &str) -> Begun {
        let held = self.key_lock(cid, ifname).await;
        let handles = self.attachment(cid, ifname);
        let bound: Vec<LeaseRecord> = handles
            .iter()
            .map(|h| lock(&h.live).record.clone())
            .collect();
        // A dual-stack attachment is bound only with both its leases.
        let whole = bound
            .first()
            .is_none_or(|r| r.network.ipam.family != Family::Dual || bound.len() == 2);
        if whole
            && bound
                .iter()
                .all(|r| r.lease.is_some() || r.lease6.is_some())
        {
            return Begun { _lock: held, bound };
        }
        for h in &handles {
            self.stop(h, false).await;
        }
        Begun {
            _lock: held,
            bound: Vec::new(),
        }
    }

    /// End a lease an ADD created (RELEASE first when `release`), forget
    /// it and remove its record.
    pub(crate) async fn abandon(&self, handle: &Handle, release: bool) {
        let (cid, ifname, family) = {
            let l = lock(&handle.live);
            (
                l.record.container_id.clone(),
                l.record.ifname.clone(),
                l.record.lease_family,
            )
        };
        self.stop(handle, release).await;
        self.forget(&cid, &ifname, handle.generation);
        if let Err(e) = persist::remove(&self.svc.store, &cid, &ifname, family) {
            warn!(error = %crate::rpc::format_chain(&e), "could not remove the lease record of a failed ADD");
        }
    }

    pub(crate) fn metrics(&self) -> &crate::metrics::Metrics {
        &self.svc.metrics
    }

    /// What every lease task shares.
    pub(crate) fn services(&self) -> Arc<Services> {
        self.svc.clone()
    }

    /// Serialize operations on one attachment; while the agent recovers,
    /// after the attachment's record is resumed, if it has one.
    pub(crate) async fn key_lock(&self, cid: &str, ifname: &str) -> OwnedMutexGuard<()> {
        let mut listed = self.recovery.listed.subscribe();
        let _ = listed.wait_for(|l| *l).await;
        let m = lock(&self.key_locks).get((cid.to_owned(), ifname.to_owned()));
        m.lock_owned().await
    }

    /// The attachment's leases (none when it is not known): one, or on a
    /// dual-stack network one per family, IPv4 first.
    pub(crate) fn attachment(&self, cid: &str, ifname: &str) -> Vec<Handle> {
        let mut leases = lock(&self.leases)
            .get(&(cid.to_owned(), ifname.to_owned()))
            .cloned()
            .unwrap_or_default();
        leases.sort_by_key(|h| h.family == Family::Ipv6);
        leases
    }

    /// The attachment's first lease, if it is known: its one lease, or
    /// on a dual-stack network its IPv4 one (for what leases IPv4 only:
    /// VMs, guest learning).
    pub(crate) fn get(&self, cid: &str, ifname: &str) -> Option<Handle> {
        self.attachment(cid, ifname).into_iter().next()
    }

    /// Every lease.
    pub(crate) fn all(&self) -> Vec<Handle> {
        lock(&self.leases).values().flatten().cloned().collect()
    }

    /// How many leases are known.
    pub(crate) fn len(&self) -> usize {
        lock(&self.leases).values().map(Vec::len).sum()
    }

    /// Remove a lease from the table (only `generation`'s); the attachment
    /// with it when it was its last.
    pub(crate) fn forget(&self, cid: &str, ifname: &str, generation: u64) {
        let mut m = lock(&self.leases);
        let k = (cid.to_owned(), ifname.to_owned());
        if let Some(leases) = m.get_mut(&k) {
            leases.retain(|h| h.generation != generation);
            if leases.is_empty() {
                m.remove(&k);
            }
        }
    }

    /// Keep `generation`'s lease known without its task (it ended with the
    /// interface gone; DEL releases it through its uplink).
    fn park(&self, key: &Key, generation: u64) {
        if let Some(h) = lock(&self.leases)
            .get_mut(key)
            .and_then(|leases| leases.iter_mut().find(|h| h.generation == generation))
        {
            h.cmds = None;
            h.persisted = None;
        }
    }

    /// Know a lease, in place of any earlier one of its attachment and
    /// family.
    fn insert(&self, h: &Handle) {
        let k = {
            let l = lock(&h.live);
            (l.record.container_id.clone(), l.record.ifname.clone())
        };
        let mut m = lock(&self.leases);
        let leases = m.entry(k).or_default();
        leases.retain(|old| old.family != h.family);
        leases.push(h.clone());
    }

    /// Know an attachment without running a task (a finished VM discovery
    /// found at start: kept for CHECK and DEL).
    pub(crate) fn insert_static(&self, record: LeaseRecord) -> Handle {
        let h = Handle {
            generation: self.generation.fetch_add(1, Ordering::Relaxed),
            family: record.family(),
            live: Arc::new(Mutex::new(Live::new(
                record,
                State::Bound,
                CapturePath::Idle,
            ))),
            cmds: None,
            persisted: None,
        };
        self.insert(&h);
        h
    }

    /// Start a lease task for `record` on `link` with `client`; `waiter`
    /// hears how the first acquisition ends.
    ///
    /// Pods start on the link's own `AF_PACKET` receiver (the first
    /// exchange starts at once; the task asks the capture actor for the ring
    /// buffer once the lease is held). One-shot discoveries (VMs) end at
    /// BOUND, so they capture on eBPF from the first frame when it can be
    /// attached now, else on `AF_PACKET`.
    pub(crate) async fn spawn(
        self: &Arc<Self>,
        record: LeaseRecord,
        client: Client,
        link: Link,
        waiter: Option<oneshot::Sender<Outcome>>,
    ) -> Result<Handle, LinkError> {
        let eager = client.config().mode == Mode::OneShot;
        let owner = PortOwner {
            network: record.network.name.clone(),
            mac: record.mac,
            uplink: record.uplink.clone(),
        };
        // The exchange's clock runs from here: the port's open (waiting
        // for the link to be operational and for the guard's qdisc on its
        // host port) is on the way to the first frame.
        let opening = Instant::now();
        let mut port = Port::open(
            self.svc.capture.clone(),
            self.svc.metrics.clone(),
            link,
            owner,
            eager,
        )
        .await?;
        // A previous agent's transaction taken over: routed before the
        // task runs, so a reply the ring kept for it reaches this lease.
        if let Some(xid) = client.adopted() {
            port.adopt(xid);
        }
        let path = port.path().clone();
        let started = self.register(record, client.state().into(), path);
        let task = Task {
            svc: self.svc.clone(),
            effects: self.svc.clone(),
            client,
            port,
            live: started.handle.live.clone(),
            cmds: started.cmds,
            waiter,
            started: Instant::now(),
            clock: crate::lease::live::ExchangeClock::new(opening),
            persisted: started.persisted,
            ahead: None,
            answered: None,
        };
        self.run(&started.handle, task::run(task));
        Ok(started.handle)
    }

    /// Know a new attachment whose lease task the caller starts (with
    /// [`Registry::run`]): its handle, and the task's ends of the command
    /// channel and of the first write's signal.
    pub(crate) fn register(
        &self,
        record: LeaseRecord,
        state: EngineState,
        path: CapturePath,
    ) -> Started {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let family = record.family();
        let (cmd_tx, cmds) = mpsc::channel(2);
        self.svc.metrics.lease_state(None, Some(state.metric()));
        let live = Arc::new(Mutex::new(Live::new(record, state, path)));
        let (persisted_tx, persisted) = watch::channel(Durable::Pending);
        let handle = Handle {
            generation,
            family,
            live,
            cmds: Some(cmd_tx),
            persisted: Some(persisted),
        };
        self.insert(&handle);
        Started {
            handle,
            cmds,
            persisted: persisted_tx,
        }
    }

    /// Run `handle`'s lease task; how it ends decides whether the
    /// attachment is forgotten, parked or kept.
    pub(crate) fn run(
        self: &Arc<Self>,
        handle: &Handle,
        task: impl std::future::Future<Output = Ended> + Send + 'static,
    ) {
        let key = {
            let l = lock(&handle.live);
            (l.record.container_id.clone(), l.record.ifname.clone())
        };
        let generation = handle.generation;
        let me = self.clone();
        let mut tasks = lock(&self.tasks);
        // The tasks ended since are let go here: a finished task keeps its
        // allocation (the lease future's size, ~4 KiB) until it is joined,
        // and the set is otherwise joined only at shutdown — a few KiB for
        // every pod the node ever ran.
        reap(&mut tasks);
        tasks.spawn(async move {
            match task.await {
                Ended::Gone => me.forget(&key.0, &key.1, generation),
                Ended::Parked => me.park(&key, generation),
                Ended::Kept => {}
            }
        });
    }

    /// Stop a lease task (RELEASE first when `release`) and wait until it
    /// has ended; a task already gone is fine. Whether the task took the
    /// command (`false`: it had ended on its own, e.g. parked because its
    /// interface went just before, so it sent no RELEASE).
    pub(crate) async fn stop(&self, h: &Handle, release: bool) -> bool {
        let Some(cmds) = &h.cmds else { return false };
        let (ack, done) = oneshot::channel();
        // A send error means the task is gone; a dropped ack means it ended
        // without reading the command. Either way it holds nothing any more.
        if cmds.send(Command::Stop { release, ack }).await.is_err() {
            return false;
        }
        if let Ok(acked) = tokio::time::timeout(STOP_WAIT, done).await {
            acked.is_ok()
        } else {
            warn!("lease task did not stop within {STOP_WAIT:?}");
            self.svc.metrics.failure("stop_timeout");
            true
        }
    }

    /// At shutdown: wait (at most `grace`) for every lease task to persist
    /// and end; abort the rest.
    pub(crate) async fn drain(&self, grace: Duration) {
        let mut tasks = std::mem::take(&mut *lock(&self.tasks));
        let drained = tokio::time::timeout(grace, async {
            while let Some(r) = tasks.join_next().await {
                if let Err(e) = r
                    && e.is_panic()
                {
                    error!(error = %e, "a lease task panicked");
                }
            }
        })
        .await;
        if drained.is_err() {
            warn!("some lease tasks did not stop within {grace:?}");
            tasks.abort_all();
        }
    }
}

/// Joins the tasks of `set` that have ended, saying if one panicked; how
/// many.
fn reap(set: &mut JoinSet<()>) -> usize {
    let mut n = 0;
    while let Some(r) = set.try_join_next() {
        n += 1;
        if let Err(e) = r
            && e.is_panic()
        {
            error!(error = %e, "a lease task panicked");
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ended tasks leave the set at the next spawn; running ones stay.
    #[tokio::test]
    async fn ended_lease_tasks_are_let_go() {
        let mut set = JoinSet::new();
        for _ in 0..100 {
            set.spawn(async {});
        }
        let (_keep, running) = oneshot::channel::<()>();
        set.spawn(async move {
            let _ = running.await;
        });
        while set.len() > 1 {
            tokio::task::yield_now().await;
            reap(&mut set);
        }
        assert_eq!(set.len(), 1, "the running task stays");
    }

    fn key(i: usize) -> Key {
        (format!("container-{i}"), "eth0".to_owned())
    }

    /// Ten thousand pods, one after another: the table stays small, and a
    /// lock held all along is kept (still excluding its attachment's next
    /// operation) however often the idle ones are dropped.
    #[tokio::test]
    async fn idle_attachment_locks_are_dropped_and_held_ones_kept() {
        let mut locks = KeyLocks::default();
        let held = locks.get(key(0)).lock_owned().await;
        for i in 1..10_000 {
            let _op = locks.get(key(i)).lock_owned().await;
        }
        let kept = locks.locks.len();
        assert!(kept <= 2 * KeyLocks::FLOOR, "{kept} locks kept");
        let again = locks.get(key(0));
        assert!(again.try_lock().is_err(), "the held lock was replaced");
        drop(held);
        assert!(again.try_lock().is_ok());
    }
}
