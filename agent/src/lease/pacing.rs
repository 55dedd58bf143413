//! How many new acquisitions talk to a network's DHCP server at once.
//!
//! A burst of ADDs (a node draining onto this one, a deployment scaled up)
//! would otherwise put every DISCOVER on the wire in the same millisecond.
//! On a localnet network each DISCOVER and each REQUEST of a fresh
//! acquisition is a broadcast the bridge floods to every port, and the
//! server answers one client at a time anyway: dnsmasq is single-threaded,
//! writes its lease file on every ACK, and without its ping check offers
//! the same free address to clients that ask at the same instant, so all
//! but one of them get a DHCPNAK and start over. So each network admits a few
//! acquisitions at a time and queues the rest, in arrival order.
//!
//! A slot is held from the first DISCOVER until the acquisition's first
//! outcome (BOUND or failure), and never longer than a hold limit: an
//! acquisition whose server does not answer gives its slot up after the
//! limit and goes on retransmitting outside the queue, so one silent server
//! delays the others of its network by at most that limit each. Networks
//! are paced separately (by the CNI network name): a slow server on one
//! does not hold up another. Renewals, rebinds and RELEASEs are not paced:
//! they are unicast, and a lease's renewal times are already spread.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The acquisition slots of every network.
#[derive(Debug)]
pub(crate) struct Pacing {
    /// Acquisitions in flight per network; 0 admits every one at once.
    per_network: usize,
    /// The longest a slot is held.
    hold: Duration,
    networks: Mutex<HashMap<String, Arc<Network>>>,
    /// Acquisitions waiting for a slot, over every network (the
    /// `acquisitions_queued` metric).
    queued: Gauge,
}

fn lock_networks(
    m: &Mutex<HashMap<String, Arc<Network>>>,
) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Network>>> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One network's slots, and how many wait for one.
#[derive(Debug)]
struct Network {
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
}

/// An admitted acquisition's slot (none when pacing is off).
#[derive(Debug)]
pub(crate) struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    hold: Duration,
}

impl Pacing {
    pub(crate) fn new(per_network: usize, hold: Duration, queued: Gauge) -> Self {
        Self {
            per_network,
            hold,
            networks: Mutex::new(HashMap::new()),
            queued,
        }
    }

    /// [`Pacing::admit`] within `limit`; else how many were still in
    /// flight or queued on `network` ahead of this one.
    pub(crate) async fn admit_within(&self, network: &str, limit: Duration) -> Result<Slot, usize> {
        match tokio::time::timeout(limit, self.admit(network)).await {
            Ok(slot) => Ok(slot),
            Err(_) => Err(self.ahead(network)),
        }
    }

    /// Acquisitions in flight on `network` plus those waiting there.
    fn ahead(&self, network: &str) -> usize {
        let nets = self
            .networks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        nets.get(network).map_or(0, |n| {
            self.per_network.saturating_sub(n.slots.available_permits())
                + n.waiting.load(Ordering::Relaxed)
        })
    }

    /// Network `name`'s slots, made on its first acquisition.
    fn network(&self, name: &str) -> Arc<Network> {
        let mut nets = lock_networks(&self.networks);
        if let Some(n) = nets.get(name) {
            return n.clone();
        }
        // A network nobody is admitted to or waiting on is forgotten when
        // another one comes (the map holds the busy networks, not every
        // name ever seen); it starts afresh with all its slots.
        let per_network = self.per_network;
        nets.retain(|_, n| {
            Arc::strong_count(n) > 1
                || n.waiting.load(Ordering::Relaxed) > 0
                || n.slots.available_permits() < per_network
        });
        let n = Arc::new(Network {
            slots: Arc::new(Semaphore::new(self.per_network)),
            waiting: AtomicUsize::new(0),
        });
        nets.insert(name.to_owned(), n.clone());
        n
    }

    /// Wait for a slot on `network`: at once while fewer than the limit are
    /// in flight there, else behind those that asked before.
    pub(crate) async fn admit(&self, network: &str) -> Slot {
        if self.per_network == 0 {
            return Slot {
                permit: None,
                hold: self.hold,
            };
        }
        let net = self.network(network);
        // Counted while it waits, however the wait ends (an ADD may be
        // abandoned in the queue).
        let queued = Queued::new(&self.queued, &net.waiting);
        // The semaphore is never closed, so this cannot fail.
        let permit = net.slots.clone().acquire_owned().await.ok();
        drop(queued);
        Slot {
            permit,
            hold: self.hold,
        }
    }

    /// Acquisitions waiting for a slot, over every network.
    #[cfg(test)]
    fn waiting(&self) -> i64 {
        self.queued.get()
    }

    /// Networks in the map.
    #[cfg(test)]
    fn networks(&self) -> usize {
        lock_networks(&self.networks).len()
    }
}

/// One acquisition waiting for a slot: counted in the gauge and in its
/// network while it lives.
struct Queued<'a> {
    gauge: &'a Gauge,
    network: &'a AtomicUsize,
}

