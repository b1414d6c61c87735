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
}

/// Chunks' KV, found by their tokens and the chunks before them. `E` is the
/// backend's storage of one chunk.
pub struct PrefixCache<E> {
    chunk: usize,
    /// Bytes one entry's storage takes (every entry is one whole chunk).
    entry_bytes: u64,
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
    /// `entry_bytes`, holding at most `max_bytes`.
    pub fn new(chunk: usize, entry_bytes: u64, max_bytes: u64) -> Self {
        PrefixCache {
            chunk: chunk.max(1),
            entry_bytes,
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
            max_bytes: self.max_bytes,
            evictions: self.evictions,
        }
    }

    /// Bytes the entries' storage takes.
    fn bytes(&self) -> u64 {
        self.index.len() as u64 * self.entry_bytes
    }

    fn entry(&self, id: EntryId) -> Option<&Entry<E>> {
        match self.entries.get(id.slot as usize) {
            Some(Some(e)) if e.generation == id.generation => Some(e),
            _ => None,
        }
    }

    /// The cached chunks `prompt` starts with, in order, each with its
    /// storage: as many whole chunks as match, leaving at least one token of
    /// the prompt to compute (its logits are the next token's). Marks them
    /// used.
    fn lookup(&mut self, prompt: &[u32]) -> Vec<(EntryId, &E)> {
        let usable = prompt.len().saturating_sub(1) / self.chunk;
        let mut found = Vec::new();
        let mut parent = None;
        for tokens in prompt.chunks_exact(self.chunk).take(usable) {
            let key = (parent, Box::<[u32]>::from(tokens));
            let Some(&id) = self.index.get(&key) else {
                break;
            };
            found.push(id);
            parent = Some(id);
        }
        self.clock += 1;
        let now = self.clock;
        for id in &found {
            if let Some(Some(e)) = self.entries.get_mut(id.slot as usize) {
                e.used = now;
            }
        }
        found
            .into_iter()
            .map(|id| (id, &self.entry(id).expect("just found").storage))
            .collect()
    }

    /// Attaches the cached chunks `prompt` starts with to a sequence that
    /// holds no position yet (`len`, else a caller's bug), each copied in by
    /// `put(position, storage)`: the sequence's trail and the positions it
    /// now holds.
    pub fn attach(
        &mut self,
        len: usize,
        prompt: &[u32],
        mut put: impl FnMut(usize, &E) -> Result<(), BackendError>,
    ) -> Result<(Trail, usize), BackendError> {
        if len != 0 {
            return Err(BackendError::CallerBug(format!(
                "a prefix attached to a sequence of {len} positions"
            )));
        }
        let chunk = self.chunk;
        let found = self.lookup(prompt);
        for (i, (_, part)) in found.iter().enumerate() {
            put(i * chunk, part)?;
        }
        let ids: Vec<EntryId> = found.iter().map(|(id, _)| *id).collect();
        Ok((Self::attached(&ids), ids.len() * chunk))
    }

    /// A sequence whose first `found` chunks were attached: its trail.
    fn attached(found: &[EntryId]) -> Trail {
        Trail {
            broken: false,
            last: found.last().copied(),
            chunks: found.len(),
        }
    }

    /// Whether a `forward` of `tokens` tokens at position `start` on a
    /// sequence with `trail` computes a chunk the cache could keep, and so
    /// whether the backend should copy it out; notes on the trail that the
    /// sequence's positions are no longer whole chunks when they are not.
    /// Gives the chunk's parent when it is to be published.
    fn publishable(&self, trail: &mut Trail, start: usize, tokens: usize) -> Publish {
        let whole = !trail.broken && tokens == self.chunk && start == trail.chunks * self.chunk;
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
        Publish::Chunk { parent }
    }

    /// Whether the cache has `tokens` after `parent` already (then the
    /// trail moves on to it and nothing is copied).
    fn find(&mut self, trail: &mut Trail, parent: Option<EntryId>, tokens: &[u32]) -> bool {
        let key = (parent, Box::<[u32]>::from(tokens));
        let Some(&id) = self.index.get(&key) else {
            return false;
        };
        self.clock += 1;
        if let Some(Some(e)) = self.entries.get_mut(id.slot as usize) {
            e.used = self.clock;
        }
        trail.last = Some(id);
        trail.chunks += 1;
        true
    }

