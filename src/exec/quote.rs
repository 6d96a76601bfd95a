//! POSIX shell quoting, and the checks that keep host names from being read as options.
//!
//! Two quoting behaviours, each with one name:
//! - [`shell_quote`] / [`shell_join`] quote a word only where a shell would read something
//!   into it, and leave plain words bare: the remote command lines this seam hands to ssh
//!   and srun, and the command labels in messages, stay readable.
//! - [`single_quote`] / [`single_quote_join`] single-quote every word, plain or not: the
//!   launch scripts and the command lines render shows to people, where every value looks
//!   the same so that a reader never has to wonder.
//!
//! Both give a word a POSIX shell hands on byte for byte. A remote command crosses a shell
//! exactly once (ssh hands one string to the login shell there), so every word of it is
//! quoted here and nothing a user, a hostfile or a node wrote is ever interpreted by a
//! shell. Callers reject NUL bytes, which no argv can hold.

/// `word` as one POSIX shell word: wrapped in single quotes, with each `'` written as
/// `'\''`. Every byte other than `'` stands for itself inside single quotes (newlines, `$`,
/// backticks, `\`, `;`, `*` included), so the shell hands the word on unchanged. Words made
/// only of characters no shell treats specially are left bare, for readable logs.
pub fn shell_quote(word: &str) -> String {
    if !word.is_empty() && word.bytes().all(is_plain) {
        return word.to_owned();
    }
    single_quote(word)
}

/// `word` always wrapped in single quotes (`'` written as `'\''`), even when it is plain:
/// launch scripts quote every value the same way, so a reader never has to wonder. The
/// empty word is `''`.
pub fn single_quote(word: &str) -> String {
    let mut out = String::with_capacity(word.len() + 2);
    out.push('\'');
    for c in word.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// The words quoted with [`shell_quote`] and joined by spaces: a command line that a POSIX
/// shell splits back into exactly these words.
pub fn shell_join<S: AsRef<str>>(words: impl IntoIterator<Item = S>) -> String {
    join(words, shell_quote)
}

/// The words quoted with [`single_quote`] and joined by spaces: a command line to paste
/// into bash, every word in single quotes.
pub fn single_quote_join<S: AsRef<str>>(words: impl IntoIterator<Item = S>) -> String {
    join(words, single_quote)
}

fn join<S: AsRef<str>>(words: impl IntoIterator<Item = S>, quote: fn(&str) -> String) -> String {
    let mut out = String::new();
    for (k, word) in words.into_iter().enumerate() {
        if k > 0 {
            out.push(' ');
        }
        out.push_str(&quote(word.as_ref()));
    }
    out
}

/// Bytes that no POSIX shell gives a meaning to in any position of a word (`=` and `~` are
/// special at the start of some words, `-` only to the program, which sees it quoted or not).
fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'_' | b'-' | b'.' | b'/' | b':' | b',' | b'+' | b'@' | b'%'
        )
}

/// Splits `line` into words as a POSIX shell would, without running one: blanks separate
/// words; `'...'` keeps everything literally; `"..."` too, except that `\` escapes `"`, `\`,
/// `$` and `` ` `` there; a `\` outside quotes keeps the next character. Nothing is expanded
/// (`$VAR`, `$(...)`, `*`, `~` stay as written): options such as `--srun-args` are words for
/// a program, never shell text. An unclosed quote or a trailing `\` is an error.
pub fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => words.extend(word.take()),
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => return Err("a ' is not closed".to_string()),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => w.push(c),
                            Some(c) => {
                                w.push('\\');
                                w.push(c);
                            }
                            None => return Err("a \" is not closed".to_string()),
                        },
                        Some(c) => w.push(c),
                        None => return Err("a \" is not closed".to_string()),
                    }
                }
            }
            '\\' => match chars.next() {
                Some(c) => word.get_or_insert_with(String::new).push(c),
                None => return Err("it ends with a \\".to_string()),
            },
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    Ok(words)
}

/// Why a host name cannot be handed to ssh or srun, or `None` when it can.
///
/// A name starting with `-` would be read as an option (`-oProxyCommand=...` runs a
/// command); blanks, control characters and an empty name are never host names.
pub fn host_problem(host: &str) -> Option<&'static str> {
    if host.is_empty() {
        Some("is empty")
    } else if host.starts_with('-') {
        Some("starts with '-', which ssh and srun would read as an option")
    } else if host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some("contains a blank or a control character")
    } else if host.chars().any(crate::log::is_format_char) {
        Some("contains an invisible Unicode format character (bidirectional or zero-width), which would show as another name")
    } else {
        None
    }
}

