//! The pipeline timeline of one iteration: a forward and a backward block per micro-batch
//! (per model chunk with the interleaved schedule) on every stage, in the order Megatron
//! runs them, so the fill and drain bubble shows as the idle time at either end.
//!
//! The durations are the time model's per-stage estimates ([`StageTime`]: forward,
//! backward with recomputation, exposed tp communication split in their proportion; a
//! chunk takes its share of the stage's layers) and its pipeline hops; the order is
//! megatron-core's (`schedules.py`: 1F1B's warm-up of `pp − s − 1` forwards, the
//! interleaved schedule's table of micro-batch groups of `pp`, warm-up of
//! `2(pp − s − 1) + (v − 1)·pp`, all forwards first when `m = pp`). The exposed
//! data-parallel communication follows the last block.

use std::collections::HashMap;

use crate::model::time::{StageTime, TimeEstimate};
use crate::model::ParallelConfig;

use super::svg::{Anchor, Svg};
use super::{fit, ms_text};

/// Forward or backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pass {
    Forward,
    Backward,
}

/// One block of the timeline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Block {
    pub stage: usize,
    /// The model chunk (0 without interleaving).
    pub chunk: usize,
    pub microbatch: u64,
    pub pass: Pass,
    pub start_ms: f64,
    pub end_ms: f64,
}

/// The most blocks a timeline simulates and draws. A prime global batch of 4,194,301 gave
/// as many micro-batches: 171 s and a 5.5 GB picture. Above this the picture shows the
/// first micro-batches only (whole groups of pp, at least one), and says so: the steady
/// state repeats, and the iteration's time is the time model's, printed beside it.
pub const MAX_BLOCKS: u64 = 10_000;

/// How many of `m` micro-batches a timeline of `stages` stages and `chunks` chunks draws.
fn drawn_microbatches(stages: usize, chunks: usize, m: u64) -> u64 {
    let per_microbatch = 2 * stages.max(1) as u64 * chunks.max(1) as u64;
    if m.saturating_mul(per_microbatch) <= MAX_BLOCKS {
        return m;
    }
    let group = stages.max(1) as u64;
    (MAX_BLOCKS / per_microbatch / group).max(1) * group
}

/// One iteration's pipeline, simulated.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    pub stages: usize,
    pub chunks: usize,
    /// The iteration's micro-batches.
    pub microbatches: u64,
    /// Those simulated and drawn: all of them up to [`MAX_BLOCKS`] blocks, else the first.
    pub drawn: u64,
    pub blocks: Vec<Block>,
    /// When the last block ends.
    pub pipeline_ms: f64,
    /// The exposed data-parallel reduce and parameter gather after it.
    pub data_parallel_ms: f64,
}

impl Schedule {
    /// Idle time inside the pipeline's span over all stages, as a share of it.
    pub fn bubble_share(&self) -> f64 {
        if self.pipeline_ms <= 0.0 || self.stages == 0 {
            return 0.0;
        }
        let busy: f64 = self.blocks.iter().map(|b| b.end_ms - b.start_ms).sum();
        (1.0 - busy / (self.pipeline_ms * self.stages as f64)).max(0.0)
    }
}

/// A stage's forward and backward time for one micro-batch on one chunk: compute with the
/// exposed tp communication shared in proportion.
fn pass_ms(stage: &StageTime, chunks: usize) -> (f64, f64) {
    let compute = stage.forward_ms + stage.backward_ms;
    let share = if compute > 0.0 {
        stage.forward_ms / compute
    } else {
        0.5
    };
    let v = chunks.max(1) as f64;
    (
        (stage.forward_ms + stage.tp_comm_ms * share) / v,
        (stage.backward_ms + stage.tp_comm_ms * (1.0 - share)) / v,
    )
}

