//! Why a mixture-of-experts plan's expert layout wins: the pick against the best
//! configuration of every other expert layout (ep × etp) that fits, term by term
//! ([`crate::plan::ExpertLayouts`]). The expert GEMMs and the routing come out of the
//! steady state, so that "64 experts per rank instead of 32" and "the all-to-all leaves the
//! node" each read as their own line.

use crate::model::time::TimeEstimate;
use crate::plan::{ExpertLayouts, LayoutBest, Plan};

use super::plan::shape_text;

const GIB: f64 = (1u64 << 30) as f64;

/// The fastest other layouts shown with their terms (besides the pick's neighbours, ep
/// halved and doubled at its etp, which always are).
const DETAILED: usize = 3;

/// Other layouts shown at all; the rest are counted.
const SHOWN: usize = 10;

/// Terms per layout, largest difference first.
const TERMS_SHOWN: usize = 4;

/// A difference smaller than this share of the pick's iteration is not a reason.
const NEGLIGIBLE: f64 = 0.001;

/// The section of the plan report; empty for a dense plan.
pub fn why_this_layout(plan: &Plan) -> String {
    let Some(layouts) = &plan.expert_layouts else {
        return String::new();
    };
    let pick = &layouts.pick;
    let (ep, etp) = (pick.config.ep, pick.config.etp);
    let mut out =
        format!("\nWhy ep {ep} × etp {etp}: the best of each other expert layout, term by term\n");
    if layouts.others.is_empty() {
        out.push_str("  no other expert layout fits in memory\n");
        return out;
    }
    out.push_str(&format!(
        "  (on torchrun's default order, as the ranking compared them: there the pick takes {:.1} ms and {:.1} GiB at its peak; + is what the other layout loses)\n",
        pick.time.iteration_ms,
        pick.peak_memory_bytes as f64 / GIB
    ));
    let neighbour =
        |c: &crate::model::ParallelConfig| c.etp == etp && (c.ep * 2 == ep || c.ep == ep * 2);
    for (i, other) in layouts.others.iter().enumerate().take(SHOWN) {
        let detailed = i < DETAILED || neighbour(&other.config);
        out.push_str(&comparison(layouts, other, detailed));
    }
    if layouts.others.len() > SHOWN {
        out.push_str(&format!(
            "  ... {} more layouts, slower still (every one in plan.json's expert_layouts)\n",
            layouts.others.len() - SHOWN
        ));
    }
    out
}

/// One other layout: its headline, then (when `detailed`) its largest differences and its
/// memory.
fn comparison(layouts: &ExpertLayouts, other: &LayoutBest, detailed: bool) -> String {
    let pick = &layouts.pick;
    let ours = terms(&pick.time);
    let theirs = terms(&other.time);
    let total = other.time.iteration_ms - pick.time.iteration_ms;
    let share = if pick.time.iteration_ms > 0.0 {
        100.0 * total / pick.time.iteration_ms
    } else {
        0.0
    };
    // (difference, the term against ours, the term alone)
    let mut deltas: Vec<(f64, String, String)> = ours
        .iter()
        .zip(&theirs)
        .map(|(o, t)| (t.ms - o.ms, t.versus(o), t.alone()))
        .filter(|(d, _, _)| d.abs() >= (NEGLIGIBLE * pick.time.iteration_ms).max(0.05))
        .collect();
    deltas.sort_by(|a, b| b.0.abs().total_cmp(&a.0.abs()));
    let c = &other.config;
    let mut out = format!(
        "  ep {} × etp {}: {:.1} ms, {total:+.1} ms ({share:+.1} %)",
        c.ep, c.etp, other.time.iteration_ms,
    );
    if !detailed {
        match deltas.first() {
            Some((d, _, alone)) => out.push_str(&format!(", most of it {d:+.1} ms of {alone}\n")),
            None => out.push('\n'),
        }
        return out;
    }
    // The layout's ep × etp opens the line already.
    out.push_str(&format!(" as {}", shape_text(c, "")));
    out.push('\n');
    for (d, why, _) in deltas.iter().take(TERMS_SHOWN) {
        out.push_str(&format!("    {d:>+10.1} ms  {why}\n"));
    }
    let memory = (other.peak_memory_bytes as f64 - pick.peak_memory_bytes as f64) / GIB;
    out.push_str(&format!(
        "    {memory:>+10.1} GiB peak memory: {:.1} vs {:.1} GiB (weights, gradients and optimizer {:.1} vs {:.1} GiB)\n",
        other.peak_memory_bytes as f64 / GIB,
        pick.peak_memory_bytes as f64 / GIB,
        other.weights_and_optimizer_bytes as f64 / GIB,
        pick.weights_and_optimizer_bytes as f64 / GIB,
    ));
    out
}

