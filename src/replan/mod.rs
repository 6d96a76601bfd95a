//! Re-plan: every decision to plan a job again, in one place. Two loops go back to the
//! planner, and both take their policy from here:
//!
//! - before a launch, the trial rounds ([`trials`]): which micro-batch sizes to try, when
//!   to fit the calibration and plan again, how much to raise the memory estimate after a
//!   trial ran out of memory, when to stop;
//! - after a failure, the plan for the survivors ([`failure`]): the global batch kept,
//!   tp × pp kept when a checkpoint exists so that it loads as it is, changed only when
//!   the checkpoint format can be resharded;
//! - while training, the plans a straggler leaves ([`straggler`]): the running plan on the
//!   cluster with the straggler at its measured speed, a re-map on every node, a re-plan
//!   without it, each timed by the model.
//!
//! Both are pure: [`trials::next_step`] answers what the trial loop saw with its next step,
//! [`failure::replan`] plans on the survivors from the checkpoint state it is given. The
//! drivers only execute: the launch in [`crate::app`] runs the trials, fits and plans as
//! told; the supervisor's driver ([`crate::supervise`]) reads the checkpoint, asks for the
//! survivors' plan and relaunches. Whether a failure is re-planned at all (blame,
//! survivors, the `--max-replans` limit) is [`crate::supervise::decide`]'s.
//!
//! Sits after `trial` and before `supervise` in the stage order: it imports the planner
//! and the launch stage's checkpoint state, and is imported by the supervisor and the app.

pub mod failure;
pub mod straggler;
pub mod trials;
