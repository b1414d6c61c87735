// sample.cu: the sampling pipeline of M0-W-1421 on the device, so that a
// decode step copies back a token id (and the requested log-probabilities)
// instead of the whole logit vector. Same order and semantics as the CPU
// sampler (worker/src/sampling): temperature, repetition penalty, top-k,
// top-p, min-p, then the inverse CDF at the host's draw `u` in rank order
// (logit descending, ties by lower id), or argmax at temperature 0.
//
// One block of SAMPLE_THREADS threads does everything, with barriers between
// the steps. Each logit becomes a 32-bit rank key (`rank_key`): smaller key,
// better rank; -0 and +0 share a key; NaN gets the worst key. Every filter
// keeps a prefix of the rank order, so the kept set is always "rank at or
// before a cut" (`Cut`: a key and, among tokens of that key, the highest id
// kept).
//
// Top-k, top-p and the draw are one operation, `find_crossing`: in rank
// order, the first token whose cumulative weight (1 per token, or
// exp(logit - top)) reaches a target. It is a radix select over the keys, 8
// bits at a time (4 passes, a 256-bin histogram of counts and weights in
// shared memory per pass), then one ordered scan over the ids of the tokens
// of the crossing key (they all weigh the same, so how many of them are
// needed is a division).
//
// Determinism (M0-W-1031): weights are summed as 64-bit fixed-point
// integers, floor(exp(logit - top) * scale) with scale = 2^(63 - ceil(log2
// vocab)) (2^45 for a 151936-token vocabulary), so the sums do not depend on
// the order of the atomic additions. Every other reduction is a min/max or
// a sum in a fixed order. The only precision difference from the CPU's f64
// sums: each weight is truncated to a multiple of 1/scale, so the choice can
// differ only where u * total lies within (tokens ranked above) / scale of a
// cumulative boundary, and tokens weighing less than 1/scale of the top one
// are never drawn (together they hold at most vocab / scale of the mass:
// 7.5e-9 of it at 2^45).

#include "common.cuh"

// Shared with the host's launch geometry: defined once in the worker
// (backend/cuda/source.rs) and passed to NVRTC as -D options.
#if !defined(SAMPLE_THREADS) || !defined(SAMPLE_MAX_LOGPROBS) || !defined(SAMPLE_OUT_WORDS)
#error "SAMPLE_THREADS, SAMPLE_MAX_LOGPROBS and SAMPLE_OUT_WORDS come from the worker as -D options"
#endif
// Words of the result buffer: [0] id, [1] logprob count, [2] max (f32 bits),
// [3] unused, [4..6) log-sum-exp (f64), then (id, value bits) pairs from [8].
static_assert(SAMPLE_OUT_WORDS == 8 + 2 * SAMPLE_MAX_LOGPROBS, "the result block's layout");
#define SAMPLE_BINS 256

#define KEY_NAN 0xffffffffu   // NaN: after everything
#define KEY_NEG_INF 0xff800000u   // rank_key(-inf)
#define ID_ALL 0xffffffffu
#define F32_MAX __int_as_float(0x7f7fffff)

// Where find_crossing's target comes from.
#define NEED_GIVEN 0    // cumulative weight >= need
#define NEED_REACH 1    // cumulative weight >= share * total (top-p)
#define NEED_EXCEED 2   // cumulative weight > share * total (the draw)

struct Cut {
    u32 key;
    u32 id;
};

struct SampleShared {
    u64 hist_w[SAMPLE_BINS];
    u32 hist_n[SAMPLE_BINS];
    u64 red64[32];
    double redf[32];
    u32 red32[32];
    // Set by warp 0 in choose_bin, read by all after a barrier.
    u32 digit;
    u32 group;
    u64 before;
    u64 need;
    u32 found_id;
    u32 slots;
};

// Ascending key = descending value; -0 and +0 share the key of +0.
__device__ __forceinline__ u32 rank_key(float y) {
    if (y != y) return KEY_NAN;
    const u32 b = (y == 0.0f) ? 0u : __float_as_uint(y);
    const u32 ord = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ~ord;
}

// The value of a key (NaN for KEY_NAN).
__device__ __forceinline__ float key_value(u32 k) {
    const u32 ord = ~k;
    const u32 b = (ord & 0x80000000u) ? (ord & 0x7fffffffu) : ~ord;
    return __uint_as_float(b);
}

