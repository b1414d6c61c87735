//! The prefix cache (issue 42): the KV of prompts' chunks kept after their
//! sequences end, so that a prompt that starts with the same tokens as an
//! earlier one takes those positions' KV instead of computing them again.
//!
//! **What makes reuse exact.** A prompt is prefilled in chunks of the
//! backend's `prefill_chunk` C, each starting at a multiple of C (the engine
//! cuts it so, cached or not). A chunk's KV depends only on its tokens, the KV
//! before it and the chunk's length (the products' kernels and sums are
//! picked by the number of rows), so the cache keeps only *whole* chunks that
//! were computed as one `forward` of C tokens at a multiple of C, after
//! positions that were all themselves such chunks (a sequence's [`Trail`]).
//! A later prompt then attaches the cached chunks that match its first
//! tokens, whole, and computes the rest in the same chunks it would have
//! computed without the cache: its tokens and log-probabilities are the same
//! bits, cached or not. The price is granularity: reuse comes in steps of C
//! tokens, and the KV of generated tokens (made one token at a time by
//! decode's kernels) is never reused; the prompt of the next turn of a chat
//! computes them again.
//!
//! **The same prompt again.** A prompt's last chunk (whole or not) is kept
//! too, with the logits of its last position: a later prompt that is the
//! same tokens, whole, attaches every position and those logits, and
//! computes nothing before its first token. Any other prompt leaves at least
//! its last token to compute, so a partial last chunk serves only its own
//! prompt.
//!
//! **What a cache entry is.** An entry is one chunk's KV, copied out of the
//! sequence that computed it into storage of the backend's (the GPU's:
//! blocks of the paged KV pool; the CPU's: host memory) and copied into a
//! new sequence's own cache when attached. Entries form a tree: an entry is
//! found by its parent (the chunk before it, or the root) and its C tokens,
//! compared whole, so two prompts share an entry only when every token up
//! to its end is the same (no hash stands in for the tokens). The cache
//! lives and dies with the backend, so it never meets another model or
//! other context settings.
//!
//! **Eviction.** Nothing holds an entry after the copy that attaches it
//! (queued before any later work of the device), so every entry may go: the
//! least recently used entry without children first, when the cache would
//! pass its bound, or when a sequence needs the room.

use std::collections::HashMap;

use crate::backend::BackendError;

/// An entry of a [`PrefixCache`]: its slot and the generation of the entry
/// in it, so that an id kept after its entry was evicted finds nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EntryId {
    slot: u32,
    generation: u32,
}

/// Where a sequence stands with the cache: whether every position so far
/// came from whole chunks (attached or computed), and the entry of the last
/// of them, the parent of the next one the sequence may publish.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Trail {
    /// Positions so far are whole chunks only: the next whole chunk may be
    /// published. False once a partial chunk or a decoded token was added.
    broken: bool,
    /// The entry of the sequence's last chunk (`None`: at the root, or the
    /// last chunk is not in the cache).
    last: Option<EntryId>,
    /// Whole chunks so far.
    chunks: usize,
    /// The prompt's length, told when the sequence was attached (0: not
    /// told): the chunk that ends there is kept with its last logits.
    prompt_len: usize,
}

impl Trail {
    /// A new sequence's trail: at the root.
    pub fn new() -> Self {
        Trail::default()
    }
}

/// The cache's counters, for `/metrics` and `/health`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PrefixStats {
    /// Tokens per entry (the backend's prefill chunk).
    pub chunk_tokens: usize,
    /// Entries held now.
    pub entries: usize,
    /// Bytes their storage takes (on the GPU, whole blocks of the pool).
    pub bytes: u64,
    /// Host bytes of the prompts' last logits kept with their last chunks
    /// (within `max_bytes` too).
    pub logits_bytes: u64,
    /// The most bytes the cache may take.
    pub max_bytes: u64,
    /// Entries evicted since start.
    pub evictions: u64,
}