impl<'a> Queued<'a> {
    fn new(gauge: &'a Gauge, network: &'a AtomicUsize) -> Self {
        gauge.inc();
        network.fetch_add(1, Ordering::Relaxed);
        Self { gauge, network }
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.gauge.dec();
        self.network.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Slot {
    /// Run `exchange` (the wait for an acquisition's first outcome) holding
    /// the slot, which is given up when it ends or once the hold limit has
    /// passed, whichever is first.
    pub(crate) async fn hold_during<F: Future>(mut self, exchange: F) -> F::Output {
        let mut exchange = std::pin::pin!(exchange);
        let Some(permit) = self.permit.take() else {
            return exchange.await;
        };
        tokio::select! {
            biased;
            out = &mut exchange => out,
            () = tokio::time::sleep(self.hold) => {
                drop(permit);
                exchange.await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    /// A pacing under test, and how many of its acquisitions were in flight
    /// (now, and at most at once).
    struct Trial {
        pacing: Arc<Pacing>,
        live: Arc<AtomicUsize>,
        peak: Arc<AtomicUsize>,
    }

    impl Trial {
        fn new(per_network: usize, hold: Duration) -> Self {
            Self {
                pacing: Arc::new(Pacing::new(per_network, hold, Gauge::default())),
                live: Arc::new(AtomicUsize::new(0)),
                peak: Arc::new(AtomicUsize::new(0)),
            }
        }

        /// Start `n` acquisitions on `network`, each taking `each` to its
        /// outcome once admitted; each task returns when it ended.
        fn run(
            &self,
            network: &'static str,
            n: usize,
            each: Duration,
        ) -> Vec<tokio::task::JoinHandle<Duration>> {
            let start = Instant::now();
            (0..n)
                .map(|_| {
                    let (pacing, live, peak) =
                        (self.pacing.clone(), self.live.clone(), self.peak.clone());
                    tokio::spawn(async move {
                        let slot = pacing.admit(network).await;
                        slot.hold_during(async {
                            let now = live.fetch_add(1, Ordering::SeqCst) + 1;
                            peak.fetch_max(now, Ordering::SeqCst);
                            tokio::time::sleep(each).await;
                            live.fetch_sub(1, Ordering::SeqCst);
                        })
                        .await;
                        start.elapsed()
                    })
                })
                .collect()
        }

        fn peak(&self) -> usize {
            self.peak.load(Ordering::SeqCst)
        }
    }

    async fn ends(handles: Vec<tokio::task::JoinHandle<Duration>>) -> Vec<Duration> {
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.expect("acquisition task"));
        }
        out.sort();
        out
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_the_limit_are_in_flight_and_the_rest_follow_in_turn() {
        let t = Trial::new(2, Duration::from_secs(1));
        let ends = ends(t.run("net1", 6, Duration::from_millis(10))).await;
        assert_eq!(t.peak(), 2);
        // Three rounds of two, 10 ms each.
        assert_eq!(ends.last().copied(), Some(Duration::from_millis(30)));
        assert_eq!(t.pacing.waiting(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_server_gives_its_slot_up_after_the_hold_limit() {
        let t = Trial::new(1, Duration::from_millis(500));
        // The first acquisition never hears back within 10 s; the second
        // starts once the first has held its slot for 500 ms.
        let slow = t.run("net1", 1, Duration::from_secs(10));
        tokio::task::yield_now().await;
        let fast = t.run("net1", 1, Duration::from_millis(10));
        assert_eq!(ends(fast).await, vec![Duration::from_millis(510)]);
        assert_eq!(ends(slow).await, vec![Duration::from_secs(10)]);
    }

    /// The map keeps the networks in use, not every name ever seen; a
    /// network in use keeps its slots.
    #[tokio::test(start_paused = true)]
    async fn idle_networks_are_forgotten() {
        let t = Trial::new(1, Duration::from_secs(5));
        let busy = t.run("busy", 2, Duration::from_secs(1));
        tokio::task::yield_now().await;
        for i in 0..100 {
            let name: &'static str = Box::leak(format!("net{i}").into_boxed_str());
            ends(t.run(name, 1, Duration::from_millis(1))).await;
        }
        assert_eq!(t.pacing.networks(), 2, "the busy one and the last one");
        ends(busy).await;
        assert_eq!(t.peak(), 2, "one on `busy` and one elsewhere at a time");
    }

    #[tokio::test(start_paused = true)]
    async fn networks_are_paced_apart() {
        let t = Trial::new(1, Duration::from_secs(5));
        let a = t.run("net1", 1, Duration::from_secs(2));
        let b = t.run("net2", 1, Duration::from_millis(10));
        assert_eq!(ends(b).await, vec![Duration::from_millis(10)]);
        assert_eq!(ends(a).await, vec![Duration::from_secs(2)]);
        assert_eq!(t.peak(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_limit_of_zero_admits_every_acquisition_at_once() {
        let t = Trial::new(0, Duration::from_secs(1));
        let h = t.run("net1", 5, Duration::from_millis(10));
        assert_eq!(
            ends(h).await.last().copied(),
            Some(Duration::from_millis(10))
        );
        assert_eq!(t.peak(), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn an_acquisition_queued_past_its_deadline_is_refused_with_the_queue_ahead() {
        let t = Trial::new(1, Duration::from_secs(5));
        // One in flight for 10 s (holding its slot for the 5 s limit), one
        // queued behind it; the same on another network, which is not
        // ahead of this one.
        let busy = t.run("net1", 2, Duration::from_secs(10));
        let elsewhere = t.run("net3", 2, Duration::from_secs(10));
        tokio::task::yield_now().await;
        let refused = t.pacing.admit_within("net1", Duration::from_secs(2)).await;
        assert_eq!(refused.err(), Some(2), "one in flight and one queued ahead");
        assert_eq!(
            t.pacing.waiting(),
            2,
            "a refused acquisition leaves the queue"
        );
        assert!(
            t.pacing
                .admit_within("net2", Duration::from_millis(1))
                .await
                .is_ok(),
            "another network has its own slots"
        );
        ends(busy).await;
        ends(elsewhere).await;
        assert!(
            t.pacing
                .admit_within("net1", Duration::from_millis(1))
                .await
                .is_ok()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_counts_the_queue() {
        let t = Trial::new(1, Duration::from_secs(5));
        let h = t.run("net1", 3, Duration::from_millis(100));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(t.pacing.waiting(), 2);
        ends(h).await;
        assert_eq!(t.pacing.waiting(), 0);
    }
}