// As the CPU's `sanitize`: NaN -> -inf (never kept), +inf -> f32::MAX.
__device__ __forceinline__ float sanitize(float x) {
    if (x != x) return NEG_INF;
    return x > F32_MAX ? F32_MAX : x;
}

// llama.cpp's repetition penalty on one logit.
__device__ __forceinline__ float penalized(float x, float p) {
    return x > 0.0f ? x / p : x * p;
}

__device__ __forceinline__ bool in_cut(u32 k, u32 i, Cut c) {
    return k < c.key || (k == c.key && i <= c.id);
}

// exp(value - top) in f64, as the CPU computes the weights.
__device__ __forceinline__ double weight_of(u32 k, double top) {
    return exp((double)key_value(k) - top);
}

__device__ __forceinline__ u64 fixed_weight(u32 k, double top, double scale) {
    return (u64)(weight_of(k, top) * scale);
}

// ---------------------------------------------------------------- reductions

// The block's minimum (or maximum) of v: butterfly within warps, then the
// warps' results in order through `red` (one slot per warp).
template <typename T>
__device__ __forceinline__ T block_extreme(T v, T* red, bool want_min) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const T t = __shfl_xor_sync(FULL_MASK, v, o);
        v = (want_min ? t < v : t > v) ? t : v;
    }
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    T m = red[0];
    for (int w = 1; w < nwarps; w++) m = (want_min ? red[w] < m : red[w] > m) ? red[w] : m;
    return m;
}

__device__ __forceinline__ u32 block_min_u32(u32 v, SampleShared& sh) { return block_extreme<u32>(v, sh.red32, true); }
__device__ __forceinline__ u32 block_max_u32(u32 v, SampleShared& sh) { return block_extreme<u32>(v, sh.red32, false); }
__device__ __forceinline__ u64 block_min_u64(u64 v, SampleShared& sh) { return block_extreme<u64>(v, sh.red64, true); }

// Sum in a fixed order: butterfly within warps, then warps in order.
__device__ __forceinline__ double block_sum_f64(double v, SampleShared& sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    __syncthreads();
    if (lane == 0) sh.redf[warp] = v;
    __syncthreads();
    double s = 0.0;
    for (int w = 0; w < nwarps; w++) s += sh.redf[w];
    return s;
}

// Exclusive prefix sum over the block in thread order; `*total` gets the sum.
__device__ __forceinline__ u32 block_exclusive_scan(u32 v, u32* total, SampleShared& sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    u32 inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u32 t = __shfl_up_sync(FULL_MASK, inc, o);
        if (lane >= o) inc += t;
    }
    __syncthreads();
    if (lane == 31) sh.red32[warp] = inc;
    __syncthreads();
    u32 base = 0, all = 0;
    for (int w = 0; w < nwarps; w++) {
        if (w < warp) base += sh.red32[w];
        all += sh.red32[w];
    }
    *total = all;
    return base + inc - v;
}

// The best (key, id) over the block: smallest key, then lowest id. `packed`
// is (key << 32) | id of each thread's best.
__device__ __forceinline__ u32 block_best_id(u64 packed, SampleShared& sh) {
    return (u32)(block_min_u64(packed, sh) & 0xffffffffull);
}

// Argmax of raw logits (ties to the lower id, NaN never wins; 0 if all are
// NaN), as `sampling::argmax`.
__device__ u32 raw_argmax(const float* logits, u32 n, SampleShared& sh) {
    u64 best = ~0ull;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
        const u64 p = ((u64)rank_key(logits[i]) << 32) | i;
        best = p < best ? p : best;
    }
    return block_best_id(best, sh);
}

// -------------------------------------------------------------- the crossing

__device__ __forceinline__ void flush_run(SampleShared& sh, u32 d, u32 count, u64 weight) {
    if (count) {
        atomicAdd(&sh.hist_n[d], count);
        atomicAdd((unsigned long long*)&sh.hist_w[d], (unsigned long long)weight);
    }
}

