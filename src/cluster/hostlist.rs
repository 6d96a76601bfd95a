//! Slurm's compressed hostlist syntax (`gpu[001-004,010],gpu-b[1-2]`).
//!
//! Owns: turning a hostlist expression into host names, the way `scontrol show hostnames`
//! does. Hosts come out in the written order, neither sorted nor deduplicated (discovery
//! reports duplicates, because it knows where the list came from).
//!
//! The grammar, as Slurm reads it:
//! - hosts are separated by commas outside brackets (`a,b`; `gpu[1,3]` is one entry);
//! - a bracket group holds comma-separated numbers and ranges (`[1-4,7]`);
//! - a range keeps the zero padding of its written lower bound (`[001-004]` gives `001`
//!   to `004`; `[8-10]` gives `8`, `9`, `10`);
//! - several groups in one entry expand as nested loops, the last group varying fastest
//!   (`a[1-2]b[3-4]` gives `a1b3,a1b4,a2b3,a2b4`).

/// The most hosts one expression may expand to; more means a typo (`[1-1000000000]`).
pub const MAX_HOSTS: usize = 1_000_000;

/// Why a hostlist expression could not be expanded. Columns count characters from 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostlistError {
    #[error("the hostlist is empty (give at least one host, e.g. node1,node2 or gpu[01-04])")]
    Empty,
    #[error(
        "empty host name at column {column} (remove the extra comma, or write a name before it)"
    )]
    EmptyHost { column: usize },
    #[error(
        "'[' at column {column} in \"{host}\" is never closed (close every bracket group with ']')"
    )]
    UnclosedBracket { host: String, column: usize },
    #[error(
        "unexpected '{bracket}' at column {column} in \"{host}\" \
         (brackets must pair up and cannot nest, e.g. gpu[01-04])"
    )]
    UnexpectedBracket {
        host: String,
        bracket: char,
        column: usize,
    },
    #[error(
        "empty range \"{range}\" at column {column} in \"{host}\" \
         (write a number or a range LOW-HIGH, e.g. [1-4])"
    )]
    EmptyRange {
        host: String,
        range: String,
        column: usize,
    },
    #[error(
        "range \"{range}\" at column {column} in \"{host}\" starts with a negative number \
         (host numbers start at 0: write numbers or ranges LOW-HIGH, e.g. [0-3])"
    )]
    Negative {
        host: String,
        range: String,
        column: usize,
    },
    #[error(
        "\"{host}\" at column {column} would give host names longer than {limit} bytes, \
         more than a DNS name may have (check the list)"
    )]
    NameTooLong {
        host: String,
        column: usize,
        limit: usize,
    },
    #[error(
        "range \"{range}\" at column {column} in \"{host}\" is not numeric \
         (write numbers or ranges LOW-HIGH separated by commas, e.g. [1-4,7])"
    )]
    NonNumeric {
        host: String,
        range: String,
        column: usize,
    },
    #[error(
        "range \"{range}\" at column {column} in \"{host}\" is descending \
         (write the lower bound first, e.g. [2-5])"
    )]
    DescendingRange {
        host: String,
        range: String,
        column: usize,
    },
    #[error(
        "number in range \"{range}\" at column {column} in \"{host}\" is too large \
         (use numbers below 2^64)"
    )]
    NumberTooLarge {
        host: String,
        range: String,
        column: usize,
    },
    #[error(
        "{character:?} at column {column} in \"{host}\" cannot be part of a host name \
         (separate hosts with commas, without spaces)"
    )]
    InvalidCharacter {
        host: String,
        character: char,
        column: usize,
    },
    #[error(
        "\"{host}\" at column {column} expands to more than {limit} hosts \
         (check the ranges for a typo)"
    )]
    TooManyHosts {
        host: String,
        column: usize,
        limit: usize,
    },
}

