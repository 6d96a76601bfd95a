//! Layer splits for pipelines whose stages differ in speed and memory (heterogeneous
//! clusters): how many transformer layers each stage gets.
//!
//! [`balance_layers`] takes, per stage, the modelled time of one micro-batch slot with `l`
//! layers (the time model's own figure, so the first stage's embedding and the last
//! stage's output layer and loss count as the extra work they are) and whether `l` layers
//! fit in that stage's memory (the memory model's own figure for that stage, with its
//! micro-batches in flight, against its own GPUs' memory). It returns the split with the
//! smallest slowest slot, which is what the 1F1B steady state and bubble pay for:
//!
//! 1. every stage's **capacity**: the most layers that fit in its memory;
//! 2. **water-filling**: every stage starts with one layer, then each further layer goes to
//!    the stage whose slot would be shortest with it, among the stages below capacity.
//!
//! Water-filling is the whole-layer form of "split in proportion to speed, then move layers
//! off an overflowing stage to the stage with the most slack": with linear slot times it
//! gives each stage layers in proportion to its speed less its extra work, rounded so
//! that the slowest slot is as short as whole layers allow, and a stage at capacity simply
//! takes no more, its share going to the stages that are then fastest. For slot times that
//! grow with the layers it is exact: no other split of whole layers within the capacities
//! has a shorter slowest slot (a layer taken from the stage that sets the maximum must go
//! somewhere that was, when it was placed, at least as slow).
//!
//! [`refine_split`] then tries moving one layer between two stages under the full time
//! model (pipeline sends, data-parallel reduce), keeping a move only when the modelled
//! iteration time drops and the split stays ordered by speed ([`SpeedOrder`]).
//!
//! Pure, deterministic (ties go to the earlier stage), O(layers × stages) slot evaluations.

pub use crate::model::parallel::stage_starts;

/// Parameters of each pipeline stage, over all its tensor-parallel ranks together, with
/// each stage's own layers ([`stage_starts`]).
pub fn stage_parameters(
    breakdown: &crate::model::params::ParameterBreakdown,
    layers_per_stage: &[u64],
) -> Vec<u64> {
    let last = layers_per_stage.len().saturating_sub(1);
    stage_starts(layers_per_stage)
        .into_iter()
        .zip(layers_per_stage)
        .enumerate()
        .map(|(i, (start, layers))| breakdown.stage_from(start, *layers, i == 0, i == last))
        .collect()
}

/// The most layers of `max` that fit on stage `stage`, given `fits` grows false with the
/// layers (memory grows with them). 0 when not even one fits.
pub(crate) fn layer_capacity(stage: usize, max: u64, fits: &impl Fn(usize, u64) -> bool) -> u64 {
    if max == 0 || !fits(stage, 1) {
        return 0;
    }
    // Binary search for the last count that fits in 1..=max.
    let (mut lo, mut hi) = (1, max);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(stage, mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// A split of `layers` over `stages` stages (at least one layer each) with the smallest
/// slowest slot, every stage within its memory; `None` when no such split exists.
///
/// `slot_ms(s, l)`: stage `s`'s time for one micro-batch with `l` layers (must grow with
/// `l`); `fits(s, l)`: whether `l` layers fit in stage `s`'s memory (true up to some count,
/// false beyond). Also returns each stage's capacity.
pub fn balance_layers(
    layers: u64,
    stages: usize,
    slot_ms: impl Fn(usize, u64) -> f64,
    fits: impl Fn(usize, u64) -> bool,
) -> Option<BalancedSplit> {
    if stages == 0 || layers < stages as u64 {
        return None;
    }
    let most = layers - (stages as u64 - 1);
    let caps: Vec<u64> = (0..stages)
        .map(|s| layer_capacity(s, most, &fits))
        .collect();
    if caps.contains(&0) || caps.iter().sum::<u64>() < layers {
        return None;
    }
    let mut split = vec![1u64; stages];
    // Each stage's slot with one more layer, recomputed only for the stage that took it.
    let mut next: Vec<f64> = (0..stages).map(|s| slot_ms(s, 2)).collect();
    for _ in stages as u64..layers {
        let mut best: Option<usize> = None;
        for s in 0..stages {
            if split[s] < caps[s] && best.is_none_or(|b| next[s] < next[b]) {
                best = Some(s);
            }
        }
        let s = best.expect("capacities sum to at least the layers");
        split[s] += 1;
        next[s] = slot_ms(s, split[s] + 1);
    }
    Some(BalancedSplit {
        layers: split,
        capacity: caps,
    })
}

/// A balanced split and each stage's capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BalancedSplit {
    /// Layers per stage, first to last.
    pub layers: Vec<u64>,
    /// Per stage, the most layers its memory holds.
    pub capacity: Vec<u64>,
}

/// Which splits keep the stages ordered by speed: no stage holds fewer layers than a
/// strictly slower stage of the same class of memory while it could hold more.
/// `speed_rank[s]` orders stages by speed (higher is faster), `memory_class[s]` groups
/// stages of equal memory, and only stages without extra work (not the first or last) are
/// compared, as the embedding and loss rightly take layers off their stages.
///
/// [`refine_split`] asks this of every one-layer move of every round, so besides the whole
/// check ([`SpeedOrder::ordered`], O(stages²)) it answers for a move from the pairs the
/// split before the move had out of order ([`SpeedOrder::ordered_after_move`], O(stages)):
/// a move changes only the pairs of the two stages it touches.
#[derive(Debug, Clone, Copy)]
pub struct SpeedOrder<'a> {
    pub capacity: &'a [u64],
    pub speed_rank: &'a [u64],
    pub memory_class: &'a [u64],
}

