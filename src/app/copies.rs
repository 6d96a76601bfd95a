//! One pipette-run per node (`srun --ntasks-per-node=1 pipette-run ...`, one per
//! Kubernetes pod): which copy this is ([`crate::cluster::copies`]), the job secret and
//! the control port from the environment, and then either the leader's run (the single
//! driver's, over the nodes of the copies, see [`crate::peers`]) or an agent's life.

use std::sync::Arc;

use crate::cli::resolved::RunConfig;
use crate::cluster::copies::{self, Copies, CopiesRequest, Role};
use crate::cluster::Environment;
use crate::error::Error;
use crate::exec::agent::{JobSecret, SECRET_FILE_VARIABLE, SECRET_VARIABLE};
use crate::peers::{self, Fleet, Log, PeerOptions, DEFAULT_JOIN_TIMEOUT, WAITING_NOTE};

/// The leader's control port (default: the master port + 1).
const PORT_VARIABLE: &str = "PIPETTE_AGENT_PORT";

/// Whether this pipette-run is one of several copies (see [`crate::cluster::copies`]).
pub(super) fn detect(
    config: &RunConfig,
    local_addr: Option<&str>,
) -> Result<Option<Copies>, Error> {
    let request = CopiesRequest {
        nnodes: config.allocation.nnodes,
        master_addr: config.launch.master_addr.clone(),
        local_addr: local_addr.map(str::to_string),
    };
    Ok(copies::detect(&config.discovery.environment, &request)?)
}

/// Runs this copy: the leader drives the job (`drive`, the single driver's run) over the
/// nodes of every copy and hands its exit code to the agents; an agent follows the
/// leader and exits with the job's code (or non-zero when it loses the leader).
pub(super) fn run_copy(mut config: RunConfig, copies: Copies, drive: fn(&RunConfig) -> i32) -> i32 {
    let fail = |e: Error| super::finish(Err(e));
    let options = match peer_options(&config) {
        Ok(options) => options,
        Err(e) => return fail(e),
    };
    let log: Log = Arc::new(|line: &str| crate::log::log(crate::log::Level::Info, "job", line));
    match copies.role() {
        Role::Agent { .. } => match peers::follow(&copies, &options, &log) {
            Ok(code) => code,
            Err(e) => fail(e.into()),
        },
        Role::Leader => {
            let fleet = match Fleet::gather(&copies, &options, &log) {
                Ok(fleet) => fleet,
                Err(e) => return fail(e.into()),
            };
            config.lead(fleet.spec(), fleet.transport());
            let code = drive(&config);
            fleet.end(code);
            code
        }
    }
}

fn peer_options(config: &RunConfig) -> Result<PeerOptions, Error> {
    let env = &config.discovery.environment;
    let relay = std::env::current_exe()
        .map_err(|e| Error::Internal(format!("cannot find this program's own path: {e}")))?;
    Ok(PeerOptions {
        secret: job_secret(env)?,
        port: control_port(env, config.launch.master_port)?,
        join_timeout: DEFAULT_JOIN_TIMEOUT,
        waiting_note: WAITING_NOTE,
        relay,
    })
}

fn job_secret(env: &Environment) -> Result<JobSecret, Error> {
    let set = |name: &str| env.get(name).filter(|v| !v.is_empty());
    let bytes = match (set(SECRET_VARIABLE), set(SECRET_FILE_VARIABLE)) {
        (Some(text), _) => text.trim_end_matches(['\n', '\r']).as_bytes().to_vec(),
        (None, Some(path)) => read_secret_file(path)?,
        (None, None) => {
            return Err(Error::Usage(format!(
                "one pipette-run per node needs a secret shared by the job's copies, to accept \
                 orders only from this job: set {SECRET_VARIABLE} in the job's environment \
                 (e.g. `export {SECRET_VARIABLE}=$(head -c 32 /dev/urandom | base64)` before \
                 srun, or a Kubernetes Secret), or {SECRET_FILE_VARIABLE}"
            )))
        }
    };
    JobSecret::new(bytes).map_err(|e| {
        Error::Usage(format!(
            "{e} (use at least 16 random bytes, e.g. `head -c 32 /dev/urandom | base64`)"
        ))
    })
}

fn read_secret_file(path: &str) -> Result<Vec<u8>, Error> {
    use std::os::unix::fs::PermissionsExt;
    let bad = |detail: String| Error::Usage(format!("{SECRET_FILE_VARIABLE}={path}: {detail}"));
    let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(bad(format!(
            "the file may be read by others (mode {:o}; make it 0600 or 0400, in Kubernetes \
             with the volume's defaultMode: 0400)",
            meta.permissions().mode() & 0o777
        )));
    }
    let mut bytes = crate::input_file::read(path).map_err(|e| bad(e.to_string()))?;
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    Ok(bytes)
}

fn control_port(env: &Environment, master_port: u16) -> Result<u16, Error> {
    match env.get(PORT_VARIABLE).filter(|v| !v.is_empty()) {
        Some(text) => text
            .trim()
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| {
                Error::Usage(format!(
                    "{PORT_VARIABLE}=\"{text}\": not a port number (1-65535)"
                ))
            }),
        None => master_port.checked_add(1).ok_or_else(|| {
            Error::Usage(format!(
                "the master port is 65535, so the copies' control port (the next one) does \
                 not exist: set {PORT_VARIABLE}"
            ))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::discover::environment as env;

    #[test]
    fn the_secret_comes_from_the_environment_or_a_private_file() {
        assert!(job_secret(&env(&[(SECRET_VARIABLE, "0123456789abcdef\n")])).is_ok());
        let err = job_secret(&env(&[])).unwrap_err().to_string();
        assert!(err.contains("set PIPETTE_JOB_SECRET"), "{err}");
        let err = job_secret(&env(&[(SECRET_VARIABLE, "short")])).unwrap_err();
        assert!(
            err.to_string().starts_with("the job secret has 5 bytes"),
            "{err}"
        );

        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "0123456789abcdef-from-a-file\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let file = path.display().to_string();
        let err = job_secret(&env(&[(SECRET_FILE_VARIABLE, &file)])).unwrap_err();
        assert!(
            err.to_string().contains("may be read by others (mode 644"),
            "{err}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert_eq!(
            job_secret(&env(&[(SECRET_FILE_VARIABLE, &file)])).unwrap(),
            JobSecret::new(b"0123456789abcdef-from-a-file".to_vec()).unwrap()
        );
    }

    #[test]
    fn the_control_port_follows_the_master_port_unless_set() {
        assert_eq!(control_port(&env(&[]), 29500).unwrap(), 29501);
        assert_eq!(
            control_port(&env(&[(PORT_VARIABLE, "4000")]), 29500).unwrap(),
            4000
        );
        assert!(control_port(&env(&[(PORT_VARIABLE, "0")]), 29500).is_err());
        assert!(control_port(&env(&[]), 65535).is_err());
    }
}
