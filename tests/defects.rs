//! Regression tests for the defects a bad-input probe found (issue 15), through the real
//! binaries: each named after its defect, each checking the exit code, that the message is
//! one line naming what is wrong, and that nothing ran. Unit-level tests of the same
//! defects sit beside the code (`defect_NN_*` in src/).

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use serde_json::Value;

mod common;

use common::TINY_MODEL;

/// `pipette-run` with an empty environment, run in `dir` (default run directories go
/// there).
fn pipette_run(dir: &Path) -> Command {
    let mut cmd = Command::cargo_bin("pipette-run").expect("binary built");
    cmd.env_clear().current_dir(dir);
    cmd
}

fn pipette() -> Command {
    let mut cmd = Command::cargo_bin("pipette").expect("binary built");
    cmd.env_clear();
    cmd
}

fn cluster_file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/clusters/a100-2x8.json")
}

/// Runs `cmd`, checks the exit code and that stderr is one line holding every one of
/// `needles` and no control character; returns stderr.
fn fails(cmd: &mut Command, code: i32, needles: &[&str]) -> String {
    let out = cmd.output().expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(code), "stderr: {stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "{needle:?} not in: {stderr}");
    }
    // One line, and for a malformed command line clap's pointer to --help.
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && *l != "For more information, try '--help'.")
        .collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(
        !stderr.lines().any(|l| l.chars().any(char::is_control)),
        "{stderr:?}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

/// Runs `cmd` and checks that it succeeded; returns its output.
fn succeeds(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn dry_run_json(cmd: &mut Command) -> Value {
    common::json_report(&cmd.output().expect("runs"))
}

fn hosts(report: &Value) -> Vec<String> {
    common::report_hosts(report)
}

/// A dry run of the tiny model in `dir` with `args` before SCRIPT.
fn dry_run(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = pipette_run(dir);
    cmd.args(args)
        .args(["--dry-run", "train.py"])
        .args(TINY_MODEL);
    cmd
}

/// A dry run in `dir` on a hostfile holding `text`.
fn hostfile_dry_run(dir: &Path, text: &str) -> Command {
    let hostfile = dir.join("hostfile");
    std::fs::write(&hostfile, text).unwrap();
    dry_run(dir, &["--hostfile", hostfile.to_str().unwrap()])
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn defect_01_huge_duration_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    for option in [
        "--trial-timeout",
        "--grace",
        "--stall-timeout",
        "--startup-timeout",
        "--health-timeout",
    ] {
        fails(
            &mut dry_run(dir.path(), &[option, "18446744073709551616"]),
            2,
            &[option, "too long to be a duration"],
        );
    }
    fails(
        dry_run(dir.path(), &[]).env("PIPETTE_STALL_TIMEOUT", "99999999999999999999h"),
        2,
        &["PIPETTE_STALL_TIMEOUT", "too long"],
    );
}

#[test]
fn defect_02_huge_global_batch_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    fails(
        pipette_run(dir.path())
            .arg("--cluster")
            .arg(cluster_file())
            .args(["--dry-run", "train.py"])
            .args(TINY_MODEL)
            .args(["--global-batch-size", "18446744073709551615"]),
        65,
        &["--global-batch-size 18446744073709551615", "2^24"],
    );
}

/// 100k hostfile lines took 7.6 s and 1M more than 120 s (the duplicate check compared
/// every host with every earlier one). Not timed: 200,000 lines must come out right, and
/// the quadratic check would take minutes at this size.
#[test]
fn defect_03_a_200k_line_hostfile_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let hostfile = dir.path().join("hostfile");
    let text: String = (0..200_000).map(|i| format!("n{i} slots=8\n")).collect();
    std::fs::write(&hostfile, text).unwrap();
    let out = succeeds(pipette().args(["discover", "--hostfile"]).arg(&hostfile));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 200_000);
    assert_eq!(stdout.lines().last(), Some("n199999 slots=8"));
}

/// One 50 MB host name took more than 120 s (it was built into the dry run's table).
#[test]
fn defect_04_a_50_mb_host_name_is_refused_with_a_short_message() {
    let dir = tempfile::tempdir().unwrap();
    let stderr = fails(
        &mut hostfile_dry_run(dir.path(), &format!("{} slots=8\n", "h".repeat(50 << 20))),
        66,
        &["line 1", "253 a DNS name may have"],
    );
    assert!(stderr.len() < 600, "{} bytes", stderr.len());
}

