//! rtnetlink: link lookup and address/route configuration.
