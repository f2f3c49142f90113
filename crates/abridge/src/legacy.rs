//! What older versions did, kept so their steps still rebuild byte for byte.
//!
//! Schema version 1 parsed stored responses with serde_json's default float
//! parser, which multiplies or divides the digits by a power of ten in `f64`
//! and can land one unit in the last place off. Those parsed values went into
//! the message bytes the steps hashed. This build parses exactly
//! (`float_roundtrip`), so to rebuild a version-1 step it redoes the old
//! parse: every stored float was written by serde_json (shortest round-trip
//! text), so parsing the exact value's text the old way gives what version 1
//! rendered.

use serde_json::{Number, Value};
use std::sync::OnceLock;

/// Replaces every float in `v` with what serde_json's default parser read
/// from its text. Integers are left alone (both parsers read them exactly).
pub(crate) fn lossy_floats(v: &mut Value) {
    // Iterative: a stored value is at most 128 levels deep, but nothing here
    // needs the call stack.
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::Number(n) if n.is_f64() => {
                let text = n.to_string();
                if let Some(f) = legacy_parse_f64(&text).and_then(Number::from_f64) {
                    *n = f;
                }
            }
            Value::Array(items) => stack.extend(items.iter_mut()),
            Value::Object(map) => stack.extend(map.values_mut()),
            _ => {}
        }
    }
}

fn pow10() -> &'static [f64; 309] {
    static POW10: OnceLock<[f64; 309]> = OnceLock::new();
    POW10.get_or_init(|| {
        // Rust parses these correctly rounded, as the literals 1e0..1e308 of
        // serde_json's table are.
        std::array::from_fn(|k| format!("1e{k}").parse().expect("a power of ten"))
    })
}

/// `a * 10 + b` would exceed `max`.
fn overflows(a: u64, b: u64, max: u64) -> bool {
    a >= max / 10 && (a > max / 10 || b > max % 10)
}

/// serde_json 1.x's number parser without `float_roundtrip`, for JSON number
/// text that is a float. None for text that is not a JSON number, or out of
/// range (serde_json refused those too).
pub(crate) fn legacy_parse_f64(text: &str) -> Option<f64> {
    let b = text.as_bytes();
    let mut i = 0;
    let positive = if b.first() == Some(&b'-') {
        i = 1;
        false
    } else {
        true
    };
    let digit = |i: usize| {
        b.get(i)
            .filter(|c| c.is_ascii_digit())
            .map(|c| (c - b'0') as u64)
    };
    let mut sig: u64 = 0;
    let mut exponent: i32 = 0;
    // Integer part: kept as u64 until it would overflow, then each further
    // digit only raises the exponent.
    match digit(i)? {
        0 => i += 1,
        _ => {
            while let Some(d) = digit(i) {
                if overflows(sig, d, u64::MAX) {
                    while digit(i).is_some() {
                        exponent += 1;
                        i += 1;
                    }
                    break;
                }
                sig = sig * 10 + d;
                i += 1;
            }
        }
    }
    // Fraction: digits join the significand until it would overflow; the
    // rest are ignored.
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while let Some(d) = digit(i) {
            if overflows(sig, d, u64::MAX) {
                while digit(i).is_some() {
                    i += 1;
                }
                break;
            }
            sig = sig * 10 + d;
            exponent -= 1;
            i += 1;
        }
        if i == start {
            return None;
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        let positive_exp = match b.get(i) {
            Some(b'+') => {
                i += 1;
                true
            }
            Some(b'-') => {
                i += 1;
                false
            }
            _ => true,
        };
        let mut exp: i32 = digit(i)? as i32;
        i += 1;
        while let Some(d) = digit(i) {
            let d = d as i32;
            if exp >= i32::MAX / 10 && (exp > i32::MAX / 10 || d > i32::MAX % 10) {
                if sig != 0 && positive_exp {
                    return None;
                }
                return Some(if positive { 0.0 } else { -0.0 });
            }
            exp = exp * 10 + d;
            i += 1;
        }
        exponent = if positive_exp {
            exponent.saturating_add(exp)
        } else {
            exponent.saturating_sub(exp)
        };
    }
    if i != b.len() {
        return None;
    }
    let mut f = sig as f64;
    loop {
        match pow10().get(exponent.unsigned_abs() as usize) {
            Some(&pow) => {
                if exponent >= 0 {
                    f *= pow;
                    if f.is_infinite() {
                        return None;
                    }
                } else {
                    f /= pow;
                }
                break;
            }
            None => {
                if f == 0.0 {
                    break;
                }
                if exponent >= 0 {
                    return None;
                }
                f /= 1e308;
                exponent += 308;
            }
        }
    }
    Some(if positive { f } else { -f })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_legacy_parser_reproduces_the_known_off_by_one_reads() {
        // Pairs observed with serde_json's default parser.
        for (text, read) in [
            ("1.0715660391465826e-75", "1.0715660391465825e-75"),
            ("-1.81996730402717e-179", "-1.8199673040271697e-179"),
            ("-1.603964615428183e+143", "-1.6039646154281832e+143"),
            ("1.5860846119992697e-265", "1.5860846119992694e-265"),
        ] {
            let f = legacy_parse_f64(text).unwrap();
            assert_eq!(serde_json::to_string(&f).unwrap(), read, "{text}");
        }
    }

    #[test]
    fn the_legacy_parser_agrees_on_ordinary_numbers() {
        for text in [
            "0.1",
            "0.30000000000000004",
            "1e300",
            "-0.0",
            "2.5",
            "123456.789",
            "1.7976931348623157e308",
        ] {
            let exact: f64 = text.parse().unwrap();
            assert_eq!(
                legacy_parse_f64(text).unwrap().to_bits(),
                exact.to_bits(),
                "{text}"
            );
        }
        assert_eq!(legacy_parse_f64("1e400"), None);
        assert_eq!(legacy_parse_f64("1."), None);
    }

    #[test]
    fn exact_parsing_round_trips_every_float_bit_for_bit() {
        // float_roundtrip is on: what the default parser got wrong reads back exactly.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let f = f64::from_bits(x);
            if !f.is_finite() {
                continue;
            }
            let text = serde_json::to_string(&f).unwrap();
            let back: f64 = serde_json::from_str(&text).unwrap();
            assert_eq!(back.to_bits(), f.to_bits(), "{text}");
        }
    }
}
