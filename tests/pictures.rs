//! The plan's pictures for every shipped example cluster: each SVG parsed and counted (a
//! cell per GPU of the world, a block per micro-batch per stage and pass, a cell per node
//! pair, a bar per stage), every text form within 80 columns, and the SVGs opened in a real
//! headless Chromium whose screenshots must not be blank.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use pipette::cluster::profile::{self, GpuInventory};
use pipette::cluster::ClusterProfile;
use pipette::config::{settings_from_megatron_args, Constraints, Settings};
use pipette::plan::{plan, Plan, PlanOptions};
use pipette::report::pictures::svg::{text_extent, Anchor};
use pipette::report::pictures::{svg_files, Picture};

/// Every example cluster, by file name.
fn examples() -> Vec<(String, ClusterProfile)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(common::repo().join("examples/clusters"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 8, "the example clusters are missing");
    files
        .into_iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (
                name,
                ClusterProfile::load(&p).unwrap_or_else(|e| panic!("{e}")),
            )
        })
        .collect()
}

/// GPT-3 1.3B pinned to tp 2 × pp 4 (so every picture has stages, tp groups and cuts),
/// with the interleaved schedule's 2 chunks or without; fp16 where a GPU lacks bf16.
fn settings(cluster: &ClusterProfile, interleaved: bool) -> Settings {
    let bf16 = cluster.nodes.iter().all(|n| match &n.gpus {
        GpuInventory::Known { gpus, .. } => gpus.iter().all(|g| g.peak_tflops.bf16.is_some()),
        GpuInventory::Unknown => true,
    });
    let gpus: usize = cluster
        .nodes
        .iter()
        .map(|n| match &n.gpus {
            GpuInventory::Known { gpus, .. } => gpus.len(),
            GpuInventory::Unknown => 0,
        })
        .sum();
    let global_batch = (gpus / 8 * 32).max(64).to_string();
    let args: Vec<String> = [
        if bf16 { "--bf16" } else { "--fp16" },
        "--global-batch-size",
        &global_batch,
        "--tensor-model-parallel-size",
        "2",
        "--pipeline-model-parallel-size",
        "4",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut s = settings_from_megatron_args(&args, Some("gpt3-1.3b"), &[]).unwrap();
    s.constraints.tensor_parallel = Some(2);
    s.constraints.pipeline_parallel = Some(4);
    s.constraints.virtual_pipeline = interleaved.then_some(2);
    s
}

fn quick_plan(cluster: &ClusterProfile, interleaved: bool) -> Plan {
    let mut options = PlanOptions {
        budget: Some(2_000),
        top_k: 1,
        ..PlanOptions::default()
    };
    if !interleaved {
        options.space.max_virtual_stages = 1;
    }
    plan(&settings(cluster, interleaved), cluster, &options).unwrap_or_else(|e| panic!("{e}"))
}

/// A minimal XML reading of an SVG: every element's name and attributes, checking that
/// tags nest and close and that attribute values are quoted.
fn elements(svg: &str) -> Vec<(String, BTreeMap<String, String>)> {
    let tag = regex::Regex::new(r#"<(/?)([A-Za-z?][\w:-]*)((?:\s+[\w:-]+="[^"<]*")*)\s*(/?)\??>"#)
        .unwrap();
    let attr = regex::Regex::new(r#"([\w:-]+)="([^"]*)""#).unwrap();
    let mut open: Vec<String> = Vec::new();
    let mut out = Vec::new();
    let mut last = 0;
    for c in tag.captures_iter(svg) {
        let whole = c.get(0).unwrap();
        // Between tags only text: no stray `<` or unescaped `&`.
        let between = &svg[last..whole.start()];
        assert!(!between.contains('<'), "a malformed tag near {between:?}");
        for (i, _) in between.match_indices('&') {
            let rest = &between[i..];
            assert!(
                ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
                    .iter()
                    .any(|e| rest.starts_with(e)),
                "an unescaped & in {between:?}"
            );
        }
        last = whole.end();
        let name = c[2].to_string();
        if name == "?xml" {
            continue;
        }
        if &c[1] == "/" {
            assert_eq!(
                open.pop().as_deref(),
                Some(name.as_str()),
                "mismatched </{name}>"
            );
            continue;
        }
        let attrs = attr
            .captures_iter(&c[3])
            .map(|a| (a[1].to_string(), a[2].to_string()))
            .collect();
        if c[4].is_empty() {
            open.push(name.clone());
        }
        out.push((name, attrs));
    }
    assert!(open.is_empty(), "unclosed elements: {open:?}");
    assert!(svg[last..].trim().is_empty(), "text after the root element");
    assert_eq!(out.first().map(|e| e.0.as_str()), Some("svg"));
    out
}

fn count(elements: &[(String, BTreeMap<String, String>)], class: &str) -> usize {
    elements
        .iter()
        .filter(|(_, a)| a.get("class").map(String::as_str) == Some(class))
        .count()
}

fn nodes_used(plan: &Plan) -> usize {
    let mut nodes: Vec<usize> = plan.placement.devices.iter().map(|d| d.node).collect();
    nodes.sort();
    nodes.dedup();
    nodes.len()
}

#[test]
fn every_picture_of_every_example_cluster_shows_what_it_should() {
    for (name, cluster) in examples() {
        for interleaved in [false, true] {
            let plan = quick_plan(&cluster, interleaved);
            let c = &plan.config;
            let at = format!(
                "{name} (interleaved: {interleaved}, tp {} pp {} dp {})",
                c.tp, c.pp, c.dp
            );
            assert_eq!(c.vpp.is_some(), interleaved, "{at}");
            let files: BTreeMap<String, String> = svg_files(&plan, &cluster).into_iter().collect();
            let world = c.world_size() as usize;

            let map = elements(&files["rank-map.svg"]);
            assert_eq!(
                count(&map, "gpu"),
                world,
                "{at}: a cell per GPU of the world"
            );
            assert_eq!(
                count(&map, "tp-group"),
                world / 2,
                "{at}: every tp group outlined"
            );
            assert_eq!(count(&map, "legend-stage"), 4, "{at}");

            let time = elements(&files["timeline.svg"]);
            let m = plan.estimate.time.microbatches as usize;
            let chunks = c.vpp.unwrap_or(1) as usize;
            assert!(m >= 1, "{at}");
            for pass in ["fwd", "bwd"] {
                assert_eq!(
                    count(&time, pass),
                    4 * m * chunks,
                    "{at}: a {pass} block per micro-batch per stage (and chunk)"
                );
            }
            assert_eq!(count(&time, "lane"), 4, "{at}");
            let shades = if chunks > 1 { 2 * chunks } else { 0 };
            assert_eq!(
                count(&time, "legend-chunk"),
                shades,
                "{at}: each chunk's shades in the legend"
            );

            let links = elements(&files["links.svg"]);
            let n = nodes_used(&plan);
            assert_eq!(
                count(&links, "link"),
                n * (n - 1),
                "{at}: a cell per node pair"
            );
            assert_eq!(
                count(&links, "cut"),
                2 * 3,
                "{at}: every pipeline cut drawn both ways"
            );

            let memory = elements(&files["memory.svg"]);
            assert_eq!(count(&memory, "stage-bar"), 4, "{at}: a bar per stage");
            for term in ["weights", "activations", "overhead"] {
                assert_eq!(count(&memory, term), 4, "{at}: {term} on every stage");
            }

            for picture in Picture::ALL {
                let text = picture.text(&plan, &cluster);
                assert!(text.lines().count() >= 2, "{at}: {picture:?}\n{text}");
                for line in text.lines() {
                    assert!(
                        line.chars().count() <= 80,
                        "{at}: {picture:?} line over 80 columns:\n{line}"
                    );
                }
            }
        }
    }
}

#[test]
fn host_names_are_escaped_in_every_picture() {
    let text =
        std::fs::read_to_string(common::repo().join("examples/clusters/a100-2x8.json")).unwrap();
    let hostile = text.replace("a100-n00", "n<0>&'\\\"");
    let cluster = ClusterProfile::from_json_str(&hostile, "hostile.json").unwrap();
    let plan = quick_plan(&cluster, false);
    for (file, svg) in svg_files(&plan, &cluster) {
        elements(&svg);
        if file == "rank-map.svg" || file == "links.svg" {
            assert!(
                svg.contains("n&lt;0&gt;&amp;&apos;&quot;"),
                "{file} shows the host escaped"
            );
        }
    }
}

/// The python that reads the screenshots: the test venv's, else the system's.
fn python() -> String {
    std::env::var("PIPETTE_MEGATRON_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

#[test]
fn the_pictures_open_in_headless_chromium() {
    let chromium = Path::new("/usr/bin/chromium");
    assert!(
        chromium.exists(),
        "{} is missing: scripts/install-test-deps installs Debian's chromium (apt-get install -y chromium)",
        chromium.display()
    );
    let (_, cluster) = examples()
        .into_iter()
        .find(|(n, _)| n == "a100-4x8-degraded.json")
        .unwrap();
    let plan = quick_plan(&cluster, true);
    let dir = tempfile::tempdir().unwrap();
    for (file, svg) in svg_files(&plan, &cluster) {
        let path = dir.path().join(&file);
        std::fs::write(&path, svg).unwrap();
        let shot = dir.path().join(format!("{file}.png"));
        let profile = tempfile::tempdir().unwrap();
        let out = Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--window-size=1200,800",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(format!("--screenshot={}", shot.display()))
            .arg(&path)
            .output()
            .expect("chromium runs");
        assert!(
            out.status.success() && shot.exists(),
            "chromium could not render {file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let read = Command::new(python())
            .arg(common::repo().join("tests/helpers/png_colours.py"))
            .arg(&shot)
            .output()
            .expect("python runs");
        assert!(
            read.status.success(),
            "{}",
            String::from_utf8_lossy(&read.stderr)
        );
        let words: Vec<f64> = String::from_utf8_lossy(&read.stdout)
            .split_whitespace()
            .map(|w| w.parse().unwrap())
            .collect();
        let (colours, drawn) = (words[2], words[3]);
        assert!(
            colours > 8.0 && drawn > 0.005,
            "{file}: the screenshot is (nearly) blank: {colours} colours, {:.1} % not white",
            drawn * 100.0
        );
    }
}

/// Every text of an SVG within its canvas, by the writer's own generous estimate of a
/// text's width: a title or label the picture's edge would clip fails here.
fn assert_text_within_canvas(svg: &str, at: &str) {
    let root = regex::Regex::new(r#"<svg [^>]*width="([\d.]+)" height="([\d.]+)""#).unwrap();
    let c = root.captures(svg).expect("an svg element with its size");
    let (width, height): (f64, f64) = (c[1].parse().unwrap(), c[2].parse().unwrap());
    let text = regex::Regex::new(
        r#"<text class="[^"]*" x="([-\d.]+)" y="([-\d.]+)" font-size="([\d.]+)" text-anchor="(\w+)">([^<]*)</text>"#,
    )
    .unwrap();
    let entity = regex::Regex::new(r"&\w+;").unwrap();
    let mut texts = 0;
    for t in text.captures_iter(svg) {
        texts += 1;
        let (x, y, size): (f64, f64, f64) = (
            t[1].parse().unwrap(),
            t[2].parse().unwrap(),
            t[3].parse().unwrap(),
        );
        let anchor = match &t[4] {
            "start" => Anchor::Start,
            "middle" => Anchor::Middle,
            _ => Anchor::End,
        };
        let words = entity.replace_all(&t[5], "x");
        let (left, right) = text_extent(x, size, anchor, &words);
        assert!(
            left >= 0.0 && right <= width && y - size >= 0.0 && y <= height,
            "{at}: {words:?} at x {left:.0}..{right:.0}, y {y} is outside the {width} × {height} canvas"
        );
    }
    assert!(texts >= 2, "{at}: a title and a legend at least");
}

#[test]
fn no_text_leaves_the_canvas_and_every_picture_has_a_title_and_a_legend() {
    for (name, cluster) in examples() {
        let plan = quick_plan(&cluster, false);
        for (file, svg) in svg_files(&plan, &cluster) {
            let at = format!("{name} {file}");
            assert_text_within_canvas(&svg, &at);
            let parsed = elements(&svg);
            assert_eq!(count(&parsed, "title"), 1, "{at}: one title");
            assert!(count(&parsed, "legend") >= 1, "{at}: a legend");
        }
    }
}

#[test]
fn a_one_node_links_picture_says_why_it_draws_no_matrix() {
    let one = one_node();
    let plan = quick_plan(&one, false);
    let svg = Picture::Links.svg(&plan, &one);
    assert!(
        svg.contains("one node: no link crosses the network"),
        "{svg}"
    );
    assert!(svg.contains("1 node in node-rank order"), "{svg}");
    let parsed = elements(&svg);
    assert_eq!(count(&parsed, "link"), 0);
    let height: f64 = parsed[0].1["height"].parse().unwrap();
    assert!(
        height < 100.0,
        "no empty canvas below the note: {height} px high"
    );
    assert_text_within_canvas(&svg, "one node links.svg");
}

/// Issue 34: a one-node plan of one stage, as `pipette-run` on one 8-GPU node plans
/// llama2-7b: the rank map says "1 node", the timeline names no pipeline, no bubble and no
/// "1 stages", and the links picture says why it draws nothing.
#[test]
fn a_one_node_one_stage_plan_reads_as_such_in_every_picture() {
    let one = one_node();
    let plan = pinned_plan(&one, "llama2-7b", &[], |pin| {
        pin.tensor_parallel = Some(1);
        pin.pipeline_parallel = Some(1);
    });
    assert_eq!((plan.config.pp, plan.config.dp), (1, 8));
    let files: BTreeMap<String, String> = svg_files(&plan, &one).into_iter().collect();
    let map = &files["rank-map.svg"];
    assert!(map.contains("8 GPUs on 1 node<"), "{map}");
    let time = &files["timeline.svg"];
    assert!(
        time.contains("Timeline of one iteration: one stage (no pipeline), 8 micro-batches"),
        "{time}"
    );
    assert!(
        !time.contains("1 stages") && !time.contains("bubble"),
        "{time}"
    );
    assert_eq!(count(&elements(time), "legend-idle"), 0);
    assert_eq!(count(&elements(time), "lane"), 1);
    let text = Picture::Timeline.text(&plan, &one);
    assert!(
        text.starts_with("Timeline of one iteration: one stage (no pipeline)"),
        "{text}"
    );
    assert!(files["links.svg"].contains("one node: no link crosses the network"));
    for (file, svg) in &files {
        assert_text_within_canvas(svg, &format!("one node {file}"));
    }
}

/// `model` in bf16, global batch 64, with `args` more and what `pin` pins, planned
/// quickly on `cluster`.
fn pinned_plan(
    cluster: &ClusterProfile,
    model: &str,
    args: &[&str],
    pin: impl FnOnce(&mut Constraints),
) -> Plan {
    let args: Vec<String> = ["--bf16", "--global-batch-size", "64"]
        .iter()
        .chain(args)
        .map(|s| s.to_string())
        .collect();
    let mut s = settings_from_megatron_args(&args, Some(model), &[]).unwrap();
    pin(&mut s.constraints);
    let options = PlanOptions {
        budget: Some(2_000),
        top_k: 1,
        ..PlanOptions::default()
    };
    plan(&s, cluster, &options).unwrap_or_else(|e| panic!("{e}"))
}

/// The first node of a100-2x8.json alone.
fn one_node() -> ClusterProfile {
    let (_, cluster) = examples()
        .into_iter()
        .find(|(n, _)| n == "a100-2x8.json")
        .unwrap();
    let mut one = cluster.clone();
    one.nodes.truncate(1);
    one.node_links = one_node_links(&cluster);
    one
}

/// The link matrix of `cluster`'s first node alone.
fn one_node_links(cluster: &ClusterProfile) -> profile::LinkMatrix {
    profile::LinkMatrix::uniform(
        1,
        cluster.node_links.get(0, 1),
        profile::Provenance::new(profile::Source::Measured),
    )
}

#[test]
fn the_rank_map_shows_context_and_expert_parallel_groups_and_the_cuts_follow_cp() {
    let (_, cluster) = examples()
        .into_iter()
        .find(|(n, _)| n == "a100-4x8-degraded.json")
        .unwrap();
    // Context parallel: llama2-7b at 8K tokens pinned to tp 2 × cp 2 × pp 2 (dp 4).
    let long = ["--seq-length", "8192", "--max-position-embeddings", "8192"];
    let cp_plan = pinned_plan(&cluster, "llama2-7b", &long, |pin| {
        pin.tensor_parallel = Some(2);
        pin.context_parallel = Some(2);
        pin.pipeline_parallel = Some(2);
    });
    let c = &cp_plan.config;
    assert_eq!((c.tp, c.cp, c.pp, c.dp), (2, 2, 2, 4));
    let files: BTreeMap<String, String> = svg_files(&cp_plan, &cluster).into_iter().collect();
    let map = &files["rank-map.svg"];
    let parsed = elements(map);
    assert_eq!(count(&parsed, "cp-group"), 32, "a bar under every GPU");
    assert_eq!(count(&parsed, "ep-group"), 0);
    assert!(map.contains("GPUs sharing one sequence (cp 2 × tp 2, context parallel)"));
    // Ranks 0-3 share a sequence (tp and cp are the innermost orders), ranks 4-7 the next.
    assert!(map.contains("<title>cp-group 0</title>") && map.contains("<title>cp-group 1</title>"));
    assert!(
        map.contains(", cp 1, dp"),
        "each GPU's tooltip names its cp rank"
    );
    assert_text_within_canvas(map, "cp rank-map.svg");
    // One cut, after the first 16 ranks (tp × cp × dp): at the middle of the nodes.
    let links = &files["links.svg"];
    assert_eq!(
        count(&elements(links), "cut"),
        2,
        "the one cut, drawn both ways"
    );
    assert!(links.contains(">s1</text>"));

    // Expert parallel: mixtral-8x7b pinned to ep 8.
    let plan = pinned_plan(&cluster, "mixtral-8x7b", &[], |pin| {
        pin.expert_parallel = Some(8);
        pin.pipeline_parallel = Some(4);
    });
    let c = &plan.config;
    assert_eq!(c.ep, 8);
    let map = Picture::RankMap.svg(&plan, &cluster);
    let parsed = elements(&map);
    assert_eq!(count(&parsed, "ep-group"), 32, "a bar under every GPU");
    assert!(map.contains("GPUs holding every expert once (ep 8 × etp"));
    assert_text_within_canvas(&map, "ep rank-map.svg");
}

#[test]
fn the_run_directory_readme_lists_every_picture() {
    let listed: Vec<&str> = pipette::render::PICTURES.iter().map(|(f, _)| *f).collect();
    let (_, cluster) = examples()
        .into_iter()
        .find(|(n, _)| n == "a100-2x8.json")
        .unwrap();
    let plan = quick_plan(&cluster, false);
    let written: Vec<String> = svg_files(&plan, &cluster)
        .into_iter()
        .map(|(f, _)| f)
        .collect();
    assert_eq!(
        listed, written,
        "render::PICTURES and the pictures written agree"
    );
}
