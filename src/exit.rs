//! Every exit code `pipette-run` and `pipette` can return, with its meaning: the one list
//! that `--help` shows ([`HELP`]) and the README's table repeats (a test holds them equal).
//!
//! A leaf: it imports no stage, so every stage (the top-level error, the supervisor) can
//! name a code without depending on the others.

/// Exit codes of `pipette-run` and `pipette`.
///
/// `2` matches torchrun (argparse) for a malformed command line; 65–72 follow `sysexits.h`
/// in spirit and never collide with a command-line error; 124, 127 and 128 + N follow the
/// shell (`timeout`, a command not found, a signal). Any other code is the failing training
/// worker's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitCode {
    Success = 0,
    /// A malformed pipette-run or torchrun option (the same code torchrun uses).
    Usage = 2,
    /// The arguments after SCRIPT (Megatron's, or the batch sizes of a DeepSpeed config they
    /// name) or a preset describe an impossible model or run.
    ModelArgs = 65,
    /// The node list could not be read: Slurm/PBS variables, hostfile, --hosts, --include/--exclude.
    NodeList = 66,
    /// The cluster profile file is missing, malformed or inconsistent.
    ClusterFile = 67,
    /// A node could not be reached (profiling, launch).
    Unreachable = 68,
    /// No parallel configuration fits in the GPUs' memory.
    NothingFits = 69,
    /// A bug in pipette-run: please report it.
    Internal = 70,
    /// torchrun is not on this machine's PATH (or --torchrun names no executable file)
    /// when the nodes are run locally: found before anything runs.
    NoTorchrun = 71,
    /// The training script failed, or did not finish in time, in the trial run; nothing
    /// was launched.
    TrialFailed = 72,
    /// `pipette doctor` found a node that would fail a run for a reason other than these
    /// (no PyTorch, a broken python or driver, GPU and CPU nodes mixed, a full disk).
    NodeNotReady = 73,
    /// The run directory could not be written: a full or read-only disk, a missing
    /// permission (`sysexits.h`'s EX_IOERR).
    CannotWrite = 74,
    /// The job made no progress for the stall timeout and could not be re-planned (a hang
    /// has no worker exit code; this is the code `timeout` gives).
    Stalled = 124,
    /// torchrun could not be started (the shell's code for a command that cannot run).
    CannotStart = 127,
}

impl ExitCode {
    pub const fn code(self) -> i32 {
        self as i32
    }
}

/// The code for an end by signal `signal` (the shell's 128 + N).
pub const fn signal(signal: i32) -> i32 {
    SIGNAL_BASE + signal
}

/// Whether `code` is how a shell reports a command ended by a signal (128 + 1..=64).
pub const fn is_signal(code: i32) -> bool {
    code > SIGNAL_BASE && code <= SIGNAL_BASE + 64
}

const SIGNAL_BASE: i32 = 128;

/// One line of the exit-code list: the code as people read it and what it means.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    /// `0`, `65`, `128+N`, `other`.
    pub code: &'static str,
    pub meaning: &'static str,
    /// The fixed code this row stands for (`None` for `128+N` and `other`).
    pub exit_code: Option<ExitCode>,
}

const fn row(exit_code: ExitCode, code: &'static str, meaning: &'static str) -> Row {
    Row {
        code,
        meaning,
        exit_code: Some(exit_code),
    }
}

/// Every code the programs can return, in order.
pub const ROWS: &[Row] = &[
    row(ExitCode::Success, "0", "success"),
    row(ExitCode::Usage, "2", "malformed command line (as torchrun)"),
    row(
        ExitCode::ModelArgs,
        "65",
        "the arguments after SCRIPT (Megatron's, or a DeepSpeed config's batch sizes) or --model describe an impossible model or run",
    ),
    row(
        ExitCode::NodeList,
        "66",
        "the node list is malformed (Slurm/PBS variables, --hostfile, --hosts, --include/--exclude)",
    ),
    row(
        ExitCode::ClusterFile,
        "67",
        "the cluster profile file (--cluster) is missing, malformed or inconsistent",
    ),
    row(ExitCode::Unreachable, "68", "a node could not be reached"),
    row(
        ExitCode::NothingFits,
        "69",
        "no parallel configuration fits in GPU memory",
    ),
    row(
        ExitCode::Internal,
        "70",
        "internal error (a bug: please report it)",
    ),
    row(
        ExitCode::NoTorchrun,
        "71",
        "torchrun not found (local launcher: not on PATH, or --torchrun is no executable; or on a node, by pipette doctor); nothing ran",
    ),
    row(
        ExitCode::TrialFailed,
        "72",
        "the training script failed (or timed out) in the trial run; nothing was launched",
    ),
    row(
        ExitCode::NodeNotReady,
        "73",
        "pipette doctor found a node not ready to run (no PyTorch, a broken python or driver, GPU and CPU nodes mixed, a full disk); its report says what to fix",
    ),
    row(
        ExitCode::CannotWrite,
        "74",
        "the run directory could not be written (a full or read-only disk, a missing permission); nothing was launched",
    ),
    row(
        ExitCode::Stalled,
        "124",
        "the job stalled (no progress for --stall-timeout) and could not be re-planned",
    ),
    row(
        ExitCode::CannotStart,
        "127",
        "torchrun could not be started on the nodes",
    ),
    Row {
        code: "128+N",
        meaning: "stopped by signal N, or a node's torchrun was ended by signal N and could not be re-planned",
        exit_code: None,
    },
    Row {
        code: "other",
        meaning: "the exit code of the first training worker that failed",
        exit_code: None,
    },
];