struct Entry<E> {
    generation: u32,
    parent: Option<EntryId>,
    tokens: Box<[u32]>,
    children: u32,
    /// The cache's clock when the entry was last attached or published.
    used: u64,
    storage: E,
    /// The logits of its last position, when it was a prompt's last chunk.
    logits: Option<Box<[f32]>>,
}

/// What [`PrefixCache::attach`] attached to a sequence.
pub struct Attached {
    pub trail: Trail,
    /// Positions the sequence now holds.
    pub len: usize,
    /// The prompt's last logits, when every position of it was attached.
    pub logits: Option<Box<[f32]>>,
}

/// Chunks' KV, found by their tokens and the chunks before them. `E` is the
/// backend's storage of one chunk.
pub struct PrefixCache<E> {
    chunk: usize,
    /// Bytes one entry's storage takes (each holds room for a whole chunk).
    entry_bytes: u64,
    /// Logits a kept last position has.
    vocab: usize,
    /// Entries holding logits.
    with_logits: usize,
    max_bytes: u64,
    entries: Vec<Option<Entry<E>>>,
    /// Each slot's generation (bumped when its entry goes).
    generations: Vec<u32>,
    free: Vec<u32>,
    index: HashMap<(Option<EntryId>, Box<[u32]>), EntryId>,
    clock: u64,
    evictions: u64,
}

impl<E> PrefixCache<E> {
    /// An empty cache of chunks of `chunk` tokens, each entry's storage
    /// `entry_bytes`, a prompt's last logits `vocab` values, holding at most
    /// `max_bytes`.
    pub fn new(chunk: usize, entry_bytes: u64, vocab: usize, max_bytes: u64) -> Self {
        PrefixCache {
            chunk: chunk.max(1),
            entry_bytes,
            vocab,
            with_logits: 0,
            max_bytes,
            entries: Vec::new(),
            generations: Vec::new(),
            free: Vec::new(),
            index: HashMap::new(),
            clock: 0,
            evictions: 0,
        }
    }

    pub fn stats(&self) -> PrefixStats {
        PrefixStats {
            chunk_tokens: self.chunk,
            entries: self.index.len(),
            bytes: self.bytes(),
            logits_bytes: self.logits_bytes(),
            max_bytes: self.max_bytes,
            evictions: self.evictions,
        }
    }

    /// Bytes the entries' storage takes.
    fn bytes(&self) -> u64 {
        self.index.len() as u64 * self.entry_bytes
    }

    /// Bytes one entry's logits take.
    fn logits_entry_bytes(&self) -> u64 {
        self.vocab as u64 * 4
    }

    fn logits_bytes(&self) -> u64 {
        self.with_logits as u64 * self.logits_entry_bytes()
    }

    fn entry(&self, id: EntryId) -> Option<&Entry<E>> {
        match self.entries.get(id.slot as usize) {
            Some(Some(e)) if e.generation == id.generation => Some(e),
            _ => None,
        }
    }

    /// The cached chunks `prompt` starts with, in order: every chunk of it
    /// when they all are and the last holds its logits (the same prompt
    /// again), else as many whole chunks as match leaving at least one token
    /// to compute (its logits are the next token's). Marks them used.
    fn lookup(&mut self, prompt: &[u32]) -> Vec<EntryId> {
        let mut found = Vec::new();
        let mut parent = None;
        for tokens in prompt.chunks(self.chunk) {
            let key = (parent, Box::<[u32]>::from(tokens));
            let Some(&id) = self.index.get(&key) else {
                break;
            };
            found.push(id);
            parent = Some(id);
        }
        let every = found.len() == prompt.len().div_ceil(self.chunk)
            && found
                .last()
                .and_then(|&id| self.entry(id))
                .is_some_and(|e| e.logits.is_some());
        if !every {
            found.truncate(prompt.len().saturating_sub(1) / self.chunk);
        }
        self.clock += 1;
        let now = self.clock;
        for id in &found {
            if let Some(Some(e)) = self.entries.get_mut(id.slot as usize) {
                e.used = now;
            }
        }
        found
    }

