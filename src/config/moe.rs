//! The parts of a model beyond a dense transformer, as Megatron's arguments describe them:
//! routed experts ([`MoeSpec`]), multi-latent attention ([`MlaSpec`]) and the modules that
//! `--recompute-modules` recomputes ([`RecomputeModule`]). Reading them is
//! `config::megatron`'s job; counting, memory and time are `model`'s.

use serde::{Deserialize, Serialize};

/// A mixture-of-experts model's expert layers (`--num-experts` and the `--moe-*` options,
/// megatron-core 0.19.2 `TransformerConfig`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoeSpec {
    /// Routed experts per MoE layer (`--num-experts`).
    pub num_experts: u64,
    /// Experts each token is sent to (`--moe-router-topk`, Megatron's default 2).
    pub router_topk: u64,
    /// Width of one routed expert's MLP (`--moe-ffn-hidden-size`, default `--ffn-hidden-size`).
    pub ffn_hidden_size: u64,
    /// Width of the shared experts' MLP (`--moe-shared-expert-intermediate-size`), if any.
    pub shared_expert_ffn: Option<u64>,
    /// `--moe-shared-expert-overlap`: the shared experts run beside the dispatch.
    #[serde(default)]
    pub shared_expert_overlap: bool,
    /// One entry per decoder layer, true where the layer's MLP is the expert layer
    /// (`--moe-layer-freq`: an int N makes every N-th layer from the first one MoE, or an
    /// explicit list such as `([0]*3+[1]*58)`).
    pub layers: Vec<bool>,
    /// `--moe-grouped-gemm`: all local experts in one grouped GEMM.
    pub grouped_gemm: bool,
    pub dispatcher: Dispatcher,
    pub load_balancing: LoadBalancing,
    /// `--moe-expert-capacity-factor`: tokens past this many times the mean per expert are
    /// dropped; `None` is dropless routing.
    pub capacity_factor: Option<f64>,
    /// `--moe-pad-expert-input-to-capacity`: every expert computes its full capacity.
    #[serde(default)]
    pub pad_to_capacity: bool,
    pub drop_policy: DropPolicy,
    /// `--moe-router-enable-expert-bias` (DeepSeek-V3's aux-loss-free balancing): a bias
    /// per expert, kept as a buffer, not a parameter.
    #[serde(default)]
    pub expert_bias: bool,
}

impl MoeSpec {
    /// How many decoder layers hold experts.
    pub fn moe_layers(&self) -> u64 {
        self.layers.iter().filter(|m| **m).count() as u64
    }

    /// Whether decoder layer `i` (from 0) holds experts.
    pub fn is_moe_layer(&self, i: u64) -> bool {
        self.layers.get(i as usize).copied().unwrap_or(false)
    }
}

/// `--moe-token-dispatcher-type`: how tokens reach their experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dispatcher {
    /// Tokens of the whole tp×ep group are gathered, each rank keeps its experts' share,
    /// results are reduce-scattered back (Megatron's default).
    Allgather,
    /// Two all-to-alls each way inside the expert-parallel group.
    Alltoall,
    /// DeepEP / HybridEP kernels (`flex`): an all-to-all with fused permutation.
    Flex,
}

impl Dispatcher {
    pub fn megatron_name(self) -> &'static str {
        match self {
            Dispatcher::Allgather => "allgather",
            Dispatcher::Alltoall => "alltoall",
            Dispatcher::Flex => "flex",
        }
    }
}

/// `--moe-router-load-balancing-type` (the first, when several are given).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadBalancing {
    AuxLoss,
    SeqAuxLoss,
    GlobalAuxLoss,
    Sinkhorn,
    None,
}

/// `--moe-token-drop-policy`: which tokens an over-full expert drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DropPolicy {
    Probs,
    Position,
}

/// Multi-latent attention (`--multi-latent-attention`, DeepSeek-V2/V3): queries and
/// key/values through low-rank projections, a separate rotary part of each head.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MlaSpec {
    /// `--q-lora-rank`: `None` projects queries at full rank.
    pub q_lora_rank: Option<u64>,
    /// `--kv-lora-rank` (Megatron's default 32).
    pub kv_lora_rank: u64,
    /// `--qk-head-dim`: the non-rotary part of a query/key head (default 128).
    pub qk_head_dim: u64,
    /// `--qk-pos-emb-head-dim`: the rotary part (default 64).
    pub qk_pos_emb_head_dim: u64,
    /// `--v-head-dim` (default 128).
    pub v_head_dim: u64,
}

/// One of `--recompute-modules` (megatron-core 0.19.2): a module whose activations are
/// recomputed in the backward pass instead of kept, under `--recompute-granularity selective`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecomputeModule {
    CoreAttn,
    MoeAct,
    Layernorm,
    MlaUpProj,
    Mlp,
    Moe,
    SharedExperts,
}

impl RecomputeModule {
    pub const ALL: [RecomputeModule; 7] = [
        RecomputeModule::CoreAttn,
        RecomputeModule::MoeAct,
        RecomputeModule::Layernorm,
        RecomputeModule::MlaUpProj,
        RecomputeModule::Mlp,
        RecomputeModule::Moe,
        RecomputeModule::SharedExperts,
    ];

    pub fn megatron_name(self) -> &'static str {
        match self {
            RecomputeModule::CoreAttn => "core_attn",
            RecomputeModule::MoeAct => "moe_act",
            RecomputeModule::Layernorm => "layernorm",
            RecomputeModule::MlaUpProj => "mla_up_proj",
            RecomputeModule::Mlp => "mlp",
            RecomputeModule::Moe => "moe",
            RecomputeModule::SharedExperts => "shared_experts",
        }
    }

    pub fn from_megatron_name(word: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.megatron_name() == word)
    }
}
