//! The agent socket under attack, over the real socket of an in-process
//! agent (embedded store): a peer that is not root, a request naming the
//! host's network namespace, a client that connects and says nothing,
//! more clients than the agent serves at once, and a umask that would
//! leave the socket open to everyone between its bind and its chmod.

use std::io::{Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use xdhcp::cni::config;
use xdhcp::cni::types::code;
use xdhcp::rpc::{self, CniRequest};
use xdhcp_tests::agent::InProcessAgent;

/// A GET of the readiness route on a fresh connection; the raw answer.
fn get_ready(socket: &Path, timeout: Duration) -> std::io::Result<String> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(timeout))?;
    write!(
        s,
        "GET {} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n",
        rpc::PATH_READY
    )?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    Ok(answer)
}

fn request(netns: &Path, ifname: &str) -> CniRequest {
    let conf = r#"{"cniVersion":"1.0.0","name":"net","type":"bridge","ipam":{"type":"xdhcp"}}"#;
    CniRequest {
        container_id: "ctr-attack".to_owned(),
        ifname: ifname.to_owned(),
        netns: Some(netns.to_path_buf()),
        args: std::collections::BTreeMap::new(),
        config: config::parse(conf.as_bytes()).unwrap(),
    }
}

/// Anyone who reaches the socket's path (it is often mounted into other
/// pods) but is not root is refused with one CNI error naming its uid,
/// whatever the file modes let through; a uid given with
/// `--socket-allow-uid` is served.
#[test]
fn a_peer_that_is_not_root_is_refused() {
    const NOBODY: u32 = 65534;
    for allowed in [false, true] {
        let agent = InProcessAgent::start_with(|a| {
            if allowed {
                a.socket_allow_uid = vec![NOBODY];
            }
        });
        // As if mounted elsewhere with open modes: only the peer check is left.
        let dir = agent.socket.parent().unwrap().to_path_buf();
        for p in [dir.parent().unwrap(), &dir] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::fs::set_permissions(&agent.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
        let socket = agent.socket.clone();
        // setresuid(2) itself changes the calling thread only (the C
        // library's wrapper would change every thread of the test).
        let answer = std::thread::spawn(move || {
            let r = unsafe { libc::syscall(libc::SYS_setresuid, NOBODY, NOBODY, NOBODY) };
            assert_eq!(r, 0, "setresuid: {}", std::io::Error::last_os_error());
            get_ready(&socket, Duration::from_secs(10))
        })
        .join()
        .unwrap()
        .expect("the agent answers");
        if allowed {
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        } else {
            assert!(!answer.starts_with("HTTP/1.1 200"), "{answer}");
            assert!(answer.contains("uid 65534"), "{answer}");
            assert!(
                answer.contains(&format!("\"code\":{}", code::INVALID_ENV)),
                "{answer}"
            );
        }
        // Root is always served.
        let mine = get_ready(&agent.socket, Duration::from_secs(10)).unwrap();
        assert!(mine.starts_with("HTTP/1.1 200"), "{mine}");
    }
}

/// A client of the socket names the host's network namespace (pid 1's),
/// or the agent's own by its pid, in a pod's path shape: the agent refuses
/// before it opens anything there, naming the namespace.
#[test]
fn the_hosts_and_the_agents_own_namespace_are_refused() {
    let agent = InProcessAgent::start_with(|_| {});
    let own = PathBuf::from(format!("/proc/{}/ns/net", std::process::id()));
    for netns in [PathBuf::from("/proc/1/ns/net"), own] {
        let err = agent
            .add(&request(&netns, "xdt-none0"))
            .expect_err("the host's namespace must be refused")
            .into_cni();
        assert_eq!(err.code, code::INVALID_ENV, "{err:?}");
        assert!(
            err.msg.contains("network namespace") && err.msg.contains(&netns.display().to_string()),
            "{}",
            err.msg
        );
    }
    // A path in no namespace shape at all.
    let err = agent
        .add(&request(Path::new("/etc/hostname"), "xdt-none0"))
        .expect_err("a file that is no namespace must be refused")
        .into_cni();
    assert_eq!(err.code, code::INVALID_ENV, "{err:?}");
    assert!(agent.leases().is_empty());
}

/// A client that connects and sends nothing is cut off once the header
/// timeout (10 s) is up: it cannot hold one of the agent's connections.
#[test]
fn a_silent_client_is_cut_off() {
    let agent = InProcessAgent::start_with(|_| {});
    let mut s = UnixStream::connect(&agent.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 512];
    // EOF (or a 408 and then EOF) once the agent gives up on the header.
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the agent kept a silent connection open: {e}"),
        }
    }
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(20),
        "{took:?}"
    );
}

/// With every connection slot held by idle clients, the next client waits
/// (in the kernel's backlog) instead of being served beside them; once a
/// slot frees, it is served.
#[test]
fn clients_beyond_the_connection_cap_wait() {
    let agent = InProcessAgent::start_with(|a| a.socket_max_connections = 2);
    let held: Vec<UnixStream> = (0..2)
        .map(|_| UnixStream::connect(&agent.socket).unwrap())
        .collect();
    // Let the agent accept both.
    std::thread::sleep(Duration::from_millis(300));
    let waited = get_ready(&agent.socket, Duration::from_secs(1));
    assert!(waited.is_err(), "served beyond the cap: {waited:?}");
    drop(held);
    let served = get_ready(&agent.socket, Duration::from_secs(5)).unwrap();
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
}

/// The socket is never at its path with a mode the umask chose: it is
/// bound elsewhere and moved into place with mode 0600, so the directory
/// sees no socket created at the path, and the mode is 0600 even with a
/// umask of 0.
#[test]
fn the_socket_is_never_at_its_path_with_the_umasks_mode() {
    let dir = tempfile::Builder::new()
        .prefix("xdt-umask-")
        .tempdir()
        .unwrap();
    let path = dir.path().join("agent.sock");
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    assert!(fd >= 0);
    let c = std::ffi::CString::new(dir.path().to_str().unwrap()).unwrap();
    let wd =
        unsafe { libc::inotify_add_watch(fd, c.as_ptr(), libc::IN_CREATE | libc::IN_MOVED_TO) };
    assert!(wd >= 0);
    let old = unsafe { libc::umask(0) };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let listener = rt.block_on(xdhcp::daemon::bind_socket(&path));
    unsafe { libc::umask(old) };
    let _listener = listener.unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // Read the directory's events: the socket's name arrives by a move.
    let mut buf = [0u8; 4096];
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n > 0, "no events");
    let mut events = Vec::new();
    let mut at = 0usize;
    let n = usize::try_from(n).unwrap();
    while at < n {
        let ev: libc::inotify_event =
            unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
        let start = at + std::mem::size_of::<libc::inotify_event>();
        let len = usize::try_from(ev.len).unwrap();
        let name = String::from_utf8_lossy(&buf[start..start + len])
            .trim_end_matches('\0')
            .to_owned();
        events.push((ev.mask, name));
        at = start + len;
    }
    unsafe { libc::close(fd) };
    assert!(
        !events
            .iter()
            .any(|(m, n)| m & libc::IN_CREATE != 0 && n == "agent.sock"),
        "the socket was created at its path: {events:?}"
    );
    assert!(
        events
            .iter()
            .any(|(m, n)| m & libc::IN_MOVED_TO != 0 && n == "agent.sock"),
        "{events:?}"
    );
    // The private directory is gone.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["agent.sock"]);
}