/// Expands a hostlist expression into host names, in written order.
///
/// ```
/// use pipette::cluster::hostlist::expand;
/// assert_eq!(expand("gpu[01-02,10],cpu").unwrap(), ["gpu01", "gpu02", "gpu10", "cpu"]);
/// assert_eq!(expand("a[1-2]b[3-4]").unwrap(), ["a1b3", "a1b4", "a2b3", "a2b4"]);
/// ```
pub fn expand(list: &str) -> Result<Vec<String>, HostlistError> {
    if list.trim().is_empty() {
        return Err(HostlistError::Empty);
    }
    let entries = split_entries(list)?;
    // Parse everything and check the total size before building any name, so a typo such
    // as `[1-999999999]` fails fast instead of allocating.
    let mut parsed = Vec::with_capacity(entries.len());
    let mut total: usize = 0;
    for (start, text) in entries {
        let entry = parse_entry(list, start, text)?;
        total = total.saturating_add(entry.count());
        if total > MAX_HOSTS {
            return Err(HostlistError::TooManyHosts {
                host: super::shown_host(text),
                column: column_of(list, start),
                limit: MAX_HOSTS,
            });
        }
        parsed.push(entry);
    }
    let mut hosts = Vec::with_capacity(total);
    for entry in &parsed {
        entry.expand_into(&mut hosts);
    }
    Ok(hosts)
}

/// Expands the inside of one bracket group (`0-3,6`) into numbers, in written order.
///
/// Slurm writes device and task lists this way too (`SLURM_JOB_GPUS=0-3`).
pub fn expand_ranges(ranges: &str) -> Result<Vec<u64>, HostlistError> {
    if ranges.trim().is_empty() {
        return Err(HostlistError::Empty);
    }
    let items = parse_group(ranges, 0, ranges, ranges)?;
    let count = items
        .iter()
        .fold(0usize, |sum, item| sum.saturating_add(item.len()));
    if count > MAX_HOSTS {
        return Err(HostlistError::TooManyHosts {
            host: super::shown_host(ranges),
            column: 1,
            limit: MAX_HOSTS,
        });
    }
    Ok(items.iter().flat_map(|item| item.lo..=item.hi).collect())
}

/// One comma-separated entry: literal text and bracket groups, in written order.
#[derive(Debug)]
struct Entry {
    segments: Vec<Segment>,
}

#[derive(Debug)]
enum Segment {
    Literal(String),
    Group(Vec<Range>),
}

/// `lo..=hi`, each printed zero-padded to `width` digits.
#[derive(Debug, Clone, Copy)]
struct Range {
    lo: u64,
    hi: u64,
    width: usize,
}

impl Range {
    fn len(&self) -> usize {
        usize::try_from(self.hi - self.lo)
            .unwrap_or(usize::MAX)
            .saturating_add(1)
    }
}

impl Entry {
    /// The number of hosts this entry expands to (saturating).
    fn count(&self) -> usize {
        self.segments.iter().fold(1usize, |product, segment| {
            product.saturating_mul(match segment {
                Segment::Literal(_) => 1,
                Segment::Group(ranges) => ranges
                    .iter()
                    .fold(0usize, |sum, range| sum.saturating_add(range.len())),
            })
        })
    }

    /// Appends the hosts, first group slowest and last group fastest, as Slurm does.
    fn expand_into(&self, hosts: &mut Vec<String>) {
        let mut prefixes = vec![String::new()];
        for segment in &self.segments {
            prefixes = match segment {
                Segment::Literal(text) => {
                    for prefix in &mut prefixes {
                        prefix.push_str(text);
                    }
                    prefixes
                }
                Segment::Group(ranges) => {
                    let mut next = Vec::new();
                    for prefix in &prefixes {
                        for range in ranges {
                            for n in range.lo..=range.hi {
                                next.push(format!("{prefix}{n:0width$}", width = range.width));
                            }
                        }
                    }
                    next
                }
            };
        }
        hosts.extend(prefixes);
    }
}

/// The 1-based character column of byte offset `at` in `text`.
fn column_of(text: &str, at: usize) -> usize {
    text.get(..at).map_or(at, |head| head.chars().count()) + 1
}