/// The order of one stage's work: (pass, chunk, micro-batch).
fn stage_order(stage: usize, stages: usize, chunks: usize, m: u64) -> Vec<(Pass, usize, u64)> {
    // megatron-core's schedule table: groups of `pp` micro-batches, each group through
    // every chunk in turn.
    let mut table: Vec<(usize, u64)> = Vec::new();
    let group = stages.max(1) as u64;
    let mut first = 0;
    while first < m {
        let last = (first + group).min(m);
        for chunk in 0..chunks {
            for mb in first..last {
                table.push((chunk, mb));
            }
        }
        first = last;
    }
    let total = table.len();
    let warmup = if chunks == 1 {
        (stages - stage - 1).min(total)
    } else if m == stages as u64 {
        total
    } else {
        ((stages - stage - 1) * 2 + (chunks - 1) * stages).min(total)
    };
    let forward = |k: usize| (Pass::Forward, table[k].0, table[k].1);
    let backward = |k: usize| (Pass::Backward, chunks - 1 - table[k].0, table[k].1);
    let mut order: Vec<(Pass, usize, u64)> = (0..warmup).map(forward).collect();
    for k in 0..total - warmup {
        order.push(forward(warmup + k));
        order.push(backward(k));
    }
    order.extend((total - warmup..total).map(backward));
    order
}

/// Simulates one iteration of `config`'s pipeline with `time`'s estimates.
pub fn schedule(config: &ParallelConfig, time: &TimeEstimate) -> Schedule {
    let stages = time.stages.len().max(1);
    let chunks = config.vpp.unwrap_or(1).max(1) as usize;
    let microbatches = time.microbatches.max(1);
    let m = drawn_microbatches(stages, chunks, microbatches);
    let passes: Vec<(f64, f64)> = (0..stages)
        .map(|s| {
            time.stages
                .get(s)
                .map_or((0.0, 0.0), |t| pass_ms(t, chunks))
        })
        .collect();
    // One direction of a hop: half its activation-and-gradient time.
    let hop = |from: usize, to: usize| -> f64 {
        time.pipeline
            .hops
            .iter()
            .find(|h| h.from_stage == from && h.to_stage == to)
            .map_or(0.0, |h| h.ms / 2.0)
    };
    let orders: Vec<Vec<(Pass, usize, u64)>> = (0..stages)
        .map(|s| stage_order(s, stages, chunks, m))
        .collect();
    let mut done: HashMap<(Pass, usize, usize, u64), f64> = HashMap::new();
    let mut next = vec![0usize; stages];
    let mut free = vec![0.0f64; stages];
    let mut blocks = Vec::new();
    loop {
        let mut progress = false;
        for s in 0..stages {
            while let Some(&(pass, chunk, mb)) = orders[s].get(next[s]) {
                let ready = match pass {
                    Pass::Forward if s > 0 => done
                        .get(&(Pass::Forward, s - 1, chunk, mb))
                        .map(|t| t + hop(s - 1, s)),
                    Pass::Forward if chunk > 0 => done
                        .get(&(Pass::Forward, stages - 1, chunk - 1, mb))
                        .map(|t| t + hop(stages - 1, 0)),
                    Pass::Forward => Some(0.0),
                    Pass::Backward if s + 1 < stages => done
                        .get(&(Pass::Backward, s + 1, chunk, mb))
                        .map(|t| t + hop(s, s + 1)),
                    Pass::Backward if chunk + 1 < chunks => done
                        .get(&(Pass::Backward, 0, chunk + 1, mb))
                        .map(|t| t + hop(stages - 1, 0)),
                    Pass::Backward => done.get(&(Pass::Forward, s, chunk, mb)).copied(),
                };
                let Some(ready) = ready else { break };
                let start = ready.max(free[s]);
                let length = match pass {
                    Pass::Forward => passes[s].0,
                    Pass::Backward => passes[s].1,
                };
                let end = start + length;
                done.insert((pass, s, chunk, mb), end);
                free[s] = end;
                blocks.push(Block {
                    stage: s,
                    chunk,
                    microbatch: mb,
                    pass,
                    start_ms: start,
                    end_ms: end,
                });
                next[s] += 1;
                progress = true;
            }
        }
        if !progress {
            break;
        }
    }
    let pipeline_ms = free.iter().copied().fold(0.0, f64::max);
    Schedule {
        stages,
        chunks,
        microbatches,
        drawn: m,
        blocks,
        pipeline_ms,
        data_parallel_ms: time.data_parallel_exposed_ms + time.param_gather_exposed_ms,
    }
}

