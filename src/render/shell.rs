//! Text for the comments and tables of a launch script and its README, and the one quoting
//! of the words a launch script runs ([`word`]).

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

/// `w` as one bash word that prints as what it is: single-quoted
/// ([`crate::exec::single_quote`]), or, when it holds a control or Unicode format character
/// (an escape sequence, a bidi override), in bash's `$'…'` with every such character written
/// as the `\xHH` of its UTF-8 bytes, so the script hands the word on byte for byte and
/// reading the script (`cat`, a pager, the dry run) cannot move the cursor, recolour,
/// reorder or hide what follows. Launch scripts are bash (`templates/launch.sh.j2`); the
/// remote command lines, which a node's login shell may read as POSIX sh, keep
/// [`crate::exec::shell_quote`].
pub fn word(w: &str) -> String {
    let hidden = |c: char| (c.is_control() && c != '\t') || crate::log::is_format_char(c);
    if !w.chars().any(hidden) {
        return crate::exec::single_quote(w);
    }
    let mut out = String::with_capacity(w.len() + 8);
    out.push_str("$'");
    for c in w.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            c if hidden(c) => {
                let mut bytes = [0u8; 4];
                for b in c.encode_utf8(&mut bytes).bytes() {
                    out.push_str(&format!("\\x{b:02x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// [`word`] of each, joined by spaces.
pub fn words<S: AsRef<str>>(ws: impl IntoIterator<Item = S>) -> String {
    ws.into_iter()
        .map(|w| word(w.as_ref()))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// N4: a script argument with an escape sequence or a bidi override is written so that
    /// the script reads clean and bash hands the word on byte for byte.
    #[test]
    fn n4_a_word_with_control_characters_is_escaped_and_still_exact() {
        assert_eq!(word("plain"), "'plain'");
        assert_eq!(word("it's"), "'it'\\''s'");
        for w in [
            "\u{1b}[31mred\u{1b}[0m",
            "a\nb",
            "x\u{202e}gnp.exe",
            "back\\slash and ' quote\u{7}",
            "\u{85}c1",
        ] {
            let quoted = word(w);
            assert!(quoted.starts_with("$'"), "{quoted}");
            assert!(!quoted
                .chars()
                .any(|c| c.is_control() || crate::log::is_format_char(c)));
            let out = std::process::Command::new("bash")
                .args(["-c", &format!("printf %s {quoted}")])
                .output()
                .unwrap();
            assert_eq!(String::from_utf8(out.stdout).unwrap(), w, "{quoted}");
        }
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
        fn one_line_has_no_line_breaks(text in "(?s).{0,40}") {
            let line = one_line(&text);
            proptest::prop_assert!(!line.contains('\n') && !line.contains('\r'));
        }
    }
}