/// A 10,000-node profile took more than 120 s and 4.5 GB: the probe measured every node
/// pair and the profile kept a 10^8-cell node matrix. Now the probe measures a ring sample
/// above 32 nodes, and the profile keeps a figure per node plus the measured pairs. Not
/// timed: the sizes must be linear, and a profile that size must read, validate and write
/// back through the real binary with its slow node found.
#[test]
fn defect_05_a_10k_node_profile_is_linear_in_its_nodes() {
    use pipette::cluster::profile::{LinkMatrix, Provenance, Source};
    use pipette::measure::NodePairs;

    let n = 10_000;
    let pairs = NodePairs::for_nodes(n).pairs(n);
    assert!(pairs.len() <= 3 * n, "{} node pairs probed", pairs.len());
    assert_eq!(
        NodePairs::for_nodes(32).pairs(32).len(),
        32 * 31 / 2,
        "small clusters: every pair, as before"
    );

    // What the probe measures on 10,000 nodes, node 77's links slow.
    let figure = |a: usize, b: usize| if a == 77 || b == 77 { 1.0 } else { 20.0 };
    let measured: Vec<(usize, usize, f64)> = pairs
        .iter()
        .flat_map(|&(a, b)| [(a, b, figure(a, b)), (b, a, figure(a, b))])
        .collect();
    let mut per_node = vec![20.0; n];
    per_node[77] = 1.0;
    let links = LinkMatrix::sampled(
        per_node,
        measured,
        Provenance::new(Source::Measured).with_date("2026-11-24"),
    )
    .unwrap();
    assert!(
        links.stored_figures() <= 7 * n,
        "{} figures",
        links.stored_figures()
    );
    assert_eq!(
        links.get(77, 5_000),
        1.0,
        "an unmeasured pair of the slow node"
    );
    assert_eq!(links.get(3, 5_000), 20.0);

    let nodes: Vec<Value> = (0..n)
        .map(|i| serde_json::json!({"host": format!("n{i:05}"), "gpus": "unknown"}))
        .collect();
    let mut doc = serde_json::json!({"schema": "pipette-cluster/1", "nodes": nodes});
    doc["node_links"] = serde_json::json!({
        "provenance": {"source": "measured", "date": "2026-11-24"},
        "node_gb_per_s": links.per_endpoint().unwrap(),
        "pairs": links.links().map(|(a, b, v)| serde_json::json!([a, b, v])).collect::<Vec<_>>(),
    });
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cluster-10k.json");
    std::fs::write(&file, doc.to_string()).unwrap();
    let size = std::fs::metadata(&file).unwrap().len();
    // A full matrix would be 10^8 cells, over 400 MB.
    assert!(size < 1_000 * n as u64, "{size} bytes for {n} nodes");

    let out = succeeds(pipette().arg("cluster").arg(&file));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("valid, 10000 nodes"), "{stdout}");
    assert!(
        stdout.contains("node-to-node bandwidth 1.00–20.00 GB/s"),
        "{stdout}"
    );

    let out = succeeds(pipette().args(["cluster", "--json"]).arg(&file));
    assert!(
        out.stdout.len() < 1_000 * n,
        "{} bytes written",
        out.stdout.len()
    );
    let written: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        written["node_links"]["node_gb_per_s"]
            .as_array()
            .unwrap()
            .len(),
        n
    );
    assert!(written["node_links"].get("gb_per_s").is_none());
}

#[test]
fn defect_06_include_and_exclude_filter_the_cluster_file_s_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let run = |filter: [&str; 2]| {
        dry_run_json(
            pipette_run(dir.path())
                .arg("--cluster")
                .arg(cluster_file())
                .args(filter)
                .args(["--dry-run", "--json", "train.py"])
                .args(TINY_MODEL),
        )
    };
    assert_eq!(hosts(&run(["--include", "a100-n01"])), ["a100-n01"]);
    assert_eq!(hosts(&run(["--exclude", "a100-n00"])), ["a100-n01"]);
    let report = run(["--include", "a100-n00:0,1"]);
    assert_eq!(hosts(&report), ["a100-n00"]);
    assert_eq!(report["nodes"]["world_size"], 2);
}

/// `--include a100-n00:99` exited 67, blaming the cluster file.
#[test]
fn defect_12_an_unknown_slot_is_a_node_list_error() {
    let dir = tempfile::tempdir().unwrap();
    fails(
        pipette_run(dir.path())
            .arg("--cluster")
            .arg(cluster_file())
            .args(["--include", "a100-n00:99", "--dry-run", "train.py"])
            .args(TINY_MODEL),
        66,
        &["--include", "no slot 99"],
    );
}

