//! Errors as one line: an error and its sources, `a: b: c`.
//!
//! Below every other module of the crate (it imports none of them): the
//! environment checks, the socket protocol, the client and the invocation
//! all render errors this way.

/// Render an error and its sources as `a: b: c`.
///
/// A source whose text already ends the line is not repeated (errors that
/// print their source's message in their own would otherwise read twice).
pub fn format_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(src) = cur {
        let next = src.to_string();
        if !s.ends_with(&next) {
            s.push_str(": ");
            s.push_str(&next);
        }
        cur = src.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("reading the config")]
        Read(#[source] std::io::Error),
        #[error("reading the config: {0}")]
        Repeats(#[source] std::io::Error),
    }

    #[test]
    fn sources_are_joined_once_each() {
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        assert_eq!(
            format_chain(&Outer::Read(io())),
            "reading the config: no such file"
        );
        // The outer message already ends with its source's: not repeated.
        assert_eq!(
            format_chain(&Outer::Repeats(io())),
            "reading the config: no such file"
        );
        assert_eq!(format_chain(&io()), "no such file");
    }
}
