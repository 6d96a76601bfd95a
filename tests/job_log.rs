//! The job log tells the whole story (issue 14): a real launch, PyTorch's real torchrun on
//! CPU, three local "nodes" (`node-a`, `node-b`, `node-c`, all this machine through the
//! local transport) of two workers each training `examples/train_gpt.py` with the user's
//! own `--tensor-model-parallel-size 2`. One node is killed mid-run; the job re-plans on the
//! two others and finishes. What pipette-run itself printed (its `pipette-run:` lines and
//! the summary, not the nodes' prefixed lines) is snapshotted, times and paths filtered:
//! the plan report, the user's configuration costed beside ours, the re-plan's change
//! line, the progress lines written without a terminal, and the closing ledger, whose
//! parts must add up to the wall time (ledger.json) within 1 %.
//!
//! Holds on a busy machine: it waits for what the job prints, never for a fixed time.
//! Needs the venv of `scripts/setup-megatron-venv` (or `PIPETTE_MEGATRON_PYTHON`); fails,
//! never skips, without it.

mod common;

use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use common::{
    assert_no_process_left, cpu_job_command, cpu_profile, node_processes, torchrun, JobBuilder,
    Patience,
};

const HOSTS: [&str; 3] = ["node-a", "node-b", "node-c"];

#[test]
fn a_launch_tells_its_whole_story() {
    let mut job = JobBuilder::new(env!("CARGO_BIN_EXE_pipette-run"), "pipette-joblog-");
    let save = job.dir().join("save");
    job.args(["--no-trial", "--launcher", "local"])
        .cpu_cluster(&HOSTS, 2)
        .hosts(&HOSTS, 2)
        .launch_basics(&common::torchrun())
        .args(["--grace", "3s", "--health-timeout", "15s"])
        .args(["--stall-timeout", "60s", "--progress-interval", "1s"])
        .arg("examples/train_gpt.py")
        .args(common::tiny_gpt_args(20, 4))
        .arg("--save")
        .arg(save)
        .args(["--tensor-model-parallel-size", "2"]);
    let mut job = job.spawn();
    // Between two checkpoints (4 and 8): node-b dies, the job re-plans on two nodes.
    job.wait_for_iteration(6, Patience::total(Duration::from_secs(300)));
    let procs = node_processes(&job.marker(), "node-b");
    assert!(
        procs.len() >= 3,
        "node-b runs torchrun and two workers: {procs:?}"
    );
    for p in &procs {
        kill(Pid::from_raw(p.pid), Signal::SIGKILL).unwrap();
    }
    let status = job.wait(Patience::total(Duration::from_secs(400)));
    let stderr = job.read("stderr");
    assert!(status.success(), "{status}:\n{stderr}");
    assert_no_process_left(&job.marker());

    // Ours only: the nodes' lines are prefixed `[host rN]`. Every line of ours before the
    // summary carries its time stamp; the rest of the test reads them without it.
    let stamped: Vec<&str> = stderr.lines().filter(|l| !l.starts_with('[')).collect();
    let summary_at = stamped
        .iter()
        .position(|l| *l == "pipette-run: summary")
        .expect("a summary");
    for line in &stamped[..summary_at] {
        assert!(common::is_stamped(line), "no time stamp: {line:?}");
        assert!(line.chars().count() <= 80, "over 80 columns: {line:?}");
    }
    let unstamped = common::unstamped_log(&stamped.join("\n"));
    let ours: Vec<&str> = unstamped.lines().collect();
    assert_eq!(ours.len(), stamped.len());
    let log = ours.join("\n");
    // A peer that fails moments after node-b (its collectives broke) is a consequence:
    // whether one is seen in the same poll is the machine's timing.
    let peer = regex::Regex::new(r"^pipette-run: warning: node-[ac] \(node rank").unwrap();
    let consequence = |line: &str| peer.is_match(line);
    // Progress comes once a second: how many lines is the machine's timing. Each
    // attempt's first stays in the snapshot; all must fit 80 columns.
    let progress: Vec<&str> = (0..ours.len())
        .filter(|&i| {
            ours[i].starts_with("pipette-run: iteration ") || ours[i].contains("tokens/s per GPU")
        })
        .map(|i| stamped[i])
        .collect();
    assert!(!progress.is_empty(), "no progress line:\n{log}");
    let mut progress_this_attempt = false;
    // Inside a progress line (its continuations start `pipette-run:   `): whether kept.
    let mut in_progress: Option<bool> = None;
    let mut shown: Vec<&str> = Vec::new();
    let mut skipping = false;
    for line in &ours {
        if line.starts_with("pipette-run: attempt ") {
            progress_this_attempt = false;
        }
        if line.starts_with("pipette-run: iteration ") {
            let keep = !progress_this_attempt;
            progress_this_attempt = true;
            in_progress = Some(keep);
            if keep {
                shown.push(line);
            }
            continue;
        }
        if let Some(keep) = in_progress {
            if line.starts_with("pipette-run:   ") {
                if keep {
                    shown.push(line);
                }
                continue;
            }
        }
        in_progress = None;
        // A peer's failure line, and its continuations (wrapped four columns deeper).
        if consequence(line) || (skipping && line.starts_with("pipette-run: warning:     ")) {
            skipping = true;
            continue;
        }
        skipping = false;
        shown.push(line);
    }

    // Everything of the plan report, the progress lines and the summary fits 80 columns,
    // time stamps included.
    let summary = job.read("run/summary.txt");
    for line in summary.lines().chain(progress.iter().copied()) {
        assert!(line.chars().count() <= 80, "over 80 columns: {line:?}");
    }
    let report_start = ours
        .iter()
        .position(|l| l.starts_with("pipette-run: Plan:"))
        .unwrap();
    let report_end = ours
        .iter()
        .position(|l| l.starts_with("pipette-run: run directory"))
        .unwrap();
    for line in &stamped[report_start..report_end] {
        assert!(line.chars().count() <= 80, "over 80 columns: {line:?}");
    }
    assert!(
        summary.lines().all(|l| stderr.contains(l)),
        "summary.txt is what was printed:\n{summary}"
    );

    // The ledger: its parts add up to the wall time (within 1 %; exactly, by
    // construction), and the training really was seen.
    let ledger: serde_json::Value = serde_json::from_str(&job.read("run/ledger.json")).unwrap();
    assert_eq!(ledger["schema"], "pipette-ledger/1");
    let wall = ledger["wall_s"].as_f64().unwrap();
    let parts = ledger["parts"].as_array().unwrap();
    let sum: f64 = parts.iter().map(|p| p["seconds"].as_f64().unwrap()).sum();
    assert!(
        (sum - wall).abs() <= 0.01 * wall,
        "parts {sum} s, wall {wall} s"
    );
    let part = |name: &str| {
        parts
            .iter()
            .find(|p| p["part"] == name)
            .and_then(|p| p["seconds"].as_f64())
            .unwrap()
    };
    for name in [
        "start-up",
        "training",
        "teardown",
        "restart",
        "failure detection",
    ] {
        assert!(part(name) > 0.0, "{name} took no time: {ledger}");
    }
    assert!(ledger["iteration"]["measured_ms"].as_f64().unwrap() > 0.0);

    let mut settings = insta::Settings::clone_current();
    let temp = job.marker();
    settings.add_filter(&regex::escape(&temp), "[TMP]");
    // Measured times, shares and rates vary with the machine; estimates do not.
    settings.add_filter(r"\d+ min( \d+ s)?", "[T] s");
    settings.add_filter(r"\d+(\.\d+)? s\b", "[T] s");
    settings.add_filter(r"(?m)^(    [a-z -]+?) +\[T\] s +\d+\.\d %$", "$1 [T] [%]");
    settings.add_filter(r"\d+\.\d+ % of the wall time", "[%] of the wall time");
    settings.add_filter(
        r"iteration \d+(\.\d+)? ms measured",
        "iteration [MS] ms measured",
    );
    settings.add_filter(r"\(\d+\.\d+× the estimate\)", "([R]× the estimate)");
    settings.add_filter(r"\d+ tokens/s per GPU", "[N] tokens/s per GPU");
    settings.add_filter(r"MFU \d+\.\d+ %", "MFU [%]");
    settings.add_filter(
        r"iteration \d+/20, \d+\.\d ms \(estimate",
        "iteration [I]/20, [MS] ms (estimate",
    );
    settings.add_filter(r"ms, ×\d+\.\d+\)", "ms, ×[R])");
    settings.add_filter(r"iterations \d+–\d+", "iterations [A]–[B]");
    settings.add_filter(r"at iteration \d+", "at iteration [K]");
    settings.add_filter(r"\(iteration \d+\)", "(iteration [K])");
    // The recovery's iterations left are the total less the checkpoint's iteration [K].
    settings.add_filter(r"per iteration \(\d+", "per iteration ([N]");
    // The same, when the line broke inside it.
    settings.add_filter(r"(?m)^(pipette-run: warning: +)\d+\)", "$1[K])");
    settings.add_filter(
        r"(?m)^(pipette-run: )?  [\d, ]*tokens/s.*$",
        "$1  [rates], ETA [T] s",
    );
    settings.bind(|| insta::assert_snapshot!(shown.join("\n")));
}