// Warp 0, after a histogram pass: picks the first non-empty bin where the
// cumulative weight (sh.before, then the bins in order) reaches sh.need, or
// the last non-empty bin if none does. On the first pass it first sets
// sh.need from the total. Leaves sh.digit, sh.before (weight ranked before
// the bin) and sh.group (the bin's count).
__device__ void choose_bin(SampleShared& sh, bool first, int target, u64 need_given, double share) {
    const int lane = threadIdx.x;
    u64 w = 0;
    u32 c = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        w += sh.hist_w[lane * 8 + j];
        c += sh.hist_n[lane * 8 + j];
    }
    u64 inc = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u64 t = __shfl_up_sync(FULL_MASK, inc, o);
        if (lane >= o) inc += t;
    }
    const u64 before = sh.before;
    u64 need;
    if (first) {
        const u64 total = __shfl_sync(FULL_MASK, inc, 31);
        if (target == NEED_GIVEN) {
            need = need_given;
        } else {
            double t = share * (double)total;
            if (!(t >= 0.0)) t = 0.0;
            need = target == NEED_REACH ? (u64)ceil(t) : (u64)floor(t) + 1ull;
            // Rounding must not push the target past every token: the cut
            // then falls on the last token of positive weight.
            if (need > total) need = total;
        }
    } else {
        need = sh.need;
    }
    const u32 crossing = __ballot_sync(FULL_MASK, c > 0 && before + inc >= need);
    const u32 nonempty = __ballot_sync(FULL_MASK, c > 0);
    const bool crossed = crossing != 0;
    const int owner = crossed ? __ffs(crossing) - 1 : 31 - __clz(nonempty);
    if (lane == owner) {
        u64 acc = before + inc - w;
        int pick = -1;
        u64 pick_before = acc;
        for (int j = 0; j < 8; j++) {
            const int b = lane * 8 + j;
            if (sh.hist_n[b] == 0) continue;
            if (crossed && acc + sh.hist_w[b] >= need) {
                pick = b;
                pick_before = acc;
                break;
            }
            pick = b;  // without a crossing: the last non-empty bin
            pick_before = acc;
            acc += sh.hist_w[b];
        }
        sh.digit = (u32)pick;
        sh.before = pick_before;
        sh.group = sh.hist_n[pick];
        sh.need = need;
    }
}

// In rank order over the tokens of `set`, the first whose cumulative weight
// reaches the target (see NEED_*); weights are 1 per token (`weighted`
// false) or fixed_weight. Returns it as the cut that keeps it and every
// token ranked before it. `set` must not be empty. All threads call it.
// Not inlined: sample_select calls it three times, and three inlined copies
// made `sample.cu [part 0]` a first start's slowest unit (NVRTC 1.74 ->
// 0.74 s on a CI machine's core; the call costs nothing beside its passes
// over the keys).
__device__ __noinline__ Cut find_crossing(const u32* keys, u32 n, Cut set, bool weighted, double top,
                                          double scale, int target, u64 need_given, double share,
                                          SampleShared& sh) {
    const u32 tid = threadIdx.x;
    if (tid == 0) sh.before = 0;
    u32 prefix = 0, hi_mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (u32 b = tid; b < SAMPLE_BINS; b += blockDim.x) {
            sh.hist_n[b] = 0;
            sh.hist_w[b] = 0;
        }
        __syncthreads();
        // Consecutive tokens of one bin are added up before the atomics:
        // most of a vocabulary falls into a few bins of the first pass.
        u32 run_d = 0, run_n = 0;
        u64 run_w = 0;
        for (u32 i = tid; i < n; i += blockDim.x) {
            const u32 k = keys[i];
            if (!in_cut(k, i, set) || (k & hi_mask) != prefix) continue;
            const u32 d = (k >> shift) & 0xffu;
            const u64 w = weighted ? fixed_weight(k, top, scale) : 1ull;
            if (d != run_d) {
                flush_run(sh, run_d, run_n, run_w);
                run_d = d;
                run_n = 0;
                run_w = 0;
            }
            run_n++;
            run_w += w;
        }
        flush_run(sh, run_d, run_n, run_w);
        __syncthreads();
        if (tid < 32) choose_bin(sh, shift == 24, target, need_given, share);
        __syncthreads();
        prefix |= sh.digit << shift;
        hi_mask |= 0xffu << shift;
    }
    // Every token of key `prefix` weighs the same: the crossing is the m-th
    // of them by id.
    const u64 wk = weighted ? fixed_weight(prefix, top, scale) : 1ull;
    const u64 need = sh.need, before = sh.before;
    const u32 group = sh.group;
    u32 m;
    if (need <= before) {
        m = 1;
    } else if (wk == 0) {
        m = group;
    } else {
        const u64 r = (need - before + wk - 1) / wk;
        m = r > (u64)group ? group : (u32)r;
    }
    if (m == 0) m = 1;

    // Ordered scan: thread t looks at ids [t * chunk, (t + 1) * chunk).
    const u32 chunk = (n + blockDim.x - 1) / blockDim.x;
    const u32 lo = min(n, tid * chunk), hi = min(n, lo + chunk);
    u32 mine = 0;
    for (u32 i = lo; i < hi; i++) {
        const u32 k = keys[i];
        mine += (k == prefix && in_cut(k, i, set)) ? 1u : 0u;
    }
    u32 total;
    const u32 ahead = block_exclusive_scan(mine, &total, sh);
    if (m > total) m = total;  // cannot happen: the group has `group` tokens
    if (m > ahead && m <= ahead + mine) {
        u32 left = m - ahead;
        for (u32 i = lo; i < hi; i++) {
            const u32 k = keys[i];
            if (k == prefix && in_cut(k, i, set) && --left == 0) {
                sh.found_id = i;
                break;
            }
        }
    }
    __syncthreads();
    Cut c;
    c.key = prefix;
    c.id = sh.found_id;
    __syncthreads();
    return c;
}

