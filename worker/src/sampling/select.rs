//! Selection over candidate token ids without sorting them.
//!
//! Candidates are ranked by logit descending, ties by lower id: a total order
//! (the logits reaching here hold no NaN), so every result below is the same
//! as with a full sort, whatever order the candidates arrive in. Top-k, top-p
//! and the draw are all one operation, [`cut_at_crossing`].

use std::cmp::Ordering;

/// Buckets per nat below the top logit, and how many there are (the last
/// one also takes everything further down, −∞ included).
const BUCKETS_PER_NAT: f32 = 16.0;
const BUCKETS: usize = 1024;
/// At or below this many candidates, skip the histogram.
const SMALL: usize = 512;

/// Rank order: higher logit first, then lower id.
pub(super) fn by_rank(logits: &[f32], a: u32, b: u32) -> Ordering {
    let (la, lb) = (logits[a as usize], logits[b as usize]);
    lb.partial_cmp(&la)
        .unwrap_or(Ordering::Equal)
        .then(a.cmp(&b))
}

/// Largest value of a NaN-free slice (−∞ if empty), over eight independent
/// lanes so that no long dependency chain forms.
pub(super) fn max_logit(logits: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = logits.chunks_exact(8);
    for chunk in &mut chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(x);
        }
    }
    chunks
        .remainder()
        .iter()
        .chain(&lanes)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max)
}

