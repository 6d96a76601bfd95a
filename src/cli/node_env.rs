//! The environment every node's torchrun gets, in order of precedence (later wins):
//!
//! 1. the variables forwarded from this process by default ([`render::forwarded_env`]: the
//!    venv's and conda's, the CUDA allocator's, NCCL's, Hugging Face's, W&B's, ...);
//! 2. the env files: `--env-file FILE` (or `PIPETTE_ENV_FILE`), else whichever of
//!    `~/.deepspeed_env`, `./.deepspeed_env` (DeepSpeed's own, named by `DS_ENV_FILE` as
//!    DeepSpeed names it), `~/.pipette_env`, `./.pipette_env` exist, in that order;
//! 3. `--env NAME=VALUE`, and `--env NAME` for this process's value.
//!
//! An env file is DeepSpeed's `.deepspeed_env` format: one `NAME=VALUE` per line, the value
//! everything after the first `=` taken literally (no quotes removed, nothing expanded);
//! blank lines and lines starting with `#` are skipped (DeepSpeed would refuse them). Every
//! value reaches the node byte for byte: the exec seam quotes it ([`crate::exec`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::ResolveError;
use crate::cli::NodeOptions;
use crate::cluster::Environment;
use crate::exec::is_env_name;
use crate::render;

/// What the command line asked for the nodes' environment.
#[derive(Debug, Clone, Default)]
pub struct EnvRequest {
    /// `--env`, in order.
    pub assignments: Vec<(String, Option<String>)>,
    /// `--env-file`.
    pub file: Option<PathBuf>,
}

impl EnvRequest {
    pub fn new(options: &NodeOptions) -> EnvRequest {
        EnvRequest {
            assignments: options.env.clone(),
            file: options.env_file.clone(),
        }
    }
}

/// The nodes' environment for `request` (see the module doc), and the env files read.
/// `home` and `cwd` are where the default files are looked for.
pub fn node_env(
    env: &Environment,
    request: &EnvRequest,
    home: Option<&Path>,
    cwd: &Path,
) -> Result<(BTreeMap<String, String>, Vec<PathBuf>), ResolveError> {
    let mut vars = render::forwarded_env(env.iter().map(|(k, v)| (k.clone(), v.clone())));
    let files = match &request.file {
        Some(file) => vec![file.clone()],
        None => default_files(env, home, cwd)
            .into_iter()
            .filter(|f| f.is_file())
            .collect(),
    };
    for file in &files {
        let text = crate::input_file::read_to_string(file).map_err(|e| {
            ResolveError::Usage(format!(
                "cannot read the env file {}: {e} (give a readable file of NAME=VALUE lines to --env-file)",
                file.display()
            ))
        })?;
        vars.extend(parse_env_file(&text, file)?);
    }
    for (name, value) in &request.assignments {
        let value = match value {
            Some(value) => value.clone(),
            None => env.get(name).cloned().ok_or_else(|| {
                ResolveError::Usage(format!(
                    "--env {name}: {name} is not set here (give --env {name}=VALUE)"
                ))
            })?,
        };
        vars.insert(name.clone(), value);
    }
    Ok((vars, files))
}

/// The nodes' environment for `request` (see the module doc), found from the working
/// directory and `HOME`; says on stderr which env files it read.
pub fn announced_node_env(
    env: &Environment,
    request: &EnvRequest,
) -> Result<BTreeMap<String, String>, ResolveError> {
    let home = env.get("HOME").map(PathBuf::from);
    let cwd = std::env::current_dir()
        .map_err(|e| ResolveError::Internal(format!("cannot read the working directory: {e}")))?;
    let (vars, files) = node_env(env, request, home.as_deref(), &cwd)?;
    if !files.is_empty() {
        let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        crate::log::log(
            crate::log::Level::Info,
            "pipette",
            &format!("environment for the nodes also from {}", names.join(", ")),
        );
    }
    Ok(vars)
}

/// The default env files, lowest precedence first (see the module doc).
fn default_files(env: &Environment, home: Option<&Path>, cwd: &Path) -> Vec<PathBuf> {
    let deepspeed = env
        .get("DS_ENV_FILE")
        .map_or(".deepspeed_env", String::as_str);
    let mut files = Vec::new();
    for name in [deepspeed, ".pipette_env"] {
        files.extend(home.map(|h| h.join(name)));
        files.push(cwd.join(name));
    }
    files
}

