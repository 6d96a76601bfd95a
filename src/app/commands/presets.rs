//! `pipette presets`: the model presets usable with --model.

use crate::app::to_json;
use crate::cli::OutputOptions;
use crate::config;
use crate::error::Error;

pub(super) fn run(output: &OutputOptions) -> Result<(), Error> {
    let names = config::presets::names();
    if output.json {
        println!("{}", to_json(&names)?);
    } else {
        for name in names {
            println!("{name}");
        }
    }
    Ok(())
}
