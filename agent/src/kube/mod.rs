//! Kubernetes: the pod-networks annotation, the API client, the embedded store.

pub mod annotation;
pub mod client;
pub mod embedded;
