//! The agent socket's HTTP routes (see [`crate::rpc`] for the protocol),
//! and the one place a daemon [`Error`] becomes a CNI error code.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Extension;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use crate::cni::types::{CniError, code};
use crate::daemon::socket::Accepted;
use crate::daemon::status;
use crate::kube::PodApiError;
use crate::metrics::AddPhase;
use crate::ops::add;
use crate::ops::context::Agent;
use crate::ops::error::Error;
use crate::ops::trust;
use crate::rpc::{self, CniRequest, GcRequest, Readiness, format_chain};

/// A CNI error as an HTTP response.
struct ApiError(CniError);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (rpc::status_for(self.0.code), Json(self.0)).into_response()
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        Self(to_cni(&e))
    }
}

/// The CNI error code of each daemon failure. The message is the error's
/// own; where it does not already say its cause, the details carry the
/// cause's chain.
fn to_cni(e: &Error) -> CniError {
    let (code, message_has_cause) = match e {
        Error::NoNetns => return CniError::env("CNI_NETNS", "not set"),
        Error::AnnotationKey { source } => {
            return CniError::config("netAttachDefName", source);
        }
        Error::NoValidAttachments => {
            return CniError::config("cni.dev/valid-attachments", "missing (required for GC)");
        }
        Error::ClientConfig { .. } | Error::ClientConfig6 { .. } => {
            (code::INVALID_NETWORK_CONFIG, true)
        }
        Error::Kube { source } => {
            // The embedded pod store lives in the state directory: its
            // failures are the node's I/O, not the API's. Either way the
            // details carry the cause (errno, transport error).
            let code = match source {
                PodApiError::Store { .. } | PodApiError::StoreCorrupt { .. } => code::IO_FAILURE,
                _ => code::KUBE_API,
            };
            let cni = CniError::new(code, e.to_string());
            return match std::error::Error::source(source) {
                Some(cause) => cni.with_details(format_chain(cause)),
                None => cni,
            };
        }
        Error::KubeDeadline { .. } => (code::KUBE_API, true),
        Error::NotReported { source, .. } => {
            // Classified by why the write failed (an embedded store on a
            // full disk is the node's I/O); the message adds the lease's fate.
            let inner = to_cni(source);
            let cni = CniError::new(inner.code, e.to_string());
            return if inner.details.is_empty() {
                cni
            } else {
                cni.with_details(inner.details)
            };
        }
        Error::Interface { .. } | Error::Netdev { .. } | Error::LinkFailed { .. } => {
            (code::INTERFACE, false)
        }
        Error::Apply { .. } => (code::INTERFACE, true),
        Error::NoLease { .. } | Error::NoLease6 { .. } => (code::DHCP_TIMEOUT, true),
        Error::Silent { .. } | Error::Queued { .. } => (code::DHCP_TIMEOUT, false),
        Error::ShuttingDown => (code::TRY_AGAIN_LATER, false),
        Error::Refused { .. } => (code::INVALID_ENV, false),
        Error::Device { .. } | Error::Handoff { .. } => (code::VFIO, true),
        Error::Store { .. } => (code::IO_FAILURE, false),
        Error::Persist { .. } => (code::IO_FAILURE, true),
        Error::LeaseGone { .. } | Error::AddressMissing { .. } | Error::Inspect { .. } => {
            (code::CHECK_FAILED, false)
        }
    };
    let cni = CniError::new(code, e.to_string());
    match std::error::Error::source(e) {
        Some(cause) if !message_has_cause => cni.with_details(format_chain(cause)),
        _ => cni,
    }
}

/// Decode a CNI request and put `--host-prefix` before its namespace path,
/// as the upstream daemon's `-hostprefix` does (by concatenation).
fn decode_cni(
    agent: &Agent,
    body: Result<Json<CniRequest>, JsonRejection>,
) -> Result<CniRequest, ApiError> {
    let mut req = decode(body)?;
    let args = &agent.args;
    let network = req
        .config
        .net_attach_def_name
        .clone()
        .unwrap_or_else(|| req.config.name.clone());
    req.config.ipam.dhcp_guard = trust::guard_policy(
        &req.config.ipam.dhcp_guard,
        &network,
        &args.dhcp_guard_trusted_network,
        args.dhcp_guard_max_rate,
        args.dhcp_guard_max_burst,
    );
    if let Some(sent) = req.netns.take() {
        let opened = match &agent.args.host_prefix {
            Some(prefix) => prefixed(prefix, &sent),
            None => sent.clone(),
        };
        trust::check_netns(&sent, &opened).map_err(|source| {
            agent.metrics().failure("refused");
            let e = ApiError::from(Error::Refused { source });
            tracing::warn!(code = e.0.code, error = %e.0.msg, details = %e.0.details, "request refused");
            e
        })?;
        req.netns = Some(opened);
    }
    Ok(req)
}

