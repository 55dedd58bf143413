//! Where the node uplinks come from: the `--uplink` flags, or, without
//! them, Open vSwitch. The follower here reads the node's `Open_vSwitch`
//! database (`--ovsdb`) through the daemon's [`xdhcp_ovsdb::NodeWatch`]
//! (shared with the workload ports' follower, `workloads.rs`) and hands the
//! capture actor the uplinks of every `ovn-bridge-mappings` entry each time
//! the view changes (a mapping, a bridge or a port added, removed or
//! renamed): [`Capture::set_uplinks`] attaches the new and detaches the
//! gone.
//!
//! The attach mode follows the bridge's datapath. Under the kernel
//! datapath both TC and XDP run before the openvswitch module's handler
//! sees a frame; under the userspace one (`datapath_type=netdev`)
//! `ovs-vswitchd` reads the port through a packet socket, which the kernel
//! feeds after XDP but before TC ingress, so only XDP consumes a reply
//! before OVS has it (docs/uplinks.md). The same holds for the DHCP guard
//! on the workload ports of the integration bridge: the follower tells it
//! which ports are on the userspace datapath, and it polices those at XDP
//! (docs/dhcp-guard.md).
//!
//! No database (no socket, or no answer): the agent runs without uplinks,
//! says so once in the log and in `xdhcp status`, and keeps trying; once it
//! has read a view, it keeps the uplinks it last read while the database is
//! away.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use xdhcp_ovsdb::{Datapath as OvsDatapath, NodeState, NodeView, UplinkKind};

use crate::datapath::AttachMode;
use crate::datapath::capture::{UplinkSource, UplinkSpec};
use crate::ops::context::Agent;
use crate::rpc::UplinkSourceStatus;
use crate::settings::AgentArgs;

/// What `xdhcp status` says before the follower has heard anything.
pub(super) fn source_at_start(args: &AgentArgs) -> UplinkSourceStatus {
    if args.uplinks.is_empty() {
        UplinkSourceStatus {
            kind: UplinkSource::Ovs.as_str().to_owned(),
            ovsdb: Some(args.ovsdb.clone()),
            state: Some("connecting".to_owned()),
            reason: None,
        }
    } else {
        UplinkSourceStatus {
            kind: UplinkSource::Flag.as_str().to_owned(),
            ovsdb: None,
            state: None,
            reason: None,
        }
    }
}

/// How long start-up waits for the first word from OVS before it resumes
/// persisted leases (which find their uplink only once it is held).
pub(super) const FIRST_VIEW_WAIT: Duration = Duration::from_secs(2);

/// Follow the uplinks of Open vSwitch until `token` is cancelled; `first`
/// is told once the first view is applied or the database is found absent.
pub(super) async fn follow_ovs(
    agent: Arc<Agent>,
    mut rx: watch::Receiver<NodeState>,
    token: CancellationToken,
    first: oneshot::Sender<()>,
) {
    let mut follower = Follower {
        agent,
        first: Some(first),
        ever_read: false,
        said_unavailable: false,
        skipped: Vec::new(),
    };
    loop {
        let state = rx.borrow_and_update().clone();
        follower.apply(&state);
        if !changed(&mut rx, &token).await {
            return;
        }
    }
}

/// Wait for the next state; `false` when cancelled (the watcher never ends
/// while a receiver lives).
async fn changed(rx: &mut watch::Receiver<NodeState>, token: &CancellationToken) -> bool {
    tokio::select! {
        () = token.cancelled() => false,
        r = rx.changed() => r.is_ok(),
    }
}

struct Follower {
    agent: Arc<Agent>,
    first: Option<oneshot::Sender<()>>,
    /// A view was read once (the uplinks then stay while OVS is away).
    ever_read: bool,
    /// The absence was logged (once, until a view is read).
    said_unavailable: bool,
    /// Uplinks of the view that cannot be captured on, as last logged.
    skipped: Vec<String>,
}

