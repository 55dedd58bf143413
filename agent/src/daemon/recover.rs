//! At start: load the persisted attachments and resume their leases without
//! a new DISCOVER.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt as _;
use tracing::{error, info, warn};
use xdhcp_engine::{Client, Mode};

use crate::datapath::link::{Link, LinkError, Sockets};
use crate::lease::acquire::engine_config;
use crate::lease::live::expiry_ms;
use crate::lease::persist::{self, LeaseRecord, WorkloadKind};
use crate::ops::context::Agent;
use crate::settings::ExpiredPolicy;
use crate::sys::clock::seed;

/// Leases resumed at once. Each resume is one trip into the pod's network
/// namespace (interface up, the link's details, removal watch), on the
/// runtime worker that runs it; a few in flight keep both workers busy.
const RESUME_IN_FLIGHT: usize = 16;

/// How long a renewal adopted from the previous agent waits for its reply
/// before it is sent again: the reply the ring kept is handed over as
/// recovery ends, well within this; one lost in the handover (read by the
/// previous agent's reader as it stopped) costs this, not RFC 2131's minute.
const ADOPTED_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// Load persisted attachments and resume them without a new DISCOVER.
///
/// Runs while the agent socket answers ([`Registry::begin_recovery`] is
/// called before it does): the records are listed first and each one's
/// attachment held, so an operation on it waits until it is resumed (or
/// forgotten), while operations on every other attachment go ahead. Each
/// record's attachment is let go as soon as that record is settled.
///
/// [`Registry::begin_recovery`]: crate::lease::registry::Registry::begin_recovery
pub(crate) async fn recover(agent: &Arc<Agent>) {
    let started = Instant::now();
    let store = agent.clone();
    let loaded = tokio::task::spawn_blocking(move || persist::load_all(&store.svc.store))
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    let (records, quarantined) = match loaded {
        Ok(x) => x,
        Err(e) => {
            error!(error = %crate::rpc::format_chain(&e),
                "cannot read the lease directory; starting without recovered leases");
            agent.metrics().failure("recover");
            agent.leases.recovered();
            return;
        }
    };
    for q in quarantined {
        agent.metrics().failure("corrupt_record");
        warn!(record = %q.what, reason = %q.reason, "unusable lease record set aside");
    }
    for rec in &records {
        agent
            .leases
            .hold_for_recovery(&rec.container_id, &rec.ifname)
            .await;
    }
    agent.leases.listed();
    let loaded_ms = started.elapsed().as_millis();
    let now_ms = crate::sys::clock::now_unix_ms();
    let mut to_resume = Vec::with_capacity(records.len());
    // Every port is guarded again, a namespace trip and a netlink query
    // each: in the background, a few at a time, once the leases are
    // resumed (one after another before them, a thousand records took
    // seconds, and the ports were unguarded all the while the agent was
    // down anyway).
    // One port per attachment: a dual-stack one has two records.
    let mut to_guard: Vec<LeaseRecord> = records
        .iter()
        .filter(|rec| rec.netns.as_deref().is_some_and(std::path::Path::exists))
        .cloned()
        .collect();
    to_guard.dedup_by(|a, b| (&a.container_id, &a.ifname) == (&b.container_id, &b.ifname));
    for rec in records {
        let (cid, ifname) = (rec.container_id.clone(), rec.ifname.clone());
        if let WorkloadKind::Vm { .. } = rec.workload {
            // One-shot discoveries are not maintained; keep them for CHECK/DEL.
            agent.leases.insert_static(rec);
            agent.leases.resumed(&cid, &ifname);
            continue;
        }
        let expired = rec
            .lease
            .as_ref()
            .and_then(expiry_ms)
            .is_some_and(|e| e <= now_ms);
        if expired && agent.args.expired_lease_policy == ExpiredPolicy::Drop {
            info!(container = %rec.container_id, ifname = %rec.ifname,
                "lease expired while the agent was down; dropped (--expired-lease-policy=drop)");
            forget(agent, &rec);
            agent.leases.resumed(&cid, &ifname);
            continue;
        }
        to_resume.push(rec);
    }
    #[cfg(feature = "test-hooks")]
    // Tests: a recovery slow enough to be seen while the socket answers.
    let delay = crate::sys::test_delay::from_env("XDHCP_TEST_RESUME_DELAY_MS");
    let resumed = futures::stream::iter(to_resume)
        .map(|rec| async move {
            #[cfg(feature = "test-hooks")]
            tokio::time::sleep(delay).await;
            let r = resume_one(agent, rec.clone(), now_ms).await;
            let ok = settle(agent, &rec, r);
            agent.leases.resumed(&rec.container_id, &rec.ifname);
            ok
        })
        .buffer_unordered(RESUME_IN_FLIGHT)
        .filter(|ok| std::future::ready(*ok))
        .count()
        .await;
    let guarding = agent.clone();
    tokio::spawn(async move {
        let started = Instant::now();
        let n = to_guard.len();
        futures::stream::iter(to_guard)
            .map(|rec| guard_one(&guarding, rec))
            .buffer_unordered(RESUME_IN_FLIGHT)
            .collect::<Vec<()>>()
            .await;
        info!(
            records = n,
            ms = started.elapsed().as_millis(),
            "recovered ports guarded again"
        );
    });
    agent.leases.recovered();
    info!(
        resumed,
        load_ms = loaded_ms,
        total_ms = started.elapsed().as_millis(),
        "lease state recovered"
    );
}

