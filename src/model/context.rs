//! Context parallelism: what one rank of a context-parallel group computes and keeps, and
//! Megatron's rules for splitting the sequence.
//!
//! Megatron cuts each sequence into 2·cp chunks and gives rank i chunks i and 2·cp − 1 − i
//! (`get_batch_on_this_cp_rank`, megatron-core utils.py), so that causal attention is
//! balanced. Every token-wise tensor on a rank (norms, the linear layers' inputs and
//! outputs, Q, K, V, the MLP) is that of s/cp tokens: a rank's activations and its linear
//! layers' work are those of a model with sequence s/cp ([`rank_model`]). Attention is the
//! exception: the rank's s/cp queries attend to every earlier key of the whole sequence,
//! so its attention work is the whole sequence's divided by cp, cp times what a model of
//! sequence s/cp would do ([`attention_work_factor`]). Weights are not split by cp; the
//! gradients are reduced (and the distributed optimizer sharded) over dp × cp.

use std::borrow::Cow;

use crate::config::{CpCommType, ModelSpec};

use super::parallel::ParallelConfig;

/// The model as one rank of a context-parallel group of `cp` sees it: the sequence cut to
/// s/cp tokens (the whole model when cp is 1). Use it for every token-wise term; multiply
/// the attention core by [`attention_work_factor`].
pub fn rank_model(model: &ModelSpec, cp: u64) -> Cow<'_, ModelSpec> {
    if cp <= 1 {
        return Cow::Borrowed(model);
    }
    Cow::Owned(ModelSpec {
        seq_length: (model.seq_length / cp).max(1),
        ..model.clone()
    })
}

/// How many times the attention core of [`rank_model`] a rank really computes: its s/cp
/// queries meet all s keys (causally, balanced by the 2·cp chunks), cp times the
/// (s/cp)² of a model of sequence s/cp.
pub fn attention_work_factor(cp: u64) -> f64 {
    cp.max(1) as f64
}

/// Megatron's rules for context parallelism under `config`, checked before any cost:
/// `None` when the sequence can be split so, else why not and what to change.
///
/// - the sequence divides into 2·cp chunks (arguments.py validate_args);
/// - with sequence parallelism each rank's s/cp tokens split again over tp
///   (the scatter to sequence-parallel regions needs it);
/// - `a2a` (and the a2a level of `a2a+p2p`) trades the sequence split for a head split:
///   the heads and query groups on a tensor-parallel rank divide by its size
///   (Transformer Engine's attention asserts it).
pub fn context_split_error(
    model: &ModelSpec,
    config: &ParallelConfig,
    comm: CpCommType,
    levels: Option<&[u64]>,
) -> Option<String> {
    let cp = config.cp.max(1);
    if cp == 1 {
        return None;
    }
    let s = model.seq_length;
    if s % cp.saturating_mul(2) != 0 {
        return Some(format!(
            "cp={cp} needs the sequence length {s} to divide into 2 × {cp} chunks (Megatron requires --seq-length to be a multiple of 2·cp)"
        ));
    }
    let tp = config.tp.max(1);
    if config.sequence_parallel && tp > 1 && (s / cp) % tp != 0 {
        return Some(format!(
            "cp={cp} with sequence parallelism at tp={tp} needs each rank's {} tokens to divide by {tp}",
            s / cp
        ));
    }
    let a2a = match comm {
        CpCommType::A2a => Some(cp),
        CpCommType::A2aP2p => Some(levels.and_then(|l| l.first().copied()).unwrap_or(cp)),
        CpCommType::P2p | CpCommType::Allgather => None,
    };
    if let Some(a) = a2a.filter(|a| *a > 1) {
        let heads = model.num_attention_heads / tp;
        let groups = (model.num_query_groups / tp).max(1);
        if heads % a != 0 || groups % a != 0 {
            return Some(format!(
                "the a2a exchange over {a} ranks needs the {heads} heads and {groups} query groups of a tensor-parallel rank to divide by {a} (Transformer Engine splits whole heads: use p2p or a smaller cp)"
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::presets;

    fn llama(seq: u64) -> ModelSpec {
        let mut m = presets::preset("llama3-8b").unwrap().model().unwrap();
        m.seq_length = seq;
        m
    }

    #[test]
    fn a_rank_sees_its_share_of_the_sequence_and_all_of_its_attention() {
        let m = llama(131_072);
        assert_eq!(rank_model(&m, 8).seq_length, 16_384);
        assert!(matches!(rank_model(&m, 1), Cow::Borrowed(_)));
        assert_eq!(attention_work_factor(8), 8.0);
    }

    #[test]
    fn megatrons_split_rules() {
        let m = llama(8192);
        let mut c = ParallelConfig::even(32, 2, 1, 1, 1);
        c.cp = 4;
        assert_eq!(context_split_error(&m, &c, CpCommType::P2p, None), None);
        let m6 = llama(8190);
        let why = context_split_error(&m6, &c, CpCommType::P2p, None).unwrap();
        assert!(why.contains("2 × 4"), "{why}");
        // a2a: 32 heads and 8 groups over tp 2 leave 16 and 4 per rank: cp 4 splits them, 8 not.
        assert_eq!(context_split_error(&m, &c, CpCommType::A2a, None), None);
        c.cp = 8;
        assert!(context_split_error(&m, &c, CpCommType::A2a, None).is_some());
        assert_eq!(
            context_split_error(&m, &c, CpCommType::A2aP2p, Some(&[2, 4])),
            None
        );
        // Sequence parallelism splits each rank's tokens again.
        let m = llama(40);
        let mut c = ParallelConfig::even(32, 8, 1, 1, 1);
        c.cp = 2;
        c.sequence_parallel = true;
        assert!(context_split_error(&m, &c, CpCommType::P2p, None).is_some());
    }
}
