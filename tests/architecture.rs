//! The stage order of the crate, checked: data flows one way (exec → cluster → peers →
//! config/model → plan → render → launch → trial → replan → supervise → report → cli → job →
//! error → app), so no module of an earlier stage may name a later one. Reads every
//! `crate::` path in the code of src/ (comments and doc links excepted: a doc may point
//! anywhere) and fails on a back-edge, naming the file and line.

use std::path::{Path, PathBuf};

/// Every top-level module of the library, earliest first. Modules of the same rank may
/// name each other (the user's settings and the cost models describe one another).
const ORDER: &[(&str, u32)] = &[
    // A leaf: every exit code with its meaning; it names no stage (checked below).
    ("exit", 0),
    // A leaf too: our own log lines (stamp, level, filter, wrapping), for every stage.
    ("log", 0),
    // A leaf too: reading an input file (a regular file, bounded in size).
    ("input_file", 0),
    ("exec", 1),
    ("cluster", 2),
    // One copy per node: the leader gathers the copies, the agents follow it.
    ("peers", 3),
    // Measures the nodes into a cluster profile.
    ("measure", 4),
    ("config", 5),
    ("model", 5),
    ("plan", 6),
    ("render", 7),
    ("launch", 8),
    ("trial", 9),
    // The re-plan policy: trial rounds and the survivors' plan.
    ("replan", 10),
    ("supervise", 11),
    // `pipette doctor`'s probe and judgement: whether the nodes are ready to run.
    ("doctor", 11),
    // Presentation and the front: stage values for people, the command lines, the
    // top-level error, the orchestrator.
    ("report", 12),
    ("cli", 13),
    // The launch sequence as values (gather, decide, spec, trial, first attempt): it
    // reads the resolved command line (cli) and builds report sections; it prints nothing.
    ("job", 14),
    ("error", 15),
    ("app", 16),
];

fn rank(module: &str) -> Option<u32> {
    ORDER.iter().find(|(m, _)| *m == module).map(|(_, r)| *r)
}

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|x| x == "rs") {
            into.push(path);
        }
    }
}

/// The top-level modules a line of code names through `crate::`.
fn named_modules(line: &str) -> Vec<String> {
    let code = line.trim_start();
    if code.starts_with("//") {
        return Vec::new();
    }
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().last();
        rest = &rest[at + "crate::".len()..];
        // `$crate::` and `some_crate::` are not this crate's paths.
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            // `crate::{a, b}`: every name of the group.
            if let Some(group) = rest.strip_prefix('{') {
                let group = group.split('}').next().unwrap_or("");
                for item in group.split(',') {
                    let item = item.trim();
                    let head: String = item
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !head.is_empty() {
                        found.push(head);
                    }
                }
            }
        } else {
            found.push(name);
        }
    }
    found
}

/// `(file, line number, from, to)` for every `crate::` path in src/ (bins excepted: they
/// are the top).
fn edges() -> Vec<(String, usize, String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut edges = Vec::new();
    for file in files {
        let relative = file.strip_prefix(&src).expect("under src/");
        let first = relative
            .components()
            .next()
            .expect("a path")
            .as_os_str()
            .to_string_lossy()
            .to_string();
        if first == "bin" || first == "lib.rs" {
            continue;
        }
        let from = first.trim_end_matches(".rs").to_string();
        let text = std::fs::read_to_string(&file).expect("a readable source file");
        for (number, line) in text.lines().enumerate() {
            for to in named_modules(line) {
                if to != from {
                    let shown = format!("src/{}", relative.display());
                    edges.push((shown, number + 1, from.clone(), to));
                }
            }
        }
    }
    edges
}

#[test]
fn no_module_names_a_later_stage() {
    let edges = edges();
    assert!(
        edges
            .iter()
            .any(|(_, _, from, to)| from == "app" && to == "supervise"),
        "the reader found no app → supervise path: it reads nothing"
    );
    let mut wrong = Vec::new();
    for (file, line, from, to) in &edges {
        match (rank(from), rank(to)) {
            (Some(a), Some(b)) if b <= a => {}
            (Some(_), Some(_)) => wrong.push(format!(
                "{file}:{line}: {from} names {to}, a later stage (move what it needs down, or put it where both can reach)"
            )),
            _ => wrong.push(format!(
                "{file}:{line}: {from} → {to}: a module not in tests/architecture.rs ORDER (add it at its stage)"
            )),
        }
    }
    assert!(wrong.is_empty(), "back-edges:\n{}", wrong.join("\n"));
}

#[test]
fn exit_codes_name_no_stage_and_only_the_app_names_the_error() {
    for (file, line, from, to) in edges() {
        assert!(
            from != "exit" && from != "log" && from != "input_file",
            "{file}:{line}: the {from} module names {to}; it must stay a leaf"
        );
        assert!(
            to != "error" || from == "app",
            "{file}:{line}: {from} names the top-level error; only app (and the binaries) may"
        );
    }
}

#[test]
fn every_module_of_the_library_has_a_stage() {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"))
        .expect("src/lib.rs");
    let declared: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';'))
        .collect();
    assert!(declared.len() > 10, "found only {declared:?} in src/lib.rs");
    for module in declared {
        assert!(
            rank(module).is_some(),
            "src/lib.rs declares {module}, which tests/architecture.rs ORDER does not place"
        );
    }
}

#[test]
fn the_reader_sees_paths_groups_and_no_comments() {
    assert_eq!(named_modules("use crate::plan::Plan;"), ["plan"]);
    assert_eq!(
        named_modules("    use crate::{exec::Transport, model::{Calibration}};"),
        ["exec", "model"]
    );
    assert_eq!(
        named_modules("let x = crate::trial::DEFAULT_ITERS + crate::exit::X;"),
        ["trial", "exit"]
    );
    assert!(named_modules("//! see [`crate::supervise`]").is_empty());
    assert!(named_modules("    /// [`crate::cli::torchrun`]").is_empty());
    assert!(named_modules("$crate::x::y; other_crate::z").is_empty());
}
