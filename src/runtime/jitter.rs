//! The runtime's randomness (heartbeat and cleanup jitter, retry backoff): the thread's generator,
//! unless a simulation seeded this thread's (`conformance::sim`), which then fixes every random
//! choice of the silos it runs, and so, with tokio's paused time on one thread, their history.

use std::cell::RefCell;
use std::ops::RangeInclusive;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

thread_local! {
    static SEEDED: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// Seeds this thread's runtime randomness (`None`: back to the thread's own generator).
pub(crate) fn seed_thread(seed: Option<u64>) {
    SEEDED.with(|s| *s.borrow_mut() = seed.map(StdRng::seed_from_u64));
}

/// A uniform value in `[0, 1)`.
pub(crate) fn unit() -> f64 {
    with_rng(|r| r.random::<f64>())
}

/// A uniform value in `range`.
pub(crate) fn between(range: RangeInclusive<u64>) -> u64 {
    with_rng(|r| r.random_range(range))
}

fn with_rng<T>(f: impl FnOnce(&mut dyn rand::RngCore) -> T) -> T {
    SEEDED.with(|s| match s.borrow_mut().as_mut() {
        Some(rng) => f(rng),
        None => f(&mut rand::rng()),
    })
}
