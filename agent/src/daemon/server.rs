//! The agent socket's HTTP routes (see [`crate::rpc`] for the protocol).

use std::sync::Arc;

use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use super::{Agent, ops};
use crate::cni::types::{CniError, code};
use crate::rpc::{self, CniRequest, GcRequest, Readiness};

/// A CNI error as an HTTP response.
struct ApiError(CniError);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (rpc::status_for(self.0.code), Json(self.0)).into_response()
    }
}

impl From<CniError> for ApiError {
    fn from(e: CniError) -> Self {
        Self(e)
    }
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
pub fn router(agent: Arc<Agent>) -> Router {
    Router::new()
        .route(rpc::PATH_ADD, post(add))
        .route(rpc::PATH_DEL, post(del))
        .route(rpc::PATH_CHECK, post(check))
        .route(rpc::PATH_GC, post(gc))
        .route(rpc::PATH_READY, get(ready))
        .route(rpc::PATH_LEASES, get(leases))
        .route(rpc::PATH_STATUS, get(status))
        .with_state(agent)
}

async fn add(
    State(a): State<Arc<Agent>>,
    body: Result<Json<CniRequest>, JsonRejection>,
) -> Result<Json<rpc::CniResult>, ApiError> {
    if let Err(why) = a.health.ready() {
        return Err(ApiError(CniError::new(
            code::TRY_AGAIN_LATER,
            format!("the xdhcp agent is starting: {why}"),
        )));
    }
    let req = decode(body)?;
    Ok(Json(ops::add(&a, req).await.inspect_err(|e| {
        tracing::warn!(code = e.code, error = %e.msg, details = %e.details, "ADD failed");
    })?))
}

async fn del(
    State(a): State<Arc<Agent>>,
    body: Result<Json<CniRequest>, JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let req = decode(body)?;
    ops::del(&a, req).await?;
    Ok(Json(serde_json::json!({})))
}

async fn check(
    State(a): State<Arc<Agent>>,
    body: Result<Json<CniRequest>, JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let req = decode(body)?;
    ops::check(&a, req).await?;
    Ok(Json(serde_json::json!({})))
}

async fn gc(
    State(a): State<Arc<Agent>>,
    body: Result<Json<GcRequest>, JsonRejection>,
) -> Result<Json<rpc::GcReply>, ApiError> {
    let req = decode(body)?;
    Ok(Json(ops::gc(&a, req).await?))
}

async fn ready(State(a): State<Arc<Agent>>) -> Json<Readiness> {
    Json(match a.health.ready() {
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

async fn leases(State(a): State<Arc<Agent>>) -> Json<Vec<rpc::LeaseView>> {
    let mut v = a.lease_views();
    v.sort_by(|x, y| (&x.container_id, &x.ifname).cmp(&(&y.container_id, &y.ifname)));
    Json(v)
}

async fn status(State(a): State<Arc<Agent>>) -> impl IntoResponse {
    let a2 = a.clone();
    // Reading kernel counters and the embedded store touches files and maps.
    match tokio::task::spawn_blocking(move || a2.status()).await {
        Ok(s) => (StatusCode::OK, Json(s)).into_response(),
        Err(e) => {
            ApiError(CniError::new(code::INTERNAL, "status failed").with_details(e.to_string()))
                .into_response()
        }
    }
}