fn schedule_name(s: &Schedule) -> String {
    if s.stages <= 1 {
        "one stage (no pipeline)".to_string()
    } else if s.chunks > 1 {
        format!("interleaved, {} chunks per stage", s.chunks)
    } else {
        "1F1B".to_string()
    }
}

/// `8 micro-batches`, or `the first 96 of 4194301 micro-batches` when cut.
fn microbatches_text(s: &Schedule) -> String {
    if s.drawn < s.microbatches {
        format!("the first {} of {} micro-batches", s.drawn, s.microbatches)
    } else {
        crate::report::micro_batches(s.microbatches)
    }
}

fn block_colour(b: &Block, chunks: usize) -> String {
    pass_colour(b.pass, b.chunk, chunks)
}

/// A pass's shade: later model chunks lighter.
fn pass_colour(pass: Pass, chunk: usize, chunks: usize) -> String {
    let light = 20.0 * chunk as f64 / chunks.max(1) as f64;
    match pass {
        Pass::Forward => format!("hsl(208,68%,{:.0}%)", 58.0 + light),
        Pass::Backward => format!("hsl(28,85%,{:.0}%)", 52.0 + light),
    }
}

/// A round step for an axis of `span`: 1, 2 or 5 times a power of ten, about 8 ticks.
fn tick_step(span: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / 8.0;
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * power)
}

