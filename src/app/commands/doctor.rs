//! `pipette doctor`: whether the nodes are ready to run. The nodes are found as pipette-run
//! finds them and reached as it reaches them; the probe and the judgement are the
//! [`crate::doctor`] stage's, the table [`crate::report::doctor`]'s.

use std::path::Path;

use crate::cli::node_env::{announced_node_env, EnvRequest};
use crate::cli::resolved::{DiscoveryInputs, NodeAccess};
use crate::cli::DoctorArgs;
use crate::cluster::{AllocationRequest, ClusterProfile, Environment};
use crate::doctor::checks::{self, diagnose, Limits};
use crate::doctor::{probe_all, Request};
use crate::error::Error;
use crate::exec;
use crate::job::inputs::{allocate, discover_nodes};
use crate::report;

/// Runs `pipette doctor`; returns the exit code (its report's, not an error's).
pub(in crate::app) fn main(args: &DoctorArgs, env: &Environment) -> i32 {
    // A stop signal ends the probes in order (exit 128 + N), nothing left running.
    let _signals = exec::signals::SignalGuard::install();
    match doctor(args, env) {
        Ok(code) => code,
        Err(e) => crate::app::finish(Err(e)),
    }
}

fn doctor(args: &DoctorArgs, env: &Environment) -> Result<i32, Error> {
    let found = discover_nodes(&DiscoveryInputs::new(&args.discovery, env.clone()))?;
    let profile = match &args.discovery.cluster {
        Some(path) => Some((path.clone(), ClusterProfile::load(path)?)),
        None => None,
    };
    let allocation = allocate(
        found,
        profile.as_ref().map(|(p, c)| (p.as_path(), c)),
        AllocationRequest::default(),
    )?;
    for w in &allocation.warnings {
        crate::log::warn(&w.to_string());
    }
    let hosts: Vec<String> = allocation.hosts.iter().map(|h| h.host.clone()).collect();
    let transport =
        NodeAccess::new(&args.access, &args.nodes).transport(&hosts, &allocation.source);
    let cwd = std::env::current_dir()
        .map_err(|e| Error::Internal(format!("cannot read the working directory: {e}")))?;
    let vars = announced_node_env(env, &EnvRequest::new(&args.nodes))?;
    let request = Request {
        transport,
        torchrun: args.access.torchrun.clone(),
        run_dir: cwd.join(args.run_dir.as_deref().unwrap_or(Path::new("pipette-runs"))),
        env: vars.into_iter().collect(),
        timeout: args.timeout,
        venvs: crate::doctor::venv_torchruns(&args.access.torchrun, env),
    };
    let nodes = probe_all(&request, &hosts);
    if let Some(received) = exec::signals::stop_received() {
        return Err(Error::Interrupted(received.signal));
    }
    let kind = request.transport.kind();
    let findings = diagnose(&nodes, &Limits::with_min_free(kind, args.min_free));
    let code = checks::exit_code(&findings).code();
    if args.json {
        let report = report::doctor::json(&nodes, &findings, kind.as_str(), &request.run_dir, code);
        println!("{}", crate::app::to_json(&report)?);
    } else {
        print!(
            "{}",
            report::doctor::render(&nodes, &findings, kind.as_str())
        );
    }
    Ok(code)
}
