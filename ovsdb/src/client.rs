//! An OVSDB client on a unix socket: calls (`get_schema`, `transact`,
//! `monitor_cond`/`monitor`, `echo`), answers to the server's `echo`, and a
//! stream of the server's notifications.
//!
//! One task reads the socket and one writes it. The reader answers `echo`
//! itself (the server drops a client that stays silent past its inactivity
//! probe), hands replies to their callers and queues notifications for
//! whoever holds the [`Events`]. The queue is unbounded so the reader never
//! waits for a consumer that itself waits for a reply.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value as Json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::replica::{Replica, Row, UpdateError};
use crate::rpc::{FrameError, Framer, Message, NotAMessage};
use crate::schema::{DatabaseSchema, SchemaError};
use crate::value::Value;

/// Where `ovs-vswitchd` and OVN look for the local database by default.
pub const DEFAULT_SOCKET: &str = "/var/run/openvswitch/db.sock";

/// Everything that can go wrong talking to the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("connecting to {}: {source}", path.display())]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("reading the OVSDB socket: {source}")]
    Read { source: std::io::Error },
    #[error("writing the OVSDB socket: {source}")]
    Write { source: std::io::Error },
    #[error("the server closed the connection")]
    Closed,
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error(transparent)]
    Message(#[from] NotAMessage),
    #[error("{method} failed: {error}")]
    Rpc { method: String, error: Json },
    #[error("unexpected {method} reply: {json}")]
    Reply { method: String, json: String },
    #[error("transaction operation {index} failed: {error}{}", details.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Operation {
        index: usize,
        error: String,
        details: Option<String>,
    },
    #[error("the server's schema: {0}")]
    Schema(#[from] SchemaError),
    #[error("applying an update: {0}")]
    Update(#[from] UpdateError),
    #[error("the server cancelled the monitor (its schema changed, or the database was removed)")]
    MonitorCanceled,
}

impl Error {
    /// Whether this is the server saying it does not know the method (how
    /// servers before `monitor_cond` answer it).
    pub fn is_unknown_method(&self) -> bool {
        matches!(self, Self::Rpc { error, .. } if error.as_str() == Some("unknown method")
            || error.get("error").and_then(Json::as_str) == Some("unknown method"))
    }
}

/// Something the server sent unasked, in order; [`Event::Closed`] last.
#[derive(Debug)]
pub enum Event {
    /// `update`, `update2`, `monitor_canceled`…
    Notification { method: String, params: Json },
    /// The connection ended: [`Error::Closed`] on end of stream, or the
    /// reason it broke.
    Closed(Error),
}

/// The server's notifications.
pub type Events = mpsc::UnboundedReceiver<Event>;

type Reply = Result<Json, Json>;

#[derive(Default)]
struct Pending {
    calls: HashMap<u64, oneshot::Sender<Reply>>,
    /// Set by the reader as it ends: no reply will come.
    closed: bool,
}

/// A connection to an OVSDB server. Dropping it closes the connection.
pub struct Client {
    out: mpsc::UnboundedSender<Vec<u8>>,
    pending: Arc<Mutex<Pending>>,
    next_id: AtomicU64,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
    }
}

/// One operation of a `transact`. Reads are all this client needs.
#[derive(Debug, Clone, PartialEq)]
pub enum Operation {
    /// Rows of `table` matching every condition (all rows if none), with
    /// `columns` (all if `None`).
    Select {
        table: String,
        conditions: Vec<Condition>,
        columns: Option<Vec<String>>,
    },
}

/// A `<condition>`: `column function value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub column: String,
    pub function: Function,
    pub value: Value,
}

/// A condition's `<function>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Function {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Includes,
    Excludes,
}

impl Function {
    fn as_str(self) -> &'static str {
        match self {
            Self::Eq => "==",
            Self::Ne => "!=",
            Self::Lt => "<",
            Self::Le => "<=",
            Self::Gt => ">",
            Self::Ge => ">=",
            Self::Includes => "includes",
            Self::Excludes => "excludes",
        }
    }
}

