//! One acquisition, the one entry every ADD path (a pod, a VM on its pod
//! netdev, a VM through the VFIO handoff) calls: the engine configuration
//! from the attachment's record, one of its network's acquisition slots
//! ([`crate::lease::pacing`]), the lease task ([`Registry::spawn`]) and the
//! wait for its first outcome. On failure the attachment is given up
//! without a trace (task stopped, forgotten, record removed).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use xdhcp_engine::{
    AcquireError, Client, ClientConfig, ClientId, ConfigError, Ipv4Prefix, Lease, Mode,
};

use crate::cni::config::validate_hostname;
use crate::datapath::link::{Link, LinkError};
use crate::lease::apply;
use crate::lease::live::{Exchange, Outcome};
use crate::lease::pacing::{Pacing, Slot};
use crate::lease::persist::LeaseRecord;
use crate::lease::registry::{Handle, Registry};
use crate::model::{ClientIdSetting, HostnameSetting, Network};
use crate::netlink::NetlinkError;

/// Extra time beyond the acquisition timeout for the engine's own failure
/// event (its deadline fires on a timer).
pub(crate) const ADD_MARGIN: Duration = Duration::from_secs(3);

/// The least an admitted acquisition gets to run, however long it queued.
pub(crate) const MIN_ACQUIRE_LEFT: Duration = Duration::from_secs(1);

/// What an acquisition is for.
#[derive(Debug)]
pub(crate) struct Acquisition {
    /// The attachment's record, without a lease yet.
    pub(crate) record: LeaseRecord,
    /// Maintained (pod) or one-shot (VM).
    pub(crate) mode: Mode,
    /// INIT-REBOOT for this address (a migrating VM), else a fresh DORA.
    pub(crate) requested: Option<Ipv4Addr>,
    /// The attachment's opened interface.
    pub(crate) link: Link,
}

/// Why an acquisition ended without a lease.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The engine refused the configuration the network asks for.
    Config(ConfigError),
    /// The v6 engine refused the configuration the network asks for.
    Config6(xdhcp_engine::v6::ConfigError),
    /// No acquisition slot within the acquisition's timeout; `ahead` were
    /// in flight or queued before it.
    Queued { ahead: usize, timeout: Duration },
    /// The lease's port could not be opened.
    Port(LinkError),
    /// The engine gave up, and what it heard.
    NoLease {
        timeout: Duration,
        source: AcquireError,
    },
    /// The v6 engine gave up, and what it heard.
    NoLease6 {
        timeout: Duration,
        source: Box<xdhcp_engine::v6::AcquireError>,
    },
    /// The interface failed (`Some`) or was deleted (`None`) meanwhile.
    LinkFailed(Option<LinkError>),
    /// The agent is shutting down.
    Cancelled,
    /// Bound, but `"apply": true` could not configure the lease (given
    /// back, and what was configured taken off).
    Apply(Arc<NetlinkError>),
    /// Nothing answered by the deadline (or the task ended without a word).
    Silent { timeout: Duration },
}

/// A lease acquired, and where the acquisition's time went.
#[derive(Debug)]
pub(crate) struct Acquired {
    pub(crate) handle: Handle,
    pub(crate) lease: Lease,
    /// Reading what the lease must not reroute, when the link's open had
    /// not (zero when it had).
    pub(crate) protect: Duration,
    /// Waiting for one of the network's acquisition slots.
    pub(crate) slot: Duration,
    /// Inside the lease task: its start, the OFFER, the ACK, the address.
    pub(crate) exchange: Exchange,
}