impl Follower {
    fn apply(&mut self, state: &NodeState) {
        match state {
            // The watcher's first word, before it tried anything.
            NodeState::Unavailable { reason } if reason == "connecting" && !self.ever_read => {}
            NodeState::Unavailable { reason } => {
                if !self.said_unavailable {
                    self.said_unavailable = true;
                    let socket = self.agent.args.ovsdb.display().to_string();
                    if self.ever_read {
                        warn!(ovsdb = %socket, reason = %reason,
                            "the Open vSwitch database went away; keeping the uplinks last read from it");
                    } else {
                        warn!(ovsdb = %socket, reason = %reason,
                            "no Open vSwitch database: no uplinks are read from OVS (give --uplink to name them); every lease takes its per-interface path");
                    }
                }
                self.status("unavailable", Some(reason.clone()));
                self.tell_first();
            }
            NodeState::Ready(view) => {
                let specs = self.specs(view);
                if !self.ever_read {
                    info!(ovsdb = %self.agent.args.ovsdb.display(),
                        uplinks = ?specs.iter().map(|s| format!("{}={}", s.physnet.as_deref().unwrap_or(""), s.ifname)).collect::<Vec<_>>(),
                        "reading the uplinks of ovn-bridge-mappings from Open vSwitch");
                }
                self.ever_read = true;
                self.said_unavailable = false;
                self.agent.capture().set_uplinks(&specs);
                self.status("connected", None);
                self.tell_first();
            }
        }
    }

    /// [`specs_of`] `view`, logging the ports left out when they change.
    fn specs(&mut self, view: &NodeView) -> Vec<UplinkSpec> {
        let (specs, skipped) = specs_of(view);
        if skipped != self.skipped {
            if !skipped.is_empty() {
                warn!(ports = ?skipped, "uplinks without a kernel device of their own are not captured on; their leases take the per-interface path");
            }
            self.skipped = skipped;
        }
        specs
    }

    fn status(&self, state: &str, reason: Option<String>) {
        let mut s = self
            .agent
            .uplink_source
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        s.state = Some(state.to_owned());
        s.reason = reason;
    }

    fn tell_first(&mut self) {
        if let Some(tx) = self.first.take() {
            let _ = tx.send(());
        }
    }
}

/// Whether `view` has an uplink the capture can hold.
pub(super) fn has_uplinks(view: &NodeView) -> bool {
    !specs_of(view).0.is_empty()
}

/// The uplinks of `view` the capture can hold, and the ports left out:
/// kernel network devices only (a DPDK port has none; an `AF_XDP` port's
/// device carries OVS's own XDP program), one per interface (several
/// physical networks mapped to one bridge share its ports, and are named
/// together).
fn specs_of(view: &NodeView) -> (Vec<UplinkSpec>, Vec<String>) {
    let mut skipped = Vec::new();
    let mut specs: Vec<UplinkSpec> = Vec::new();
    for u in &view.uplinks {
        if u.kind != UplinkKind::System {
            skipped.push(format!("{} ({:?})", u.ifname, u.kind));
            continue;
        }
        if let Some(held) = specs.iter_mut().find(|s| s.ifname == u.ifname) {
            if let Some(p) = held.physnet.as_mut() {
                p.push(',');
                p.push_str(&u.physnet);
            }
            continue;
        }
        specs.push(UplinkSpec {
            ifname: u.ifname.clone(),
            physnet: Some(u.physnet.clone()),
            bridge: Some(u.bridge.clone()),
            source: UplinkSource::Ovs,
            attach: attach_for(&u.datapath),
        });
    }
    (specs, skipped)
}