impl SpeedOrder<'_> {
    /// Whether stage `i` holds fewer layers than the slower stage `j` of its memory class
    /// while it could hold more (both in the middle of the pipeline).
    #[inline]
    fn out_of_order(&self, split: &[u64], i: usize, j: usize) -> bool {
        self.speed_rank[i] > self.speed_rank[j]
            && self.memory_class[i] == self.memory_class[j]
            && split[i] < split[j]
            && split[i] < self.capacity[i]
    }

    fn middle(split: &[u64]) -> std::ops::Range<usize> {
        1..split.len().saturating_sub(1)
    }

    /// Whether `split` is ordered by speed (see the type's doc).
    pub fn ordered(&self, split: &[u64]) -> bool {
        let middle = Self::middle(split);
        middle
            .clone()
            .all(|i| middle.clone().all(|j| !self.out_of_order(split, i, j)))
    }

    /// The pairs `(i, j)` of `split` that are out of order.
    pub fn out_of_order_pairs(&self, split: &[u64]) -> Vec<(usize, usize)> {
        let middle = Self::middle(split);
        middle
            .clone()
            .flat_map(|i| middle.clone().map(move |j| (i, j)))
            .filter(|&(i, j)| self.out_of_order(split, i, j))
            .collect()
    }

    /// [`SpeedOrder::ordered`] of `moved`, a split that differs from one whose
    /// out-of-order pairs were `before` only at stages `a` and `b`: the pairs that touch
    /// neither stage are as they were (so none of `before` may be among them), and those
    /// that touch one are checked anew.
    pub fn ordered_after_move(
        &self,
        moved: &[u64],
        a: usize,
        b: usize,
        before: &[(usize, usize)],
    ) -> bool {
        let touches = |(i, j): (usize, usize)| i == a || i == b || j == a || j == b;
        if !before.iter().all(|&p| touches(p)) {
            return false;
        }
        let middle = Self::middle(moved);
        [a, b].into_iter().filter(|s| middle.contains(s)).all(|s| {
            middle
                .clone()
                .all(|o| !self.out_of_order(moved, s, o) && !self.out_of_order(moved, o, s))
        })
    }
}

