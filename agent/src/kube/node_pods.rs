//! The pods of this agent's node, as a watch of the API server keeps them:
//! a reflector (list, then watch, with `fieldSelector=spec.nodeName=<node>`)
//! whose store answers "which pod is `ns/name`, and what is its UID now"
//! without a request per ADD. An ADD that comes without `CNI_ARGS` (as
//! ovnkube-node execs the `dhcp` plugin) finds its pod's name and UID in
//! Open vSwitch and the pod object here.
//!
//! Needs `list` and `watch` on pods (cluster-wide, narrowed by the field
//! selector). While the API cannot be reached, or the role lacks the verbs,
//! the store keeps what it last had (empty before the first list); each
//! failure is logged once until the watch runs again, and the watch retries
//! with the runtime's default backoff.

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{info, warn};

use super::PodInfo;
use super::client::{KubeClient, pod_info};

/// The node's pods as the watch last showed them.
#[derive(Clone)]
pub struct NodePods {
    store: Store<Pod>,
    node: String,
}

impl std::fmt::Debug for NodePods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodePods")
            .field("node", &self.node)
            .field("pods", &self.store.state().len())
            .finish()
    }
}

/// The field selector of node `node`'s pods.
pub fn node_selector(node: &str) -> String {
    format!("spec.nodeName={node}")
}

impl NodePods {
    /// The store of `client`'s node's pods, and the task that keeps it
    /// (run it until shutdown); `None` for a client without a node.
    pub fn follow(
        client: &KubeClient,
    ) -> Option<(NodePods, impl Future<Output = ()> + Send + 'static)> {
        let node = client.node()?.to_owned();
        let api: Api<Pod> = Api::all(client.raw().clone());
        let config = watcher::Config::default().fields(&node_selector(&node));
        let (store, writer) = reflector::store();
        let stream = reflector::reflector(
            writer,
            watcher(api, config)
                // Only identity is read: the field managers are dead weight.
                .modify(|pod| pod.metadata.managed_fields = None)
                .default_backoff(),
        );
        let label = node.clone();
        let task = async move {
            let mut stream = std::pin::pin!(stream);
            let mut failing: Option<String> = None;
            let mut listed = false;
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::InitDone) if !listed => {
                        listed = true;
                        info!(node = %label, "the pods of this node are listed; watching them");
                    }
                    Ok(_) => {
                        if failing.take().is_some() {
                            info!(node = %label, "watching the pods of this node again");
                        }
                    }
                    Err(e) => {
                        let text = crate::rpc::format_chain(&e);
                        if failing.as_deref() != Some(&text) {
                            warn!(node = %label, error = %text,
                                "cannot list or watch the pods of this node (the role needs list and watch on pods); retrying");
                            failing = Some(text);
                        }
                    }
                }
            }
            // The watcher retries for ever; should its stream end anyway,
            // the store keeps what it has (the agent goes on without
            // updates rather than stop).
            warn!(node = %label, "the watch of this node's pods ended; its last state is kept");
            std::future::pending::<()>().await;
        };
        Some((NodePods { store, node }, task))
    }

    /// Whether the first list is in.
    pub fn listed(&self) -> bool {
        matches!(
            futures::FutureExt::now_or_never(self.store.wait_until_ready()),
            Some(Ok(()))
        )
    }

    /// Pod `ns/name`, if the watch has it.
    pub fn get(&self, ns: &str, name: &str) -> Option<PodInfo> {
        let pod: Arc<Pod> = self.store.get(&ObjectRef::new(name).within(ns))?;
        Some(pod_info(ns, name, &pod))
    }

    /// The pod with UID `uid`, if the watch has it.
    pub fn by_uid(&self, uid: &str) -> Option<PodInfo> {
        let pod = self
            .store
            .find(|p| p.metadata.uid.as_deref() == Some(uid))?;
        let meta = &pod.metadata;
        Some(pod_info(
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
            &pod,
        ))
    }
}
