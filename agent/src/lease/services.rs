//! What every lease task shares: metrics, the capture actor, the lease
//! store and the agent's shutdown token.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::datapath::capture::Capture;
use crate::metrics::Metrics;
use crate::store::LeaseStore;

/// What every lease task shares (and, as [`crate::lease::effects::Effects`],
/// the store writer and applier that carry its effects out).
#[derive(Debug)]
pub(crate) struct Services {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) capture: Arc<Capture>,
    pub(crate) store: LeaseStore,
    pub(crate) token: CancellationToken,
}