/// `prefix` + `path`, concatenated as the upstream daemon joins them.
fn prefixed(prefix: &std::path::Path, path: &std::path::Path) -> std::path::PathBuf {
    let mut joined = prefix.as_os_str().to_owned();
    joined.push(path.as_os_str());
    joined.into()
}

fn decode<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    body.map(|Json(t)| t).map_err(|e| {
        ApiError(
            CniError::new(
                code::DECODE_FAILURE,
                "the agent could not decode the request",
            )
            .with_details(e.body_text()),
        )
    })
}

/// The router of the agent socket.
pub(crate) fn router(agent: Arc<Agent>) -> Router {
    let r = Router::new()
        .route(rpc::PATH_ADD, post(add))
        .route(rpc::PATH_DEL, post(del))
        .route(rpc::PATH_CHECK, post(check))
        .route(rpc::PATH_GC, post(gc))
        .route(rpc::PATH_READY, get(ready))
        .route(rpc::PATH_LEASES, get(leases))
        .route(rpc::PATH_STATUS, get(status))
        .route(crate::bindings::PATH_BINDINGS, get(bindings));
    #[cfg(feature = "test-hooks")]
    let r = r.route(rpc::PATH_TEST_READER_FAULT, post(reader_fault));
    #[cfg(feature = "test-hooks")]
    let r = r.route(rpc::PATH_TEST_READER_STALL, post(reader_stall));
    r.with_state(agent)
}

/// How long the caller waits for the answer ([`rpc::HEADER_WAIT_MS`]), if
/// it says.
fn told_wait(headers: &HeaderMap) -> Result<Option<Duration>, ApiError> {
    let Some(v) = headers.get(rpc::HEADER_WAIT_MS) else {
        return Ok(None);
    };
    v.to_str()
        .ok()
        .and_then(|t| t.parse::<u64>().ok())
        .map(|ms| Some(Duration::from_millis(ms)))
        .ok_or_else(|| {
            ApiError(CniError::new(
                code::DECODE_FAILURE,
                format!(
                    "the agent could not decode the request: header {}: {v:?} is not a whole number of milliseconds",
                    rpc::HEADER_WAIT_MS
                ),
            ))
        })
}

async fn add(
    State(a): State<Arc<Agent>>,
    accepted: Option<Extension<Accepted>>,
    headers: HeaderMap,
    body: Result<Json<CniRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let began = Instant::now();
    if let Err(why) = a.health.takes_adds() {
        return Err(ApiError(CniError::new(
            code::TRY_AGAIN_LATER,
            format!("the xdhcp agent is starting: {why}"),
        )));
    }
    let wait = told_wait(&headers)?;
    let req = decode_cni(&a, body)?;
    let span = tracing::info_span!("add", container = %req.container_id, ifname = %req.ifname);
    // The ADD runs as a task of its own: a caller that goes away (its
    // timeout, a killed runtime) does not stop it halfway, between the
    // lease and its report; it finishes, and a retried ADD finds it done.
    let agent = a.clone();
    let (added, ended) = tokio::spawn(tracing::Instrument::instrument(
        async move {
            // Boxed: the ADD's future is over clippy's size limit.
            let added = Box::pin(add::add(&agent, req, wait)).await;
            (added, Instant::now())
        },
        span.clone(),
    ))
    .await
    .map_err(|e| {
        ApiError(CniError::new(
            code::INTERNAL,
            format!("the ADD's task ended without an answer: {e}"),
        ))
    })?;
    let result = added.map_err(|e| {
        let e = ApiError::from(e);
        tracing::warn!(parent: &span, code = e.0.code, error = %e.0.msg, details = %e.0.details, "ADD failed");
        e
    })?;
    // Serialized here, so the answer's phase counts it.
    let answer = Json(result).into_response();
    let answered = Instant::now();
    // From the accept (the request read) when this is the connection's
    // first request; else from the handler's start.
    let start = accepted.and_then(|Extension(acc)| acc.first());
    let metrics = a.metrics();
    if let Some(at) = start {
        metrics.add_phase(AddPhase::Request, began.saturating_duration_since(at));
    }
    metrics.add_phase(AddPhase::Answer, answered.saturating_duration_since(ended));
    metrics.add_done(answered.saturating_duration_since(start.unwrap_or(began)));
    tracing::debug!(parent: &span,
        request_us = start.map(|at| began.saturating_duration_since(at).as_micros()),
        answer_us = answered.saturating_duration_since(ended).as_micros(),
        total_us = answered.saturating_duration_since(start.unwrap_or(began)).as_micros(),
        "ADD answered");
    Ok(answer)
}