/// Two launches in the same second got the same default directory; the second failed
/// with "choose another --run-dir", a flag it was never given.
#[test]
fn defect_07_default_run_directories_never_collide() {
    let dir = tempfile::tempdir().unwrap();
    let dry_run = || {
        dry_run_json(
            pipette_run(dir.path())
                .arg("--cluster")
                .arg(cluster_file())
                .env("SLURM_JOB_ID", "981")
                .env("SLURM_JOB_NODELIST", "a100-n[00-01]")
                .args(["--dry-run", "--json", "train.py"])
                .args(TINY_MODEL),
        )["run_dir"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let first = dry_run();
    let second = dry_run();
    assert_ne!(first, second);
    let made = entries(&dir.path().join("pipette-runs"));
    assert_eq!(made.len(), 2, "{made:?}");
    // <local date-time>-<job id>, e.g. 2026-11-24T10-31-05-981.
    let name = Path::new(&first).file_name().unwrap().to_str().unwrap();
    let shape = regex_lite(name);
    assert!(shape, "{name}");
}

/// `YYYY-MM-DDTHH-MM-SS-981`, optionally numbered.
fn regex_lite(name: &str) -> bool {
    let bytes = name.as_bytes();
    let digits = |range: std::ops::Range<usize>| bytes[range].iter().all(u8::is_ascii_digit);
    bytes.len() >= 23
        && digits(0..4)
        && bytes[4] == b'-'
        && digits(5..7)
        && bytes[7] == b'-'
        && digits(8..10)
        && bytes[10] == b'T'
        && digits(11..13)
        && digits(14..16)
        && digits(17..19)
        && name[19..].starts_with("-981")
}

/// `--run-dir` took an existing directory and wrote into it until a file clashed; a dry
/// run's directory then made the real run fail with "File exists".
#[test]
fn defect_08_an_existing_run_dir_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let with_run_dir = |dry: bool| {
        let mut cmd = pipette_run(dir.path());
        cmd.arg("--cluster")
            .arg(cluster_file())
            .arg("--run-dir")
            .arg(&run_dir)
            .args(["--no-trial", "--torchrun", "/nonexistent/torchrun"]);
        if dry {
            cmd.arg("--dry-run");
        }
        cmd.arg("train.py").args(TINY_MODEL);
        cmd
    };
    with_run_dir(true).assert().success();
    let written = entries(&run_dir);
    assert!(written.contains(&"plan.json".to_string()), "{written:?}");
    // The launch after the dry run: refused at once, the dry run's files untouched.
    fails(
        &mut with_run_dir(false),
        2,
        &["already exists", "remove it, or choose another --run-dir"],
    );
    assert_eq!(entries(&run_dir), written);
    fails(&mut with_run_dir(true), 2, &["already exists"]);
    assert_eq!(entries(&run_dir), written);
}

#[test]
fn defect_09_control_characters_in_a_hostfile_are_refused_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    fails(
        &mut hostfile_dry_run(
            dir.path(),
            "good slots=8\nevil\u{1b}]2;owned\u{7} slots=8\n",
        ),
        66,
        &["line 2", "control character"],
    );
    fails(
        &mut hostfile_dry_run(dir.path(), "localhost:2\n"),
        66,
        &["\"localhost slots=2\""],
    );
}

#[test]
fn defect_10_negative_numbers_get_their_valid_range() {
    let dir = tempfile::tempdir().unwrap();
    for (option, value, range) in [
        ("--seed", "-1", "from 0 to 18446744073709551615"),
        ("--max-replans", "-1", "from 0 to 4294967295"),
        ("--memory-headroom", "-0.1", "a fraction from 0"),
        ("--budget", "-5", "from 0 to"),
        ("--master-port", "-1", "from 1 to 65535"),
        ("--nproc-per-node", "-2", "from 1 to 1024"),
    ] {
        let stderr = fails(
            &mut dry_run(dir.path(), &[option, value]),
            2,
            &[option, range],
        );
        assert!(!stderr.contains("-- -1"), "{stderr}");
    }
}

#[test]
fn defect_11_environment_errors_name_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let stderr = fails(
        dry_run(dir.path(), &[]).env("PET_NNODES", "abc"),
        2,
        &["PET_NNODES=\"abc\"", "fix or unset PET_NNODES"],
    );
    assert!(!stderr.contains("for '--nnodes"), "{stderr}");
    fails(
        dry_run(dir.path(), &[]).env("PIPETTE_CLUSTER", ""),
        2,
        &["PIPETTE_CLUSTER", "set but empty"],
    );
    // Typed on the command line, the flag is named as before.
    fails(
        pipette_run(dir.path())
            .env("PET_NNODES", "abc")
            .args(["--nnodes", "x", "--dry-run", "train.py"])
            .args(TINY_MODEL),
        2,
        &["--nnodes"],
    );
}

#[test]
fn defect_12_a_cluster_file_with_a_byte_order_mark_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = vec![0xef, 0xbb, 0xbf];
    text.extend(std::fs::read(cluster_file()).unwrap());
    let path = dir.path().join("bom.json");
    std::fs::write(&path, text).unwrap();
    pipette().arg("cluster").arg(&path).assert().success();
}

#[test]
fn defect_13_slurm_job_id_without_a_node_list_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    fails(
        dry_run(dir.path(), &[])
            .env("SLURM_JOB_ID", "4242")
            .env("SLURM_JOB_NODELIST", ""),
        66,
        &[
            "SLURM_JOB_ID=4242",
            "SLURM_JOB_NODELIST",
            "unset SLURM_JOB_ID",
        ],
    );
}

#[test]
fn defect_14_impossible_sizes_are_capped() {
    let dir = tempfile::tempdir().unwrap();
    fails(
        &mut dry_run(dir.path(), &["--nproc-per-node", "99999"]),
        2,
        &["--nproc-per-node", "more than 1024"],
    );
    fails(
        &mut hostfile_dry_run(dir.path(), "a slots=1000000\n"),
        66,
        &["slots=1000000", "1024"],
    );
}

