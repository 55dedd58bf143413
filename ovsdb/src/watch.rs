//! The node view, kept current: a task that monitors the local OVSDB
//! server and publishes a [`NodeState`] on a `watch` channel within
//! milliseconds of each database change (the server pushes the change; no
//! polling), and reconnects on its own with a capped exponential backoff,
//! starting over with a fresh monitor and a new replica each time, so a
//! restarted server (perhaps with another database) is seen as it is.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::watch;

use crate::client::{Applied, Client, Error, Event};
use crate::node::{NodeView, ViewOptions, monitor_requests, node_view};

/// The database `ovs-vswitchd` uses.
pub const VSWITCH_DB: &str = "Open_vSwitch";

/// How the watcher runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchOptions {
    pub view: ViewOptions,
    /// The database to monitor.
    pub database: String,
    /// The first wait after a failed or lost connection; it doubles on each
    /// failure up to `backoff_max`, and starts over once a monitor runs.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// How often to `echo` the server to find a hung one (a dead one closes
    /// the socket, which is seen at once); `None`: never.
    pub probe_interval: Option<Duration>,
    /// How long the server may take to answer a call (the schema, the
    /// monitor, a probe) before the connection counts as lost: a hung
    /// server still accepts connections.
    pub reply_timeout: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self {
            view: ViewOptions::default(),
            database: VSWITCH_DB.to_owned(),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            probe_interval: Some(Duration::from_secs(5)),
            reply_timeout: Duration::from_secs(5),
        }
    }
}

/// What the agent knows about the node's Open vSwitch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeState {
    /// No monitor runs: not connected yet, or the connection was lost.
    Unavailable { reason: String },
    /// The view of the database as the server last reported it.
    Ready(NodeView),
}

/// Why a monitoring session ended.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error(transparent)]
    Ovsdb(#[from] Error),
    #[error("the server did not answer {call} within {after:?}")]
    Timeout { call: &'static str, after: Duration },
}

/// The node watcher.
#[derive(Debug)]
pub struct NodeWatch;

impl NodeWatch {
    /// Starts watching the OVSDB server at `socket` on the current tokio
    /// runtime. The task runs until every receiver is dropped.
    pub fn spawn(socket: impl Into<PathBuf>, options: WatchOptions) -> watch::Receiver<NodeState> {
        let (tx, rx) = watch::channel(NodeState::Unavailable {
            reason: "connecting".to_owned(),
        });
        let socket = socket.into();
        tokio::spawn(async move {
            tokio::select! {
                () = tx.closed() => {}
                () = run(&socket, &options, &tx) => {}
            }
        });
        rx
    }
}

/// Waits between connection attempts: `initial`, doubling on each failure
/// up to `max`, back to `initial` once a monitor has run.
#[derive(Debug, Clone)]
struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            next: initial.min(max),
        }
    }

    /// The wait before the next attempt.
    fn delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (d * 2).min(self.max);
        d
    }

    fn reset(&mut self) {
        self.next = self.initial.min(self.max);
    }
}

async fn run(socket: &Path, options: &WatchOptions, tx: &watch::Sender<NodeState>) {
    let mut backoff = Backoff::new(options.backoff_initial, options.backoff_max);
    loop {
        let mut monitored = false;
        let Err(error) = session(socket, options, tx, &mut monitored).await;
        if monitored {
            backoff.reset();
            tracing::warn!(socket = %socket.display(), %error, "OVSDB monitor lost; reconnecting");
        } else {
            tracing::debug!(socket = %socket.display(), %error, "OVSDB not available");
        }
        publish(
            tx,
            NodeState::Unavailable {
                reason: error.to_string(),
            },
        );
        tokio::time::sleep(backoff.delay()).await;
    }
}

/// Publishes `state` if it differs from the last one, so receivers wake
/// only on a change; logs the view's warnings when they change.
fn publish(tx: &watch::Sender<NodeState>, state: NodeState) {
    tx.send_if_modified(|current| {
        if *current == state {
            return false;
        }
        if let NodeState::Ready(view) = &state {
            let before = match current {
                NodeState::Ready(v) => v.warnings.as_slice(),
                NodeState::Unavailable { .. } => &[],
            };
            if view.warnings != before {
                for w in &view.warnings {
                    tracing::warn!(warning = %w, "Open vSwitch node view");
                }
            }
        }
        *current = state;
        true
    });
}