/// What became of one record's resume; whether its lease runs.
fn settle(agent: &Agent, rec: &LeaseRecord, resumed: Result<(), LinkError>) -> bool {
    match resumed {
        Ok(()) => true,
        // Gone before DEL, but its uplink is known: DEL releases it there.
        Err(e)
            if e.is_interface_gone()
                && rec.uplink.is_some()
                && (rec.lease.is_some() || rec.lease6.is_some())
                && rec.workload == WorkloadKind::Pod =>
        {
            info!(container = %rec.container_id, ifname = %rec.ifname,
                "interface gone; the lease is kept until DEL releases it through the uplink");
            agent.leases.insert_static(rec.clone());
            false
        }
        Err(e) => {
            warn!(container = %rec.container_id, ifname = %rec.ifname, error = %crate::rpc::format_chain(&e),
                "cannot resume the lease (interface or namespace gone); forgetting it");
            forget(agent, rec);
            false
        }
    }
}

/// Guard a recovered record's port again.
async fn guard_one(agent: &Arc<Agent>, rec: LeaseRecord) {
    if let Some(ns) = rec.netns.as_deref() {
        // A pod's record holds its interface's MAC, a VM's the VM's.
        let vm = rec.workload != WorkloadKind::Pod;
        crate::ops::guard_port::guard_port(
            agent,
            &rec.container_id,
            &rec.ifname,
            ns,
            crate::ops::guard_port::PortNetwork::of_record(&rec.network),
            (rec.mac, vm),
            crate::guard::HostEnd::default(),
        )
        .await;
    }
}

/// An IPv6 attachment: its interface's index (the link brought up, as for
/// IPv4), then the lease task on a new socket.
async fn resume_v6(agent: &Arc<Agent>, rec: LeaseRecord, now_ms: u64) -> Result<(), LinkError> {
    let Some(netns) = rec.netns.clone() else {
        return Err(LinkError::Io {
            op: "resume a DHCPv6 lease",
            ifname: rec.ifname.clone(),
            netns: None,
            source: std::io::Error::other("the record names no network namespace"),
        });
    };
    let ifindex = Link::open(Some(&netns), &rec.ifname, Sockets::Later)?
        .info
        .ifindex;
    agent
        .leases
        .resume6(agent.base.acquire_timeout, rec, netns, ifindex, now_ms)
        .await
        .map(|_| ())
}

fn forget(agent: &Agent, rec: &LeaseRecord) {
    if let Err(e) = persist::remove(
        &agent.svc.store,
        &rec.container_id,
        &rec.ifname,
        rec.lease_family,
    ) {
        warn!(container = %rec.container_id, ifname = %rec.ifname, error = %crate::rpc::format_chain(&e),
            "could not remove the lease record");
    }
}

async fn resume_one(agent: &Arc<Agent>, rec: LeaseRecord, now_ms: u64) -> Result<(), LinkError> {
    if rec.family() == crate::model::Family::Ipv6 {
        return resume_v6(agent, rec, now_ms).await;
    }
    // No packet socket yet: the lease opens its sender (and, until the
    // ring buffer serves it, its receiver) before its first transmit.
    let link = Link::open(rec.netns.as_deref(), &rec.ifname, Sockets::Later)?.with_src_mac(rec.mac);
    let now = Instant::now();
    // A record holds a lease or, stopped with its first REQUEST out (its
    // ADD may have answered), the address to ask for again (INIT-REBOOT).
    let mut cfg = engine_config(
        &agent.base,
        &rec.network,
        &rec.args,
        rec.mac,
        Mode::Maintain,
        rec.requested,
    );
    // The server that offered it, so a DEL before any answer releases it
    // there (the previous agent's REQUEST may have been acknowledged).
    cfg.requested_from = rec.requested_from;
    cfg.route_policy
        .protected
        .extend(crate::lease::apply::protected_in_pod(rec.netns.as_deref(), &rec.ifname).await);
    let client = if let Some(l) = rec.lease.clone() {
        info!(container = %rec.container_id, ifname = %rec.ifname, address = %l.address,
            "resuming lease without DISCOVER");
        let mut client = Client::resume_planned(cfg, l, rec.planned_xids, now, now_ms, seed());
        // The previous agent's renewal (or rebinding) in flight: its xid is
        // still owned in the pinned map. Taken over, so the reply the ring
        // kept while no agent ran completes it, instead of a new REQUEST.
        let sent = rec.planned_xids.and_then(|p| {
            [p.rebind, p.renew]
                .into_iter()
                .find(|x| agent.svc.capture.sent_by_previous_agent(*x))
        });
        if let Some(xid) = sent
            && client.adopt_sent(now, xid, ADOPTED_GRACE)
        {
            info!(container = %rec.container_id, ifname = %rec.ifname, xid, state = client.state().label(),
                "adopted the previous agent's transaction in flight");
        }
        client
    } else {
        info!(container = %rec.container_id, ifname = %rec.ifname, requested = ?rec.requested,
            "resuming an acquisition whose REQUEST was out (INIT-REBOOT)");
        Client::new(cfg, now, seed())
    };
    agent
        .leases
        .spawn(rec, client, link, None)
        .await
        .map(|_| ())
}