impl Operation {
    fn to_json(&self) -> Json {
        match self {
            Self::Select {
                table,
                conditions,
                columns,
            } => {
                let mut op = serde_json::json!({
                    "op": "select",
                    "table": table,
                    "where": conditions
                        .iter()
                        .map(|c| serde_json::json!([c.column, c.function.as_str(), c.value.to_json()]))
                        .collect::<Vec<_>>(),
                });
                if let Some(cols) = columns {
                    op["columns"] = Json::from(cols.clone());
                }
                op
            }
        }
    }
}

/// What one operation returned.
#[derive(Debug, Clone, PartialEq)]
pub enum OperationResult {
    /// A select's rows.
    Rows(Vec<Row>),
}

/// Which tables and columns a monitor watches (`None`: all columns).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MonitorRequests {
    pub tables: Vec<(String, Option<Vec<String>>)>,
}

impl MonitorRequests {
    fn to_json(&self) -> Json {
        let mut m = serde_json::Map::new();
        for (table, columns) in &self.tables {
            let mut req = serde_json::Map::new();
            if let Some(cols) = columns {
                req.insert("columns".into(), Json::from(cols.clone()));
            }
            m.insert(table.clone(), Json::Array(vec![Json::Object(req)]));
        }
        Json::Object(m)
    }
}

/// Which monitor the server accepted, and so which notifications carry its
/// updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MonitorKind {
    /// `monitor_cond`: `update2` diffs.
    Cond,
    /// `monitor` (servers before Open vSwitch 2.6): `update` rows.
    Plain,
}

/// A monitor's replica and how to keep it current.
#[derive(Debug, Clone)]
pub struct Monitor {
    pub kind: MonitorKind,
    /// The id the server puts first in each notification's params.
    pub id: Json,
    pub schema: DatabaseSchema,
    pub replica: Replica,
}

/// What a notification did to a [`Monitor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The replica changed.
    Updated,
    /// Not this monitor's (another monitor's update, a lock notice…).
    Ignored,
}

impl Monitor {
    /// Applies one notification to the replica. `monitor_canceled` is
    /// [`Error::MonitorCanceled`]: the replica can no longer be kept and a
    /// new monitor must replace it.
    pub fn apply(&mut self, method: &str, params: &Json) -> Result<Applied, Error> {
        let (id, updates) = match params.as_array().map(Vec::as_slice) {
            Some([id, updates, ..]) => (id, updates),
            Some([id]) => (id, &Json::Null),
            _ => (&Json::Null, &Json::Null),
        };
        if *id != self.id {
            return Ok(Applied::Ignored);
        }
        match (method, self.kind) {
            ("update2", MonitorKind::Cond) => {
                self.replica.apply_update2(&self.schema, updates)?;
                Ok(Applied::Updated)
            }
            ("update", MonitorKind::Plain) => {
                self.replica.apply_update(updates)?;
                Ok(Applied::Updated)
            }
            ("monitor_canceled", _) => Err(Error::MonitorCanceled),
            _ => Ok(Applied::Ignored),
        }
    }
}

impl Client {
    /// Connects to the server at `path` (a unix socket).
    pub async fn connect(path: &Path) -> Result<(Self, Events), Error> {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|source| Error::Connect {
                path: path.to_owned(),
                source,
            })?;
        let (mut rd, mut wr) = stream.into_split();
        let (out, mut out_rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let (ev_tx, ev_rx) = mpsc::unbounded_channel();
        let pending = Arc::new(Mutex::new(Pending::default()));

        let writer = tokio::spawn(async move {
            while let Some(bytes) = out_rx.recv().await {
                if let Err(e) = wr.write_all(&bytes).await {
                    tracing::debug!(error = %e, "OVSDB socket write failed");
                    // The reader sees the broken connection and reports it.
                    return;
                }
            }
        });

        let reader_pending = Arc::clone(&pending);
        let reader_out = out.clone();
        let reader = tokio::spawn(async move {
            let end = read_loop(&mut rd, &reader_pending, &reader_out, &ev_tx).await;
            let calls = {
                let mut p = reader_pending
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                p.closed = true;
                std::mem::take(&mut p.calls)
            };
            // Dropping the senders fails every waiting call with Closed.
            drop(calls);
            let _ = ev_tx.send(Event::Closed(end));
        });

        Ok((
            Self {
                out,
                pending,
                next_id: AtomicU64::new(1),
                reader,
                writer,
            },
            ev_rx,
        ))
    }

