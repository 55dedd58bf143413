//! The cluster's `DhcpGuardPolicy` objects (`xdhcp.io/v1alpha1`,
//! cluster-scoped), as a watch of the API server keeps them: a reflector
//! (list, then watch) whose every change is checked
//! ([`xdhcp_api::guard::PolicyBook`]) and handed on as one table, network
//! (NAD or network name) → the settings its object sets. The guard applies
//! the table to every port of each network (`guard.rs`).
//!
//! An invalid object is refused with the reason in the log (once per
//! version of its verdict): the settings of its last good version stay,
//! or, if it never had one, its network keeps its settings without one.
//! Two objects naming one network: the first by name holds it.
//!
//! Needs `list` and `watch` on `dhcpguardpolicies.xdhcp.io`. While the API
//! cannot be reached, the CRD is not installed or the role lacks the verbs,
//! the table keeps what it last had (empty before the first list); each
//! failure is logged once until the watch runs again, and the watch
//! retries with the runtime's default backoff.

use std::collections::BTreeMap;
use std::future::Future;

use futures::StreamExt;
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tracing::{info, warn};
use xdhcp_api::guard::{DhcpGuardPolicy, GuardOverrides, PolicyBook, Verdict};

use super::client::KubeClient;

/// Network (NAD or network name) → what its `DhcpGuardPolicy` sets.
pub type GuardTable = BTreeMap<String, GuardOverrides>;

/// The table as the watch last showed it, and the task that keeps it (run
/// it until shutdown).
pub fn follow(
    client: &KubeClient,
) -> (
    watch::Receiver<GuardTable>,
    impl Future<Output = ()> + Send + 'static,
) {
    let api: Api<DhcpGuardPolicy> = Api::all(client.raw().clone());
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default())
            .modify(|p| p.metadata.managed_fields = None)
            .default_backoff(),
    );
    let (tx, rx) = watch::channel(GuardTable::new());
    let task = async move {
        let mut stream = std::pin::pin!(stream);
        let mut book = PolicyBook::default();
        let mut said: BTreeMap<String, Verdict> = BTreeMap::new();
        let mut failing: Option<String> = None;
        let mut listed = false;
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::InitDone) => {
                    if !listed {
                        listed = true;
                        info!("the DhcpGuardPolicy objects are listed; watching them");
                    }
                    publish(&store, &mut book, &mut said, &tx);
                }
                Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                    if failing.take().is_some() {
                        info!("watching the DhcpGuardPolicy objects again");
                    }
                    publish(&store, &mut book, &mut said, &tx);
                }
                Ok(_) => {}
                Err(e) => {
                    let text = crate::rpc::format_chain(&e);
                    if failing.as_deref() != Some(&text) {
                        warn!(error = %text,
                            "cannot list or watch DhcpGuardPolicy objects (is the CRD installed? the role needs list and watch on dhcpguardpolicies.xdhcp.io); networks keep their last guard settings; retrying");
                        failing = Some(text);
                    }
                }
            }
        }
        warn!("the watch of DhcpGuardPolicy objects ended; its last state is kept");
        std::future::pending::<()>().await;
    };
    (rx, task)
}

/// Check every object the store holds, log each verdict that changed, and
/// send the table when it changed.
fn publish(
    store: &Store<DhcpGuardPolicy>,
    book: &mut PolicyBook,
    said: &mut BTreeMap<String, Verdict>,
    tx: &watch::Sender<GuardTable>,
) {
    let objects = store.state();
    let named: Vec<(String, &DhcpGuardPolicy)> =
        objects.iter().map(|o| (o.name_any(), o.as_ref())).collect();
    let verdicts = book.update(named.iter().map(|(n, o)| (n.as_str(), &o.spec)));
    for (name, verdict) in &verdicts {
        if said.get(name) == Some(verdict) {
            continue;
        }
        match verdict {
            Verdict::Applied { network } => {
                info!(policy = %name, %network, "DhcpGuardPolicy applied to its network's ports");
            }
            Verdict::Refused { error, kept } => {
                warn!(policy = %name, %error,
                    kept = kept.as_deref().unwrap_or("-"),
                    "DhcpGuardPolicy refused; the network keeps the settings it had (its last good version's, if any)");
            }
        }
    }
    *said = verdicts;
    let table = book.table();
    tx.send_if_modified(|t| {
        if *t == table {
            return false;
        }
        *t = table;
        true
    });
}
