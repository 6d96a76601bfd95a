//! Value parsers shared by the options: whole numbers that refuse a negative value by
//! naming the valid range, and durations read with a checked conversion.
//!
//! clap alone reads `--seed -1` as an unknown flag `-1` and suggests `-- -1`, which then
//! ends the options and fails further on; the options that take a number are declared
//! with `allow_negative_numbers` (or `allow_hyphen_values`) so that the value reaches
//! these parsers, which say what is wrong with it. clap prefixes every message with the
//! option (`invalid value '-1' for '--seed <SEED>'`).

use std::fmt::Display;
use std::str::FromStr;
use std::time::Duration;

/// An unsigned integer type an option can hold, with its largest value.
pub trait Whole: FromStr + Display + Copy + Into<u128> {
    const MAX: Self;
}

impl Whole for u16 {
    const MAX: Self = u16::MAX;
}
impl Whole for u32 {
    const MAX: Self = u32::MAX;
}
impl Whole for u64 {
    const MAX: Self = u64::MAX;
}

/// An amount of bytes: `0`, `500MiB`, `10GiB`, `1.5TiB` (binary units; a bare number is
/// bytes).
pub fn bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let units: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    let (number, scale) = units
        .iter()
        .find_map(|(unit, scale)| t.strip_suffix(unit).map(|n| (n.trim(), *scale)))
        .unwrap_or((t, 1));
    match number.parse::<f64>() {
        Ok(n) if n.is_finite() && n >= 0.0 && n * (scale as f64) < u64::MAX as f64 => {
            Ok((n * scale as f64) as u64)
        }
        _ => Err(format!(
            "{text:?} is not an amount of bytes (e.g. 500MiB, 10GiB, 1.5TiB)"
        )),
    }
}

/// A whole number from 0 to `T::MAX`.
pub fn whole<T: Whole>(text: &str) -> Result<T, String> {
    bounded(text, 0, T::MAX.into())
}

/// A whole number from 1 to `T::MAX` (a size, a count of things that must exist).
pub fn positive<T: Whole>(text: &str) -> Result<T, String> {
    bounded(text, 1, T::MAX.into())
}

/// A whole number from 0 to `MAX`.
pub fn at_most<const MAX: u64>(text: &str) -> Result<u64, String> {
    bounded(text, 0, MAX.into())
}

/// A whole number of at least `MIN`.
pub fn at_least<const MIN: u64>(text: &str) -> Result<u64, String> {
    bounded(text, MIN.into(), u64::MAX.into())
}

/// `usize` option values (counts of list entries) are held to `u32`'s range: more is a
/// mistake on any machine, and the range is the same on every platform.
pub fn whole_usize(text: &str) -> Result<usize, String> {
    whole::<u32>(text).map(|n| n as usize)
}

fn bounded<T: FromStr>(text: &str, min: u128, max: u128) -> Result<T, String> {
    let range = format!("a whole number from {min} to {max}");
    let trimmed = text.trim();
    let digits = trimmed.strip_prefix(['-', '+']).unwrap_or(trimmed);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{text:?} is not a whole number (give {range})"));
    }
    if trimmed.starts_with('-') && digits.bytes().any(|b| b != b'0') {
        return Err(format!("{text:?} is negative (give {range})"));
    }
    match digits.parse::<u128>() {
        Ok(n) if n < min => Err(format!("{text:?} is below {min} (give {range})")),
        Ok(n) if n <= max => digits
            .parse::<T>()
            .map_err(|_| format!("{text:?} is out of range (give {range})")),
        _ => Err(format!("{text:?} is too large (give {range})")),
    }
}

/// The longest duration an option takes: ten years (of 365.25 days). Timeouts are added to
/// an `Instant`, which holds seconds since boot in an `i64`: a value near 2^63 s passed
/// parsing and panicked on the addition (exit 101). Ten years is far beyond any job and far
/// below what an `Instant` can hold, with room for sums of several timeouts.
pub const MAX_DURATION: Duration = Duration::from_secs(315_576_000);