/// The `NAME=VALUE` lines of an env file (see the module doc); `path` names it in errors.
pub fn parse_env_file(text: &str, path: &Path) -> Result<Vec<(String, String)>, ResolveError> {
    let mut vars = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        let bad = |what: String| {
            ResolveError::Usage(format!(
                "env file {}, line {}: {what} (write NAME=VALUE, one a line)",
                path.display(),
                n + 1
            ))
        };
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            return Err(bad(format!("{:?} has no =", line)));
        };
        let name = name.trim();
        if !is_env_name(name) {
            return Err(bad(format!(
                "{name:?} is not an environment variable name (letters, digits and _)"
            )));
        }
        if value.contains('\0') {
            return Err(bad(format!("the value of {name} contains a NUL byte")));
        }
        vars.push((name.to_string(), value.to_string()));
    }
    Ok(vars)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Environment {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn env_files_read_as_deepspeed_reads_them_and_values_stay_literal() {
        let text = "# site\n\nNCCL_IB_HCA=mlx5_0\nMSG=a \"b\" $(id) 'c' =d\r\nexport_X=1\n";
        let vars = parse_env_file(text, Path::new("e")).unwrap();
        assert_eq!(
            vars,
            [
                ("NCCL_IB_HCA".to_string(), "mlx5_0".to_string()),
                ("MSG".to_string(), "a \"b\" $(id) 'c' =d".to_string()),
                ("export_X".to_string(), "1".to_string()),
            ]
        );
        let err = parse_env_file("A=1\nexport B=2\n", Path::new("/x/.pipette_env")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "env file /x/.pipette_env, line 2: \"export B\" is not an environment variable name (letters, digits and _) (write NAME=VALUE, one a line)"
        );
        let err = parse_env_file("JUSTNAME\n", Path::new("f")).unwrap_err();
        assert!(
            err.to_string().contains("line 1: \"JUSTNAME\" has no ="),
            "{err}"
        );
    }

    #[test]
    fn later_sources_win_and_a_bare_name_copies_this_process_value() {
        let dir = tempfile::tempdir().unwrap();
        let (home, cwd) = (dir.path().join("home"), dir.path().join("cwd"));
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&cwd).unwrap();
        std::fs::write(
            home.join(".deepspeed_env"),
            "A=home-ds\nB=home-ds\nC=home-ds\n",
        )
        .unwrap();
        std::fs::write(cwd.join(".pipette_env"), "B=cwd-pipette\n").unwrap();
        let here = env(&[("NCCL_DEBUG", "INFO"), ("C", "here"), ("SECRET", "s")]);
        let request = EnvRequest {
            assignments: vec![("C".into(), None), ("D".into(), Some("x=y".into()))],
            file: None,
        };
        let (vars, files) = node_env(&here, &request, Some(&home), &cwd).unwrap();
        assert_eq!(
            files,
            [home.join(".deepspeed_env"), cwd.join(".pipette_env")]
        );
        let get = |k: &str| vars.get(k).map(String::as_str);
        assert_eq!(get("NCCL_DEBUG"), Some("INFO"), "forwarded by default");
        assert_eq!(get("SECRET"), None, "not forwarded unless asked");
        assert_eq!(get("A"), Some("home-ds"));
        assert_eq!(get("B"), Some("cwd-pipette"));
        assert_eq!(get("C"), Some("here"));
        assert_eq!(get("D"), Some("x=y"));

        // --env-file replaces the default files; a bare name must be set here.
        let request = EnvRequest {
            assignments: vec![("MISSING".into(), None)],
            file: Some(cwd.join(".pipette_env")),
        };
        let err = node_env(&here, &request, Some(&home), &cwd).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--env MISSING: MISSING is not set here (give --env MISSING=VALUE)"
        );
        let request = EnvRequest {
            assignments: Vec::new(),
            file: Some(cwd.join(".pipette_env")),
        };
        let (vars, _) = node_env(&here, &request, Some(&home), &cwd).unwrap();
        assert_eq!(vars.get("A"), None);
        assert_eq!(vars.get("B").map(String::as_str), Some("cwd-pipette"));
    }
}
