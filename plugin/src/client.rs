//! Blocking HTTP/1.1 client of the agent socket: one connection per call,
//! `Connection: close`, bounded by one deadline. No async runtime: the
//! plugin makes one call per exec.
//!
//! A call that changes something (ADD, DEL, CHECK, GC) waits a bounded
//! time for an agent that is being restarted ([`AGENT_RESTART_WAIT`]):
//! during a rolling upgrade the stopping agent answers "try again later"
//! (CNI code 11), then the socket is briefly missing or refuses
//! connections, then the new agent answers code 11 until it serves; an ADD
//! that failed there would cost the pod a sandbox retry with the kubelet's
//! back-off. STATUS does not wait: the runtime
//! polls it to learn exactly that the agent is not there.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error_chain::format_chain;
use crate::proto::{NOT_XDHCP_DAEMON, connect_hint};
use crate::types::{CniError, code};

/// Largest response head or body the plugin accepts (the agent's are small).
const MAX_RESPONSE: usize = 4 << 20;

/// How long a call that changes something waits for the agent's socket to
/// accept while it is missing or refuses connections, or for the agent to
/// stop answering "try again later" (the agent between its old and new
/// process), before failing (as "agent unreachable", or with the agent's
/// last answer).
pub const AGENT_RESTART_WAIT: Duration = Duration::from_secs(10);

/// The first pause between connection attempts while waiting; each pause
/// doubles up to [`MAX_CONNECT_PAUSE`].
const FIRST_CONNECT_PAUSE: Duration = Duration::from_millis(10);
const MAX_CONNECT_PAUSE: Duration = Duration::from_millis(200);

/// An HTTP status as the agent sent it: code and reason phrase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub code: u16,
    pub reason: String,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.reason.is_empty() {
            write!(f, "{}", self.code)
        } else {
            write!(f, "{} {}", self.code, self.reason)
        }
    }
}

/// Failure talking to the agent.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to the xdhcp agent at {}{}: {source}", socket.display(), waited_for(*waited))]
    Connect {
        socket: PathBuf,
        /// How long the call waited for the agent to come back (zero for
        /// a call that does not wait, or an error that is not a restart).
        waited: Duration,
        #[source]
        source: io::Error,
    },
    #[error("the xdhcp agent at {} did not answer within {}s", socket.display(), after.as_secs())]
    Timeout { socket: PathBuf, after: Duration },
    #[error("HTTP exchange with the xdhcp agent at {} failed: {source}", socket.display())]
    Http {
        socket: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "the xdhcp agent answered {status} with a body that is not JSON of the expected shape: {source}"
    )]
    Decode {
        status: Status,
        #[source]
        source: serde_json::Error,
    },
    #[error(transparent)]
    Agent(#[from] CniError),
}

impl ClientError {
    /// The CNI error the plugin prints for this failure: an agent error as
    /// is, everything else as "agent unreachable" naming the socket and
    /// what to do.
    pub fn into_cni(self) -> CniError {
        match self {
            Self::Agent(e) => e,
            Self::Connect {
                socket,
                waited,
                source,
            } => CniError::new(
                code::AGENT_UNREACHABLE,
                format!(
                    "{} (socket {}{})",
                    connect_hint(source.kind()),
                    socket.display(),
                    waited_for(waited)
                ),
            )
            .with_details(format_chain(&source)),
            e @ Self::Timeout { .. } => CniError::new(code::AGENT_UNREACHABLE, e.to_string()),
            e @ Self::Decode { .. } if matches!(&e, Self::Decode { status, .. } if status.code == 404) => {
                CniError::new(code::AGENT_UNREACHABLE, NOT_XDHCP_DAEMON)
                    .with_details(format_chain(&e))
            }
            e @ (Self::Http { .. } | Self::Decode { .. }) => {
                CniError::new(code::AGENT_UNREACHABLE, "talking to the xdhcp agent failed")
                    .with_details(format_chain(&e))
            }
        }
    }
}

/// ", waited N s for it" when the call waited for a restarting agent.
fn waited_for(waited: Duration) -> String {
    if waited.is_zero() {
        String::new()
    } else {
        format!("; waited {:.1}s for it to come back", waited.as_secs_f64())
    }
}

/// Whether a connection error is what an agent between two processes
/// gives: no socket yet, or a socket nobody listens on any more.
fn agent_restarting(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
    )
}