impl Registry {
    /// [`Registry::acquire_timed`] without the timings.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        pacing: &Pacing,
        base: &ClientConfig,
        a: Acquisition,
    ) -> Result<(Handle, Lease), Failure> {
        let got = self.acquire_timed(pacing, base, a).await?;
        Ok((got.handle, got.lease))
    }

    /// Run the engine on the acquisition's link until the first lease (or
    /// failure), admitted by the network's pacing before the first
    /// DISCOVER; `base` is the agent's engine configuration.
    pub(crate) async fn acquire_timed(
        self: &Arc<Self>,
        pacing: &Pacing,
        base: &ClientConfig,
        mut a: Acquisition,
    ) -> Result<Acquired, Failure> {
        let rec = &a.record;
        let mut cfg = engine_config(base, &rec.network, &rec.args, rec.mac, a.mode, a.requested);
        // Read in the link's own trip into the namespace when it looked
        // (its cost is the open's, so this phase costs nothing); else here,
        // with a connection of its own, and timed.
        let (protected, protect) = if let Some(p) = a.link.take_protected() {
            (p, Duration::ZERO)
        } else {
            let reading = Instant::now();
            let p = apply::protected_in_pod(rec.netns.as_deref(), &rec.ifname).await;
            (p, reading.elapsed())
        };
        cfg.route_policy.protected.extend(protected);
        cfg.validate().map_err(Failure::Config)?;
        let timeout = cfg.acquire_timeout;
        let (slot, waited) = self.admit(pacing, &rec.network.name, timeout).await?;
        cfg.acquire_timeout = timeout.saturating_sub(waited).max(MIN_ACQUIRE_LEFT);
        let client = Client::new(cfg, Instant::now(), crate::sys::clock::seed());
        let (tx, rx) = oneshot::channel();
        let handle = self
            .spawn(a.record, client, a.link, Some(tx))
            .await
            .map_err(|source| {
                self.metrics().failure("interface");
                Failure::Port(source)
            })?;
        let outcome = slot
            .hold_during(tokio::time::timeout(timeout + ADD_MARGIN, rx))
            .await;
        let failure = match outcome {
            Ok(Ok(Outcome::Bound(lease, exchange))) => {
                return Ok(Acquired {
                    handle,
                    lease,
                    protect,
                    slot: waited,
                    exchange,
                });
            }
            Ok(Ok(Outcome::Failed(source))) => Failure::NoLease { timeout, source },
            Ok(Ok(Outcome::LinkFailed(source))) => Failure::LinkFailed(Some(source)),
            Ok(Ok(Outcome::Removed)) => Failure::LinkFailed(None),
            Ok(Ok(Outcome::Cancelled)) => Failure::Cancelled,
            Ok(Ok(Outcome::ApplyFailed(source))) => {
                // Bound at the server: give the address back, nobody uses it.
                self.abandon(&handle, true).await;
                return Err(Failure::Apply(source));
            }
            // No answer by the deadline, or the task ended without one.
            Ok(Err(_)) | Err(_) => {
                self.metrics().failure("acquire_no_reply");
                Failure::Silent { timeout }
            }
        };
        self.abandon(&handle, false).await;
        Err(failure)
    }
}

impl Registry {
    /// One of `network`'s acquisition slots within the acquisition's
    /// `timeout` (both families' acquisitions take one), and how long the
    /// wait took: the engine gets what is left of the timeout.
    pub(crate) async fn admit(
        &self,
        pacing: &Pacing,
        network: &str,
        timeout: Duration,
    ) -> Result<(Slot, Duration), Failure> {
        let asked = Instant::now();
        let slot = pacing
            .admit_within(network, timeout)
            .await
            .map_err(|ahead| {
                self.metrics().failure("acquire_queued");
                Failure::Queued { ahead, timeout }
            })?;
        let waited = asked.elapsed();
        tracing::debug!(
            network,
            waited_us = waited.as_micros(),
            "acquisition admitted"
        );
        Ok((slot, waited))
    }
}

/// The engine configuration of one attachment: the agent's (`base`), then
/// the network's DHCP settings, then identity.
pub(crate) fn engine_config(
    base: &ClientConfig,
    network: &Network,
    args: &BTreeMap<String, String>,
    mac: [u8; 6],
    mode: Mode,
    requested_ip: Option<Ipv4Addr>,
) -> ClientConfig {
    let ipam = &network.ipam;
    let mut cfg = base.clone();
    cfg.chaddr = mac;
    cfg.mode = mode;
    cfg.requested_ip = requested_ip;
    cfg.client_id = match &ipam.client_id {
        ClientIdSetting::Mac => ClientId::Mac,
        ClientIdSetting::None => ClientId::None,
        ClientIdSetting::Raw(b) => ClientId::Raw(b.clone()),
    };
    cfg.hostname = match &ipam.hostname {
        HostnameSetting::PodName => args.get("K8S_POD_NAME").cloned(),
        HostnameSetting::Fixed(h) => Some(h.clone()),
        HostnameSetting::FromArg(k) => args.get(k).cloned(),
    }
    .filter(|h| validate_hostname(h).is_ok());
    if let Some(t) = ipam.timeout {
        cfg.acquire_timeout = t;
    }
    if let Some(m) = ipam.resend_max {
        cfg.retransmit.max_interval = m.max(cfg.retransmit.initial);
    }
    cfg.route_policy.allow_default_override = ipam.allow_default_route_override;
    // The network's own protected prefixes add to the agent's (its flags
    // and the node's networks); they never replace them.
    cfg.route_policy
        .protected
        .extend(ipam.protected_prefixes.iter().map(|p| Ipv4Prefix {
            addr: p.addr,
            len: p.len,
        }));
    cfg
}