/// One connection: schema, monitor, then updates until it breaks.
async fn session(
    socket: &Path,
    options: &WatchOptions,
    tx: &watch::Sender<NodeState>,
    monitored: &mut bool,
) -> Result<Infallible, WatchError> {
    let after = options.reply_timeout;
    let timeout = |call| move |_: tokio::time::error::Elapsed| WatchError::Timeout { call, after };
    let (client, mut events) = tokio::time::timeout(after, Client::connect(socket))
        .await
        .map_err(timeout("connect"))??;
    let schema = tokio::time::timeout(after, client.get_schema(&options.database))
        .await
        .map_err(timeout("get_schema"))??;
    let mut monitor = tokio::time::timeout(
        after,
        client.monitor(&options.database, schema, &monitor_requests()),
    )
    .await
    .map_err(timeout("the monitor request"))??;
    *monitored = true;
    tracing::info!(socket = %socket.display(), kind = ?monitor.kind, "OVSDB monitor running");
    publish(
        tx,
        NodeState::Ready(node_view(&monitor.replica, &options.view)),
    );

    let mut probe = options.probe_interval.map(|period| {
        let mut i = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        i
    });
    loop {
        let probe_tick = async {
            match probe.as_mut() {
                Some(i) => {
                    i.tick().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            event = events.recv() => match event {
                Some(Event::Notification { method, params }) => {
                    if monitor.apply(&method, &params)? == Applied::Updated {
                        publish(tx, NodeState::Ready(node_view(&monitor.replica, &options.view)));
                    }
                }
                Some(Event::Closed(e)) => return Err(e.into()),
                None => return Err(Error::Closed.into()),
            },
            () = probe_tick => {
                tokio::time::timeout(after, client.echo())
                    .await
                    .map_err(timeout("an echo"))??;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::Framer;
    use crate::{ViewWarning, node::Uplink};
    use serde_json::{Value as Json, json};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{UnixListener, UnixStream};
    use tokio::sync::mpsc;

    fn fixture(text: &str) -> Json {
        serde_json::from_str(text).unwrap()
    }

    /// The next message the client sent.
    async fn recv(stream: &mut UnixStream, framer: &mut Framer) -> Json {
        let mut buf = [0u8; 4096];
        loop {
            if let Some(m) = framer.next_message().unwrap() {
                return m;
            }
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "the client hung up");
            framer.push(&buf[..n]);
        }
    }

    async fn send(stream: &mut UnixStream, msg: &Json) {
        stream.write_all(msg.to_string().as_bytes()).await.unwrap();
    }

    /// A server from before `monitor_cond` (Open vSwitch < 2.6), speaking
    /// with replies recorded from a real one: it answers `monitor_cond` with
    /// the recorded "unknown method", `monitor` with the recorded initial
    /// rows, then checks that the client answers its `echo`, and sends the
    /// recorded `update` of `ovn-bridge-mappings` gaining `physnet2` on the
    /// first connection only. It hangs up when told to.
    async fn old_server(
        listener: UnixListener,
        echoed: mpsc::UnboundedSender<Json>,
        mut hang_up: mpsc::UnboundedReceiver<()>,
    ) {
        for connection in 0.. {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut framer = Framer::default();
            let req = recv(&mut s, &mut framer).await;
            assert_eq!(req["method"], "get_schema");
            let mut reply = fixture(include_str!("../fixtures/get_schema_reply.json"));
            reply["id"] = req["id"].clone();
            send(&mut s, &reply).await;

            let req = recv(&mut s, &mut framer).await;
            assert_eq!(req["method"], "monitor_cond");
            let mut reply = fixture(include_str!("../fixtures/unknown_method_reply.json"));
            reply["id"] = req["id"].clone();
            send(&mut s, &reply).await;

            let req = recv(&mut s, &mut framer).await;
            assert_eq!(req["method"], "monitor");
            let monitor_id = req["params"][1].clone();
            let mut reply = fixture(include_str!("../fixtures/monitor_reply.json"));
            reply["id"] = req["id"].clone();
            send(&mut s, &reply).await;

            send(
                &mut s,
                &json!({"id": "probe", "method": "echo", "params": ["hello"]}),
            )
            .await;
            echoed.send(recv(&mut s, &mut framer).await).unwrap();

            if connection == 0 {
                let mut update = fixture(include_str!("../fixtures/update_mapping_added.json"));
                update["params"][0] = monitor_id;
                send(&mut s, &update).await;
            }
            hang_up.recv().await.unwrap();
        }
    }

    fn physnets(state: &NodeState) -> Vec<String> {
        match state {
            NodeState::Ready(v) => v.mappings.iter().map(|m| m.physnet.clone()).collect(),
            NodeState::Unavailable { .. } => Vec::new(),
        }
    }

    fn uplinks(state: &NodeState) -> Vec<Uplink> {
        match state {
            NodeState::Ready(v) => v.uplinks.clone(),
            NodeState::Unavailable { .. } => Vec::new(),
        }
    }

    #[test]
    fn the_backoff_doubles_up_to_its_cap_and_starts_over_after_a_monitor() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(500));
        let delays: Vec<_> = (0..5).map(|_| b.delay()).collect();
        assert_eq!(delays, [ms(100), ms(200), ms(400), ms(500), ms(500)]);
        b.reset();
        assert_eq!(b.delay(), ms(100));
    }

    #[tokio::test]
    async fn a_server_that_accepts_but_never_answers_is_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("db.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let server = tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                held.push(listener.accept().await.unwrap().0);
            }
        });
        let mut rx = NodeWatch::spawn(
            &socket,
            WatchOptions {
                reply_timeout: Duration::from_millis(50),
                ..WatchOptions::default()
            },
        );
        let state = tokio::time::timeout(
            Duration::from_secs(10),
            rx.wait_for(
                |s| matches!(s, NodeState::Unavailable { reason } if reason != "connecting"),
            ),
        )
        .await
        .unwrap()
        .unwrap()
        .clone();
        assert_eq!(
            state,
            NodeState::Unavailable {
                reason: "the server did not answer get_schema within 50ms".into()
            }
        );
        drop(rx);
        server.abort();
    }

    #[tokio::test]
    async fn an_old_server_is_monitored_with_monitor_and_resynced_after_it_hangs_up() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("db.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let (echo_tx, mut echoed) = mpsc::unbounded_channel();
        let (hang_up, hang_up_rx) = mpsc::unbounded_channel();
        let server = tokio::spawn(old_server(listener, echo_tx, hang_up_rx));
        let options = WatchOptions {
            backoff_initial: Duration::from_millis(10),
            probe_interval: None,
            ..WatchOptions::default()
        };
        let mut rx = NodeWatch::spawn(&socket, options);
        let timeout = Duration::from_secs(10);

        // The recorded update: physnet2 mapped to a bridge that is missing.
        let state = tokio::time::timeout(
            timeout,
            rx.wait_for(|s| physnets(s) == ["physnet1", "physnet2"]),
        )
        .await
        .unwrap()
        .unwrap()
        .clone();
        let NodeState::Ready(view) = &state else {
            unreachable!()
        };
        assert_eq!(
            view.warnings,
            [ViewWarning::MappedBridgeMissing {
                physnet: "physnet2".into(),
                bridge: "br-phys2".into()
            }]
        );
        assert_eq!(uplinks(&state).len(), 3);
        assert_eq!(
            echoed.recv().await.unwrap(),
            json!({"id": "probe", "result": ["hello"], "error": null})
        );

        // Hung up: unavailable, then a fresh monitor whose replica holds
        // the initial rows only (physnet2 is gone).
        hang_up.send(()).unwrap();
        tokio::time::timeout(
            timeout,
            rx.wait_for(|s| matches!(s, NodeState::Unavailable { .. })),
        )
        .await
        .unwrap()
        .unwrap();
        tokio::time::timeout(timeout, rx.wait_for(|s| physnets(s) == ["physnet1"]))
            .await
            .unwrap()
            .unwrap();
        assert!(echoed.recv().await.is_some());
        drop(rx);
        server.abort();
    }
}
