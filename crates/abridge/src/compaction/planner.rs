//! The pure half of deciding: boundary math and the threshold test.

/// The compaction boundary for a turn: every turn before it, less the
/// `keep_last` most recent ones. None when there is nothing before it to
/// compact (turn 0, or fewer earlier turns than `keep_last + 1`).
///
/// Fixed for the whole turn, so a turn compacts at most once; never inside a
/// turn, so a tool call and its result are never split.
pub fn boundary(turn_idx: i64, keep_last: u32) -> Option<i64> {
    let b = turn_idx - 1 - keep_last as i64;
    (b >= 0).then_some(b)
}

/// True when the measured context has reached the threshold.
/// No measure yet (a session's first step) never compacts.
pub fn should_compact(measure: Option<i64>, threshold_tokens: u64) -> bool {
    measure.is_some_and(|m| m >= 0 && m as u64 >= threshold_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turn_zero_is_never_compacted() {
        assert_eq!(boundary(0, 0), None);
    }

    #[test]
    fn boundary_is_every_earlier_turn_less_keep_last() {
        assert_eq!(boundary(1, 0), Some(0));
        assert_eq!(boundary(10, 0), Some(9));
        assert_eq!(boundary(10, 3), Some(6));
        assert_eq!(boundary(3, 3), None);
        assert_eq!(boundary(4, 3), Some(0));
    }

    #[test]
    fn threshold_is_inclusive_and_needs_a_measure() {
        assert!(!should_compact(None, 10));
        assert!(!should_compact(Some(9), 10));
        assert!(should_compact(Some(10), 10));
        assert!(should_compact(Some(11), 10));
    }
}