/// Splits at commas outside brackets, trims each entry, and rejects empty entries and
/// unpaired brackets. Returns each entry with its byte offset in `list`.
fn split_entries(list: &str) -> Result<Vec<(usize, &str)>, HostlistError> {
    let mut entries = Vec::new();
    let mut depth_open: Option<usize> = None;
    let mut start = 0;
    for (at, c) in list.char_indices() {
        match c {
            '[' if depth_open.is_some() => {
                return Err(HostlistError::UnexpectedBracket {
                    host: entry_around(list, start, at),
                    bracket: '[',
                    column: column_of(list, at),
                })
            }
            '[' => depth_open = Some(at),
            ']' if depth_open.is_none() => {
                return Err(HostlistError::UnexpectedBracket {
                    host: entry_around(list, start, at),
                    bracket: ']',
                    column: column_of(list, at),
                })
            }
            ']' => depth_open = None,
            ',' if depth_open.is_none() => {
                push_entry(list, start, at, &mut entries)?;
                start = at + 1;
            }
            _ => {}
        }
    }
    if let Some(open) = depth_open {
        return Err(HostlistError::UnclosedBracket {
            host: super::shown_host(list[start..].trim()),
            column: column_of(list, open),
        });
    }
    push_entry(list, start, list.len(), &mut entries)?;
    Ok(entries)
}

/// Trims `list[start..end]` and records it, or reports an empty host name.
fn push_entry<'a>(
    list: &'a str,
    start: usize,
    end: usize,
    entries: &mut Vec<(usize, &'a str)>,
) -> Result<(), HostlistError> {
    let raw = &list[start..end];
    let leading = raw.len() - raw.trim_start().len();
    let text = raw.trim();
    if text.is_empty() {
        return Err(HostlistError::EmptyHost {
            column: column_of(list, start + leading),
        });
    }
    entries.push((start + leading, text));
    Ok(())
}

/// The entry that starts at `start` up to the next comma after `at` (for messages).
fn entry_around(list: &str, start: usize, at: usize) -> String {
    let end = list[at..].find(',').map_or(list.len(), |i| at + i);
    super::shown_host(list[start..end].trim())
}

/// Parses one entry (brackets already known to pair up and not nest).
fn parse_entry(list: &str, start: usize, text: &str) -> Result<Entry, HostlistError> {
    // Whitespace inside brackets is reported by the range parser; outside, here.
    let mut inside = false;
    for (at, c) in text.char_indices() {
        match c {
            '[' => inside = true,
            ']' => inside = false,
            c if !inside && (c.is_whitespace() || c.is_control()) => {
                return Err(HostlistError::InvalidCharacter {
                    host: super::shown_host(text),
                    character: c,
                    column: column_of(list, start + at),
                })
            }
            _ => {}
        }
    }
    let mut segments = Vec::new();
    let mut literal = String::new();
    let mut rest = text;
    let mut offset = start;
    while let Some(open) = rest.find('[') {
        literal.push_str(&rest[..open]);
        let close = rest[open..].find(']').map(|i| open + i).ok_or_else(|| {
            HostlistError::UnclosedBracket {
                host: super::shown_host(text),
                column: column_of(list, offset + open),
            }
        })?;
        if !literal.is_empty() {
            segments.push(Segment::Literal(std::mem::take(&mut literal)));
        }
        let inside = &rest[open + 1..close];
        segments.push(Segment::Group(parse_group(
            list,
            offset + open + 1,
            inside,
            text,
        )?));
        rest = &rest[close + 1..];
        offset += close + 1;
    }
    literal.push_str(rest);
    if !literal.is_empty() {
        segments.push(Segment::Literal(literal));
    }
    // Checked before any name is built: a 50 MB entry must not be copied per host.
    let fixed: usize = segments
        .iter()
        .map(|s| match s {
            Segment::Literal(text) => text.len(),
            Segment::Group(_) => 1,
        })
        .sum();
    if fixed > super::MAX_HOST_NAME {
        return Err(HostlistError::NameTooLong {
            host: super::shown_host(text),
            column: column_of(list, start),
            limit: super::MAX_HOST_NAME,
        });
    }
    Ok(Entry { segments })
}

