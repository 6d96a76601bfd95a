//! The user's checkpoints as a node sees them: whether the save directory holds one and at
//! which iteration ([`read_checkpoint`], through the exec seam). What to do with it after a
//! failure (resume, keep tp × pp, reshard) is the supervisor's decision, not launch's.

use std::time::Duration;

use crate::exec::{self, NodeCommand, Transport};

/// What the save directory holds, as read on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointState {
    /// No `latest_checkpointed_iteration.txt`: nothing saved yet.
    None,
    /// The last checkpoint's iteration.
    At(u64),
    /// There is a tracker file, but it names no iteration (a `release` checkpoint), or it
    /// could not be read: assume a checkpoint exists.
    Unknown,
}

impl CheckpointState {
    pub fn exists(self) -> bool {
        self != CheckpointState::None
    }

    pub fn iteration(self) -> Option<u64> {
        match self {
            CheckpointState::At(i) => Some(i),
            _ => None,
        }
    }
}

/// Reads `SAVE/latest_checkpointed_iteration.txt` on `host` (in `workdir`, where the job's
/// relative paths start), as Megatron writes it.
pub fn read_checkpoint(
    transport: &Transport,
    host: &str,
    workdir: &std::path::Path,
    save: &str,
    timeout: Duration,
) -> CheckpointState {
    let tracker = format!(
        "{}/latest_checkpointed_iteration.txt",
        save.trim_end_matches('/')
    );
    let command = NodeCommand::new("sh")
        .arg("-c")
        .arg("if [ -e \"$1\" ]; then cat -- \"$1\" || echo unreadable; else echo none; fi")
        .arg("pipette-checkpoint")
        .arg(tracker)
        .cwd(workdir);
    match exec::run(transport, host, &command, timeout) {
        Ok(out) if out.status.success() => match out.stdout_text().trim() {
            "none" => CheckpointState::None,
            text => text
                .parse()
                .map_or(CheckpointState::Unknown, CheckpointState::At),
        },
        _ => CheckpointState::Unknown,
    }
}