/// The key a host name is compared by: DNS names are case-insensitive and `x.` is the
/// fully-qualified spelling of `x`, so `nodeA`, `NODEA` and `nodea.` are one node. Every
/// comparison of host names goes through it (or [`same_host`]): the cluster file, the host
/// lists, the health checks, the re-plan's survivors and spares, the agents' addresses.
pub fn host_key(host: &str) -> String {
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

/// Whether `a` and `b` name one host ([`host_key`]).
pub fn same_host(a: &str, b: &str) -> bool {
    let (a, b) = (
        a.strip_suffix('.').unwrap_or(a),
        b.strip_suffix('.').unwrap_or(b),
    );
    a.eq_ignore_ascii_case(b)
}

/// Whether `name` is a valid environment variable name (`[A-Za-z_][A-Za-z0-9_]*`).
pub fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn n5_a_host_is_one_host_whatever_its_case_or_trailing_dot() {
        for (a, b) in [
            ("nodeA", "NODEA"),
            ("x", "x."),
            ("Node-1.", "node-1"),
            ("a.b.", "A.B"),
        ] {
            assert!(same_host(a, b), "{a} {b}");
            assert_eq!(host_key(a), host_key(b), "{a} {b}");
        }
        for (a, b) in [("nodea", "nodeb"), ("x", "x.."), ("x", "x.y"), ("", ".")] {
            assert_eq!(same_host(a, b), host_key(a) == host_key(b), "{a} {b}");
        }
        assert!(!same_host("nodea", "nodeb"));
        assert!(!same_host("x", "x.y"));
    }

    #[test]
    fn words_split_as_a_shell_splits_them_and_nothing_expands() {
        let split = |l: &str| split_words(l).unwrap();
        assert_eq!(
            split(
                "--container-image=nvcr.io#nvidia/pytorch:24.05-py3 --container-mounts=/data:/data"
            ),
            [
                "--container-image=nvcr.io#nvidia/pytorch:24.05-py3",
                "--container-mounts=/data:/data"
            ]
        );
        assert_eq!(
            split("  -o 'SetEnv=A=b c'\t-p\n22 "),
            ["-o", "SetEnv=A=b c", "-p", "22"]
        );
        assert_eq!(
            split(r#"a"b c"d 'x'"y" \$(id) "\"\$HOME\\" '' """#),
            ["ab cd", "xy", "$(id)", "\"$HOME\\", "", ""]
        );
        assert_eq!(split(r#""a\b" a\ b"#), ["a\\b", "a b"]);
        assert!(split("").is_empty());
        assert_eq!(split_words("'open").unwrap_err(), "a ' is not closed");
        assert_eq!(split_words("\"open").unwrap_err(), "a \" is not closed");
        assert_eq!(split_words("end\\").unwrap_err(), "it ends with a \\");
    }

    #[test]
    fn split_words_reads_back_what_shell_join_wrote() {
        let words = [
            "plain",
            "a b",
            "it's",
            "$(id)",
            "\"q\"",
            "`x`",
            "",
            "tab\tnl\n",
            "\\",
        ];
        assert_eq!(split_words(&shell_join(words)).unwrap(), words);
        assert_eq!(split_words(&single_quote_join(words)).unwrap(), words);
    }

    #[test]
    fn plain_words_stay_bare() {
        assert_eq!(shell_quote("torchrun"), "torchrun");
        assert_eq!(shell_quote("--nproc-per-node"), "--nproc-per-node");
        assert_eq!(shell_quote("/tmp/a.py"), "/tmp/a.py");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote("K=V"), "'K=V'");
        assert_eq!(shell_quote("~"), "'~'");
    }

    #[test]
    fn sh_splits_a_joined_line_back_into_the_same_words() {
        let words = [
            "plain",
            "",
            "two words",
            "it's",
            "'",
            "''",
            "$HOME",
            "`id`",
            "$(id)",
            "a;b",
            "a|b&c",
            "line\nbreak",
            "back\\slash",
            "\"double\"",
            "*",
            "?",
            "[x]",
            "{a,b}",
            "~root",
            "#comment",
            "tab\there",
            "ünïcødé",
            "!bang",
            "-n",
        ];
        let line = shell_join(words);
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("printf '%s\\0' {line}"))
            .output()
            .unwrap();
        assert!(out.status.success());
        let got: Vec<&str> = std::str::from_utf8(&out.stdout)
            .unwrap()
            .split_terminator('\0')
            .collect();
        assert_eq!(got, words);
    }

    /// What a POSIX shell makes of a word written by [`shell_quote`] or [`single_quote`]:
    /// single-quoted pieces, `\'`, and bare plain bytes; `None` for anything else.
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
                c if c.is_ascii() && is_plain(c as u8) => out.push(c),
                _ => return None,
            }
        }
        Some(out)
    }

    #[test]
    fn single_quote_quotes_every_word() {
        assert_eq!(single_quote(""), "''");
        assert_eq!(single_quote("plain"), "'plain'");
        assert_eq!(single_quote("it's"), "'it'\\''s'");
        assert_eq!(single_quote("$(rm -rf /); `x`"), "'$(rm -rf /); `x`'");
        assert_eq!(single_quote("a\nb"), "'a\nb'");
        assert_eq!(single_quote_join(["a b", "c"]), "'a b' 'c'");
    }

    proptest::proptest! {
        #[test]
        fn single_quoting_round_trips(word in "(?s)[^\u{0}]{0,40}") {
            let quoted = single_quote(&word);
            proptest::prop_assert_eq!(unquote(&quoted), Some(word.clone()));
            proptest::prop_assert!(quoted.starts_with('\'') && quoted.ends_with('\''));
        }

        /// Bare or quoted, the word a shell reads is the word given, and a bare word holds
        /// only bytes no shell gives a meaning to.
        #[test]
        fn shell_quoting_round_trips(word in "(?s)[^\u{0}]{0,40}") {
            let quoted = shell_quote(&word);
            proptest::prop_assert_eq!(unquote(&quoted), Some(word.clone()));
            proptest::prop_assert!(
                quoted.starts_with('\'') || (!quoted.is_empty() && quoted.bytes().all(is_plain))
            );
        }
    }

    #[test]
    fn option_like_and_blank_hosts_are_refused() {
        assert!(host_problem("gpu07").is_none());
        assert!(host_problem("10.0.0.7").is_none());
        assert!(host_problem("-oProxyCommand=x").is_some());
        assert!(host_problem("").is_some());
        assert!(host_problem("a b").is_some());
        assert!(host_problem("a\nb").is_some());
    }

    #[test]
    fn env_names() {
        assert!(is_env_name("CUDA_VISIBLE_DEVICES"));
        assert!(is_env_name("_x1"));
        assert!(!is_env_name("1x"));
        assert!(!is_env_name("A-B"));
        assert!(!is_env_name(""));
        assert!(!is_env_name("A=B"));
    }
}