/// A missing torchrun surfaced after profiling as exit 68, "could not be reached".
#[test]
fn a_missing_torchrun_is_its_own_exit_code_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    fails(
        pipette_run(dir.path())
            .env("PATH", "/nonexistent")
            .args(["--nproc-per-node", "1", "train.py"])
            .args(TINY_MODEL),
        71,
        &[
            "torchrun not found",
            "\"torchrun\" is not on PATH",
            "--torchrun",
        ],
    );
    fails(
        pipette_run(dir.path())
            .args(["--torchrun", "/nonexistent/torchrun", "train.py"])
            .args(TINY_MODEL),
        71,
        &["\"/nonexistent/torchrun\" is not an executable file"],
    );
    // Nothing ran: no profile, no run directory.
    assert_eq!(entries(dir.path()), Vec::<String>::new());
}

/// PBS node files with one line per node read as one GPU per node, 7 of 8 idle.
#[test]
fn pbs_slots_that_disagree_with_the_profile_give_way_to_its_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let nodefile = dir.path().join("nodes");
    std::fs::write(&nodefile, "a100-n00\na100-n01\n").unwrap();
    let report = dry_run_json(
        pipette_run(dir.path())
            .env("PBS_NODEFILE", &nodefile)
            .arg("--cluster")
            .arg(cluster_file())
            .args(["--dry-run", "--json", "train.py"])
            .args(TINY_MODEL),
    );
    assert_eq!(report["nodes"]["world_size"], 16);
    let warnings = report["nodes"]["warnings"].to_string();
    assert!(warnings.contains("using the 8 GPUs"), "{warnings}");
}

#[test]
fn short_help_leaves_torchrun_options_to_long_help() {
    let dir = tempfile::tempdir().unwrap();
    let short = pipette_run(dir.path()).arg("-h").output().unwrap();
    let long = pipette_run(dir.path()).arg("--help").output().unwrap();
    assert!(short.status.success() && long.status.success());
    let (short, long) = (
        String::from_utf8(short.stdout).unwrap(),
        String::from_utf8(long.stdout).unwrap(),
    );
    assert!(!short.contains("--rdzv-endpoint"), "{short}");
    assert!(short.contains("--help lists them all"), "{short}");
    assert!(long.contains("--rdzv-endpoint"));
    // torchrun's thirty options were most of -h's 244 lines.
    let (short_lines, long_lines) = (short.lines().count(), long.lines().count());
    assert!(
        short_lines * 2 < long_lines,
        "{short_lines} of {long_lines}"
    );
    // A screenful: each option's first clause (it was 189 lines), no line over 100 columns;
    // --help keeps the rest, the variables and what each exit code means.
    assert!(short_lines <= 100, "-h is {short_lines} lines:\n{short}");
    for text in [&short, &long] {
        let wide: Vec<&str> = text.lines().filter(|l| l.chars().count() > 100).collect();
        assert!(wide.is_empty(), "{wide:#?}");
    }
    assert!(short.contains("--dry-run        Show what would run (nodes, model, settings, plan, commands) and launch"), "{short}");
    assert!(!short.contains("PIPETTE_CLUSTER") && long.contains("[env: PIPETTE_CLUSTER]"));
    assert!(short.contains("Exit codes: 0, 2, 65,") && long.contains("malformed command line"));
    assert!(long.contains("profiles are cached under ~/.cache/pipette-run/profiles"));
}

#[test]
fn completions_and_man_page_are_printed() {
    for shell in ["bash", "zsh", "fish"] {
        let out = pipette().args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("pipette-run"));
        let out = pipette()
            .args(["completions", shell, "--program", "pipette"])
            .output()
            .unwrap();
        assert!(String::from_utf8_lossy(&out.stdout).contains("calibrate"));
    }
    pipette().args(["completions", "tcsh"]).assert().code(2);
    let out = pipette().arg("man").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(".TH pipette-run"));
}

// The second probe (issue 33): its classes N1–N17, each test named after its class.

/// N1: 2^63 s up to just under 2^64 s passed parsing and panicked where the timeout was
/// added to an `Instant` (exit 101, and a panicked teardown thread).
#[test]
fn n1_a_duration_an_instant_cannot_hold_is_refused_at_parse_time() {
    let dir = tempfile::tempdir().unwrap();
    for option in [
        "--grace",
        "--stall-timeout",
        "--startup-timeout",
        "--health-timeout",
        "--straggler-cooldown",
        "--progress-interval",
    ] {
        for huge in ["9223372036854775808", "18446744073709551615"] {
            fails(
                &mut dry_run(dir.path(), &[option, huge]),
                2,
                &[option, "too long to be a duration", "at most 10 years"],
            );
        }
    }
    assert_eq!(entries(dir.path()), Vec::<String>::new());
}

/// N11: `pipette estimate --pp 4294967295` aborted allocating 34 GB (exit 134); a count
/// that sizes a list is now checked before the list is built.
#[test]
fn n11_counts_that_size_an_allocation_are_checked_first() {
    fails(
        pipette()
            .args(["estimate", "--pp", "4294967295", "--"])
            .args(TINY_MODEL),
        2,
        &["--pp 4294967295", "more than the model's 4 layers"],
    );
    let mut layers: Vec<&str> = TINY_MODEL.to_vec();
    layers[1] = "4294967295";
    fails(
        pipette()
            .args(["estimate", "--pp", "4294967295", "--"])
            .args(&layers),
        65,
        &["--num-layers 4294967295", "65536"],
    );
}

