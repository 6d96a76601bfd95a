//! `pipette profile`: the allocated nodes measured into a cluster profile file.

use crate::cli::node_env::{announced_node_env, EnvRequest};
use crate::cli::resolved::{DiscoveryInputs, NodeAccess};
use crate::cli::ProfileArgs;
use crate::cluster::Environment;
use crate::error::Error;
use crate::job::inputs::{discover_nodes, profile_summary};
use crate::log::{self, Level};
use crate::measure::{self, ProfileOptions, ProgressBars};

pub(super) fn run(args: &ProfileArgs, env: &Environment) -> Result<(), Error> {
    // The probe stops in order on a stop signal, its staging removed (exit 128 + N).
    let _signals = crate::exec::signals::SignalGuard::install();
    let found = discover_nodes(&DiscoveryInputs::new(&args.discovery, env.clone()))?;
    let spec = &found.spec;
    for w in &found.warnings {
        log::warn(&w.to_string());
    }
    let access = NodeAccess::new(&args.access, &args.nodes);
    let env = announced_node_env(env, &EnvRequest::new(&args.nodes))?;
    let options = ProfileOptions {
        transport: access.transport(&spec.hosts(), &spec.source),
        nproc_per_node: args.nproc_per_node,
        torchrun: args.access.torchrun.clone(),
        reprofile: args.profiling.reprofile,
        env: env.into_iter().collect(),
        ..ProfileOptions::default()
    };
    let progress = ProgressBars::new(!args.output.json, measure::LINE_INTERVAL);
    let run = measure::run_profile(spec, &options, &progress)?;
    let text = run.profile.to_json_pretty();
    std::fs::write(&args.out, &text).map_err(|e| {
        Error::Usage(format!(
            "cannot write {}: {e} (choose another --out)",
            args.out.display()
        ))
    })?;
    for note in &run.notes {
        log::log(Level::Info, "profile", note);
    }
    if args.output.json {
        println!("{text}");
    } else {
        let s = profile_summary(&args.out, &run.profile);
        println!(
            "{}: {} nodes, {} GPUs ({}){}",
            s.path,
            s.nodes,
            s.gpus,
            s.gpu_models.join(", "),
            s.node_link_gbps
                .map(|(lo, hi)| format!(", node links {lo:.2}–{hi:.2} GB/s"))
                .unwrap_or_default()
        );
    }
    Ok(())
}
