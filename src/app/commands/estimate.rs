//! `pipette estimate`: one parallel configuration costed ([`crate::job::estimate`]).

use crate::app::to_json;
use crate::cli::EstimateArgs;
use crate::error::Error;
use crate::job::estimate::estimate;

pub(super) fn run(args: &EstimateArgs) -> Result<(), Error> {
    let report = estimate(args)?;
    if args.output.json {
        println!("{}", to_json(&report)?);
    } else {
        print!("{}", report.to_human());
    }
    Ok(())
}
