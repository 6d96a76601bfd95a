//! The time model against vTrain's 1,549 measured A100 runs (`data/vtrain`,
//! read through `pipette::model::validation` on `examples/clusters/vtrain-a100.json`, with
//! vTrain's own assumptions: vocabulary 50,257, fp16, full recomputation).
//!
//! The bounds are what today's model meets with the shipped calibration and nothing fitted,
//! with a little room, so that a change that makes the model rank or predict worse fails.
//! On the 109 multi-node runs the model (shipped tables, nothing fitted) has median |error|
//! 4.3 %, max 51.9 %, Kendall's tau 0.48–0.83 per sweep, its pick at most 10.4 % slower
//! than the measured best, the faster member named in 165 of 189 micro-batch pairs; fitted
//! on the one-node runs 4.2 %, 51.8 %, 0.48–0.82, 10.4 % and 165. Before the optimizer step,
//! the host floor, the measured all-reduce latencies by group size and the A100 SXM's
//! best-shape throughput (the table is a PCIe part's) it had 7.6 %, 50.4 %, 0.53–0.84, 10.4 %
//! and 166 (fitted: 10.0 %, 54.5 %, 158); before a collective crossing nodes spread over the
//! nodes' NICs and the unfused attention of vTrain's runs was costed 8.8 %, 143.7 %,
//! 0.50–0.85, 10.4 % and 166; the one-efficiency model before it 25.3 %, 140.7 %,
//! 0.51–0.77, 11.5 % and 125 of 189 (50 predicted as ties). The lowest tau fell from 0.53
//! to 0.48 (the 39.1B sweep, whose tp 2 runs the model puts 30–40 % too fast), so its
//! bound is 0.45. Issue 19's unfitted target (median ≤ 15 %) is held here; its other targets
//! (median ≤ 6 % and max ≤ 20 % fitted on the one-node runs; tau ≥ 0.85; pick within 2 %;
//! ≥ 95 % of the pairs) are met only for the median and replace these bounds as the model
//! improves.
//! `scripts/validate-time-model` prints the full report.

use crate::common;

use std::sync::OnceLock;

use pipette::cluster::ClusterProfile;
use pipette::model::time::{TimeModel, STATED_ERROR};
use pipette::model::validation::{
    fit_calibration, parse_runs, predict, prepare, rms_log_error, score, PreparedRun,
    RunAssumptions, Score,
};
use pipette::model::Calibration;

fn cluster() -> &'static ClusterProfile {
    static CLUSTER: OnceLock<ClusterProfile> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        ClusterProfile::load(common::repo().join("examples/clusters/vtrain-a100.json"))
            .unwrap_or_else(|e| panic!("{e}"))
    })
}

/// The runs of one of vTrain's files; a missing file fails the test.
fn runs(file: &str) -> Vec<PreparedRun> {
    let path = common::repo().join("data/vtrain").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (the measured data set is part of the repository: data/vtrain/README.md)",
            path.display()
        )
    });
    let runs = parse_runs(&text, file).unwrap_or_else(|e| panic!("{e}"));
    prepare(&runs, &RunAssumptions::default(), 8).unwrap_or_else(|e| panic!("{e}"))
}

fn multi() -> &'static [PreparedRun] {
    static RUNS: OnceLock<Vec<PreparedRun>> = OnceLock::new();
    RUNS.get_or_init(|| runs("ground_truth_multi.csv"))
}

fn single() -> &'static [PreparedRun] {
    static RUNS: OnceLock<Vec<PreparedRun>> = OnceLock::new();
    RUNS.get_or_init(|| runs("ground_truth_single.csv"))
}

/// The shipped model's score on the multi-node runs, computed once for the tests that read it.
fn shipped_score() -> &'static Score {
    static SCORE: OnceLock<Score> = OnceLock::new();
    SCORE.get_or_init(|| {
        let predictions = predict(
            multi(),
            cluster(),
            &Calibration::default(),
            TimeModel::Pipette,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        score(&predictions)
    })
}

#[test]
fn every_run_is_read_and_costed() {
    assert_eq!(multi().len(), 109);
    assert_eq!(single().len(), 1440);
    let s = shipped_score();
    assert_eq!(s.runs, 109);
    // 3.6B, 18.4B and 39.1B on 64, 256 and 512 GPUs, 175B on 512.
    assert_eq!(s.sweeps.len(), 4, "{:?}", s.sweeps);
    assert_eq!(s.micro_batch_pairs.pairs, 189);
    assert!(multi().iter().all(|r| r.run.params_billion.is_some()));
    assert!(single().iter().all(|r| r.run.gpus <= 8));
}

#[test]
fn shipped_model_predicts_the_multi_node_runs_within_todays_bounds() {
    let s = shipped_score();
    // Issue 19: with the shipped tables and nothing fitted, median |error| at most 15 %.
    assert!(
        s.median_abs_error <= 0.15,
        "median |error| {}",
        s.median_abs_error
    );
    // What the model reaches today, with room.
    assert!(
        s.median_abs_error <= 0.055,
        "median |error| {}",
        s.median_abs_error
    );
    assert!(s.max_abs_error <= 0.55, "max |error| {}", s.max_abs_error);
}

#[test]
fn the_stated_error_is_what_the_validation_measures() {
    // The estimate states `STATED_ERROR` wherever it is shown: it must stay the median
    // |error| of the multi-node runs (update the constant when the model changes).
    let s = shipped_score();
    assert!(
        (s.median_abs_error - STATED_ERROR).abs() <= 0.005,
        "the validation's median |error| is {:.4}, the stated error {STATED_ERROR}: update pipette::model::time::STATED_ERROR",
        s.median_abs_error
    );
    assert_eq!(TimeModel::Pipette.stated_error(), Some(STATED_ERROR));
}

#[test]
fn shipped_model_ranks_each_sweep_within_todays_bounds() {
    let s = shipped_score();
    for sweep in &s.sweeps {
        let tau = sweep.kendall_tau.expect("every sweep has several runs");
        assert!(tau >= 0.45, "{sweep:?}");
        assert!(sweep.pick_regret <= 0.12, "{sweep:?}");
    }
    let pairs = s.micro_batch_pairs;
    assert!(pairs.named >= 160, "{pairs:?}");
}

#[test]
fn fitting_on_one_node_runs_fits_them_at_least_as_well_as_the_defaults() {
    // Every fortieth one-node run (36 of them, across the file) keeps the test fast: the fit
    // prices its sample some 400 times, in a debug build. It is a least-squares optimum over
    // the runs it sees, so it can do no worse there than the calibration it starts from.
    let sample: Vec<PreparedRun> = single().iter().step_by(40).cloned().collect();
    let base = Calibration::default();
    let fit = fit_calibration(&sample, cluster(), &base, TimeModel::Pipette)
        .unwrap_or_else(|e| panic!("{e}"));
    let before = predict(&sample, cluster(), &base, TimeModel::Pipette).unwrap();
    assert_eq!(fit.runs, sample.len());
    assert!(
        fit.rms_log_error <= rms_log_error(&before) + 1e-12,
        "{fit:?}"
    );
    let after = predict(&sample, cluster(), &fit.calibration, TimeModel::Pipette).unwrap();
    assert!((rms_log_error(&after) - fit.rms_log_error).abs() < 1e-12);
    assert_ne!(fit.calibration, base);
}