/// Whether an exchange was cut off by the agent's end going away before
/// the agent took the call: reset (the kernel resets a connection closed
/// with the request unread, as it does one still queued on a listener that
/// a stopping agent closes; the soak's rolling upgrades met this), or the
/// pipe broken before the request was written. The next agent takes the
/// call then. A connection closed unanswered after the agent read the
/// request is not one of these: that agent may have been in the middle of
/// the call (killed mid-ADD), and the next agent resumes what it left; the
/// caller's retry comes after that, as for any failed call.
fn cut_off(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
    )
}

/// Blocking client of the agent at one socket; every call is bounded by
/// the timeout (after the connection, which a POST may wait for up to
/// the restart wait).
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
    timeout: Duration,
    restart_wait: Duration,
}

impl Client {
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self {
            socket: socket.into(),
            timeout,
            restart_wait: AGENT_RESTART_WAIT,
        }
    }

    /// The same client waiting `wait` instead of [`AGENT_RESTART_WAIT`]
    /// for a restarting agent.
    #[must_use]
    pub fn with_restart_wait(mut self, wait: Duration) -> Self {
        self.restart_wait = wait;
        self
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `POST path` with a JSON body.
    pub fn post<Q: Serialize, R: DeserializeOwned>(
        &self,
        path: &str,
        body: &Q,
    ) -> Result<R, ClientError> {
        self.post_with(path, body, false)
    }

    /// `POST path` with a JSON body, telling the agent how long this client
    /// waits for the answer ([`crate::proto::HEADER_WAIT_MS`]).
    pub fn post_telling_wait<Q: Serialize, R: DeserializeOwned>(
        &self,
        path: &str,
        body: &Q,
    ) -> Result<R, ClientError> {
        self.post_with(path, body, true)
    }

    fn post_with<Q: Serialize, R: DeserializeOwned>(
        &self,
        path: &str,
        body: &Q,
        tell_wait: bool,
    ) -> Result<R, ClientError> {
        let bytes = serde_json::to_vec(body).map_err(|source| ClientError::Decode {
            status: Status {
                code: 400,
                reason: "Bad Request".to_owned(),
            },
            source,
        })?;
        // An agent that is stopping (or not yet serving) answers "try again
        // later" (code 11): the same restart as a missing socket, waited
        // for within the same budget, from the call's start. Every POST is
        // safe to send again: ADD, DEL, CHECK and GC are idempotent at the
        // agent, and one answered 11 changed nothing.
        let started = Instant::now();
        let mut pause = FIRST_CONNECT_PAUSE;
        let mut waited = Duration::ZERO;
        loop {
            let stream = self.connect(started, self.restart_wait, waited)?;
            match self.call(&stream, "POST", path, &bytes, tell_wait) {
                // Cut off by a stopping or dying agent: the same restart,
                // within the same budget.
                Err(ClientError::Http { ref source, .. })
                    if cut_off(source) && started.elapsed() + pause <= self.restart_wait =>
                {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(MAX_CONNECT_PAUSE);
                    waited = started.elapsed();
                }
                Err(ClientError::Agent(e)) if e.code == code::TRY_AGAIN_LATER => {
                    if started.elapsed() + pause > self.restart_wait {
                        let waited = started.elapsed();
                        return Err(ClientError::Agent(CniError {
                            msg: format!("{}{}", e.msg, waited_for(waited)),
                            ..e
                        }));
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(MAX_CONNECT_PAUSE);
                    waited = started.elapsed();
                }
                answer => return answer,
            }
        }
    }

    /// `GET path` (no wait for a restarting agent).
    pub fn get<R: DeserializeOwned>(&self, path: &str) -> Result<R, ClientError> {
        let stream = self.connect(Instant::now(), Duration::ZERO, Duration::ZERO)?;
        self.call(&stream, "GET", path, &[], false)
    }

    /// Connects, retrying until `wait` after `started` while the agent
    /// looks restarted (no socket, or connection refused); `waited`: how
    /// long the call has waited for it already.
    fn connect(
        &self,
        started: Instant,
        wait: Duration,
        mut waited: Duration,
    ) -> Result<UnixStream, ClientError> {
        let mut pause = FIRST_CONNECT_PAUSE;
        loop {
            match UnixStream::connect(&self.socket) {
                Ok(s) => return Ok(s),
                Err(e) if agent_restarting(&e) && waited + pause <= wait => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(MAX_CONNECT_PAUSE);
                    waited = started.elapsed();
                }
                Err(source) => {
                    return Err(ClientError::Connect {
                        socket: self.socket.clone(),
                        waited,
                        source,
                    });
                }
            }
        }
    }

    fn call<R: DeserializeOwned>(
        &self,
        stream: &UnixStream,
        method: &str,
        path: &str,
        body: &[u8],
        tell_wait: bool,
    ) -> Result<R, ClientError> {
        let deadline = Instant::now() + self.timeout;
        let wait = tell_wait.then_some(self.timeout);
        let (status, bytes) =
            Self::exchange(stream, deadline, wait, method, path, body).map_err(|source| {
                if matches!(
                    source.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) {
                    ClientError::Timeout {
                        socket: self.socket.clone(),
                        after: self.timeout,
                    }
                } else {
                    ClientError::Http {
                        socket: self.socket.clone(),
                        source,
                    }
                }
            })?;
        if (200..300).contains(&status.code) {
            serde_json::from_slice(&bytes).map_err(|source| ClientError::Decode { status, source })
        } else {
            let e: CniError = serde_json::from_slice(&bytes)
                .map_err(|source| ClientError::Decode { status, source })?;
            Err(ClientError::Agent(e))
        }
    }

    fn exchange(
        stream: &UnixStream,
        deadline: Instant,
        wait: Option<Duration>,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> io::Result<(Status, Vec<u8>)> {
        let remaining = || {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                Err(io::Error::from(io::ErrorKind::TimedOut))
            } else {
                Ok(left)
            }
        };
        let wait = wait.map_or_else(String::new, |w| {
            format!("{}: {}\r\n", crate::proto::HEADER_WAIT_MS, w.as_millis())
        });
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nhost: xdhcp\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n{wait}connection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        stream.set_write_timeout(Some(remaining()?))?;
        (&*stream).write_all(&request)?;
        let mut reader = BufReader::new(Deadlined {
            stream,
            deadline: &remaining,
        });
        read_response(&mut reader)
    }
}

