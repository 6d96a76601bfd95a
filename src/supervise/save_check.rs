//! Before a launch or a resume: the `--save` directory is writable, and the checkpoint
//! tracker it holds (`latest_checkpointed_iteration.txt`) names a checkpoint that is there.
//! Found here, an unwritable `--save` or a corrupt or dangling tracker stops the job with
//! one line before anything runs; found by the job, it would fail every attempt on every
//! node alike (the supervisor then tells it from a node's failure, see
//! [`super::decide::job_cause`], but only after a launch).

use std::time::Duration;

use crate::exec::{self, NodeCommand, Transport};
use crate::exit::ExitCode;
use crate::log::printable;

/// The POSIX `sh` check run in the job's working directory on a node: `$1` is the save
/// directory. Creates it when missing (as Megatron would), writes and removes a probe file
/// in it, then reads the tracker's first 64 bytes, when it is a regular file (a FIFO there
/// would block the read, and Megatron's resume after it). Prints one line: `ok none`,
/// `ok N`, `ok release`, `unwritable`, `notdir`, `notfile`, `corrupt TEXT`, `dangling DIR`.
pub const SAVE_CHECK_SCRIPT: &str = concat!(
    "d=$1; if [ -e \"$d\" ] && [ ! -d \"$d\" ]; then echo notdir; exit 0; fi; ",
    "mkdir -p -- \"$d\" 2>/dev/null || { echo unwritable; exit 0; }; ",
    "p=\"$d/.pipette-write-check.$$\"; ( : > \"$p\" ) 2>/dev/null || { echo unwritable; exit 0; }; ",
    "rm -f -- \"$p\"; t=\"$d/latest_checkpointed_iteration.txt\"; ",
    "[ -e \"$t\" ] || [ -L \"$t\" ] || { echo ok none; exit 0; }; ",
    "[ -f \"$t\" ] || { echo notfile; exit 0; }; ",
    "c=$(head -c 64 -- \"$t\" 2>/dev/null | tr -d ' \\t\\r\\n'); ",
    "case \"$c\" in release) if [ -d \"$d/release\" ]; then echo ok release; else echo dangling release; fi;; ",
    "''|*[!0-9]*) printf 'corrupt %s\\n' \"$c\";; ",
    "*) n=$(printf '%s' \"$c\" | sed 's/^0*//'); [ -n \"$n\" ] || n=0; ",
    "while [ ${#n} -lt 7 ]; do n=0$n; done; ",
    "if [ -d \"$d/iter_$n\" ]; then echo \"ok $c\"; else echo \"dangling iter_$n\"; fi;; esac"
);

/// What the check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SaveState {
    /// Writable; no tracker, or one naming a checkpoint that is there.
    Usable,
    /// Not a directory, or it cannot be created or written in.
    Unwritable { not_a_directory: bool },
    /// The tracker names no iteration (its first bytes, as read).
    Corrupt(String),
    /// The tracker is no regular file (a FIFO, a device, a directory, a dangling link).
    NotAFile,
    /// The tracker names a checkpoint directory that is not there.
    Dangling(String),
    /// The check's answer could not be read (the node did not answer): no evidence.
    Unknown,
}

/// Reads the check's line ([`SAVE_CHECK_SCRIPT`]).
pub fn parse(line: &str) -> SaveState {
    let line = line.trim();
    let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
    match word {
        "ok" => SaveState::Usable,
        "unwritable" => SaveState::Unwritable {
            not_a_directory: false,
        },
        "notdir" => SaveState::Unwritable {
            not_a_directory: true,
        },
        "corrupt" => SaveState::Corrupt(rest.to_string()),
        "notfile" => SaveState::NotAFile,
        "dangling" if !rest.is_empty() => SaveState::Dangling(rest.to_string()),
        _ => SaveState::Unknown,
    }
}

/// Why a job with this state must not run, in one line, and its exit code. `resumes`:
/// whether the attempt loads the checkpoint (a relaunch's resume, or `--load` naming the
/// save directory); a tracker that nothing reads is no reason to stop.
pub fn refusal(save: &str, state: &SaveState, resumes: bool) -> Option<(String, i32)> {
    let save = printable(save).into_owned();
    let tracker = "latest_checkpointed_iteration.txt";
    match state {
        SaveState::Usable | SaveState::Unknown => None,
        SaveState::Unwritable { not_a_directory } => Some((
            if *not_a_directory {
                format!("--save {save} is not a directory (point --save at a directory)")
            } else {
                format!(
                    "--save {save} cannot be written (check its permissions and free space, \
                     or point --save elsewhere)"
                )
            },
            ExitCode::CannotWrite.code(),
        )),
        SaveState::Corrupt(text) if resumes => Some((
            format!(
                "the checkpoint tracker {save}/{tracker} names no iteration (it holds '{}'); \
                 fix it to name the last whole checkpoint, or remove it to start afresh",
                printable(text)
            ),
            ExitCode::ModelArgs.code(),
        )),
        SaveState::Dangling(dir) if resumes => Some((
            format!(
                "the checkpoint tracker {save}/{tracker} names {}, which is not in {save}; \
                 fix it to name the last whole checkpoint, or remove it to start afresh",
                printable(dir)
            ),
            ExitCode::ModelArgs.code(),
        )),
        SaveState::NotAFile if resumes => Some((
            format!(
                "the checkpoint tracker {save}/{tracker} is not a regular file (a pipe, device, \
                 directory or dangling link, which the resume would wait on or fail to read); \
                 remove it to start afresh, or write the last whole checkpoint's iteration in it"
            ),
            ExitCode::ModelArgs.code(),
        )),
        SaveState::Corrupt(_) | SaveState::Dangling(_) | SaveState::NotAFile => None,
    }
}