/// N11: `--vpp` was taken unchecked by `pipette estimate` (any value, any pp).
#[test]
fn n11_estimate_checks_the_interleaved_schedule() {
    for (args, needle) in [
        (["--pp", "2", "--vpp", "2"], "needs --pp above 2"),
        (["--pp", "4", "--vpp", "4294967295"], "does not divide"),
    ] {
        fails(
            pipette()
                .arg("estimate")
                .args(args)
                .arg("--")
                .args(TINY_MODEL),
            2,
            &[needle, "interleaved schedule"],
        );
    }
}

/// N12: `--budget` had no cap (a typing mistake never finished).
#[test]
fn n12_the_annealing_budget_is_capped() {
    let dir = tempfile::tempdir().unwrap();
    fails(
        &mut dry_run(dir.path(), &["--budget", "10000001"]),
        2,
        &["--budget", "from 0 to 10000000"],
    );
}

/// N2: a prime global batch of 4,194,301 (as many micro-batches) took 171 s and wrote a
/// 5.5 GB timeline picture. The timeline now draws the first whole groups of pp and says
/// so; the dry run finishes in seconds.
#[test]
fn n2_a_prime_global_batch_draws_a_bounded_timeline() {
    let dir = tempfile::tempdir().unwrap();
    let mut model: Vec<&str> = TINY_MODEL.to_vec();
    let at = model
        .iter()
        .position(|a| *a == "--global-batch-size")
        .unwrap();
    model[at + 1] = "4194301";
    let at = model
        .iter()
        .position(|a| *a == "--micro-batch-size")
        .unwrap();
    model[at + 1] = "1";
    let run = dir.path().join("run");
    succeeds(
        pipette_run(dir.path())
            .arg("--cluster")
            .arg(cluster_file())
            .arg("--run-dir")
            .arg(&run)
            .args(["--dry-run", "train.py"])
            .args(&model),
    );
    let timeline = std::fs::read_to_string(run.join("timeline.svg")).unwrap();
    assert!(timeline.len() < 4 << 20, "{} bytes", timeline.len());
    assert!(
        timeline.contains("of 4194301 micro-batches"),
        "the picture says it is cut"
    );
}

/// N3: a cluster file's nodes were looked up one by one (100,000 nodes: 92 s). Not timed:
/// the quadratic lookup would take minutes at this size.
#[test]
fn n3_a_100k_node_cluster_file_is_looked_up_by_hash() {
    let dir = tempfile::tempdir().unwrap();
    let n = 100_000;
    let nodes: Vec<Value> = (0..n)
        .map(|i| serde_json::json!({"host": format!("n{i:06}"), "gpus": "unknown"}))
        .collect();
    let pairs: Vec<Value> = (0..n)
        .map(|i| serde_json::json!([i, (i + 1) % n, 20.0]))
        .collect();
    let doc = serde_json::json!({
        "schema": "pipette-cluster/1",
        "nodes": nodes,
        "node_links": {
            "provenance": {"source": "measured", "date": "2026-11-24"},
            "node_gb_per_s": vec![20.0; n],
            "pairs": pairs,
        },
    });
    let file = dir.path().join("cluster.json");
    std::fs::write(&file, doc.to_string()).unwrap();
    let hostfile = dir.path().join("hostfile");
    let text: String = (0..n).map(|i| format!("n{i:06} slots=1\n")).collect();
    std::fs::write(&hostfile, text).unwrap();
    // Every host is found in the file; the first without a GPU inventory is named.
    fails(
        &mut dry_run(
            dir.path(),
            &[
                "--cluster",
                file.to_str().unwrap(),
                "--hostfile",
                hostfile.to_str().unwrap(),
            ],
        ),
        67,
        &["node n000000 has no GPU inventory"],
    );
}

/// N10: any input-file option pointed at `/dev/zero` read until memory ran out.
#[test]
fn n10_an_input_file_must_be_a_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    for (option, code) in [
        ("--cluster", 67),
        ("--hostfile", 66),
        ("--config", 2),
        ("--env-file", 2),
    ] {
        fails(
            &mut dry_run(dir.path(), &[option, "/dev/zero"]),
            code,
            &["/dev/zero", "is not a regular file"],
        );
    }
    fails(
        dry_run(dir.path(), &[])
            .env("PBS_JOBID", "1")
            .env("PBS_NODEFILE", "/dev/zero"),
        66,
        &["PBS_NODEFILE", "is not a regular file"],
    );
    fails(
        pipette()
            .args(["estimate", "--calibration", "/dev/zero", "--"])
            .args(TINY_MODEL),
        2,
        &["--calibration /dev/zero", "is not a regular file"],
    );
    assert_eq!(entries(dir.path()), Vec::<String>::new());
}

