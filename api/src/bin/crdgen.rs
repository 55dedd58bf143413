//! Print the `ClusterUserDefinedNetwork` CRD manifest (with its "generated" header) on stdout.
//!
//! `cargo run -q -p xdhcp-api --bin crdgen > manifests/crd/clusteruserdefinednetworks.k8s.ovn.org.yaml`

use std::io::Write as _;
use std::process::ExitCode;

fn main() -> ExitCode {
    let yaml = match xdhcp_api::crd::crd_yaml() {
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
