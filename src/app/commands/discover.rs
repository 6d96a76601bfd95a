//! `pipette discover`: the nodes pipette-run would use here.

use crate::app::to_json;
use crate::cli::resolved::DiscoveryInputs;
use crate::cli::{DiscoveryOptions, OutputOptions};
use crate::cluster::Environment;
use crate::error::Error;
use crate::job::inputs::discover_nodes;
use crate::log;

pub(super) fn run(
    discovery: &DiscoveryOptions,
    output: &OutputOptions,
    env: &Environment,
) -> Result<(), Error> {
    let found = discover_nodes(&DiscoveryInputs::new(discovery, env.clone()))?;
    let spec = &found.spec;
    for w in &found.warnings {
        log::warn(&w.to_string());
    }
    if output.json {
        println!("{}", to_json(spec)?);
    } else {
        for node in &spec.nodes {
            match node.slots.count() {
                Some(n) => println!("{} slots={n}", node.host),
                None => println!("{}", node.host),
            }
        }
    }
    Ok(())
}