/// One term of an iteration and what it says of its layout (`32 experts per rank × 1536
/// tokens`), so two layouts' terms read side by side.
struct Term {
    name: &'static str,
    ms: f64,
    /// What sets it in this layout; empty where the name says it all.
    detail: String,
}

impl Term {
    /// `all-to-all dispatch and combine (16 ranks, 8 on a node, ...)`.
    fn alone(&self) -> String {
        if self.detail.is_empty() {
            self.name.to_string()
        } else {
            format!("{} ({})", self.name, self.detail)
        }
    }

    /// `all-to-all dispatch and combine: 16 ranks over 2 nodes ... vs 8 inside one node`.
    fn versus(&self, ours: &Term) -> String {
        if self.detail.is_empty() || self.detail == ours.detail {
            self.name.to_string()
        } else {
            format!("{}: {} vs {}", self.name, self.detail, ours.detail)
        }
    }
}

/// The iteration in terms that add up to it: the steady state split into the expert GEMMs,
/// the routing and the rest of each micro-batch slot (each the critical stage's per
/// micro-batch figure times the micro-batches), then the pipeline, the synchronisations and
/// the optimizer.
fn terms(t: &TimeEstimate) -> Vec<Term> {
    let m = t.microbatches as f64;
    // Each layout's own slowest stage: its layers set how many MoE layers a slot holds.
    let stage = t.stages.get(t.critical_stage).map_or(String::new(), |s| {
        format!("stage {} ({} layers)", s.stage, s.layers)
    });
    let (experts_ms, routing_ms, experts_detail, dispatch_detail, edp_detail) = match &t.expert {
        Some(x) => (
            m * x.experts_ms,
            m * (x.router_ms + x.permute_ms),
            format!(
                "{} per rank × {:.0} tokens{}, {stage}",
                x.experts_per_rank,
                x.tokens_per_expert,
                if x.etp > 1 {
                    format!(" split over etp {}", x.etp)
                } else {
                    String::new()
                }
            ),
            where_it_runs(x),
            format!("expert-dp {}", x.expert_dp),
        ),
        None => (0.0, 0.0, String::new(), String::new(), String::new()),
    };
    let term = |name, ms, detail: String| Term { name, ms, detail };
    vec![
        term(
            "all-to-all dispatch and combine",
            t.expert_parallel_ms,
            dispatch_detail,
        ),
        term("expert GEMMs", experts_ms, experts_detail),
        term("router, permute and unpermute", routing_ms, stage.clone()),
        term(
            "rest of the slots (attention, dense and shared MLPs, recompute, tp comm)",
            t.steady_ms - experts_ms - routing_ms,
            stage,
        ),
        term("pipeline fill and drain", t.bubble_ms, String::new()),
        term(
            "pipeline sends on the critical path",
            t.pipeline_p2p_ms,
            String::new(),
        ),
        term(
            "data-parallel reduce and gather (exposed)",
            t.data_parallel_exposed_ms + t.param_gather_exposed_ms,
            String::new(),
        ),
        term(
            "expert-data-parallel sync (exposed)",
            t.expert_dp_exposed_ms,
            edp_detail,
        ),
        term("optimizer step", t.optimizer_ms, String::new()),
    ]
}