/// Improves `split` by moving one layer at a time between two stages while `cost` (the
/// full modelled iteration time; `None` when the split does not fit) drops, at most
/// `rounds` moves, each the best single move; a move is costed only when its split is
/// ordered by speed (`order`). Returns the split and its cost.
pub fn refine_split(
    mut split: Vec<u64>,
    mut current: f64,
    rounds: usize,
    order: &SpeedOrder<'_>,
    mut cost: impl FnMut(&[u64]) -> Option<f64>,
) -> (Vec<u64>, f64) {
    let n = split.len();
    for _ in 0..rounds {
        let before = order.out_of_order_pairs(&split);
        let mut best: Option<(f64, usize, usize)> = None;
        for from in 0..n {
            if split[from] <= 1 {
                continue;
            }
            for to in (0..n).filter(|&to| to != from) {
                split[from] -= 1;
                split[to] += 1;
                if order.ordered_after_move(&split, from, to, &before) {
                    if let Some(c) = cost(&split) {
                        if c < current && best.is_none_or(|b| c < b.0) {
                            best = Some((c, from, to));
                        }
                    }
                }
                split[from] += 1;
                split[to] -= 1;
            }
        }
        let Some((c, from, to)) = best else {
            break;
        };
        split[from] -= 1;
        split[to] += 1;
        current = c;
    }
    (split, current)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DeepSeek-V3's first three layers are dense: a first stage of 9 layers holds fewer
    /// parameters than a middle one of 9, and the stages add up to the model.
    #[test]
    fn stages_count_the_layers_they_hold() {
        assert_eq!(
            stage_starts(&[9, 10, 10, 10, 10, 12]),
            [0, 9, 19, 29, 39, 49]
        );
        let model = crate::config::presets::preset("deepseek-v3")
            .unwrap()
            .model()
            .unwrap();
        let b = crate::model::params::ParameterBreakdown::new(&model, 1);
        let split = [9, 9, 9, 9, 9, 16];
        let per_stage = stage_parameters(&b, &split);
        assert!(per_stage[0] < per_stage[1] + b.embedding());
        assert_eq!(per_stage[1], per_stage[2]);
        assert_eq!(per_stage.iter().sum::<u64>(), b.total());
    }
    use proptest::prelude::*;

    /// A synthetic pipeline: per stage a speed (ms per layer) and a memory capacity; the
    /// first stage's embedding and the last stage's loss cost `extra` layers of work and
    /// memory; stage `s` of `pp` keeps `pp − s` micro-batches of activations per layer.
    #[derive(Debug)]
    struct Pipeline {
        ms_per_layer: Vec<f64>,
        capacity: Vec<u64>,
        extra: f64,
        weights: u64,
        activations: u64,
    }

    impl Pipeline {
        fn slot(&self, s: usize, l: u64) -> f64 {
            let ends = u64::from(s == 0) + u64::from(s + 1 == self.ms_per_layer.len());
            (l as f64 + self.extra * ends as f64) * self.ms_per_layer[s]
        }

        fn memory(&self, s: usize, l: u64) -> u64 {
            let pp = self.ms_per_layer.len() as u64;
            l * (self.weights + self.activations * (pp - s as u64))
        }

        fn fits(&self, s: usize, l: u64) -> bool {
            self.memory(s, l) <= self.capacity[s]
        }
    }

    #[test]
    fn a_twice_as_fast_stage_takes_twice_the_layers() {
        let p = Pipeline {
            ms_per_layer: vec![1.0, 2.0, 2.0, 1.0],
            capacity: vec![u64::MAX; 4],
            extra: 0.0,
            weights: 1,
            activations: 0,
        };
        let split = balance_layers(30, 4, |s, l| p.slot(s, l), |s, l| p.fits(s, l)).unwrap();
        assert_eq!(split.layers, [10, 5, 5, 10]);
    }

    #[test]
    fn a_full_stage_passes_its_share_on() {
        // The fast first stage could take 20 layers but holds 12.
        let p = Pipeline {
            ms_per_layer: vec![1.0, 3.0],
            capacity: vec![12, 100],
            extra: 0.0,
            weights: 1,
            activations: 0,
        };
        let split = balance_layers(24, 2, |s, l| p.slot(s, l), |s, l| p.fits(s, l)).unwrap();
        assert_eq!(split.layers, [12, 12]);
        assert_eq!(split.capacity, [12, 23]);
        assert!(balance_layers(24, 2, |s, l| p.slot(s, l), |_, l| l <= 11).is_none());
    }

    #[test]
    fn refinement_keeps_only_moves_that_pay() {
        let unordered = SpeedOrder {
            capacity: &[10, 10],
            speed_rank: &[0, 0],
            memory_class: &[0, 0],
        };
        let (split, cost) = refine_split(vec![5, 5], 10.0, 4, &unordered, |s| {
            Some((s[0] as f64 - 7.0).abs() + 8.0)
        });
        assert_eq!(split, [7, 3]);
        assert_eq!(cost, 8.0);
    }

    fn pipeline() -> impl Strategy<Value = (Pipeline, u64)> {
        (
            prop::collection::vec((1u32..=4, 0usize..=2), 1..=8),
            prop::collection::vec(20u64..=200, 3),
            0u32..=3,
            1u64..=4,
            0u64..=3,
            1u64..=96,
        )
            .prop_map(|(stages, memories, extra, weights, activations, layers)| {
                let pipeline = Pipeline {
                    ms_per_layer: stages.iter().map(|(k, _)| 1.0 / f64::from(*k)).collect(),
                    capacity: stages.iter().map(|(_, m)| memories[*m]).collect(),
                    extra: f64::from(extra) / 2.0,
                    weights,
                    activations,
                };
                (pipeline, layers)
            })
    }

    proptest! {
        /// The check of one move from the pairs out of order before it is the whole check.
        #[test]
        fn a_moves_order_check_is_the_whole_check(
            stages in prop::collection::vec((1u64..=6, 0u64..=3, 0u64..=1, 1u64..=6), 1..=9),
        ) {
            let split: Vec<u64> = stages.iter().map(|s| s.0).collect();
            let speed_rank: Vec<u64> = stages.iter().map(|s| s.1).collect();
            let memory_class: Vec<u64> = stages.iter().map(|s| s.2).collect();
            let capacity: Vec<u64> = stages.iter().map(|s| s.0 + s.3 - 1).collect();
            let order = SpeedOrder {
                capacity: &capacity,
                speed_rank: &speed_rank,
                memory_class: &memory_class,
            };
            let before = order.out_of_order_pairs(&split);
            prop_assert_eq!(before.is_empty(), order.ordered(&split));
            for from in 0..split.len() {
                for to in 0..split.len() {
                    if from == to || split[from] <= 1 {
                        continue;
                    }
                    let mut moved = split.clone();
                    moved[from] -= 1;
                    moved[to] += 1;
                    prop_assert_eq!(
                        order.ordered_after_move(&moved, from, to, &before),
                        order.ordered(&moved),
                        "{:?} → {:?}", split, moved
                    );
                }
            }
        }

        #[test]
        fn splits_sum_fit_and_favour_faster_stages((p, layers) in pipeline()) {
            let pp = p.ms_per_layer.len();
            let Some(split) = balance_layers(layers, pp, |s, l| p.slot(s, l), |s, l| p.fits(s, l))
            else {
                // Nothing fits: then not even the most each stage holds adds up.
                let most: u64 = (0..pp)
                    .map(|s| (0..=layers).take_while(|&l| p.fits(s, l)).last().unwrap_or(0))
                    .sum();
                prop_assert!(layers < pp as u64 || most < layers
                    || (0..pp).any(|s| !p.fits(s, 1)));
                return Ok(());
            };
            prop_assert_eq!(split.layers.iter().sum::<u64>(), layers);
            for s in 0..pp {
                prop_assert!(split.layers[s] >= 1);
                prop_assert!(p.fits(s, split.layers[s]), "stage {} overflows: {:?}", s, split);
            }
            // A faster stage never holds fewer layers than a slower one with equal memory
            // unless it is full (stages in the middle: the ends carry extra work).
            for i in 1..pp.saturating_sub(1) {
                for j in 1..pp - 1 {
                    if p.ms_per_layer[i] < p.ms_per_layer[j]
                        && p.capacity[i] == p.capacity[j]
                        && split.layers[i] < split.layers[j]
                    {
                        prop_assert!(!p.fits(i, split.layers[i] + 1),
                            "stage {} (faster) has fewer layers than {}: {:?}", i, j, split);
                    }
                }
            }
            // No split within capacity has a shorter slowest slot than one layer moved.
            let worst = |l: &[u64]| (0..pp).map(|s| p.slot(s, l[s])).fold(0.0, f64::max);
            let balanced = worst(&split.layers);
            for from in 0..pp {
                for to in 0..pp {
                    let mut moved = split.layers.clone();
                    if from == to || moved[from] <= 1 || moved[to] >= split.capacity[to] {
                        continue;
                    }
                    moved[from] -= 1;
                    moved[to] += 1;
                    prop_assert!(worst(&moved) >= balanced);
                }
            }
        }
    }
}
