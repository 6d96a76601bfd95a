//! What a port open to the network spends on connections it refuses, bounded (N16: a
//! flood of connections to a copy's control port started one thread and wrote one log
//! line each, without limit).
//!
//! - [`Handshakes`]: at most [`MAX_HANDSHAKES`] handshakes at once; a connection beyond
//!   them is closed unread (and counted as refused).
//! - [`Refusals`]: the first refusal is logged in full (its address and why); the ones that
//!   follow within [`WINDOW`] are counted, and one line per window sums them up ("refused
//!   480 connections to the control port from 10.0.0.9, 10.0.0.7 in the last 10 s"), so a
//!   flood writes one line per window however fast it comes.
//!
//! The accept loops that use them call [`Refusals::tick`] while idle, so a window's summary
//! comes when it ends even if nothing else connects.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::serve::Log;

/// The most handshakes a listener runs at once: the copies of a job connect a few at a
/// time, and a handshake takes at most [`super::wire::HANDSHAKE_TIMEOUT`].
pub const MAX_HANDSHAKES: usize = 64;

/// How often, at most, refusals after the first are summed up in one line.
pub const WINDOW: Duration = Duration::from_secs(10);

/// How many addresses a summary names (the rest are counted).
const ADDRESSES_NAMED: usize = 3;

/// The handshakes under way on one listener.
#[derive(Clone, Default)]
pub struct Handshakes(Arc<AtomicUsize>);

/// One handshake's place; the place is free again when this is dropped.
pub struct Slot(Arc<AtomicUsize>);

