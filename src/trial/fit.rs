//! Fitting the estimators' calibration to what a trial measured. Pure.
//!
//! **Memory.** The memory model says a GPU of stage *i* holds
//! `fixed_i + activation_factor · (1 + allocator_slack) · A_i + overhead_bytes`, with
//! `fixed_i` the weights, gradients and optimizer state and `A_i` the formula's activation
//! bytes ([`crate::model::memory`]). Each rank's measured peak gives one point
//! `(A_i, measured_i − fixed_i)`. When the points differ in `A` (several pipeline stages,
//! or trials at several micro-batch sizes) a least-squares line through them gives the
//! activation slope (hence `activation_factor`, the slack kept as it is) and the intercept
//! `overhead_bytes`. When they do not, one point cannot tell the two apart: only
//! `overhead_bytes` is fitted, with the activation factor left as it was. Results are
//! clamped to sane ranges (activation factor 0.25–8, overhead 0–64 GiB) and a note says
//! what was clamped.
//!
//! **Time.** The time model's compute throughput scales with one efficiency
//! (`measured_compute_efficiency` on a profile with measured TFLOPS, else
//! `compute_efficiency`); communication terms do not. [`fit_efficiency`] solves
//! `model(e) = measured` by bisection on `log e` (the model's time falls as `e` grows).

use serde::{Deserialize, Serialize};

/// The memory model's activation factor is kept within this range.
pub const ACTIVATION_FACTOR_RANGE: (f64, f64) = (0.25, 8.0);
/// And the overhead within this one.
pub const OVERHEAD_RANGE: (u64, u64) = (0, 64 << 30);
/// The compute efficiency within this one (the time model accepts at most 1).
pub const EFFICIENCY_RANGE: (f64, f64) = (0.001, 1.0);

/// What one rank measured, beside what the formula says of its stage.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MemoryPoint {
    /// Weights, gradients and optimizer state.
    pub fixed_bytes: u64,
    /// The formula's activation bytes, before calibration.
    pub activation_bytes: u64,
    pub measured_bytes: u64,
}

/// How the memory calibration was fitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryFitMethod {
    /// Points of different activation bytes: slope and intercept.
    LeastSquares,
    /// Points of one activation size: the overhead only.
    OverheadOnly,
}

/// The fitted memory factors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryFit {
    pub activation_factor: f64,
    pub overhead_bytes: u64,
    pub method: MemoryFitMethod,
    pub notes: Vec<String>,
}

/// Fits the activation factor and the overhead to `points` (see the module doc); the
/// allocator slack, and the activation factor when it cannot be fitted, come from
/// `slack` and `activation_factor`. `None` without points.
pub fn fit_memory(points: &[MemoryPoint], activation_factor: f64, slack: f64) -> Option<MemoryFit> {
    if points.is_empty() {
        return None;
    }
    let xs: Vec<f64> = points.iter().map(|p| p.activation_bytes as f64).collect();
    let ys: Vec<f64> = points
        .iter()
        .map(|p| p.measured_bytes as f64 - p.fixed_bytes as f64)
        .collect();
    let n = xs.len() as f64;
    let mean_x = xs.iter().sum::<f64>() / n;
    let mean_y = ys.iter().sum::<f64>() / n;
    let (lo, hi) = xs
        .iter()
        .fold((f64::MAX, f64::MIN), |(l, h), x| (l.min(*x), h.max(*x)));
    let mut notes = Vec::new();
    // Points within 5 % of each other in activations cannot separate slope and intercept.
    let spread = hi > 0.0 && (hi - lo) / hi > 0.05;
    let (mut factor, method) = if spread {
        let sxx: f64 = xs.iter().map(|x| (x - mean_x).powi(2)).sum();
        let sxy: f64 = xs
            .iter()
            .zip(&ys)
            .map(|(x, y)| (x - mean_x) * (y - mean_y))
            .sum();
        (sxy / sxx / (1.0 + slack), MemoryFitMethod::LeastSquares)
    } else {
        notes.push(
            "every measurement had the same activation bytes: only the overhead was fitted (trial two micro-batch sizes to fit the activation factor too)"
                .to_string(),
        );
        (activation_factor, MemoryFitMethod::OverheadOnly)
    };
    let (flo, fhi) = ACTIVATION_FACTOR_RANGE;
    if !(flo..=fhi).contains(&factor) || !factor.is_finite() {
        let clamped = if factor.is_finite() {
            factor.clamp(flo, fhi)
        } else {
            activation_factor
        };
        notes.push(format!(
            "the fitted activation factor {} is outside {flo}–{fhi}: clamped to {clamped:.3}",
            shown_factor(factor)
        ));
        factor = clamped;
    }
    let overhead = mean_y - factor * (1.0 + slack) * mean_x;
    let (olo, ohi) = OVERHEAD_RANGE;
    let overhead_bytes = if overhead < olo as f64 || overhead > ohi as f64 {
        let clamped = overhead.clamp(olo as f64, ohi as f64);
        notes.push(format!(
            "the fitted overhead {:.0} MiB is outside 0–{} GiB: clamped to {:.0} MiB",
            overhead / (1u64 << 20) as f64,
            ohi >> 30,
            clamped / (1u64 << 20) as f64
        ));
        clamped as u64
    } else {
        overhead.round() as u64
    };
    Some(MemoryFit {
        activation_factor: factor,
        overhead_bytes,
        method,
        notes,
    })
}

