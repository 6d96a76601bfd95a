//! `pipette cluster FILE`: a cluster profile read, validated and summarised.

use std::path::Path;

use crate::cli::OutputOptions;
use crate::cluster::ClusterProfile;
use crate::error::Error;
use crate::job::inputs::profile_summary;

pub(super) fn run(file: &Path, output: &OutputOptions) -> Result<(), Error> {
    let profile = ClusterProfile::load(file)?;
    if output.json {
        println!("{}", profile.to_json_pretty());
    } else {
        let s = profile_summary(file, &profile);
        println!(
            "{}: valid, {} nodes, {} GPUs ({})",
            s.path,
            s.nodes,
            s.gpus,
            if s.gpu_models.is_empty() {
                "GPU models unknown".to_string()
            } else {
                s.gpu_models.join(", ")
            }
        );
        if let Some((lo, hi)) = s.node_link_gbps {
            println!("node-to-node bandwidth {lo:.2}–{hi:.2} GB/s");
            println!("{}", s.nics_line());
        }
    }
    Ok(())
}
