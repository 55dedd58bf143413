//! The short soak (`xdhcp_tests::soak`): 40 pods churned through the real
//! plugin against dnsmasq and Kea for 50 s while the seeded chaos schedule
//! kills and upgrades the agent, restarts and stops the servers past T2,
//! removes a pod's namespace, makes the stand-in API server fail, floods
//! forged replies and takes a pod's capture apart from outside (links
//! detached, tc filters and `clsact` deleted, the interface flapped); then
//! the invariant checker must find nothing.
//! The long one is `cargo xtask bench soak`.

mod agent_support;

use xdhcp_tests::soak::{self, SoakConfig};

#[test]
#[expect(
    clippy::print_stderr,
    reason = "the soak's report, shown with --nocapture"
)]
fn a_short_soak_under_chaos_breaks_no_invariant() {
    let mut cfg = SoakConfig::short(agent_support::xdhcp_bin(), agent_support::plugin_bin());
    if let Ok(seed) = std::env::var("XDHCP_SOAK_SEED") {
        cfg.seed = seed.parse().expect("XDHCP_SOAK_SEED: a number");
    }
    let report = soak::run(cfg);
    let md = report.markdown();
    eprintln!("{md}");
    assert!(report.counts.adds > 40, "the churn never got going:\n{md}");
    assert!(
        report.counts.faults.values().sum::<u64>() >= 5,
        "too few chaos steps ran:\n{md}"
    );
    assert!(report.counts.renewals > 0, "no lease was renewed:\n{md}");
    assert!(report.violations.is_empty(), "invariants broken:\n{md}");
}
