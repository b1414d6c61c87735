//! Stop sequences (M0-W-1422): ends generation when the decoded output
//! contains one of the job's stop strings.
//!
//! Matching is on decoded text, so a stop string may span several tokens.
//! The matcher sees the output piece by piece and decides, for each piece,
//! what is safe to stream now:
//!
//! - as soon as a stop string occurs in the unsent text, generation ends; the
//!   text before it is released, the stop string and anything after it (in
//!   the same piece too) is never emitted. Among the matches present at that
//!   moment the earliest start wins, ties to the longest stop string;
//! - otherwise only the longest suffix of the unsent text that is a proper
//!   prefix of some stop string is held back (never more), everything before
//!   it is emitted. A false start is released as soon as it stops matching.
//!
//! Held-back text always starts on a `char` boundary, so a UTF-8 character is
//! never split between emits.

/// Streaming stop-string matcher for one job.
#[derive(Debug)]
pub struct StopMatcher {
    /// Non-empty stop strings.
    stops: Vec<String>,
    /// Decoded text received but not yet emitted.
    unsent: String,
    /// Set once a stop string matched; nothing is emitted afterwards.
    stopped: bool,
}

/// What the caller may do after a [`StopMatcher::push`].
#[derive(Debug, PartialEq)]
pub enum StopOutcome {
    /// Text that is safe to send now (may be "").
    Emit(String),
    /// A stop string matched: `emit` is the text before it that was not yet
    /// sent; generation must end.
    Stopped { emit: String, stop: String },
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub fn new(mut stops: Vec<String>) -> Self {
        stops.retain(|s| !s.is_empty());
        StopMatcher {
            stops,
            unsent: String::new(),
            stopped: false,
        }
    }

