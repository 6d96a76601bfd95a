//! The one place render touches the disk: writing a [`LaunchSpec`]'s files into its run
//! directory.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{LaunchSpec, RenderError};

/// The default run directory: `WORKDIR/pipette-runs/<unix seconds>-<rendezvous id>`, one
/// per launch (characters other than letters, digits, `.`, `-`, `_` in the id become `_`).
pub fn default_run_dir(workdir: &Path, rdzv_id: &str, unix_seconds: u64) -> PathBuf {
    workdir
        .join("pipette-runs")
        .join(format!("{unix_seconds}-{}", file_name_safe(rdzv_id)))
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
    std::fs::create_dir_all(dir).map_err(|e| fail(dir, e.to_string()))?;
    for file in &spec.files {
        if file.path.contains('/') || file.path.starts_with('.') || file.path.is_empty() {
            return Err(fail(
                dir,
                format!("{:?} is not a plain file name (a bug)", file.path),
            ));
        }
        let path = dir.join(&file.path);
        let mode = if file.executable { 0o755 } else { 0o644 };
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
            .map_err(|e| {
                let hint = if e.kind() == std::io::ErrorKind::AlreadyExists {
                    " (it holds an earlier launch: choose another --run-dir, or remove it)"
                } else {
                    ""
                };
                fail(dir, format!("{}: {e}{hint}", file.path))
            })?;
        out.write_all(file.contents.as_bytes())
            .map_err(|e| fail(&path, e.to_string()))?;
        // The umask may have cleared bits the scripts need.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| fail(&path, e.to_string()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::RunFile;

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
        assert_eq!((mode("launch-0-a.sh"), mode("plan.json")), (0o755, 0o644));
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

    #[test]
    fn default_run_dirs_are_per_launch() {
        let d = default_run_dir(Path::new("/w"), "job/7 x", 1700000000);
        assert_eq!(d, Path::new("/w/pipette-runs/1700000000-job_7_x"));
    }
}