/// Every JSON output carries its schema's name and version; an error under `--json` is a
/// JSON object on stdout too (the message still on stderr).
#[test]
fn json_outputs_carry_their_schema_and_errors_are_json() {
    let run = |args: &[&str], run_dir: std::path::PathBuf| {
        cpu_job_command(env!("CARGO_BIN_EXE_pipette-run"))
            .args(args)
            .arg("--run-dir")
            .arg(run_dir)
            .args(["--dry-run", "--json"])
            .arg("examples/train_gpt.py")
            .args(common::tiny_gpt_args(20, 4))
            .output()
            .unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("cluster.json");
    std::fs::write(&profile, cpu_profile(&HOSTS, 2)).unwrap();
    let cluster = profile.display().to_string();
    let report = common::json_report(&run(&["--cluster", &cluster], dir.path().join("a")));
    assert_eq!(report["schema"], "pipette-dry-run/1");
    // The user wrote --micro-batch-size 1: costed beside the plan.
    assert_eq!(report["yours"]["yours"]["verdict"], "costed", "{report}");

    let missing = dir.path().join("missing.json").display().to_string();
    let out = run(&["--cluster", &missing], dir.path().join("b"));
    assert!(!out.status.success());
    let error: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    assert_eq!(error["schema"], "pipette-error/1");
    assert_eq!(error["exit_code"], out.status.code().unwrap());
    let message = error["error"].as_str().unwrap();
    assert!(message.contains("missing.json"), "{message}");
    assert!(String::from_utf8_lossy(&out.stderr).contains(message));

    // Errors found before the launch path (the command line, the environment, the env
    // file) are the same object, with their own exit code.
    let error_object = |out: &std::process::Output, code: i32| {
        assert_eq!(out.status.code(), Some(code), "{out:?}");
        let error: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {out:?}"));
        assert_eq!(error["schema"], "pipette-error/1");
        assert_eq!(error["exit_code"], code);
        let message = error["error"].as_str().unwrap().to_string();
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(&message),
            "{out:?}"
        );
        message
    };
    let message = error_object(&run(&["--seed", "many"], dir.path().join("c")), 2);
    assert!(message.contains("--seed"), "{message}");
    let with_env = |name: &str, value: &str, run_dir: &str| {
        cpu_job_command(env!("CARGO_BIN_EXE_pipette-run"))
            .env(name, value)
            .args(["--cluster", &cluster, "--dry-run", "--json", "--run-dir"])
            .arg(dir.path().join(run_dir))
            .arg("examples/train_gpt.py")
            .args(common::tiny_gpt_args(20, 4))
            .output()
            .unwrap()
    };
    let message = error_object(&with_env("PIPETTE_SEED", "many", "d"), 2);
    assert!(message.contains("PIPETTE_SEED"), "{message}");
    let message = error_object(&with_env("PIPETTE_LOG", "loud", "e"), 2);
    assert!(message.contains("PIPETTE_LOG=loud"), "{message}");
    let env_file = dir.path().join("missing.env").display().to_string();
    let message = error_object(&with_env("PIPETTE_ENV_FILE", &env_file, "f"), 2);
    assert!(message.contains("missing.env"), "{message}");
}

