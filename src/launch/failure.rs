//! What a node's end means: one home for classifying how a command of a job (the
//! supervised attempt's torchrun, or a trial's) ended — could not start, lost, ended by a
//! signal (the exit code is [`exit::signal`]'s), or exited with torchrun's report naming
//! the worker that failed first — so that the supervisor and the trial read it alike.

use serde::Serialize;

use super::output_lines::{last_exception_line, torchrun_root_cause};
use crate::exec::group::{End, NodeEnd};
use crate::exec::{ExecError, Status};
use crate::exit::{self, ExitCode};

/// Why a node failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureReason {
    /// Its torchrun exited with a non-zero code (a worker failed).
    Exited,
    /// Its torchrun was ended by a signal (killed, or the node lost it).
    Signal,
    /// Its command could not be started.
    StartFailed,
    /// The transport's connection to it died.
    ConnectionLost,
}

/// A node's failure, as seen by the supervisor.
#[derive(Debug, Clone, Serialize)]
pub struct NodeFailure {
    pub host: String,
    pub node_rank: u64,
    pub reason: FailureReason,
    /// How its command ended, in words (`exit code 1`, `signal 9 (SIGKILL)`).
    pub status: Option<String>,
    /// The failing worker's exit code (from torchrun's failure report when it has one),
    /// 128 + N for a signal, 68 for an unreachable node, 127 for a command that could not
    /// start.
    pub exit_code: i32,
    /// The global rank of the worker that failed first, when torchrun said.
    pub worker_rank: Option<u64>,
    pub detail: String,
}

impl NodeFailure {
    /// The failure in one line: the host, its node rank, what ended.
    pub fn describe(&self) -> String {
        let what = match self.reason {
            FailureReason::Exited => format!(
                "torchrun exited with {}{}",
                self.status.as_deref().unwrap_or("an error"),
                self.worker_rank
                    .map(|r| format!(" (worker rank {r} exited with {})", self.exit_code))
                    .unwrap_or_default()
            ),
            FailureReason::Signal => format!(
                "torchrun was ended by {}",
                self.status.as_deref().unwrap_or("a signal")
            ),
            FailureReason::StartFailed => format!("could not start: {}", self.detail),
            FailureReason::ConnectionLost => format!("connection lost: {}", self.detail),
        };
        format!("{} (node rank {}): {what}", self.host, self.node_rank)
    }
}

