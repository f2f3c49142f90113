//! A panic inside a polled future or a call, turned into an error value:
//! what a host's model client, summariser or tool does wrong ends as a failed
//! call under its retry policy, never as a panic of the host's task.

use std::panic::AssertUnwindSafe;

/// Polls a boxed future in the caller's task, turning a panic inside it into
/// an `Err` with the payload: what spawning a task for the call would give,
/// without handing it to another thread. Dropping it (a timeout) cancels the
/// call instead of leaving it running detached.
pub(crate) struct CatchUnwind<'a, T>(
    pub(crate) std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>,
);

impl<T> std::future::Future for CatchUnwind<'_, T> {
    type Output = std::thread::Result<T>;
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let fut = self.0.as_mut();
        match std::panic::catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Ok(std::task::Poll::Ready(v)) => std::task::Poll::Ready(Ok(v)),
            Err(p) => std::task::Poll::Ready(Err(p)),
        }
    }
}

pub(crate) fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic)".into()
    }
}