/// `8 ranks inside one node (NVLink)`, `16 ranks, 8 on a node, over the network at 46.5
/// GB/s`, `none (ep 1)`.
fn where_it_runs(x: &crate::model::time::ExpertTime) -> String {
    if x.ep <= 1 {
        return "none (ep 1)".to_string();
    }
    if x.dispatch.crosses_nodes {
        format!(
            "{} ranks, {} on a node, leave the node at {:.1} GB/s",
            x.ep, x.dispatch.on_node, x.dispatch.inter_gb_per_s
        )
    } else {
        format!("{} ranks inside one node (NVLink)", x.ep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::ClusterProfile;
    use crate::config::settings_from_megatron_args;
    use crate::plan::{plan, MappingMode, PlanOptions};

    /// A DeepSeek-V3-like model small enough to plan in a debug build: MLA, a shared
    /// expert, one dense first layer, 64 experts, one MTP layer.
    fn deepseek_like() -> crate::config::Settings {
        let args: Vec<String> = "--num-layers 13 --hidden-size 1024 --ffn-hidden-size 2816 \
             --num-attention-heads 16 --multi-latent-attention --q-lora-rank 384 \
             --kv-lora-rank 128 --qk-head-dim 64 --qk-pos-emb-head-dim 32 --v-head-dim 64 \
             --qk-layernorm --swiglu --normalization RMSNorm --disable-bias-linear \
             --position-embedding-type rope --untie-embeddings-and-output-weights \
             --num-experts 64 --moe-ffn-hidden-size 256 --moe-shared-expert-intermediate-size 256 \
             --moe-router-topk 6 --moe-layer-freq ([0]*1+[1]*12) \
             --moe-token-dispatcher-type alltoall --mtp-num-layers 1 --seq-length 2048 \
             --max-position-embeddings 2048 --vocab-size 32000 --global-batch-size 256 --bf16"
            .split_whitespace()
            .map(String::from)
            .collect();
        settings_from_megatron_args(&args, None, &[]).unwrap()
    }

    fn a100_2x8() -> ClusterProfile {
        let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples/clusters/a100-2x8.json");
        ClusterProfile::load(&file).unwrap()
    }

    /// Issue 29: the report holds the pick against the best of every other expert layout.
    /// Each one is what planning that layout alone (pinned, on torchrun's order) finds,
    /// figure for figure; its terms add up to its iteration; the report names each layout
    /// with its largest difference first. A dense plan has no such section.
    #[test]
    fn the_pick_is_held_against_the_best_of_every_other_expert_layout() {
        let settings = deepseek_like();
        let cluster = a100_2x8();
        let options = PlanOptions {
            budget: Some(500),
            top_k: 2,
            ..PlanOptions::default()
        };
        let p = plan(&settings, &cluster, &options).unwrap();
        let layouts = p
            .expert_layouts
            .as_ref()
            .expect("an MoE plan compares layouts");
        let pick = (p.config.ep, p.config.etp);
        assert_eq!(layouts.pick.config, p.config);
        assert!(layouts.others.len() >= 3, "{} others", layouts.others.len());
        let add_up = |t: &TimeEstimate| {
            let sum: f64 = terms(t).iter().map(|t| t.ms).sum();
            assert!(
                (sum - t.iteration_ms).abs() <= 1e-9 * t.iteration_ms,
                "{sum} vs {}",
                t.iteration_ms
            );
        };
        add_up(&layouts.pick.time);
        let mut seen = Vec::new();
        for other in &layouts.others {
            let layout = (other.config.ep, other.config.etp);
            assert_ne!(layout, pick, "the pick's own layout is not an other");
            assert!(!seen.contains(&layout), "{layout:?} twice");
            seen.push(layout);
            add_up(&other.time);
            let mut alone = settings.clone();
            alone.constraints.expert_parallel = Some(layout.0);
            alone.constraints.expert_tensor_parallel = Some(layout.1);
            let only = PlanOptions {
                mapping: MappingMode::Identity,
                top_k: 1,
                ..options.clone()
            };
            let best = plan(&alone, &cluster, &only).unwrap();
            assert_eq!(best.config, other.config, "{layout:?}");
            assert!(
                (best.estimate.iteration_ms - other.time.iteration_ms).abs()
                    <= 1e-9 * best.estimate.iteration_ms,
                "{layout:?}: {} vs {}",
                best.estimate.iteration_ms,
                other.time.iteration_ms
            );
        }
        let ms: Vec<f64> = layouts.others.iter().map(|o| o.time.iteration_ms).collect();
        assert!(ms.windows(2).all(|w| w[0] <= w[1]), "fastest first: {ms:?}");
        let text = why_this_layout(&p);
        assert!(
            text.contains(&format!("Why ep {} × etp {}:", pick.0, pick.1)),
            "{text}"
        );
        for other in layouts.others.iter().take(SHOWN) {
            assert!(
                text.contains(&format!(
                    "  ep {} × etp {}: {:.1} ms",
                    other.config.ep, other.config.etp, other.time.iteration_ms
                )),
                "{text}"
            );
        }
        // The first layout's lines, largest difference first.
        let first: Vec<f64> = text
            .lines()
            .skip_while(|l| !l.starts_with("  ep "))
            .skip(1)
            .take_while(|l| l.starts_with("    ") && l.contains(" ms "))
            .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
            .collect();
        assert!(!first.is_empty(), "{text}");
        assert!(
            first.windows(2).all(|w| w[0].abs() >= w[1].abs()),
            "{first:?}\n{text}"
        );

        let dense: Vec<String> = ["--bf16", "--global-batch-size", "64"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let dense = settings_from_megatron_args(&dense, Some("gpt3-1.3b"), &[]).unwrap();
        let p = plan(&dense, &cluster, &options).unwrap();
        assert!(p.expert_layouts.is_none());
        assert_eq!(why_this_layout(&p), "");
    }
}
