//! `pipette plan` through the real binary: the JSON contract, the human plan for the
//! example clusters (snapshots), reproducibility, and "nothing fits".

use assert_cmd::Command;
use predicates::prelude::*;
use serde_json::Value;

fn pipette() -> Command {
    let mut cmd = Command::cargo_bin("pipette").expect("binary built");
    cmd.env_clear().current_dir(env!("CARGO_MANIFEST_DIR"));
    cmd
}

fn stdout(cmd: &mut Command) -> String {
    let out = cmd.output().expect("runs");
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
fn plan_json_has_the_documented_keys() {
    let v: Value = serde_json::from_str(&stdout(pipette().args([
        "plan",
        "--json",
        "--cluster",
        "examples/clusters/a100-4x8-degraded.json",
        "--model",
        "llama2-13b",
        "--",
        "--global-batch-size",
        "128",
        "--bf16",
    ])))
    .unwrap();
    for key in [
        "tp",
        "pp",
        "dp",
        "micro_batch",
        "vpp",
        "recompute",
        "sequence_parallel",
        "distributed_optimizer",
        "layers_per_stage",
    ] {
        assert!(v["config"].get(key).is_some(), "config.{key} missing");
    }
    let order = v["mapping"]["node_order"].as_array().unwrap();
    assert_eq!(order.len(), 4);
    for host in order {
        let devices = &v["mapping"]["cuda_visible_devices"][host.as_str().unwrap()];
        let mut d: Vec<u64> = devices
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        d.sort();
        assert_eq!(d, (0..8).collect::<Vec<_>>(), "each GPU once on {host}");
    }
    assert!(v["estimate"]["iteration_ms"].as_f64().unwrap() > 0.0);
    assert!(v["estimate"]["peak_memory_bytes"].as_u64().unwrap() > 0);
    let baseline = v["baseline_mapping_ms"].as_f64().unwrap();
    assert!(v["estimate"]["iteration_ms"].as_f64().unwrap() <= baseline + 1e-9);
}

#[test]
fn same_seed_same_plan() {
    let run = |seed: &str| {
        stdout(pipette().args([
            "plan",
            "--json",
            "--seed",
            seed,
            "--cluster",
            "examples/clusters/a100-4x8-degraded.json",
            "--model",
            "gpt3-6.7b",
            "--",
            "--global-batch-size",
            "64",
            "--bf16",
        ]))
    };
    assert_eq!(run("7"), run("7"));
}

#[test]
fn nothing_fits_exits_69_and_says_what_would() {
    pipette()
        .args([
            "plan",
            "--cluster",
            "examples/clusters/v100-8x8.json",
            "--nproc-per-node",
            "1",
            "--hosts",
            "v100-n00",
            "--model",
            "gpt3-175b",
            "--",
            "--global-batch-size",
            "8",
            "--fp16",
        ])
        .assert()
        .code(69)
        .stderr(predicate::str::contains(
            "no configuration fits in GPU memory",
        ))
        .stderr(predicate::str::contains("GPUs"));
}

#[test]
fn plan_needs_a_cluster_profile() {
    pipette()
        .args(["plan", "--model", "gpt3-1.3b"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("pipette profile"));
}

fn snapshot(name: &str, cluster: &str, model: &str, extra: &[&str]) {
    let out = stdout(
        pipette()
            .args(["plan", "--cluster", cluster, "--model", model, "--"])
            .args(extra),
    );
    insta::assert_snapshot!(name, out);
}

#[test]
fn plan_for_the_example_clusters() {
    snapshot(
        "a100_2x8_gpt3_13b",
        "examples/clusters/a100-2x8.json",
        "gpt3-13b",
        &["--global-batch-size", "64", "--bf16"],
    );
    snapshot(
        "a100_4x8_degraded_llama2_13b",
        "examples/clusters/a100-4x8-degraded.json",
        "llama2-13b",
        &["--global-batch-size", "128", "--bf16"],
    );
    snapshot(
        "v100_8x8_gpt3_6_7b_fp16",
        "examples/clusters/v100-8x8.json",
        "gpt3-6.7b",
        &["--global-batch-size", "128", "--fp16"],
    );
    snapshot(
        "h100_16x8_llama2_70b",
        "examples/clusters/h100-16x8.json",
        "llama2-70b",
        &["--global-batch-size", "512", "--bf16"],
    );
    // Mixed GPUs: layers by speed, the stage table and the even-split comparison.
    snapshot(
        "a100_v100_mixed_4x8_gpt3_13b_fp16",
        "examples/clusters/a100-v100-mixed-4x8.json",
        "gpt3-13b",
        &["--global-batch-size", "64", "--fp16"],
    );
}

/// The rows of the plan's "Top configurations" table: (rank, runs, mapped ms).
fn table_rows(text: &str) -> Vec<(usize, bool, f64)> {
    let table = text
        .split("Top configurations")
        .nth(1)
        .expect("a table of configurations");
    table
        .lines()
        .map_while(|l| {
            (!l.trim_start().starts_with("#1-#") && !l.contains("configurations Megatron"))
                .then_some(l)
        })
        .filter_map(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            let first = cells.first()?;
            let rank = first.trim_end_matches('*').parse().ok()?;
            Some((rank, first.ends_with('*'), cells.last()?.parse().ok()?))
        })
        .collect()
}

/// The runner-up's sentence, its wrapped lines joined.
fn runner_up_sentence(text: &str) -> String {
    let mut lines = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("runner-up #"));
    let mut sentence = lines.next().expect("a runner-up line").trim().to_owned();
    for more in lines.take_while(|l| l.starts_with("      ")) {
        sentence.push(' ');
        sentence.push_str(more.trim());
    }
    sentence
}

