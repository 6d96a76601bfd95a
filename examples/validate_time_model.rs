//! Checks the time model against vTrain's measured A100 runs (`data/vtrain`) and
//! prints, for the multi-node runs, every run's error, the median and largest |error|,
//! Kendall's tau and the regret of the model's pick within each sweep (one model on one GPU
//! count), and the micro-batch pairs whose faster member the model names; run by
//! `scripts/validate-time-model`.
//!
//! Two modes, both reported unless one is asked for:
//! - `defaults`: the shipped calibration (or `--calibration FILE`), nothing fitted;
//! - `fit`: [`fit_calibration`] fitted on the one-node runs (`ground_truth_single.csv`),
//!   then the multi-node runs (`ground_truth_multi.csv`) reported; the fit never sees them.
//!
//! The cluster is `examples/clusters/vtrain-a100.json` (its note says what it assumes and
//! where each figure comes from); what the CSV does not say about a run (vocabulary,
//! precision, recomputation) is [`RunAssumptions::default`], changed by the flags below to
//! see how much each assumption matters.
//!
//! Usage: `cargo run --release --example validate_time_model -- [OPTIONS]`
//!   --mode defaults|fit|both   (both)
//!   --time-model pipette|pipette-compat|amp   (pipette)
//!   --calibration FILE         a Calibration JSON to start from (the shipped defaults)
//!   --cluster FILE             (examples/clusters/vtrain-a100.json)
//!   --data DIR                 (data/vtrain)
//!   --json FILE                write the summary and every run's prediction as JSON
//!                              (target/validate-time-model.json; `-` for stdout)
//!   --bf16 | --no-recompute | --flash-attention | --vocab N
//!                              change one assumption about vTrain's runs
//!   --quiet                    no per-run table
//!   --moe-data FILE            the MoE development set (data/moe/dev.json): every run with
//!                              a step time costed on H100 (examples/clusters/h100-128x8.json)
//!                              or GB200 NVL72 trays, one scale per source, the error per
//!                              run and source, Kendall's tau and the pick per layout sweep
//!                              (pipette::model::moe_validation); written under "moe" in the
//!                              JSON
//!   --no-moe                   leave the MoE development set out

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use pipette::cluster::ClusterProfile;
use pipette::config::Precision;
use pipette::model::memory::AttentionKernel;
use pipette::model::moe_validation::{validate_dev_set, DevReport};
use pipette::model::time::TimeModel;
use pipette::model::validation::{
    fit_calibration, parse_runs, predict, prepare, score, Fit, Prediction, PreparedRun,
    RunAssumptions, Score,
};
use pipette::model::Calibration;
use serde::Serialize;

struct Options {
    fit: bool,
    defaults: bool,
    time_model: TimeModel,
    calibration: Calibration,
    cluster: PathBuf,
    data: PathBuf,
    json: String,
    assumptions: RunAssumptions,
    quiet: bool,
    moe_data: Option<PathBuf>,
}

fn parse_options() -> Result<Options, String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut o = Options {
        fit: true,
        defaults: true,
        time_model: TimeModel::Pipette,
        calibration: Calibration::default(),
        cluster: root.join("examples/clusters/vtrain-a100.json"),
        data: root.join("data/vtrain"),
        json: root
            .join("target/validate-time-model.json")
            .display()
            .to_string(),
        assumptions: RunAssumptions::default(),
        quiet: false,
        moe_data: Some(root.join("data/moe/dev.json")),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} takes a value"));
        match arg.as_str() {
            "--mode" => match value()?.as_str() {
                "defaults" => (o.fit, o.defaults) = (false, true),
                "fit" => (o.fit, o.defaults) = (true, false),
                "both" => (o.fit, o.defaults) = (true, true),
                other => return Err(format!("--mode {other:?} (choose defaults, fit or both)")),
            },
            "--time-model" => o.time_model = value()?.parse()?,
            "--calibration" => {
                let path = value()?;
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("cannot read {path}: {e}"))?;
                o.calibration = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
            }
            "--cluster" => o.cluster = value()?.into(),
            "--data" => o.data = value()?.into(),
            "--json" => o.json = value()?,
            "--bf16" => o.assumptions.precision = Precision::Bf16,
            "--no-recompute" => o.assumptions.full_recompute = false,
            "--flash-attention" => o.assumptions.attention = AttentionKernel::Fused,
            "--vocab" => {
                let text = value()?;
                o.assumptions.vocab_size = text
                    .parse()
                    .map_err(|_| format!("--vocab {text:?} (want a whole number)"))?;
            }
            "--quiet" => o.quiet = true,
            "--moe-data" => o.moe_data = Some(value()?.into()),
            "--no-moe" => o.moe_data = None,
            "-h" | "--help" => {
                return Err(
                    "see the usage at the top of examples/validate_time_model.rs".to_string(),
                )
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(o)
}

