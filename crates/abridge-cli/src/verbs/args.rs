//! Value parsers of the verbs' numeric arguments: one clear message each.

/// A count that must be at least 1 (`--turns`, `--sessions`, `--workers`).
pub fn at_least_one(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("expected a whole number of at least 1".to_string()),
    }
}

/// A count or duration that may be 0 but not negative.
pub fn whole(s: &str) -> Result<u64, String> {
    s.trim()
        .parse::<u64>()
        .map_err(|_| "expected a whole number (0 or more)".into())
}

/// [`whole`], as a `u32`.
pub fn whole_u32(s: &str) -> Result<u32, String> {
    whole(s)?
        .try_into()
        .map_err(|_| "expected a whole number below 2^32".into())
}

/// A row id (`--step`): at least 1.
pub fn row_id(s: &str) -> Result<i64, String> {
    match s.trim().parse::<i64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("expected a row id (a whole number of at least 1)".into()),
    }
}

/// A probability in [0, 1].
pub fn probability(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err("expected a number from 0 to 1".into()),
    }
}