async fn del(
    State(a): State<Arc<Agent>>,
    body: Result<Json<CniRequest>, JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let req = decode_cni(&a, body)?;
    // As ADD: a DEL is not stopped halfway when its caller goes away.
    let agent = a.clone();
    tokio::spawn(async move { add::del(&agent, req).await })
        .await
        .map_err(|e| {
            ApiError(CniError::new(
                code::INTERNAL,
                format!("the DEL's task ended without an answer: {e}"),
            ))
        })??;
    Ok(Json(serde_json::json!({})))
}

async fn check(
    State(a): State<Arc<Agent>>,
    body: Result<Json<CniRequest>, JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let req = decode_cni(&a, body)?;
    add::check(&a, req).await?;
    Ok(Json(serde_json::json!({})))
}

async fn gc(
    State(a): State<Arc<Agent>>,
    body: Result<Json<GcRequest>, JsonRejection>,
) -> Result<Json<rpc::GcReply>, ApiError> {
    let req = decode(body)?;
    Ok(Json(add::gc(&a, req).await?))
}

/// CNI STATUS: whether ADDs are taken (not whether every record is resumed
/// yet: see `Health::takes_adds`).
async fn ready(State(a): State<Arc<Agent>>) -> Json<Readiness> {
    Json(match a.health.takes_adds() {
        Ok(()) => Readiness {
            ready: true,
            reason: String::new(),
        },
        Err(why) => Readiness {
            ready: false,
            reason: why.to_owned(),
        },
    })
}

/// The lease table, once every record is resumed: during a start's
/// recovery it would list only what is resumed so far, and an operator (or
/// a checker) would read a missing lease as a lost one.
async fn leases(State(a): State<Arc<Agent>>) -> Json<Vec<rpc::LeaseView>> {
    a.leases.wait_recovered().await;
    Json(status::leases(&a))
}

async fn status(State(a): State<Arc<Agent>>) -> impl IntoResponse {
    let a2 = a.clone();
    // Reading kernel counters and the embedded store touches files and maps.
    match tokio::task::spawn_blocking(move || status::status(&a2)).await {
        Ok(s) => (StatusCode::OK, Json(s)).into_response(),
        Err(e) => {
            ApiError(CniError::new(code::INTERNAL, "status failed").with_details(e.to_string()))
                .into_response()
        }
    }
}

/// Break or mend the ring reader, as a failure would (tests only).
#[cfg(feature = "test-hooks")]
async fn reader_fault(
    State(a): State<Arc<Agent>>,
    Json(f): Json<rpc::ReaderFault>,
) -> Json<serde_json::Value> {
    a.capture().inject_reader_fault(f.broken);
    Json(serde_json::json!({}))
}

/// Stall the ring reader, or let it read again (tests only).
#[cfg(feature = "test-hooks")]
async fn reader_stall(
    State(a): State<Arc<Agent>>,
    Json(f): Json<rpc::ReaderStall>,
) -> Json<serde_json::Value> {
    a.capture().inject_reader_stall(f.stalled, &f.owned_xids);
    Json(serde_json::json!({}))
}

/// The bindings, once every record is resumed (as [`leases`]).
async fn bindings(State(a): State<Arc<Agent>>) -> Json<Vec<crate::bindings::BindingRow>> {
    a.leases.wait_recovered().await;
    Json(crate::daemon::status::binding_rows(&a))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// The caller's wait is read from its header; a malformed one is a
    /// decode failure naming the header, and none is none.
    #[test]
    fn the_callers_wait_is_read_from_its_header() {
        use axum::http::{HeaderMap, HeaderValue};
        use std::time::Duration;
        let mut h = HeaderMap::new();
        assert_eq!(super::told_wait(&h).ok().flatten(), None);
        h.insert(
            super::rpc::HEADER_WAIT_MS,
            HeaderValue::from_static("20000"),
        );
        assert_eq!(
            super::told_wait(&h).ok().flatten(),
            Some(Duration::from_secs(20))
        );
        h.insert(super::rpc::HEADER_WAIT_MS, HeaderValue::from_static("20s"));
        let Err(e) = super::told_wait(&h) else {
            panic!("a malformed wait was accepted");
        };
        assert_eq!(e.0.code, crate::cni::types::code::DECODE_FAILURE);
        assert!(e.0.msg.contains(super::rpc::HEADER_WAIT_MS), "{}", e.0.msg);
    }

    #[test]
    fn host_prefix_is_concatenated_as_upstream_does() {
        assert_eq!(
            super::prefixed(Path::new("/host"), Path::new("/var/run/netns/cni-1")),
            Path::new("/host/var/run/netns/cni-1")
        );
        assert_eq!(
            super::prefixed(Path::new("/host/"), Path::new("/proc/42/ns/net")),
            Path::new("/host//proc/42/ns/net")
        );
    }
}