/// `-q` says no plan report, `-v` the dry run's whole report; the summary stays.
/// `PIPETTE_LOG` sets levels per target as `RUST_LOG` does. (A torchrun that fails at once:
/// what is printed before the launch is what is tested.)
#[test]
fn quiet_and_verbose_say_less_and_more() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("cluster.json");
    std::fs::write(&profile, cpu_profile(&HOSTS[..1], 2)).unwrap();
    let run = |flag: Option<&str>, filter: Option<&str>, name: &str| {
        let mut command = cpu_job_command(env!("CARGO_BIN_EXE_pipette-run"));
        command.env_remove("PIPETTE_LOG");
        if let Some(filter) = filter {
            command.env("PIPETTE_LOG", filter);
        }
        let out = command
            .args(flag)
            .args(["--no-trial", "--launcher", "local", "--max-replans", "0"])
            .arg("--cluster")
            .arg(&profile)
            .args(["--hosts", "node-a", "--nproc-per-node", "2"])
            .args(["--torchrun", "false", "--run-dir"])
            .arg(dir.path().join(name))
            .arg("examples/train_gpt.py")
            .args(common::tiny_gpt_args(4, 4))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "torchrun's code");
        String::from_utf8(out.stderr).unwrap()
    };
    let failure = "pipette-run: warning: node-a (node rank 0): torchrun exited";
    let plain = run(None, None, "plain");
    assert!(plain.contains("pipette-run: Plan: tp 1"), "{plain}");
    assert!(plain.contains("pipette-run:   yours: "), "{plain}");
    assert!(
        plain.contains("pipette-run: attempt 1: launching"),
        "{plain}"
    );
    assert!(plain.contains(failure), "{plain}");
    assert!(!plain.contains("Top configurations"), "{plain}");
    let quiet = run(Some("-q"), None, "quiet");
    assert!(
        !quiet.contains("Plan:") && !quiet.contains("yours") && !quiet.contains("launching"),
        "{quiet}"
    );
    assert!(quiet.contains(failure), "{quiet}");
    assert!(quiet.contains("pipette-run: summary"), "{quiet}");
    let verbose = run(Some("-v"), None, "verbose");
    assert!(
        verbose.contains("pipette-run: debug: the plan\n"),
        "{verbose}"
    );
    assert!(verbose.contains("\nPlan: tp 1"), "{verbose}");
    assert!(verbose.contains("\nTop configurations"), "{verbose}");
    assert!(verbose.contains("  yours: "), "{verbose}");
    assert!(verbose.contains("pipette-run: summary"), "{verbose}");
    // The plan's lines alone, beside warnings: no launch line.
    let plan_only = run(None, Some("warn,plan=info"), "plan-only");
    assert!(plan_only.contains("pipette-run: Plan: tp 1"), "{plan_only}");
    assert!(!plan_only.contains("launching"), "{plan_only}");
    assert!(plan_only.contains(failure), "{plan_only}");
    // The command line wins over the environment's bare level; a target's level stays.
    let quiet_plan = run(Some("-q"), Some("debug,plan=info"), "quiet-plan");
    assert!(
        quiet_plan.contains("pipette-run: Plan: tp 1"),
        "{quiet_plan}"
    );
    assert!(
        !quiet_plan.contains("launching") && !quiet_plan.contains("debug: "),
        "{quiet_plan}"
    );
}

