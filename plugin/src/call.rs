//! One CNI call as the plugin reads it, in one step: the environment
//! (`CNI_COMMAND`, `CNI_CONTAINERID`, …) and, for every command but
//! VERSION, the network configuration on stdin, each validated field by
//! field, and the command checked against the configuration's version.

use crate::config::{self, NetworkConfig};
use crate::env::{CniEnv, Command, check_command_version};
use crate::types::CniError;

/// What the runtime asked for.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "read once per process and taken apart at once"
)]
pub enum CniCall {
    /// `VERSION`: needs no configuration.
    Version,
    /// Every other command, with its validated configuration.
    Invoke { env: CniEnv, config: NetworkConfig },
}

impl CniCall {
    /// Read the call from the environment (`lookup`) and stdin.
    pub fn read(lookup: impl Fn(&str) -> Option<String>, stdin: &[u8]) -> Result<Self, CniError> {
        let env = CniEnv::from_lookup(lookup)?;
        if env.command == Command::Version {
            return Ok(Self::Version);
        }
        let config = config::parse(stdin)?;
        check_command_version(env.command, &config.cni_version)?;
        Ok(Self::Invoke { env, config })
    }
}