/// Parses the inside of a bracket group, which starts at byte `start` of `list`.
fn parse_group(
    list: &str,
    start: usize,
    inside: &str,
    host: &str,
) -> Result<Vec<Range>, HostlistError> {
    let mut ranges = Vec::new();
    let mut offset = start;
    for item in inside.split(',') {
        let column = column_of(list, offset);
        offset += item.len() + 1;
        let error_fields = || (super::shown_host(host), super::shown_host(item), column);
        let (low, high) = match item.split_once('-') {
            Some((low, high)) => (low, Some(high)),
            None => (item, None),
        };
        if low.is_empty() && high.is_some_and(|h| h.starts_with(|c: char| c.is_ascii_digit())) {
            let (host, range, column) = error_fields();
            return Err(HostlistError::Negative {
                host,
                range,
                column,
            });
        }
        if low.is_empty() || high.is_some_and(str::is_empty) {
            let (host, range, column) = error_fields();
            return Err(HostlistError::EmptyRange {
                host,
                range,
                column,
            });
        }
        let number = |digits: &str| -> Result<u64, HostlistError> {
            if !digits.bytes().all(|b| b.is_ascii_digit()) {
                let (host, range, column) = error_fields();
                return Err(HostlistError::NonNumeric {
                    host,
                    range,
                    column,
                });
            }
            digits.parse::<u64>().map_err(|_| {
                let (host, range, column) = error_fields();
                HostlistError::NumberTooLarge {
                    host,
                    range,
                    column,
                }
            })
        };
        let lo = number(low)?;
        let hi = match high {
            Some(high) => number(high)?,
            None => lo,
        };
        if lo > hi {
            let (host, range, column) = error_fields();
            return Err(HostlistError::DescendingRange {
                host,
                range,
                column,
            });
        }
        ranges.push(Range {
            lo,
            hi,
            width: low.len(),
        });
    }
    Ok(ranges)
}

