//! Cutting text for display and for caps: only between grapheme clusters
//! (what a reader sees as one character), never inside a UTF-8 sequence.

use unicode_segmentation::{GraphemeCursor, UnicodeSegmentation};

/// Byte offset of the end of the longest run of whole grapheme clusters (what
/// a reader sees as one character: a letter with its marks, a Devanagari
/// syllable's vowel sign, a flag, a ZWJ emoji sequence) from the start of `s`
/// that holds at most `n_chars` chars.
///
/// Found at the cut itself: the `n_chars`-th char boundary, moved back to the
/// cluster boundary at or before it (the text before the cut is not walked
/// cluster by cluster).
fn head_cut(s: &str, n_chars: usize) -> usize {
    let idx = s.char_indices().nth(n_chars).map_or(s.len(), |(i, _)| i);
    let mut cursor = GraphemeCursor::new(idx, s.len(), true);
    match cursor.is_boundary(s, 0) {
        Ok(true) => idx,
        Ok(false) => match cursor.prev_boundary(s, 0) {
            Ok(Some(b)) => b,
            Ok(None) => 0,
            Err(_) => head_cut_walking(s, n_chars),
        },
        Err(_) => head_cut_walking(s, n_chars),
    }
}

/// Byte offset of the start of the longest run of whole grapheme clusters at
/// the end of `s` that holds at most `n_chars` chars (found at the cut, as
/// [`head_cut`]).
pub(crate) fn tail_cut(s: &str, n_chars: usize) -> usize {
    let idx = if n_chars == 0 {
        s.len()
    } else {
        s.char_indices().nth_back(n_chars - 1).map_or(0, |(i, _)| i)
    };
    let mut cursor = GraphemeCursor::new(idx, s.len(), true);
    match cursor.is_boundary(s, 0) {
        Ok(true) => idx,
        Ok(false) => match cursor.next_boundary(s, 0) {
            Ok(Some(b)) => b,
            Ok(None) => s.len(),
            Err(_) => tail_cut_walking(s, n_chars),
        },
        Err(_) => tail_cut_walking(s, n_chars),
    }
}

/// [`head_cut`] by walking the clusters from the start (the reference the
/// fast path is tested against).
fn head_cut_walking(s: &str, n_chars: usize) -> usize {
    let (mut chars, mut end) = (0, 0);
    for (i, g) in s.grapheme_indices(true) {
        chars += g.chars().count();
        if chars > n_chars {
            break;
        }
        end = i + g.len();
    }
    end
}

/// [`tail_cut`] by walking the clusters from the end.
fn tail_cut_walking(s: &str, n_chars: usize) -> usize {
    let (mut chars, mut start) = (0, s.len());
    for (i, g) in s.grapheme_indices(true).rev() {
        chars += g.chars().count();
        if chars > n_chars {
            break;
        }
        start = i;
    }
    start
}

/// Caps `s` at `cap` chars: keeps 75% head and 25% tail with a marker between,
/// cutting only between grapheme clusters (never inside a UTF-8 sequence, nor
/// between a char and its marks or vowel signs, nor inside a flag or an emoji
/// sequence).
pub fn cap_block(s: &str, cap: usize) -> String {
    let total = s.chars().count();
    if total <= cap {
        return s.to_string();
    }
    let head_n = cap * 3 / 4;
    let tail_n = cap - head_n;
    let h = head_cut(s, head_n);
    let t = tail_cut(s, tail_n).max(h);
    let omitted = s[h..t].chars().count();
    format!("{}\n[… {omitted} chars omitted …]\n{}", &s[..h], &s[t..])
}

/// Cuts `s` to at most `max` chars (head only), between grapheme clusters.
pub fn truncate_chars(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    s[..head_cut(s, max)].to_string()
}

