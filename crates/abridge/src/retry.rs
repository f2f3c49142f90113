//! One retry policy for every retried call: the model's (per step) and the
//! summariser's (per compaction claim).
//!
//! The delay before retry `n` (the `n+1`-th attempt) is `initial_backoff`
//! doubled `n - 1` times, capped at `max_backoff`, then reduced by a random
//! fraction of at most `jitter` so that many hosts retrying one provider do not
//! do it in step. The doubling saturates: no attempt count overflows a
//! `Duration`.

use std::time::Duration;

/// How often and how patiently a failed call is tried again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all (the first call included); at least 1.
    pub max_attempts: u32,
    /// Delay before the second attempt.
    pub initial_backoff: Duration,
    /// Largest delay between two attempts, whatever their number.
    pub max_backoff: Duration,
    /// Fraction of each delay, from 0 to 1, that may be taken off at random.
    pub jitter: f64,
}

impl Default for RetryPolicy {
    /// 3 attempts, 500 ms doubling to at most 30 s, 20 % jitter.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            jitter: 0.2,
        }
    }
}

impl RetryPolicy {
    /// `max_attempts` attempts with no delay between them (tests, chaos runs).
    pub fn immediate(max_attempts: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts,
            initial_backoff: Duration::ZERO,
            max_backoff: Duration::ZERO,
            jitter: 0.0,
        }
    }

    /// Sets the number of attempts.
    pub fn with_max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// Sets the first delay and the cap.
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max;
        self
    }

    /// Sets the jitter fraction (0 to 1).
    pub fn with_jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// The longest delay before retry `retry` (1 for the second attempt):
    /// `initial_backoff · 2^(retry-1)`, saturating, capped at `max_backoff`.
    pub fn ceiling(&self, retry: u32) -> Duration {
        let doublings = retry.saturating_sub(1).min(63);
        let factor = 1u64 << doublings;
        let nanos = self
            .initial_backoff
            .as_nanos()
            .saturating_mul(u128::from(factor));
        let capped = nanos.min(self.max_backoff.as_nanos());
        Duration::from_nanos(u64::try_from(capped).unwrap_or(u64::MAX))
    }

    /// The delay before retry `retry`: [`ceiling`](Self::ceiling) less a
    /// random fraction of at most `jitter` of it.
    pub fn delay(&self, retry: u32) -> Duration {
        let ceiling = self.ceiling(retry);
        let jitter = if self.jitter.is_finite() {
            self.jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        if jitter == 0.0 || ceiling.is_zero() {
            return ceiling;
        }
        ceiling.mul_f64(1.0 - jitter * unit_random())
    }

    /// Checks the values; called when a runner is built.
    pub(crate) fn validate(&self, what: &str) -> crate::error::Result<()> {
        if self.max_attempts == 0 {
            return Err(crate::error::Error::Config(format!(
                "{what}: max_attempts must be at least 1"
            )));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(crate::error::Error::Config(format!(
                "{what}: jitter must be from 0 to 1, got {}",
                self.jitter
            )));
        }
        if self.initial_backoff > self.max_backoff {
            return Err(crate::error::Error::Config(format!(
                "{what}: initial_backoff ({:?}) is above max_backoff ({:?})",
                self.initial_backoff, self.max_backoff
            )));
        }
        Ok(())
    }
}

/// A uniform number in [0, 1) from the standard library's per-process random
/// hasher keys and a counter (no dependency; not for cryptography).
fn unit_random() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_doubles_and_stops_at_the_cap() {
        let p = RetryPolicy::default().with_jitter(0.0);
        let got: Vec<u64> = (1..=8).map(|r| p.delay(r).as_millis() as u64).collect();
        assert_eq!(got, [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
    }

    #[test]
    fn no_attempt_count_overflows() {
        let p = RetryPolicy {
            max_attempts: u32::MAX,
            initial_backoff: Duration::from_secs(u64::MAX / 4),
            max_backoff: Duration::MAX,
            jitter: 1.0,
        };
        for retry in [1, 2, 63, 64, 65, 66, 1000, u32::MAX] {
            assert!(p.delay(retry) <= Duration::MAX);
        }
        assert_eq!(p.ceiling(u32::MAX), Duration::from_nanos(u64::MAX));
    }

    #[test]
    fn jitter_only_takes_off_at_most_its_fraction() {
        let p = RetryPolicy::default().with_jitter(0.5);
        for _ in 0..1000 {
            let d = p.delay(3);
            assert!(
                d <= Duration::from_secs(2) && d >= Duration::from_secs(1),
                "{d:?}"
            );
        }
        let spread: std::collections::BTreeSet<u128> =
            (0..100).map(|_| p.delay(3).as_micros()).collect();
        assert!(spread.len() > 50, "the delays are not spread: {spread:?}");
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(RetryPolicy::immediate(0).validate("x").is_err());
        assert!(RetryPolicy::default()
            .with_jitter(1.5)
            .validate("x")
            .is_err());
        assert!(RetryPolicy::default()
            .with_backoff(Duration::from_secs(2), Duration::from_secs(1))
            .validate("x")
            .is_err());
        assert!(RetryPolicy::default().validate("x").is_ok());
    }
}