/// A stream whose every read is bounded by what is left of the deadline.
struct Deadlined<'a, F> {
    stream: &'a UnixStream,
    deadline: &'a F,
}

impl<F: Fn() -> io::Result<Duration>> Read for Deadlined<'_, F> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(Some((self.deadline)()?))?;
        (&*self.stream).read(buf)
    }
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn read_line(r: &mut impl BufRead, what: &str) -> io::Result<String> {
    let mut line = Vec::new();
    r.by_ref()
        .take(MAX_RESPONSE as u64)
        .read_until(b'\n', &mut line)?;
    if line.last() != Some(&b'\n') {
        return Err(if line.is_empty() {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("connection closed before the {what}"),
            )
        } else {
            bad(format!("{what} not terminated"))
        });
    }
    let line = String::from_utf8(line).map_err(|_| bad(format!("{what} is not UTF-8")))?;
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}

/// Read one HTTP/1.1 response: status line, headers, and a body delimited
/// by `content-length`, chunked encoding, or the end of the connection.
pub fn read_response(r: &mut impl BufRead) -> io::Result<(Status, Vec<u8>)> {
    let line = read_line(r, "status line")?;
    let mut parts = line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(bad(format!("not an HTTP/1.x status line: {line:?}")));
    }
    let code = parts
        .next()
        .and_then(|c| c.parse::<u16>().ok())
        .filter(|c| (100..1000).contains(c))
        .ok_or_else(|| bad(format!("bad status line: {line:?}")))?;
    let reason = parts.next().unwrap_or_default().to_owned();
    let mut length = None;
    let mut chunked = false;
    let mut head = line.len();
    loop {
        let h = read_line(r, "header")?;
        head += h.len();
        if head > MAX_RESPONSE {
            return Err(bad("response head too large"));
        }
        if h.is_empty() {
            break;
        }
        let (name, value) = h
            .split_once(':')
            .ok_or_else(|| bad(format!("malformed header {h:?}")))?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let n = value
                .parse::<usize>()
                .map_err(|_| bad(format!("bad content-length {value:?}")))?;
            length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value
                .rsplit(',')
                .next()
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("chunked"));
        }
    }
    if code / 100 == 1 {
        // An interim response: the final one follows.
        return read_response(r);
    }
    let status = Status { code, reason };
    let body = if chunked {
        read_chunked(r)?
    } else if let Some(n) = length {
        if n > MAX_RESPONSE {
            return Err(bad("response body too large"));
        }
        let mut body = vec![0; n];
        r.read_exact(&mut body)?;
        body
    } else {
        let mut body = Vec::new();
        r.take(MAX_RESPONSE as u64 + 1).read_to_end(&mut body)?;
        if body.len() > MAX_RESPONSE {
            return Err(bad("response body too large"));
        }
        body
    };
    Ok((status, body))
}