/// A duration in milliseconds as a person says it: `850 ms`, `12 s`,
/// `4 min`, `3 h 20 min`, `2 days 5 h`. Negative values read as 0.
pub fn human_duration_ms(ms: i64) -> String {
    let ms = ms.max(0);
    let s = ms / 1000;
    let (m, h, d) = (s / 60, s / 3600, s / 86_400);
    match () {
        _ if ms < 1000 => format!("{ms} ms"),
        _ if s < 60 => format!("{s} s"),
        _ if m < 60 => format!("{m} min"),
        _ if h < 24 => match m % 60 {
            0 => format!("{h} h"),
            rest => format!("{h} h {rest} min"),
        },
        _ => {
            let days = if d == 1 { "day" } else { "days" };
            match h % 24 {
                0 => format!("{d} {days}"),
                rest => format!("{d} {days} {rest} h"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations_read_as_a_person_says_them() {
        let got: Vec<String> = [
            -5,
            850,
            12_000,
            240_000,
            12_000_000,
            10_800_000,
            86_400_000,
            190_800_000,
        ]
        .into_iter()
        .map(human_duration_ms)
        .collect();
        assert_eq!(
            got,
            [
                "0 ms",
                "850 ms",
                "12 s",
                "4 min",
                "3 h 20 min",
                "3 h",
                "1 day",
                "2 days 5 h"
            ]
        );
    }

    use super::*;

    fn parts(capped: &str) -> (&str, &str) {
        let (h, rest) = capped.split_once("\n[… ").expect("marker");
        let (_, t) = rest.split_once(" chars omitted …]\n").expect("marker end");
        (h, t)
    }

    #[test]
    fn short_blocks_are_untouched() {
        assert_eq!(cap_block("héllo", 5), "héllo");
    }

    #[test]
    fn cap_keeps_three_quarters_head_one_quarter_tail() {
        let s: String = ('a'..='z').cycle().take(1000).collect();
        let c = cap_block(&s, 100);
        let (h, t) = parts(&c);
        assert_eq!((h.chars().count(), t.chars().count()), (75, 25));
        assert!(s.starts_with(h) && s.ends_with(t));
        assert!(c.contains("[… 900 chars omitted …]"));
    }

    #[test]
    fn cap_on_cjk_and_emoji_cuts_on_char_boundaries() {
        let s = "漢字🙂".repeat(500);
        for cap in [1, 2, 7, 100, 333] {
            let c = cap_block(&s, cap);
            let (h, t) = parts(&c);
            assert!(s.starts_with(h) && s.ends_with(t));
            assert!(h.chars().count() + t.chars().count() <= cap);
        }
    }

    #[test]
    fn cap_never_separates_combining_marks_or_joined_emoji() {
        // e + combining acute, repeated: a cut after an odd number of chars would
        // leave a bare accent; the cut moves back instead.
        let s = "e\u{301}".repeat(300);
        let c = cap_block(&s, 101);
        let (h, t) = parts(&c);
        assert!(h.ends_with('\u{301}'), "head ends on a whole grapheme");
        assert!(t.starts_with('e'), "tail starts on a base char");
        // A family emoji is one ZWJ sequence: never cut inside it.
        let fam = "👩\u{200D}👩\u{200D}👧".repeat(100);
        let c = cap_block(&fam, 50);
        let (h, t) = parts(&c);
        assert!(h.ends_with('👧') && t.starts_with('👩'), "{h:?} | {t:?}");
    }

    /// Regression: a Devanagari vowel sign or virama, and the second half of a
    /// flag, were cut from the char before them.
    #[test]
    fn cap_never_splits_devanagari_syllables_or_flags() {
        // न म स ् त े: 6 chars; the conjunct स्ते (with its virama and vowel
        // sign) is one cluster.
        let hindi = "नमस्ते".repeat(200);
        for cap in 1..40 {
            let c = cap_block(&hindi, cap);
            let (h, t) = parts(&c);
            assert!(
                !h.ends_with('\u{94D}') || h.is_empty(),
                "{cap}: head ends on a virama"
            );
            for bad in ['\u{947}', '\u{94D}'] {
                assert!(!t.starts_with(bad), "{cap}: tail starts on {bad:?}");
            }
            assert!(h.chars().count() + t.chars().count() <= cap);
            assert!(hindi.starts_with(h) && hindi.ends_with(t));
        }
        assert_eq!(truncate_chars("नमस्ते", 5), "नम");
        assert_eq!(truncate_chars("नमस्ते", 6), "नमस्ते");
        assert_eq!(truncate_chars("नमस्ते!", 6), "नमस्ते");
        let flags = "🇫🇷🇯🇵".repeat(50);
        for cap in 1..30 {
            let c = cap_block(&flags, cap);
            let (h, t) = parts(&c);
            assert_eq!(h.chars().count() % 2, 0, "{cap}: a flag cut in the head");
            assert_eq!(t.chars().count() % 2, 0, "{cap}: a flag cut in the tail");
        }
        assert_eq!(truncate_chars("🇫🇷🇯🇵", 3), "🇫🇷");
    }

    /// The cut found at the cut point equals the one found by walking every
    /// cluster, on mixed scripts and at every length.
    #[test]
    fn cutting_at_the_cut_point_equals_walking_the_clusters() {
        let texts = [
            "plain ascii text, with\r\nCRLF line ends\r\n".repeat(3),
            "नमस्ते दुनिया 🇫🇷🇯🇵 e\u{301}te\u{301} 👩\u{200D}👩\u{200D}👧 漢字 ".repeat(4),
            "\u{301}\u{301}leading marks, then 🏳️‍🌈 and 👍🏽".to_string(),
            String::new(),
        ];
        for t in &texts {
            let n = t.chars().count();
            for k in 0..=n + 1 {
                assert_eq!(head_cut(t, k), head_cut_walking(t, k), "head {k} of {t:?}");
                assert_eq!(tail_cut(t, k), tail_cut_walking(t, k), "tail {k} of {t:?}");
            }
        }
    }

    #[test]
    fn truncate_is_a_char_prefix() {
        let s = "a🙂b漢c";
        assert_eq!(truncate_chars(s, 2), "a🙂");
        assert_eq!(truncate_chars(s, 10), s);
        assert_eq!(truncate_chars("e\u{301}e\u{301}", 3), "e\u{301}");
    }
}