// ------------------------------------------------------------------ kernels

// Two units (-DONE_PART, source.rs's Module::parts): sample_select; the
// others. Compiled side by side, they halve this module's part of a first
// start.
#if !defined(ONE_PART) || ONE_PART == 0
// sample_select: picks the next token (one block of SAMPLE_THREADS).
// - logits: [n] f32, the raw logits; keys: [n] u32 scratch
// - pen_ids: [n_pen] u32, the distinct generated ids (< n) to penalize;
//   n_pen is 0 when penalty == 1
// - top_k: 0 (off) or 0 < top_k < n; top_p >= 1: off; min_p <= 0: off
// - u: the draw in [0, 1); greedy != 0: argmax (u unused)
// - scale: the fixed-point scale of the weights (see the top of the file)
// - out[0] receives the id
__device__ __forceinline__ void select_one(const float* logits, u32 n, u32* keys, const u32* pen_ids, u32 n_pen,
                                           float temperature, float penalty, u32 top_k, float top_p, float min_p,
                                           double u, double scale, int greedy, u32* out, SampleShared& sh) {
    const u32 tid = threadIdx.x;

    // Steps 1 and 2: temperature, then the penalty over the distinct ids.
    for (u32 i = tid; i < n; i += blockDim.x) {
        const float x = logits[i];
        keys[i] = rank_key(greedy ? x : sanitize(x / temperature));
    }
    __syncthreads();
    for (u32 j = tid; j < n_pen; j += blockDim.x) {
        const u32 id = pen_ids[j];
        if (id >= n) continue;
        const float y = penalized(key_value(keys[id]), penalty);
        keys[id] = rank_key(greedy ? y : sanitize(y));
    }
    __syncthreads();

    if (greedy) {
        u64 best = ~0ull;
        for (u32 i = tid; i < n; i += blockDim.x) {
            const u64 p = ((u64)keys[i] << 32) | i;
            best = p < best ? p : best;
        }
        const u32 id = block_best_id(best, sh);
        if (tid == 0) out[0] = id;
        return;
    }

    u32 kmin = KEY_NAN;
    for (u32 i = tid; i < n; i += blockDim.x) kmin = keys[i] < kmin ? keys[i] : kmin;
    const u32 top_key = block_min_u32(kmin, sh);
    if (top_key >= KEY_NEG_INF) {
        // No finite logit: the CPU falls back to the argmax of the raw logits.
        const u32 id = raw_argmax(logits, n, sh);
        if (tid == 0) out[0] = id;
        return;
    }
    const double top = (double)key_value(top_key);

    Cut cut;
    cut.key = KEY_NAN;
    cut.id = ID_ALL;
    // Step 3: top-k, by count.
    if (top_k > 0 && top_k < n) cut = find_crossing(keys, n, cut, false, top, scale, NEED_GIVEN, top_k, 0.0, sh);
    // Step 4: top-p, the smallest prefix reaching top_p of the kept weight.
    if (top_p < 1.0f) cut = find_crossing(keys, n, cut, true, top, scale, NEED_REACH, 0, (double)top_p, sh);
    // Step 5: min-p keeps weights >= min_p (the top one weighs 1): a prefix
    // that ends at the worst key passing the test.
    if (min_p > 0.0f) {
        u32 worst = 0;  // key + 1 of the worst token kept; 0: none
        for (u32 i = tid; i < n; i += blockDim.x) {
            const u32 k = keys[i];
            if (in_cut(k, i, cut) && weight_of(k, top) >= (double)min_p) worst = k + 1 > worst ? k + 1 : worst;
        }
        worst = block_max_u32(worst, sh);
        if (worst == 0) {
            // Nothing left (min_p > 1): the CPU's fallback, as above.
            const u32 id = raw_argmax(logits, n, sh);
            if (tid == 0) out[0] = id;
            return;
        }
        if (worst - 1 < cut.key) {
            cut.key = worst - 1;
            cut.id = ID_ALL;
        }
    }
    // Step 6: the first token whose cumulative weight exceeds u * total.
    const Cut drawn = find_crossing(keys, n, cut, true, top, scale, NEED_EXCEED, 0, u, sh);
    if (tid == 0) out[0] = drawn.id;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_select(const float* logits, u32 n, u32* keys, const u32* pen_ids, u32 n_pen, float temperature,
                  float penalty, u32 top_k, float top_p, float min_p, double u, double scale, int greedy, u32* out) {
    pdl_start();
    __shared__ SampleShared sh;
    select_one(logits, n, keys, pen_ids, n_pen, temperature, penalty, top_k, top_p, min_p, u, scale, greedy, out, sh);
}

// One sequence's sample_select arguments, for sample_select_rows (the
// host's SampleRow: the same fields in this order, 8-byte aligned).
struct SampleRow {
    const float* logits;
    u32* keys;
    const u32* pen_ids;
    u32* out;
    double u;
    u32 n_pen;
    float temperature;
    float penalty;
    u32 top_k;
    float top_p;
    float min_p;
    int greedy;
    u32 pad;
};

// sample_select_rows: sample_select for each sequence of a batched decode
// step, block b taking rows[b] (each its own logits, scratch, parameters
// and draw), so that a row's choice is the one sample_select makes alone.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_select_rows(const SampleRow* rows, u32 n, double scale) {
    pdl_start();
    __shared__ SampleShared sh;
    const SampleRow r = rows[blockIdx.x];
    select_one(r.logits, n, r.keys, r.pen_ids, r.n_pen, r.temperature, r.penalty, r.top_k, r.top_p, r.min_p, r.u,
               scale, r.greedy, r.out, sh);
}

