//! Near misses: an option after SCRIPT that neither Megatron's parser nor the [`options`]
//! table knows, a small edit away from an option pipette reads a meaning from
//! (`--global-batch-sise` for `--global-batch-size`). Megatron would refuse it
//! ("unrecognized arguments") only once every node has started, after the profiling and the
//! trial; pipette would plan without it (with the preset's batch, say). So it is worth a
//! warning before anything runs, never an error: it may be the script's own option.
//!
//! Megatron's own options are every long option of its parser ([`MEGATRON_OPTIONS`],
//! megatron-core 0.19.2): `--fp8` is never taken for a misspelt `--bf16`.

use super::argparse::arg_words;
use super::options::{self, Read};

/// Every long option of Megatron's parser (megatron-core 0.19.2); source and licence in
/// the file's head.
const MEGATRON_OPTIONS: &str = include_str!("../../../data/megatron/options-0.19.2.txt");

/// An option the user probably misspelt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NearMiss {
    /// As written, with its dashes (`--global-batch-sise`).
    pub written: String,
    /// The option it is a small edit from (`--global-batch-size`).
    pub meant: String,
}

impl NearMiss {
    /// The warning, in one line.
    pub fn warning(&self) -> String {
        format!(
            "{} is neither Megatron's option nor one pipette-run reads: did you mean {}? (pipette-run plans without it; the script gets it as written)",
            self.written, self.meant
        )
    }
}

/// Whether `--name` is one of Megatron's parser's options.
pub fn megatron_knows(name: &str) -> bool {
    MEGATRON_OPTIONS
        .lines()
        .filter_map(|l| l.strip_prefix("--"))
        .any(|known| known == name)
}

/// How far a name may be from a known one and still be taken for it: one edit in a short
/// name (where two would reach other real names), two in a longer one.
fn tolerance(name: &str) -> usize {
    if name.len() <= 8 {
        1
    } else {
        2
    }
}

/// The options in `args` (the arguments after SCRIPT, before any `--`) that are near
/// misses of options pipette reads, each with the closest such option (the table's first
/// on a tie), in the order written; each written spelling once.
pub fn near_misses(args: &[String]) -> Vec<NearMiss> {
    let mut found: Vec<NearMiss> = Vec::new();
    for word in arg_words(args) {
        let Some(name) = word.written_name(args) else {
            continue;
        };
        let dashed = name.replace('_', "-");
        // Known names are not typos (underscored spellings of known ones have their own
        // hint, see read.rs), nor are Megatron's own.
        if options::find(&dashed).is_some() || megatron_knows(&dashed) {
            continue;
        }
        let closest = options::OPTIONS
            .iter()
            .filter(|o| o.read != Read::Ignored)
            .map(|o| (strsim::osa_distance(&dashed, o.name), o.name))
            .filter(|(d, _)| *d <= tolerance(&dashed))
            .min_by_key(|(d, _)| *d);
        let written = format!("--{name}");
        if let Some((_, meant)) = closest {
            if !found.iter().any(|m| m.written == written) {
                found.push(NearMiss {
                    written,
                    meant: format!("--{meant}"),
                });
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_owned).collect()
    }

    fn meant(text: &str) -> Vec<(String, String)> {
        near_misses(&words(text))
            .into_iter()
            .map(|m| (m.written, m.meant))
            .collect()
    }

    #[test]
    fn a_misspelt_option_pipette_reads_is_named_with_the_one_meant() {
        assert_eq!(
            meant("--global-batch-sise 256 --lr 1e-4"),
            [("--global-batch-sise".into(), "--global-batch-size".into())]
        );
        assert_eq!(
            meant("--num-layer=4 --hiden-size 64 --micro_batch_sise 2"),
            [
                ("--num-layer".into(), "--num-layers".into()),
                ("--hiden-size".into(), "--hidden-size".into()),
                ("--micro_batch_sise".into(), "--micro-batch-size".into()),
            ]
        );
        let warning = near_misses(&words("--global-batch-sise 256"))[0].warning();
        assert!(
            warning.contains("--global-batch-sise")
                && warning.contains("did you mean --global-batch-size?"),
            "{warning}"
        );
    }

    #[test]
    fn megatron_options_known_ones_and_far_ones_are_not_typos() {
        // --fp8 is one edit from nothing pipette reads but is Megatron's; --seed and
        // --log-interval are Megatron's too; --global-batch-size is known; --my-flag and
        // anything after `--` are the script's.
        for text in [
            "--fp8 hybrid --seed 3 --log-interval 10",
            "--global-batch-size 256 --num_layers 4",
            "--my-flag 1 -- --global-batch-sise 2",
            "--bf16 --fp16",
        ] {
            assert_eq!(meant(text), [], "{text}");
        }
    }

    #[test]
    fn megatron_list_is_read_and_holds_the_options_pipette_reads() {
        assert!(megatron_knows("global-batch-size") && megatron_knows("fp8-format"));
        assert!(!megatron_knows("global-batch-sise"));
        // Every option pipette reads a meaning from is Megatron's, except the DeepSpeed
        // ones and those Megatron removed.
        for o in options::OPTIONS {
            if matches!(o.read, Read::Setting(_) | Read::Unsupported { .. }) {
                assert!(megatron_knows(o.name), "--{} is not in the list", o.name);
            }
        }
    }
}