/// N4: raw control characters reached the terminal from GPU names, `SLURM_JOB_ID` (also
/// into the launch scripts), `--include`, `PIPETTE_LOG` and TOML error snippets. Each is
/// now escaped or refused; `fails` checks that stderr holds no control character.
#[test]
fn n4_strings_from_input_are_escaped_before_printing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let esc = "\u{1b}[2J\u{1b}[31m";
    let hostfile = d.join("hosts");
    std::fs::write(&hostfile, "a slots=1\n").unwrap();
    fails(
        &mut dry_run(
            d,
            &[
                "--hostfile",
                hostfile.to_str().unwrap(),
                "--include",
                &format!("a{esc}"),
            ],
        ),
        66,
        &["--include", "\\u{1b}[2J"],
    );
    fails(
        dry_run(d, &[]).env("PIPETTE_LOG", format!("debug{esc}")),
        2,
        &["PIPETTE_LOG", "\\u{1b}[31m"],
    );
    let config = d.join("site.toml");
    std::fs::write(&config, format!("launcher = \"ssh{esc}\"\n")).unwrap();
    fails(
        &mut dry_run(d, &["--config", config.to_str().unwrap()]),
        2,
        &["site.toml", "TOML parse error"],
    );
    fails(
        dry_run(d, &[])
            .env("SLURM_JOB_ID", format!("42{esc}"))
            .env("SLURM_JOB_NODELIST", "a"),
        66,
        &[
            "SLURM_JOB_ID",
            "holds a blank, control or invisible character",
        ],
    );
    let mut profile: Value =
        serde_json::from_str(&std::fs::read_to_string(cluster_file()).unwrap()).unwrap();
    profile["nodes"][0]["gpus"][0]["name"] = Value::from(format!("A100{esc}"));
    let file = d.join("cluster.json");
    std::fs::write(&file, profile.to_string()).unwrap();
    fails(
        &mut dry_run(d, &["--cluster", file.to_str().unwrap()]),
        67,
        &[
            "nodes[0].gpus[0].name",
            "control or invisible format character",
        ],
    );
}

/// N5: bidi and zero-width characters were accepted in host names, and `nodeA`/`NODEA`
/// and `x`/`x.` were two nodes. Host names are compared case-insensitively without a
/// trailing dot, everywhere (lists, filters, cluster files).
#[test]
fn n5_a_host_is_one_host_whatever_its_case_or_trailing_dot() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for invisible in ["\u{202e}", "\u{200b}", "\u{feff}"] {
        fails(
            &mut hostfile_dry_run(d, &format!("a{invisible}b slots=1\n")),
            66,
            &["invisible Unicode format character"],
        );
    }
    fails(
        &mut hostfile_dry_run(d, "nodeA slots=1\nNODEA. slots=1\n"),
        66,
        &["\"NODEA.\" is already listed on line 1"],
    );
    fails(
        &mut dry_run(d, &["--hosts", "x,X."]),
        66,
        &["listed twice in --hosts"],
    );
    // The cluster file's a100-n00 and a100-n01 are the hostfile's A100-N00. and A100-N01.
    let hostfile = d.join("hosts");
    std::fs::write(&hostfile, "A100-N00. slots=8\nA100-N01 slots=8\n").unwrap();
    let report = dry_run_json(
        pipette_run(d)
            .arg("--cluster")
            .arg(cluster_file())
            .arg("--hostfile")
            .arg(&hostfile)
            .args(["--dry-run", "--json", "train.py"])
            .args(TINY_MODEL),
    );
    let mut shown = hosts(&report);
    shown.sort();
    assert_eq!(shown, ["A100-N00.", "A100-N01"]);
    // --exclude names a host as the list does not spell it.
    let report = dry_run_json(
        pipette_run(d)
            .arg("--cluster")
            .arg(cluster_file())
            .args(["--hosts", "a100-n00,a100-n01", "--exclude", "A100-N01."])
            .args(["--dry-run", "--json", "train.py"])
            .args(TINY_MODEL),
    );
    assert_eq!(hosts(&report), ["a100-n00"]);
}

/// N13: a calibration file's factors were taken as they were: negative, 1e308, unknown
/// fields, `[]`.
#[test]
fn n13_a_calibration_file_is_fully_validated() {
    let dir = tempfile::tempdir().unwrap();
    for (text, needle) in [
        (
            r#"{"activation_factor": -1}"#,
            "activation_factor is -1, out of range",
        ),
        // Absurd values named short, never as hundreds of digits.
        (
            r#"{"gemm_scale": 1e308}"#,
            "gemm_scale is 1e308, out of range",
        ),
        (
            r#"{"compute_efficiency": 1e-320}"#,
            "compute_efficiency is 1e-320, out of range",
        ),
        (
            r#"{"calibration": {"activation_factr": 1.2}}"#,
            "unknown field",
        ),
        ("[]", "is not a JSON object"),
    ] {
        let file = dir.path().join("calibration.json");
        std::fs::write(&file, text).unwrap();
        fails(
            pipette()
                .args(["estimate", "--calibration"])
                .arg(&file)
                .arg("--")
                .args(TINY_MODEL),
            2,
            &["--calibration", needle],
        );
    }
}