/// Sum of `weight` over `cands`, in f64, over four interleaved accumulators
/// (a fixed order, so the result is deterministic).
pub(super) fn mass(cands: &[u32], weight: impl Fn(u32) -> f64) -> f64 {
    let mut acc = [0.0_f64; 4];
    let mut chunks = cands.chunks_exact(4);
    for chunk in &mut chunks {
        for (a, &id) in acc.iter_mut().zip(chunk) {
            *a += weight(id);
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|&id| weight(id)).sum();
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

/// Reusable buffers of [`cut_at_crossing`].
#[derive(Debug, Default)]
pub(super) struct Scratch {
    /// Weight per logit bucket.
    hist: Vec<f64>,
    /// Holds the crossing bucket's members during the split.
    spare: Vec<u32>,
}

/// When a cumulative weight counts as having crossed the target.
#[derive(Clone, Copy, Debug)]
pub(super) enum Reach {
    /// `cum >= target` (top-k, top-p: "reaches").
    AtLeast,
    /// `cum > target` (inverse CDF at `u ∈ [0, 1)`).
    Beyond,
}

impl Reach {
    fn crossed(self, cum: f64, target: f64) -> bool {
        match self {
            Reach::AtLeast => cum >= target,
            Reach::Beyond => cum > target,
        }
    }
}

/// What the cumulative weight must cross.
#[derive(Clone, Copy, Debug)]
pub(super) enum Target {
    /// This much weight.
    Weight(f64),
    /// This share of the candidates' total weight.
    Share(f64),
}

impl Target {
    fn resolve(self, total: impl FnOnce() -> f64) -> f64 {
        match self {
            Target::Weight(w) => w,
            Target::Share(s) => s * total(),
        }
    }
}

/// Keeps the `k` best-ranked candidates, in no particular order
/// (`k == 0` = off): a crossing with unit weights. `top` as in
/// [`cut_at_crossing`].
pub(super) fn keep_top_k(
    cands: &mut Vec<u32>,
    logits: &[f32],
    top: f32,
    k: usize,
    scratch: &mut Scratch,
) {
    if k == 0 || k >= cands.len() {
        return;
    }
    let unit = |_| 1.0;
    cut_at_crossing(
        cands,
        logits,
        top,
        unit,
        Target::Weight(k as f64),
        Reach::AtLeast,
        scratch,
    );
}

/// Walking the candidates in rank order and summing `weight` (positive),
/// finds the first one whose cumulative weight crosses `target`, and cuts
/// `cands` down to it and the candidates ranked above it: afterwards those
/// come first, in no particular order, and the crossing candidate is last.
/// If rounding keeps the total from crossing, the cut is at the last-ranked
/// candidate. `cands` must not be empty.
///
/// Large sets are first narrowed to one logit bucket: a histogram of weight
/// per bucket below `top` (which should be the largest logit among `cands`;
/// any value is correct, it only sets where the buckets start) locates the
/// bucket holding the crossing, one branch-free pass drops the buckets after
/// it and puts that bucket last, and only its members go through a weighted
/// quickselect. Linear in `cands.len()` throughout.
pub(super) fn cut_at_crossing(
    cands: &mut Vec<u32>,
    logits: &[f32],
    top: f32,
    weight: impl Fn(u32) -> f64,
    target: Target,
    reach: Reach,
    scratch: &mut Scratch,
) {
    debug_assert!(!cands.is_empty());
    let (start, before, target) = if cands.len() <= SMALL {
        (0, 0.0, target.resolve(|| mass(cands, &weight)))
    } else {
        let bucket_of = |id: u32| bucket(logits[id as usize], top);
        let hist = &mut scratch.hist;
        fill_histogram(hist, cands, bucket_of, &weight);
        let target = target.resolve(|| hist.iter().sum());
        let (b, before) = crossing_bucket(hist, target, reach);
        (
            split_at_bucket(cands, &mut scratch.spare, bucket_of, b),
            before,
            target,
        )
    };
    let c = quickselect_crossing(&mut cands[start..], logits, &weight, before, target, reach);
    cands.truncate(start + c + 1);
}

/// Bucket of a logit: how far below `top` it lies, in 1/16 nat steps.
/// Non-decreasing as the logit decreases (f32 rounding is monotone; a logit
/// above `top` lands in bucket 0).
fn bucket(logit: f32, top: f32) -> usize {
    (((top - logit) * BUCKETS_PER_NAT) as usize).min(BUCKETS - 1)
}

fn fill_histogram(
    hist: &mut Vec<f64>,
    cands: &[u32],
    bucket_of: impl Fn(u32) -> usize,
    weight: impl Fn(u32) -> f64,
) {
    hist.clear();
    hist.resize(BUCKETS, 0.0);
    for &id in cands {
        hist[bucket_of(id)] += weight(id);
    }
}

/// The first bucket whose cumulative weight crosses `target`, with the weight
/// of the buckets before it; the last non-empty bucket if none does.
fn crossing_bucket(hist: &[f64], target: f64, reach: Reach) -> (usize, f64) {
    let (mut before, mut last) = (0.0, (0, 0.0));
    for (b, &m) in hist.iter().enumerate().filter(|&(_, &m)| m > 0.0) {
        if reach.crossed(before + m, target) {
            return (b, before);
        }
        last = (b, before);
        before += m;
    }
    last
}

/// One branch-free pass: keeps the candidates of buckets before `b` in front
/// (compacted in place), then those of bucket `b` (parked in `spare`), and
/// drops the rest. Returns where bucket `b` starts.
fn split_at_bucket(
    cands: &mut Vec<u32>,
    spare: &mut Vec<u32>,
    bucket_of: impl Fn(u32) -> usize,
    b: usize,
) -> usize {
    if spare.len() < cands.len() {
        spare.resize(cands.len(), 0);
    }
    let (mut front, mut parked) = (0, 0);
    for i in 0..cands.len() {
        let id = cands[i];
        let k = bucket_of(id);
        cands[front] = id;
        front += usize::from(k < b);
        spare[parked] = id;
        parked += usize::from(k == b);
    }
    cands.truncate(front);
    cands.extend_from_slice(&spare[..parked]);
    front
}

/// Weighted quickselect behind [`cut_at_crossing`]: returns the index of the
/// crossing within `cands`, with the candidates ranked above it before it and
/// those below after it. `before` is the weight of everything ranked above
/// `cands`. Each step partitions the open range around its median
/// (`select_nth_unstable_by`) and keeps the half holding the crossing.
fn quickselect_crossing(
    cands: &mut [u32],
    logits: &[f32],
    weight: impl Fn(u32) -> f64,
    mut before: f64,
    target: f64,
    reach: Reach,
) -> usize {
    // Invariant: cands[..lo] rank above cands[lo..], weigh `before` with what
    // precedes `cands`, and do not cross; cands[hi..] rank below cands[..hi].
    let (mut lo, mut hi) = (0, cands.len());
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        cands[lo..hi].select_nth_unstable_by(mid - lo, |&a, &b| by_rank(logits, a, b));
        let left = before + mass(&cands[lo..mid], &weight);
        let through_mid = left + weight(cands[mid]);
        if reach.crossed(left, target) {
            hi = mid;
        } else if reach.crossed(through_mid, target) {
            return mid;
        } else {
            lo = mid + 1;
            before = through_mid;
        }
    }
    if lo < hi {
        lo
    } else {
        hi - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Straightforward reference: full sort, then a sequential walk over
    /// weights e^logit. Returns the crossing id and the ids ranked above it.
    fn crossing_by_sort(logits: &[f32], target: f64, reach: Reach) -> (u32, Vec<u32>) {
        let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
        ids.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        let mut cum = 0.0;
        let mut i = ids.len() - 1;
        for (j, &id) in ids.iter().enumerate() {
            cum += f64::from(logits[id as usize]).exp();
            if reach.crossed(cum, target) {
                i = j;
                break;
            }
        }
        let mut above = ids[..i].to_vec();
        above.sort();
        (ids[i], above)
    }

    /// Runs `cut_at_crossing` over all ids (given in a scrambled order) and
    /// checks the crossing and the tokens kept above it against the reference.
    fn check(logits: &[f32], target: f64, reach: Reach) {
        let n = logits.len() as u32;
        let mut cands: Vec<u32> = (0..n).map(|i| (i * 7919 + 13) % n).collect();
        let exp = |id: u32| f64::from(logits[id as usize]).exp();
        let top = max_logit(logits);
        let weight = Target::Weight(target);
        cut_at_crossing(
            &mut cands,
            logits,
            top,
            exp,
            weight,
            reach,
            &mut Scratch::default(),
        );
        let (id, above) = crossing_by_sort(logits, target, reach);
        let crossing = cands.pop().unwrap();
        assert_eq!(crossing, id, "target {target} {reach:?}");
        cands.sort();
        assert_eq!(cands, above);
    }

    /// Distinct-ish pseudo-random logits with repeats, spanning `span` nats.
    fn spread(n: u32, span: f32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i.wrapping_mul(7919) % 211) as f32) / 210.0 * span - span / 2.0)
            .collect()
    }

    #[test]
    fn by_rank_orders_by_logit_then_id() {
        let logits = [1.0, 2.0, 2.0, -0.0, 0.0];
        assert_eq!(by_rank(&logits, 1, 0), Ordering::Less);
        assert_eq!(by_rank(&logits, 1, 2), Ordering::Less);
        assert_eq!(by_rank(&logits, 2, 1), Ordering::Greater);
        // -0.0 and 0.0 are the same logit: ties go by id.
        assert_eq!(by_rank(&logits, 3, 4), Ordering::Less);
    }

    #[test]
    fn bucket_follows_rank() {
        assert_eq!(bucket(3.0, 3.0), 0);
        assert_eq!(bucket(2.0, 3.0), 16);
        assert_eq!(bucket(-100.0, 3.0), BUCKETS - 1);
        assert_eq!(bucket(f32::NEG_INFINITY, 3.0), BUCKETS - 1);
        assert_eq!(bucket(-f32::MAX, f32::MAX), BUCKETS - 1);
    }

    #[test]
    fn split_at_bucket_keeps_earlier_then_crossing_bucket() {
        let mut v = vec![5, 1, 9, 3, 7, 3, 0, 8, 2];
        let start = split_at_bucket(&mut v, &mut Vec::new(), |x| x as usize / 3, 1);
        assert_eq!(v, [1, 0, 2, 5, 3, 3]);
        assert_eq!(start, 3);
    }

    #[test]
    fn top_k_keeps_best_ranked() {
        let logits = [0.5, 3.0, 1.0, 3.0, 2.0, 1.0];
        let mut cands: Vec<u32> = (0..6).collect();
        keep_top_k(&mut cands, &logits, 3.0, 4, &mut Scratch::default());
        cands.sort();
        assert_eq!(cands, [1, 2, 3, 4]); // 1.0 tie between ids 2 and 5: id 2
    }

    #[test]
    fn top_k_on_large_sets() {
        for logits in [spread(5000, 12.0), vec![0.0; 3000], spread(2000, 2000.0)] {
            let mut order: Vec<u32> = (0..logits.len() as u32).collect();
            order.sort_by(|&a, &b| by_rank(&logits, a, b));
            for k in [1, 7, 600, 1999] {
                let mut cands: Vec<u32> = (0..logits.len() as u32).rev().collect();
                keep_top_k(
                    &mut cands,
                    &logits,
                    max_logit(&logits),
                    k,
                    &mut Scratch::default(),
                );
                cands.sort();
                let mut expected = order[..k].to_vec();
                expected.sort();
                assert_eq!(cands, expected, "k = {k}");
            }
        }
    }

    #[test]
    fn crossing_at_exact_boundaries() {
        // Uniform weights: sums of 1.0 are exact, so boundaries are exact.
        for n in [7usize, 700] {
            let logits = vec![0.0_f32; n];
            for target in [0, 1, 2, 3, n / 2, n - 1, n] {
                check(&logits, target as f64, Reach::AtLeast);
                check(&logits, target as f64, Reach::Beyond);
            }
        }
    }

    #[test]
    fn crossing_matches_sorted_walk_on_many_targets() {
        for (n, span) in [
            (300, 8.0),
            (997, 8.0),
            (20_000, 30.0),
            (5000, 0.01),
            (3000, 500.0),
        ] {
            let logits = spread(n, span);
            let total: f64 = logits.iter().map(|&x| f64::from(x).exp()).sum();
            for step in 0..50 {
                let target = total * (f64::from(step) + 0.37) / 50.0;
                check(&logits, target, Reach::Beyond);
                check(&logits, target, Reach::AtLeast);
            }
        }
    }

    #[test]
    fn any_top_gives_the_same_cut() {
        let logits = spread(3000, 20.0);
        let exp = |id: u32| f64::from(logits[id as usize]).exp();
        let mut expected: Option<Vec<u32>> = None;
        for top in [10.0, 9.0, 0.0, -50.0, 80.0, f32::MAX] {
            let mut cands: Vec<u32> = (0..3000).collect();
            let target = Target::Share(0.8);
            cut_at_crossing(
                &mut cands,
                &logits,
                top,
                exp,
                target,
                Reach::AtLeast,
                &mut Scratch::default(),
            );
            let last = cands.pop();
            cands.sort();
            cands.extend(last);
            assert_eq!(*expected.get_or_insert(cands.clone()), cands, "top {top}");
        }
    }

    #[test]
    fn max_and_mass() {
        let xs: Vec<f32> = (0..37).map(|i| ((i * 13) % 37) as f32 - 3.0).collect();
        assert_eq!(max_logit(&xs), 33.0);
        assert_eq!(
            max_logit(&xs[..5]),
            xs[..5].iter().copied().fold(f32::MIN, f32::max)
        );
        assert_eq!(max_logit(&[]), f32::NEG_INFINITY);
        let ids: Vec<u32> = (0..37).collect();
        assert_eq!(mass(&ids, f64::from), 666.0);
        assert_eq!(mass(&ids[..3], |_| 0.5), 1.5);
    }

    #[test]
    fn crossing_beyond_total_returns_last_ranked() {
        for n in [3u32, 2000] {
            let logits: Vec<f32> = (0..n).map(|i| (i % 17) as f32).collect();
            check(&logits, 1e300, Reach::Beyond);
        }
    }
}
