//! An in-process fake of the few Kubernetes API endpoints xdhcp uses.
//!
//! **This is not a cluster.** It is an HTTP/1 server on `127.0.0.1:0` that
//! speaks just enough of the API for the real `kube::Client` to be driven
//! against it:
//! - `GET   /api/v1/namespaces/{ns}/pods/{name}`
//! - `PATCH /api/v1/namespaces/{ns}/pods/{name}` — JSON merge patch only
//!   (`application/merge-patch+json`, RFC 7386), with the
//!   `metadata.resourceVersion` precondition enforced as the API server does
//!   (409 Conflict when stale), then `metadata.uid` as the API server treats
//!   it (an immutable field: 422 Invalid when it is not the pod's); every
//!   accepted write bumps the version;
//! - `GET   /apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/{name}`;
//! - `GET   /apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstancemigrations/{name}`;
//! - `GET   /api/v1/pods` — the list, and with `watch=true` the watch, of
//!   every namespace's pods, narrowed by `fieldSelector=spec.nodeName=<node>`
//!   (the one field selector served): what a kube-rs reflector of a node's
//!   pods asks. The watch streams the `ADDED`/`MODIFIED`/`DELETED` events
//!   after the `resourceVersion` it names, as the store changes, until its
//!   `timeoutSeconds` or the server stops.
//! - `GET   /apis/xdhcp.io/v1alpha1/dhcpguardpolicies` — the list, and with
//!   `watch=true` the watch, of the cluster-scoped `DhcpGuardPolicy` objects
//!   (what the agent's reflector of them asks), stored as the test gives
//!   them: the fake checks nothing of their spec (a real API server would
//!   check the CRD's schema first), so a test can hand the agent an object
//!   only the agent's own checks refuse.
//!
//! Errors are `Status` objects with the real reasons and codes. Faults can
//! be queued per operation: an error status, or a concurrent write by
//! another client just before a PATCH is served (which then fails its
//! precondition for real). A request can also be held until the test lets
//! it go ([`FakeApiServer::hold`]), so the test can change the world at an
//! exact point of a client's sequence. Every request is recorded for
//! assertions; requests outside the subset are answered 404 and recorded as
//! unexpected.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// The node a stored pod is scheduled to when its `spec.nodeName` is
/// unset: the node test agents run on (`AgentArgs::with_defaults`).
pub const NODE: &str = xdhcp::settings::TEST_NODE_NAME;

/// The UID a VMI stored without one gets.
fn fake_vmi_uid(ns: &str, name: &str) -> String {
    format!("vmi-uid-{ns}-{name}")
}

/// The operations the fake serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `GET` a pod.
    GetPod,
    /// `PATCH` a pod.
    PatchPod,
    /// `GET` a VMI.
    GetVmi,
    /// `GET` a `VirtualMachineInstanceMigration`.
    GetVmim,
    /// `GET /api/v1/pods`: list the pods (all namespaces).
    ListPods,
    /// `GET /api/v1/pods?watch=true`: watch them.
    WatchPods,
    /// `GET /apis/xdhcp.io/v1alpha1/dhcpguardpolicies`: list them.
    ListGuardPolicies,
    /// The same with `watch=true`: watch them.
    WatchGuardPolicies,
}

/// The path of the `DhcpGuardPolicy` collection.
const GUARD_POLICIES: &str = "/apis/xdhcp.io/v1alpha1/dhcpguardpolicies";

/// A fault injected into the next request of an [`Op`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Answer with this HTTP status (a Kubernetes `Status` body).
    Status(u16),
    /// Hold the answer this long (a hung or overloaded API server), then serve.
    Delay(std::time::Duration),
    /// Answer 429 Too Many Requests with a `Retry-After` header of this many
    /// seconds (and `details.retryAfterSeconds`), as the API server's
    /// priority and fairness does when it sheds load.
    TooManyRequests {
        /// Seconds the client is asked to wait.
        retry_after_secs: u32,
    },
    /// Before serving this PATCH, another client sets annotation `key` to
    /// `value` and bumps the resourceVersion; a PATCH carrying the old
    /// version then gets a genuine 409.
    ConcurrentWrite {
        /// Annotation key written by the other client.
        key: String,
        /// Its value.
        value: String,
    },
}

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The operation, `None` when outside the served subset.
    pub op: Option<Op>,
    /// HTTP method.
    pub method: String,
    /// Path and query.
    pub uri: String,
    /// `Content-Type` header.
    pub content_type: Option<String>,
    /// Parsed JSON body, if any.
    pub body: Option<Value>,
    /// Status code answered.
    pub status: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Pod,
    Vmi,
    Vmim,
}

