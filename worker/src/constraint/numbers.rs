//! JSON numbers a client can read (issue 43). llguidance's JSON grammar
//! takes every number RFC 8259's grammar does, `1e877` and 400-digit
//! integers included, which most parsers refuse or read as infinity
//! (serde_json and Go: out of range; Python and JavaScript: infinity). A
//! JSON Schema job's output is followed byte by byte here, and where a
//! number is being written, tokens that would give it more than
//! [`MAX_INT_DIGITS`] digits before its point or more than
//! [`MAX_EXP_DIGITS`] exponent digits are masked off, so every number is
//! finite as an IEEE double (below 1e299 in magnitude). Seen on the 0.5B
//! synthetic file: 11 of 176 complete outputs held numbers such as
//! `-9707E907699`. Regex and Lark grammars describe their own text and are
//! left alone.

use std::sync::Arc;

use llguidance::toktrie::TokEnv;

/// Most digits of a number's integer part.
pub const MAX_INT_DIGITS: u16 = 200;
/// Most digits of a number's exponent (`e-99` to `e99`).
pub const MAX_EXP_DIGITS: u16 = 2;

/// Where the output is, lexically, as JSON.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Lex {
    #[default]
    Outside,
    InString,
    /// After a backslash in a string.
    Escape,
    /// A number's integer part, with its digits so far (0 after a `-`).
    Int(u16),
    Fraction,
    /// After `e` or `E`.
    ExpSign,
    /// An exponent's digits so far.
    Exp(u16),
}

impl Lex {
    /// The state after byte `b`; `None` where a number would outgrow its limits.
    fn step(self, b: u8) -> Option<Lex> {
        let digit = b.is_ascii_digit();
        Some(match self {
            Lex::Outside => match b {
                b'"' => Lex::InString,
                b'-' => Lex::Int(0),
                _ if digit => Lex::Int(1),
                _ => Lex::Outside,
            },
            Lex::InString => match b {
                b'\\' => Lex::Escape,
                b'"' => Lex::Outside,
                _ => Lex::InString,
            },
            Lex::Escape => Lex::InString,
            Lex::Int(n) if digit => Lex::Int(within(n + 1, MAX_INT_DIGITS)?),
            Lex::Int(_) if b == b'.' => Lex::Fraction,
            Lex::Fraction if digit => Lex::Fraction,
            Lex::Int(_) | Lex::Fraction if b == b'e' || b == b'E' => Lex::ExpSign,
            Lex::ExpSign if b == b'+' || b == b'-' => Lex::Exp(0),
            Lex::ExpSign | Lex::Exp(_) if digit => {
                let n = if let Lex::Exp(n) = self { n } else { 0 };
                Lex::Exp(within(n + 1, MAX_EXP_DIGITS)?)
            }
            // The number ended: the byte is read as outside one.
            _ => return Lex::Outside.step(b),
        })
    }

    fn in_string(self) -> bool {
        matches!(self, Lex::InString | Lex::Escape)
    }
}

fn within(n: u16, most: u16) -> Option<u16> {
    (n <= most).then_some(n)
}

/// Which tokens can start or extend a number (their first byte a digit,
/// `-`, `+`, `.`, `e` or `E`), over the compiler's token environment, whose
/// trie holds every token's bytes; one per compiler, shared by its JSON
/// Schema grammars.
pub struct NumberTokens {
    env: TokEnv,
    /// Bit `id % 32` of word `id / 32`: token `id` is numeric.
    numeric: Vec<u32>,
}

impl NumberTokens {
    pub fn new(env: TokEnv) -> Self {
        let trie = env.tok_trie();
        let n_vocab = trie.vocab_size();
        let mut numeric = vec![0u32; n_vocab.div_ceil(32)];
        for id in 0..n_vocab as u32 {
            if matches!(
                trie.token(id).first(),
                Some(b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
            ) {
                numeric[id as usize / 32] |= 1 << (id % 32);
            }
        }
        NumberTokens { env, numeric }
    }

    fn word(&self, id: u32) -> &[u8] {
        self.env.tok_trie().token(id)
    }
}

/// One job's place in its JSON output.
#[derive(Clone)]
pub struct NumberGuard {
    tokens: Arc<NumberTokens>,
    lex: Lex,
}

impl NumberGuard {
    pub fn new(tokens: Arc<NumberTokens>) -> Self {
        NumberGuard {
            tokens,
            lex: Lex::Outside,
        }
    }

