//! The trial rounds before a launch: which micro-batch size to try next, when to fit the
//! calibration and plan again, how much to raise the memory estimate when a trial runs out
//! of memory, and when to stop.
//!
//! A round tries the plan (at each `--trial-micro-batches` size in the first round, at the
//! plan's own size after that), then fits the calibration to every trial measured so far
//! and plans again. Another round follows only when that re-plan chose another
//! configuration, or when a trial ran out of memory (then the overhead is raised until the
//! configuration that ran out no longer fits, and the new plan is tried); at most
//! [`Rounds::max`] rounds. Out of memory in the last round is the trial's error.
//!
//! [`next_step`] is the whole policy, a pure function of where the rounds stand and what
//! the driver (the launch in `app`) saw last; the driver runs the trials, fits and plans.

/// At most this many rounds of trial, fit and re-plan before a launch.
pub const MAX_TRIAL_ROUNDS: usize = 2;

/// Added to the shortfall a trial showed when it ran out of memory, so the configuration
/// that ran out is estimated strictly above the usable memory.
const OUT_OF_MEMORY_MARGIN_BYTES: u64 = 1 << 20;

/// What the rounds are asked to do.
#[derive(Debug, Clone, Copy)]
pub struct Rounds<'a> {
    /// At most this many rounds ([`MAX_TRIAL_ROUNDS`] before a launch; one for
    /// `pipette calibrate`, whose re-plan is only reported).
    pub max: usize,
    /// `--trial-micro-batches`: the sizes the first round tries (else the plan's own).
    pub first_sizes: Option<&'a [u64]>,
}

/// Where the rounds stand: the round (from 0) and how many trials of it have run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Position {
    pub round: usize,
    pub tried: usize,
}

/// What the driver saw after its last step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Nothing yet: the rounds begin.
    Start,
    /// The last trial measured its iterations.
    Measured,
    /// The last trial ran out of memory; the plan's estimate of its peak and of the
    /// usable memory.
    OutOfMemory { peak_bytes: u64, usable_bytes: u64 },
    /// After [`Step::RaiseOverhead`]: the plan was made again.
    Replanned,
    /// After [`Step::Fit`]: the calibration was fitted and the plan made again; whether
    /// that chose another configuration.
    Fitted { changed: bool },
}

/// What the driver does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Run the trial of the current plan at this micro-batch size.
    Trial { micro_batch: u64 },
    /// Raise the calibration's overhead by this much and plan again.
    RaiseOverhead { by_bytes: u64 },
    /// Fit the calibration to every trial measured so far and plan again.
    Fit,
    /// Stop: the current plan is the one to launch.
    Done,
    /// Stop: a trial of the last round ran out of memory, and its error stands.
    OutOfMemory,
}

/// The next step after `seen` at `at`, and where the rounds stand then. `plan_micro_batch`
/// is the current plan's size (tried in every round after the first, and in the first
/// when no sizes were asked for).
pub fn next_step(
    rounds: &Rounds<'_>,
    at: Position,
    seen: Seen,
    plan_micro_batch: u64,
) -> (Step, Position) {
    match seen {
        Seen::Start => begin_round(rounds, 0, plan_micro_batch),
        Seen::Measured => {
            let at = Position {
                tried: at.tried + 1,
                ..at
            };
            let sizes = round_sizes(rounds, at.round, plan_micro_batch);
            match sizes.get(at.tried) {
                Some(&micro_batch) => (Step::Trial { micro_batch }, at),
                None => (Step::Fit, at),
            }
        }
        Seen::OutOfMemory {
            peak_bytes,
            usable_bytes,
        } => {
            if at.round + 1 < rounds.max {
                // The estimate was too low: raise the overhead until that configuration no
                // longer fits.
                let by_bytes = usable_bytes.saturating_sub(peak_bytes) + OUT_OF_MEMORY_MARGIN_BYTES;
                (Step::RaiseOverhead { by_bytes }, at)
            } else {
                (Step::OutOfMemory, at)
            }
        }
        Seen::Replanned => begin_round(rounds, at.round + 1, plan_micro_batch),
        Seen::Fitted { changed } => {
            if !changed || at.round + 1 >= rounds.max {
                (Step::Done, at)
            } else {
                begin_round(rounds, at.round + 1, plan_micro_batch)
            }
        }
    }
}

/// The first step of round `round`.
fn begin_round(rounds: &Rounds<'_>, round: usize, plan_micro_batch: u64) -> (Step, Position) {
    let at = Position { round, tried: 0 };
    if round >= rounds.max {
        return (Step::Done, at);
    }
    match round_sizes(rounds, round, plan_micro_batch).first() {
        Some(&micro_batch) => (Step::Trial { micro_batch }, at),
        None => (Step::Fit, at),
    }
}

