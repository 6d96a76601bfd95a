//! The signals pipette-run handles for the whole job, from the first moment (discovery,
//! profiling, the trial) to the end of its supervision. The handler only counts them
//! (atomics: a signal handler may call only what is async-signal-safe), and wakes the thread
//! that exits when a second stop signal ends pipette-run at once; whatever runs reads the
//! counts:
//!
//! - **stop** signals — INT, TERM, HUP, QUIT (as torchrun handles them): whatever runs is
//!   stopped in order (a staged job's nodes, see [`super::staged`]; the training's nodes,
//!   torn down by the supervisor), its staging removed, and pipette-run exits with
//!   128 + the first signal's number. What does not watch for them (discovery, planning)
//!   finishes its step first; a second stop signal then ends pipette-run at once, unless
//!   something that answers it itself is running ([`Stopping`]: a staged job's nodes are
//!   being stopped, or the supervisor's teardown, where a second signal kills at once).
//! - **act** signals — USR1, USR2 (Slurm's `--signal=USR1@120` before a time limit): they
//!   ask the training script to do something (checkpoint, stop by itself), so the job goes
//!   on and whoever runs the script passes them to it ([`ActSignals`]); while nothing of
//!   the user's runs (profiling, planning) there is nobody to tell, and they are dropped.
//!
//! Owns only the process's signal dispositions and the counts; knows nothing of nodes.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::libc::c_int;
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

/// The signals that stop the job.
pub const STOP_SIGNALS: [Signal; 4] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// The signals passed on to the training script while the job goes on.
pub const ACT_SIGNALS: [Signal; 2] = [Signal::SIGUSR1, Signal::SIGUSR2];

static STOPS: AtomicUsize = AtomicUsize::new(0);
static FIRST_STOP: AtomicI32 = AtomicI32::new(0);
/// How many of each [`ACT_SIGNALS`] have arrived, in that order.
static ACTS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// How many [`Stopping`] guards live.
static ANSWERING: AtomicUsize = AtomicUsize::new(0);

/// How many guards live, and the dispositions the first one replaced.
static INSTALLED: Mutex<(usize, Vec<(Signal, SigAction)>)> = Mutex::new((0, Vec::new()));

/// The writing end of the pipe the handler wakes the exiting thread through (see
/// [`start_exiting_thread`]).
static EXIT_NOW: OnceLock<OwnedFd> = OnceLock::new();

extern "C" fn on_signal(signal: c_int) {
    if let Some(i) = ACT_SIGNALS.iter().position(|s| *s as c_int == signal) {
        ACTS[i].fetch_add(1, Ordering::SeqCst);
        return;
    }
    let _ = FIRST_STOP.compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
    let count = STOPS.fetch_add(1, Ordering::SeqCst) + 1;
    if count >= 2 && ANSWERING.load(Ordering::SeqCst) == 0 {
        // Nobody stops anything in order now: the user asked twice, so go. Not from here:
        // exiting runs atexit handlers and flushes buffers, which a handler may not do
        // (only async-signal-safe calls), and the one exit that may (`_exit`) is unsafe
        // libc, not in nix. `write` is async-signal-safe: it wakes the thread that exits.
        if let Some(exit_now) = EXIT_NOW.get() {
            let _ = nix::unistd::write(exit_now, &[0]);
        }
    }
}

