//! Capturing what the crate logs on the test's own thread, reliably while other tests run.
//!
//! `tracing` caches each callsite's interest process-wide when the callsite is first reached.
//! While at most one dispatcher is registered, that interest is asked of the *reaching
//! thread's* default subscriber: a sibling test's thread without one caches "never", and the
//! event then reaches no subscriber anywhere — the capture misses it. With two or more
//! registered, every registered dispatcher is asked (and their answers combined), the capturing
//! one included. So the first capture registers a second dispatcher for the rest of the process,
//! one that wants nothing.
//!
//! (One window stays, outside a test's reach: a callsite whose first reach on another thread
//! began just before the first capture of the process registered.)

use std::sync::{Arc, Mutex, OnceLock};

use tracing::Dispatch;
use tracing::level_filters::LevelFilter;
use tracing::subscriber::DefaultGuard;
use tracing_subscriber::layer::SubscriberExt;

/// A `tracing` writer into a shared buffer, to read what was logged.
#[derive(Clone, Default)]
pub(crate) struct Captured(pub(crate) Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Captures the events at `level` and above logged on this thread while the guard lives.
    pub(crate) fn on_this_thread(&self, level: tracing::Level) -> DefaultGuard {
        keep_a_second_dispatcher_registered();
        let writer = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(level)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    /// Captures the warnings logged on this thread while the guard lives.
    pub(crate) fn warnings(&self) -> DefaultGuard {
        self.on_this_thread(tracing::Level::WARN)
    }

    /// What was logged so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Registers, once, a dispatcher no thread uses and that wants no event: from then on a
/// callsite's interest is combined from every registered dispatcher's, never one thread's
/// default alone. Wanting nothing (level `OFF`), it leaves the process's max level and each
/// callsite's interest to the captures: it does not turn on the driver's TRACE spans.
fn keep_a_second_dispatcher_registered() {
    static KEPT: OnceLock<Dispatch> = OnceLock::new();
    KEPT.get_or_init(|| Dispatch::new(tracing_subscriber::registry().with(LevelFilter::OFF)));
}

/// The race the capture is built against: another thread reaches a callsite first, while the
/// capture is the only subscriber anywhere (certain when no other test's capture is live). It
/// failed with a plain `set_default`: the event on the capturing thread was never built.
#[test]
fn a_warning_whose_callsite_another_thread_reached_first_is_captured() {
    fn warn_from(thread: &str) {
        tracing::warn!("a warning from {thread}");
    }
    let captured = Captured::default();
    let _guard = captured.warnings();
    std::thread::spawn(|| warn_from("the other thread"))
        .join()
        .unwrap();
    warn_from("the capturing thread");
    let text = captured.text();
    assert!(
        text.contains("a warning from the capturing thread"),
        "{text:?}"
    );
    assert!(!text.contains("the other thread"), "{text:?}");
}
