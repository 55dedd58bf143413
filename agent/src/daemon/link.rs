//! Per-lease link I/O: the raw-socket sender and, when the eBPF path is not
//! used for this interface, the filtered `AF_PACKET` receiver — both opened
//! inside the target namespace ([`crate::datapath::rawsock`],
//! [`crate::datapath::afpacket`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};

use tracing::debug;
use xdhcp_engine::Transmit;

use crate::datapath::RxFrame;
use crate::datapath::afpacket::AfPacketReceiver;
use crate::datapath::rawsock::{
    LinkInfo, LinkRemovalWatch, RawSender, RawSockError, is_gone_errno,
};
use crate::sys::netns::run_in_netns_async;

/// Failure opening or using a link.
pub(super) type LinkError = RawSockError;

/// What one trip into the namespace opens for a link.
type Opened = (
    RawSender,
    Option<AfPacketReceiver>,
    Option<LinkRemovalWatch>,
);

/// The sender for one interface, plus (`AF_PACKET` fallback) its receiver.
///
/// Both are packet sockets, and closing a packet socket waits for an RCU
/// grace period (`packet_release` -> `synchronize_net`, 5-30 ms). Dropping a
/// link (DEL, interface gone) or its receiver (capture moved to eBPF)
/// therefore hands the sockets to [`close_later`] instead of blocking the
/// async worker that runs the lease task.
#[derive(Debug)]
pub(super) struct Link {
    pub ifname: String,
    pub netns: Option<PathBuf>,
    pub info: LinkInfo,
    /// The hardware address the DHCP client uses (`chaddr`): the
    /// interface's, or a VM's. The receiver takes only replies for it.
    client_mac: [u8; 6],
    /// Always present; taken only by `Drop`.
    tx: Option<RawSender>,
    rx: Option<AfPacketReceiver>,
    /// Interface-removal notifications (pod namespaces only).
    watch: Option<LinkRemovalWatch>,
    watch_failed: AtomicBool,
}

impl Drop for Link {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            close_later(Box::new(tx));
        }
        if let Some(rx) = self.rx.take() {
            close_later(Box::new(rx));
        }
    }
}

/// Threads that close packet sockets; a fixed number, so the thread count
/// stays O(1) in the lease count. Concurrent closes share grace periods.
const CLOSERS: usize = 2;

type Closing = Box<dyn Send>;

/// Close `sock` (drop it) on a background closer thread; inline if none
/// could be started.
pub(super) fn close_later(sock: Closing) {
    static QUEUE: OnceLock<Option<Mutex<mpsc::Sender<Closing>>>> = OnceLock::new();
    let queue = QUEUE.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Closing>();
        let rx = Arc::new(Mutex::new(rx));
        let mut started = 0;
        for i in 0..CLOSERS {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("xdhcp-close{i}"))
                .stack_size(64 * 1024)
                .spawn(move || {
                    loop {
                        let next = rx
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .recv();
                        match next {
                            Ok(sock) => drop(sock),
                            Err(_) => break,
                        }
                    }
                });
            started += usize::from(spawned.is_ok());
        }
        (started > 0).then(|| Mutex::new(tx))
    });
    let rejected = match queue {
        Some(q) => q
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .send(sock)
            .err()
            .map(|e| e.0),
        None => Some(sock),
    };
    drop(rejected);
}