impl Handshakes {
    /// A place for one more handshake, or `None` when [`MAX_HANDSHAKES`] run already.
    pub fn try_start(&self) -> Option<Slot> {
        self.0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < MAX_HANDSHAKES).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(Arc::clone(&self.0)))
    }

    /// What an accept loop does with the connection `stream` it just accepted from
    /// `peer`: a place for its handshake, given back with it; or, when [`MAX_HANDSHAKES`] run
    /// already, the connection closed unread and counted among the `refusals`.
    pub fn admit<S>(&self, stream: S, peer: SocketAddr, refusals: &Refusals) -> Option<(S, Slot)> {
        let Some(slot) = self.try_start() else {
            drop(stream);
            refusals.refused(peer, "too many connections at once");
            return None;
        };
        Some((stream, slot))
    }

    /// How many run now.
    pub fn running(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The refused connections of one listener, logged within bounds (see the module doc).
pub struct Refusals {
    /// What was refused, for the lines: "a command connection", "a copy of pipette-run
    /// connecting".
    what: &'static str,
    /// What a refusal means for the user, after the reason: "nothing was run".
    outcome: &'static str,
    window: Duration,
    log: Log,
    state: Mutex<Window>,
}

#[derive(Default)]
struct Window {
    /// When the window opened (with a refusal logged in full, or a summary).
    opened: Option<Instant>,
    /// Refusals counted since then.
    count: u64,
    addresses: Vec<IpAddr>,
    more_addresses: bool,
}

impl Refusals {
    pub fn new(what: &'static str, outcome: &'static str, log: Log) -> Arc<Refusals> {
        Arc::new(Refusals::with_window(what, outcome, WINDOW, log))
    }

    fn with_window(
        what: &'static str,
        outcome: &'static str,
        window: Duration,
        log: Log,
    ) -> Refusals {
        Refusals {
            what,
            outcome,
            window,
            log,
            state: Mutex::new(Window::default()),
        }
    }

    /// Notes one refused connection from `peer`, refused for `reason`.
    pub fn refused(&self, peer: SocketAddr, reason: &str) {
        self.refused_at(Instant::now(), peer, reason);
    }

    /// Sums up the window if it is over; call it while idle.
    pub fn tick(&self) {
        self.tick_at(Instant::now());
    }

    /// Sums up what is counted and not yet said (when the listener closes).
    pub fn flush(&self) {
        let mut state = self.lock();
        if let Some(opened) = state.opened {
            self.summarise(&mut state, opened.elapsed());
        }
        *state = Window::default();
    }

    fn refused_at(&self, now: Instant, peer: SocketAddr, reason: &str) {
        let mut state = self.lock();
        self.roll(&mut state, now);
        if state.opened.is_none() {
            state.opened = Some(now);
            (self.log)(&format!(
                "refused {} from {peer}: {reason} ({})",
                self.what, self.outcome
            ));
            return;
        }
        state.count += 1;
        let ip = peer.ip();
        if !state.addresses.contains(&ip) {
            if state.addresses.len() < ADDRESSES_NAMED {
                state.addresses.push(ip);
            } else {
                state.more_addresses = true;
            }
        }
    }

    fn tick_at(&self, now: Instant) {
        let mut state = self.lock();
        self.roll(&mut state, now);
    }

    /// At the end of a window: one line for what it counted, and a new window while
    /// refusals keep coming (so a flood is summed up, never logged one by one).
    fn roll(&self, state: &mut Window, now: Instant) {
        let Some(opened) = state.opened else {
            return;
        };
        if now.saturating_duration_since(opened) < self.window {
            return;
        }
        let counted = state.count;
        self.summarise(state, self.window);
        *state = Window::default();
        if counted > 0 {
            state.opened = Some(now);
        }
    }

    fn summarise(&self, state: &mut Window, over: Duration) {
        if state.count == 0 {
            return;
        }
        let mut from: Vec<String> = state.addresses.iter().map(IpAddr::to_string).collect();
        if state.more_addresses {
            from.push("other addresses".to_string());
        }
        let plural = if state.count == 1 { "" } else { "s" };
        (self.log)(&format!(
            "refused {} more connection{plural} from {} in the last {} ({}; something keeps connecting without the job's secret)",
            state.count,
            from.join(", "),
            crate::exec::format_duration(over),
            self.outcome,
        ));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::agent::collecting;

    fn peer(last: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, last], 40000 + u16::from(last)))
    }

    #[test]
    fn n16_a_flood_of_refusals_is_one_line_per_window() {
        let (log, lines) = collecting();
        let refusals =
            Refusals::with_window("a connection", "nothing ran", Duration::from_secs(10), log);
        let t0 = Instant::now();
        for i in 0..1000u32 {
            let at = t0 + Duration::from_millis(u64::from(i) * 15);
            refusals.refused_at(at, peer((i % 5) as u8), "wrong job secret");
        }
        // 1000 refusals over 15 s: the first in full, one summary for the first window.
        refusals.tick_at(t0 + Duration::from_secs(15));
        {
            let lines = lines.lock().unwrap();
            assert_eq!(lines.len(), 2, "{lines:#?}");
            assert_eq!(
                lines[0],
                "refused a connection from 10.0.0.0:40000: wrong job secret (nothing ran)"
            );
            assert!(
                lines[1].starts_with(
                    "refused 666 more connections from 10.0.0.1, 10.0.0.2, 10.0.0.3, other \
                     addresses in the last 10 s (nothing ran; "
                ),
                "{}",
                lines[1]
            );
        }
        // The flood goes on: the next window is summed up too, never logged one by one.
        refusals.tick_at(t0 + Duration::from_secs(25));
        assert_eq!(lines.lock().unwrap().len(), 3);
        assert!(lines.lock().unwrap()[2].starts_with("refused 333 more connections"));
        // Quiet for a window: the window closes, and the next refusal is news again.
        refusals.tick_at(t0 + Duration::from_secs(40));
        refusals.refused_at(t0 + Duration::from_secs(41), peer(9), "malformed handshake");
        let lines = lines.lock().unwrap();
        assert_eq!(lines.len(), 4, "{lines:#?}");
        assert!(lines[3].contains("from 10.0.0.9:40009: malformed handshake"));
    }

    #[test]
    fn n16_what_is_counted_is_said_when_the_listener_closes() {
        let (log, lines) = collecting();
        let refusals = Refusals::new("a connection", "nothing ran", log);
        refusals.refused(peer(1), "wrong job secret");
        refusals.refused(peer(1), "wrong job secret");
        refusals.flush();
        refusals.flush();
        let lines = lines.lock().unwrap();
        assert_eq!(lines.len(), 2, "{lines:#?}");
        assert!(
            lines[1].starts_with("refused 1 more connection from 10.0.0.1 in the last "),
            "{}",
            lines[1]
        );
    }

    #[test]
    fn n16_handshakes_are_bounded() {
        let handshakes = Handshakes::default();
        let slots: Vec<Slot> = (0..MAX_HANDSHAKES)
            .map(|_| handshakes.try_start().expect("a place"))
            .collect();
        assert!(handshakes.try_start().is_none());
        assert_eq!(handshakes.running(), MAX_HANDSHAKES);
        drop(slots);
        assert_eq!(handshakes.running(), 0);
        assert!(handshakes.try_start().is_some());
    }

    #[test]
    fn n16_a_connection_beyond_the_handshakes_is_closed_and_refused() {
        let (log, lines) = collecting();
        let refusals = Refusals::new("a connection", "nothing ran", log);
        let handshakes = Handshakes::default();
        let admitted: Vec<(u32, Slot)> = (0..MAX_HANDSHAKES as u32)
            .map(|i| handshakes.admit(i, peer(1), &refusals).expect("a place"))
            .collect();
        assert_eq!(admitted[7].0, 7, "the connection comes back with its place");
        assert!(lines.lock().unwrap().is_empty());
        assert!(handshakes.admit(99u32, peer(2), &refusals).is_none());
        assert_eq!(
            *lines.lock().unwrap(),
            ["refused a connection from 10.0.0.2:40002: too many connections at once (nothing ran)"]
        );
        drop(admitted);
        assert!(handshakes.admit(100u32, peer(3), &refusals).is_some());
    }
}