#endif
#if !defined(ONE_PART) || ONE_PART == 1
// sample_logprobs: the k most likely tokens of the raw logits with what the
// host needs for their log-softmax (one block of SAMPLE_THREADS).
// - logits: [n] f32; keys: [n] u32 scratch; 0 < k <= SAMPLE_MAX_LOGPROBS
// - out (SAMPLE_OUT_WORDS u32, 8-byte aligned): [1] count, [2] max (f32
//   bits), [4..6) ln sum exp(x - max) (f64), from [8] (id, value bits) pairs
//   in no particular order. NaN counts as -inf, +inf as f32::MAX; tokens of
//   probability zero are not listed. out[0] is left alone.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_logprobs(const float* logits, u32 n, u32* keys, u32 k, u32* out) {
    pdl_start();
    __shared__ SampleShared sh;
    const u32 tid = threadIdx.x;
    u32 kmin = KEY_NAN;
    for (u32 i = tid; i < n; i += blockDim.x) {
        const float x = logits[i];
        const u32 key = rank_key(x != x ? NEG_INF : (x > F32_MAX ? F32_MAX : x));
        keys[i] = key;
        kmin = key < kmin ? key : kmin;
    }
    const u32 top_key = block_min_u32(kmin, sh);
    if (top_key >= KEY_NEG_INF) {
        if (tid == 0) {
            out[1] = 0;
            out[2] = __float_as_uint(NEG_INF);
            *(double*)(out + 4) = 0.0;
        }
        return;
    }
    const double top = (double)key_value(top_key);
    double s = 0.0;
    for (u32 i = tid; i < n; i += blockDim.x) s += weight_of(keys[i], top);
    const double log_sum = log(block_sum_f64(s, sh));

    Cut cut;
    cut.key = KEY_NAN;
    cut.id = ID_ALL;
    if (k < n) cut = find_crossing(keys, n, cut, false, top, 0.0, NEED_GIVEN, k, 0.0, sh);
    if (tid == 0) sh.slots = 0;
    __syncthreads();
    for (u32 i = tid; i < n; i += blockDim.x) {
        const u32 key = keys[i];
        if (key < KEY_NEG_INF && in_cut(key, i, cut)) {
            const u32 slot = atomicAdd(&sh.slots, 1u);
            if (slot < SAMPLE_MAX_LOGPROBS) {
                out[8 + 2 * slot] = i;
                out[9 + 2 * slot] = __float_as_uint(key_value(key));
            }
        }
    }
    __syncthreads();
    if (tid == 0) {
        out[1] = sh.slots < k ? sh.slots : k;
        out[2] = __float_as_uint(key_value(top_key));
        *(double*)(out + 4) = log_sum;
    }
}