impl Link {
    /// Open the sender (and, with `afpacket_rx`, the receiver) on `ifname`
    /// inside `netns` (`None`: the agent's own namespace, e.g. a VF netdev
    /// during the VFIO handoff).
    pub(super) async fn open(
        netns: Option<&Path>,
        ifname: &str,
        afpacket_rx: bool,
    ) -> Result<Self, LinkError> {
        // Main plugins may hand the interface over still down (bridge,
        // macvlan): bring it up first, as the upstream dhcp plugin does. One
        // trip into the namespace does both.
        let name = ifname.to_owned();
        let ns_owned = netns.map(Path::to_path_buf);
        // The receiver registers with this runtime's reactor even though it
        // is created on the namespace thread: one trip for everything.
        let runtime = tokio::runtime::Handle::current();
        let watched = netns.is_some();
        let work = move || -> Result<Opened, LinkError> {
            let in_ns = |e: RawSockError| match e {
                RawSockError::InterfaceGone { ifname, source, .. } => LinkError::InterfaceGone {
                    ifname,
                    netns: ns_owned.clone(),
                    source,
                },
                other => other,
            };
            crate::sys::ifreq::ensure_up(&name).map_err(|source| {
                if is_gone_errno(&source) {
                    LinkError::InterfaceGone {
                        ifname: name.clone(),
                        netns: ns_owned.clone(),
                        source,
                    }
                } else {
                    LinkError::Io {
                        op: "bring the interface up",
                        ifname: name.clone(),
                        netns: ns_owned.clone(),
                        source,
                    }
                }
            })?;
            let _entered = runtime.enter();
            // Subscribed before the sender binds: a deletion after this point
            // is queued on the watch, one before it fails the bind.
            let watch = if watched {
                Some(
                    LinkRemovalWatch::open_here().map_err(|source| LinkError::Io {
                        op: "subscribe to link notifications",
                        ifname: name.clone(),
                        netns: ns_owned.clone(),
                        source,
                    })?,
                )
            } else {
                None
            };
            let tx = RawSender::open_here(&name).map_err(in_ns)?;
            let rx = if afpacket_rx {
                let rx = AfPacketReceiver::open_here(&name).map_err(in_ns)?;
                rx.only_for(tx.info().mac).map_err(in_ns)?;
                Some(rx)
            } else {
                None
            };
            Ok((tx, rx, watch))
        };
        let (tx, rx, watch) = match netns {
            Some(ns) => run_in_netns_async(ns, work).await??,
            None => work()?,
        };
        Ok(Self {
            ifname: ifname.to_owned(),
            netns: netns.map(Path::to_path_buf),
            info: tx.info(),
            client_mac: tx.info().mac,
            tx: Some(tx),
            rx,
            watch,
            watch_failed: AtomicBool::new(false),
        })
    }

    /// Open the `AF_PACKET` receiver on a link that has none (opened
    /// without one, or its capture moved to eBPF and was lost since).
    pub(crate) async fn open_rx(&mut self) -> Result<(), LinkError> {
        if self.rx.is_none() {
            let rx = match &self.netns {
                Some(ns) => AfPacketReceiver::open_async(ns, &self.ifname).await?,
                None => AfPacketReceiver::open_here(&self.ifname)?,
            };
            rx.only_for(self.client_mac)?;
            self.rx = Some(rx);
        }
        Ok(())
    }

    /// Send frames with `mac` as the Ethernet source (a VM's MAC).
    #[must_use]
    pub(super) fn with_src_mac(mut self, mac: [u8; 6]) -> Self {
        self.tx = self.tx.take().map(|tx| tx.with_src_mac(mac));
        if mac == self.client_mac {
            return self;
        }
        self.client_mac = mac;
        if let Some(rx) = &self.rx
            && let Err(error) = rx.only_for(mac)
        {
            // Still correct (the engine ignores other clients' replies),
            // only busier: say so and go on.
            tracing::warn!(ifname = %self.ifname, %error,
                "receiving DHCP replies for every client on this interface");
        }
        self
    }

    /// Send one engine transmit.
    pub(super) fn send(&self, t: &Transmit) -> Result<(), LinkError> {
        self.tx
            .as_ref()
            .expect("the sender is present until the link is dropped")
            .send_transmit(t)
    }

    /// Close the `AF_PACKET` receiver (capture moved to eBPF), off this thread.
    pub(super) fn drop_rx(&mut self) {
        if let Some(rx) = self.rx.take() {
            close_later(Box::new(rx));
        }
    }

    /// Next DHCP server→client frame from the `AF_PACKET` receiver. Pends
    /// forever when the link has none (the eBPF dispatcher delivers instead).
    pub(super) async fn recv(&self) -> Result<RxFrame, LinkError> {
        match &self.rx {
            Some(rx) => rx.recv().await,
            None => std::future::pending().await,
        }
    }

    /// Stop watching for the interface's removal (a one-shot discovery
    /// ends at BOUND and never asks).
    pub(super) fn drop_watch(&mut self) {
        self.watch = None;
    }

    /// Resolves once the interface is deleted (or moved out of its
    /// namespace). Pends forever when the link has no watch (opened in the
    /// agent's own namespace) or the watch failed; cancel-safe.
    pub(super) async fn removed(&self) {
        let (Some(w), Some(tx)) = (&self.watch, &self.tx) else {
            return std::future::pending().await;
        };
        if self.watch_failed.load(Ordering::Relaxed) {
            return std::future::pending().await;
        }
        if let Err(e) = w.removed(self.info.ifindex, tx).await {
            debug!(ifname = %self.ifname, error = %e,
                "link notifications failed; interface removal is noticed at the next send");
            self.watch_failed.store(true, Ordering::Relaxed);
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn missing_interface_is_gone() {
        let e = Link::open(None, "xdt-nope0", false).await.unwrap_err();
        assert!(e.is_interface_gone(), "{e}");
    }
}