pub fn svg(config: &ParallelConfig, time: &TimeEstimate) -> String {
    let s = schedule(config, time);
    let left = 80.0;
    let plot = 1080.0;
    let row = if s.stages <= 16 {
        28.0
    } else {
        (448.0 / s.stages as f64).max(6.0)
    };
    let top = 70.0;
    let total = (s.pipeline_ms + s.data_parallel_ms).max(1e-9);
    let scale = plot / total;
    let height = top + row * s.stages as f64 + 70.0;
    let mut svg = Svg::new(left + plot + 30.0, height);
    // One stage is no pipeline: nothing waits on another stage, so no bubble to name.
    let piped = s.stages > 1;
    if piped {
        svg.title(&format!(
            "Pipeline timeline of one iteration: {}, {}, {} stages",
            schedule_name(&s),
            microbatches_text(&s),
            s.stages
        ));
        svg.note(42.0, &format!(
            "pipeline {} (idle share {:.0} %: the bubble), then exposed data-parallel communication {}; the time model's critical path: {}",
            ms_text(s.pipeline_ms),
            s.bubble_share() * 100.0,
            ms_text(s.data_parallel_ms),
            ms_text(time.iteration_ms)
        ));
    } else {
        svg.title(&format!(
            "Timeline of one iteration: {}, {}",
            schedule_name(&s),
            microbatches_text(&s),
        ));
        svg.note(42.0, &format!(
            "forward and backward passes {}, then exposed data-parallel communication {}; the time model's critical path: {}",
            ms_text(s.pipeline_ms),
            ms_text(s.data_parallel_ms),
            ms_text(time.iteration_ms)
        ));
    }
    // Legend swatches.
    let mut x = 10.0;
    for (class, fill, label) in [
        ("legend-fwd", "hsl(208,68%,58%)", "forward"),
        ("legend-bwd", "hsl(28,85%,52%)", "backward"),
        ("legend-idle", "#eeeeee", "idle (bubble)"),
        ("legend-dp", "#9a9a9a", "data-parallel (exposed)"),
    ]
    .into_iter()
    .filter(|(class, ..)| piped || *class != "legend-idle")
    {
        svg.rect(x, 50.0, 14.0, 12.0, class, fill, "");
        svg.text(x + 18.0, 60.0, 11.0, Anchor::Start, "legend", label);
        x += 40.0 + 7.0 * label.len() as f64;
    }
    // Interleaved: each chunk's two shades (forward, backward), so the lighter blocks read.
    if s.chunks > 1 {
        for chunk in 0..s.chunks {
            for (k, pass) in [Pass::Forward, Pass::Backward].into_iter().enumerate() {
                svg.rect(
                    x + 15.0 * k as f64,
                    50.0,
                    14.0,
                    12.0,
                    "legend-chunk",
                    &pass_colour(pass, chunk, s.chunks),
                    "",
                );
            }
            let label = format!("chunk {chunk}");
            svg.text(x + 34.0, 60.0, 11.0, Anchor::Start, "legend", &label);
            x += 50.0 + 7.0 * label.len() as f64;
        }
    }
    for stage in 0..s.stages {
        let y = top + stage as f64 * row;
        svg.rect(
            left,
            y + 1.0,
            s.pipeline_ms * scale,
            row - 2.0,
            "lane",
            "#eeeeee",
            "",
        );
        if row >= 10.0 {
            svg.text(
                left - 6.0,
                y + row / 2.0 + 4.0,
                (row * 0.45).min(11.0),
                Anchor::End,
                "stage",
                &format!("stage {stage}"),
            );
        }
        if s.data_parallel_ms > 0.0 {
            svg.rect(
                left + s.pipeline_ms * scale,
                y + 1.0,
                s.data_parallel_ms * scale,
                row - 2.0,
                "dp",
                "#9a9a9a",
                &format!(
                    "exposed data-parallel communication {}",
                    ms_text(s.data_parallel_ms)
                ),
            );
        }
    }
    for b in &s.blocks {
        let y = top + b.stage as f64 * row;
        let w = (b.end_ms - b.start_ms) * scale;
        let class = match b.pass {
            Pass::Forward => "fwd",
            Pass::Backward => "bwd",
        };
        let chunk = if s.chunks > 1 {
            format!(", chunk {}", b.chunk)
        } else {
            String::new()
        };
        svg.rect(
            left + b.start_ms * scale,
            y + 1.0,
            w,
            row - 2.0,
            class,
            &block_colour(b, s.chunks),
            &format!(
                "stage {} {} micro-batch {}{chunk}: {} – {}",
                b.stage,
                if b.pass == Pass::Forward {
                    "forward"
                } else {
                    "backward"
                },
                b.microbatch,
                ms_text(b.start_ms),
                ms_text(b.end_ms)
            ),
        );
        let label = b.microbatch.to_string();
        if w >= 7.0 * label.len() as f64 + 4.0 && row >= 14.0 {
            svg.text(
                left + b.start_ms * scale + w / 2.0,
                y + row / 2.0 + 4.0,
                10.0,
                Anchor::Middle,
                "mb",
                &label,
            );
        }
    }
    // Time axis.
    let axis = top + row * s.stages as f64 + 6.0;
    svg.line((left, axis), (left + plot, axis), "axis", "#444", 1.0, "");
    let step = tick_step(total);
    let mut t = 0.0;
    while t <= total + 1e-9 {
        let x = left + t * scale;
        svg.line((x, axis), (x, axis + 5.0), "tick", "#444", 1.0, "");
        svg.text(x, axis + 18.0, 10.0, Anchor::Middle, "tick", &ms_text(t));
        t += step;
    }
    svg.text(
        left + plot / 2.0,
        axis + 38.0,
        11.0,
        Anchor::Middle,
        "axis",
        "time since the iteration began (the time model's estimates)",
    );
    svg.finish()
}