/// A fitted factor for a note: three decimals, or three in e-notation outside 0.001–10⁶,
/// so that one fitted from degenerate points (1e-320, 1e300) stays a short figure.
fn shown_factor(x: f64) -> String {
    if x == 0.0 || !x.is_finite() || (1e-3..1e6).contains(&x.abs()) {
        format!("{x:.3}")
    } else {
        format!("{x:.3e}")
    }
}

/// The efficiency `e` at which `model(e)` (ms, falling as `e` grows) equals `measured_ms`,
/// within [`EFFICIENCY_RANGE`]; `Err` with the model's error. The flag says the answer
/// was clamped to the range's end.
pub fn fit_efficiency<E>(
    measured_ms: f64,
    mut model: impl FnMut(f64) -> Result<f64, E>,
) -> Result<(f64, bool), E> {
    let (mut lo, mut hi) = (EFFICIENCY_RANGE.0.ln(), EFFICIENCY_RANGE.1.ln());
    // Too slow even at the lowest efficiency, or too fast even at the highest.
    if model(EFFICIENCY_RANGE.0)? < measured_ms {
        return Ok((EFFICIENCY_RANGE.0, true));
    }
    if model(EFFICIENCY_RANGE.1)? > measured_ms {
        return Ok((EFFICIENCY_RANGE.1, true));
    }
    for _ in 0..80 {
        let mid = 0.5 * (lo + hi);
        if model(mid.exp())? > measured_ms {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(((0.5 * (lo + hi)).exp(), false))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn point(fixed: u64, act: u64, factor: f64, slack: f64, overhead: u64) -> MemoryPoint {
        MemoryPoint {
            fixed_bytes: fixed,
            activation_bytes: act,
            measured_bytes: fixed + (act as f64 * factor * (1.0 + slack)) as u64 + overhead,
        }
    }

    #[test]
    fn recovers_known_factors_from_several_activation_sizes() {
        let points = [
            point(800 * MIB, 100 * MIB, 1.7, 0.1, 900 * MIB),
            point(800 * MIB, 300 * MIB, 1.7, 0.1, 900 * MIB),
            point(500 * MIB, 600 * MIB, 1.7, 0.1, 900 * MIB),
        ];
        let fit = fit_memory(&points, 1.0, 0.1).unwrap();
        assert_eq!(fit.method, MemoryFitMethod::LeastSquares);
        assert!((fit.activation_factor - 1.7).abs() < 1e-6, "{fit:?}");
        assert!(fit.overhead_bytes.abs_diff(900 * MIB) < MIB, "{fit:?}");
        assert!(fit.notes.is_empty());
    }

    #[test]
    fn one_activation_size_fits_the_overhead_only() {
        let points = [
            point(800 * MIB, 100 * MIB, 1.0, 0.1, 300 * MIB),
            point(800 * MIB, 100 * MIB, 1.0, 0.1, 310 * MIB),
        ];
        let fit = fit_memory(&points, 1.0, 0.1).unwrap();
        assert_eq!(fit.method, MemoryFitMethod::OverheadOnly);
        assert_eq!(fit.activation_factor, 1.0);
        assert!(fit.overhead_bytes.abs_diff(305 * MIB) < MIB, "{fit:?}");
        assert!(fit.notes[0].contains("only the overhead"));
        assert!(fit_memory(&[], 1.0, 0.1).is_none());
    }

    #[test]
    fn absurd_fits_are_clamped_and_said() {
        // Measured memory falls as activations grow: a negative slope.
        let points = [
            MemoryPoint {
                fixed_bytes: 0,
                activation_bytes: 100 * MIB,
                measured_bytes: 900 * MIB,
            },
            MemoryPoint {
                fixed_bytes: 0,
                activation_bytes: 200 * MIB,
                measured_bytes: 800 * MIB,
            },
        ];
        let fit = fit_memory(&points, 1.0, 0.0).unwrap();
        assert_eq!(fit.activation_factor, 0.25);
        assert!(fit.notes.iter().any(|n| n.contains("clamped")), "{fit:?}");
        // A slope of 2⁶⁰ (one byte more of activations, an exabyte more measured): the note
        // names it short, never as 19 digits and three decimals.
        let points = [
            MemoryPoint {
                fixed_bytes: 0,
                activation_bytes: 1,
                measured_bytes: 0,
            },
            MemoryPoint {
                fixed_bytes: 0,
                activation_bytes: 2,
                measured_bytes: 1 << 60,
            },
        ];
        let fit = fit_memory(&points, 1.0, 0.0).unwrap();
        assert_eq!(fit.activation_factor, 8.0);
        assert!(
            fit.notes.contains(
                &"the fitted activation factor 1.153e18 is outside 0.25–8: clamped to 8.000"
                    .to_string()
            ),
            "{fit:?}"
        );
    }

    #[test]
    fn efficiency_solves_the_time_model() {
        // compute 1000 ms at e = 1, plus 50 ms of communication that does not scale.
        let model = |e: f64| Ok::<f64, ()>(1000.0 / e + 50.0);
        let (e, clamped) = fit_efficiency(2050.0, model).unwrap();
        assert!(!clamped);
        assert!((e - 0.5).abs() < 1e-9, "{e}");
        let (e, clamped) = fit_efficiency(40.0, model).unwrap();
        assert!(clamped);
        assert_eq!(e, EFFICIENCY_RANGE.1);
        assert!(fit_efficiency(1.0, |_| Err::<f64, &str>("no")).is_err());
    }
}