fn load_runs(path: &Path, assumptions: &RunAssumptions) -> Result<Vec<PreparedRun>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let origin = path.display().to_string();
    let runs = parse_runs(&text, &origin)?;
    prepare(&runs, assumptions, 8).map_err(|e| format!("{origin}: {e}"))
}

/// One mode's result, as the JSON file holds it.
#[derive(Serialize)]
struct ModeReport {
    mode: &'static str,
    /// What was fitted on the one-node runs (`None` without fitting).
    fit: Option<Fit>,
    calibration: Calibration,
    multi: Score,
    /// The one-node runs under the same calibration (what the fit saw, in `fit` mode).
    single: Score,
    multi_runs: Vec<Prediction>,
    single_runs: Vec<Prediction>,
}

#[derive(Serialize)]
struct Report {
    time_model: TimeModel,
    cluster: String,
    assumptions: RunAssumptions,
    modes: Vec<ModeReport>,
    /// The MoE development set (`None` with `--no-moe`).
    moe: Option<DevReport>,
}

fn pct(x: f64) -> String {
    format!("{:+.1} %", 100.0 * x)
}

fn print_score(name: &str, s: &Score) {
    let tau = |t: Option<f64>| t.map_or("-".to_string(), |t| format!("{t:.2}"));
    println!(
        "{name}: {} runs, median |error| {:.1} %, max |error| {:.1} %, mean error {}, tau {}..{}, \
         worst pick {:.1} % slower than the best, micro-batch pairs named {} of {} ({} tied)",
        s.runs,
        100.0 * s.median_abs_error,
        100.0 * s.max_abs_error,
        pct(s.mean_error),
        tau(s.tau_min),
        tau(s.tau_max),
        100.0 * s.worst_pick_regret,
        s.micro_batch_pairs.named,
        s.micro_batch_pairs.pairs,
        s.micro_batch_pairs.tied,
    );
}

fn print_sweeps(s: &Score) {
    println!(
        "  {:<7} {:>5} {:>6} {:>5} {:>6} {:>8}  {:<24} {:<24}",
        "model", "GPUs", "batch", "runs", "tau", "regret", "model's pick", "measured best"
    );
    for w in &s.sweeps {
        println!(
            "  {:<7} {:>5} {:>6} {:>5} {:>6} {:>7.1}%  {:<24} {:<24}",
            w.model,
            w.gpus,
            w.global_batch,
            w.runs,
            w.kendall_tau.map_or("-".to_string(), |t| format!("{t:.2}")),
            100.0 * w.pick_regret,
            w.pick,
            w.best
        );
    }
}