pub fn text(config: &ParallelConfig, time: &TimeEstimate) -> String {
    let s = schedule(config, time);
    let width = 70usize;
    let total = (s.pipeline_ms + s.data_parallel_ms).max(1e-9);
    let mut out = fit(
        &format!(
            "Timeline of one iteration: {}, {}",
            schedule_name(&s),
            microbatches_text(&s)
        ),
        80,
    );
    out.push('\n');
    out.push_str(&fit(
        &format!(
            "  F forward, B backward, # both, . idle (the bubble, {:.0} %), = data-parallel",
            s.bubble_share() * 100.0
        ),
        80,
    ));
    out.push('\n');
    for stage in 0..s.stages {
        // Each column shows what fills most of its time on this stage.
        let mut forward = vec![0.0f64; width];
        let mut backward = vec![0.0f64; width];
        let column = total / width as f64;
        for b in s.blocks.iter().filter(|b| b.stage == stage) {
            let (from, to) = (b.start_ms / column, b.end_ms / column);
            let first = from.floor() as usize;
            let last = (to.ceil() as usize).min(width);
            for (c, (f, bw)) in forward
                .iter_mut()
                .zip(backward.iter_mut())
                .enumerate()
                .take(last)
                .skip(first)
            {
                let overlap = (to.min(c as f64 + 1.0) - from.max(c as f64)).max(0.0);
                match b.pass {
                    Pass::Forward => *f += overlap,
                    Pass::Backward => *bw += overlap,
                }
            }
        }
        let line: String = (0..width)
            .map(|c| {
                let mid = (c as f64 + 0.5) * column;
                if mid > s.pipeline_ms {
                    '='
                } else if forward[c] + backward[c] < 0.5 {
                    '.'
                } else if forward[c] >= 2.0 * backward[c] {
                    'F'
                } else if backward[c] >= 2.0 * forward[c] {
                    'B'
                } else {
                    '#'
                }
            })
            .collect();
        out.push_str(&format!("  s{stage:<3} {line}\n"));
    }
    out.push_str(&fit(
        &format!("        0{:>w$}", ms_text(total), w = width - 1),
        80,
    ));
    out.push('\n');
    out.push_str(&fit(
        &format!(
            "  pipeline {}, then data-parallel {}; the model's critical path: {}",
            ms_text(s.pipeline_ms),
            ms_text(s.data_parallel_ms),
            ms_text(time.iteration_ms)
        ),
        80,
    ));
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(order: &[(Pass, usize, u64)], pass: Pass) -> usize {
        order.iter().filter(|o| o.0 == pass).count()
    }

    #[test]
    fn every_stage_runs_every_micro_batch_once_each_way() {
        for (stages, chunks, m) in [(4, 1, 8), (4, 2, 8), (4, 3, 4), (3, 2, 7), (1, 1, 5)] {
            for s in 0..stages {
                let order = stage_order(s, stages, chunks, m);
                assert_eq!(count(&order, Pass::Forward), chunks * m as usize);
                assert_eq!(count(&order, Pass::Backward), chunks * m as usize);
                // A backward never precedes its own forward.
                for (i, (p, c, mb)) in order.iter().enumerate() {
                    if *p == Pass::Backward {
                        assert!(order[..i].contains(&(Pass::Forward, *c, *mb)));
                    }
                }
            }
        }
        // 1F1B: the first stage warms up with pp − 1 forwards, the last with none.
        let first = stage_order(0, 4, 1, 8);
        assert_eq!(
            &first[..4].iter().map(|o| o.0).collect::<Vec<_>>(),
            &[Pass::Forward; 4]
        );
        assert_eq!(first[4].0, Pass::Backward);
        assert_eq!(stage_order(3, 4, 1, 8)[1].0, Pass::Backward);
    }

    /// N2: a prime global batch of 4,194,301 micro-batches took 171 s and drew a 5.5 GB
    /// picture; the timeline now draws whole groups of pp up to MAX_BLOCKS blocks.
    #[test]
    fn n2_a_huge_micro_batch_count_draws_a_bounded_timeline() {
        assert_eq!(drawn_microbatches(4, 1, 8), 8);
        for (stages, chunks) in [(1, 1), (4, 1), (4, 3), (64, 2), (300, 1)] {
            let drawn = drawn_microbatches(stages, chunks, 4_194_301);
            assert_eq!(drawn % stages as u64, 0);
            assert!(drawn >= stages as u64);
            if drawn > stages as u64 {
                assert!(drawn * 2 * (stages * chunks) as u64 <= MAX_BLOCKS);
            }
        }
    }

    #[test]
    fn tick_steps_are_round() {
        assert_eq!(tick_step(100.0), 20.0);
        assert_eq!(tick_step(3579.5), 500.0);
        assert_eq!(tick_step(0.0), 1.0);
    }
}
