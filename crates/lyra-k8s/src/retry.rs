//! Error classes and the per-object retry schedule.

use std::time::Duration;

/// Whether trying again can help without anyone changing anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// A provider failure, a lease held by someone else, the store or the API server being
    /// unavailable: retried with exponential backoff.
    Retryable,
    /// Bad input (unknown workflow, invalid workflow, wrong data): the object is `Stalled`
    /// and left alone until its spec (or the reconcile-request annotation) changes.
    Terminal,
}

/// Exponential backoff with full jitter on the upper half: attempt `n` (1-based) waits
/// between half and all of `min(base * 2^(n-1), max)`, so replicas of a failure spread out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_secs(2),
            max: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// The ceiling of attempt `n`'s delay, before jitter.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(30);
        self.base.saturating_mul(1 << exp).min(self.max)
    }

    /// The delay before retry `attempt`, jittered with `unit` in `[0, 1)`.
    pub fn delay_with(&self, attempt: u32, unit: f64) -> Duration {
        let ceiling = self.ceiling(attempt);
        let half = ceiling / 2;
        half + (ceiling - half).mul_f64(unit.clamp(0.0, 1.0))
    }

    pub fn delay(&self, attempt: u32) -> Duration {
        self.delay_with(attempt, rand::random::<f64>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_exponentially_up_to_the_cap() {
        let b = Backoff {
            base: Duration::from_secs(1),
            max: Duration::from_secs(60),
        };
        let ceilings: Vec<u64> = (1..=8).map(|n| b.ceiling(n).as_secs()).collect();
        assert_eq!(ceilings, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(b.ceiling(u32::MAX), Duration::from_secs(60));
    }

    #[test]
    fn jitter_stays_in_the_upper_half() {
        let b = Backoff::default();
        for n in 1..10 {
            let c = b.ceiling(n);
            assert_eq!(b.delay_with(n, 0.0), c / 2);
            assert_eq!(b.delay_with(n, 1.0), c);
            let d = b.delay(n);
            assert!(d >= c / 2 && d <= c, "{d:?} vs {c:?}");
        }
    }
}
