//! The end of a VM's ADD on an IPv6 or dual-stack network, wherever its
//! one-shot discoveries ran — from the launcher pod's netdev
//! ([`crate::ops::vm6`]) or from its VF's netdev during a driver handoff
//! ([`crate::ops::vm`]): the addresses reported in the launcher pod's
//! `pod-networks` entry, every record in place, the CNI result; on a
//! failure the discoveries dropped (never released: the guest owns its
//! bindings).

use std::sync::Arc;

use tracing::warn;

use crate::cni::types::CniResult;
use crate::lease::apply::Address6;
use crate::lease::registry::Handle;
use crate::lease::v6::address6;
use crate::ops::context::Agent;
use crate::ops::error::{Error, LeaseFate};
use crate::ops::report::{
    Deadline, ReportTo, report_address_dual, report_address6, unrecorded, unreport,
};
use crate::rpc::CniRequest;
use crate::sys::sync::lock;

/// What a VM's discoveries bound: the `DHCPv6` lease, and on a dual-stack
/// network the DHCPv4 one.
pub(crate) struct Found {
    pub(crate) v4: Option<(Handle, xdhcp_engine::Lease)>,
    pub(crate) v6: (Handle, xdhcp_engine::v6::Lease),
}

impl Found {
    pub(crate) fn handles(&self) -> impl Iterator<Item = &Handle> {
        self.v4.iter().map(|(h, _)| h).chain([&self.v6.0])
    }
}

/// A VM's ADD once its discoveries are done: its addresses reported with
/// its `mac` (before the answer, in one write: both addresses on a
/// dual-stack network), every record in place, and the CNI result; a
/// failed or stale write, or a record not written, ends the ADD with the
/// leases kept at the server (a VM's are never released) and the port's
/// guard taken off. Also the end of a VFIO VM's ADD, whose discoveries ran
/// on its VF's netdev ([`crate::ops::vm`]). Returns the result and the
/// `DHCPv6` address.
pub(crate) async fn answer(
    agent: &Arc<Agent>,
    req: &CniRequest,
    to: ReportTo<'_>,
    found: &Found,
    mac: [u8; 6],
    deadline: Deadline,
) -> Result<(CniResult, std::net::Ipv6Addr), Error> {
    let (h6, lease6) = &found.v6;
    let router = lock(&h6.live).record.router6;
    let a6 = address6(&lock(&h6.live).record.network, lease6, router);
    if let Err(e) = report(agent, req, to, found, (a6, mac), deadline).await {
        give_back(agent, req, found).await;
        return Err(e);
    }
    // Answer only once every record is in place: a restart must know this
    // VM's discovery is done.
    for h in found.handles() {
        if let Some(reason) = unrecorded(h, deadline).await {
            give_back(agent, req, found).await;
            return Err(unreport(agent, to, deadline, reason).await);
        }
    }
    let result = match &found.v4 {
        Some((_, lease4)) => crate::ops::add_dual::result(lease4, lease6, router, &req.config),
        None => crate::ops::add6::cni_result6(lease6, router, &req.config),
    };
    Ok((result, lease6.address))
}

/// Write the VM's addresses (its `DHCPv6` address `a6`, and beside it the
/// DHCPv4 one of a dual-stack network) with its `mac` in the launcher pod's
/// entry, within the ADD's deadline; the error says the leases are kept.
async fn report(
    agent: &Agent,
    req: &CniRequest,
    to: ReportTo<'_>,
    found: &Found,
    (a6, mac): (Address6, [u8; 6]),
    deadline: Deadline,
) -> Result<(), Error> {
    let (Some(pod), Some(key)) = (to.pod, to.key) else {
        return Ok(());
    };
    let write = async {
        match &found.v4 {
            Some((_, lease4)) => {
                report_address_dual(
                    &*agent.pod_api,
                    pod,
                    key,
                    (lease4, a6),
                    mac,
                    req.netns.as_deref(),
                )
                .await
            }
            None => report_address6(&*agent.pod_api, pod, key, a6, mac, req.netns.as_deref()).await,
        }
    };
    let what = || {
        format!(
            "writing the pod-networks entry of pod {}/{}",
            pod.namespace, pod.name
        )
    };
    let Err(source) = deadline.kube(agent.metrics(), what, write).await else {
        return Ok(());
    };
    let address: std::net::IpAddr = found
        .v4
        .as_ref()
        .map_or(a6.address.into(), |(_, l)| l.address.into());
    warn!(container = %req.container_id, ifname = %req.ifname, %address, address6 = %a6.address,
        error = %crate::rpc::format_chain(&source), "VM ADD not reported; its leases kept at the server");
    Err(Error::NotReported {
        address,
        fate: LeaseFate::KeptForVm,
        source: Box::new(source),
    })
}

/// Drop an ADD's discoveries (their records removed; nothing released:
/// the server keeps the bindings for the VM's DUID and MAC, which its next
/// ADD asks for again) and the port's guard.
async fn give_back(agent: &Arc<Agent>, req: &CniRequest, found: &Found) {
    for h in found.handles() {
        agent.leases.abandon(h, false).await;
    }
    agent.guard.release(&req.container_id, &req.ifname);
}