/// N14: `--rdzv-endpoint host:99999` silently used port 29500; `PET_MASTER_PORT=0` was
/// accepted.
#[test]
fn n14_a_port_out_of_range_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    fails(
        &mut dry_run(dir.path(), &["--rdzv-endpoint", "host:99999"]),
        2,
        &["--rdzv-endpoint", "\"99999\" is not a port number"],
    );
    fails(
        dry_run(dir.path(), &[]).env("PET_MASTER_PORT", "0"),
        2,
        &["PET_MASTER_PORT", "from 1 to 65535"],
    );
    assert_eq!(entries(dir.path()), Vec::<String>::new());
}

/// N15: misleading messages: a file on the run directory's path "already exists"; a
/// site configuration's bad value was blamed on the command line.
#[test]
fn n15_messages_name_the_real_cause() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("afile"), "").unwrap();
    let run = d.join("afile/run");
    fails(
        &mut dry_run(d, &["--run-dir", run.to_str().unwrap()]),
        2,
        &["is a file, not a directory"],
    );
    let config = d.join("site.toml");
    std::fs::write(&config, "grace = \"-1s\"\n").unwrap();
    fails(
        &mut dry_run(d, &["--config", config.to_str().unwrap()]),
        2,
        &["site.toml: grace = \"-1s\"", "fix the file"],
    );
}

/// N9: when torchrun exited 0 right after a few MB of output, the tail was missing from
/// the node log and the terminal (0 of 8 runs kept it at 5-10 MB); a line without a
/// newline was held whole however long. A stand-in torchrun writes 10 MB of lines, a last
/// line and a 3 MB line without a newline, then exits 0.
#[test]
fn n9_every_line_before_a_successful_exit_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let torchrun = d.join("torchrun");
    common::write_executable(
        &torchrun,
        "#!/bin/sh\nexec python3 -c '\nimport sys\nw = sys.stdout.write\n\
         for i in range(100000):\n    w(\"line %06d %s\\n\" % (i, \"x\" * 88))\n\
         w(\"last line\\n\")\nw(\"y\" * 3000000)\n'\n",
    );
    std::fs::write(d.join("train.py"), "").unwrap();
    let out = succeeds(
        pipette_run(d)
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .args([
                "--hosts",
                "node-a",
                "--launcher",
                "local",
                "--nproc-per-node",
                "1",
            ])
            .arg("--torchrun")
            .arg(&torchrun)
            .arg("--run-dir")
            .arg(d.join("run"))
            .arg("train.py"),
    );
    let log = std::fs::read(d.join("run/logs/node-a.log")).unwrap();
    for (name, text) in [("terminal", out.stdout), ("node log", log)] {
        let text = String::from_utf8_lossy(&text);
        let lines = text.lines().filter(|l| l.contains("line 0")).count();
        assert_eq!(lines, 100_000, "{name}");
        assert!(text.contains("line 099999 "), "{name}");
        assert!(text.contains("last line"), "{name}");
        let cut = text.lines().last().unwrap_or_default();
        assert!(
            cut.ends_with("[pipette-run: line cut at 1048576 bytes, 1951424 more dropped]"),
            "{name}: {}",
            &cut[cut.len().saturating_sub(120)..]
        );
        assert!(cut.len() < (1 << 20) + 200, "{name}: {} bytes", cut.len());
    }
}

/// N17: `node_failed.detail` was torchrun's banner line, not the worker's error. A
/// stand-in torchrun prints a worker's traceback and torchrun's report, and exits 1.
#[test]
fn n17_a_node_failure_s_detail_is_the_worker_s_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let torchrun = d.join("torchrun");
    common::write_executable(
        &torchrun,
        "#!/bin/sh\ncat >&2 <<'X'\nTraceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n\
         ValueError: the worker's own error\n\
         torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n\
         ============================================================\ntrain.py FAILED\n\
         ------------------------------------------------------------\nX\nexit 1\n",
    );
    std::fs::write(d.join("train.py"), "").unwrap();
    let out = pipette_run(d)
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .args([
            "--hosts",
            "node-a",
            "--launcher",
            "local",
            "--nproc-per-node",
            "1",
        ])
        .args(["--max-replans", "0"])
        .arg("--torchrun")
        .arg(&torchrun)
        .arg("--run-dir")
        .arg(d.join("run"))
        .arg("train.py")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let events = pipette::supervise::events::read_events(&d.join("run/events.jsonl")).unwrap();
    let failed: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "node_failed")
        .collect();
    assert_eq!(failed.len(), 1, "{events:?}");
    assert_eq!(failed[0]["detail"], "ValueError: the worker's own error");
}

// Further cases of the same classes (issue 33's "kept back" cases, tried independently).

