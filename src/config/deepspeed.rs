//! A DeepSpeed config that the script's arguments name (`--deepspeed_config FILE`,
//! `--deepspeed-config FILE`, or Hugging Face Trainer's `--deepspeed FILE`; `=FILE` too):
//! what it says about batch sizes and the ZeRO stage, and whether its batch arithmetic
//! can hold on the world the job runs on.
//!
//! DeepSpeed's rule (`deepspeed/runtime/config.py`, `_set_batch_related_parameters` and
//! `_batch_assertion`, DeepSpeed 0.9–0.16, Apache-2.0): of `train_batch_size` (T),
//! `train_micro_batch_size_per_gpu` (M) and `gradient_accumulation_steps` (G), the ones
//! missing are derived with floor division from those given and the world size W — T and
//! M given: G = T // M // W; T and G: M = T // W // G; M and G: T = M·G·W; T alone: G = 1,
//! M = T // W; M alone: G = 1, T = M·W; neither T nor M: refused — then all three must be
//! positive and T = M·G·W. `"auto"` (Hugging Face Trainer fills it from its own
//! arguments before DeepSpeed reads it) is not known here, so the arithmetic is not
//! checked. DeepSpeed's W is its data-parallel size; a script that also pipelines or
//! shards tensors with DeepSpeed has fewer data-parallel ranks than the world, which
//! nothing in its arguments tells us: the check takes the world, as for a DeepSpeed
//! script without model parallelism.
//!
//! Pure: the caller reads the file.

use serde::Serialize;

use super::megatron::argparse::words_by;
use super::megatron::options::Arity;

/// The options that name a DeepSpeed config, in dashed spelling. `--deepspeed` alone is
/// also DeepSpeed's own flag (`deepspeed.add_config_arguments`), so it names a file only
/// when a value follows it.
const CONFIG_OPTIONS: &[&str] = &["deepspeed-config", "deepspeed"];

/// The DeepSpeed config file the script's arguments name, if any (the last one given, as
/// argparse keeps it; nothing after `--`).
pub fn config_path(args: &[String]) -> Option<String> {
    let arity = |name: &str| match CONFIG_OPTIONS.contains(&name) {
        true => Arity::Value,
        false => Arity::Flag,
    };
    words_by(args, arity)
        .into_iter()
        .filter(|word| {
            word.name
                .as_deref()
                .is_some_and(|n| CONFIG_OPTIONS.contains(&n))
        })
        .filter_map(|word| word.value(args).filter(|v| !v.is_empty()))
        .next_back()
}

/// One batch setting of the config: a number, `"auto"`, or not given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum BatchValue {
    Given(u64),
    /// `"auto"`: filled in by Hugging Face Trainer from its own arguments.
    #[serde(serialize_with = "auto")]
    Auto,
}

fn auto<S: serde::Serializer>(s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str("auto")
}

/// What a DeepSpeed config says about batch sizes and ZeRO.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeepSpeedConfig {
    /// The file, as the arguments name it.
    pub path: String,
    pub train_batch_size: Option<BatchValue>,
    pub train_micro_batch_size_per_gpu: Option<BatchValue>,
    pub gradient_accumulation_steps: Option<BatchValue>,
    /// `zero_optimization.stage`; DeepSpeed's default is 0 (no ZeRO).
    pub zero_stage: Option<u64>,
}

/// The three batch settings on a world, as DeepSpeed resolves them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeepSpeedBatch {
    pub train_batch_size: u64,
    pub train_micro_batch_size_per_gpu: u64,
    pub gradient_accumulation_steps: u64,
    pub world_size: u64,
    /// The settings DeepSpeed derives, each as `name = formula`.
    pub derived: Vec<String>,
}

/// Why a DeepSpeed config cannot be used on this world.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeepSpeedError {
    /// Not a JSON object, or a batch field that is not a positive integer or `"auto"`.
    #[error("the DeepSpeed config {path}: {detail}")]
    Invalid { path: String, detail: String },
    /// DeepSpeed would refuse the batch sizes on this many ranks.
    #[error(
        "the DeepSpeed config {path} cannot hold on the {world} rank(s) found: train_batch_size {train} != train_micro_batch_size_per_gpu {micro} × gradient_accumulation_steps {accumulation} × world size {world}{how} (DeepSpeed refuses it; change the config, or run on a world size it divides into)"
    )]
    Batch {
        path: String,
        train: u64,
        micro: u64,
        accumulation: u64,
        world: u64,
        /// How DeepSpeed derived the missing ones, e.g. ` (gradient_accumulation_steps = 16 // 3 // 4)`.
        how: String,
    },
    /// Neither `train_batch_size` nor `train_micro_batch_size_per_gpu`.
    #[error("the DeepSpeed config {path} gives neither train_batch_size nor train_micro_batch_size_per_gpu (DeepSpeed needs one of them)")]
    NoBatch { path: String },
}

