//! Text for the comments and tables of a launch script and its README. The values a script
//! runs are quoted elsewhere, each one by [`crate::exec::single_quote`].

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

    #[test]
    fn one_line_escapes_line_breaks_only() {
        assert_eq!(one_line("gpu-01"), "gpu-01");
        assert_eq!(one_line("a\nb\r\t"), "a\\nb\\r\\t");
        assert_eq!(one_line("héllo wörld"), "héllo wörld");
        assert_eq!(one_line("x\u{2028}y"), "x\\u{2028}y");
    }

    proptest::proptest! {
        #[test]
        fn one_line_has_no_line_breaks(text in "(?s).{0,40}") {
            let line = one_line(&text);
            proptest::prop_assert!(!line.contains('\n') && !line.contains('\r'));
        }
    }
}