/// N1, other duration options: torchrun's `--monitor-interval` and `--shutdown-timeout`
/// (seconds, handed to torchrun) took 2^64 s, and torchrun's sleep overflowed on every node.
#[test]
fn n1_torchrun_s_seconds_are_bounded_as_every_duration() {
    let dir = tempfile::tempdir().unwrap();
    for option in ["--monitor-interval", "--shutdown-timeout"] {
        fails(
            &mut dry_run(dir.path(), &[option, "18446744073709551615"]),
            2,
            &[option, "is too long (give at most 10 years"],
        );
    }
    fails(
        dry_run(dir.path(), &[]).env("PET_SHUTDOWN_TIMEOUT", "1e300"),
        2,
        &["PET_SHUTDOWN_TIMEOUT", "is too long"],
    );
    assert_eq!(entries(dir.path()), Vec::<String>::new());
}

/// N4, other strings printed raw: `--master-addr` (and `PET_MASTER_ADDR`), `--rdzv-id`
/// and `--rdzv-endpoint`'s host reached the dry run's output and the launch scripts with
/// their escape sequences; bidi characters were taken in the master address.
#[test]
fn n4_addresses_and_the_rendezvous_id_are_checked_before_printing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let esc = "a\u{1b}[2J\u{1b}[31m";
    fails(
        &mut dry_run(d, &["--master-addr", esc]),
        2,
        &["--master-addr", "\\u{1b}[2J", "control character"],
    );
    fails(
        dry_run(d, &[]).env("PET_MASTER_ADDR", esc),
        2,
        &["PET_MASTER_ADDR", "\\u{1b}[2J"],
    );
    fails(
        &mut dry_run(d, &["--master-addr", "a\u{202e}b"]),
        2,
        &["--master-addr", "invisible Unicode format character"],
    );
    fails(
        &mut dry_run(d, &["--rdzv-id", esc]),
        2,
        &["--rdzv-id", "\\u{1b}[2J", "control or invisible character"],
    );
    fails(
        &mut dry_run(d, &["--rdzv-endpoint", &format!("{esc}:29500")]),
        2,
        &["--rdzv-endpoint", "\\u{1b}[2J"],
    );
    assert_eq!(entries(d), Vec::<String>::new());
}

/// N4, the script's own words: a script argument (and a script path) holding an escape
/// sequence reached the dry run and `launch-*.sh` raw. Both now carry it escaped (bash's
/// `$'\x1b…'` in the script, which hands the word on unchanged), and the run still plans.
#[test]
fn n4_the_script_s_arguments_are_escaped_in_the_dry_run_and_the_scripts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let run = d.join("run");
    let out = pipette_run(d)
        .arg("--run-dir")
        .arg(&run)
        .args(["--nproc-per-node", "1", "--dry-run", "train.py"])
        .arg("--wandb-exp-name")
        .arg("x\u{1b}[2J\u{1b}[31mred\u{202e}")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{202e}'),
        "{text}"
    );
    assert!(
        text.contains("$'x\\x1b[2J\\x1b[31mred\\xe2\\x80\\xae'"),
        "{text}"
    );
    let mut scripts = 0;
    for entry in std::fs::read_dir(&run).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        assert!(
            !bytes.contains(&0x1b),
            "{} holds a raw escape",
            path.display()
        );
        scripts += usize::from(path.extension().is_some_and(|e| e == "sh"));
    }
    assert!(scripts > 0, "no launch script in {}", run.display());
}

/// N5, other spellings of one host: `x..` was a node beside `x`, and `127.000.000.001`
/// and `127.1` nodes beside `127.0.0.1` (the resolver reads them as that address).
#[test]
fn n5_other_spellings_of_one_host_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (hosts, needle) in [
        ("x..", "empty part between dots"),
        (".x", "empty part between dots"),
        (
            "127.0.0.1,127.000.000.001",
            "not an IPv4 address as written",
        ),
        ("127.1", "not an IPv4 address as written"),
        // Fullwidth characters look like `node1` and are another name.
        (
            "\u{ff4e}\u{ff4f}\u{ff44}\u{ff45}\u{ff11}",
            "not ASCII: a host name is ASCII letters",
        ),
    ] {
        fails(&mut dry_run(d, &["--hosts", hosts]), 66, &[needle]);
    }
    fails(
        &mut hostfile_dry_run(d, "10.0.0.010 slots=1\n"),
        66,
        &["10.0.0.010", "not an IPv4 address as written"],
    );
    // A name that is a dotted quad as written, and one with digits among letters, are hosts.
    succeeds(&mut dry_run(d, &["--hosts", "127.0.0.1,n01.rack2"]));
}

/// N10, another input-file option: `--ssh-config` is read by ssh, not by pipette-run, so
/// `/dev/zero`, a FIFO or a directory went to every ssh unchecked (a FIFO: every node's
/// ssh waited for a writer).
#[test]
fn n10_the_ssh_configuration_must_be_a_regular_file_too() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    for file in [Path::new("/dev/zero"), &fifo, &sub] {
        fails(
            &mut dry_run(
                dir.path(),
                &["--ssh-config", file.to_str().unwrap(), "--hosts", "a,b"],
            ),
            2,
            &["--ssh-config", "is not a regular file"],
        );
    }
    assert_eq!(entries(dir.path()), ["fifo", "sub"]);
}