/// Hosts in Slurm's hostlist form, runs of one prefix and numbered suffix of one width
/// bracketed, in the order given: `n01 n02 n03 n07 m1` → `n[01-03,07],m1`.
pub fn compress(hosts: &[String]) -> String {
    // (prefix, width, numbers) per run of hosts that differ only in their number.
    let mut runs: Vec<(&str, usize, Vec<u64>)> = Vec::new();
    for host in hosts {
        let digits = host.len() - host.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (prefix, number) = host.split_at(host.len() - digits);
        let parsed = if digits > 0 && digits <= 18 {
            number.parse::<u64>().ok()
        } else {
            None
        };
        match (parsed, runs.last_mut()) {
            (Some(n), Some((p, w, numbers))) if *p == prefix && *w == digits => numbers.push(n),
            (Some(n), _) => runs.push((prefix, digits, vec![n])),
            (None, _) => runs.push((host.as_str(), 0, Vec::new())),
        }
    }
    let parts: Vec<String> = runs
        .into_iter()
        .map(|(prefix, width, numbers)| {
            if numbers.is_empty() {
                return prefix.to_string();
            }
            let pad = |n: u64| format!("{n:0width$}");
            if numbers.len() == 1 {
                return format!("{prefix}{}", pad(numbers[0]));
            }
            let mut ranges: Vec<String> = Vec::new();
            let mut i = 0;
            while i < numbers.len() {
                let mut j = i;
                while j + 1 < numbers.len() && numbers[j + 1] == numbers[j] + 1 {
                    j += 1;
                }
                ranges.push(if i == j {
                    pad(numbers[i])
                } else {
                    format!("{}-{}", pad(numbers[i]), pad(numbers[j]))
                });
                i = j + 1;
            }
            format!("{prefix}[{}]", ranges.join(","))
        })
        .collect();
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(list: &str) -> Vec<String> {
        match expand(list) {
            Ok(hosts) => hosts,
            Err(e) => panic!("{list:?} should expand: {e}"),
        }
    }

    #[test]
    fn plain_names_keep_written_order_and_duplicates() {
        assert_eq!(hosts("node2,node1,node2"), ["node2", "node1", "node2"]);
        assert_eq!(hosts("  solo  "), ["solo"]);
        assert_eq!(hosts("a.example.org, b-1_x"), ["a.example.org", "b-1_x"]);
    }

    #[test]
    fn ranges_keep_padding_of_the_lower_bound() {
        assert_eq!(
            hosts("gpu[001-004]"),
            ["gpu001", "gpu002", "gpu003", "gpu004"]
        );
        assert_eq!(hosts("n[8-10]"), ["n8", "n9", "n10"]);
        assert_eq!(hosts("n[08-10]"), ["n08", "n09", "n10"]);
        assert_eq!(hosts("n[1-010]").len(), 10);
        assert_eq!(hosts("n[0]"), ["n0"]);
    }

    #[test]
    fn commas_inside_brackets_do_not_split_hosts() {
        assert_eq!(
            hosts("gpu[001-002,010],gpu-b[1-2]"),
            ["gpu001", "gpu002", "gpu010", "gpu-b1", "gpu-b2"]
        );
        assert_eq!(hosts("n[3,1,2]"), ["n3", "n1", "n2"]);
    }

    #[test]
    fn several_groups_vary_the_last_fastest() {
        assert_eq!(hosts("a[1-2]b[3-4]"), ["a1b3", "a1b4", "a2b3", "a2b4"]);
        assert_eq!(
            hosts("rack[1-2]-gpu[01-02].ib"),
            [
                "rack1-gpu01.ib",
                "rack1-gpu02.ib",
                "rack2-gpu01.ib",
                "rack2-gpu02.ib"
            ]
        );
        assert_eq!(hosts("[1-2][1-2]"), ["11", "12", "21", "22"]);
    }

    #[test]
    fn errors_name_the_text_and_column() {
        assert_eq!(
            expand("gpu[5-2]"),
            Err(HostlistError::DescendingRange {
                host: "gpu[5-2]".into(),
                range: "5-2".into(),
                column: 5
            })
        );
        assert_eq!(
            expand("a,gpu[1-x]"),
            Err(HostlistError::NonNumeric {
                host: "gpu[1-x]".into(),
                range: "1-x".into(),
                column: 7
            })
        );
        assert_eq!(
            expand("gpu[1,,2]"),
            Err(HostlistError::EmptyRange {
                host: "gpu[1,,2]".into(),
                range: String::new(),
                column: 7
            })
        );
        assert!(matches!(
            expand("gpu[]"),
            Err(HostlistError::EmptyRange { column: 5, .. })
        ));
        assert!(matches!(
            expand("gpu[-3]"),
            Err(HostlistError::Negative { .. })
        ));
        assert!(matches!(
            expand("gpu[3-]"),
            Err(HostlistError::EmptyRange { .. })
        ));
        assert!(matches!(
            expand("gpu[1-2-3]"),
            Err(HostlistError::NonNumeric { .. })
        ));
        assert!(matches!(
            expand("gpu[ 1]"),
            Err(HostlistError::NonNumeric { .. })
        ));
        assert_eq!(
            expand("a,gpu[1-2"),
            Err(HostlistError::UnclosedBracket {
                host: "gpu[1-2".into(),
                column: 6
            })
        );
        assert_eq!(
            expand("gpu1-2]"),
            Err(HostlistError::UnexpectedBracket {
                host: "gpu1-2]".into(),
                bracket: ']',
                column: 7
            })
        );
        assert!(matches!(
            expand("g[1[2]]"),
            Err(HostlistError::UnexpectedBracket {
                bracket: '[',
                column: 4,
                ..
            })
        ));
        assert_eq!(expand("a,,b"), Err(HostlistError::EmptyHost { column: 3 }));
        assert_eq!(expand("a,"), Err(HostlistError::EmptyHost { column: 3 }));
        assert_eq!(expand(" "), Err(HostlistError::Empty));
        assert!(matches!(
            expand("a b"),
            Err(HostlistError::InvalidCharacter {
                character: ' ',
                column: 2,
                ..
            })
        ));
        assert!(matches!(
            expand("n[1-99999999999999999999]"),
            Err(HostlistError::NumberTooLarge { .. })
        ));
    }

    #[test]
    fn huge_expansions_are_refused_before_allocating() {
        assert!(matches!(
            expand("n[0-18446744073709551615]"),
            Err(HostlistError::TooManyHosts { .. })
        ));
        assert!(matches!(
            expand("a[1-1000]b[1-1000]c[1-2]"),
            Err(HostlistError::TooManyHosts { .. })
        ));
        assert_eq!(expand("a[1-1000]b[1-1000]").map(|h| h.len()), Ok(MAX_HOSTS));
    }

    #[test]
    fn messages_are_one_line_with_a_hint() {
        let message = expand("gpu[5-2]").unwrap_err().to_string();
        assert_eq!(
            message,
            "range \"5-2\" at column 5 in \"gpu[5-2]\" is descending \
             (write the lower bound first, e.g. [2-5])"
        );
        for list in [
            "",
            "a,,b",
            "a[1",
            "a]",
            "a[]",
            "a[x]",
            "a[2-1]",
            "a b",
            "a[0-9999999999]",
        ] {
            let message = expand(list).unwrap_err().to_string();
            assert!(!message.contains('\n'), "{message}");
            assert!(message.ends_with(')'), "{message}");
            assert!(
                message.starts_with(|c: char| !c.is_uppercase()),
                "{message}"
            );
        }
    }

    /// `gpu[-1-3]` was "empty range": the range is negative.
    #[test]
    fn defect_12_a_negative_range_is_named_as_negative() {
        let e = expand("gpu[-1-3]").unwrap_err().to_string();
        assert!(e.contains("negative"), "{e}");
        assert!(!e.contains("empty"), "{e}");
    }

    /// A 50 MB host name took minutes to show; names past a DNS name's 253 bytes are
    /// refused before any is built, and the message shows only their start.
    #[test]
    fn defect_04_a_huge_host_name_is_refused_at_once() {
        let huge = format!("h{}", "x".repeat(50 << 20));
        let e = expand(&huge).unwrap_err().to_string();
        assert!(e.contains("253 bytes"), "{}", &e[..200.min(e.len())]);
        assert!(
            e.len() < 400,
            "the message shows a short part: {} bytes",
            e.len()
        );
        let ranged = format!("{}[1-1000000]", "y".repeat(300));
        assert!(matches!(
            expand(&ranged),
            Err(HostlistError::NameTooLong { .. })
        ));
        assert_eq!(expand(&"z".repeat(253)).unwrap().len(), 1);
    }

    #[test]
    fn expand_ranges_reads_slurm_index_lists() {
        assert_eq!(expand_ranges("0-3,6"), Ok(vec![0, 1, 2, 3, 6]));
        assert_eq!(expand_ranges("4"), Ok(vec![4]));
        assert!(expand_ranges("0,a").is_err());
        assert!(expand_ranges("").is_err());
        assert!(expand_ranges("0-18446744073709551615").is_err());
    }

    #[test]
    fn hosts_compress_as_slurm_writes_them() {
        let h = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            compress(&h(&["n01", "n02", "n03", "n07", "m1", "login"])),
            "n[01-03,07],m1,login"
        );
        assert_eq!(compress(&h(&["a9", "a10"])), "a9,a10");
        assert_eq!(compress(&h(&["x"])), "x");
        assert_eq!(compress(&[]), "");
    }
}
