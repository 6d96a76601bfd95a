//! pipette-run: a drop-in replacement for `torchrun` that plans how to train.
//!
//! Data flows one way through the stages; each stage takes the previous stage's
//! value and returns a new one. Only two loops go back to the planner, and both take
//! their decisions from [`replan`]:
//!
//! ```text
//! RunCli ─▶ RunConfig ─▶ Discovery ─▶ Allocation ─▶ ClusterProfile ─▶ Plan ◀─────────────┐
//!  (cli)     (app)        (cluster)    (cluster)     (cluster,         (plan, with       │
//!                                                     measure)          Settings from    │
//!                                                                       config)          │
//! trial rounds: Plan ─▶ trial ─▶ TrialReport ─▶ calibration ─▶ plan again ───────────────┤
//!               (replan::trials::next_step decides; app's launch executes)               │
//!                                                                                        │
//! Plan ─▶ Attempt ─▶ NodeGroup  ─▶ Ending ─▶ Decision ─▶ Outcome                         │
//!         (render    (launch)      (watch)   (decide)    (supervise)                     │
//!          via                                  │                                        │
//!          launch)                              └── re-plan on the survivors ────────────┘
//!                                                   (replan::failure::replan, executed
//!                                                    by supervise's driver)
//! ```
//!
//! - [`cli`] owns the command lines (torchrun's options, pipette's own) and nothing else;
//!   [`app`] resolves them once into a `RunConfig`, so nothing below app sees clap types.
//! - [`config`] turns the user's Megatron arguments (or a preset) into [`config::Settings`].
//! - [`cluster`] discovers the allocated nodes, reads and validates cluster profile files
//!   ([`cluster::ClusterProfile`]), and decides the [`cluster::Allocation`] (which hosts,
//!   how many workers each, which GPUs) that the profile, the report and launch all read.
//! - [`peers`] makes one job of one pipette-run per node (`srun --ntasks-per-node=1`,
//!   one per Kubernetes pod): the leader gathers the other copies and reaches each node
//!   through its copy ([`exec::agent`]); the agents follow it.
//! - [`measure`] measures the nodes (GPU inventory, link bandwidth, matmul throughput)
//!   into a cluster profile, cached per node set.
//! - [`model`] holds the pure cost models: parameters, memory per stage, iteration time,
//!   and the calibration factors they share.
//! - [`plan`] searches the configurations (mixed GPU kinds included) and the rank mapping.
//! - [`render`] writes a plan as Megatron arguments and per-node launch files.
//! - [`launch`] renders each attempt of a plan and runs torchrun on every node through
//!   the [`exec`] seam, tears it down and sweeps; it also reads what the job prints
//!   (Megatron's iteration lines, torchrun's failure report: [`launch::output_lines`]).
//! - [`trial`] runs the user's script briefly under a plan and fits the calibration to
//!   what it measured.
//! - [`replan`] owns every decision to plan again: the trial rounds' policy
//!   ([`replan::trials::next_step`]: what to try next, how far to raise the memory
//!   estimate after running out of memory, when to stop) and the survivors' plan after a
//!   failure ([`replan::failure::replan`]: keep tp × pp so the checkpoint loads). Pure;
//!   the drivers only execute.
//! - [`supervise`] watches the job: [`supervise::decide`] is the pure decision (blame,
//!   survivors, exit code, stop or re-plan), its driver runs the attempts (launch, watch,
//!   teardown, health checks, checkpoint read, re-plan, relaunch), typed
//!   [`supervise::events::Event`]s go to `events.jsonl` and the reporter shows them.
//! - [`doctor`] checks that the nodes are ready to run (`pipette doctor`): one probe per
//!   node, what it reports ([`doctor::facts`]) and the pure judgement ([`doctor::checks`]).
//! - [`report`] shows stage values to people (tables) and to tools (JSON).
//! - [`job`] prepares a `pipette-run` job as values, one step after another: gather the
//!   inputs, decide, the job's spec (built once), the trial, the first attempt.
//! - [`app`] is the orchestrator: it runs the stages in order for each command.
//! - [`error`] is the one top-level error, which maps every failure to an exit code (only
//!   [`app`] and the binaries use it); [`exit`] lists every exit code with its meaning (a
//!   leaf: it imports no stage); [`log`] writes our own lines on standard error (time
//!   stamp, level, target filter, 80-column wrapping; a leaf too, so every stage logs);
//!   [`input_file`] reads a file the user named (a regular file of at most 1 GiB; a leaf).
//!
//! The order exec → cluster → peers → measure → config/model → plan → render → launch → trial →
//! replan → supervise → doctor → report → cli → job → error → app is checked by
//! tests/architecture.rs:
//! no module names a later one.
//!
//! The binaries in `src/bin` only parse arguments, call [`app`], and exit.

pub mod app;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod doctor;
pub mod error;
pub mod exec;
pub mod exit;
pub mod input_file;
pub mod job;
pub mod launch;
pub mod log;
pub mod measure;
pub mod model;
pub mod peers;
pub mod plan;
pub mod render;
pub mod replan;
pub mod report;
pub mod supervise;
pub mod trial;

pub use error::Error;
pub use exit::ExitCode;