/// The stamps and wrapping of our lines undone for tests that read them
/// (`common::unwrapped_log`): a continuation joins its line only at the same level and four
/// columns deeper; the nodes' lines pass as they are.
#[test]
fn unwrapped_log_takes_stamps_off_and_joins_continuations_only() {
    let log =
        "17:40:02Z pipette-run: warning: node-a (node rank 0): torchrun exited with (worker rank\n\
               17:40:02Z pipette-run: warning:     0 exited with 7)\n\
               [node-a r0] 17:40:02Z pipette-run:     not ours\n\
               17:40:03Z pipette-run:   layers per stage 2\n\
               17:40:03Z pipette-run:       wrapped deeper\n\
               17:40:03Z pipette-run: warning:       a warning is not a continuation\n\
               24:00:00Z pipette-run: not a stamp\n";
    assert_eq!(
        common::unwrapped_log(log),
        "pipette-run: warning: node-a (node rank 0): torchrun exited with (worker rank 0 exited with 7)\n\
         [node-a r0] 17:40:02Z pipette-run:     not ours\n\
         pipette-run:   layers per stage 2 wrapped deeper\n\
         pipette-run: warning:       a warning is not a continuation\n\
         24:00:00Z pipette-run: not a stamp"
    );
    assert!(common::is_stamped("23:59:59Z pipette: x") && !common::is_stamped("pipette: x"));
}

/// Without a terminal, profiling and the trial are not silent until they end: every
/// `--progress-interval` (1 s here) a plain line of ours names the phase, how far it got,
/// how long it has run and the time left. `pipette calibrate` without a cluster file
/// profiles two local "nodes" with the real probe, then runs the trial.
#[test]
fn profiling_and_the_trial_write_progress_lines_without_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let out = cpu_job_command(env!("CARGO_BIN_EXE_pipette"))
        .env("XDG_CACHE_HOME", dir.path().join("cache"))
        .env_remove("PIPETTE_LOG")
        .arg("calibrate")
        .arg("--out")
        .arg(dir.path().join("fit.json"))
        .args(["--hosts", "node-a,node-b", "--nproc-per-node", "1"])
        .args(["--launcher", "local", "--pin", "tp=1,pp=1,dp=2"])
        .arg("--torchrun")
        .arg(torchrun())
        .args(["--progress-interval", "1s", "--trial-iters", "8"])
        .arg("examples/train_gpt.py")
        .args(common::TINY_MODEL)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let line = regex::Regex::new(
        r"^pipette: (inventory|starting probe|GPU pairs|node pairs|compute|trial run) \d+/\d+, \d+ (s|min( \d+ s)?) elapsed, ETA (unknown|\d+ (s|min( \d+ s)?))$",
    )
    .unwrap();
    let unstamped = common::unstamped_log(&stderr);
    let progress: Vec<&str> = unstamped.lines().filter(|l| line.is_match(l)).collect();
    let profiling = progress.iter().filter(|l| !l.contains("trial run")).count();
    let trial = progress.iter().filter(|l| l.contains("trial run")).count();
    assert!(
        profiling > 0 && trial > 0,
        "profile and trial lines:\n{stderr}"
    );
    for raw in stderr.lines().filter(|l| l.contains(" elapsed, ETA ")) {
        assert!(common::is_stamped(raw), "{raw}");
        assert!(raw.chars().count() <= 80, "over 80 columns: {raw}");
    }
}
