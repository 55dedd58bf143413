//! Sans-IO DHCPv4 client engine (RFC 2131).
