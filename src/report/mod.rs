//! Shows stage values to people (aligned text) and to tools (JSON). Pure: builds
//! strings, never prints.

pub mod dry_run;
pub mod estimate;
pub mod ledger;
pub mod pictures;
pub mod plan;

pub use dry_run::DryRunReport;

/// The schema name and version of a trial report written for tools (`trial.json` in a
/// run directory, `pipette calibrate --out` and `--json`): its `schema` field, then the
/// fields of [`crate::trial::TrialReport`].
pub const TRIAL_SCHEMA: &str = "pipette-trial/1";

/// A trial report as written for tools: [`TRIAL_SCHEMA`] first.
#[derive(Debug, serde::Serialize)]
pub struct TrialFile<'a> {
    pub schema: &'static str,
    #[serde(flatten)]
    pub report: &'a crate::trial::TrialReport,
}

impl<'a> TrialFile<'a> {
    pub fn new(report: &'a crate::trial::TrialReport) -> Self {
        TrialFile {
            schema: TRIAL_SCHEMA,
            report,
        }
    }
}

/// The terminal width our text is laid out for.
pub const WIDTH: usize = 80;

// Wrapping lives with our log lines, the earliest that need it.
pub(crate) use crate::log::fill;
pub use crate::log::wrap;

/// `6738415616` → `6,738,415,616`: parameter counts are read by people.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `6738415616` → `6.74 B`.
pub fn short_count(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2} B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.1} M", n / 1e6)
    } else {
        format!("{n}")
    }
}

/// Devices as a compact list: `[0,1,2,3]` → `0-3`, `[0,1,4,5]` → `0-1,4-5`.
pub fn device_ranges(devices: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < devices.len() {
        let start = devices[i];
        let mut end = start;
        while i + 1 < devices.len() && devices[i + 1] == end + 1 {
            end += 1;
            i += 1;
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

/// Hosts in Slurm's hostlist form, runs of one prefix and numbered suffix of one width
/// bracketed, in the order given: `n01 n02 n03 n07 m1` → `n[01-03,07],m1`.
pub fn compress_hosts(hosts: &[String]) -> String {
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

    #[test]
    fn hosts_compress_as_slurm_writes_them() {
        let h = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            compress_hosts(&h(&["n01", "n02", "n03", "n07", "m1", "login"])),
            "n[01-03,07],m1,login"
        );
        assert_eq!(compress_hosts(&h(&["a9", "a10"])), "a9,a10");
        assert_eq!(compress_hosts(&h(&["x"])), "x");
        assert_eq!(compress_hosts(&[]), "");
    }

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(6738415616), "6,738,415,616");
    }

    #[test]
    fn device_ranges_compresses_runs() {
        assert_eq!(device_ranges(&[0, 1, 2, 3]), "0-3");
        assert_eq!(device_ranges(&[0, 1, 4, 5, 7]), "0-1,4-5,7");
        assert_eq!(device_ranges(&[]), "");
    }
}