    /// Attaches the cached chunks `prompt` starts with to a sequence that
    /// holds no position yet (`len`, else a caller's bug), each copied in by
    /// `put(position, storage, positions)`: the sequence's trail, the
    /// positions it now holds and, when that is the whole prompt, its last
    /// logits.
    pub fn attach(
        &mut self,
        len: usize,
        prompt: &[u32],
        mut put: impl FnMut(usize, &E, usize) -> Result<(), BackendError>,
    ) -> Result<Attached, BackendError> {
        if len != 0 {
            return Err(BackendError::CallerBug(format!(
                "a prefix attached to a sequence of {len} positions"
            )));
        }
        let found = self.lookup(prompt);
        let mut at = 0;
        let mut logits = None;
        for &id in &found {
            let e = self.entry(id).expect("just found");
            put(at, &e.storage, e.tokens.len())?;
            at += e.tokens.len();
            logits = e.logits.as_ref();
        }
        let whole = at == prompt.len();
        Ok(Attached {
            trail: Trail {
                // Nothing of the prompt is left to publish.
                broken: whole,
                last: found.last().copied(),
                chunks: found.len(),
                prompt_len: prompt.len(),
            },
            len: at,
            logits: logits.filter(|_| whole).cloned(),
        })
    }

    /// Whether a `forward` of `tokens` tokens at position `start` on a
    /// sequence with `trail` computes a chunk the cache could keep, and so
    /// whether the backend should copy it out; notes on the trail that the
    /// sequence's positions are no longer whole chunks when they are not.
    /// Gives the chunk's parent when it is to be published.
    fn publishable(&self, trail: &mut Trail, start: usize, tokens: usize) -> Publish {
        let last = trail.prompt_len == start + tokens;
        let fits = tokens == self.chunk || (last && tokens > 0 && tokens < self.chunk);
        let whole = !trail.broken && fits && start == trail.chunks * self.chunk;
        if !whole {
            trail.broken = true;
            return Publish::No;
        }
        // The parent must still be there (an evicted parent ends the trail:
        // the chunk could not be found again from the root).
        let parent = trail.last;
        if trail.chunks > 0 && parent.is_none_or(|p| self.entry(p).is_none()) {
            trail.broken = true;
            return Publish::No;
        }
        Publish::Chunk { parent, last }
    }

    /// The entry of `tokens` after `parent`, when the cache has it already
    /// (then the trail moves on to it and nothing is copied).
    fn find(
        &mut self,
        trail: &mut Trail,
        parent: Option<EntryId>,
        tokens: &[u32],
    ) -> Option<EntryId> {
        let key = (parent, Box::<[u32]>::from(tokens));
        let &id = self.index.get(&key)?;
        self.clock += 1;
        if let Some(Some(e)) = self.entries.get_mut(id.slot as usize) {
            e.used = self.clock;
        }
        trail.last = Some(id);
        trail.chunks += 1;
        Some(id)
    }

    /// Whether `bytes` more may be held, after evicting (into `evicted`, for
    /// the backend to free) what the bound asks; never the entry `keep`
    /// (the new one's parent, or the entry the bytes are for).
    fn make_room(&mut self, keep: Option<EntryId>, bytes: u64, evicted: &mut Vec<E>) -> bool {
        if bytes > self.max_bytes {
            return false;
        }
        while self.bytes() + self.logits_bytes() + bytes > self.max_bytes {
            match self.evict_one(keep) {
                Some(storage) => evicted.push(storage),
                None => return false,
            }
        }
        true
    }

    /// Adds the chunk `tokens` after `parent` (found with [`Self::find`]
    /// first: not there) with its storage; the trail moves on to it. The
    /// caller made room with [`Self::make_room`].
    fn insert(
        &mut self,
        trail: &mut Trail,
        parent: Option<EntryId>,
        tokens: &[u32],
        storage: E,
    ) -> EntryId {
        self.clock += 1;
        let slot = self.free.pop().unwrap_or_else(|| {
            self.entries.push(None);
            self.generations.push(0);
            (self.entries.len() - 1) as u32
        });
        let id = EntryId {
            slot,
            generation: self.generations[slot as usize],
        };
        if let Some(p) = parent {
            if let Some(Some(e)) = self.entries.get_mut(p.slot as usize) {
                e.children += 1;
            }
        }
        self.entries[slot as usize] = Some(Entry {
            generation: id.generation,
            parent,
            tokens: tokens.into(),
            children: 0,
            used: self.clock,
            storage,
            logits: None,
        });
        self.index.insert((parent, tokens.into()), id);
        trail.last = Some(id);
        trail.chunks += 1;
        id
    }

