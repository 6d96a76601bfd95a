//! Signals for the whole job (issue 15): {HUP, QUIT, USR1, TERM, INT} × {profiling, trial,
//! training}, on two local CPU "nodes" (`node-a`, `node-b`, one process each) with
//! PyTorch's real torchrun and the toy GPT (`examples/train_gpt.py`) under a small script
//! that records every USR1/USR2 its Python handler sees.
//!
//! - a stop signal (HUP, QUIT, TERM, INT) ends pipette-run with 128 + N, an `exit` event in
//!   `events.jsonl`, no process of the job and no staging directory left;
//! - USR1 in the trial or the training reaches every worker's handler, is recorded as a
//!   `signal_passed` event (attempt 0 in the trial), and the job goes on to exit 0; in
//!   profiling nobody runs the script yet, so it is dropped and the job goes on.
//!
//! The profiling phase is held by a torchrun wrapper that waits, before it runs the link
//! probe, for a file the test writes; the trial or training phase by the script, which
//! waits for the signal at its start. Every wait is for a marker file or pipette-run's
//! exit, bounded only against a hung job. They run one at a time (two CPU cores).
//!
//! Needs the venv of `scripts/setup-megatron-venv` (or `PIPETTE_MEGATRON_PYTHON`); fails,
//! never skips, without it.

mod common;

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::Signal;

use common::{assert_no_process_left, torchrun, JobBuilder, Patience, RunningJob};
use pipette::exec::signals::{stop_received, ActSignals, Received, SignalGuard};
use pipette::supervise::events::read_events;

static SERIAL: Mutex<()> = Mutex::new(());

/// The bound on one job: profiling, a trial and training of the toy on a loaded 2-core
/// machine (torch imports alone take seconds each there).
const JOB_LIMIT: Patience = Patience {
    quiet: Duration::from_secs(300),
    hard: Duration::from_secs(300),
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Profiling,
    Trial,
    Training,
}

/// The script torchrun runs: records USR1/USR2 in `signals.log`, says it is ready (its
/// handler is in place), and in the phase `SIGTEST_HOLD` names waits for a signal before
/// it trains. `--save` tells the training from the trial (which drops it).
const SCRIPT: &str = r#"
import os, runpy, signal, sys, time
d = os.environ["SIGTEST_DIR"]
phase = "train" if "--save" in sys.argv else "trial"
rank = os.environ.get("RANK", "?")
got = []
def on(sig, frame):
    with open(os.path.join(d, "signals.log"), "a") as f:
        f.write(f"{signal.Signals(sig).name} {phase} {rank}\n")
    got.append(sig)
signal.signal(signal.SIGUSR1, on)
signal.signal(signal.SIGUSR2, on)
with open(os.path.join(d, f"ready.{phase}.{rank}"), "w") as f:
    f.write(f"{os.getpid()}\n")
if os.environ.get("SIGTEST_HOLD") == phase:
    end = time.time() + 600
    while not got and time.time() < end:
        time.sleep(0.05)
train = os.path.join(os.environ["SIGTEST_REPO"], "examples", "train_gpt.py")
sys.argv = [train] + sys.argv[1:]
runpy.run_path(train, run_name="__main__")
"#;

/// Starts the job held (when `hold`) in `phase`.
fn start(phase: Phase, hold: bool) -> RunningJob {
    let mut job = JobBuilder::new(env!("CARGO_BIN_EXE_pipette-run"), "pipette-signals-");
    let d = job.dir().to_path_buf();
    std::fs::create_dir(d.join("tmp")).unwrap();
    let script = d.join("sigtest.py");
    std::fs::write(&script, SCRIPT).unwrap();
    // Holds the link probe until `release` exists.
    let wrapper = d.join("torchrun");
    common::write_executable(&wrapper, &format!(
            "#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in */bandwidth.py) echo $$ >> '{d}/probe.started'; \
             while [ ! -e '{d}/release' ]; do sleep 0.05; done ;; esac; done\nexec '{real}' \"$@\"\n",
            d = d.display(),
            real = torchrun().display()
        ));
    job.hosts(&["node-a", "node-b"], 1)
        .args(["--launcher", "local", "--pin", "tp=1,pp=1,dp=2"])
        .launch_basics(&wrapper)
        .args([
            "--grace",
            "5s",
            "--health-timeout",
            "15s",
            "--trial-iters",
            "2",
            // One trial: the script holds every trial until a signal comes, and the
            // measured choice's further trials get none.
            "--trial-top-k",
            "1",
        ]);
    if phase != Phase::Profiling {
        job.cpu_cluster(&["node-a", "node-b"], 1);
    }
    if phase != Phase::Trial {
        job.arg("--no-trial");
    }
    let hold = match (hold, phase) {
        (true, Phase::Trial) => "trial",
        (true, Phase::Training) => "train",
        _ => "none",
    };
    job.arg(&script)
        .args(common::tiny_gpt_args(2, 100))
        .arg("--save")
        .arg(d.join("ckpt"));
    job.command()
        .env("SIGTEST_DIR", &d)
        .env("SIGTEST_REPO", common::repo())
        .env("SIGTEST_HOLD", hold)
        .env("TMPDIR", d.join("tmp"))
        .env("XDG_CACHE_HOME", d.join("cache"));
    job.spawn()
}

/// What the scripts' handlers recorded, sorted.
fn signals_seen(job: &RunningJob) -> Vec<String> {
    let mut lines: Vec<String> = job
        .read("signals.log")
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

fn has_file(dir: &Path, prefix: &str) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(prefix))
    })
}

