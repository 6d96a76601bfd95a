//! `pipette config show`: every pipette-run option with a value, and where it comes from.

use std::path::Path;

use crate::error::Error;

/// `pipette config show [--config FILE]`.
pub(super) fn show(config: Option<&Path>) -> Result<(), Error> {
    let matches = crate::cli::run_command()
        .ignore_errors(true)
        .try_get_matches_from(["pipette-run"])
        .unwrap_or_default();
    let site = match config {
        Some(path) => crate::cli::site::load_from(path),
        None => crate::cli::site::load(&matches),
    }
    .map_err(Error::Usage)?;
    let shown =
        crate::cli::site::show(crate::cli::run_command(), site.as_ref()).map_err(Error::Usage)?;
    print!("{shown}");
    Ok(())
}