    /// Follows a chosen token. A token past the limits cannot have been
    /// chosen (its bit was clear); should one come, the count stays where
    /// it was.
    pub fn follow(&mut self, id: u32) {
        for &b in self.tokens.word(id) {
            self.lex = self.lex.step(b).unwrap_or(self.lex);
        }
    }

    /// Clears in `bits` every token that would take the number being
    /// written (or one it starts) past the limits.
    pub fn narrow(&self, bits: &mut [u32]) {
        if self.lex.in_string() {
            return;
        }
        for (w, (allowed, numeric)) in bits.iter_mut().zip(&self.tokens.numeric).enumerate() {
            let mut candidates = *allowed & numeric;
            while candidates != 0 {
                let bit = candidates.trailing_zeros();
                candidates &= candidates - 1;
                if !self.fits(self.tokens.word((w * 32) as u32 + bit)) {
                    *allowed &= !(1 << bit);
                }
            }
        }
    }

    fn fits(&self, word: &[u8]) -> bool {
        let mut lex = self.lex;
        for &b in word {
            match lex.step(b) {
                Some(next) => lex = next,
                None => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lex_of(text: &str) -> Option<Lex> {
        text.bytes().try_fold(Lex::Outside, Lex::step)
    }

    #[test]
    fn numbers_are_followed_through_strings_and_literals() {
        assert_eq!(lex_of(r#"{"a": -12"#), Some(Lex::Int(2)));
        assert_eq!(lex_of(r#"{"a": 1.5e+3"#), Some(Lex::Exp(1)));
        assert_eq!(lex_of(r#"{"a": 1E"#), Some(Lex::ExpSign));
        assert_eq!(
            lex_of(r#"{"e1": "12\"3e999", "b": true"#),
            Some(Lex::Outside)
        );
        assert_eq!(lex_of(r#"["x\\", 7"#), Some(Lex::Int(1)));
        assert_eq!(lex_of("[1e99, 2e-05, 0.125]"), Some(Lex::Outside));
        assert_eq!(lex_of("1e100"), None);
        assert_eq!(lex_of(&"9".repeat(200)), Some(Lex::Int(200)));
        assert_eq!(lex_of(&"9".repeat(201)), None);
        // A fraction's digits are not limited.
        assert!(lex_of(&format!("0.{}", "1".repeat(400))).is_some());
    }

    #[test]
    fn tokens_past_the_limits_are_masked_where_a_number_is_written() {
        use llguidance::toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie};
        let vocab = ["1", "23", "e", "e9", "\"", ", ", "999", "-"];
        let words: Vec<Vec<u8>> = vocab.iter().map(|w| w.as_bytes().to_vec()).collect();
        let info = TokRxInfo::new(vocab.len() as u32, 0);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)));
        let tokens = Arc::new(NumberTokens::new(env));
        let mut g = NumberGuard::new(tokens);
        let allowed = |g: &NumberGuard| {
            let mut bits = vec![u32::MAX >> (32 - vocab.len())];
            g.narrow(&mut bits);
            (0..vocab.len())
                .filter(|&i| bits[0] & (1 << i) != 0)
                .map(|i| vocab[i])
                .collect::<Vec<_>>()
        };
        assert_eq!(allowed(&g), vocab, "outside a number, anything");
        for id in [0, 2, 0] {
            g.follow(id); // "1e1"
        }
        assert_eq!(allowed(&g), ["1", "e", "e9", "\"", ", ", "-"]);
        g.follow(0); // "1e11": two exponent digits
        assert_eq!(allowed(&g), ["e", "e9", "\"", ", ", "-"]);
        g.follow(5); // ", "
        assert_eq!(allowed(&g), vocab);
        g.follow(4); // in a string, anything
        g.follow(6);
        assert_eq!(allowed(&g), vocab);
    }
}