    /// Takes the next piece of decoded output. After a `Stopped` outcome the
    /// matcher is done: further pushes return `Emit("")`.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        if self.stopped {
            return StopOutcome::Emit(String::new());
        }
        if self.stops.is_empty() {
            return StopOutcome::Emit(text.to_owned());
        }
        self.unsent.push_str(text);
        if let Some((at, stop)) = self.earliest_match() {
            let stop = stop.to_owned();
            self.stopped = true;
            let mut emit = std::mem::take(&mut self.unsent);
            emit.truncate(at);
            return StopOutcome::Stopped { emit, stop };
        }
        let hold = self.held_back_len();
        let emit: String = self.unsent.drain(..self.unsent.len() - hold).collect();
        StopOutcome::Emit(emit)
    }

    /// Generation ended for another reason: releases the held-back text.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.unsent)
    }

    /// Byte offset and stop string of the match that starts first in the
    /// unsent text (ties: the longest stop string).
    ///
    /// Searching the unsent text is enough: what was emitted earlier cannot
    /// be part of a match, since any suffix of it that begins a stop string
    /// was held back.
    fn earliest_match(&self) -> Option<(usize, &str)> {
        self.stops
            .iter()
            .filter_map(|s| self.unsent.find(s.as_str()).map(|at| (at, s.as_str())))
            .min_by(|a, b| a.0.cmp(&b.0).then(b.1.len().cmp(&a.1.len())))
    }

    /// Length of the longest suffix of the unsent text, starting on a char
    /// boundary, that is a proper prefix of some stop string.
    fn held_back_len(&self) -> usize {
        let text = &self.unsent;
        let longest_prefix = self.stops.iter().map(|s| s.len() - 1).max().unwrap_or(0);
        let first = text.len().saturating_sub(longest_prefix);
        (first..text.len())
            .filter(|&i| text.is_char_boundary(i))
            .find(|&i| self.begins_a_stop(&text[i..]))
            .map_or(0, |i| text.len() - i)
    }

    /// Whether `tail` is a proper prefix of some stop string.
    fn begins_a_stop(&self, tail: &str) -> bool {
        self.stops
            .iter()
            .any(|s| s.len() > tail.len() && s.starts_with(tail))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use StopOutcome::{Emit, Stopped};

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(stops.iter().map(|s| s.to_string()).collect())
    }

    fn emit(s: &str) -> StopOutcome {
        Emit(s.to_string())
    }

    fn stopped(emit: &str, stop: &str) -> StopOutcome {
        Stopped {
            emit: emit.to_string(),
            stop: stop.to_string(),
        }
    }

    /// Feeds `pieces`, returns everything the client would see and whether
    /// a stop matched (finish() is called when none did).
    fn stream(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = matcher(stops);
        let mut out = String::new();
        for piece in pieces {
            match m.push(piece) {
                Emit(e) => out.push_str(&e),
                Stopped { emit, .. } => {
                    out.push_str(&emit);
                    return (out, true);
                }
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn no_stops_passes_everything_through() {
        let mut m = matcher(&[]);
        assert_eq!(m.push("Hello"), emit("Hello"));
        assert_eq!(m.push(", wor"), emit(", wor"));
        assert_eq!(m.finish(), "");
        // Empty stop strings are ignored.
        let mut m = matcher(&["", ""]);
        assert_eq!(m.push("abc"), emit("abc"));
    }

    #[test]
    fn stop_inside_one_piece_drops_the_rest() {
        let mut m = matcher(&["STOP"]);
        assert_eq!(m.push("one "), emit("one "));
        assert_eq!(m.push("two STOP three"), stopped("two ", "STOP"));
        assert_eq!(m.push("more"), emit(""));
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn stop_spanning_three_pieces() {
        let mut m = matcher(&["<|end|>"]);
        assert_eq!(m.push("Answer: 42<|"), emit("Answer: 42"));
        assert_eq!(m.push("en"), emit(""));
        assert_eq!(m.push("d|> trailing"), stopped("", "<|end|>"));
    }

    #[test]
    fn false_start_is_released() {
        let mut m = matcher(&["Hello"]);
        assert_eq!(m.push("Hel"), emit(""));
        assert_eq!(m.push("p"), emit("Help"));
        // Only the part that can still begin the stop is held.
        assert_eq!(m.push(" HelHe"), emit(" Hel"));
        assert_eq!(m.push("llo"), stopped("", "Hello"));
    }

    #[test]
    fn holds_back_only_the_longest_possible_prefix() {
        let mut m = matcher(&["abcd", "cx"]);
        // "abc" begins "abcd"; "c" alone would begin "cx": keep the longer.
        assert_eq!(m.push("zzabc"), emit("zz"));
        // "abcy": no suffix begins a stop any more.
        assert_eq!(m.push("y"), emit("abcy"));
        assert_eq!(m.push("ab"), emit(""));
        assert_eq!(m.push("c"), emit(""));
        assert_eq!(m.push("x"), stopped("ab", "cx"));
    }

    #[test]
    fn overlapping_stops_earliest_start_wins() {
        let mut m = matcher(&["bcd", "abc"]);
        assert_eq!(m.push("xabcd"), stopped("x", "abc"));
        let mut m = matcher(&["cd", "abcd"]);
        assert_eq!(m.push("zabcd!"), stopped("z", "abcd"));
        // Same start: the longest stop string.
        let mut m = matcher(&["ab", "abc"]);
        assert_eq!(m.push("_abc_"), stopped("_", "abc"));
        // A stop that overlaps itself: "aaab" with stop "aab".
        let mut m = matcher(&["aab"]);
        assert_eq!(m.push("a"), emit(""));
        assert_eq!(m.push("a"), emit(""));
        assert_eq!(m.push("a"), emit("a"));
        assert_eq!(m.push("b"), stopped("", "aab"));
    }

    #[test]
    fn multibyte_text_around_the_stop() {
        let mut m = matcher(&["終わり"]);
        assert_eq!(m.push("今日は終"), emit("今日は"));
        assert_eq!(m.push("わ"), emit(""));
        assert_eq!(m.push("り。次"), stopped("", "終わり"));

        let mut m = matcher(&["🛑stop"]);
        assert_eq!(m.push("é🛑"), emit("é"));
        assert_eq!(m.push("st"), emit(""));
        assert_eq!(m.push("ay ñ"), emit("🛑stay ñ"));
    }

    #[test]
    fn never_holds_part_of_a_char() {
        // "ã" (C3 A3) and "é" (C3 A9) share their first byte: nothing to hold.
        let mut m = matcher(&["é!"]);
        assert_eq!(m.push("ã"), emit("ã"));
        assert_eq!(m.push("é"), emit(""));
        assert_eq!(m.push("ü"), emit("éü"));
    }

    #[test]
    fn finish_releases_held_text() {
        let mut m = matcher(&["Hello", "###"]);
        assert_eq!(m.push("Say He"), emit("Say "));
        assert_eq!(m.finish(), "He");
        assert_eq!(m.finish(), "");
        let mut m = matcher(&["###"]);
        assert_eq!(m.push("x ##"), emit("x "));
        assert_eq!(m.finish(), "##");
    }

    /// Every split of the text at char boundaries into up to three pieces
    /// gives the same visible output: the text up to the stop.
    #[test]
    fn output_does_not_depend_on_piece_boundaries() {
        let cases: [(&str, &[&str], &str, bool); 4] = [
            ("ab<stop>cd", &["<stop>"], "ab", true),
            ("日本語<終>です", &["<終>", "xyz"], "日本語", true),
            ("<sto<st<stop", &["<stop>"], "<sto<st<stop", false),
            ("aaab aab", &["aab"], "a", true),
        ];
        for (text, stops, expected, hit) in cases {
            let cuts: Vec<usize> = (0..=text.len())
                .filter(|&i| text.is_char_boundary(i))
                .collect();
            for &i in &cuts {
                for &j in cuts.iter().filter(|&&j| j >= i) {
                    let pieces = [&text[..i], &text[i..j], &text[j..]];
                    assert_eq!(
                        stream(stops, &pieces),
                        (expected.to_string(), hit),
                        "{pieces:?}"
                    );
                }
            }
        }
    }

    /// After each push, exactly the longest suffix that begins a stop is
    /// unsent (checked by brute force over all suffixes).
    #[test]
    fn unsent_text_is_minimal() {
        let stops = ["<|im_end|>", "\n\nUser:"];
        let text = "Hi <|im the\n\nUse <|im_end";
        let mut m = matcher(&stops);
        let (mut pushed, mut sent) = (String::new(), String::new());
        for ch in text.chars() {
            pushed.push(ch);
            match m.push(&ch.to_string()) {
                Emit(e) => sent.push_str(&e),
                Stopped { .. } => panic!("no stop in {text:?}"),
            }
            let expected = (0..=pushed.len())
                .filter(|&i| pushed.is_char_boundary(i))
                .map(|i| &pushed[i..])
                .find(|tail| {
                    stops
                        .iter()
                        .any(|s| s.len() > tail.len() && s.starts_with(tail))
                })
                .unwrap_or("");
            assert_eq!(format!("{sent}{expected}"), pushed);
        }
        assert_eq!(m.finish(), "<|im_end");
    }
}