/// A request to hold: the `skip`+1-th request of `op` from now.
struct HoldSlot {
    op: Op,
    skip: usize,
    reached: std::sync::mpsc::Sender<()>,
    release: tokio::sync::oneshot::Receiver<()>,
}

/// A request the server holds ([`FakeApiServer::hold`]): it is answered only
/// once [`Held::release`] is called (or this is dropped).
pub struct Held {
    reached: std::sync::mpsc::Receiver<()>,
    release: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Held {
    /// Wait (blocking, at most `within`) until the request arrives and is
    /// being held; `false` if it did not arrive in time.
    pub fn wait(&self, within: std::time::Duration) -> bool {
        self.reached.recv_timeout(within).is_ok()
    }

    /// Let the held request be served.
    pub fn release(mut self) {
        if let Some(tx) = self.release.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(tx) = self.release.take() {
            let _ = tx.send(());
        }
    }
}

#[derive(Default)]
struct Inner {
    objects: BTreeMap<(Kind, String, String), Value>,
    next_rv: u64,
    next_uid: u64,
    faults: VecDeque<(Op, Fault)>,
    holds: Vec<HoldSlot>,
    requests: Vec<Recorded>,
    /// Every change of a pod, in order: (resourceVersion, event type, the
    /// pod after it — before it, for `DELETED`).
    pod_events: Vec<(u64, &'static str, Value)>,
    /// `DhcpGuardPolicy` objects by name.
    policies: BTreeMap<String, Value>,
    /// Every change of one, in order, as [`Inner::pod_events`].
    policy_events: Vec<(u64, &'static str, Value)>,
    /// Set when the server stops: open watches end.
    stopped: bool,
}

impl Inner {
    fn bump(&mut self) -> String {
        self.next_rv += 1;
        self.next_rv.to_string()
    }

    /// Record a change of pod `obj` (stamped with the current version).
    fn pod_event(&mut self, kind: &'static str, obj: &Value) {
        let mut obj = obj.clone();
        obj["apiVersion"] = json!("v1");
        obj["kind"] = json!("Pod");
        let rv = self.next_rv;
        self.pod_events.push((rv, kind, obj));
    }
}

/// The node a `fieldSelector` narrows a pod list or watch to: `Ok(None)`
/// for none; an error for a selector the fake does not serve.
fn node_selector(query: &str) -> Result<Option<String>, String> {
    let Some(sel) = query_param(query, "fieldSelector") else {
        return Ok(None);
    };
    match sel.split_once('=') {
        Some(("spec.nodeName", node)) => Ok(Some(node.trim_start_matches('=').to_owned())),
        _ => Err(format!(
            "field selector {sel:?} is not served (only spec.nodeName=<node>)"
        )),
    }
}

/// The (percent-decoded) value of `key` in `query`.
fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                if let Ok(b) = u8::from_str_radix(hex, 16) {
                    out.push(b);
                    i += 3;
                } else {
                    out.push(b'%');
                    i += 1;
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether pod `obj` is on `node` (every pod, with no node to match).
fn on_node(obj: &Value, node: Option<&str>) -> bool {
    node.is_none_or(|n| obj["spec"]["nodeName"].as_str() == Some(n))
}

/// The pod list (`PodList`), narrowed to `node`.
fn pod_list(st: &Inner, node: Option<&str>) -> Value {
    let items: Vec<Value> = st
        .objects
        .iter()
        .filter(|((k, ..), obj)| *k == Kind::Pod && on_node(obj, node))
        .map(|(_, obj)| {
            let mut obj = obj.clone();
            obj["apiVersion"] = json!("v1");
            obj["kind"] = json!("Pod");
            obj
        })
        .collect();
    json!({
        "kind": "PodList", "apiVersion": "v1",
        "metadata": {"resourceVersion": st.next_rv.to_string()},
        "items": items
    })
}

/// The watch of the pods on `node` after version `from`: one JSON event a
/// line, as the store changes, for `timeout` or until the server stops.
fn pod_watch(
    inner: Arc<Mutex<Inner>>,
    node: Option<String>,
    from: u64,
    timeout: std::time::Duration,
) -> Response {
    event_watch(
        inner,
        |st| &st.pod_events,
        from,
        timeout,
        move |obj| on_node(obj, node.as_deref()),
    )
}

/// The watch of the events `events` selects after version `from`, those
/// `keep` passes: one JSON event a line, as the store changes, for
/// `timeout` or until the server stops.
fn event_watch(
    inner: Arc<Mutex<Inner>>,
    events: fn(&Inner) -> &Vec<(u64, &'static str, Value)>,
    from: u64,
    timeout: std::time::Duration,
    keep: impl Fn(&Value) -> bool + Clone + Send + 'static,
) -> Response {
    let end = tokio::time::Instant::now() + timeout;
    let stream = futures::stream::unfold(from, move |seen| {
        let inner = inner.clone();
        let keep = keep.clone();
        async move {
            loop {
                let (lines, last, stopped) = {
                    let st = inner
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    let mut last = seen;
                    let mut lines = String::new();
                    for (rv, kind, obj) in events(&st).iter().filter(|(rv, ..)| *rv > seen) {
                        last = *rv;
                        if keep(obj) {
                            lines.push_str(&json!({"type": kind, "object": obj}).to_string());
                            lines.push('\n');
                        }
                    }
                    (lines, last, st.stopped)
                };
                if !lines.is_empty() {
                    return Some((Ok::<_, std::convert::Infallible>(lines), last));
                }
                if stopped || tokio::time::Instant::now() >= end {
                    return None;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}

/// A virt-launcher pod, for [`FakeApiServer::launcher_pod`].
#[derive(Debug, Clone, Copy)]
pub struct LauncherPod<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    /// Its node (`spec.nodeName`).
    pub node: &'a str,
    /// The VMI that controls it.
    pub vmi: &'a str,
    /// The live migration it is the target of: its name and UID.
    pub migration: Option<(&'a str, &'a str)>,
}

/// The fake API server; stops when dropped.
pub struct FakeApiServer {
    inner: Arc<Mutex<Inner>>,
    addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn status_body(code: u16, message: &str, name: &str, kind: &str) -> Value {
    let reason = match code {
        400 => "BadRequest",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        _ => "",
    };
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason,
        "details": {"name": name, "kind": kind}, "code": code
    })
}

/// A `VirtualMachineInstance` `namespace/name` with one bridge-bound
/// secondary interface `iface` on the NAD `nad_key` (`<ns>/<name>`, or a
/// bare name), `mac` in its spec; `masquerade`: a pod network interface
/// (`default`, masquerade binding) listed first, as most VMs have.
pub fn vmi(
    (namespace, name): (&str, &str),
    masquerade: bool,
    (iface, nad_key, mac): (&str, &str, &str),
) -> Value {
    let mut networks = Vec::new();
    let mut interfaces = Vec::new();
    if masquerade {
        networks.push(json!({"name": "default", "pod": {}}));
        interfaces.push(json!({"name": "default", "masquerade": {}}));
    }
    networks.push(json!({"name": iface, "multus": {"networkName": nad_key}}));
    interfaces.push(json!({"name": iface, "bridge": {}, "macAddress": mac}));
    json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "networks": networks,
            "domain": {"devices": {"interfaces": interfaces}}
        }
    })
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().expect("made an object above");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

fn route(path: &str) -> Option<(Kind, String, String)> {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match segs.as_slice() {
        ["api", "v1", "namespaces", ns, "pods", name] => {
            Some((Kind::Pod, (*ns).to_owned(), (*name).to_owned()))
        }
        [
            "apis",
            "kubevirt.io",
            "v1",
            "namespaces",
            ns,
            "virtualmachineinstances",
            name,
        ] => Some((Kind::Vmi, (*ns).to_owned(), (*name).to_owned())),
        [
            "apis",
            "kubevirt.io",
            "v1",
            "namespaces",
            ns,
            "virtualmachineinstancemigrations",
            name,
        ] => Some((Kind::Vmim, (*ns).to_owned(), (*name).to_owned())),
        _ => None,
    }
}

fn reply(code: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let json = [(header::CONTENT_TYPE, "application/json")];
    match body["details"]["retryAfterSeconds"].as_u64() {
        Some(secs) => (
            status,
            json,
            [(header::RETRY_AFTER, secs.to_string())],
            body.to_string(),
        )
            .into_response(),
        None => (status, json, body.to_string()).into_response(),
    }
}

async fn handle(
    State(inner): State<Arc<Mutex<Inner>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    if method == Method::GET && uri.path() == "/api/v1/pods" {
        return pods_collection(&inner, &uri, content_type);
    }
    if method == Method::GET && uri.path() == GUARD_POLICIES {
        return policies_collection(&inner, &uri, content_type);
    }
    let target = route(uri.path());
    let op = match (&method, &target) {
        (&Method::GET, Some((Kind::Pod, ..))) => Some(Op::GetPod),
        (&Method::PATCH, Some((Kind::Pod, ..))) => Some(Op::PatchPod),
        (&Method::GET, Some((Kind::Vmi, ..))) => Some(Op::GetVmi),
        (&Method::GET, Some((Kind::Vmim, ..))) => Some(Op::GetVmim),
        _ => None,
    };
    let held = {
        let mut st = inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut slot = None;
        if let Some(i) = st.holds.iter().position(|h| Some(h.op) == op) {
            if st.holds[i].skip == 0 {
                slot = Some(st.holds.remove(i));
            } else {
                st.holds[i].skip -= 1;
            }
        }
        slot
    };
    if let Some(h) = held {
        let _ = h.reached.send(());
        // A dropped sender (the test gave up) lets the request through too.
        let _ = h.release.await;
    }
    let delay = {
        let mut st = inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let i = st
            .faults
            .iter()
            .position(|(o, f)| Some(*o) == op && matches!(f, Fault::Delay(_)));
        match i.and_then(|i| st.faults.remove(i)) {
            Some((_, Fault::Delay(d))) => Some(d),
            _ => None,
        }
    };
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    let mut st = inner
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (code, out) = serve(
        &mut st,
        op,
        target,
        content_type.as_deref(),
        parsed.as_ref(),
    );
    st.requests.push(Recorded {
        op,
        method: method.to_string(),
        uri: uri.to_string(),
        content_type,
        body: parsed,
        status: code,
    });
    reply(code, &out)
}

/// `GET /api/v1/pods`: the list, or (`watch=true`) the watch, recorded
/// as [`Op::ListPods`] / [`Op::WatchPods`]; a queued [`Fault::Status`] of
/// that op answers instead.
fn pods_collection(inner: &Arc<Mutex<Inner>>, uri: &Uri, content_type: Option<String>) -> Response {
    let query = uri.query().unwrap_or("");
    let watch = matches!(query_param(query, "watch").as_deref(), Some("true" | "1"));
    let op = if watch { Op::WatchPods } else { Op::ListPods };
    let mut st = inner
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let fault = st
        .faults
        .iter()
        .position(|(o, f)| *o == op && matches!(f, Fault::Status(_)));
    let answer = match (
        fault.and_then(|i| st.faults.remove(i)),
        node_selector(query),
    ) {
        (Some((_, Fault::Status(code))), _) => Err((
            code,
            status_body(code, "injected failure for pods", "", "pods"),
        )),
        (_, Err(msg)) => Err((400, status_body(400, &msg, "", "pods"))),
        (_, Ok(node)) => Ok(node),
    };
    st.requests.push(Recorded {
        op: Some(op),
        method: "GET".to_owned(),
        uri: uri.to_string(),
        content_type,
        body: None,
        status: answer.as_ref().map_or_else(|(c, _)| *c, |_| 200),
    });
    let node = match answer {
        Ok(node) => node,
        Err((code, body)) => return reply(code, &body),
    };
    if !watch {
        return reply(200, &pod_list(&st, node.as_deref()));
    }
    let from = query_param(query, "resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(st.next_rv);
    let timeout = query_param(query, "timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .map_or(
            std::time::Duration::from_secs(290),
            std::time::Duration::from_secs,
        );
    drop(st);
    pod_watch(inner.clone(), node, from, timeout)
}

/// `GET` the `DhcpGuardPolicy` collection: the list, or (`watch=true`) the
/// watch, recorded as [`Op::ListGuardPolicies`] / [`Op::WatchGuardPolicies`];
/// a queued [`Fault::Status`] of that op answers instead.
fn policies_collection(
    inner: &Arc<Mutex<Inner>>,
    uri: &Uri,
    content_type: Option<String>,
) -> Response {
    let query = uri.query().unwrap_or("");
    let watch = matches!(query_param(query, "watch").as_deref(), Some("true" | "1"));
    let op = if watch {
        Op::WatchGuardPolicies
    } else {
        Op::ListGuardPolicies
    };
    let mut st = inner
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let fault = st
        .faults
        .iter()
        .position(|(o, f)| *o == op && matches!(f, Fault::Status(_)))
        .and_then(|i| st.faults.remove(i));
    let code = match fault {
        Some((_, Fault::Status(code))) => code,
        _ => 200,
    };
    st.requests.push(Recorded {
        op: Some(op),
        method: "GET".to_owned(),
        uri: uri.to_string(),
        content_type,
        body: None,
        status: code,
    });
    if code != 200 {
        let body = status_body(
            code,
            "injected failure for dhcpguardpolicies",
            "",
            "dhcpguardpolicies",
        );
        return reply(code, &body);
    }
    if !watch {
        let items: Vec<Value> = st.policies.values().cloned().collect();
        return reply(
            200,
            &json!({
                "kind": "DhcpGuardPolicyList", "apiVersion": "xdhcp.io/v1alpha1",
                "metadata": {"resourceVersion": st.next_rv.to_string()},
                "items": items
            }),
        );
    }
    let from = query_param(query, "resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(st.next_rv);
    let timeout = query_param(query, "timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .map_or(
            std::time::Duration::from_secs(290),
            std::time::Duration::from_secs,
        );
    drop(st);
    event_watch(
        inner.clone(),
        |st| &st.policy_events,
        from,
        timeout,
        |_| true,
    )
}

/// Apply the next queued fault (other than a delay) for `op` on `key`: an
/// error answer to send instead of serving, or a concurrent write done
/// before serving.
fn take_fault(
    st: &mut Inner,
    op: Op,
    key: &(Kind, String, String),
    kind_name: &str,
) -> Option<(u16, Value)> {
    let name = &key.2;
    let i = st
        .faults
        .iter()
        .position(|(o, f)| *o == op && !matches!(f, Fault::Delay(_)))?;
    let (_, fault) = st.faults.remove(i).expect("position is in range");
    match fault {
        Fault::Status(code) => {
            let msg = format!("injected failure for {kind_name} \"{name}\"");
            Some((code, status_body(code, &msg, name, kind_name)))
        }
        Fault::TooManyRequests { retry_after_secs } => {
            let msg = format!("injected: too many requests for {kind_name} \"{name}\"");
            let mut body = status_body(429, &msg, name, kind_name);
            body["details"]["retryAfterSeconds"] = json!(retry_after_secs);
            Some((429, body))
        }
        Fault::Delay(_) => unreachable!("delays are taken before serving"),
        Fault::ConcurrentWrite { key: akey, value } => {
            let rv = st.bump();
            if let Some(obj) = st.objects.get_mut(key) {
                obj["metadata"]["annotations"][akey] = json!(value);
                obj["metadata"]["resourceVersion"] = json!(rv);
                let obj = obj.clone();
                if key.0 == Kind::Pod {
                    st.pod_event("MODIFIED", &obj);
                }
            }
            None
        }
    }
}

fn serve(
    st: &mut Inner,
    op: Option<Op>,
    target: Option<(Kind, String, String)>,
    content_type: Option<&str>,
    body: Option<&Value>,
) -> (u16, Value) {
    let (Some(op), Some((kind, ns, name))) = (op, target) else {
        return (
            404,
            status_body(
                404,
                "the server could not find the requested resource",
                "",
                "",
            ),
        );
    };
    let kind_name = match kind {
        Kind::Pod => "pods",
        Kind::Vmi => "virtualmachineinstances",
        Kind::Vmim => "virtualmachineinstancemigrations",
    };
    let key = (kind, ns.clone(), name.clone());

    if let Some(answer) = take_fault(st, op, &key, kind_name) {
        return answer;
    }

    let not_found = || {
        let msg = format!("{kind_name} \"{name}\" not found");
        (404, status_body(404, &msg, &name, kind_name))
    };
    match op {
        Op::ListPods | Op::WatchPods | Op::ListGuardPolicies | Op::WatchGuardPolicies => {
            unreachable!("the collections are served before")
        }
        Op::GetPod | Op::GetVmi | Op::GetVmim => match st.objects.get(&key) {
            Some(obj) => (200, obj.clone()),
            None => not_found(),
        },
        Op::PatchPod => {
            if content_type != Some("application/merge-patch+json") {
                let msg = format!("only merge patches are served, got {content_type:?}");
                return (415, status_body(415, &msg, &name, kind_name));
            }
            let Some(patch) = body else {
                return (
                    400,
                    status_body(400, "patch body is not JSON", &name, kind_name),
                );
            };
            let Some(current) = st.objects.get(&key).cloned() else {
                return not_found();
            };
            let mut patch = patch.clone();
            let meta = patch.get_mut("metadata").and_then(Value::as_object_mut);
            let want_rv = meta
                .as_ref()
                .and_then(|m| m.get("resourceVersion").cloned());
            let want_uid = meta.as_ref().and_then(|m| m.get("uid").cloned());
            if let Some(m) = meta {
                m.remove("resourceVersion");
                m.remove("uid");
            }
            if let Some(refused) = preconditions(
                &current,
                want_rv.as_ref(),
                want_uid.as_ref(),
                &name,
                kind_name,
            ) {
                return refused;
            }
            let mut next = current;
            merge_patch(&mut next, &patch);
            if next["metadata"]["annotations"]
                .as_object()
                .is_some_and(serde_json::Map::is_empty)
            {
                next["metadata"]
                    .as_object_mut()
                    .expect("pods have metadata")
                    .remove("annotations");
            }
            let rv = st.bump();
            next["metadata"]["resourceVersion"] = json!(rv);
            st.objects.insert(key, next.clone());
            st.pod_event("MODIFIED", &next);
            (200, next)
        }
    }
}

/// The preconditions of a PATCH on `current`, as the API server checks
/// them: it applies the patch, compares the resourceVersion (409), then
/// validates the update, where a changed `metadata.uid` is an immutable
/// field (422). `None` when the patch may be applied.
fn preconditions(
    current: &Value,
    want_rv: Option<&Value>,
    want_uid: Option<&Value>,
    name: &str,
    kind_name: &str,
) -> Option<(u16, Value)> {
    if want_rv.is_some_and(|rv| *rv != current["metadata"]["resourceVersion"]) {
        let msg = format!(
            "Operation cannot be fulfilled on {kind_name} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
        );
        return Some((409, status_body(409, &msg, name, kind_name)));
    }
    if let Some(u) = want_uid.filter(|u| **u != current["metadata"]["uid"]) {
        let msg = format!(
            "Pod \"{name}\" is invalid: metadata.uid: Invalid value: {u}: field is immutable"
        );
        return Some((422, status_body(422, &msg, name, kind_name)));
    }
    None
}

impl FakeApiServer {
    /// Start on `127.0.0.1:0` (inside a tokio runtime).
    pub async fn start() -> FakeApiServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake API server on 127.0.0.1:0");
        Self::serve(listener)
    }

    /// Start on `listener` (bound elsewhere: in another network namespace,
    /// for an agent that runs there), inside a tokio runtime.
    pub fn start_on(listener: std::net::TcpListener) -> FakeApiServer {
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        Self::serve(
            tokio::net::TcpListener::from_std(listener).expect("a listener for the runtime"),
        )
    }

    fn serve(listener: tokio::net::TcpListener) -> FakeApiServer {
        let inner = Arc::new(Mutex::new(Inner {
            next_rv: 100,
            ..Inner::default()
        }));
        let addr = listener.local_addr().expect("bound socket has an address");
        let app = Router::new().fallback(handle).with_state(inner.clone());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await
                .expect("fake API server failed");
        });
        FakeApiServer {
            inner,
            addr,
            shutdown: Some(tx),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A real `kube::Client` pointed at this server.
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url().parse().expect("a valid URL"));
        kube::Client::try_from(config).expect("kube client for the fake API server")
    }

    /// Stop serving (new connections are refused, open watches end).
    pub fn stop(&mut self) {
        self.lock().stopped = true;
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    /// Store a pod with these labels and annotations; returns its UID. A
    /// pod labelled `vm.kubevirt.io/name` is a launcher pod: it gets the
    /// controller owner reference to that VMI ([`FakeApiServer::vmi_uid`]).
    /// [`FakeApiServer::put_pod`] stores a pod as given.
    pub fn add_pod(
        &self,
        ns: &str,
        name: &str,
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
    ) -> String {
        let uid = {
            let mut st = self.lock();
            st.next_uid += 1;
            format!("00000000-0000-4000-8000-{:012x}", st.next_uid)
        };
        let labels: serde_json::Map<String, Value> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), json!(v)))
            .collect();
        let annotations: serde_json::Map<String, Value> = annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), json!(v)))
            .collect();
        let mut meta = json!({"name": name, "namespace": ns, "uid": uid});
        // A launcher pod is controlled by its VMI, as virt-controller makes
        // it: the owner reference names the VMI and its UID.
        if let Some(vmi) = labels.get("vm.kubevirt.io/name").and_then(Value::as_str) {
            meta["ownerReferences"] = json!([{
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "name": vmi, "uid": self.vmi_uid(ns, vmi),
                "controller": true, "blockOwnerDeletion": true
            }]);
        }
        if !labels.is_empty() {
            meta["labels"] = Value::Object(labels);
        }
        if !annotations.is_empty() {
            meta["annotations"] = Value::Object(annotations);
        }
        self.put_pod(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "c", "image": "registry.invalid/c"}]}
        }));
        uid
    }

    /// `pod` as virt-controller makes it, with `annotations` (for
    /// [`FakeApiServer::put_pod`]): labelled as its VMI's launcher,
    /// controlled by that VMI (its UID: [`FakeApiServer::vmi_uid`]), on its
    /// node; a migration target carries the migration's name (annotation)
    /// and UID (label).
    pub fn launcher_pod(&self, pod: &LauncherPod<'_>, annotations: &Value) -> Value {
        let mut annotations = annotations.clone();
        let mut labels = json!({"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": pod.vmi});
        if let Some((job, job_uid)) = pod.migration {
            annotations["kubevirt.io/migrationJobName"] = json!(job);
            labels["kubevirt.io/migrationJobUID"] = json!(job_uid);
        }
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": pod.name, "namespace": pod.namespace, "uid": pod.uid,
                "labels": labels,
                "ownerReferences": [{
                    "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                    "name": pod.vmi, "uid": self.vmi_uid(pod.namespace, pod.vmi),
                    "controller": true, "blockOwnerDeletion": true}],
                "annotations": annotations
            },
            "spec": {"nodeName": pod.node,
                     "containers": [{"name": "compute", "image": "registry.invalid/c"}]}
        })
    }

    /// The UID of VMI `ns/name`: the stored one's, else the one it gets
    /// when stored without one.
    pub fn vmi_uid(&self, ns: &str, name: &str) -> String {
        self.lock()
            .objects
            .get(&(Kind::Vmi, ns.to_owned(), name.to_owned()))
            .and_then(|v| v["metadata"]["uid"].as_str().map(str::to_owned))
            .unwrap_or_else(|| fake_vmi_uid(ns, name))
    }

    /// Store a pod object as given (namespace and name from its metadata);
    /// a resourceVersion is assigned.
    pub fn put_pod(&self, pod: Value) {
        self.put(Kind::Pod, pod);
    }

    /// Store a `kubevirt.io/v1` `VirtualMachineInstance` object.
    pub fn put_vmi(&self, vmi: Value) {
        self.put(Kind::Vmi, vmi);
    }

    /// Store a `kubevirt.io/v1` `VirtualMachineInstanceMigration` object.
    pub fn put_vmim(&self, vmim: Value) {
        self.put(Kind::Vmim, vmim);
    }

    /// Hold the request of `op` that comes after the next `skip` ones: it
    /// is answered only once the returned [`Held`] is released or dropped.
    pub fn hold(&self, op: Op, skip: usize) -> Held {
        let (reached_tx, reached) = std::sync::mpsc::channel();
        let (release, release_rx) = tokio::sync::oneshot::channel();
        self.lock().holds.push(HoldSlot {
            op,
            skip,
            reached: reached_tx,
            release: release_rx,
        });
        Held {
            reached,
            release: Some(release),
        }
    }

    fn put(&self, kind: Kind, mut obj: Value) {
        let ns = obj["metadata"]["namespace"]
            .as_str()
            .expect("metadata.namespace")
            .to_owned();
        let name = obj["metadata"]["name"]
            .as_str()
            .expect("metadata.name")
            .to_owned();
        // Every pod is scheduled: to the node test agents run on unless
        // the test names another.
        if kind == Kind::Pod && obj["spec"]["nodeName"].is_null() {
            obj["spec"]["nodeName"] = json!(NODE);
        }
        // Every VMI has a UID, the one `add_pod`'s launcher pods name
        // unless the test gives its own.
        if kind == Kind::Vmi && obj["metadata"]["uid"].is_null() {
            obj["metadata"]["uid"] = json!(fake_vmi_uid(&ns, &name));
        }
        let mut st = self.lock();
        let rv = st.bump();
        obj["metadata"]["resourceVersion"] = json!(rv);
        let event = if st.objects.contains_key(&(kind, ns.clone(), name.clone())) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        if kind == Kind::Pod {
            st.pod_event(event, &obj);
        }
        st.objects.insert((kind, ns, name), obj);
    }

    /// Store a cluster-scoped `DhcpGuardPolicy` named `name` with `spec`
    /// (as given: nothing of it is checked), created or replaced; watches
    /// see it `ADDED` or `MODIFIED`.
    pub fn put_guard_policy(&self, name: &str, spec: &Value) {
        let mut st = self.lock();
        let rv = st.bump();
        let uid = format!("guard-policy-uid-{name}");
        let obj = json!({
            "apiVersion": "xdhcp.io/v1alpha1", "kind": "DhcpGuardPolicy",
            "metadata": {"name": name, "uid": uid, "resourceVersion": rv},
            "spec": spec
        });
        let event = if st.policies.contains_key(name) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        let at = st.next_rv;
        st.policy_events.push((at, event, obj.clone()));
        st.policies.insert(name.to_owned(), obj);
    }

    /// Delete `DhcpGuardPolicy` `name`.
    pub fn delete_guard_policy(&self, name: &str) {
        let mut st = self.lock();
        if let Some(obj) = st.policies.remove(name) {
            st.bump();
            let at = st.next_rv;
            st.policy_events.push((at, "DELETED", obj));
        }
    }

    /// Delete a pod.
    pub fn delete_pod(&self, ns: &str, name: &str) {
        let mut st = self.lock();
        if let Some(obj) = st
            .objects
            .remove(&(Kind::Pod, ns.to_owned(), name.to_owned()))
        {
            st.bump();
            st.pod_event("DELETED", &obj);
        }
    }

    /// The stored pod.
    pub fn pod(&self, ns: &str, name: &str) -> Option<Value> {
        self.lock()
            .objects
            .get(&(Kind::Pod, ns.to_owned(), name.to_owned()))
            .cloned()
    }

    /// One annotation of the stored pod.
    pub fn annotation(&self, ns: &str, name: &str, key: &str) -> Option<String> {
        self.pod(ns, name)?["metadata"]["annotations"][key]
            .as_str()
            .map(str::to_owned)
    }

    /// Queue a fault for the next request of `op` (faults of one op are
    /// consumed in the order queued).
    pub fn inject(&self, op: Op, fault: Fault) {
        self.lock().faults.push_back((op, fault));
    }

    /// Queue the same fault `n` times.
    pub fn inject_n(&self, op: Op, fault: &Fault, n: usize) {
        for _ in 0..n {
            self.inject(op, fault.clone());
        }
    }

    /// Faults not consumed yet.
    pub fn pending_faults(&self) -> usize {
        self.lock().faults.len()
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.lock().requests.clone()
    }

    /// How many requests of `op` were received.
    pub fn count(&self, op: Op) -> usize {
        self.lock()
            .requests
            .iter()
            .filter(|r| r.op == Some(op))
            .count()
    }

    /// Requests outside the served subset.
    pub fn unexpected(&self) -> Vec<Recorded> {
        self.lock()
            .requests
            .iter()
            .filter(|r| r.op.is_none())
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_patch_follows_rfc7386() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge_patch(&mut t, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(t, json!({"a": "z", "c": {"d": "e"}}));
        let mut t = json!({"a": [1, 2]});
        merge_patch(&mut t, &json!({"a": [3], "n": {"x": 1}}));
        assert_eq!(t, json!({"a": [3], "n": {"x": 1}}));
    }

    #[test]
    fn routes() {
        assert_eq!(
            route("/api/v1/namespaces/ns/pods/p"),
            Some((Kind::Pod, "ns".into(), "p".into()))
        );
        assert_eq!(
            route("/apis/kubevirt.io/v1/namespaces/ns/virtualmachineinstances/v"),
            Some((Kind::Vmi, "ns".into(), "v".into()))
        );
        assert_eq!(
            route("/apis/kubevirt.io/v1/namespaces/ns/virtualmachineinstancemigrations/m"),
            Some((Kind::Vmim, "ns".into(), "m".into()))
        );
        assert_eq!(route("/api/v1/pods"), None);
    }

    #[test]
    fn the_node_field_selector_is_read_and_others_refused() {
        let q = "fieldSelector=spec.nodeName%3Dnode-1&limit=500";
        assert_eq!(node_selector(q), Ok(Some("node-1".to_owned())));
        assert_eq!(node_selector("watch=true"), Ok(None));
        assert!(node_selector("fieldSelector=status.phase%3DRunning").is_err());
        assert_eq!(
            query_param("a=b&watch=true", "watch").as_deref(),
            Some("true")
        );
        assert_eq!(route("/api/v1/namespaces/ns/pods/p/status"), None);
    }
}