/// Runs the check for `save` on `host`, in `workdir` (where the job's relative paths start).
pub fn check(
    transport: &Transport,
    host: &str,
    workdir: &std::path::Path,
    save: &str,
    timeout: Duration,
) -> SaveState {
    let command = NodeCommand::new("sh")
        .arg("-c")
        .arg(SAVE_CHECK_SCRIPT)
        .arg("pipette-save-check")
        .arg(save)
        .cwd(workdir);
    match exec::run(transport, host, &command, timeout) {
        Ok(out) if out.status.success() => parse(&out.stdout_text()),
        _ => SaveState::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(dir: &std::path::Path, save: &str) -> SaveState {
        check(
            &Transport::Local,
            "localhost",
            dir,
            save,
            Duration::from_secs(20),
        )
    }

    #[test]
    fn the_check_reads_what_the_save_directory_holds() {
        let dir = tempfile::tempdir().unwrap();
        // Missing: created, usable.
        assert_eq!(local(dir.path(), "ck"), SaveState::Usable);
        assert!(dir.path().join("ck").is_dir());
        let tracker = dir.path().join("ck/latest_checkpointed_iteration.txt");
        std::fs::write(&tracker, "8\n").unwrap();
        assert_eq!(
            local(dir.path(), "ck"),
            SaveState::Dangling("iter_0000008".into())
        );
        std::fs::create_dir(dir.path().join("ck/iter_0000008")).unwrap();
        assert_eq!(local(dir.path(), "ck"), SaveState::Usable);
        std::fs::write(&tracker, "garbage").unwrap();
        assert_eq!(
            local(dir.path(), "ck"),
            SaveState::Corrupt("garbage".into())
        );
        std::fs::write(&tracker, "").unwrap();
        assert_eq!(local(dir.path(), "ck"), SaveState::Corrupt(String::new()));
        std::fs::write(&tracker, "release").unwrap();
        assert_eq!(
            local(dir.path(), "ck"),
            SaveState::Dangling("release".into())
        );
        std::fs::write(dir.path().join("file"), "x").unwrap();
        assert_eq!(
            local(dir.path(), "file"),
            SaveState::Unwritable {
                not_a_directory: true
            }
        );
        assert_eq!(
            local(dir.path(), "file/below"),
            SaveState::Unwritable {
                not_a_directory: false
            }
        );
    }

    /// N10 (a variant): a tracker that is a FIFO was read with `head`, which waited for a
    /// writer until the check's timeout, and the resume then waited on it for ever; a link
    /// to /dev/zero was read as an empty tracker.
    #[test]
    fn n10_a_tracker_that_is_no_regular_file_is_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("ck")).unwrap();
        let tracker = dir.path().join("ck/latest_checkpointed_iteration.txt");
        nix::unistd::mkfifo(&tracker, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert_eq!(local(dir.path(), "ck"), SaveState::NotAFile);
        std::fs::remove_file(&tracker).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &tracker).unwrap();
        assert_eq!(local(dir.path(), "ck"), SaveState::NotAFile);
        std::fs::remove_file(&tracker).unwrap();
        std::os::unix::fs::symlink("/nonexistent/tracker", &tracker).unwrap();
        assert_eq!(local(dir.path(), "ck"), SaveState::NotAFile);
        let (line, code) = refusal("/ck", &SaveState::NotAFile, true).unwrap();
        assert_eq!(code, 65);
        assert!(line.contains("is not a regular file"), "{line}");
        assert_eq!(refusal("/ck", &SaveState::NotAFile, false), None);
    }

    #[test]
    fn only_what_the_job_would_trip_on_is_refused() {
        let unwritable = SaveState::Unwritable {
            not_a_directory: false,
        };
        let (line, code) = refusal("/ck", &unwritable, false).unwrap();
        assert_eq!(code, 74);
        assert!(line.contains("--save /ck cannot be written"), "{line}");
        let corrupt = SaveState::Corrupt("x\u{1b}y".into());
        assert_eq!(refusal("/ck", &corrupt, false), None);
        let (line, code) = refusal("/ck", &corrupt, true).unwrap();
        assert_eq!(code, 65);
        assert!(!line.contains('\u{1b}'), "{line}");
        assert!(line.contains("names no iteration"), "{line}");
        let (line, _) = refusal("/ck", &SaveState::Dangling("iter_0000008".into()), true).unwrap();
        assert!(
            line.contains("names iter_0000008, which is not in /ck"),
            "{line}"
        );
        assert_eq!(refusal("/ck", &SaveState::Usable, true), None);
        assert_eq!(refusal("/ck", &SaveState::Unknown, true), None);
        assert_eq!(parse("garbage"), SaveState::Unknown);
    }
}
