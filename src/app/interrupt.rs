//! A stop signal (Ctrl-C, SIGTERM) during a launch before the supervisor takes over:
//! profiling, planning and the trial each stop what they ran and return
//! [`Error::Interrupted`]; [`ending_on_signal`] then records the signal and the exit in the
//! run directory as the supervisor would, and ends with 128 + the signal's number. The
//! supervisor handles the signals that come after it has taken over.

use std::time::Instant;

use super::run::{event_log, finish_outcome};
use crate::cli::resolved::RunConfig;
use crate::error::Error;
use crate::job;
use crate::log::{self, Level};
use crate::report::ledger::LedgerInputs;
use crate::report::plan::YoursReport;
use crate::supervise;

/// What a launch was doing, for a stop signal's record, and how long each step took, for
/// the ledger.
pub(super) struct Stage {
    /// `profiling the nodes`, `the trial run`.
    pub(super) during: &'static str,
    /// The run directory, once known.
    pub(super) run_dir: Option<std::path::PathBuf>,
    /// When pipette-run started on the launch.
    pub(super) start: Instant,
    /// The steps before the supervisor's, timed so far (`wall` is set at the end).
    pub(super) ledger: LedgerInputs,
    /// The user's configuration costed beside the plan, for `--json`.
    pub(super) yours: Option<YoursReport>,
}

/// What the supervisor's caller knew before the launch, for the end of the job.
pub(super) struct Before<'a> {
    /// The ledger's inputs, `wall` up to the launch.
    pub(super) ledger: LedgerInputs,
    pub(super) yours: Option<&'a YoursReport>,
}

impl Stage {
    /// What is known so far, with the wall time so far.
    pub(super) fn before(&self) -> Before<'_> {
        Before {
            ledger: LedgerInputs {
                wall: self.start.elapsed(),
                ..self.ledger.clone()
            },
            yours: self.yours.as_ref(),
        }
    }
}

/// Runs `launch` (which says in its [`Stage`] what it is doing); when a stop signal ends it
/// before the supervisor takes over (profiling, planning, the trial: each stops what it ran
/// and removes its staging), records the signal and the exit in the run directory's
/// `events.jsonl` and `summary.txt` as the supervisor would, prints the summary, and
/// returns 128 + the signal's number.
pub(super) fn ending_on_signal(
    config: &RunConfig,
    launch: impl FnOnce(&mut Stage) -> Result<i32, Error>,
) -> Result<i32, Error> {
    let mut stage = Stage {
        during: "profiling the nodes",
        run_dir: None,
        start: Instant::now(),
        ledger: LedgerInputs::default(),
        yours: None,
    };
    let error = match launch(&mut stage) {
        Ok(code) => return Ok(code),
        Err(e) => e,
    };
    let Some(signal) = error.interrupted_by() else {
        return Err(error);
    };
    let ledger = LedgerInputs {
        wall: stage.start.elapsed(),
        ..stage.ledger.clone()
    };
    let run_dir = match stage.run_dir {
        Some(dir) => dir,
        None => {
            let workdir = std::env::current_dir()
                .map_err(|e| Error::Internal(format!("cannot read the working directory: {e}")))?;
            job::claim_run_dir(config, &workdir, None)?
        }
    };
    let events = event_log(&run_dir)?;
    let count = supervise::signals::stop_received().map_or(1, |r| r.count);
    let outcome = supervise::interrupted(&events, signal, count, stage.during);
    log::log(
        Level::Warn,
        "job",
        &format!(
            "{} received during {}: stopped it (nothing is left running); run directory {} (events.jsonl, summary.txt)",
            supervise::signals::signal_name(signal),
            stage.during,
            run_dir.display()
        ),
    );
    let before = Before {
        ledger,
        yours: stage.yours.as_ref(),
    };
    finish_outcome(config, &run_dir, &outcome, None, &before)
}

/// `Err(Error::Interrupted)` once a stop signal has arrived: checked between the stages
/// that do not watch for one themselves.
pub(super) fn stop_requested() -> Result<(), Error> {
    match supervise::signals::stop_received() {
        Some(r) => Err(Error::Interrupted(r.signal)),
        None => Ok(()),
    }
}