// sample_argmax: greedy sampling without a penalty (the common request)
// over many blocks, where sample_select's one block reads the whole
// vocabulary on one SM (a 151,936-token vocabulary took it about as long as
// ten of a 0.5B model's layers). Block b takes ids [b * chunk, (b + 1) *
// chunk) and writes its best (key << 32 | id) to partial[b]; the last block
// to finish (by the ticket in *done) takes the best of those, writes the id
// to out[0] and sets *done back to 0 for the next launch. A minimum does not
// depend on the order it is taken in, so the id is raw_argmax's: the one
// sample_select picks when greedy.
#if !defined(SAMPLE_ARGMAX_THREADS) || !defined(SAMPLE_ARGMAX_BLOCKS)
#error "SAMPLE_ARGMAX_THREADS and SAMPLE_ARGMAX_BLOCKS come from the worker as -D options"
#endif
extern "C" __global__ void __launch_bounds__(SAMPLE_ARGMAX_THREADS)
    sample_argmax(const float* logits, u32 n, u64* partial, u32* done, u32* out) {
    pdl_start();
    __shared__ SampleShared sh;
    __shared__ bool last;
    const u32 chunk = (n + gridDim.x - 1) / gridDim.x;
    const u32 lo = blockIdx.x * chunk, hi = min(n, lo + chunk);
    u64 best = ~0ull;
    for (u32 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const u64 p = ((u64)rank_key(logits[i]) << 32) | i;
        best = p < best ? p : best;
    }
    best = block_min_u64(best, sh);
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = best;
        __threadfence();  // the partial is visible before the ticket is taken
        last = atomicAdd(done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    best = ~0ull;
    for (u32 b = threadIdx.x; b < gridDim.x; b += blockDim.x) {
        const u64 p = __ldcg(partial + b);
        best = p < best ? p : best;
    }
    best = block_min_u64(best, sh);
    if (threadIdx.x == 0) {
        out[0] = (u32)(best & 0xffffffffull);
        *done = 0;
    }
}

// sample_mask_rows (issue #43): the constrained rows of a step, each row's
// logits copied to its sampler's adjusted buffer with every token whose bit
// is clear (bit id % 32 of word id / 32 of the row's mask) at -inf, which
// every kernel above ranks last and never keeps, so the choice and the
// log-probabilities are the allowed tokens' alone, as on the CPU. One launch
// and one copy of the masks for all rows (grid: blocks over n, then rows),
// not a copy, a mask copy and a launch for each. The host builds the masks
// while the step runs.
struct MaskRow {
    const float* logits;
    float* adjusted;
};

#define SAMPLE_MASK_THREADS 256
extern "C" __global__ void __launch_bounds__(SAMPLE_MASK_THREADS)
    sample_mask_rows(const MaskRow* rows, u32 n, const u32* masks, u32 words) {
    pdl_start();
    const MaskRow r = rows[blockIdx.y];
    const u32* allowed = masks + (size_t)blockIdx.y * words;
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) r.adjusted[i] = ((allowed[i >> 5] >> (i & 31)) & 1u) ? r.logits[i] : __int_as_float(0xff800000);
}

// sample_bias (issue #43): a job's logit_bias and presence/frequency
// penalties, one (id, delta bits) pair each in `pairs`, added to its logits
// (the sampler's adjusted copy, after sample_mask_rows where the job is
// constrained: the CPU adds before masking, the same values since a finite
// delta leaves -inf at -inf) and before the pipeline. The host sums each
// id's delta once and sends the ids distinct (so no two threads touch one
// logit) and in the vocabulary; one f32 add per logit, as on the CPU.
#define SAMPLE_BIAS_THREADS 256
extern "C" __global__ void __launch_bounds__(SAMPLE_BIAS_THREADS)
    sample_bias(float* logits, u32 count, const u32* pairs) {
    pdl_start();
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) logits[pairs[2 * i]] += __uint_as_float(pairs[2 * i + 1]);
}
#endif