    /// Whether one more entry may be added, after evicting (into `evicted`,
    /// for the backend to free) what the bound asks; never the entry `keep`
    /// (the new one's parent).
    fn make_room(&mut self, keep: Option<EntryId>, evicted: &mut Vec<E>) -> bool {
        let bytes = self.entry_bytes;
        if bytes > self.max_bytes {
            return false;
        }
        while self.bytes() + bytes > self.max_bytes {
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
    fn insert(&mut self, trail: &mut Trail, parent: Option<EntryId>, tokens: &[u32], storage: E) {
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
        });
        self.index.insert((parent, tokens.into()), id);
        trail.last = Some(id);
        trail.chunks += 1;
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
    /// memory before it takes its own). Cheap when nothing is kept: a
    /// decode step only marks the trail.
    pub fn publish<Er>(
        &mut self,
        trail: &mut Trail,
        start: usize,
        tokens: &[u32],
        copy: impl FnOnce(Vec<E>) -> Result<Option<E>, Er>,
    ) -> Result<(), Er> {
        let Publish::Chunk { parent } = self.publishable(trail, start, tokens.len()) else {
            return Ok(());
        };
        if self.find(trail, parent, tokens) {
            return Ok(());
        }
        let mut evicted = Vec::new();
        if !self.make_room(parent, &mut evicted) {
            // What was evicted is freed as it drops; nothing is copied.
            trail.broken = true;
            return Ok(());
        }
        match copy(evicted)? {
            Some(storage) => self.insert(trail, parent, tokens, storage),
            None => trail.broken = true,
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
    /// The chunk may be kept, after `parent`.
    Chunk {
        parent: Option<EntryId>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache of 4-token chunks of 10 bytes each whose storage is the
    /// chunk's first token.
    fn cache(max: u64) -> PrefixCache<u32> {
        PrefixCache::new(4, 10, max)
    }

    /// Attaches and publishes `prompt`'s chunks as a backend prefilling it would.
    fn prefill(c: &mut PrefixCache<u32>, prompt: &[u32]) -> Trail {
        let (mut trail, mut at) = c.attach(0, prompt, |_, _| Ok(())).unwrap();
        while at < prompt.len() {
            let end = (at + 4).min(prompt.len());
            let tokens = &prompt[at..end];
            c.publish(&mut trail, at, tokens, |_| Ok::<_, ()>(Some(tokens[0])))
                .unwrap();
            at = end;
        }
        trail
    }

    fn hits(c: &mut PrefixCache<u32>, prompt: &[u32]) -> Vec<u32> {
        c.lookup(prompt).into_iter().map(|(_, s)| *s).collect()
    }

    #[test]
    fn a_prompt_finds_the_whole_chunks_it_shares_and_leaves_one_token() {
        let mut c = cache(1000);
        let a: Vec<u32> = (0..10).collect();
        prefill(&mut c, &a);
        assert_eq!(c.stats().entries, 2, "two whole chunks of ten tokens");
        // The same prompt: both chunks (two tokens are left to compute).
        assert_eq!(hits(&mut c, &a), vec![0, 4]);
        // Eight tokens exactly: one chunk, the last token is computed.
        assert_eq!(hits(&mut c, &a[..8]), vec![0]);
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
        assert_eq!(c.publishable(&mut t, 0, 4), Publish::Chunk { parent: None });
        c.insert(&mut t, None, &[1, 2, 3, 4], 1);
        assert_eq!(
            c.publishable(&mut t, 5, 4),
            Publish::No,
            "not at a chunk's start"
        );
    }

    #[test]
    fn the_bound_evicts_the_least_recently_used_leaf_first() {
        let mut c = cache(30);
        prefill(&mut c, &[1, 1, 1, 1, 2, 2, 2, 2, 0]); // chain 1 -> 2
        prefill(&mut c, &[3, 3, 3, 3, 0]); // entry 3
        assert_eq!(c.stats().bytes, 30);
        hits(&mut c, &[1, 1, 1, 1, 2, 2, 2, 2, 0]); // the chain is newer now
        prefill(&mut c, &[5, 5, 5, 5, 0]);
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
        assert!(!c.make_room(None, &mut gone));
        prefill(&mut c, &[1, 2, 3, 4, 5]);
        assert!(c.is_empty());
    }
}