    /// Evicts the least recently used entry that no other entry continues
    /// (and that is not `keep`); its storage, or `None` when none may go.
    pub fn evict_one(&mut self, keep: Option<EntryId>) -> Option<E> {
        let slot = self
            .entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.as_ref().map(|e| (i, e)))
            .filter(|(i, e)| e.children == 0 && keep.is_none_or(|k| k.slot as usize != *i))
            .min_by_key(|(_, e)| e.used)
            .map(|(i, _)| i)?;
        let e = self.entries[slot].take().expect("chosen above");
        self.generations[slot] = self.generations[slot].wrapping_add(1);
        self.free.push(slot as u32);
        self.index.remove(&(e.parent, e.tokens));
        if e.logits.is_some() {
            self.with_logits -= 1;
        }
        if let Some(p) = e.parent {
            if let Some(Some(pe)) = self.entries.get_mut(p.slot as usize) {
                pe.children -= 1;
            }
        }
        self.evictions += 1;
        Some(e.storage)
    }

    /// After a `forward` of `tokens` at `start` on a sequence with `trail`:
    /// keeps the chunk when it may be kept and is not there yet, its storage
    /// made by `copy` (which may decline with `Ok(None)`: no room), after
    /// evicting what the bound asks (handed to `copy`, which frees their
    /// memory before it takes its own); the prompt's last chunk with the
    /// logits `logits` gives. Cheap when nothing is kept: a decode step only
    /// marks the trail.
    pub fn publish<Er>(
        &mut self,
        trail: &mut Trail,
        start: usize,
        tokens: &[u32],
        copy: impl FnOnce(Vec<E>) -> Result<Option<E>, Er>,
        logits: impl FnOnce() -> Result<Vec<f32>, Er>,
    ) -> Result<(), Er> {
        let Publish::Chunk { parent, last } = self.publishable(trail, start, tokens.len()) else {
            return Ok(());
        };
        let logit_bytes = if last { self.logits_entry_bytes() } else { 0 };
        let (id, room_for_logits) = match self.find(trail, parent, tokens) {
            Some(id) => (id, false),
            None => {
                let mut evicted = Vec::new();
                if !self.make_room(parent, self.entry_bytes + logit_bytes, &mut evicted) {
                    // What was evicted is freed as it drops; nothing is copied.
                    trail.broken = true;
                    return Ok(());
                }
                match copy(evicted)? {
                    Some(storage) => (self.insert(trail, parent, tokens, storage), true),
                    None => {
                        trail.broken = true;
                        return Ok(());
                    }
                }
            }
        };
        if tokens.len() < self.chunk {
            trail.broken = true;
        }
        if last && self.entry(id).is_some_and(|e| e.logits.is_none()) {
            let mut evicted = Vec::new();
            if room_for_logits || self.make_room(Some(id), logit_bytes, &mut evicted) {
                drop(evicted);
                let values = logits()?;
                if let Some(Some(e)) = self.entries.get_mut(id.slot as usize) {
                    if values.len() == self.vocab {
                        e.logits = Some(values.into());
                        self.with_logits += 1;
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether the cache holds anything.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.index.is_empty()
    }
}

/// What [`PrefixCache::publishable`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Publish {
    No,
    /// The chunk may be kept, after `parent`; `last`: it ends the prompt.
    Chunk {
        parent: Option<EntryId>,
        last: bool,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache of 4-token chunks of 10 bytes each whose storage is the
    /// chunk's first token, and whose logits are one value (4 bytes): that
    /// token again.
    fn cache(max: u64) -> PrefixCache<u32> {
        PrefixCache::new(4, 10, 1, max)
    }

    /// Publishes `prompt`'s chunks after `trail` as a backend prefilling it would.
    fn publish_all(c: &mut PrefixCache<u32>, prompt: &[u32], mut trail: Trail, mut at: usize) {
        while at < prompt.len() {
            let end = (at + 4).min(prompt.len());
            let tokens = &prompt[at..end];
            c.publish(
                &mut trail,
                at,
                tokens,
                |_| Ok::<_, ()>(Some(tokens[0])),
                || Ok(vec![tokens[0] as f32]),
            )
            .unwrap();
            at = end;
        }
    }

    /// Attaches, then publishes the rest of `prompt` (its last chunk with
    /// its logits).
    fn prefill(c: &mut PrefixCache<u32>, prompt: &[u32]) {
        let a = c.attach(0, prompt, |_, _, _| Ok(())).unwrap();
        publish_all(c, prompt, a.trail, a.len);
    }

    /// Publishes `prompt`'s chunks with no prompt told: whole chunks only.
    fn chunks_only(c: &mut PrefixCache<u32>, prompt: &[u32]) {
        publish_all(c, prompt, Trail::new(), 0);
    }

    fn hits(c: &mut PrefixCache<u32>, prompt: &[u32]) -> Vec<u32> {
        let found = c.lookup(prompt);
        found
            .into_iter()
            .map(|id| c.entry(id).unwrap().storage)
            .collect()
    }

    #[test]
    fn a_prompt_finds_the_whole_chunks_it_shares_and_leaves_one_token() {
        let mut c = cache(1000);
        let a: Vec<u32> = (0..10).collect();
        prefill(&mut c, &a);
        assert_eq!(c.stats().entries, 3, "two whole chunks and the last");
        // The same prompt: every chunk.
        assert_eq!(hits(&mut c, &a), vec![0, 4, 8]);
        // Eight tokens exactly: one chunk (the second was not a prompt's
        // last, so it has no logits), the last token is computed.
        assert_eq!(hits(&mut c, &a[..8]), vec![0]);
        // A longer prompt: the whole chunks, not the partial last one.
        let mut longer = a.clone();
        longer.extend([10, 11]);
        assert_eq!(hits(&mut c, &longer), vec![0, 4]);
        // A prompt differing in its 6th token shares the first chunk only.
        let mut b = a.clone();
        b[5] = 99;
        assert_eq!(hits(&mut c, &b), vec![0]);
        // One differing first token: nothing.
        let mut d = a.clone();
        d[0] = 99;
        assert!(hits(&mut c, &d).is_empty());
    }

    #[test]
    fn the_same_prompt_attaches_every_position_and_its_last_logits() {
        let mut c = cache(1000);
        let a: Vec<u32> = (0..10).collect();
        prefill(&mut c, &a);
        let mut puts = Vec::new();
        let got = c
            .attach(0, &a, |at, s, n| {
                puts.push((at, *s, n));
                Ok(())
            })
            .unwrap();
        assert_eq!(puts, [(0, 0, 4), (4, 4, 4), (8, 8, 2)]);
        assert_eq!((got.len, got.logits.as_deref()), (10, Some(&[8.0][..])));
        // A whole last chunk keeps its logits too, on the entry it shares.
        prefill(&mut c, &a[..8]);
        assert_eq!(c.stats().entries, 3);
        let got = c.attach(0, &a[..8], |_, _, _| Ok(())).unwrap();
        assert_eq!((got.len, got.logits.as_deref()), (8, Some(&[4.0][..])));
        assert_eq!(c.stats().logits_bytes, 8);
        // Not the whole prompt: no logits.
        let got = c.attach(0, &a[..9], |_, _, _| Ok(())).unwrap();
        assert_eq!((got.len, got.logits), (8, None));
    }

    #[test]
    fn only_whole_chunks_after_whole_chunks_are_published() {
        let mut c = cache(1000);
        let mut t = Trail::new();
        assert_eq!(c.publishable(&mut t, 0, 3), Publish::No, "a partial chunk");
        assert_eq!(
            c.publishable(&mut t, 3, 4),
            Publish::No,
            "after a partial chunk, never again"
        );
        let mut t = Trail::new();
        assert_eq!(
            c.publishable(&mut t, 0, 4),
            Publish::Chunk {
                parent: None,
                last: false
            }
        );
        c.insert(&mut t, None, &[1, 2, 3, 4], 1);
        assert_eq!(
            c.publishable(&mut t, 5, 4),
            Publish::No,
            "not at a chunk's start"
        );
        // A prompt's partial last chunk, after whole ones.
        let mut t = Trail {
            prompt_len: 7,
            ..Trail::new()
        };
        let id = c.insert(&mut t, None, &[5, 5, 5, 5], 5);
        assert_eq!(
            c.publishable(&mut t, 4, 3),
            Publish::Chunk {
                parent: Some(id),
                last: true
            }
        );
    }

    #[test]
    fn the_bound_evicts_the_least_recently_used_leaf_first() {
        let mut c = cache(30);
        chunks_only(&mut c, &[1, 1, 1, 1, 2, 2, 2, 2, 0]); // chain 1 -> 2
        chunks_only(&mut c, &[3, 3, 3, 3, 0]); // entry 3
        assert_eq!(c.stats().bytes, 30);
        hits(&mut c, &[1, 1, 1, 1, 2, 2, 2, 2, 0]); // the chain is newer now
        chunks_only(&mut c, &[5, 5, 5, 5, 0]);
        assert_eq!(c.stats().evictions, 1);
        assert!(
            hits(&mut c, &[3, 3, 3, 3, 0]).is_empty(),
            "3 was the oldest leaf"
        );
        assert_eq!(hits(&mut c, &[1, 1, 1, 1, 2, 2, 2, 2, 0]), vec![1, 2]);
        // Evicting everything goes leaf first: 2 before its parent 1.
        let mut order = Vec::new();
        while let Some(s) = c.evict_one(None) {
            order.push(s);
        }
        assert_eq!(order.len(), 3);
        let pos = |x| order.iter().position(|&s| s == x).unwrap();
        assert!(pos(2) < pos(1));
        assert!(c.is_empty());
        assert_eq!(c.stats().bytes, 0);
    }

    #[test]
    fn the_bound_counts_the_logits_kept() {
        // Room for a chunk and a last chunk with its logits: 10 + 10 + 4.
        let mut c = cache(24);
        prefill(&mut c, &[1, 1, 1, 1, 0]);
        let s = c.stats();
        assert_eq!((s.entries, s.bytes, s.logits_bytes), (2, 20, 4));
        // One byte less: the last chunk is not kept, and nothing is evicted
        // for it but what the bound asks.
        let mut c = cache(23);
        prefill(&mut c, &[1, 1, 1, 1, 0]);
        let s = c.stats();
        assert_eq!((s.entries, s.logits_bytes), (1, 0));
        assert!(s.bytes + s.logits_bytes <= s.max_bytes);
        // Evicting an entry with logits gives their bytes back.
        let mut c = cache(24);
        prefill(&mut c, &[1, 1, 1, 1, 0]);
        while c.evict_one(None).is_some() {}
        assert_eq!(c.stats().logits_bytes, 0);
    }

    #[test]
    fn a_trail_whose_parent_was_evicted_publishes_no_more() {
        let mut c = cache(1000);
        let mut t = Trail::new();
        c.insert(&mut t, None, &[1, 2, 3, 4], 1);
        c.evict_one(None).unwrap();
        assert_eq!(c.publishable(&mut t, 4, 4), Publish::No);
        // A new entry in the freed slot is not mistaken for the old one.
        let mut u = Trail::new();
        c.insert(&mut u, None, &[9, 9, 9, 9], 9);
        assert_eq!(c.publishable(&mut t, 4, 4), Publish::No);
    }

    #[test]
    fn an_entry_larger_than_the_bound_is_never_added() {
        let mut c = cache(5);
        let mut gone = Vec::new();
        assert!(!c.make_room(None, 10, &mut gone));
        prefill(&mut c, &[1, 2, 3, 4, 5]);
        assert!(c.is_empty());
    }
}
