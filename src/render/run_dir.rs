//! The one place render touches the disk: writing a [`LaunchSpec`]'s files into its run
//! directory.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{LaunchSpec, RenderError};

/// The default run directory: `WORKDIR/pipette-runs/<local date-time>-<id>`, e.g.
/// `pipette-runs/2026-11-24T10-31-05-981` (`id`: the scheduler's job id, else this
/// process's id; characters other than letters, digits, `.`, `-`, `_` become `_`). Names
/// sort by time and say when and which job; [`claim_run_dir`] numbers a second launch in
/// the same second.
/// `time` is on the local clock (no zone in the name: `:` and `+` would need quoting).
pub fn default_run_dir(workdir: &Path, id: &str, time: jiff::civil::DateTime) -> PathBuf {
    workdir.join("pipette-runs").join(format!(
        "{}-{}",
        time.strftime("%Y-%m-%dT%H-%M-%S"),
        file_name_safe(id)
    ))
}

/// How many numbered alternatives (`DIR-2`, `DIR-3`, ...) [`claim_run_dir`] tries for a
/// default directory before giving up: more launches of one job in one second than this
/// is not a clash but a loop.
const NUMBERED_TRIES: u32 = 1000;

/// Refuses a `--run-dir` that already exists, before anything runs: each launch writes
/// into a directory of its own, and a dry run's directory holds its files.
pub fn refuse_existing_run_dir(dir: &Path) -> Result<(), RenderError> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        // `afile/run` was said to "already exist".
        Err(e) => Err(io_failure(dir, e)),
        Ok(_) => Err(RenderError::RunDir {
            path: dir.display().to_string(),
            message: "it already exists (each launch, and each dry run, writes a new \
                      directory): remove it, or choose another --run-dir"
                .to_string(),
        }),
    }
}

/// `e` on `path` as the error it is: a path the user chose that cannot be a directory
/// (a file on its way) is theirs to fix (exit 2); a full or read-only disk or a missing
/// permission is the file system's ([`RenderError::RunDirWrite`], exit 74).
fn io_failure(path: &Path, e: std::io::Error) -> RenderError {
    use std::io::ErrorKind;
    let path_text = path.display().to_string();
    // `mkdir -p` over a file says EEXIST.
    let a_file = e.kind() == ErrorKind::NotADirectory
        || (e.kind() == ErrorKind::AlreadyExists && path.exists() && !path.is_dir());
    if a_file {
        return RenderError::RunDir {
            path: path_text,
            message: "a part of its path is a file, not a directory: choose another --run-dir"
                .to_string(),
        };
    }
    match e.kind() {
        ErrorKind::AlreadyExists => RenderError::RunDir {
            path: path_text,
            message: format!("{e}: choose another --run-dir"),
        },
        _ => RenderError::RunDirWrite {
            path: path_text,
            message: e.to_string(),
        },
    }
}

/// Makes `dir` (and its parents) for this launch alone and returns it. An existing `dir`
/// is refused, unless `numbered` (a default directory, whose name only says when): then
/// the first free `dir-2`, `dir-3`, ... is taken. `mkdir` is atomic, so two launches that
/// race for one name never share it.
pub fn claim_run_dir(dir: &Path, numbered: bool) -> Result<PathBuf, RenderError> {
    let fail = |path: &Path, message: String| RenderError::RunDir {
        path: path.display().to_string(),
        message,
    };
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io_failure(parent, e))?;
    }
    let tries = if numbered { NUMBERED_TRIES } else { 1 };
    for n in 1..=tries {
        let candidate = match n {
            1 => dir.to_path_buf(),
            n => {
                let mut name = dir.as_os_str().to_os_string();
                name.push(format!("-{n}"));
                PathBuf::from(name)
            }
        };
        // The owner's alone: it holds the job's scripts and logs, often on a shared file
        // system.
        match std::fs::DirBuilder::new().mode(0o700).create(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_failure(&candidate, e)),
        }
    }
    match numbered {
        false => Err(refuse_existing_run_dir(dir).err().unwrap_or_else(|| {
            fail(dir, "it appeared while being created: choose another --run-dir".to_string())
        })),
        true => Err(fail(
            dir,
            format!("it and {} numbered alternatives exist (clear out pipette-runs/, or give --run-dir)", NUMBERED_TRIES - 1),
        )),
    }
}

/// `text` as part of a file name: its first 64 characters, letters, digits, `.`, `-` and
/// `_` kept and any other written `_`, without leading dots (no hidden files, no `..`).
/// May be empty.
pub(super) fn file_name_safe(text: &str) -> String {
    let part: String = text
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    part.trim_start_matches('.').to_string()
}

