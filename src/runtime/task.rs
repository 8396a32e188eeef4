//! Where the runtime's tasks are spawned, and the one thing that can hold them: a [`Pause`] a
//! simulation puts around a silo (`conformance::sim`). A task spawned from inside a paused
//! silo's scope joins its pause: while paused, none of the silo's code is polled — its timers
//! fire late, at the resume, and tokio's monotonic clock has moved on, as after a `SIGSTOP`.
//! Outside such a scope (every production host) `spawn` is `tokio::spawn`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use tokio::task::JoinHandle;

tokio::task_local! {
    static PAUSE: Pause;
}

/// A switch that stops and resumes every task of one simulated process.
#[derive(Clone, Debug, Default)]
pub(crate) struct Pause(Arc<PauseState>);

#[derive(Debug, Default)]
struct PauseState {
    paused: AtomicBool,
    /// The tasks that were due while paused, woken at the resume.
    parked: Mutex<Vec<Waker>>,
}

impl Pause {
    pub(crate) fn set(&self, paused: bool) {
        self.0.paused.store(paused, Ordering::SeqCst);
        if !paused {
            let parked =
                std::mem::take(&mut *self.0.parked.lock().unwrap_or_else(PoisonError::into_inner));
            parked.into_iter().for_each(Waker::wake);
        }
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.0.paused.load(Ordering::SeqCst)
    }

    /// Spawns `work` inside this pause's scope: it and every task it spawns through [`spawn`]
    /// stop while the pause is set.
    pub(crate) fn spawn<F>(&self, work: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        tokio::spawn(PAUSE.scope(
            self.clone(),
            Held {
                pause: self.clone(),
                work: Box::pin(work),
            },
        ))
    }
}

/// Spawns a task of the runtime: inside a [`Pause`]'s scope it shares that pause, elsewhere it is
/// plain `tokio::spawn`.
pub(crate) fn spawn<F>(work: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match PAUSE.try_with(Pause::clone) {
        Ok(pause) => pause.spawn(work),
        Err(_) => tokio::spawn(work),
    }
}

/// `work`, not polled while its pause is set (boxed: spawns are rare, and so no `unsafe` pin).
struct Held<F> {
    pause: Pause,
    work: Pin<Box<F>>,
}

impl<F: Future> Future for Held<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        if this.pause.is_paused() {
            let mut parked = this
                .pause
                .0
                .parked
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // Checked again under the lock: a resume in between would miss this waker.
            if this.pause.is_paused() {
                parked.push(cx.waker().clone());
                return Poll::Pending;
            }
        }
        this.work.as_mut().poll(cx)
    }
}