    /// Calls `method` with `params` and waits for the reply.
    pub async fn call(&self, method: &str, params: Json) -> Result<Json, Error> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self
                .pending
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if p.closed {
                return Err(Error::Closed);
            }
            p.calls.insert(id, tx);
        }
        let msg = Message::Request {
            id: Json::from(id),
            method: method.to_owned(),
            params,
        };
        if self
            .out
            .send(msg.to_json().to_string().into_bytes())
            .is_err()
        {
            return Err(Error::Closed);
        }
        match rx.await {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(error)) => Err(Error::Rpc {
                method: method.to_owned(),
                error,
            }),
            Err(_) => Err(Error::Closed),
        }
    }

    /// `echo`: a round trip that proves the server is alive.
    pub async fn echo(&self) -> Result<(), Error> {
        self.call("echo", serde_json::json!(["xdhcp"]))
            .await
            .map(drop)
    }

    /// The schema of database `db`.
    pub async fn get_schema(&self, db: &str) -> Result<DatabaseSchema, Error> {
        let json = self.call("get_schema", serde_json::json!([db])).await?;
        Ok(DatabaseSchema::from_json(&json)?)
    }

    /// Runs `ops` as one transaction on `db`. A failed operation is
    /// [`Error::Operation`] (the server then ran none of them).
    pub async fn transact(
        &self,
        db: &str,
        ops: &[Operation],
    ) -> Result<Vec<OperationResult>, Error> {
        let mut params = vec![Json::from(db)];
        params.extend(ops.iter().map(Operation::to_json));
        let json = self.call("transact", Json::Array(params)).await?;
        parse_transact_reply(ops, &json)
    }

    /// Starts a monitor of `requests` on `db` with `monitor_cond`, or with
    /// `monitor` when the server does not know `monitor_cond`, and returns
    /// it with the replica of the initial reply. Its updates arrive as
    /// [`Event::Notification`]s for [`Monitor::apply`].
    pub async fn monitor(
        &self,
        db: &str,
        schema: DatabaseSchema,
        requests: &MonitorRequests,
    ) -> Result<Monitor, Error> {
        let id = Json::from(format!("xdhcp-{db}"));
        let params = serde_json::json!([db, id, requests.to_json()]);
        let (kind, initial) = match self.call("monitor_cond", params.clone()).await {
            Ok(initial) => (MonitorKind::Cond, initial),
            Err(e) if e.is_unknown_method() => {
                tracing::debug!("the server has no monitor_cond: falling back to monitor");
                (MonitorKind::Plain, self.call("monitor", params).await?)
            }
            Err(e) => return Err(e),
        };
        let mut replica = Replica::default();
        match kind {
            MonitorKind::Cond => replica.apply_update2(&schema, &initial)?,
            MonitorKind::Plain => replica.apply_update(&initial)?,
        }
        Ok(Monitor {
            kind,
            id,
            schema,
            replica,
        })
    }
}

fn parse_transact_reply(ops: &[Operation], json: &Json) -> Result<Vec<OperationResult>, Error> {
    let bad = || Error::Reply {
        method: "transact".into(),
        json: json.to_string(),
    };
    let results = json.as_array().ok_or_else(bad)?;
    // An error beyond the operations (a commit failure) comes last.
    for (index, r) in results.iter().enumerate() {
        if let Some(error) = r.get("error").and_then(Json::as_str) {
            return Err(Error::Operation {
                index,
                error: error.to_owned(),
                details: r.get("details").and_then(Json::as_str).map(str::to_owned),
            });
        }
    }
    if results.len() < ops.len() {
        return Err(bad());
    }
    ops.iter()
        .zip(results)
        .map(|(op, r)| match op {
            Operation::Select { table, .. } => {
                let rows = r.get("rows").and_then(Json::as_array).ok_or_else(bad)?;
                rows.iter()
                    .map(|row| {
                        let uuid = row
                            .get("_uuid")
                            .and_then(|u| u.get(1))
                            .and_then(Json::as_str)
                            .unwrap_or("");
                        Row::from_json(table, uuid, row).map_err(Error::from)
                    })
                    .collect::<Result<_, _>>()
                    .map(OperationResult::Rows)
            }
        })
        .collect()
}