/// The workload ports of `view` whose bridge is on the userspace datapath:
/// `ovs-vswitchd` reads them through packet sockets, before TC ingress, so
/// the DHCP guard polices them at XDP.
pub(super) fn userspace_ports(view: &NodeView) -> BTreeSet<String> {
    if view.integration_datapath != Some(OvsDatapath::Netdev) {
        return BTreeSet::new();
    }
    view.workloads.iter().map(|w| w.ifname.clone()).collect()
}

/// The attach mode an uplink of a bridge on `datapath` needs: XDP under
/// the userspace datapath (native where the driver has it, generic
/// otherwise: the attach falls back on its own); the per-device default
/// (or `--attach`) under the kernel one.
fn attach_for(datapath: &OvsDatapath) -> Option<AttachMode> {
    match datapath {
        OvsDatapath::Netdev => Some(AttachMode::XdpNative),
        OvsDatapath::System | OvsDatapath::Other(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uplink(physnet: &str, bridge: &str, ifname: &str, kind: UplinkKind) -> xdhcp_ovsdb::Uplink {
        xdhcp_ovsdb::Uplink {
            ifname: ifname.to_owned(),
            physnet: physnet.to_owned(),
            bridge: bridge.to_owned(),
            datapath: OvsDatapath::Netdev,
            kind,
            bond: None,
        }
    }

    #[test]
    fn one_uplink_per_interface_and_no_port_without_a_kernel_device() {
        let view = NodeView {
            integration_bridge: "br-int".to_owned(),
            integration_datapath: None,
            mappings: Vec::new(),
            uplinks: vec![
                uplink("physnet1", "br-ex", "eth1", UplinkKind::System),
                uplink("physnet2", "br-ex", "eth1", UplinkKind::System),
                uplink("physnet3", "br-dpdk", "dpdk0", UplinkKind::Dpdk),
            ],
            workloads: Vec::new(),
            warnings: Vec::new(),
        };
        let (specs, skipped) = specs_of(&view);
        assert_eq!(specs.len(), 1, "{specs:?}");
        assert_eq!(specs[0].ifname, "eth1");
        assert_eq!(specs[0].physnet.as_deref(), Some("physnet1,physnet2"));
        assert_eq!(specs[0].bridge.as_deref(), Some("br-ex"));
        assert_eq!(specs[0].attach, Some(AttachMode::XdpNative));
        assert_eq!(skipped, ["dpdk0 (Dpdk)"]);
    }

    #[test]
    fn workload_ports_of_a_userspace_integration_bridge_are_guarded_at_xdp() {
        let port = |ifname: &str| xdhcp_ovsdb::WorkloadPort {
            ifname: ifname.to_owned(),
            iface_id: format!("ns_{ifname}"),
            pod_uid: None,
            sandbox: None,
            attached_mac: None,
            pod_if_name: None,
            network: None,
            nad: None,
            vf_netdev_name: None,
            vf_is_vfio: false,
            ovn_installed: true,
        };
        let mut view = NodeView {
            integration_bridge: "br-int".to_owned(),
            integration_datapath: Some(OvsDatapath::Netdev),
            mappings: Vec::new(),
            uplinks: Vec::new(),
            workloads: vec![port("a1b2c3_3"), port("d4e5f6_4")],
            warnings: Vec::new(),
        };
        assert_eq!(
            userspace_ports(&view).into_iter().collect::<Vec<_>>(),
            ["a1b2c3_3", "d4e5f6_4"]
        );
        // The kernel datapath (or no integration bridge): TC, as on a
        // Linux bridge.
        view.integration_datapath = Some(OvsDatapath::System);
        assert!(userspace_ports(&view).is_empty());
        view.integration_datapath = None;
        assert!(userspace_ports(&view).is_empty());
    }

    #[test]
    fn a_userspace_datapath_uplink_needs_xdp_and_a_kernel_one_the_default() {
        assert_eq!(
            attach_for(&OvsDatapath::Netdev),
            Some(AttachMode::XdpNative)
        );
        assert_eq!(attach_for(&OvsDatapath::System), None);
    }
}