/// The list as `--help` ends: `Exit codes:` and one line per [`ROWS`] entry, the meanings
/// aligned. Built at compile time so that clap can take it as a constant.
pub const HELP: &str = match std::str::from_utf8(&HELP_BYTES) {
    Ok(text) => text,
    Err(_) => panic!("the exit-code help is not UTF-8"),
};

const HEADER: &str = "Exit codes:";
const INDENT: usize = 2;
/// The widest code and two spaces.
const WIDTH: usize = {
    let mut widest = 0;
    let mut i = 0;
    while i < ROWS.len() {
        if ROWS[i].code.len() > widest {
            widest = ROWS[i].code.len();
        }
        i += 1;
    }
    widest + 2
};
const HELP_LEN: usize = {
    let mut n = HEADER.len();
    let mut i = 0;
    while i < ROWS.len() {
        n += 1 + INDENT + WIDTH + ROWS[i].meaning.len();
        i += 1;
    }
    n
};
const HELP_BYTES: [u8; HELP_LEN] = {
    const fn put(out: &mut [u8; HELP_LEN], mut at: usize, text: &str) -> usize {
        let bytes = text.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            out[at] = bytes[i];
            at += 1;
            i += 1;
        }
        at
    }
    let mut out = [b' '; HELP_LEN];
    let mut at = put(&mut out, 0, HEADER);
    let mut i = 0;
    while i < ROWS.len() {
        out[at] = b'\n';
        at = put(&mut out, at + 1 + INDENT, ROWS[i].code);
        at += WIDTH - ROWS[i].code.len();
        at = put(&mut out, at, ROWS[i].meaning);
        i += 1;
    }
    out
};

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [ExitCode; 14] = [
        ExitCode::Success,
        ExitCode::Usage,
        ExitCode::ModelArgs,
        ExitCode::NodeList,
        ExitCode::ClusterFile,
        ExitCode::Unreachable,
        ExitCode::NothingFits,
        ExitCode::Internal,
        ExitCode::NoTorchrun,
        ExitCode::TrialFailed,
        ExitCode::NodeNotReady,
        ExitCode::CannotWrite,
        ExitCode::Stalled,
        ExitCode::CannotStart,
    ];

    #[test]
    fn every_code_has_one_row_that_names_it() {
        for code in ALL {
            let rows: Vec<&Row> = ROWS.iter().filter(|r| r.exit_code == Some(code)).collect();
            assert_eq!(rows.len(), 1, "{code:?}");
            assert_eq!(rows[0].code, code.code().to_string(), "{code:?}");
        }
        assert_eq!(
            ROWS.iter().filter(|r| r.exit_code.is_some()).count(),
            ALL.len()
        );
    }

    #[test]
    fn help_lists_every_row_aligned() {
        let lines: Vec<&str> = HELP.lines().collect();
        assert_eq!(lines[0], "Exit codes:");
        assert_eq!(lines.len(), ROWS.len() + 1);
        assert_eq!(lines[1], "  0      success");
        assert_eq!(
            lines[4],
            "  66     the node list is malformed (Slurm/PBS variables, --hostfile, --hosts, --include/--exclude)"
        );
        assert_eq!(
            lines[16],
            "  other  the exit code of the first training worker that failed"
        );
        assert!(!HELP.ends_with('\n'));
    }

    #[test]
    fn signals_are_128_plus_their_number() {
        assert_eq!(signal(9), 137);
        assert!(is_signal(137) && is_signal(192));
        assert!(!is_signal(128) && !is_signal(193) && !is_signal(1));
    }

    /// The README's "Exit codes" table lists exactly the codes `--help` lists.
    #[test]
    fn the_readme_lists_the_same_codes() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
            .expect("README.md");
        let section = readme
            .split("### Exit codes")
            .nth(1)
            .expect("the README has an \"Exit codes\" section");
        let codes: Vec<&str> = section
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .skip(2) // the header and its rule
            .filter_map(|l| l.split('|').nth(1).map(str::trim))
            .collect();
        let ours: Vec<&str> = ROWS.iter().map(|r| r.code).collect();
        assert_eq!(codes, ours);
    }
}