impl DeepSpeedConfig {
    /// Reads the config's text (`path` as the arguments name it, for messages).
    pub fn from_json(path: &str, text: &str) -> Result<Self, DeepSpeedError> {
        let invalid = |detail: String| DeepSpeedError::Invalid {
            path: path.to_string(),
            detail,
        };
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| invalid(format!("not JSON: {e}")))?;
        let object = value
            .as_object()
            .ok_or_else(|| invalid("is not a JSON object".to_string()))?;
        let batch = |name: &str| -> Result<Option<BatchValue>, DeepSpeedError> {
            match object.get(name) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::String(s)) if s == "auto" => Ok(Some(BatchValue::Auto)),
                Some(v) => match v.as_u64() {
                    Some(n) => Ok(Some(BatchValue::Given(n))),
                    None => Err(invalid(format!(
                        "{name} is {v}, not a non-negative integer or \"auto\""
                    ))),
                },
            }
        };
        let zero_stage = match object.get("zero_optimization").and_then(|z| z.get("stage")) {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => Some(v.as_u64().ok_or_else(|| {
                invalid(format!("zero_optimization.stage is {v}, not 0, 1, 2 or 3"))
            })?),
        };
        Ok(DeepSpeedConfig {
            path: path.to_string(),
            train_batch_size: batch("train_batch_size")?,
            train_micro_batch_size_per_gpu: batch("train_micro_batch_size_per_gpu")?,
            gradient_accumulation_steps: batch("gradient_accumulation_steps")?,
            zero_stage,
        })
    }

    /// Whether any batch setting is `"auto"` (then the arithmetic is not checked).
    pub fn has_auto(&self) -> bool {
        [
            self.train_batch_size,
            self.train_micro_batch_size_per_gpu,
            self.gradient_accumulation_steps,
        ]
        .contains(&Some(BatchValue::Auto))
    }

    /// The batch settings on `world` ranks as DeepSpeed resolves them (see the module
    /// doc); `Ok(None)` when one is `"auto"`.
    pub fn batch_on(&self, world: u64) -> Result<Option<DeepSpeedBatch>, DeepSpeedError> {
        if self.has_auto() {
            return Ok(None);
        }
        let given = |v: Option<BatchValue>| match v {
            Some(BatchValue::Given(n)) => Some(n),
            _ => None,
        };
        let (t, m, g) = (
            given(self.train_batch_size),
            given(self.train_micro_batch_size_per_gpu),
            given(self.gradient_accumulation_steps),
        );
        let w = world;
        let div = |a: u64, b: u64| a.checked_div(b).unwrap_or(0);
        let (train, micro, accumulation, derived) = match (t, m, g) {
            (Some(t), Some(m), Some(g)) => (t, m, g, vec![]),
            (Some(t), Some(m), None) => (
                t,
                m,
                div(div(t, m), w),
                vec![format!("gradient_accumulation_steps = {t} // {m} // {w}")],
            ),
            (Some(t), None, Some(g)) => (
                t,
                div(div(t, w), g),
                g,
                vec![format!(
                    "train_micro_batch_size_per_gpu = {t} // {w} // {g}"
                )],
            ),
            (None, Some(m), Some(g)) => (
                m * g * w,
                m,
                g,
                vec![format!("train_batch_size = {m} × {g} × {w}")],
            ),
            (Some(t), None, None) => (
                t,
                div(t, w),
                1,
                vec![
                    "gradient_accumulation_steps = 1".to_string(),
                    format!("train_micro_batch_size_per_gpu = {t} // {w}"),
                ],
            ),
            (None, Some(m), None) => (
                m * w,
                m,
                1,
                vec![
                    format!("train_batch_size = {m} × {w}"),
                    "gradient_accumulation_steps = 1".to_string(),
                ],
            ),
            (None, None, _) => {
                return Err(DeepSpeedError::NoBatch {
                    path: self.path.clone(),
                })
            }
        };
        let holds = train > 0 && micro > 0 && accumulation > 0 && train == micro * accumulation * w;
        if !holds {
            return Err(DeepSpeedError::Batch {
                path: self.path.clone(),
                train,
                micro,
                accumulation,
                world: w,
                how: if derived.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", derived.join(", "))
                },
            });
        }
        Ok(Some(DeepSpeedBatch {
            train_batch_size: train,
            train_micro_batch_size_per_gpu: micro,
            gradient_accumulation_steps: accumulation,
            world_size: w,
            derived,
        }))
    }

    /// What the launch reports about the config on `world` ranks, in one line (after a
    /// successful [`DeepSpeedConfig::batch_on`]).
    pub fn describe(&self, batch: Option<&DeepSpeedBatch>) -> String {
        let zero = match self.zero_stage {
            Some(stage) => format!("ZeRO stage {stage}"),
            None => "ZeRO stage 0 (not set)".to_string(),
        };
        match batch {
            Some(b) => format!(
                "DeepSpeed config {}: train_batch_size {} = micro-batch {} per rank × {} accumulation step(s) × {} rank(s){}; {zero}",
                self.path,
                b.train_batch_size,
                b.train_micro_batch_size_per_gpu,
                b.gradient_accumulation_steps,
                b.world_size,
                if b.derived.is_empty() {
                    String::new()
                } else {
                    format!(" (DeepSpeed derives {})", b.derived.join(", "))
                }
            ),
            None => format!(
                "DeepSpeed config {}: batch sizes \"auto\" (the script fills them in; not checked); {zero}",
                self.path
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(String::from).collect()
    }

    fn config(json: &str) -> DeepSpeedConfig {
        DeepSpeedConfig::from_json("ds.json", json).unwrap()
    }

    #[test]
    fn the_config_path_comes_in_every_spelling() {
        assert_eq!(
            config_path(&words("--deepspeed_config a.json")),
            Some("a.json".into())
        );
        assert_eq!(
            config_path(&words("--deepspeed-config=b.json --lr 1")),
            Some("b.json".into())
        );
        assert_eq!(
            config_path(&words("--deepspeed c.json")),
            Some("c.json".into())
        );
        assert_eq!(
            config_path(&words("--deepspeed=d.json")),
            Some("d.json".into())
        );
        // DeepSpeed's own flag, with the config given separately.
        assert_eq!(
            config_path(&words("--deepspeed --deepspeed_config e.json")),
            Some("e.json".into())
        );
        assert_eq!(config_path(&words("--deepspeed --lr 1")), None);
        assert_eq!(config_path(&words("--lr 1 -- --deepspeed f.json")), None);
        assert_eq!(config_path(&words("--deepspeed_config")), None);
    }

    #[test]
    fn reads_batch_sizes_auto_and_the_zero_stage() {
        let c = config(
            r#"{"train_batch_size": 16, "gradient_accumulation_steps": "auto", "zero_optimization": {"stage": 2}}"#,
        );
        assert_eq!(c.train_batch_size, Some(BatchValue::Given(16)));
        assert_eq!(c.train_micro_batch_size_per_gpu, None);
        assert_eq!(c.gradient_accumulation_steps, Some(BatchValue::Auto));
        assert_eq!(c.zero_stage, Some(2));
        assert_eq!(c.batch_on(4), Ok(None));
        assert!(
            c.describe(None).contains("\"auto\""),
            "{}",
            c.describe(None)
        );
        for bad in [
            r#"[1]"#,
            r#"{"train_batch_size": -1}"#,
            r#"{"train_batch_size": "8"}"#,
            "{",
            r#"{"zero_optimization": {"stage": "x"}}"#,
        ] {
            assert!(
                matches!(
                    DeepSpeedConfig::from_json("ds.json", bad),
                    Err(DeepSpeedError::Invalid { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn batch_arithmetic_follows_deepspeed() {
        // All three given: they must multiply out.
        let all = config(
            r#"{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}"#,
        );
        let b = all.batch_on(4).unwrap().unwrap();
        assert_eq!(
            (
                b.train_batch_size,
                b.train_micro_batch_size_per_gpu,
                b.gradient_accumulation_steps
            ),
            (16, 2, 2)
        );
        let e = all.batch_on(3).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the DeepSpeed config ds.json cannot hold on the 3 rank(s) found: train_batch_size 16 != train_micro_batch_size_per_gpu 2 × gradient_accumulation_steps 2 × world size 3 (DeepSpeed refuses it; change the config, or run on a world size it divides into)"
        );
        // T and M: G = T // M // W, floor division as DeepSpeed does.
        let tm = config(r#"{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 3}"#);
        let e = tm.batch_on(2).unwrap_err().to_string();
        assert!(e.contains("train_batch_size 16 != train_micro_batch_size_per_gpu 3 × gradient_accumulation_steps 2 × world size 2 (gradient_accumulation_steps = 16 // 3 // 2)"), "{e}");
        assert_eq!(
            config(r#"{"train_batch_size": 12, "train_micro_batch_size_per_gpu": 3}"#)
                .batch_on(2)
                .unwrap()
                .unwrap()
                .gradient_accumulation_steps,
            2
        );
        // T and G: M = T // W // G.
        assert_eq!(
            config(r#"{"train_batch_size": 16, "gradient_accumulation_steps": 2}"#)
                .batch_on(4)
                .unwrap()
                .unwrap()
                .train_micro_batch_size_per_gpu,
            2
        );
        // M and G: T follows, always holds.
        assert_eq!(
            config(r#"{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3}"#)
                .batch_on(5)
                .unwrap()
                .unwrap()
                .train_batch_size,
            30
        );
        // T alone: G = 1, M = T // W; too few samples for the ranks gives M = 0.
        assert_eq!(
            config(r#"{"train_batch_size": 8}"#)
                .batch_on(4)
                .unwrap()
                .unwrap()
                .train_micro_batch_size_per_gpu,
            2
        );
        assert!(config(r#"{"train_batch_size": 2}"#).batch_on(4).is_err());
        // M alone: T = M·W.
        assert_eq!(
            config(r#"{"train_micro_batch_size_per_gpu": 4}"#)
                .batch_on(3)
                .unwrap()
                .unwrap()
                .train_batch_size,
            12
        );
        // Neither T nor M.
        assert!(matches!(
            config(r#"{"gradient_accumulation_steps": 2}"#).batch_on(2),
            Err(DeepSpeedError::NoBatch { .. })
        ));
    }
}
