//! Recently encoded long fragments of text (issue 42). A prompt is cut at
//! its special tokens first and each piece of text between them is encoded
//! on its own, so a chat's system prompt and each message of its history is
//! a fragment of its own; a chat or an agent that resends them finds them
//! here instead of splitting and merging them again (the pre-tokenizer's
//! regexes are most of a long prompt's time before its first token once its
//! KV comes from the prefix cache). Encoding is a function of the fragment
//! alone, so a hit gives the ids encoding gives.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Fragments shorter than this are encoded every time (cheap, and many).
pub const MIN_FRAGMENT_BYTES: usize = 256;
/// The most the cache holds: the fragments' text and their ids.
pub const MAX_CACHE_BYTES: usize = 16 << 20;

#[derive(Default)]
pub struct FragmentCache {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    map: HashMap<Box<str>, Entry>,
    clock: u64,
    bytes: usize,
}

struct Entry {
    ids: Arc<[u32]>,
    used: u64,
}

fn entry_bytes(text: &str, ids: &[u32]) -> usize {
    text.len() + 4 * ids.len()
}

impl FragmentCache {
    /// The ids of `text`, when it was encoded lately.
    pub fn get(&self, text: &str) -> Option<Arc<[u32]>> {
        if text.len() < MIN_FRAGMENT_BYTES {
            return None;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.clock += 1;
        let now = inner.clock;
        let e = inner.map.get_mut(text)?;
        e.used = now;
        Some(e.ids.clone())
    }

    /// Keeps `ids` as `text`'s, evicting the least recently used fragments
    /// beyond the bound.
    pub fn put(&self, text: &str, ids: &Arc<[u32]>) {
        let size = entry_bytes(text, ids);
        if text.len() < MIN_FRAGMENT_BYTES || size > MAX_CACHE_BYTES / 4 {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.map.contains_key(text) {
            return;
        }
        while inner.bytes + size > MAX_CACHE_BYTES {
            let Some(oldest) = inner
                .map
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(e) = inner.map.remove(&oldest) {
                inner.bytes -= entry_bytes(&oldest, &e.ids);
            }
        }
        inner.clock += 1;
        let used = inner.clock;
        inner.bytes += size;
        inner.map.insert(
            text.into(),
            Entry {
                ids: ids.clone(),
                used,
            },
        );
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.inner.lock().unwrap().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_fragments_are_kept_short_ones_not() {
        let c = FragmentCache::default();
        let long = "a".repeat(MIN_FRAGMENT_BYTES);
        c.put("short", &Arc::from([1]));
        assert!(c.get("short").is_none());
        c.put(&long, &Arc::from([1, 2, 3]));
        assert_eq!(c.get(&long).as_deref(), Some(&[1, 2, 3][..]));
        assert_eq!(c.bytes(), long.len() + 12);
    }

    #[test]
    fn the_least_recently_used_go_first_past_the_bound() {
        let c = FragmentCache::default();
        // Each entry a little over a fifth of the bound: four fit.
        let ids: Arc<[u32]> = vec![0u32; MAX_CACHE_BYTES / 20].into();
        let texts: Vec<String> = (0..5)
            .map(|i| format!("{i}{}", "x".repeat(MIN_FRAGMENT_BYTES)))
            .collect();
        for t in &texts[..4] {
            c.put(t, &ids);
        }
        assert!(c.get(&texts[0]).is_some(), "0 is the newest now");
        c.put(&texts[4], &ids);
        assert!(c.get(&texts[1]).is_none(), "1 was the oldest");
        for t in [&texts[0], &texts[2], &texts[3], &texts[4]] {
            assert!(c.get(t).is_some());
        }
        assert!(c.bytes() <= MAX_CACHE_BYTES);
    }
}
