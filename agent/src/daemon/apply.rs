//! `"apply": true`: configure the leased address and routes on the pod
//! interface, check them (CHECK), and take them away (DEL, lease lost).
//!
//! Runs iproute2 inside the namespace (`nsenter --net=<path> ip …`): a
//! handful of commands per lease change, off the DHCP fast path (apply is
//! opt-in; without it the main plugin configures the CNI result).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use tokio::process::Command;
use xdhcp_engine::Lease;

/// A configuration command failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("running `{cmd}` in {}: {source}", netns.display())]
    Spawn {
        cmd: String,
        netns: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{cmd}` in {} failed: {stderr}", netns.display())]
    Failed {
        cmd: String,
        netns: PathBuf,
        stderr: String,
    },
}

async fn ip(netns: &Path, args: &[String]) -> Result<String, ApplyError> {
    let cmd = format!("ip {}", args.join(" "));
    let out = Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .arg("ip")
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|source| ApplyError::Spawn {
            cmd: cmd.clone(),
            netns: netns.to_path_buf(),
            source,
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(ApplyError::Failed {
            cmd,
            netns: netns.to_path_buf(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

#[expect(
    clippy::needless_pass_by_value,
    reason = "takes owned temporaries so argument lists read as plain values"
)]
fn s(x: impl ToString) -> String {
    x.to_string()
}

/// Configure `lease` on `ifname`: address (with the lease lifetime as
/// `valid_lft` is deliberately not used — the agent owns expiry), link up,
/// option-121 routes, default route via option 3.
pub async fn configure(
    netns: &Path,
    ifname: &str,
    lease: &Lease,
    metric: Option<u32>,
) -> Result<(), ApplyError> {
    let addr = format!("{}/{}", lease.address, lease.prefix_len);
    ip(netns, &[s("link"), s("set"), s(ifname), s("up")]).await?;
    ip(
        netns,
        &[s("-4"), s("addr"), s("replace"), addr, s("dev"), s(ifname)],
    )
    .await?;
    if let Some(mtu) = lease.mtu.filter(|m| *m >= 576) {
        ip(netns, &[s("link"), s("set"), s(ifname), s("mtu"), s(mtu)]).await?;
    }
    for (dst, gw) in routes(lease) {
        let mut args = vec![s("-4"), s("route"), s("replace"), dst];
        if gw.is_unspecified() {
            args.extend([s("dev"), s(ifname), s("scope"), s("link")]);
        } else {
            args.extend([s("via"), s(gw), s("dev"), s(ifname)]);
        }
        if let Some(m) = metric {
            args.extend([s("metric"), s(m)]);
        }
        ip(netns, &args).await?;
    }
    Ok(())
}

/// Routes as `(dst/len, gateway)`; option 121 wins over option 3 (the engine
/// already leaves `routers` empty when 121 was present).
pub fn routes(lease: &Lease) -> Vec<(String, Ipv4Addr)> {
    let mut out: Vec<(String, Ipv4Addr)> = lease
        .routes
        .iter()
        .map(|r| (format!("{}/{}", r.dest, r.prefix_len), r.gateway))
        .collect();
    if lease.routes.is_empty()
        && let Some(gw) = lease.routers.first()
    {
        out.push(("0.0.0.0/0".to_owned(), *gw));
    }
    out
}

/// Whether `ifname` carries `address/prefix_len`.
pub async fn has_address(
    netns: &Path,
    ifname: &str,
    address: Ipv4Addr,
    prefix_len: u8,
) -> Result<bool, ApplyError> {
    let out = ip(
        netns,
        &[s("-4"), s("-o"), s("addr"), s("show"), s("dev"), s(ifname)],
    )
    .await?;
    let want = format!("inet {address}/{prefix_len} ");
    Ok(out.lines().any(|l| l.contains(&want)))
}

/// Remove the leased address (its routes go with it). Missing is fine.
pub async fn deconfigure(netns: &Path, ifname: &str, lease: &Lease) -> Result<(), ApplyError> {
    let addr = format!("{}/{}", lease.address, lease.prefix_len);
    match ip(
        netns,
        &[s("-4"), s("addr"), s("del"), addr, s("dev"), s(ifname)],
    )
    .await
    {
        Ok(_) => Ok(()),
        Err(ApplyError::Failed { stderr, .. })
            if stderr.contains("Cannot assign") || stderr.contains("Cannot find device") =>
        {
            Ok(())
        }
        Err(e) => Err(e),
    }
}