/// The plans that contradicted themselves (a tie that runs in place of the faster #1 was
/// said to "win" against a faster "runner-up" at a negative margin), and one without a
/// tie that runs: the runner-up is the fastest configuration other than the pick, its
/// figure is its row's, and a faster one is said to be a tie that the simpler beats.
#[test]
fn the_runner_up_is_the_tables_and_a_faster_one_is_called_a_tie() {
    let mut tie_runs = 0;
    for (cluster, model) in [
        ("examples/clusters/a100-4x8-degraded.json", "gpt3-13b"),
        ("examples/clusters/h100-16x8.json", "gpt3-13b"),
        ("examples/clusters/a100-2x8.json", "gpt3-13b"),
    ] {
        let text = stdout(pipette().args(["plan", "--cluster", cluster, "--model", model]));
        let rows = table_rows(&text);
        assert!(rows.len() >= 2, "{text}");
        let pick = rows.iter().find(|r| r.1).unwrap_or(&rows[0]);
        let expected = rows.iter().find(|r| r.0 != pick.0).unwrap();
        let sentence = runner_up_sentence(&text);
        let (rank, rest) = sentence["runner-up #".len()..].split_once(' ').unwrap();
        assert_eq!(rank.parse::<usize>().unwrap(), expected.0, "{sentence}");
        let ms: f64 = rest
            .split_once(": ")
            .unwrap()
            .1
            .split(" ms")
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            (ms - expected.2).abs() < 0.06,
            "{sentence} against row {expected:?}"
        );
        let faster = expected.2 < pick.2;
        assert_eq!(
            sentence.contains("faster, within the model's stated error")
                && sentence.contains("a tie, and the simpler runs"),
            faster,
            "{sentence}"
        );
        assert_eq!(text.contains("Why it wins"), !faster, "{text}");
        assert_eq!(
            text.contains("Why it runs, though #1 is faster"),
            faster,
            "{text}"
        );
        tie_runs += usize::from(faster);
        // Never a margin the reader must invert.
        assert!(!regex_like_negative_percent(&text), "{text}");
    }
    assert_eq!(tie_runs, 2, "the two plans whose pick is a slower tie");
}

/// Whether `text` holds a negative percentage (`-50.8 %`).
fn regex_like_negative_percent(text: &str) -> bool {
    text.split_whitespace()
        .zip(text.split_whitespace().skip(1))
        .any(|(a, b)| b == "%" && a.starts_with('-') && a[1..].parse::<f64>().is_ok())
}

/// A mixture-of-experts plan says where its time goes term by term, the all-to-all and the
/// experts' own gradient sync included: the rows add up to the iteration it states, and the
/// mapping line's figures are the table's (the mapping search prices the expert terms as
/// the full model does, so "mapped" is never cheaper by leaving them out).
#[test]
fn a_moe_plan_names_its_all_to_all_and_its_terms_add_up() {
    let text = stdout(pipette().args([
        "plan",
        "--cluster",
        "examples/clusters/a100-4x8-degraded.json",
        "--model",
        "qwen3-30b-a3b",
    ]));
    let number_after = |line: &str, key: &str| -> f64 {
        let rest = &line[line.find(key).unwrap_or_else(|| panic!("{key} in {line}")) + key.len()..];
        rest.split_whitespace().next().unwrap().parse().unwrap()
    };
    let headline = text
        .lines()
        .find(|l| l.trim_start().starts_with("iteration "))
        .unwrap_or_else(|| panic!("{text}"));
    let iteration = number_after(headline, "iteration ");
    let section = text
        .split("where the time goes\n")
        .nth(1)
        .unwrap_or_else(|| panic!("{text}"));
    let rows: Vec<(&str, f64)> = section
        .lines()
        .take_while(|l| !l.trim_start().starts_with("runner-up"))
        .map(|l| {
            // `  {name}{ms} ms   runner-up {ms} ms`: the first figure ends the name.
            let ours = l.split(" ms").next().unwrap().trim_end();
            let (name, ms) = ours.rsplit_once(' ').unwrap();
            (name.trim(), ms.parse().unwrap())
        })
        .collect();
    let names: Vec<&str> = rows.iter().map(|r| r.0).collect();
    assert!(names.contains(&"expert dispatch and combine"), "{text}");
    assert!(
        names.contains(&"expert-data-parallel sync (exposed)"),
        "{text}"
    );
    let dispatch = rows[names
        .iter()
        .position(|n| n.starts_with("expert dispatch"))
        .unwrap()]
    .1;
    assert!(dispatch > 0.0, "{text}");
    let sum: f64 = rows.iter().map(|r| r.1).sum();
    // Each row is rounded to 0.1 ms.
    assert!(
        (sum - iteration).abs() <= 0.05 * rows.len() as f64,
        "the terms add up to {sum} ms, the plan says {iteration} ms:\n{text}"
    );
    assert!(text.contains("alltoall dispatch over 8 ranks"), "{text}");
    // The pick's mapped figure in the table is the iteration the plan states.
    let pick = table_rows(&text)
        .into_iter()
        .find(|r| r.1)
        .or_else(|| table_rows(&text).into_iter().next())
        .unwrap();
    assert!((pick.2 - iteration).abs() < 0.06, "{pick:?}\n{text}");
}