/// The sizes round `round` tries.
fn round_sizes(rounds: &Rounds<'_>, round: usize, plan_micro_batch: u64) -> Vec<u64> {
    match (rounds.first_sizes, round) {
        (Some(list), 0) => list.to_vec(),
        _ => vec![plan_micro_batch],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn oom(peak_gib: u64, usable_gib: u64) -> Seen {
        Seen::OutOfMemory {
            peak_bytes: peak_gib * GIB,
            usable_bytes: usable_gib * GIB,
        }
    }

    fn trial(micro_batch: u64) -> Step {
        Step::Trial { micro_batch }
    }

    /// Each case: its name, the most rounds, the sizes asked for the first round, then
    /// what the driver saw with the plan's micro-batch at that moment and the step the
    /// policy must answer.
    #[test]
    fn the_rounds_follow_the_policy() {
        #[allow(clippy::type_complexity)]
        let cases: &[(&str, usize, Option<&[u64]>, &[(Seen, u64, Step)])] = &[
            (
                "one trial, the re-plan keeps the configuration",
                MAX_TRIAL_ROUNDS,
                None,
                &[
                    (Seen::Start, 2, trial(2)),
                    (Seen::Measured, 2, Step::Fit),
                    (Seen::Fitted { changed: false }, 2, Step::Done),
                ],
            ),
            (
                "every asked size is tried in the first round, then one fit",
                MAX_TRIAL_ROUNDS,
                Some(&[1, 2, 4]),
                &[
                    (Seen::Start, 8, trial(1)),
                    (Seen::Measured, 8, trial(2)),
                    (Seen::Measured, 8, trial(4)),
                    (Seen::Measured, 8, Step::Fit),
                    (Seen::Fitted { changed: false }, 8, Step::Done),
                ],
            ),
            (
                "a changed configuration is tried again at its own size, once",
                MAX_TRIAL_ROUNDS,
                Some(&[1, 2]),
                &[
                    (Seen::Start, 1, trial(1)),
                    (Seen::Measured, 1, trial(2)),
                    (Seen::Measured, 1, Step::Fit),
                    (Seen::Fitted { changed: true }, 4, trial(4)),
                    (Seen::Measured, 4, Step::Fit),
                    (Seen::Fitted { changed: true }, 2, Step::Done),
                ],
            ),
            (
                "out of memory raises the overhead by the shortfall and tries the new plan",
                MAX_TRIAL_ROUNDS,
                None,
                &[
                    (Seen::Start, 4, trial(4)),
                    (
                        oom(70, 80),
                        4,
                        Step::RaiseOverhead {
                            by_bytes: 10 * GIB + MIB,
                        },
                    ),
                    (Seen::Replanned, 2, trial(2)),
                    (Seen::Measured, 2, Step::Fit),
                    (Seen::Fitted { changed: true }, 1, Step::Done),
                ],
            ),
            (
                "out of memory on a later asked size skips the rest of the list",
                MAX_TRIAL_ROUNDS,
                Some(&[1, 8, 16]),
                &[
                    (Seen::Start, 2, trial(1)),
                    (Seen::Measured, 2, trial(8)),
                    (oom(90, 80), 2, Step::RaiseOverhead { by_bytes: MIB }),
                    (Seen::Replanned, 2, trial(2)),
                    (Seen::Measured, 2, Step::Fit),
                    (Seen::Fitted { changed: false }, 2, Step::Done),
                ],
            ),
            (
                "out of memory in the last round is the answer",
                MAX_TRIAL_ROUNDS,
                None,
                &[
                    (Seen::Start, 2, trial(2)),
                    (Seen::Measured, 2, Step::Fit),
                    (Seen::Fitted { changed: true }, 8, trial(8)),
                    (oom(70, 80), 8, Step::OutOfMemory),
                ],
            ),
            (
                "pipette calibrate: one round, its re-plan only reported",
                1,
                Some(&[2, 4]),
                &[
                    (Seen::Start, 1, trial(2)),
                    (Seen::Measured, 1, trial(4)),
                    (Seen::Measured, 1, Step::Fit),
                    (Seen::Fitted { changed: true }, 8, Step::Done),
                ],
            ),
            (
                "pipette calibrate: out of memory in its one round",
                1,
                None,
                &[
                    (Seen::Start, 2, trial(2)),
                    (oom(70, 80), 2, Step::OutOfMemory),
                ],
            ),
            (
                "an empty list of sizes goes straight to the fit (which says why it cannot)",
                MAX_TRIAL_ROUNDS,
                Some(&[]),
                &[(Seen::Start, 2, Step::Fit)],
            ),
            (
                "no rounds: nothing runs",
                0,
                None,
                &[(Seen::Start, 2, Step::Done)],
            ),
        ];
        for (name, max, first_sizes, steps) in cases {
            let rounds = Rounds {
                max: *max,
                first_sizes: *first_sizes,
            };
            let mut at = Position::default();
            for (i, (seen, plan_micro_batch, expected)) in steps.iter().enumerate() {
                let (step, next) = next_step(&rounds, at, *seen, *plan_micro_batch);
                assert_eq!(step, *expected, "{name}: step {i} after {seen:?}");
                at = next;
            }
        }
    }

    #[test]
    fn the_position_counts_rounds_and_trials() {
        let rounds = Rounds {
            max: MAX_TRIAL_ROUNDS,
            first_sizes: Some(&[1, 2]),
        };
        let (_, at) = next_step(&rounds, Position::default(), Seen::Start, 4);
        assert_eq!(at, Position { round: 0, tried: 0 });
        let (_, at) = next_step(&rounds, at, Seen::Measured, 4);
        assert_eq!(at, Position { round: 0, tried: 1 });
        let (_, at) = next_step(&rounds, at, oom(70, 80), 4);
        assert_eq!(at, Position { round: 0, tried: 1 });
        let (_, at) = next_step(&rounds, at, Seen::Replanned, 4);
        assert_eq!(at, Position { round: 1, tried: 0 });
    }
}
