//! Megatron's argument vocabulary: reads the arguments after SCRIPT into [`Settings`].

use super::Settings;

#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    #[error("placeholder")]
    Placeholder,
}

/// Reads Megatron arguments (everything after SCRIPT).
pub fn settings_from_megatron_args(_args: &[String]) -> Result<Settings, ArgsError> {
    Err(ArgsError::Placeholder)
}
