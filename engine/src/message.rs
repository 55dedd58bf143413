//! Outgoing messages, built with `dhcproto` (RFC 2131 Table 5).

use std::net::Ipv4Addr;

use dhcproto::v4::{DhcpOption, Flags, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Encodable, Encoder};

/// BOOTP minimum message size: some relays and servers drop shorter ones
/// (RFC 1542 §2.1).
pub const MIN_LEN: usize = 300;

/// Options the client asks for (option 55) and honours.
pub const REQUESTED_OPTIONS: [u8; 11] = [1, 3, 6, 15, 26, 51, 54, 58, 59, 119, 121];

/// Message kinds the client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageKind {
    Discover,
    Request,
    Decline,
    Release,
}

impl MessageKind {
    /// Bounded label for logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            MessageKind::Discover => "discover",
            MessageKind::Request => "request",
            MessageKind::Decline => "decline",
            MessageKind::Release => "release",
        }
    }

    fn dhcp_type(self) -> MessageType {
        match self {
            MessageKind::Discover => MessageType::Discover,
            MessageKind::Request => MessageType::Request,
            MessageKind::Decline => MessageType::Decline,
            MessageKind::Release => MessageType::Release,
        }
    }
}

/// Everything that varies between the messages the client sends.
#[derive(Debug, Clone)]
pub struct Outgoing<'a> {
    pub kind: MessageKind,
    pub xid: u32,
    pub secs: u16,
    pub chaddr: [u8; 6],
    pub ciaddr: Ipv4Addr,
    pub broadcast_flag: bool,
    pub client_id: Option<&'a [u8]>,
    pub hostname: Option<&'a str>,
    /// Option 50.
    pub requested_ip: Option<Ipv4Addr>,
    /// Option 54.
    pub server_id: Option<Ipv4Addr>,
    /// Option 57.
    pub max_message_size: u16,
}

/// Encode a message. DISCOVER and REQUEST carry 12, 55 and 57; DECLINE and
/// RELEASE must not (RFC 2131 Table 5).
pub fn build(o: &Outgoing<'_>) -> Result<Vec<u8>, dhcproto::error::EncodeError> {
    let mut msg = Message::new_with_id(
        o.xid,
        o.ciaddr,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        &o.chaddr,
    );
    msg.set_opcode(Opcode::BootRequest).set_secs(o.secs);
    if o.broadcast_flag && matches!(o.kind, MessageKind::Discover | MessageKind::Request) {
        msg.set_flags(Flags::default().set_broadcast());
    }
    let opts = msg.opts_mut();
    opts.insert(DhcpOption::MessageType(o.kind.dhcp_type()));
    if let Some(id) = o.client_id {
        opts.insert(DhcpOption::ClientIdentifier(id.to_vec()));
    }
    if let Some(ip) = o.requested_ip {
        opts.insert(DhcpOption::RequestedIpAddress(ip));
    }
    if let Some(ip) = o.server_id {
        opts.insert(DhcpOption::ServerIdentifier(ip));
    }
    if matches!(o.kind, MessageKind::Discover | MessageKind::Request) {
        if let Some(h) = o.hostname {
            opts.insert(DhcpOption::Hostname(h.to_owned()));
        }
        opts.insert(DhcpOption::ParameterRequestList(
            REQUESTED_OPTIONS
                .iter()
                .map(|c| OptionCode::from(*c))
                .collect(),
        ));
        opts.insert(DhcpOption::MaxMessageSize(o.max_message_size));
    }
    let mut buf = Vec::with_capacity(MIN_LEN);
    msg.encode(&mut Encoder::new(&mut buf))?;
    if buf.len() < MIN_LEN {
        buf.resize(MIN_LEN, 0);
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use dhcproto::Decodable;
    use dhcproto::Decoder;

    use super::*;

    fn out(kind: MessageKind) -> Outgoing<'static> {
        Outgoing {
            kind,
            xid: 0xdead_beef,
            secs: 7,
            chaddr: [2, 0, 0, 0, 0, 1],
            ciaddr: Ipv4Addr::UNSPECIFIED,
            broadcast_flag: true,
            client_id: Some(&[1, 2, 0, 0, 0, 0, 1]),
            hostname: Some("pod-a"),
            requested_ip: Some(Ipv4Addr::new(192, 0, 2, 10)),
            server_id: Some(Ipv4Addr::new(192, 0, 2, 1)),
            max_message_size: 1500,
        }
    }

    #[test]
    fn request_carries_table5_options() {
        let b = build(&out(MessageKind::Request)).unwrap();
        assert!(b.len() >= MIN_LEN);
        let m = Message::decode(&mut Decoder::new(&b)).unwrap();
        assert_eq!(m.xid(), 0xdead_beef);
        assert_eq!(m.secs(), 7);
        assert!(m.flags().broadcast());
        assert_eq!(m.chaddr(), &[2, 0, 0, 0, 0, 1]);
        assert_eq!(m.opts().msg_type(), Some(MessageType::Request));
        for code in [12u8, 50, 54, 55, 57, 61] {
            assert!(
                m.opts().get(OptionCode::from(code)).is_some(),
                "option {code}"
            );
        }
        let Some(DhcpOption::ParameterRequestList(prl)) =
            m.opts().get(OptionCode::ParameterRequestList)
        else {
            panic!("no PRL");
        };
        let prl: Vec<u8> = prl.iter().map(|c| u8::from(*c)).collect();
        assert_eq!(prl, REQUESTED_OPTIONS);
    }

    #[test]
    fn release_and_decline_omit_forbidden_options() {
        for kind in [MessageKind::Release, MessageKind::Decline] {
            let b = build(&out(kind)).unwrap();
            let m = Message::decode(&mut Decoder::new(&b)).unwrap();
            assert!(!m.flags().broadcast());
            for code in [12u8, 55, 57] {
                assert!(
                    m.opts().get(OptionCode::from(code)).is_none(),
                    "{kind:?} {code}"
                );
            }
            assert!(m.opts().get(OptionCode::ServerIdentifier).is_some());
        }
    }
}
