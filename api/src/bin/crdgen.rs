//! Print a CRD manifest (with its "generated" header) on stdout: the
//! `ClusterUserDefinedNetwork`, or with the argument `guard` the `DhcpGuardPolicy`.
//!
//! `cargo run -q -p xdhcp-api --bin crdgen > manifests/crd/clusteruserdefinednetworks.k8s.ovn.org.yaml`
//! `cargo run -q -p xdhcp-api --bin crdgen -- guard > manifests/crd/dhcpguardpolicies.xdhcp.io.yaml`

use std::io::Write as _;
use std::process::ExitCode;

fn main() -> ExitCode {
    let which = std::env::args().nth(1);
    let yaml = match which.as_deref() {
        None => xdhcp_api::crd::crd_yaml(),
        Some("guard") => xdhcp_api::crd::guard_crd_yaml(),
        Some(other) => {
            let _ = writeln!(
                std::io::stderr(),
                "crdgen: unknown CRD {other:?} (none, or `guard`)"
            );
            return ExitCode::FAILURE;
        }
    };
    let yaml = match yaml {
        Ok(yaml) => yaml,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "crdgen: serialising the CRD: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(yaml.as_bytes()).and_then(|()| out.flush()) {
        let _ = writeln!(std::io::stderr(), "crdgen: writing stdout: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
