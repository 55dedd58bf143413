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
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self {
            view: ViewOptions::default(),
            database: VSWITCH_DB.to_owned(),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            probe_interval: Some(Duration::from_secs(5)),
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
    #[error("the server did not answer an echo within {after:?}")]
    ProbeTimeout { after: Duration },
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

async fn run(socket: &Path, options: &WatchOptions, tx: &watch::Sender<NodeState>) {
    let mut delay = options.backoff_initial;
    loop {
        let mut monitored = false;
        let Err(error) = session(socket, options, tx, &mut monitored).await;
        if monitored {
            delay = options.backoff_initial;
            tracing::warn!(socket = %socket.display(), %error, "OVSDB monitor lost; reconnecting");
        } else {
            tracing::debug!(socket = %socket.display(), %error, ?delay, "OVSDB not available");
        }
        publish(
            tx,
            NodeState::Unavailable {
                reason: error.to_string(),
            },
        );
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(options.backoff_max);
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
    let (client, mut events) = Client::connect(socket).await?;
    let schema = client.get_schema(&options.database).await?;
    let mut monitor = client
        .monitor(&options.database, schema, &monitor_requests())
        .await?;
    *monitored = true;
    tracing::info!(socket = %socket.display(), kind = ?monitor.kind, "OVSDB monitor running");
    publish(
        tx,
        NodeState::Ready(node_view(&monitor.replica, &options.view)),
    );

    let mut probe = options.probe_interval.map(|period| {
        let mut i = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        (i, period)
    });
    loop {
        let probe_tick = async {
            match probe.as_mut() {
                Some((i, period)) => {
                    i.tick().await;
                    *period
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
            period = probe_tick => {
                match tokio::time::timeout(period, client.echo()).await {
                    Ok(result) => result?,
                    Err(_) => return Err(WatchError::ProbeTimeout { after: period }),
                }
            }
        }
    }
}
