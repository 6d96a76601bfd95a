//! Shows stage values to people (aligned text) and to tools (JSON). Pure: builds
//! strings, never prints.

pub mod doctor;
pub mod dry_run;
pub mod estimate;
pub mod layouts;
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
/// `1 micro-batch`, `8 micro-batches`.
pub fn micro_batches(n: u64) -> String {
    if n == 1 {
        "1 micro-batch".into()
    } else {
        format!("{n} micro-batches")
    }
}

pub const WIDTH: usize = 80;

// Wrapping lives with our log lines, the earliest that need it.
pub(crate) use crate::log::fill;
pub use crate::log::wrap;

// Host lists are written in the form the scheduler reads them.
pub use crate::cluster::hostlist::compress as compress_hosts;

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

#[cfg(test)]
mod tests {
    use super::*;

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