/// Writes every file of `spec` into `dir` (created with its parents), launch scripts
/// executable. Refuses to replace a file that is already there: one directory per launch.
pub fn write_run_dir(spec: &LaunchSpec, dir: &Path) -> Result<(), RenderError> {
    let fail = |path: &Path, message: String| RenderError::RunDir {
        path: path.display().to_string(),
        message,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| io_failure(dir, e))?;
    for file in &spec.files {
        if file.path.contains('/') || file.path.starts_with('.') || file.path.is_empty() {
            return Err(fail(
                dir,
                format!("{:?} is not a plain file name (a bug)", file.path),
            ));
        }
        let path = dir.join(&file.path);
        let mode = if file.executable { 0o700 } else { 0o644 };
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => fail(
                    dir,
                    format!(
                        "{}: {e} (it holds an earlier launch: choose another --run-dir, or remove it)",
                        file.path
                    ),
                ),
                _ => io_failure(&path, e),
            })?;
        out.write_all(file.contents.as_bytes())
            .map_err(|e| io_failure(&path, e))?;
        // The umask may have cleared bits the scripts need.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| io_failure(&path, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::RunFile;

    /// N15: a full or read-only disk exited 2, as if the command line were wrong; a file
    /// on the run directory's path was said to "already exist".
    #[test]
    fn n15_the_file_system_s_refusals_are_told_apart_from_the_user_s() {
        use std::io::{Error, ErrorKind};
        for kind in [
            ErrorKind::StorageFull,
            ErrorKind::ReadOnlyFilesystem,
            ErrorKind::PermissionDenied,
        ] {
            let e = io_failure(Path::new("/r"), Error::from(kind));
            assert!(
                matches!(e, RenderError::RunDirWrite { .. }),
                "{kind:?}: {e}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("afile");
        std::fs::write(&file, "").unwrap();
        let e = claim_run_dir(&file.join("run"), false).unwrap_err();
        assert!(e.to_string().contains("is a file, not a directory"), "{e}");
        let e = refuse_existing_run_dir(&file.join("run")).unwrap_err();
        assert!(e.to_string().contains("is a file, not a directory"), "{e}");
    }

    fn spec(files: Vec<RunFile>) -> LaunchSpec {
        LaunchSpec {
            megatron_args: vec![],
            nodes: vec![],
            master_addr: "a".into(),
            master_port: 1,
            rdzv_id: "1".into(),
            nproc_per_node: 1,
            world_size: 1,
            deepspeed: false,
            notes: vec![],
            workdir: String::new(),
            run_dir: String::new(),
            files,
        }
    }

    #[test]
    fn writes_files_once_with_modes() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("runs/1");
        let s = spec(vec![
            RunFile {
                path: "launch-0-a.sh".into(),
                contents: "#!/bin/sh\n".into(),
                executable: true,
            },
            RunFile {
                path: "plan.json".into(),
                contents: "{}\n".into(),
                executable: false,
            },
        ]);
        write_run_dir(&s, &run).unwrap();
        let mode = |p: &str| std::fs::metadata(run.join(p)).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode("launch-0-a.sh"), mode("plan.json")), (0o700, 0o644));
        assert_eq!(
            std::fs::read_to_string(run.join("plan.json")).unwrap(),
            "{}\n"
        );
        let again = write_run_dir(&s, &run).unwrap_err().to_string();
        assert!(again.contains("--run-dir"), "{again}");
        let bad = spec(vec![RunFile {
            path: "../x".into(),
            contents: String::new(),
            executable: false,
        }]);
        assert!(write_run_dir(&bad, &run).is_err());
    }

    const NOON: jiff::civil::DateTime = jiff::civil::datetime(2026, 11, 24, 10, 3, 5, 0);

    #[test]
    fn default_run_dirs_are_per_launch() {
        let d = default_run_dir(Path::new("/w"), "job/7 x", NOON);
        assert_eq!(d, Path::new("/w/pipette-runs/2026-11-24T10-03-05-job_7_x"));
    }

    /// Two launches in one second got one default directory, and the second failed
    /// with "choose another --run-dir", a flag it was never given.
    #[test]
    fn defect_07_default_run_dirs_never_collide() {
        let dir = tempfile::tempdir().unwrap();
        let name = default_run_dir(dir.path(), "981", NOON);
        let first = claim_run_dir(&name, true).unwrap();
        let second = claim_run_dir(&name, true).unwrap();
        let third = claim_run_dir(&name, true).unwrap();
        assert_eq!(first, name);
        assert_eq!(second.file_name().unwrap(), "2026-11-24T10-03-05-981-2");
        assert!(third.to_string_lossy().ends_with("-981-3"));
        assert!(first.is_dir() && second.is_dir() && third.is_dir());
    }

    /// `--run-dir` accepted an existing directory and wrote into it until a file clashed.
    #[test]
    fn defect_08_an_existing_run_dir_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let given = dir.path().join("run");
        assert!(refuse_existing_run_dir(&given).is_ok());
        std::fs::create_dir(&given).unwrap();
        std::fs::write(given.join("mine.txt"), "x").unwrap();
        let refused = refuse_existing_run_dir(&given).unwrap_err().to_string();
        assert!(refused.contains("already exists"), "{refused}");
        assert!(refused.contains("choose another --run-dir"), "{refused}");
        let claimed = claim_run_dir(&given, false).unwrap_err().to_string();
        assert_eq!(claimed, refused);
        let left: Vec<_> = std::fs::read_dir(&given).unwrap().collect();
        assert_eq!(left.len(), 1);
        // A fresh one is made with its parents.
        let fresh = dir.path().join("a/b/run");
        assert_eq!(claim_run_dir(&fresh, false).unwrap(), fresh);
    }
}