/// A file handed on to another program (`--ssh-config`, which ssh reads): when it is
/// there, a regular file. A FIFO made every ssh (one per node) wait for a writer, and a
/// device is no configuration; a missing file is left to the program, which names it.
pub fn not_a_special_file(text: &str) -> Result<std::path::PathBuf, String> {
    let path = std::path::PathBuf::from(text);
    match std::fs::metadata(&path) {
        Ok(meta) if !meta.is_file() => Err(format!(
            "{:?} is not a regular file (give a file, not a device, pipe or directory)",
            crate::log::printable(text)
        )),
        _ => Ok(path),
    }
}

/// `10`, `10s`, `1.5s`, `500ms`, `5min`, `2h` (a bare number is seconds). The conversion
/// is checked: a value longer than [`MAX_DURATION`] is an error, never a panic.
pub fn duration(text: &str) -> Result<Duration, String> {
    let example = "e.g. 30s, 500ms, 10min";
    let text = text.trim();
    if text.starts_with('-') {
        return Err(format!(
            "{text:?} is negative (give a duration of 0 or more, {example})"
        ));
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale = match unit.trim() {
        "" | "s" | "sec" => 1.0,
        "ms" => 0.001,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("{text:?} is not a duration ({example})")),
    };
    match number.parse::<f64>() {
        Ok(n) if n.is_finite() && n >= 0.0 => Duration::try_from_secs_f64(n * scale)
            .ok()
            .filter(|d| *d <= MAX_DURATION)
            .ok_or_else(|| {
                format!("{text:?} is too long to be a duration (give at most 10 years, {example})")
            }),
        _ => Err(format!("{text:?} is not a duration ({example})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_of_bytes_take_binary_units() {
        assert_eq!(bytes("0"), Ok(0));
        assert_eq!(bytes("512"), Ok(512));
        assert_eq!(bytes("500MiB"), Ok(500 << 20));
        assert_eq!(bytes("10 GiB"), Ok(10 << 30));
        assert_eq!(bytes("1.5TiB"), Ok(3 << 39));
        for bad in ["-1GiB", "ten", "1e30TiB", "5GB", ""] {
            assert!(
                bytes(bad).unwrap_err().contains("not an amount of bytes"),
                "{bad}"
            );
        }
    }

    #[test]
    fn whole_numbers_name_their_range() {
        assert_eq!(whole::<u64>("0"), Ok(0));
        assert_eq!(whole::<u32>(" 7 "), Ok(7));
        assert_eq!(whole::<u16>("-0"), Ok(0));
        assert_eq!(positive::<u64>("3"), Ok(3));
        assert_eq!(at_least::<2>("2"), Ok(2));
        let e = whole::<u64>("-1").unwrap_err();
        assert_eq!(
            e,
            "\"-1\" is negative (give a whole number from 0 to 18446744073709551615)"
        );
        assert!(whole::<u32>("4294967296")
            .unwrap_err()
            .contains("too large"));
        assert!(whole::<u16>("1e3")
            .unwrap_err()
            .contains("not a whole number"));
        assert!(positive::<u32>("0").unwrap_err().contains("below 1"));
        assert!(at_least::<2>("1").unwrap_err().contains("from 2 to"));
        assert!(whole::<u64>("").is_err());
    }

    /// `Duration::from_secs_f64` panicked (exit 101) on 2^64 s and more.
    #[test]
    fn defect_01_huge_duration_is_an_error_not_a_panic() {
        for huge in [
            "18446744073709551616",
            "1e30",
            "99999999999999999999h",
            "1e400",
        ] {
            let e = duration(huge).unwrap_err();
            assert!(e.contains("duration"), "{huge}: {e}");
        }
        assert!(duration("18446744073709551616")
            .unwrap_err()
            .contains("too long"));
        assert!(duration("1000000000000000000").is_err());
    }

    /// 2^63 s up to just under 2^64 s passed parsing and panicked where a timeout was added
    /// to an `Instant` (exit 101). Every accepted duration now fits beside any `Instant`.
    #[test]
    fn n1_durations_that_overflow_an_instant_are_refused_at_parse_time() {
        for huge in ["9223372036854775808", "18446744073709551615", "87700h"] {
            let e = duration(huge).unwrap_err();
            assert!(e.contains("at most 10 years"), "{huge}: {e}");
        }
        let longest = duration("87600h").unwrap();
        assert_eq!(longest, Duration::from_secs(315_360_000));
        assert!(std::time::Instant::now()
            .checked_add(MAX_DURATION * 4)
            .is_some());
    }
}
