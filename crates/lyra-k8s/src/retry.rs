//! Error classes and the per-object retry schedule.

use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBuilder};

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

/// Exponential backoff with jitter on the upper half: attempt `n` (1-based) waits between
/// half and all of `min(base * 2^(n-1), max)`, so replicas of a failure spread out. The
/// schedule is `backon`'s: it doubles from `base / 2` up to `max / 2`, and its jitter adds up
/// to as much again.
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
    fn schedule(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(self.base / 2)
            .with_max_delay(self.max / 2)
            .with_factor(2.0)
            .without_max_times()
    }

    /// The `attempt`th (1-based) delay of `builder`'s schedule. Past 30 doublings every
    /// schedule is at its cap.
    fn nth(builder: ExponentialBuilder, attempt: u32) -> Duration {
        let n = attempt.saturating_sub(1).min(30) as usize;
        builder.build().nth(n).unwrap_or_default()
    }

    /// The ceiling of attempt `n`'s delay, before jitter.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        Self::nth(self.schedule(), attempt) * 2
    }

    /// The delay before retry `attempt`: between half and all of its ceiling.
    pub fn delay(&self, attempt: u32) -> Duration {
        Self::nth(self.schedule().with_jitter(), attempt)
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
        for n in 1..12 {
            let c = b.ceiling(n);
            let delays: Vec<Duration> = (0..50).map(|_| b.delay(n)).collect();
            assert!(delays.iter().all(|d| *d >= c / 2 && *d <= c), "{delays:?} vs {c:?}");
            // Jittered: fifty draws are not all the same.
            assert!(delays.iter().any(|d| *d != delays[0]), "{delays:?}");
        }
        assert_eq!(b.ceiling(1), Duration::from_secs(2));
        assert_eq!(b.ceiling(100), Duration::from_secs(300));
    }
}
