//! What can go wrong running a command on a node, in words that say what to do.

use std::time::Duration;

use super::{Output, TransportKind};

/// A command could not be run on a node, or did not finish.
///
/// Messages are one line, name the host and say what to do. [`ExecError::is_unreachable`]
/// tells the failures that mean "the node cannot be reached" (exit code 68) from the rest.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// A host name that must not reach ssh or srun.
    #[error("host name {host:?} {problem} (check the node list)")]
    BadHost { host: String, problem: &'static str },
    /// A command that cannot be passed on faithfully.
    #[error("cannot run a command on {host}: {detail}")]
    BadCommand { host: String, detail: String },
    /// The local process (the command itself, `ssh` or `srun`) could not be started.
    #[error("cannot start {program} for {host}: {source} ({hint})")]
    Start {
        host: String,
        program: String,
        #[source]
        source: std::io::Error,
        hint: String,
    },
    /// ssh reported that it could not reach the host or log in.
    #[error("{} to {host} failed: {detail} ({hint})", .transport.as_str())]
    Unreachable {
        host: String,
        transport: TransportKind,
        detail: String,
        hint: String,
    },
    /// The command ran past its time limit and was stopped (its whole process tree).
    #[error("{command} on {host} did not finish within {} (stopped it; check the node, or allow more time)", format_duration(*.limit))]
    TimedOut {
        host: String,
        command: String,
        limit: Duration,
        /// What it wrote before it was stopped.
        output: Box<Output>,
    },
    /// pipette-run was told to stop (a stop signal, see [`super::signals`]); what ran was
    /// stopped.
    #[error("stopped by {} (nothing was left running)", super::signals::signal_name(*.signal))]
    Interrupted { signal: i32 },
    /// Waiting for or signalling a process we started failed.
    #[error("lost track of {command} on {host}: {detail} (this is a bug in pipette-run; please report it)")]
    Lost {
        host: String,
        command: String,
        detail: String,
    },
}

impl ExecError {
    /// Whether the node could not be reached at all (as opposed to a command that ran and
    /// failed, or a bad request).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, ExecError::Unreachable { .. })
    }

    /// The stop signal that ended what ran, when one did.
    pub fn interrupted_by(&self) -> Option<i32> {
        match self {
            ExecError::Interrupted { signal } => Some(*signal),
            _ => None,
        }
    }

    /// The host the error is about (none when pipette-run was stopped).
    pub fn host(&self) -> &str {
        match self {
            ExecError::Interrupted { .. } => "",
            ExecError::BadHost { host, .. }
            | ExecError::BadCommand { host, .. }
            | ExecError::Start { host, .. }
            | ExecError::Unreachable { host, .. }
            | ExecError::TimedOut { host, .. }
            | ExecError::Lost { host, .. } => host,
        }
    }
}

/// `3 s`, `1.5 s`, `250 ms`, `2 min 5 s`.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        let s = d.as_secs_f64();
        if ms % 1000 == 0 {
            format!("{} s", ms / 1000)
        } else {
            format!("{s:.1} s")
        }
    } else {
        let s = d.as_secs();
        if s % 60 == 0 {
            format!("{} min", s / 60)
        } else {
            format!("{} min {} s", s / 60, s % 60)
        }
    }
}

/// When `ssh` exits with 255 and its last words are its own, the host was not reached:
/// returns (what ssh said, what to do).
pub(super) fn ssh_failure(stderr: &[u8], host: &str) -> Option<(String, String)> {
    let text = String::from_utf8_lossy(stderr);
    let line = text.lines().rev().map(str::trim).find(|l| !l.is_empty())?;
    const SSH_SAYS: [&str; 12] = [
        "ssh: ",
        "Permission denied",
        "Host key verification failed",
        "kex_exchange_identification",
        "Connection closed by",
        "Connection reset by",
        "Connection timed out",
        "Connection to ",
        "Timeout, server",
        "client_loop:",
        "Bad owner or permissions",
        "banner exchange",
    ];
    if !SSH_SAYS.iter().any(|s| line.contains(s)) {
        return None;
    }
    let detail = match line.strip_prefix("ssh: connect to host ") {
        // "ssh: connect to host gpu07 port 22: Connection refused" → "Connection refused"
        Some(rest) => rest.rsplit(": ").next().unwrap_or(rest).to_owned(),
        None => line.strip_prefix("ssh: ").unwrap_or(line).to_owned(),
    };
    let lower = line.to_ascii_lowercase();
    let hint = if lower.contains("could not resolve") || lower.contains("name or service") {
        format!("check the host name {host:?}, and that it resolves on this machine")
    } else if lower.contains("permission denied") {
        "check that your ssh key is authorized there: pipette-run runs ssh in batch mode and cannot ask for a password".to_owned()
    } else if lower.contains("host key verification") {
        "the host is not in known_hosts or its key changed: ssh to it once by hand".to_owned()
    } else if lower.contains("timed out") || lower.contains("timeout") {
        "check that the host is up and reachable from here".to_owned()
    } else if lower.contains("bad owner") {
        "fix the permissions of your ssh configuration".to_owned()
    } else {
        "check that sshd runs there and the host name resolves".to_owned()
    };
    Some((detail, hint))
}

/// When the agent relay exits with 255 after a line of its own, the node's copy of
/// pipette-run could not be reached or was lost: returns (what the relay said, what to do).
pub(super) fn agent_failure(stderr: &[u8]) -> Option<(String, String)> {
    let text = String::from_utf8_lossy(stderr);
    let line = text.lines().rev().map(str::trim).find(|l| !l.is_empty())?;
    let detail = line.strip_prefix(super::agent::RELAY_SAYS)?;
    let hint =
        "check that the node's copy of pipette-run still runs; its own log says why it ended";
    Some((detail.to_owned(), hint.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(format_duration(Duration::from_millis(250)), "250 ms");
        assert_eq!(format_duration(Duration::from_secs(3)), "3 s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(format_duration(Duration::from_secs(125)), "2 min 5 s");
        assert_eq!(format_duration(Duration::from_secs(600)), "10 min");
    }

    #[test]
    fn ssh_errors_are_recognised_and_explained() {
        let (detail, hint) = ssh_failure(
            b"ssh: connect to host gpu07 port 22: Connection refused\n",
            "gpu07",
        )
        .unwrap();
        assert_eq!(detail, "Connection refused");
        assert!(hint.contains("sshd runs there"));
        let (detail, hint) = ssh_failure(
            b"ssh: Could not resolve hostname gpu99: Name or service not known\r\n",
            "gpu99",
        )
        .unwrap();
        assert_eq!(
            detail,
            "Could not resolve hostname gpu99: Name or service not known"
        );
        assert!(hint.contains("resolves"), "{hint}");
        let (_, hint) =
            ssh_failure(b"me@gpu07: Permission denied (publickey).\n", "gpu07").unwrap();
        assert!(hint.contains("batch mode"));
        assert!(ssh_failure(b"Traceback...\nValueError: x\n", "gpu07").is_none());
        assert!(ssh_failure(b"", "gpu07").is_none());
    }

    #[test]
    fn unreachable_message_names_the_host() {
        let err = ExecError::Unreachable {
            host: "gpu07".into(),
            transport: TransportKind::Ssh,
            detail: "Connection refused".into(),
            hint: "check that sshd runs there and the host name resolves".into(),
        };
        assert_eq!(
            err.to_string(),
            "ssh to gpu07 failed: Connection refused (check that sshd runs there and the host name resolves)"
        );
        assert!(err.is_unreachable());
    }
}
