//! Words for bash: every value a launch script carries is single-quoted here, so that no
//! template, host name or user argument can make the shell interpret anything.

/// `word` as one bash word that means exactly `word`: always single-quoted, with each `'`
/// written as `'\''`. Inside single quotes bash interprets nothing — not `$`, backticks,
/// `\`, `;` or newlines — so the word arrives byte-for-byte. The empty word is `''`.
/// Callers reject NUL bytes, which no argv can hold.
pub use crate::exec::single_quote as shell_quote;

/// The words quoted and joined by single spaces: a command line to paste into bash.
pub fn shell_join<S: AsRef<str>>(words: &[S]) -> String {
    words
        .iter()
        .map(|w| shell_quote(w.as_ref()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `text` on one line, for comments and tables: control characters and Unicode line
/// separators are written as Rust escapes (`\n`, `\u{2028}`), everything else as it is.
/// A newline in a bash comment would end the comment and run the rest.
pub fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || c == '\u{2028}' || c == '\u{2029}' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What bash makes of a sequence of single-quoted pieces and `\'`: the inverse of
    /// [`shell_quote`] for the words it writes.
    fn unquote(quoted: &str) -> Option<String> {
        let mut out = String::new();
        let mut chars = quoted.chars();
        while let Some(c) = chars.next() {
            match c {
                '\'' => loop {
                    match chars.next()? {
                        '\'' => break,
                        c => out.push(c),
                    }
                },
                '\\' => out.push(chars.next()?),
                _ => return None,
            }
        }
        Some(out)
    }

    #[test]
    fn quotes_what_a_shell_would_interpret() {
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("plain"), "'plain'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote("$(rm -rf /); `x`"), "'$(rm -rf /); `x`'");
        assert_eq!(shell_quote("a\nb"), "'a\nb'");
        assert_eq!(shell_join(&["a b", "c"]), "'a b' 'c'");
    }

    #[test]
    fn one_line_escapes_line_breaks_only() {
        assert_eq!(one_line("gpu-01"), "gpu-01");
        assert_eq!(one_line("a\nb\r\t"), "a\\nb\\r\\t");
        assert_eq!(one_line("héllo wörld"), "héllo wörld");
        assert_eq!(one_line("x\u{2028}y"), "x\\u{2028}y");
    }

    proptest::proptest! {
        #[test]
        fn quoting_round_trips(word in "(?s)[^\u{0}]{0,40}") {
            let quoted = shell_quote(&word);
            proptest::prop_assert_eq!(unquote(&quoted), Some(word.clone()));
            proptest::prop_assert!(quoted.starts_with('\'') && quoted.ends_with('\''));
        }

        #[test]
        fn one_line_has_no_line_breaks(text in "(?s).{0,40}") {
            let line = one_line(&text);
            proptest::prop_assert!(!line.contains('\n') && !line.contains('\r'));
        }
    }
}