/// Reads messages until the stream ends or breaks; returns why.
async fn read_loop(
    rd: &mut tokio::net::unix::OwnedReadHalf,
    pending: &Mutex<Pending>,
    out: &mpsc::UnboundedSender<Vec<u8>>,
    events: &mpsc::UnboundedSender<Event>,
) -> Error {
    let mut framer = Framer::default();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match rd.read(&mut buf).await {
            Ok(0) => return Error::Closed,
            Ok(n) => n,
            Err(source) => return Error::Read { source },
        };
        framer.push(&buf[..n]);
        loop {
            let json = match framer.next_message() {
                Ok(Some(json)) => json,
                Ok(None) => break,
                Err(e) => return e.into(),
            };
            match Message::from_json(json) {
                Ok(Message::Response { id, result }) => {
                    let tx = id.as_u64().and_then(|id| {
                        pending
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .calls
                            .remove(&id)
                    });
                    if let Some(tx) = tx {
                        let _ = tx.send(result);
                    } else {
                        tracing::debug!(%id, "OVSDB reply to no call of ours");
                    }
                }
                Ok(Message::Request { id, method, params }) => {
                    // RFC 7047 §4.1.11: echo returns its params.
                    let result = if method == "echo" {
                        Ok(params)
                    } else {
                        Err(Json::from("unknown method"))
                    };
                    let reply = Message::Response { id, result }.to_json().to_string();
                    if out.send(reply.into_bytes()).is_err() {
                        return Error::Closed;
                    }
                }
                Ok(Message::Notification { method, params }) => {
                    // Nobody listening is fine: calls still work.
                    let _ = events.send(Event::Notification { method, params });
                }
                Err(e) => return e.into(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn select_operations_are_written_as_rfc_7047_says() {
        let op = Operation::Select {
            table: "Bridge".into(),
            conditions: vec![Condition {
                column: "name".into(),
                function: Function::Eq,
                value: Value::Atom(crate::Atom::String("br-int".into())),
            }],
            columns: Some(vec!["name".into(), "ports".into()]),
        };
        assert_eq!(
            op.to_json(),
            json!({"op": "select", "table": "Bridge",
                   "where": [["name", "==", "br-int"]], "columns": ["name", "ports"]})
        );
    }

    #[test]
    fn recorded_transact_replies_give_rows_or_typed_errors() {
        let select = Operation::Select {
            table: "Bridge".into(),
            conditions: Vec::new(),
            columns: Some(vec!["name".into(), "datapath_type".into(), "ports".into()]),
        };
        let reply: Json =
            serde_json::from_str(include_str!("../fixtures/transact_select_reply.json")).unwrap();
        let [OperationResult::Rows(rows)] =
            parse_transact_reply(std::slice::from_ref(&select), &reply["result"])
                .unwrap()
                .try_into()
                .unwrap();
        let names: Vec<_> = rows.iter().map(|r| r.str("name")).collect();
        assert_eq!(names, ["br-ex", "br-int"]);
        assert_eq!(rows[1].str("datapath_type"), "netdev");
        assert_eq!(rows[0].uuids("ports").count(), 4);

        let reply: Json =
            serde_json::from_str(include_str!("../fixtures/transact_error_reply.json")).unwrap();
        match parse_transact_reply(&[select], &reply["result"]) {
            Err(Error::Operation {
                index: 0,
                error,
                details: Some(details),
            }) => {
                assert_eq!(error, "syntax error");
                assert!(details.contains("No table named NoSuchTable"), "{details}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unknown_method_is_recognised_in_both_spellings() {
        let e = |error: Json| Error::Rpc {
            method: "monitor_cond".into(),
            error,
        };
        assert!(e(json!("unknown method")).is_unknown_method());
        assert!(e(json!({"error": "unknown method"})).is_unknown_method());
        assert!(!e(json!("syntax error")).is_unknown_method());
    }
}
