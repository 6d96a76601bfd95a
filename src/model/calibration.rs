//! Calibration factors: what the formulas cannot see, measured by a dry run.
//!
//! The memory model ([`super::memory`]) and the time model read their correction factors
//! from one [`Calibration`]. [`Calibration::default`] holds documented first guesses; the
//! dry run (a later issue) replaces them with values fitted to what one short real run
//! measures on the cluster at hand. A plain struct: every field is public, serialised by
//! name, and missing fields read as their defaults, so a calibration file written before a
//! field existed still loads.

use serde::{Deserialize, Serialize};

use crate::cluster::profile::show_number;

/// One GiB, for readable defaults.
const GIB: u64 = 1 << 30;

/// See [`Calibration::host_layer_pass_ms`]: 0.84 ms, the figure `scripts/validate-time-model`
/// fits on vTrain's 1,440 one-node A100 runs (`data/vtrain/ground_truth_single.csv`,
/// Megatron-DeepSpeed in fp16 with full recomputation; 0.8366 on 2026-11-24, PyTorch's
/// softmax costed where Megatron's fused one cannot run), whose small models take about
/// 3.5 ms per layer and micro-batch (forward, recomputation, backward) at any micro-batch
/// size and tp. A newer Megatron with fused kernels issues a layer faster;
/// the floor matters only where a slot's GPU work is smaller.
pub const HOST_LAYER_PASS_MS: f64 = 0.84;

/// Correction factors shared by the memory and time models.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Calibration {
    /// Memory: measured activation bytes over the formula's (Korthikanti et al. 2022 as
    /// extended in [`super::memory`]). Covers what the formula leaves out: temporaries
    /// of the backward pass, the flash-attention softmax statistics, rotary-embedding
    /// copies, and kernels that keep more than the paper assumes. Default 1.0 (trust the
    /// formula) until a dry run measures the peak.
    pub activation_factor: f64,
    /// Memory: bytes on every GPU that no formula models: the CUDA context and kernel
    /// images (about 0.5 GiB on a Hopper GPU), NCCL communicator buffers (a few hundred
    /// MiB for the tp, pp and dp groups), cuBLAS / cuDNN workspaces. Default 1.5 GiB.
    pub overhead_bytes: u64,
    /// Memory: PyTorch's caching allocator reserves more than the live tensors need
    /// (blocks split and freed out of order as activations come and go); this fraction of
    /// the activation bytes is added to the overhead. Weights, gradients and optimizer
    /// state live in a few large buffers allocated once, so they get none. Default 0.10.
    pub allocator_slack: f64,
    /// Time: attained share of a GPU's datasheet peak (dense tensor-core TFLOPS for the
    /// training dtype) when the profile has no measured throughput. Megatron reaches about
    /// 40–55 % model-FLOPs utilisation on large GPT models; default 0.45.
    pub compute_efficiency: f64,
    /// Time: attained share of a *measured* matrix-multiply throughput (the profile's
    /// `measured_tflops`). Default 1.0 (take the measurement as it is) until a dry run
    /// fits it; attention, norms and kernel launches usually make it 0.6–0.8.
    pub measured_compute_efficiency: f64,
    /// Time: share of the tensor-parallel collectives hidden behind the GEMMs with
    /// `--tp-comm-overlap` (Transformer Engine's userbuffers). Default 0.5, a first guess;
    /// never more than the overlapped GEMMs last (`ops::KindOps::tp_overlap_gemms`).
    pub tp_comm_overlap: f64,
    /// Time: with `--overlap-grad-reduce`, the share of a stage's last backward pass that
    /// can hide the data-parallel gradient reduce (the last bucket is reduced after the
    /// pass ends). Default 0.9.
    pub grad_reduce_overlap: f64,
    /// Time: with `--overlap-param-gather`, the share of the next forward pass that can
    /// hide the distributed optimizer's parameter all-gather. Default 0.9.
    pub param_gather_overlap: f64,
    /// Time (Pipette model): scale on the shipped tables' matrix-multiply efficiencies
    /// (`data/perf`), the same for every shape. Default 1.0: the published figures as they are.
    pub gemm_scale: f64,
    /// Time (Pipette model): scale on the tables' fixed cost of a memory-bound kernel
    /// (launch and tail; SimuMax's 40 µs). Default 1.0.
    pub kernel_cost_scale: f64,
    /// Time (Pipette model): scale on the tables' collective latencies (tensor-parallel
    /// collectives and pipeline messages). Default 1.0.
    pub collective_latency_scale: f64,
    /// Time (Pipette model): the host's time to issue one layer's forward pass for one
    /// micro-batch (Python, framework dispatch and kernel launches), ms; a backward pass
    /// takes twice that. A GPU cannot run faster than its kernels are issued, so a stage's
    /// micro-batch slot takes at least its layers' host time: what bounds tiny micro-batches
    /// of small models. Default HOST_LAYER_PASS_MS.
    pub host_layer_pass_ms: f64,
}

impl Default for Calibration {
    fn default() -> Self {
        Calibration {
            activation_factor: 1.0,
            overhead_bytes: 3 * GIB / 2,
            allocator_slack: 0.10,
            compute_efficiency: 0.45,
            measured_compute_efficiency: 1.0,
            tp_comm_overlap: 0.5,
            grad_reduce_overlap: 0.9,
            param_gather_overlap: 0.9,
            gemm_scale: 1.0,
            kernel_cost_scale: 1.0,
            collective_latency_scale: 1.0,
            host_layer_pass_ms: HOST_LAYER_PASS_MS,
        }
    }
}

