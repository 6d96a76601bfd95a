//! `pipette model`: the model and training settings, with the exact parameter count.

use crate::app::to_json;
use crate::cli::resolved::SettingsInputs;
use crate::cli::{ModelOptions, OutputOptions};
use crate::config;
use crate::error::Error;
use crate::job::inputs::{model_section, read_settings};
use crate::report::dry_run::ModelSection;

pub(super) fn run(
    model: &ModelOptions,
    output: &OutputOptions,
    megatron_args: &[String],
) -> Result<(), Error> {
    let settings = read_settings(&SettingsInputs::new(model), megatron_args)?;
    let section = model_section(&settings);
    if output.json {
        #[derive(serde::Serialize)]
        struct ModelReport<'a> {
            model: &'a ModelSection,
            training: &'a config::TrainingSettings,
            constraints: &'a config::Constraints,
        }
        let report = ModelReport {
            model: &section,
            training: &settings.training,
            constraints: &settings.constraints,
        };
        println!("{}", to_json(&report)?);
    } else {
        let spec = &section.spec;
        println!(
            "{}: {} parameters ({})",
            spec.preset.as_deref().unwrap_or("model"),
            crate::report::thousands(section.parameters),
            crate::report::short_count(section.parameters)
        );
    }
    Ok(())
}
