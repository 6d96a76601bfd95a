//! Property tests for the Slurm hostlist parser: lists compressed here, independently of
//! the parser, expand back to exactly the hosts they stand for; garbage never panics.

use pipette::cluster::hostlist::{expand, expand_ranges};
use proptest::prelude::*;

/// One range in a bracket group, as written: `lo` padded to `width` digits, then
/// optionally `-hi` with `hi_padding` extra leading zeros (which Slurm ignores).
#[derive(Debug, Clone)]
struct WrittenRange {
    lo: u64,
    len: u64,
    width: usize,
    single: bool,
    hi_padding: usize,
}

impl WrittenRange {
    fn hi(&self) -> u64 {
        if self.single {
            self.lo
        } else {
            self.lo + self.len
        }
    }

    fn write(&self) -> String {
        let lo = format!("{:0width$}", self.lo, width = self.width);
        if self.single {
            return lo;
        }
        let hi = self.hi().to_string();
        format!("{lo}-{}{hi}", "0".repeat(self.hi_padding))
    }

    fn numbers(&self) -> Vec<String> {
        (self.lo..=self.hi())
            .map(|n| format!("{n:0width$}", width = self.width))
            .collect()
    }
}

#[derive(Debug, Clone)]
enum Part {
    Literal(String),
    Group(Vec<WrittenRange>),
}

fn range() -> impl Strategy<Value = WrittenRange> {
    (0u64..2000, 0u64..4, 0usize..3, any::<bool>(), 0usize..2).prop_map(
        |(lo, len, extra_width, single, hi_padding)| WrittenRange {
            lo,
            len,
            width: lo.to_string().len() + extra_width,
            single,
            hi_padding,
        },
    )
}

fn part() -> impl Strategy<Value = Part> {
    prop_oneof![
        "[a-z][a-z0-9._-]{0,6}".prop_map(Part::Literal),
        prop::collection::vec(range(), 1..4).prop_map(Part::Group),
    ]
}

/// An entry is a non-empty sequence of parts; at most three groups keep it small.
fn entry() -> impl Strategy<Value = Vec<Part>> {
    prop::collection::vec(part(), 1..5).prop_filter("at most three groups", |parts| {
        parts.iter().filter(|p| matches!(p, Part::Group(_))).count() <= 3
    })
}

fn write_entry(parts: &[Part]) -> String {
    parts
        .iter()
        .map(|part| match part {
            Part::Literal(text) => text.clone(),
            Part::Group(ranges) => {
                let items: Vec<String> = ranges.iter().map(WrittenRange::write).collect();
                format!("[{}]", items.join(","))
            }
        })
        .collect()
}

/// The hosts an entry stands for: the first group varies slowest, as in Slurm.
fn hosts_of(parts: &[Part]) -> Vec<String> {
    let Some((head, tail)) = parts.split_first() else {
        return vec![String::new()];
    };
    let heads: Vec<String> = match head {
        Part::Literal(text) => vec![text.clone()],
        Part::Group(ranges) => ranges.iter().flat_map(WrittenRange::numbers).collect(),
    };
    let tails = hosts_of(tail);
    heads
        .iter()
        .flat_map(|h| tails.iter().map(move |t| format!("{h}{t}")))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn compressed_lists_expand_to_exactly_their_hosts(
        entries in prop::collection::vec(entry(), 1..5),
        spaced in any::<bool>(),
    ) {
        let separator = if spaced { ", " } else { "," };
        let list = entries.iter().map(|e| write_entry(e)).collect::<Vec<_>>().join(separator);
        let expected: Vec<String> = entries.iter().flat_map(|e| hosts_of(e)).collect();
        prop_assert_eq!(expand(&list), Ok(expected), "list {}", list);
    }

    #[test]
    fn index_lists_expand_in_written_order(ranges in prop::collection::vec(range(), 1..6)) {
        // Leading zeros do not change a number.
        let written: Vec<String> = ranges.iter().map(WrittenRange::write).collect();
        let expected: Vec<u64> = ranges.iter().flat_map(|r| r.lo..=r.hi()).collect();
        prop_assert_eq!(expand_ranges(&written.join(",")), Ok(expected));
    }

    #[test]
    fn garbage_never_panics(text in "\\PC{0,40}") {
        let _ = expand(&text);
        let _ = expand_ranges(&text);
    }

    #[test]
    fn near_miss_syntax_never_panics(text in "[a-c0-9\\[\\],\\- ]{0,30}") {
        if let Ok(hosts) = expand(&text) {
            prop_assert!(hosts.iter().all(|h| !h.is_empty()));
        }
        let _ = expand_ranges(&text);
    }
}