/// Runs one case of the matrix.
fn case(signal: Signal, phase: Phase) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let act = signal == Signal::SIGUSR1;
    let mut job = start(phase, act);
    match phase {
        Phase::Profiling => job.wait_until("the link probe", JOB_LIMIT, |j| {
            j.path("probe.started").exists()
        }),
        Phase::Trial => job.wait_until("the trial's workers", JOB_LIMIT, |j| {
            has_file(j.dir(), "ready.trial.0") && has_file(j.dir(), "ready.trial.1")
        }),
        Phase::Training => job.wait_until("the training's workers", JOB_LIMIT, |j| {
            has_file(j.dir(), "ready.train.0") && has_file(j.dir(), "ready.train.1")
        }),
    }
    job.signal(signal);
    if act && phase == Phase::Profiling {
        // Nobody to pass it to: the job goes on once the probe may run.
        std::fs::write(job.path("release"), "").unwrap();
    }
    let status = job.wait(JOB_LIMIT);
    let output = job.output();
    let code = status
        .code()
        .unwrap_or_else(|| panic!("pipette-run died: {status}\n{output}"));
    let expected = if act { 0 } else { 128 + signal as i32 };
    assert_eq!(code, expected, "{signal} in {phase:?}:\n{output}");

    let events = read_events(&job.run_dir().join("events.jsonl"))
        .unwrap_or_else(|e| panic!("{signal} in {phase:?}: no events ({e}):\n{output}"));
    let exit = events
        .iter()
        .find(|e| e["event"] == "exit")
        .unwrap_or_else(|| panic!("{signal} in {phase:?}: no exit event: {events:?}"));
    assert_eq!(exit["code"], expected, "{exit}");

    let seen = signals_seen(&job);
    match (act, phase) {
        (true, Phase::Trial) => {
            assert_eq!(seen, ["SIGUSR1 trial 0", "SIGUSR1 trial 1"]);
            // The trial records it too, as attempt 0 (before the job's attempt 1).
            assert!(
                events.iter().any(|e| e["event"] == "signal_passed"
                    && e["signal"] == "SIGUSR1"
                    && e["attempt"] == 0
                    && e["workers"] == 2),
                "{events:?}"
            );
        }
        (true, Phase::Training) => {
            assert_eq!(seen, ["SIGUSR1 train 0", "SIGUSR1 train 1"]);
            assert!(
                events.iter().any(|e| e["event"] == "signal_passed"
                    && e["signal"] == "SIGUSR1"
                    && e["workers"] == 2),
                "{events:?}"
            );
        }
        _ => assert!(seen.is_empty(), "{signal} in {phase:?}: {seen:?}"),
    }
    assert_no_process_left(&job.marker());
    let tmp = job.path("tmp");
    for staging in ["pipette-probe.", "pipette-trial."] {
        assert!(
            !has_file(&tmp, staging),
            "{signal} in {phase:?} left {staging}* in {}",
            tmp.display()
        );
    }
}

macro_rules! matrix {
    ($($name:ident: $signal:ident, $phase:ident;)*) => {
        $(
            #[test]
            fn $name() {
                case(Signal::$signal, Phase::$phase);
            }
        )*
    };
}

matrix! {
    hup_in_profiling: SIGHUP, Profiling;
    quit_in_profiling: SIGQUIT, Profiling;
    usr1_in_profiling: SIGUSR1, Profiling;
    term_in_profiling: SIGTERM, Profiling;
    int_in_profiling: SIGINT, Profiling;
    hup_in_the_trial: SIGHUP, Trial;
    quit_in_the_trial: SIGQUIT, Trial;
    usr1_in_the_trial: SIGUSR1, Trial;
    term_in_the_trial: SIGTERM, Trial;
    int_in_the_trial: SIGINT, Trial;
    hup_in_training: SIGHUP, Training;
    quit_in_training: SIGQUIT, Training;
    usr1_in_training: SIGUSR1, Training;
    term_in_training: SIGTERM, Training;
    int_in_training: SIGINT, Training;
}

/// The handler's counts, in this test process (the matrix runs pipette-run as children,
/// which have their own): stop and act signals apart, guards nested.
#[test]
fn stop_and_act_signals_are_counted_apart_while_a_guard_lives() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let outer = SignalGuard::install().unwrap();
    let mut acts = ActSignals::new();
    let inner = SignalGuard::install().unwrap();
    nix::sys::signal::raise(Signal::SIGUSR1).unwrap();
    nix::sys::signal::raise(Signal::SIGUSR2).unwrap();
    nix::sys::signal::raise(Signal::SIGUSR1).unwrap();
    assert_eq!(stop_received(), None, "act signals do not stop");
    assert_eq!(
        acts.take(),
        [Signal::SIGUSR1, Signal::SIGUSR1, Signal::SIGUSR2]
    );
    assert!(acts.take().is_empty(), "each is passed on once");
    assert!(ActSignals::new().take().is_empty(), "earlier ones are not");
    // A second stop signal would end a process that nothing answers it in.
    let _stopping = pipette::exec::signals::Stopping::new();
    nix::sys::signal::raise(Signal::SIGHUP).unwrap();
    nix::sys::signal::raise(Signal::SIGTERM).unwrap();
    drop(inner);
    assert_eq!(
        outer.received(),
        Some(Received {
            signal: Signal::SIGHUP as i32,
            count: 2
        }),
        "the counts run on across nested guards"
    );
    drop(outer);
    assert_eq!(stop_received(), None, "the last guard resets the counts");
}
