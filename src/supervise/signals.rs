//! SIGINT and SIGTERM while a job runs: the handler only counts them (an atomic store is all
//! a signal handler may safely do); the supervisor's loop reads the count and forwards the
//! signal as a teardown: TERM to every node, the grace period, then KILL. A second signal
//! while tearing down kills at once.

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

use nix::libc::c_int;
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

static COUNT: AtomicUsize = AtomicUsize::new(0);
static FIRST: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(signal: c_int) {
    let _ = FIRST.compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
    COUNT.fetch_add(1, Ordering::SeqCst);
}

/// The handlers, installed while it lives; the previous ones come back when it is dropped.
pub struct SignalGuard {
    previous: Vec<(Signal, SigAction)>,
}

/// What has arrived so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// The first signal's number (SIGINT or SIGTERM).
    pub signal: i32,
    /// How many have arrived.
    pub count: usize,
}

impl SignalGuard {
    /// Installs the handlers for SIGINT and SIGTERM (counts start from zero).
    pub fn install() -> nix::Result<SignalGuard> {
        COUNT.store(0, Ordering::SeqCst);
        FIRST.store(0, Ordering::SeqCst);
        let action = SigAction::new(
            SigHandler::Handler(on_signal),
            SaFlags::SA_RESTART,
            SigSet::empty(),
        );
        let mut previous = Vec::new();
        for signal in [Signal::SIGINT, Signal::SIGTERM] {
            // SAFETY: the handler only touches atomics, which is async-signal-safe.
            let old = unsafe { sigaction(signal, &action) }?;
            previous.push((signal, old));
        }
        Ok(SignalGuard { previous })
    }

    /// The signals received since [`SignalGuard::install`], if any.
    pub fn received(&self) -> Option<Received> {
        let count = COUNT.load(Ordering::SeqCst);
        (count > 0).then(|| Received {
            signal: FIRST.load(Ordering::SeqCst),
            count,
        })
    }

    /// How many signals have arrived.
    pub fn count(&self) -> usize {
        COUNT.load(Ordering::SeqCst)
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        for (signal, old) in self.previous.drain(..) {
            // SAFETY: restores the action that was installed before.
            let _ = unsafe { sigaction(signal, &old) };
        }
    }
}

/// `SIGTERM` for 15.
pub fn signal_name(signal: i32) -> String {
    Signal::try_from(signal).map_or_else(|_| format!("signal {signal}"), |s| s.to_string())
}
