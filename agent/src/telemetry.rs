//! Logging: `tracing` with an `EnvFilter` (`RUST_LOG`, default `info`), human
//! or JSON lines on stderr (stdout belongs to the CNI result and the
//! operator commands).

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Readable single lines.
    Human,
    /// One JSON object per line (for log collectors).
    Json,
}

/// Logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("RUST_LOG is not a valid filter: {0}")]
    Filter(#[from] tracing_subscriber::filter::ParseError),
    #[error("a global tracing subscriber is already installed: {0}")]
    AlreadySet(#[from] tracing_subscriber::util::TryInitError),
}

/// The filter from `RUST_LOG`, or `info` when it is unset or empty.
pub fn filter() -> Result<EnvFilter, TelemetryError> {
    match std::env::var("RUST_LOG") {
        Ok(s) if !s.trim().is_empty() => Ok(EnvFilter::try_new(s)?),
        _ => Ok(EnvFilter::new("info")),
    }
}

/// Install the global subscriber.
pub fn init(format: LogFormat) -> Result<(), TelemetryError> {
    let filter = filter()?;
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Human => registry
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .try_init()?,
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_writer(std::io::stderr),
            )
            .try_init()?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_filter_is_a_typed_error() {
        assert!(matches!(
            EnvFilter::try_new("xdhcp=notalevel").map_err(TelemetryError::from),
            Err(TelemetryError::Filter(_))
        ));
        assert!(filter().is_ok() || std::env::var("RUST_LOG").is_ok());
    }
}
