//! What a lease task asks of the world besides its port — its record
//! written or removed, its address configured or taken off the interface —
//! as values ([`Effect`]), and the store writer and applier that carry
//! them out ([`Effects`], done by [`Services`]). The task decides; the
//! carrier writes, fsyncs and configures, and logs and counts what fails.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::task::JoinHandle;
use tracing::{info, warn};
use xdhcp_engine::Lease;

use crate::lease::apply;
use crate::lease::persist::{self, Durable, LeaseRecord};
use crate::lease::services::Services;
use crate::netlink::NetlinkError;
use crate::store::{StoreError, Wait};

/// One thing a lease task has done outside itself.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Effect {
    /// Write the record (only one that holds a lease or a first REQUEST's
    /// address is written).
    Persist(Box<LeaseRecord>),
    /// Write the record that an ADD's answer waits for: in place (the
    /// agent's death cannot lose it, a restart reads it) once done, made
    /// durable by the store moments later, off the ADD's path.
    PersistVisible(Box<LeaseRecord>),
    /// Remove the lease's record (its interface is gone): the
    /// attachment's, or its lease of `family` on a dual-stack network.
    Remove {
        container_id: String,
        ifname: String,
        family: Option<crate::model::Family>,
    },
    /// Configure the lease's address and routes on `ifname` in `netns`,
    /// the routes with `metric` (the network's `ipam.priority`).
    Apply {
        netns: PathBuf,
        ifname: String,
        lease: Lease,
        metric: Option<u32>,
    },
    /// Put back what `ifname` in `netns` lacks of the lease's
    /// configuration (a renewal): read first, write only what is missing.
    Repair {
        netns: PathBuf,
        ifname: String,
        lease: Lease,
        metric: Option<u32>,
    },
    /// Take a lost lease's address and routes off `ifname` in `netns`.
    Unapply {
        netns: PathBuf,
        ifname: String,
        lease: Lease,
        metric: Option<u32>,
    },
}

/// Who carries a lease task's effects out. What comes back is what became
/// of a write ([`Durable`]); the other effects come back
/// [`Durable::Saved`] once done (their failures are logged and counted
/// here: the lease goes on).
pub(crate) trait Effects: std::fmt::Debug + Send + Sync + 'static {
    /// Carry `effect` out off the task (a write on the blocking pool).
    fn start(self: Arc<Self>, effect: Effect) -> JoinHandle<Durable>;
    /// Carry `effect` out now, on this thread (a task's last steps: its
    /// record); an address effect is started and not waited for.
    fn now(self: Arc<Self>, effect: Effect) -> Durable;
    /// Carry an address effect out off the task and say how it went (a
    /// first lease whose configuration failed fails its ADD).
    fn address(self: Arc<Self>, effect: Effect) -> JoinHandle<Result<(), Arc<NetlinkError>>>;
}

impl Effects for Services {
    fn start(self: Arc<Self>, effect: Effect) -> JoinHandle<Durable> {
        match effect {
            Effect::Apply { .. } | Effect::Repair { .. } | Effect::Unapply { .. } => {
                tokio::spawn(async move {
                    let _ = self.carry_address(effect).await;
                    Durable::Saved
                })
            }
            Effect::Persist(_) | Effect::PersistVisible(_) | Effect::Remove { .. } => {
                tokio::task::spawn_blocking(move || self.now(effect))
            }
        }
    }

    fn now(self: Arc<Self>, effect: Effect) -> Durable {
        match effect {
            Effect::Persist(rec) => self.save(&rec, Wait::Durable),
            Effect::PersistVisible(rec) => {
                // Tests: a DHCPv6 lease's record slow to be in place.
                #[cfg(feature = "test-hooks")]
                if rec.lease6.is_some() {
                    std::thread::sleep(crate::sys::test_delay::from_env(
                        "XDHCP_TEST_V6_RECORD_DELAY_MS",
                    ));
                }
                self.save(&rec, Wait::Visible)
            }
            Effect::Remove {
                container_id,
                ifname,
                family,
            } => match persist::remove(&self.store, &container_id, &ifname, family) {
                Ok(()) => Durable::Saved,
                Err(e) => {
                    warn!(error = %crate::rpc::format_chain(&e), "could not remove the lease record");
                    Durable::Failed(Arc::new(e))
                }
            },
            Effect::Apply { .. } | Effect::Repair { .. } | Effect::Unapply { .. } => {
                tokio::spawn(async move { self.carry_address(effect).await });
                Durable::Saved
            }
        }
    }

    fn address(self: Arc<Self>, effect: Effect) -> JoinHandle<Result<(), Arc<NetlinkError>>> {
        tokio::spawn(async move { self.carry_address(effect).await })
    }
}

impl Services {
    /// Write `rec` as `wait` says; a failure is logged and counted.
    fn save(&self, rec: &LeaseRecord, wait: Wait) -> Durable {
        match persist::save(&self.store, rec, wait) {
            Ok(()) => Durable::Saved,
            Err(e) => {
                self.metrics.failure("persist");
                warn!(container = %rec.container_id, ifname = %rec.ifname, error = %crate::rpc::format_chain(&e),
                    "could not persist the lease; a restart would lose it");
                Durable::Failed(Arc::new(e))
            }
        }
    }

    /// Configure or take off an address; a failure is logged (and, for a
    /// configuration, counted) and returned.
    async fn carry_address(&self, effect: Effect) -> Result<(), Arc<NetlinkError>> {
        let done = match &effect {
            Effect::Apply {
                netns,
                ifname,
                lease,
                metric,
            } => apply::configure(netns, ifname, lease, *metric)
                .await
                .inspect_err(|e| {
                    self.metrics.failure("apply");
                    warn!(error = %crate::rpc::format_chain(e), "could not configure the leased address");
                }),
            Effect::Repair {
                netns,
                ifname,
                lease,
                metric,
            } => match apply::repair(netns, ifname, lease, *metric).await {
                Ok(put_back) => {
                    if !put_back.is_empty() {
                        info!(?put_back, "put back what the interface lacked of the lease");
                    }
                    Ok(())
                }
                Err(e) => {
                    self.metrics.failure("apply");
                    warn!(error = %crate::rpc::format_chain(&e),
                        "could not put back the leased address or routes");
                    Err(e)
                }
            },
            Effect::Unapply {
                netns,
                ifname,
                lease,
                metric,
            } => apply::deconfigure(netns, ifname, lease, *metric)
                .await
                .inspect_err(|e| {
                    warn!(error = %crate::rpc::format_chain(e), "could not remove the lost address");
                }),
            Effect::Persist(_) | Effect::PersistVisible(_) | Effect::Remove { .. } => Ok(()),
        };
        done.map_err(Arc::new)
    }

    /// What became of an effect [`Effects::start`] started (a carrier that
    /// died is a failed write, logged and counted).
    pub(crate) async fn settled(&self, carried: JoinHandle<Durable>) -> Durable {
        self.joined(carried.await)
    }

    /// [`Services::settled`] for a carrier already awaited.
    pub(crate) fn joined(&self, carried: Result<Durable, tokio::task::JoinError>) -> Durable {
        carried.unwrap_or_else(|e| {
            self.metrics.failure("persist");
            warn!(error = %e, "could not persist the lease; a restart would lose it");
            Durable::Failed(Arc::new(StoreError::Io {
                op: "write the lease record in a blocking task",
                path: self.store.leases_dir().to_path_buf(),
                source: std::io::Error::other(e.to_string()),
            }))
        })
    }
}