impl Calibration {
    /// Every factor within the range a model can use, as `field: problem (range)`. A file
    /// is read field by field: a negative factor, 1e308 or infinity would make every
    /// estimate meaningless (or infinite) without a word. The ranges hold every value a
    /// fit produces (trial::fit's and model::validation's), with room to set one by hand.
    pub fn check(&self) -> Result<(), String> {
        let shares = "a share from 0 to 1";
        let fields: [(&str, f64, f64, f64, &str); 11] = [
            (
                "activation_factor",
                self.activation_factor,
                0.01,
                100.0,
                "a factor from 0.01 to 100",
            ),
            (
                "allocator_slack",
                self.allocator_slack,
                0.0,
                10.0,
                "a share from 0 to 10",
            ),
            (
                "compute_efficiency",
                self.compute_efficiency,
                0.001,
                1.0,
                "a share from 0.001 to 1",
            ),
            (
                "measured_compute_efficiency",
                self.measured_compute_efficiency,
                0.001,
                1.0,
                "a share from 0.001 to 1",
            ),
            ("tp_comm_overlap", self.tp_comm_overlap, 0.0, 1.0, shares),
            (
                "grad_reduce_overlap",
                self.grad_reduce_overlap,
                0.0,
                1.0,
                shares,
            ),
            (
                "param_gather_overlap",
                self.param_gather_overlap,
                0.0,
                1.0,
                shares,
            ),
            (
                "gemm_scale",
                self.gemm_scale,
                0.001,
                1000.0,
                "a scale from 0.001 to 1000",
            ),
            (
                "kernel_cost_scale",
                self.kernel_cost_scale,
                0.0,
                1000.0,
                "a scale from 0 to 1000",
            ),
            (
                "collective_latency_scale",
                self.collective_latency_scale,
                0.0,
                1000.0,
                "a scale from 0 to 1000",
            ),
            (
                "host_layer_pass_ms",
                self.host_layer_pass_ms,
                0.0,
                1000.0,
                "ms from 0 to 1000",
            ),
        ];
        for (name, value, low, high, range) in fields {
            if !(low..=high).contains(&value) {
                // As written, but short: 1e-320 and 1e308 were printed as hundreds of digits.
                return Err(format!(
                    "{name} is {}, out of range (give {range})",
                    show_number(value)
                ));
            }
        }
        if self.overhead_bytes > MAX_OVERHEAD_BYTES {
            return Err(format!(
                "overhead_bytes is {}, out of range (give at most {MAX_OVERHEAD_BYTES}, 1 TiB)",
                self.overhead_bytes
            ));
        }
        Ok(())
    }
}

/// The most per-GPU overhead a calibration may carry: 1 TiB, above any GPU's memory.
const MAX_OVERHEAD_BYTES: u64 = 1 << 40;

#[cfg(test)]
mod tests {
    use super::*;

    /// N13: calibration files were partly validated (negative factors, 1e308, unknown
    /// fields were taken as they were).
    #[test]
    fn n13_a_calibration_is_checked_field_by_field() {
        assert!(Calibration::default().check().is_ok());
        let d = Calibration::default;
        for c in [
            Calibration {
                activation_factor: -1.0,
                ..d()
            },
            Calibration {
                activation_factor: 1e308,
                ..d()
            },
            Calibration {
                compute_efficiency: 0.0,
                ..d()
            },
            Calibration {
                gemm_scale: f64::INFINITY,
                ..d()
            },
            Calibration {
                tp_comm_overlap: 1.5,
                ..d()
            },
            Calibration {
                host_layer_pass_ms: f64::NAN,
                ..d()
            },
            Calibration {
                overhead_bytes: u64::MAX,
                ..d()
            },
        ] {
            let e = c.check().unwrap_err();
            assert!(e.contains("out of range"), "{c:?}: {e}");
        }
        // An absurd value is named short, as written.
        for (value, shown) in [(1e-320, "1e-320"), (1e308, "1e308"), (-1.5, "-1.5")] {
            let c = Calibration {
                activation_factor: value,
                ..d()
            };
            assert_eq!(
                c.check().unwrap_err(),
                format!(
                    "activation_factor is {shown}, out of range (give a factor from 0.01 to 100)"
                )
            );
        }
        let unknown = serde_json::from_str::<Calibration>(r#"{"activation_factr": 1.2}"#);
        assert!(unknown.unwrap_err().to_string().contains("unknown field"));
    }

    #[test]
    fn missing_fields_read_as_defaults() {
        let c: Calibration = serde_json::from_str(r#"{"activation_factor": 1.25}"#).unwrap();
        assert_eq!(c.activation_factor, 1.25);
        assert_eq!(c.overhead_bytes, Calibration::default().overhead_bytes);
        let c: Calibration = serde_json::from_str("{}").unwrap();
        assert_eq!(c, Calibration::default());
    }

    #[test]
    fn round_trips_through_json() {
        let c = Calibration {
            activation_factor: 1.1,
            overhead_bytes: 123,
            allocator_slack: 0.0,
            ..Calibration::default()
        };
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<Calibration>(&text).unwrap(), c);
    }
}
