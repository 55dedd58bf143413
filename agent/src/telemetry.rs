//! Logging: `tracing` with an `EnvFilter` (`RUST_LOG`, default `info`), human
//! or JSON lines on stderr (stdout belongs to the CNI result and the
//! operator commands). Human lines are coloured only when stderr is a
//! terminal: a log written to a file or a pipe (a container runtime's,
//! journald's) stays plain text.

use std::io::IsTerminal as _;

use clap::ValueEnum;
use tracing::Subscriber;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{DefaultFields, Format};
use tracing_subscriber::fmt::writer::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
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

/// The human-readable layer writing to `writer`, with ANSI colour codes
/// only when `ansi` (stderr is a terminal).
fn human_layer<S, W>(
    writer: W,
    ansi: bool,
) -> tracing_subscriber::fmt::Layer<S, DefaultFields, Format, W>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + 'static,
{
    tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(ansi)
}

/// Install the global subscriber.
pub fn init(format: LogFormat) -> Result<(), TelemetryError> {
    let filter = filter()?;
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Human => registry
            .with(human_layer(
                std::io::stderr,
                std::io::stderr().is_terminal(),
            ))
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
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A log sink the test reads back.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("sink lock").extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Sink {
        type Writer = Sink;

        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    /// One warning through [`human_layer`], as written.
    fn human_line(ansi: bool) -> String {
        let sink = Sink::default();
        let subscriber = tracing_subscriber::registry().with(human_layer(sink.clone(), ansi));
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(ifname = "eth0", "lease renewed");
        });
        let bytes = sink.0.lock().expect("sink lock").clone();
        String::from_utf8(bytes).expect("log lines are UTF-8")
    }

    #[test]
    fn colour_codes_only_for_a_terminal() {
        let plain = human_line(false);
        assert!(plain.contains("lease renewed"), "{plain:?}");
        assert!(plain.contains("ifname=\"eth0\""), "{plain:?}");
        assert!(
            !plain.contains('\x1b'),
            "ANSI codes in a plain log: {plain:?}"
        );
        let coloured = human_line(true);
        assert!(
            coloured.contains("\x1b["),
            "no ANSI codes on a terminal: {coloured:?}"
        );
    }

    #[test]
    fn bad_filter_is_a_typed_error() {
        assert!(matches!(
            EnvFilter::try_new("xdhcp=notalevel").map_err(TelemetryError::from),
            Err(TelemetryError::Filter(_))
        ));
        assert!(filter().is_ok() || std::env::var("RUST_LOG").is_ok());
    }
}
