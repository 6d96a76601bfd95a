//! The cluster profile file: nodes, GPUs, measured links, and where each figure came from.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterProfile {}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("placeholder")]
    Placeholder,
}