/// Starts, once per process, the thread that ends pipette-run with 128 + the first stop
/// signal's number as soon as the handler writes to [`EXIT_NOW`]. The pipe is closed on
/// exec (the commands pipette-run starts do not hold it), and its writing end does not
/// block (a handler must never wait; one byte is all it takes).
fn start_exiting_thread() -> nix::Result<()> {
    if EXIT_NOW.get().is_some() {
        return Ok(());
    }
    let (read_end, write_end) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    fcntl(&write_end, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    std::thread::Builder::new()
        .name("pipette-exit".to_string())
        .spawn(move || loop {
            match nix::unistd::read(&read_end, &mut [0u8]) {
                Ok(0) => return,
                Ok(_) => std::process::exit(128 + FIRST_STOP.load(Ordering::SeqCst)),
                Err(Errno::EINTR) => continue,
                Err(_) => return,
            }
        })
        .map_err(|e| e.raw_os_error().map_or(Errno::EAGAIN, Errno::from_raw))?;
    let _ = EXIT_NOW.set(write_end);
    Ok(())
}

/// While one lives, a second stop signal is left to its maker (who stops what runs, and
/// may kill at once), instead of ending pipette-run at once.
pub struct Stopping {
    _private: (),
}

impl Stopping {
    pub fn new() -> Stopping {
        ANSWERING.fetch_add(1, Ordering::SeqCst);
        Stopping { _private: () }
    }
}

impl Default for Stopping {
    fn default() -> Self {
        Stopping::new()
    }
}

impl Drop for Stopping {
    fn drop(&mut self) {
        ANSWERING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The handlers, installed while a guard lives. Guards nest: the application installs one
/// as it starts and the supervisor another, and the counts run on across both; when the
/// last is dropped the previous dispositions come back and the counts start again from
/// zero.
pub struct SignalGuard {
    _private: (),
}

/// The stop signals that have arrived so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// The first stop signal's number.
    pub signal: i32,
    /// How many stop signals have arrived.
    pub count: usize,
}

impl SignalGuard {
    /// Installs the handlers for [`STOP_SIGNALS`] and [`ACT_SIGNALS`] (the first guard
    /// does; later ones share it).
    pub fn install() -> nix::Result<SignalGuard> {
        let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
        if installed.0 == 0 {
            start_exiting_thread()?;
            reset_counts();
            let action = SigAction::new(
                SigHandler::Handler(on_signal),
                SaFlags::SA_RESTART,
                SigSet::empty(),
            );
            let mut previous = Vec::new();
            for signal in STOP_SIGNALS.into_iter().chain(ACT_SIGNALS) {
                // SAFETY: the handler only touches atomics, which is async-signal-safe.
                match unsafe { sigaction(signal, &action) } {
                    Ok(old) => previous.push((signal, old)),
                    Err(e) => {
                        restore(&mut previous);
                        return Err(e);
                    }
                }
            }
            installed.1 = previous;
        }
        installed.0 += 1;
        Ok(SignalGuard { _private: () })
    }

    /// The stop signals received so far, if any.
    pub fn received(&self) -> Option<Received> {
        stop_received()
    }

    /// How many stop signals have arrived.
    pub fn count(&self) -> usize {
        STOPS.load(Ordering::SeqCst)
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
        installed.0 -= 1;
        if installed.0 == 0 {
            restore(&mut installed.1);
            reset_counts();
        }
    }
}

fn restore(previous: &mut Vec<(Signal, SigAction)>) {
    for (signal, old) in previous.drain(..) {
        // SAFETY: restores the action that was installed before.
        let _ = unsafe { sigaction(signal, &old) };
    }
}

fn reset_counts() {
    STOPS.store(0, Ordering::SeqCst);
    FIRST_STOP.store(0, Ordering::SeqCst);
    for count in &ACTS {
        count.store(0, Ordering::SeqCst);
    }
}

/// The stop signals received while a [`SignalGuard`] lives (none without one).
pub fn stop_received() -> Option<Received> {
    let count = STOPS.load(Ordering::SeqCst);
    (count > 0).then(|| Received {
        signal: FIRST_STOP.load(Ordering::SeqCst),
        count,
    })
}

/// The act signals that arrived since it was made (or last asked): whoever runs the user's
/// script makes one as it starts it and passes on what [`ActSignals::take`] returns.
#[derive(Debug)]
pub struct ActSignals {
    seen: [usize; 2],
}

impl ActSignals {
    /// Counts from now: what arrived before is not this one's to pass on.
    pub fn new() -> ActSignals {
        ActSignals {
            seen: [0, 1].map(|i| ACTS[i].load(Ordering::SeqCst)),
        }
    }

    /// The act signals that arrived since the last call, once each, USR1 before USR2.
    pub fn take(&mut self) -> Vec<Signal> {
        let mut arrived = Vec::new();
        for (i, signal) in ACT_SIGNALS.into_iter().enumerate() {
            let now = ACTS[i].load(Ordering::SeqCst);
            // Counts restart from zero when the last guard goes.
            let new = now.saturating_sub(self.seen[i]);
            arrived.extend(std::iter::repeat_n(signal, new));
            self.seen[i] = now;
        }
        arrived
    }
}

impl Default for ActSignals {
    fn default() -> Self {
        ActSignals::new()
    }
}

/// `SIGTERM` for 15.
pub fn signal_name(signal: i32) -> String {
    Signal::try_from(signal).map_or_else(|_| format!("signal {signal}"), |s| s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set in the copy of the test binary that [`a_second_stop_signal_ends_pipette_run_at_once`]
    /// starts: that copy receives the signals.
    const CHILD: &str = "PIPETTE_SIGNALS_TEST_CHILD";

    /// Two stop signals with nothing to answer them end the process with 128 + the first
    /// one's number, whatever it is doing. Run in a copy of this test binary (this test
    /// alone), as the signals end it.
    #[test]
    fn a_second_stop_signal_ends_pipette_run_at_once() {
        if std::env::var_os(CHILD).is_some() {
            let _guard = SignalGuard::install().unwrap();
            nix::sys::signal::raise(Signal::SIGTERM).unwrap();
            nix::sys::signal::raise(Signal::SIGINT).unwrap();
            // The exiting thread ends the process while this one sleeps.
            std::thread::sleep(std::time::Duration::from_secs(30));
            panic!("still running after the second stop signal");
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "exec::signals::tests::a_second_stop_signal_ends_pipette_run_at_once",
                "--test-threads",
                "1",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(128 + Signal::SIGTERM as i32),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
