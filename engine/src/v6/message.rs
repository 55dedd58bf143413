//! Outgoing `DHCPv6` messages, built with dhcproto's `v6` types.

use std::fmt;
use std::net::Ipv6Addr;

use dhcproto::v6::{DhcpOption, DhcpOptions, IAAddr, IANA, Message, MessageType, ORO, OptionCode};
use dhcproto::{Encodable, Encoder};

use super::validate::code;

/// `All_DHCP_Relay_Agents_and_Servers` (RFC 8415 §7.1), port 547.
pub const ALL_SERVERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 1, 2);

/// Client message types this engine sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageKind {
    Solicit,
    Request,
    Confirm,
    Renew,
    Rebind,
    Release,
    Decline,
}

impl MessageKind {
    pub fn msg_type(self) -> MessageType {
        match self {
            MessageKind::Solicit => MessageType::Solicit,
            MessageKind::Request => MessageType::Request,
            MessageKind::Confirm => MessageType::Confirm,
            MessageKind::Renew => MessageType::Renew,
            MessageKind::Rebind => MessageType::Rebind,
            MessageKind::Release => MessageType::Release,
            MessageKind::Decline => MessageType::Decline,
        }
    }

    /// Bounded label for logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            MessageKind::Solicit => "solicit",
            MessageKind::Request => "request",
            MessageKind::Confirm => "confirm",
            MessageKind::Renew => "renew",
            MessageKind::Rebind => "rebind",
            MessageKind::Release => "release",
            MessageKind::Decline => "decline",
        }
    }

    /// Whether the message names one server (carries its Server Identifier,
    /// RFC 8415 §18.2): REQUEST, RENEW, RELEASE, DECLINE.
    pub fn names_server(self) -> bool {
        matches!(
            self,
            MessageKind::Request | MessageKind::Renew | MessageKind::Release | MessageKind::Decline
        )
    }
}

impl fmt::Display for MessageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// What goes into one message.
#[derive(Debug, Clone)]
pub(crate) struct Outgoing<'a> {
    pub kind: MessageKind,
    pub xid: u32,
    pub client_id: &'a [u8],
    pub server_id: Option<&'a [u8]>,
    pub iaid: u32,
    /// The `IA_NA`'s address, if any (none in SOLICIT). Lifetimes and T1/T2
    /// are sent as 0: RFC 8415 §18.2 lets the client leave them to the
    /// server.
    pub address: Option<Ipv6Addr>,
    /// Elapsed Time (§21.9), hundredths of a second.
    pub elapsed_cs: u16,
    pub rapid_commit: bool,
    pub request_options: &'a [u16],
}

/// Encode `o`. Every option is built by dhcproto; encoding only fails on
/// lengths above 65535, which the caller's bounded inputs cannot reach.
pub(crate) fn build(o: &Outgoing<'_>) -> Result<Vec<u8>, dhcproto::error::EncodeError> {
    let mut msg = Message::new_with_id(o.kind.msg_type(), [0; 3]);
    msg.set_xid_num(o.xid);
    let mut opts = DhcpOptions::new();
    opts.insert(DhcpOption::ClientId(o.client_id.to_vec()));
    if let (true, Some(id)) = (o.kind.names_server(), o.server_id) {
        opts.insert(DhcpOption::ServerId(id.to_vec()));
    }
    opts.insert(DhcpOption::ElapsedTime(o.elapsed_cs));
    let mut ia_opts = DhcpOptions::new();
    if let Some(addr) = o.address {
        ia_opts.insert(DhcpOption::IAAddr(IAAddr {
            addr,
            preferred_life: 0,
            valid_life: 0,
            opts: DhcpOptions::new(),
        }));
    }
    opts.insert(DhcpOption::IANA(IANA {
        id: o.iaid,
        t1: 0,
        t2: 0,
        opts: ia_opts,
    }));
    // ORO: in SOLICIT, REQUEST, RENEW and REBIND (§18.2); SOLICIT asks for
    // SOL_MAX_RT too, as §18.2.1 requires.
    if matches!(
        o.kind,
        MessageKind::Solicit | MessageKind::Request | MessageKind::Renew | MessageKind::Rebind
    ) {
        let mut codes: Vec<OptionCode> = o
            .request_options
            .iter()
            .map(|c| OptionCode::from(*c))
            .collect();
        if o.kind == MessageKind::Solicit && !o.request_options.contains(&code::SOL_MAX_RT) {
            codes.push(OptionCode::from(code::SOL_MAX_RT));
        }
        if !codes.is_empty() {
            opts.insert(DhcpOption::ORO(ORO { opts: codes }));
        }
    }
    if o.kind == MessageKind::Solicit && o.rapid_commit {
        opts.insert(DhcpOption::RapidCommit);
    }
    msg.set_opts(opts);
    let mut buf = Vec::with_capacity(128);
    msg.encode(&mut Encoder::new(&mut buf))?;
    Ok(buf)
}
