//! `BPF_PROG_TEST_RUN` on the loaded programs, for the kernel-path tests and
//! `bench_xdp` only: built with the `test-hooks` feature, which also puts
//! the do-nothing XDP baseline into the eBPF object. The product carries
//! neither.

use std::time::Duration;

use aya::programs::{SchedClassifier, TestRun as _, TestRunOptions, Xdp};
use xdhcp_common as common;

use super::{Datapath, EbpfDatapathError, Result, prog};

/// The programs in the object, for [`Datapath::test_run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgramKind {
    /// The XDP capture program.
    Xdp,
    /// The TC (clsact ingress) capture program.
    Tc,
    /// The do-nothing XDP baseline.
    XdpPass,
    /// The uplink XDP program.
    UplinkXdp,
    /// The uplink TC program.
    UplinkTc,
}

impl ProgramKind {
    const fn name(self) -> &'static str {
        match self {
            Self::Xdp => common::PROG_XDP,
            Self::Tc => common::PROG_TC,
            Self::XdpPass => common::PROG_XDP_PASS,
            Self::UplinkXdp => common::PROG_UPLINK_XDP,
            Self::UplinkTc => common::PROG_UPLINK_TC,
        }
    }
}

/// Result of one `BPF_PROG_TEST_RUN`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestRunOutcome {
    /// The program's return value (XDP action or TC action as `u32`).
    pub retval: u32,
    /// Average time per repetition, as measured by the kernel.
    pub duration: Duration,
}

impl Datapath {
    /// Runs a program once per repetition on `data` with `BPF_PROG_TEST_RUN`
    /// (the ingress ifindex is the loopback device of the caller's namespace).
    pub fn test_run(
        &mut self,
        kind: ProgramKind,
        data: &[u8],
        repeat: u32,
    ) -> Result<TestRunOutcome> {
        self.test_run_ctx(kind, data, repeat, None)
    }

    /// Like [`Datapath::test_run`], as if the frame arrived on `ifindex`
    /// (rx queue 0), a device of the caller's namespace.
    pub fn test_run_on(
        &mut self,
        kind: ProgramKind,
        data: &[u8],
        repeat: u32,
        ifindex: u32,
    ) -> Result<TestRunOutcome> {
        let mut ctx = Vec::with_capacity(44);
        match kind {
            // struct xdp_md { data, data_end, data_meta, ingress_ifindex,
            // rx_queue_index, egress_ifindex }
            ProgramKind::Xdp | ProgramKind::XdpPass | ProgramKind::UplinkXdp => {
                let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
                for v in [0, len, 0, ifindex, 0, 0] {
                    ctx.extend_from_slice(&v.to_ne_bytes());
                }
            }
            // struct __sk_buff up to `ifindex` (offset 40); the kernel
            // zero-fills the rest.
            ProgramKind::Tc | ProgramKind::UplinkTc => {
                ctx.resize(40, 0);
                ctx.extend_from_slice(&ifindex.to_ne_bytes());
            }
        }
        self.test_run_ctx(kind, data, repeat, Some(&ctx))
    }

    fn test_run_ctx(
        &mut self,
        kind: ProgramKind,
        data: &[u8],
        repeat: u32,
        ctx_in: Option<&[u8]>,
    ) -> Result<TestRunOutcome> {
        let name = kind.name();
        let opts = TestRunOptions {
            data_in: Some(data),
            ctx_in,
            repeat,
            ..TestRunOptions::default()
        };
        let res = match kind {
            ProgramKind::Tc | ProgramKind::UplinkTc => {
                prog::<SchedClassifier>(&mut self.ebpf, name)?.test_run(opts)
            }
            ProgramKind::Xdp | ProgramKind::XdpPass | ProgramKind::UplinkXdp => {
                if let Some(reason) = &self.xdp_unavailable {
                    return Err(EbpfDatapathError::XdpUnavailable {
                        reason: reason.clone(),
                    });
                }
                prog::<Xdp>(&mut self.ebpf, name)?.test_run(opts)
            }
        }
        .map_err(|source| EbpfDatapathError::TestRun { name, source })?;
        Ok(TestRunOutcome {
            retval: res.return_value,
            duration: res.duration,
        })
    }
}