fn print_runs(predictions: &[Prediction]) {
    println!(
        "  {:>4} {:<6} {:>5} {:>3} {:>3} {:>4} {:>3} {:>11} {:>11} {:>9}   {:>8} {:>8} {:>8} {:>8} {:>8}",
        "line",
        "model",
        "GPUs",
        "tp",
        "pp",
        "dp",
        "mb",
        "measured",
        "predicted",
        "error",
        "compute",
        "tp comm",
        "p2p",
        "dp sync",
        "optim"
    );
    for p in predictions {
        let r = &p.run;
        let t = &p.terms;
        println!(
            "  {:>4} {:<6} {:>5} {:>3} {:>3} {:>4} {:>3} {:>9.1}ms {:>9.1}ms {:>9}   {:>8.0} {:>8.0} {:>8.0} {:>8.0} {:>8.0}",
            r.line,
            r.model_label(),
            r.gpus,
            r.tp,
            r.pp,
            r.dp,
            r.micro_batch,
            r.measured_ms,
            p.predicted_ms,
            pct(p.error),
            t.compute_ms,
            t.tp_comm_ms,
            t.pipeline_p2p_ms,
            t.data_parallel_ms,
            t.optimizer_ms
        );
    }
}

fn run(o: &Options) -> Result<(), String> {
    let cluster = ClusterProfile::load(&o.cluster).map_err(|e| e.to_string())?;
    let single = load_runs(&o.data.join("ground_truth_single.csv"), &o.assumptions)?;
    let multi = load_runs(&o.data.join("ground_truth_multi.csv"), &o.assumptions)?;
    println!(
        "time model {}, cluster {}, assumptions: vocabulary {}, {:?}, {}, {:?} attention",
        o.time_model,
        o.cluster.display(),
        o.assumptions.vocab_size,
        o.assumptions.precision,
        if o.assumptions.full_recompute {
            "full recomputation"
        } else {
            "no recomputation"
        },
        o.assumptions.attention
    );
    let mut modes = Vec::new();
    let mut wanted = Vec::new();
    if o.defaults {
        wanted.push("defaults");
    }
    if o.fit {
        wanted.push("fit");
    }
    for mode in wanted {
        let fit = if mode == "fit" {
            Some(fit_calibration(
                &single,
                &cluster,
                &o.calibration,
                o.time_model,
            )?)
        } else {
            None
        };
        let calibration = fit
            .as_ref()
            .map_or_else(|| o.calibration.clone(), |f| f.calibration.clone());
        let multi_predictions = predict(&multi, &cluster, &calibration, o.time_model)?;
        let single_predictions = predict(&single, &cluster, &calibration, o.time_model)?;
        let single_score = score(&single_predictions);
        let multi_score = score(&multi_predictions);
        println!();
        match &fit {
            None => println!("== defaults: nothing fitted =="),
            Some(f) => println!(
                "== fit on the {} one-node runs: {} (rms ln error there {:.3}) ==",
                f.runs,
                f.fitted
                    .iter()
                    .map(|(k, v)| format!("{k} = {v:.4}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                f.rms_log_error
            ),
        }
        if !o.quiet {
            print_runs(&multi_predictions);
        }
        print_sweeps(&multi_score);
        print_score("single (one node)", &single_score);
        print_score("multi (reported)", &multi_score);
        modes.push(ModeReport {
            mode,
            fit,
            calibration,
            multi: multi_score,
            single: single_score,
            multi_runs: multi_predictions,
            single_runs: single_predictions,
        });
    }
    let moe = match &o.moe_data {
        Some(path) => {
            let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
            let h100 = ClusterProfile::load(root.join("examples/clusters/h100-128x8.json"))
                .map_err(|e| e.to_string())?;
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let dev = validate_dev_set(&text, &h100, &o.calibration)?;
            println!("\n{}", dev.render());
            Some(dev)
        }
        None => None,
    };
    let report = Report {
        time_model: o.time_model,
        cluster: o.cluster.display().to_string(),
        assumptions: o.assumptions.clone(),
        modes,
        moe,
    };
    let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    if o.json == "-" {
        println!("{json}");
    } else {
        std::fs::write(&o.json, json + "\n")
            .map_err(|e| format!("cannot write {}: {e}", o.json))?;
        println!("\nJSON summary: {}", o.json);
    }
    Ok(())
}

fn main() -> ExitCode {
    match parse_options().and_then(|o| run(&o)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("validate_time_model: {e}");
            ExitCode::from(2)
        }
    }
}
