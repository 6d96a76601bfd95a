//! Memory per pipeline stage: the memory model's terms on one GPU of each stage (weights,
//! gradients and optimizer state; activations at the stage's peak; overhead) stacked
//! against what the plan may use of the GPU's memory and the memory itself.

use crate::plan::Plan;

use super::fit;
use super::svg::{Anchor, Svg};

const GIB: f64 = (1u64 << 30) as f64;

/// One stage's bar: its terms and its limits, bytes.
struct StageBar {
    stage: usize,
    weights: u64,
    activations: u64,
    overhead: u64,
    usable: u64,
    gpu: u64,
}

fn bars(plan: &Plan) -> Vec<StageBar> {
    let e = &plan.estimate;
    e.memory
        .stages
        .iter()
        .map(|s| {
            // On mixed GPUs each stage has its own GPUs' memory.
            let own = plan
                .heterogeneous
                .as_ref()
                .and_then(|h| h.stages.get(s.stage));
            StageBar {
                stage: s.stage,
                weights: s.weights_and_optimizer_bytes,
                activations: s.activation_bytes,
                overhead: s.overhead_bytes,
                usable: own.map_or(e.usable_memory_bytes, |o| o.usable_memory_bytes),
                gpu: own.map_or(e.gpu_memory_bytes, |o| o.gpu_memory_bytes),
            }
        })
        .collect()
}

/// The longest bar or GPU memory, bytes: the scale's end.
fn largest(bars: &[StageBar]) -> f64 {
    bars.iter()
        .map(|b| (b.weights + b.activations + b.overhead).max(b.gpu))
        .max()
        .unwrap_or(1)
        .max(1) as f64
}

const TERMS: [(&str, &str, &str); 3] = [
    (
        "weights",
        "hsl(215,55%,48%)",
        "weights, gradients, optimizer",
    ),
    ("activations", "hsl(35,85%,55%)", "activations"),
    ("overhead", "hsl(280,25%,62%)", "overhead"),
];

pub fn svg(plan: &Plan) -> String {
    let bars = bars(plan);
    let left = 80.0;
    let plot = 860.0;
    let row = if bars.len() <= 16 { 30.0 } else { 14.0 };
    let top = 84.0;
    let most = largest(&bars);
    let scale = plot / most;
    let height = top + row * bars.len() as f64 + 60.0;
    let mut svg = Svg::new(left + plot + 160.0, height);
    svg.title(&format!(
        "Memory per GPU of each pipeline stage (estimated), peak {:.1} GiB",
        plan.estimate.peak_memory_bytes as f64 / GIB
    ));
    let mut x = 10.0;
    for (class, fill, label) in TERMS {
        svg.rect(x, 36.0, 14.0, 12.0, &format!("legend-{class}"), fill, "");
        svg.text(x + 18.0, 46.0, 11.0, Anchor::Start, "legend", label);
        x += 34.0 + 6.0 * label.len() as f64;
    }
    for (class, stroke, dash, label) in [
        ("legend-usable", "#c0392b", "", "usable"),
        ("legend-gpu", "#222", "4 2", "GPU memory"),
    ] {
        svg.line((x, 42.0), (x + 16.0, 42.0), class, stroke, 2.0, dash);
        svg.text(x + 20.0, 46.0, 11.0, Anchor::Start, "legend", label);
        x += 80.0;
    }
    for (i, b) in bars.iter().enumerate() {
        let y = top + i as f64 * row;
        svg.text(
            left - 6.0,
            y + row / 2.0 + 4.0,
            (row * 0.4).min(11.0),
            Anchor::End,
            "stage",
            &format!("stage {}", b.stage),
        );
        let total = b.weights + b.activations + b.overhead;
        svg.rect(
            left,
            y + 2.0,
            total as f64 * scale,
            row - 4.0,
            "stage-bar",
            "none",
            &format!(
                "stage {}: {:.2} GiB of {:.2} GiB usable",
                b.stage,
                total as f64 / GIB,
                b.usable as f64 / GIB
            ),
        );
        let mut at = left;
        for ((class, fill, label), bytes) in
            TERMS.iter().zip([b.weights, b.activations, b.overhead])
        {
            let w = bytes as f64 * scale;
            svg.rect(
                at,
                y + 2.0,
                w,
                row - 4.0,
                class,
                fill,
                &format!("stage {} {label}: {:.2} GiB", b.stage, bytes as f64 / GIB),
            );
            at += w;
        }
        let over = total > b.usable;
        svg.text(
            at + 6.0,
            y + row / 2.0 + 4.0,
            (row * 0.4).min(11.0),
            Anchor::Start,
            if over { "over" } else { "total" },
            &format!(
                "{:.1} GiB{}",
                total as f64 / GIB,
                if over {
                    " — over the usable memory"
                } else {
                    ""
                }
            ),
        );
        let ux = left + b.usable as f64 * scale;
        svg.line((ux, y), (ux, y + row), "usable", "#c0392b", 2.0, "");
        let gx = left + b.gpu as f64 * scale;
        svg.line((gx, y), (gx, y + row), "gpu-memory", "#222", 1.5, "4 2");
    }
    let axis = top + row * bars.len() as f64 + 6.0;
    svg.line((left, axis), (left + plot, axis), "axis", "#444", 1.0, "");
    let step_gib = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
        .into_iter()
        .find(|s| most / GIB / s <= 10.0)
        .unwrap_or(200.0);
    let mut g = 0.0;
    while g * GIB <= most + 1.0 {
        let x = left + g * GIB * scale;
        svg.line((x, axis), (x, axis + 5.0), "tick", "#444", 1.0, "");
        svg.text(
            x,
            axis + 18.0,
            10.0,
            Anchor::Middle,
            "tick",
            &format!("{g:.0} GiB"),
        );
        g += step_gib;
    }
    svg.finish()
}

pub fn text(plan: &Plan) -> String {
    let bars = bars(plan);
    let width = 48usize;
    let most = largest(&bars);
    let cols = |bytes: u64| ((bytes as f64 / most) * width as f64).round() as usize;
    let mut out = String::from(
        "Memory per GPU of each stage (estimated): # weights+optimizer, = activations,\n  + overhead, | usable memory, ] GPU memory; GiB: total of usable\n",
    );
    for b in &bars {
        let mut line: Vec<char> = Vec::with_capacity(width + 1);
        for (c, bytes) in [('#', b.weights), ('=', b.activations), ('+', b.overhead)] {
            line.extend(std::iter::repeat_n(c, cols(bytes)));
        }
        line.truncate(width + 1);
        while line.len() < width + 1 {
            line.push(' ');
        }
        let u = cols(b.usable).min(width);
        let g = cols(b.gpu).min(width);
        if line[g] == ' ' {
            line[g] = ']';
        }
        line[u] = '|';
        let total = b.weights + b.activations + b.overhead;
        let bar: String = line.into_iter().collect();
        out.push_str(&fit(
            &format!(
                "  s{:<3} {bar} {:.1} of {:.1}{}",
                b.stage,
                total as f64 / GIB,
                b.usable as f64 / GIB,
                if total > b.usable { " over" } else { "" }
            ),
            80,
        ));
        out.push('\n');
    }
    out
}