fn read_chunked(r: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line = read_line(r, "chunk size")?;
        let size = line.split(';').next().unwrap_or_default().trim();
        let n =
            usize::from_str_radix(size, 16).map_err(|_| bad(format!("bad chunk size {size:?}")))?;
        if n == 0 {
            // Trailers, up to the empty line.
            while !read_line(r, "trailer")?.is_empty() {}
            return Ok(body);
        }
        if body.len() + n > MAX_RESPONSE {
            return Err(bad("response body too large"));
        }
        let at = body.len();
        body.resize(at + n, 0);
        r.read_exact(&mut body[at..])?;
        if !read_line(r, "chunk end")?.is_empty() {
            return Err(bad("chunk not followed by CRLF"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{PATH_READY, Readiness};

    fn parse(raw: &str) -> io::Result<(Status, Vec<u8>)> {
        read_response(&mut raw.as_bytes())
    }

    #[test]
    fn bodies_by_length_chunks_and_close() {
        let (s, b) = parse("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}").unwrap();
        assert_eq!(
            (s.code, s.reason.as_str(), b.as_slice()),
            (200, "OK", &b"{}"[..])
        );
        let (s, b) = parse(
            "HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4;x=y\r\n\":1}\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((s.code, b.as_slice()), (404, &br#"{"a":1}"#[..]));
        let (_, b) = parse("HTTP/1.0 200 OK\r\n\r\n{\"x\":2}").unwrap();
        assert_eq!(b, br#"{"x":2}"#);
        let (s, _) = parse(
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(s.code, 204);
    }

    #[test]
    fn malformed_responses_are_errors() {
        for raw in [
            "",
            "SSH-2.0-OpenSSH\r\n\r\n",
            "HTTP/1.1 2x OK\r\n\r\n",
            "HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n{}",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 2",
        ] {
            assert!(parse(raw).is_err(), "{raw:?}");
        }
    }

    /// The upstream daemon (Go's `net/rpc` over HTTP) on the socket: every
    /// path but its own gets Go's plain-text 404, and the plugin says what
    /// is wrong instead of "not JSON".
    #[test]
    fn the_upstream_daemon_on_the_socket_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dhcp.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf).unwrap();
            conn.write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain; charset=utf-8\r\n\
                  X-Content-Type-Options: nosniff\r\nContent-Length: 19\r\n\r\n404 page not found\n",
            )
            .unwrap();
        });
        let client = Client::new(&path, Duration::from_secs(5));
        let e = client.get::<Readiness>(PATH_READY).unwrap_err().into_cni();
        server.join().unwrap();
        assert_eq!(e.code, code::AGENT_UNREACHABLE);
        assert!(e.msg.contains("upstream dhcp daemon"), "{e}");
        assert!(e.details.contains("404 Not Found"), "{e}");
    }

    #[test]
    fn agent_errors_pass_through_and_answers_decode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            for answer in [
                "HTTP/1.1 504 Gateway Timeout\r\ncontent-length: 33\r\n\r\n{\"code\":102,\"msg\":\"no lease yet\"}",
                "HTTP/1.1 200 OK\r\ncontent-length: 14\r\n\r\n{\"ready\":true}",
            ] {
                let (mut conn, _) = listener.accept().unwrap();
                let mut buf = [0u8; 4096];
                let n = conn.read(&mut buf).unwrap();
                let req = String::from_utf8_lossy(&buf[..n]).into_owned();
                conn.write_all(answer.as_bytes()).unwrap();
                assert!(req.starts_with("GET /v1/cni/status HTTP/1.1\r\n"), "{req}");
            }
        });
        let client = Client::new(&path, Duration::from_secs(5));
        let e = client.get::<Readiness>(PATH_READY).unwrap_err().into_cni();
        assert_eq!((e.code, e.msg.as_str()), (102, "no lease yet"));
        let r: Readiness = client.get(PATH_READY).unwrap();
        assert!(r.ready);
        server.join().unwrap();
    }

    #[test]
    fn missing_socket_is_a_connect_error() {
        let dir = tempfile::tempdir().unwrap();
        let c = Client::new(dir.path().join("none.sock"), Duration::from_secs(2));
        let e = c.get::<Readiness>(PATH_READY).unwrap_err();
        assert!(matches!(e, ClientError::Connect { .. }), "{e}");
        let e = e.into_cni();
        assert_eq!(e.code, code::AGENT_UNREACHABLE);
        assert!(e.msg.contains("not running"), "{e}");
        assert!(e.msg.contains("none.sock"), "{e}");
    }

    /// An agent between its old and its new process (a rolling upgrade):
    /// first no socket, then a stale one nobody listens on, then the new
    /// agent's. An ADD-like POST waits for it and is answered.
    #[test]
    fn a_post_waits_for_a_restarting_agent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.sock");
        let p = path.clone();
        let agent = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            // The old process's socket, left behind: connection refused.
            drop(std::os::unix::net::UnixListener::bind(&p).unwrap());
            std::thread::sleep(Duration::from_millis(150));
            std::fs::remove_file(&p).unwrap();
            let listener = std::os::unix::net::UnixListener::bind(&p).unwrap();
            let (mut conn, _) = listener.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf).unwrap();
            conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 14\r\n\r\n{\"ready\":true}")
                .unwrap();
        });
        let client = Client::new(&path, Duration::from_secs(5));
        let started = Instant::now();
        let r: Readiness = client.post(PATH_READY, &serde_json::json!({})).unwrap();
        assert!(r.ready);
        assert!(started.elapsed() >= Duration::from_millis(300));
        agent.join().unwrap();
    }

    /// An agent answering `answers` in turn, one connection each (it asks
    /// that each request be a POST to `PATH_READY`); how many it answered.
    fn agent_answering(path: &Path, answers: Vec<&'static str>) -> std::thread::JoinHandle<usize> {
        let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
        std::thread::spawn(move || {
            let mut n = 0;
            for answer in answers {
                let Ok((mut conn, _)) = listener.accept() else {
                    break;
                };
                let mut buf = [0u8; 4096];
                let got = conn.read(&mut buf).unwrap();
                let req = String::from_utf8_lossy(&buf[..got]).into_owned();
                assert!(req.starts_with("POST /v1/cni/status HTTP/1.1\r\n"), "{req}");
                conn.write_all(answer.as_bytes()).unwrap();
                n += 1;
            }
            n
        })
    }

    const SHUTTING_DOWN: &str = "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 52\r\n\r\n\
        {\"code\":11,\"msg\":\"the xdhcp agent is shutting down\"}";
    const STARTING: &str = "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 47\r\n\r\n\
        {\"code\":11,\"msg\":\"the xdhcp agent is starting\"}";
    const READY: &str = "HTTP/1.1 200 OK\r\ncontent-length: 14\r\n\r\n{\"ready\":true}";

    /// A rolling upgrade as the plugin meets it: the stopping agent answers
    /// "shutting down" (code 11), its socket goes, the next agent answers
    /// "starting" (code 11), then serves. The POST waits through all of it
    /// and is answered.
    #[test]
    fn a_post_answered_try_again_later_waits_for_the_next_agent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.sock");
        let old = agent_answering(&path, vec![SHUTTING_DOWN, SHUTTING_DOWN]);
        let p = path.clone();
        let next = std::thread::spawn(move || {
            assert_eq!(old.join().unwrap(), 2);
            std::fs::remove_file(&p).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            agent_answering(&p, vec![STARTING, READY]).join().unwrap()
        });
        let client = Client::new(&path, Duration::from_secs(5));
        let r: Readiness = client.post(PATH_READY, &serde_json::json!({})).unwrap();
        assert!(r.ready);
        assert_eq!(next.join().unwrap(), 2, "the next agent answered twice");
    }

    /// A stopping agent closes the call's connection with the request
    /// unread (the peer reads a reset, as from a connection still queued on
    /// a closed listener): the POST is sent again and answered. One closed
    /// unanswered after the request was read (an agent killed mid-call) is
    /// not sent again, nor is a GET cut off.
    #[test]
    fn a_post_cut_off_unread_by_a_stopping_agent_is_sent_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let agent = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // Closed with the request unread: reset.
            let (conn, _) = listener.accept().unwrap();
            let _ = nix::sys::socket::recv(
                std::os::fd::AsRawFd::as_raw_fd(&conn),
                &mut buf,
                nix::sys::socket::MsgFlags::MSG_PEEK,
            )
            .unwrap();
            drop(conn);
            // Answered.
            let (mut conn, _) = listener.accept().unwrap();
            let _ = conn.read(&mut buf).unwrap();
            conn.write_all(READY.as_bytes()).unwrap();
            // Then, for the next two calls: read and closed unanswered.
            for _ in 0..2 {
                let (mut conn, _) = listener.accept().unwrap();
                let _ = conn.read(&mut buf).unwrap();
            }
        });
        let client = Client::new(&path, Duration::from_secs(5));
        let r: Readiness = client.post(PATH_READY, &serde_json::json!({})).unwrap();
        assert!(r.ready);
        let e = client
            .post::<_, Readiness>(PATH_READY, &serde_json::json!({}))
            .unwrap_err();
        assert!(matches!(e, ClientError::Http { .. }), "{e}");
        let e = client.get::<Readiness>(PATH_READY).unwrap_err();
        assert!(matches!(e, ClientError::Http { .. }), "{e}");
        agent.join().unwrap();
    }

    /// An agent that keeps answering "try again later": the POST gives up
    /// after its wait with the agent's answer, saying how long it waited;
    /// a GET (STATUS) takes the answer at once.
    #[test]
    fn a_post_gives_up_on_try_again_later_after_its_wait_and_a_get_does_not_wait() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let _agent = std::thread::spawn(move || {
            while let Ok((mut conn, _)) = listener.accept() {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf);
                let _ = conn.write_all(SHUTTING_DOWN.as_bytes());
            }
        });
        let wait = Duration::from_millis(300);
        let c = Client::new(&path, Duration::from_secs(2)).with_restart_wait(wait);
        let started = Instant::now();
        let e = c
            .post::<_, Readiness>(PATH_READY, &serde_json::json!({}))
            .unwrap_err()
            .into_cni();
        let took = started.elapsed();
        assert!(took >= wait / 3 && took < wait * 3, "{took:?}");
        assert_eq!(e.code, code::TRY_AGAIN_LATER);
        assert!(
            e.msg
                .starts_with("the xdhcp agent is shutting down; waited"),
            "{e}"
        );

        let started = Instant::now();
        let e = c.get::<Readiness>(PATH_READY).unwrap_err().into_cni();
        assert!(started.elapsed() < Duration::from_millis(100));
        assert_eq!(
            (e.code, e.msg.as_str()),
            (code::TRY_AGAIN_LATER, "the xdhcp agent is shutting down")
        );
    }

    /// An agent that does not come back: the POST gives up after its
    /// wait and says how long it waited; STATUS (a GET) does not wait.
    #[test]
    fn a_post_gives_up_on_an_agent_that_stays_away_and_a_get_does_not_wait() {
        let dir = tempfile::tempdir().unwrap();
        let wait = Duration::from_millis(300);
        let c = Client::new(dir.path().join("none.sock"), Duration::from_secs(2))
            .with_restart_wait(wait);
        let started = Instant::now();
        let e = c
            .post::<_, Readiness>(PATH_READY, &serde_json::json!({}))
            .unwrap_err();
        assert!(started.elapsed() >= wait / 3, "{:?}", started.elapsed());
        assert!(matches!(e, ClientError::Connect { waited, .. } if waited > Duration::ZERO));
        let e = e.into_cni();
        assert_eq!(e.code, code::AGENT_UNREACHABLE);
        assert!(
            e.msg.contains("not running") && e.msg.contains("for it to come back"),
            "{e}"
        );

        let started = Instant::now();
        let e = c.get::<Readiness>(PATH_READY).unwrap_err();
        assert!(started.elapsed() < Duration::from_millis(100));
        assert!(matches!(e, ClientError::Connect { waited, .. } if waited.is_zero()));
        assert!(!e.into_cni().msg.contains("come back"));
    }

    /// A socket path no socket can have (longer than `sun_path`) is not a
    /// restart: no wait.
    #[test]
    fn a_post_does_not_wait_on_an_error_that_is_not_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x".repeat(120));
        let c = Client::new(&path, Duration::from_secs(2));
        let started = Instant::now();
        let e = c
            .post::<_, Readiness>(PATH_READY, &serde_json::json!({}))
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(
            matches!(e, ClientError::Connect { waited, .. } if waited.is_zero()),
            "{e}"
        );
    }

    #[test]
    fn silent_agent_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mute.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        // Accept and never answer.
        let _keep = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            std::thread::sleep(Duration::from_secs(5));
            drop(s);
        });
        let c = Client::new(&path, Duration::from_millis(200));
        let e = c.get::<Readiness>(PATH_READY).unwrap_err();
        assert!(matches!(e, ClientError::Timeout { .. }), "{e}");
        assert_eq!(e.into_cni().code, code::AGENT_UNREACHABLE);
    }
}