impl NodeFailure {
    /// What `end`, a node's command that did not succeed, says about its failure.
    pub fn of(end: &NodeEnd) -> NodeFailure {
        let mut failure = NodeFailure {
            host: end.host.clone(),
            node_rank: end.node as u64,
            reason: FailureReason::Exited,
            status: None,
            exit_code: ExitCode::Internal.code(),
            worker_rank: None,
            detail: String::new(),
        };
        let (status, output) = match &end.end {
            End::NotStarted(e) => {
                (failure.reason, failure.exit_code) = if e.is_unreachable() {
                    (FailureReason::ConnectionLost, ExitCode::Unreachable.code())
                } else {
                    (FailureReason::StartFailed, ExitCode::CannotStart.code())
                };
                failure.detail = e.to_string();
                return failure;
            }
            End::Lost(e) => {
                failure.detail = e.to_string();
                return failure;
            }
            End::Exited { status, output } => (*status, output),
        };
        failure.status = Some(status.to_string());
        failure.exit_code = status.code().unwrap_or(1);
        let output = match output {
            Ok(output) => output,
            Err(e @ ExecError::Unreachable { .. }) => {
                failure.reason = FailureReason::ConnectionLost;
                failure.exit_code = ExitCode::Unreachable.code();
                failure.detail = e.to_string();
                return failure;
            }
            Err(e) => {
                failure.detail = e.to_string();
                return failure;
            }
        };
        // The worker's own error (its last Python exception before torchrun's report), not
        // torchrun's banner line, which was always the detail.
        let text = format!("{}\n{}", output.stdout_text(), output.stderr_text());
        failure.detail = last_exception_line(&text)
            .or_else(|| output.last_line())
            .unwrap_or_default();
        match status {
            Status::Signaled(signal) => {
                failure.reason = FailureReason::Signal;
                failure.exit_code = exit::signal(signal);
            }
            // The remote wrapper reports a launcher ended by a signal as 128 + N.
            Status::Exited(code) if end.remote && exit::is_signal(code) => {
                failure.reason = FailureReason::Signal;
                failure.exit_code = code;
            }
            Status::Exited(code) => {
                let text = format!("{}{}", output.stderr_text(), output.stdout_text());
                match torchrun_root_cause(&text) {
                    Some((rank, worker_code)) => {
                        failure.worker_rank = rank;
                        failure.exit_code = worker_code;
                    }
                    None => failure.exit_code = code,
                }
            }
        }
        failure
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{Output, TransportKind};

    fn exited(status: Status, remote: bool, stdout: &str, stderr: &str) -> NodeEnd {
        NodeEnd {
            node: 1,
            host: "node-b".into(),
            remote,
            end: End::Exited {
                status,
                output: Ok(Output {
                    status,
                    stdout: stdout.into(),
                    stderr: stderr.into(),
                }),
            },
        }
    }

    #[test]
    fn a_node_s_end_is_classified_once_for_the_job_and_the_trial() {
        let report = "ValueError: bad batch\nRoot Cause (first observed failure):\n[0]:\n  \
                      rank      : 3 (local_rank: 1)\n  exitcode  : 7 (pid: 1)\n";
        let f = NodeFailure::of(&exited(Status::Exited(1), false, "", report));
        assert_eq!(
            (f.reason, f.exit_code, f.worker_rank),
            (FailureReason::Exited, 7, Some(3))
        );
        assert_eq!(
            (f.node_rank, f.detail.as_str()),
            (1, "ValueError: bad batch")
        );
        assert_eq!(f.status.as_deref(), Some("exit code 1"));
        // A signal is exit::signal's code, here and on a remote node's wrapper.
        let f = NodeFailure::of(&exited(Status::Signaled(9), false, "bye\n", ""));
        assert_eq!(
            (f.reason, f.exit_code, f.detail.as_str()),
            (FailureReason::Signal, 137, "bye")
        );
        let f = NodeFailure::of(&exited(Status::Exited(143), true, "", ""));
        assert_eq!((f.reason, f.exit_code), (FailureReason::Signal, 143));
        let f = NodeFailure::of(&exited(Status::Exited(143), false, "", ""));
        assert_eq!((f.reason, f.exit_code), (FailureReason::Exited, 143));
        // What never ran, or was lost, or lost its connection.
        let lost = || ExecError::Lost {
            host: "node-b".into(),
            command: "`torchrun`".into(),
            detail: "gone".into(),
        };
        let unreachable = || ExecError::Unreachable {
            host: "node-b".into(),
            transport: TransportKind::Ssh,
            detail: "no route".into(),
            hint: "check it".into(),
        };
        let end = |end: End| NodeEnd {
            node: 0,
            host: "node-a".into(),
            remote: true,
            end,
        };
        let f = NodeFailure::of(&end(End::NotStarted(lost())));
        assert_eq!((f.reason, f.exit_code), (FailureReason::StartFailed, 127));
        let f = NodeFailure::of(&end(End::NotStarted(unreachable())));
        assert_eq!((f.reason, f.exit_code), (FailureReason::ConnectionLost, 68));
        let f = NodeFailure::of(&end(End::Lost(lost())));
        assert_eq!(
            (f.reason, f.exit_code, f.status),
            (FailureReason::Exited, 70, None)
        );
        let f = NodeFailure::of(&end(End::Exited {
            status: Status::Exited(255),
            output: Err(unreachable()),
        }));
        assert_eq!((f.reason, f.exit_code), (FailureReason::ConnectionLost, 68));
        assert_eq!(f.status.as_deref(), Some("exit code 255"));
    }
}
