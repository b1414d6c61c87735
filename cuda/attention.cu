// attention.cu: the f16 KV cache and causal grouped-query attention.
//
// Cache layout, per layer and per K or V: [n_head_kv][capacity][head_dim]
// f16; position p of KV head h is at (h * capacity + p) * head_dim. Strides
// use the capacity, never the filled length.
#include "common.cuh"

// The first cached position a query at `pos` sees: 0, or with a sliding
// window of swa > 0 positions (itself included) pos + 1 - swa.
__device__ __forceinline__ int first_visible(int pos, int swa) { return swa > 0 ? max(0, pos + 1 - swa) : 0; }

// Writes rows t of k and v ([n, n_head_kv * head_dim] f32) to positions
// start_pos + t of the layer's cache planes, rounded to f16. Positions past
// the capacity are dropped (the host refuses them before launching).
// start_pos is read from pos_ptr when that is not null (graph replay).
extern "C" __global__ void kv_store(const float* __restrict__ k, const float* __restrict__ v, int n, int n_head_kv,
                                    int head_dim, int start_pos, const int* __restrict__ pos_ptr, int capacity,
                                    u16* __restrict__ k_cache, u16* __restrict__ v_cache) {
    if (pos_ptr) start_pos = *pos_ptr;
    const int kv_dim = n_head_kv * head_dim;
    const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (i64)n * kv_dim) return;
    const int t = (int)(idx / kv_dim), j = (int)(idx % kv_dim);
    const int h = j / head_dim, d = j % head_dim;
    if (start_pos + t >= capacity) return;
    const i64 dst = ((i64)h * capacity + start_pos + t) * head_dim + d;
    k_cache[dst] = f32_to_f16(k[idx]);
    v_cache[dst] = f32_to_f16(v[idx]);
}

// Shared with the host's launch geometry: defined once in the worker
// (backend/cuda/source.rs) and passed to NVRTC as -D options.
#if !defined(ATT_THREADS) || !defined(ATT_MAX_HEAD_DIM)
#error "ATT_THREADS and ATT_MAX_HEAD_DIM come from the worker as -D options"
#endif
static_assert(ATT_THREADS % 32 == 0 && ATT_MAX_HEAD_DIM % 64 == 0, "whole warps, and whole dim pairs per lane");
#define ATT_WARPS (ATT_THREADS / 32)
#define ATT_PAIRS_PER_LANE (ATT_MAX_HEAD_DIM / 64)

// Dot product of q (shared, f32) with one cached f16 row of head_dim values.
__device__ __forceinline__ float dot_q_k(const float* __restrict__ q, const u16* __restrict__ k, int head_dim) {
    float s = 0.0f;
    if ((head_dim & 7) == 0) {
#pragma unroll 8
        for (int d = 0; d < head_dim; d += 8) {
            const uint4 w = *(const uint4*)(k + d);
            const u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                s = fmaf(q[d + 2 * i], f16_to_f32((u16)(ws[i] & 0xFFFFu)), s);
                s = fmaf(q[d + 2 * i + 1], f16_to_f32((u16)(ws[i] >> 16)), s);
            }
        }
    } else {
        for (int d = 0; d < head_dim; d++) s = fmaf(q[d], f16_to_f32(k[d]), s);
    }
    return s;
}

// out[t][h] = softmax_j(scale * q[t][h] . K[j]) V[j] over positions
// j = 0..start_pos + t, with K, V from KV head h / (n_head / n_head_kv); with
// a sliding window (swa > 0) only the swa positions up to start_pos + t.
// start_pos is read from pos_ptr when that is not null (graph replay).
//
// One block of ATT_THREADS per (row t, head h). Keys are taken ATT_THREADS at
// a time: thread i scores key i of the chunk on its own; the block finds the
// chunk's maximum and the sum of its weights (online softmax: earlier sums and
// outputs are rescaled when the maximum grows); then warp w accumulates
// weight * V over keys w, w + ATT_WARPS, ... with each lane holding dim
// pairs lane, lane + 32, ... . At the end the warps' outputs are added in warp
// order. Every sum has a fixed order. head_dim must be even.
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
    attention(const float* __restrict__ q, int n, int n_head, int n_head_kv, int head_dim, int start_pos,
              const int* __restrict__ pos_ptr, int capacity, const u16* __restrict__ k_cache,
              const u16* __restrict__ v_cache, float scale, int swa, float* __restrict__ out) {
    __shared__ __align__(16) float qs[ATT_MAX_HEAD_DIM];
    __shared__ float p[ATT_THREADS];
    __shared__ float red[32];
    __shared__ float part[ATT_WARPS][ATT_MAX_HEAD_DIM];
    const int t = blockIdx.x, h = blockIdx.y;
    if (t >= n || h >= n_head) return;
    if (pos_ptr) start_pos = *pos_ptr;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kvh = h / (n_head / n_head_kv);
    const int n_ctx = min(start_pos + t + 1, capacity);
    const int first = first_visible(start_pos + t, swa);
    const float* qrow = q + ((i64)t * n_head + h) * head_dim;
    for (int d = tid; d < head_dim; d += ATT_THREADS) qs[d] = qrow[d];
    const u16* kh = k_cache + (i64)kvh * capacity * head_dim;
    const u16* vh = v_cache + (i64)kvh * capacity * head_dim;
    __syncthreads();

    // Lane `lane` accumulates dims 2 * (lane + 32 k) and the one after (head_dim is even).
    float m = NEG_INF, l = 0.0f;
    float o[2 * ATT_PAIRS_PER_LANE];
#pragma unroll
    for (int k = 0; k < 2 * ATT_PAIRS_PER_LANE; k++) o[k] = 0.0f;
    for (int base = first; base < n_ctx; base += ATT_THREADS) {
        const int cnt = min(ATT_THREADS, n_ctx - base);
        const float sc = tid < cnt ? dot_q_k(qs, kh + (i64)(base + tid) * head_dim, head_dim) * scale : NEG_INF;
        const float m_new = fmaxf(m, block_max(sc, red));
        const float alpha = expf(m - m_new);  // 0 on the first chunk (m = -inf)
        const float e = tid < cnt ? expf(sc - m_new) : 0.0f;
        p[tid] = e;
        l = l * alpha + block_sum(e, red);  // block_sum's barriers also publish p
#pragma unroll
        for (int k = 0; k < 2 * ATT_PAIRS_PER_LANE; k++) o[k] *= alpha;
        // Unrolled so that several keys' loads are in flight at once.
#pragma unroll 8
        for (int j = warp; j < cnt; j += ATT_WARPS) {
            const u32* vr = (const u32*)(vh + (i64)(base + j) * head_dim);
            const float pj = p[j];
#pragma unroll
            for (int k = 0; k < ATT_PAIRS_PER_LANE; k++) {
                const int d2 = lane + 32 * k;
                if (2 * d2 < head_dim) {
                    const u32 w = vr[d2];
                    o[2 * k] = fmaf(pj, f16_to_f32((u16)(w & 0xFFFFu)), o[2 * k]);
                    o[2 * k + 1] = fmaf(pj, f16_to_f32((u16)(w >> 16)), o[2 * k + 1]);
                }
            }
        }
        m = m_new;
        __syncthreads();  // p is rewritten by the next chunk
    }
#pragma unroll
    for (int k = 0; k < ATT_PAIRS_PER_LANE; k++) {
        const int d2 = lane + 32 * k;
        if (2 * d2 < head_dim) {
            part[warp][2 * d2] = o[2 * k];
            part[warp][2 * d2 + 1] = o[2 * k + 1];
        }
    }
    __syncthreads();
    float* orow = out + ((i64)t * n_head + h) * head_dim;
    const float inv = 1.0f / l;
    for (int d = tid; d < head_dim; d += ATT_THREADS) {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) s += part[w][d];
        orow[d] = s * inv;
    }
}

// ---- Decode over a long context: the context split across blocks ----------
//
// For one query row (decode) the kernel above runs one block per head, so a
// 32-head model keeps 32 SMs busy however long the context. Here the context
// of n_ctx positions is cut into `nsplit` chunks of ceil(n_ctx / nsplit)
// positions and each block takes one KV head and one chunk, for all the query
// heads that share that KV head (each K and V row is read once per group,
// not once per head). n_ctx is read on the device when pos_ptr is set, so a
// captured graph replays at any position with every block busy.
//
// Each warp runs its own online softmax over keys w, w + ATS_WARPS, ... of
// the chunk, ATS_KEYS keys at a time: their K and V rows are all loaded
// before any is used (lanes over dim pairs: each row one coalesced read),
// which keeps enough reads in flight to stream the cache. A score is summed
// across the warp by a butterfly (every lane gets the same bits). The block
// then merges its warps' states in warp order and writes the chunk's state
// (max, sum of weights, unnormalised output) to `part`; attention_combine
// merges the chunks of each head in chunk order. Every sum has a fixed order.
#if !defined(ATS_THREADS) || !defined(ATS_MAX_GROUP) || !defined(ATS_KEYS) || !defined(ATS_MAX_SPLITS)
#error "ATS_THREADS, ATS_MAX_GROUP, ATS_KEYS and ATS_MAX_SPLITS come from the worker as -D options"
#endif
static_assert(ATS_THREADS % 32 == 0, "whole warps");
#define ATS_WARPS (ATS_THREADS / 32)

// PPL: dim pairs per lane (head_dim <= 64 * PPL); G: most query heads per
// KV head. One instance per class, so that q and the outputs stay in
// registers and a group of 4 (Llama 3) neither computes nor holds 8 heads'
// (at 8 it ran 3 blocks an SM, bound by registers and instruction latency).
// part: [n_head][nsplit][head_dim + 2] floats: max, sum, then output.
template <int PPL, int G>
__device__ __forceinline__ void attention_split_impl(const float* __restrict__ q, int n_head, int n_head_kv,
                                                     int head_dim, int start_pos, const int* __restrict__ pos_ptr,
                                                     int capacity, const u16* __restrict__ k_cache,
                                                     const u16* __restrict__ v_cache, float scale, int swa,
                                                     int nsplit, float* __restrict__ part) {
    __shared__ float ow[ATS_WARPS][ATT_MAX_HEAD_DIM];
    __shared__ float mw[ATS_WARPS][G], lw[ATS_WARPS][G];
    const int kvh = blockIdx.x, s = blockIdx.y;
    const int group = n_head / n_head_kv;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (pos_ptr) start_pos = *pos_ptr;
    const int n_ctx = min(start_pos + 1, capacity), first = first_visible(start_pos, swa);
    const int chunk = (n_ctx - first + nsplit - 1) / nsplit;
    const int j0 = first + s * chunk, cnt = max(0, min(chunk, n_ctx - j0));
    const int stride = head_dim + 2, npairs = head_dim >> 1;
    if (cnt == 0) {
        for (int g = 0; g < group; g++) {
            float* dst = part + ((i64)(kvh * group + g) * nsplit + s) * stride;
            for (int d = tid; d < stride; d += ATS_THREADS) dst[d] = d == 0 ? NEG_INF : 0.0f;
        }
        return;
    }
    // The lane's dim pairs of each query head, scaled.
    float2 qv[G][PPL];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float2* qh = (const float2*)(q + (i64)(kvh * group + min(g, group - 1)) * head_dim);
#pragma unroll
        for (int k = 0; k < PPL; k++) {
            const int pr = lane + 32 * k;
            const float2 v = g < group && pr < npairs ? qh[pr] : make_float2(0.0f, 0.0f);
            qv[g][k] = make_float2(v.x * scale, v.y * scale);
        }
    }
    float m[G], l[G];
    float2 o[G][PPL];
#pragma unroll
    for (int g = 0; g < G; g++) {
        m[g] = NEG_INF;
        l[g] = 0.0f;
#pragma unroll
        for (int k = 0; k < PPL; k++) o[g][k] = make_float2(0.0f, 0.0f);
    }
    const u32* kh = (const u32*)(k_cache + (i64)kvh * capacity * head_dim);
    const u32* vh = (const u32*)(v_cache + (i64)kvh * capacity * head_dim);
    for (int base = warp; base < cnt; base += ATS_WARPS * ATS_KEYS) {
        u32 kr[ATS_KEYS][PPL], vr[ATS_KEYS][PPL];
#pragma unroll
        for (int u = 0; u < ATS_KEYS; u++) {
            const int j = base + u * ATS_WARPS;
            const i64 row = (i64)(j0 + min(j, cnt - 1)) * npairs;
#pragma unroll
            for (int k = 0; k < PPL; k++) {
                const int pr = lane + 32 * k;
                const bool in = j < cnt && pr < npairs;
                kr[u][k] = in ? kh[row + pr] : 0u;
                vr[u][k] = in ? vh[row + pr] : 0u;
            }
        }
        // Every score of the batch, then their butterfly sums side by side
        // (independent shuffles in flight, not one chain per key).
        float sc[ATS_KEYS][G];
#pragma unroll
        for (int u = 0; u < ATS_KEYS; u++) {
            float2 kf[PPL];
#pragma unroll
            for (int k = 0; k < PPL; k++)
                kf[k] = make_float2(f16_to_f32((u16)(kr[u][k] & 0xFFFFu)), f16_to_f32((u16)(kr[u][k] >> 16)));
#pragma unroll
            for (int g = 0; g < G; g++) {
                if (g >= group) break;  // the same for every thread
                float acc = 0.0f;
#pragma unroll
                for (int k = 0; k < PPL; k++) {
                    acc = fmaf(qv[g][k].x, kf[k].x, acc);
                    acc = fmaf(qv[g][k].y, kf[k].y, acc);
                }
                sc[u][g] = acc;
            }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
            for (int u = 0; u < ATS_KEYS; u++)
#pragma unroll
                for (int g = 0; g < G; g++)
                    if (g < group) sc[u][g] += __shfl_xor_sync(FULL_MASK, sc[u][g], off);
        }
        // Online softmax over the batch: one rescale per head, the keys'
        // weights and values added in key order. Keys past the chunk (the
        // same for the whole warp) weigh nothing.
        const int nk = min(ATS_KEYS, (cnt - base + ATS_WARPS - 1) / ATS_WARPS);
        float2 vf[ATS_KEYS][PPL];
#pragma unroll
        for (int u = 0; u < ATS_KEYS; u++)
#pragma unroll
            for (int k = 0; k < PPL; k++)
                vf[u][k] = make_float2(f16_to_f32((u16)(vr[u][k] & 0xFFFFu)), f16_to_f32((u16)(vr[u][k] >> 16)));
#pragma unroll
        for (int g = 0; g < G; g++) {
            if (g >= group) break;  // the same for every thread
            float mx = m[g];
#pragma unroll
            for (int u = 0; u < ATS_KEYS; u++)
                if (u < nk) mx = fmaxf(mx, sc[u][g]);
            const float alpha = expf(m[g] - mx);  // 0 at the first batch (m = -inf)
            float p[ATS_KEYS], psum = 0.0f;
#pragma unroll
            for (int u = 0; u < ATS_KEYS; u++) {
                p[u] = u < nk ? expf(sc[u][g] - mx) : 0.0f;
                psum += p[u];
            }
            l[g] = fmaf(l[g], alpha, psum);
#pragma unroll
            for (int k = 0; k < PPL; k++) {
                float ox = o[g][k].x * alpha, oy = o[g][k].y * alpha;
#pragma unroll
                for (int u = 0; u < ATS_KEYS; u++) {
                    ox = fmaf(p[u], vf[u][k].x, ox);
                    oy = fmaf(p[u], vf[u][k].y, oy);
                }
                o[g][k] = make_float2(ox, oy);
            }
            m[g] = mx;
        }
    }
    // The warps' states merged in warp order, one head at a time. (Unrolled,
    // so that o stays in registers.) A warp without keys has m = -inf.
    if (lane == 0) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            mw[warp][g] = m[g];
            lw[warp][g] = l[g];
        }
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (g >= group) break;  // the same for every thread
#pragma unroll
        for (int k = 0; k < PPL; k++) {
            const int pr = lane + 32 * k;
            if (pr < npairs) {
                ow[warp][2 * pr] = o[g][k].x;
                ow[warp][2 * pr + 1] = o[g][k].y;
            }
        }
        __syncthreads();
        float mx = NEG_INF;
        for (int w = 0; w < ATS_WARPS; w++) mx = fmaxf(mx, mw[w][g]);
        float* dst = part + ((i64)(kvh * group + g) * nsplit + s) * stride;
        for (int d = tid; d < head_dim; d += ATS_THREADS) {
            float acc = 0.0f;
            for (int w = 0; w < ATS_WARPS; w++)
                if (mw[w][g] != NEG_INF) acc = fmaf(ow[w][d], expf(mw[w][g] - mx), acc);
            dst[2 + d] = acc;
        }
        if (tid == 0) {
            float sum = 0.0f;
            for (int w = 0; w < ATS_WARPS; w++)
                if (mw[w][g] != NEG_INF) sum = fmaf(lw[w][g], expf(mw[w][g] - mx), sum);
            dst[0] = mx;
            dst[1] = sum;
        }
        __syncthreads();
    }
}

#define ATTENTION_SPLIT(NAME, PPL, G)                                                                            \
    extern "C" __global__ void __launch_bounds__(ATS_THREADS)                                                    \
        NAME(const float* __restrict__ q, int n_head, int n_head_kv, int head_dim, int start_pos,                \
             const int* __restrict__ pos_ptr, int capacity, const u16* __restrict__ k_cache,                     \
             const u16* __restrict__ v_cache, float scale, int swa, int nsplit, float* __restrict__ part) {      \
        attention_split_impl<PPL, G>(q, n_head, n_head_kv, head_dim, start_pos, pos_ptr, capacity, k_cache,       \
                                     v_cache, scale, swa, nsplit, part);                                         \
    }
static_assert(ATS_MAX_GROUP == 8, "the instances below take groups of up to 4 or 8 heads");
ATTENTION_SPLIT(attention_split_64_g4, 1, 4)
ATTENTION_SPLIT(attention_split_64_g8, 1, 8)
ATTENTION_SPLIT(attention_split_128_g4, 2, 4)
ATTENTION_SPLIT(attention_split_128_g8, 2, 8)
ATTENTION_SPLIT(attention_split_256_g4, 4, 4)
ATTENTION_SPLIT(attention_split_256_g8, 4, 8)

// out[h] = the merge of head h's chunk states, in chunk order. One block of
// ATSC_THREADS per head; the chunks' weights are computed once into shared
// memory. Warp w adds chunks w, w + ATSC_WARPS, ... (lanes over dims, so each
// chunk's output is one coalesced read, and the reads of different chunks
// are independent); the warps' sums are then added in warp order.
#if !defined(ATSC_THREADS)
#error "ATSC_THREADS comes from the worker as a -D option"
#endif
static_assert(ATSC_THREADS % 32 == 0, "whole warps");
#define ATSC_WARPS (ATSC_THREADS / 32)
extern "C" __global__ void __launch_bounds__(ATSC_THREADS)
    attention_combine(const float* __restrict__ part, int n_head, int head_dim, int nsplit, float* __restrict__ out) {
    __shared__ float wgt[ATS_MAX_SPLITS];
    __shared__ float red[32];
    __shared__ float accw[ATSC_WARPS][ATT_MAX_HEAD_DIM];
    const int h = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (h >= n_head) return;
    const int stride = head_dim + 2;
    const float* ph = part + (i64)h * nsplit * stride;
    float m = NEG_INF;
    for (int s = tid; s < nsplit; s += ATSC_THREADS) m = fmaxf(m, ph[(i64)s * stride]);
    m = block_max(m, red);
    float l = 0.0f;
    for (int s = tid; s < nsplit; s += ATSC_THREADS) {
        const float ls = ph[(i64)s * stride + 1];
        const float a = ls == 0.0f ? 0.0f : expf(ph[(i64)s * stride] - m);  // 0: an empty chunk
        wgt[s] = a;
        l = fmaf(ls, a, l);
    }
    l = block_sum(l, red);  // its barriers also publish wgt
    float acc[2 * ATT_PAIRS_PER_LANE];
#pragma unroll
    for (int k = 0; k < 2 * ATT_PAIRS_PER_LANE; k++) acc[k] = 0.0f;
#pragma unroll 4
    for (int s = warp; s < nsplit; s += ATSC_WARPS) {
        const float* ps = ph + (i64)s * stride + 2;
        const float a = wgt[s];
#pragma unroll
        for (int k = 0; k < 2 * ATT_PAIRS_PER_LANE; k++) {
            const int d = lane + 32 * k;
            if (d < head_dim) acc[k] = fmaf(ps[d], a, acc[k]);
        }
    }
#pragma unroll
    for (int k = 0; k < 2 * ATT_PAIRS_PER_LANE; k++) {
        const int d = lane + 32 * k;
        if (d < head_dim) accw[warp][d] = acc[k];
    }
    __syncthreads();
    for (int d = tid; d < head_dim; d += ATSC_THREADS) {
        float o = 0.0f;
        for (int w = 0; w < ATSC_WARPS; w++) o += accw[w][d];
        out[(i64)h * head_dim + d] = o / l;
    }
}

// ---- Prefill: flash attention on tensor cores ------------------------------
//
// out as `attention` computes it, for many query rows at once: one block of
// ATC_THREADS (4 warps) takes ATC_BQ = 64 query rows of one head (16 a
// warp) and walks the keys that any of them sees, ATC_BK = 64 at a time,
// with the online softmax of `attention`. Scores and the weighted sum of V
// are products on the tensor cores (m16n8k16, f16 in, f32 accumulation): q
// (scaled by scale * log2 e) and the weights p are each split into an f16
// high part and the f16 rounding of the rest, and both are multiplied (K and
// V are f16 in the cache: exact), which keeps about f32 accuracy. Every sum
// has a fixed order; a row's result does not depend on the rows beside it.
#if !defined(ATC_THREADS) || !defined(ATC_BQ) || !defined(ATC_BK)
#error "ATC_THREADS, ATC_BQ and ATC_BK come from the worker as -D options"
#endif
static_assert(ATC_THREADS == 128 && ATC_BQ == 64 && ATC_BK == 64, "the warp layout below assumes these");

// Shared-memory row stride in halves: 8 halves of padding, so the eight rows
// one ldmatrix reads start in distinct 16-byte bank groups.
template <int D>
__device__ __forceinline__ constexpr int atc_stride() { return D + 8; }

template <int D>
__device__ __forceinline__ void attention_tc_impl(const float* __restrict__ q, int n, int n_head, int n_head_kv,
                                                  int start_pos, int capacity, const u16* __restrict__ k_cache,
                                                  const u16* __restrict__ v_cache, float scale, int swa,
                                                  float* __restrict__ out) {
    constexpr int S = atc_stride<D>(), NT = D / 8, KS = D / 16;
    extern __shared__ __align__(16) u16 atc_smem[];
    u16* qh = atc_smem;           // [ATC_BQ][S] high parts of q
    u16* ql = qh + ATC_BQ * S;    // [ATC_BQ][S] low parts
    u16* ks = ql + ATC_BQ * S;    // [ATC_BK][S] keys of the current tile
    u16* vs = ks + ATC_BK * S;    // [ATC_BK][S] values
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, qd = lane & 3;
    const int q0 = blockIdx.x * ATC_BQ, h = blockIdx.y;
    const int kvh = h / (n_head / n_head_kv);
    const int rows = min(ATC_BQ, n - q0);
    // Keys 0..n_ctx-1 exist; the block's last row sees up to start_pos + q0 + rows - 1.
    const int n_ctx = min(start_pos + q0 + rows, capacity);
    const u16* kh = k_cache + (i64)kvh * capacity * D;
    const u16* vh = v_cache + (i64)kvh * capacity * D;

    // q rows (zeros past n), scaled so that exp2 gives the softmax weights.
    const float qscale = scale * 1.4426950408889634f;
    for (int i = tid; i < ATC_BQ * D / 4; i += ATC_THREADS) {
        const int r = i / (D / 4), d = 4 * (i % (D / 4));
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < rows) v = *(const float4*)(q + ((i64)(q0 + r) * n_head + h) * D + d);
        u32 h0, l0, h1, l1;
        split_f16x2(v.x * qscale, v.y * qscale, h0, l0);
        split_f16x2(v.z * qscale, v.w * qscale, h1, l1);
        *(uint2*)(qh + r * S + d) = make_uint2(h0, h1);
        *(uint2*)(ql + r * S + d) = make_uint2(l0, l1);
    }

    // This thread's rows of the warp's 16: wr + g and wr + g + 8, at these positions.
    const int wr = warp * 16;
    const int pos0 = start_pos + q0 + wr + g, pos1 = pos0 + 8;
    const int warp_last = start_pos + q0 + min(wr + 15, rows - 1);  // the warp's last row sees up to here
    const int warp_first = first_visible(start_pos + q0 + wr, swa);  // and its first row from here
    float o[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
    const u32 qh_a = shared_addr(qh), ql_a = shared_addr(ql), ks_a = shared_addr(ks), vs_a = shared_addr(vs);

    // The first tile any row of the block sees.
    const int k_begin = first_visible(start_pos + q0, swa) / ATC_BK * ATC_BK;
    for (int k0 = k_begin; k0 < n_ctx; k0 += ATC_BK) {
        __syncthreads();  // the previous tile is no longer read (and q is staged)
        for (int i = tid; i < ATC_BK * D / 8; i += ATC_THREADS) {
            const int r = i / (D / 8), d = 8 * (i % (D / 8));
            uint4 kv = make_uint4(0u, 0u, 0u, 0u), vv = kv;
            if (k0 + r < n_ctx) {
                kv = *(const uint4*)(kh + (i64)(k0 + r) * D + d);
                vv = *(const uint4*)(vh + (i64)(k0 + r) * D + d);
            }
            *(uint4*)(ks + r * S + d) = kv;
            *(uint4*)(vs + r * S + d) = vv;
        }
        __syncthreads();
        if (wr >= rows || k0 > warp_last || k0 + ATC_BK <= warp_first) continue;  // nothing this warp sees

        // Scores of the warp's 16 rows with the tile's 64 keys: 8 tiles of 8 keys.
        float s[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            u32 ah[4], al[4];
            const u32 qoff = ((wr + (lane & 7) + 8 * ((lane >> 3) & 1)) * S + 16 * kk + 8 * (lane >> 4)) * 2;
            ldmatrix_x4(ah, qh_a + qoff);
            ldmatrix_x4(al, ql_a + qoff);
#pragma unroll
            for (int p = 0; p < 4; p++) {
                u32 b[4];
                const int key = 16 * p + (lane & 7) + 8 * (lane >> 4);
                ldmatrix_x4(b, ks_a + (key * S + 16 * kk + 8 * ((lane >> 3) & 1)) * 2);
                // The small part first, so the large one is added last.
                mma_f16(s[2 * p], al, b[0], b[1]);
                mma_f16(s[2 * p], ah, b[0], b[1]);
                mma_f16(s[2 * p + 1], al, b[2], b[3]);
                mma_f16(s[2 * p + 1], ah, b[2], b[3]);
            }
        }
        // Causal mask and the tile's row maxima (lanes of a quad share rows).
        float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int key = k0 + 8 * j + 2 * qd + c;
                if (key > pos0 || key >= n_ctx || key < first_visible(pos0, swa)) s[j][c] = NEG_INF;
                if (key > pos1 || key >= n_ctx || key < first_visible(pos1, swa)) s[j][2 + c] = NEG_INF;
                mx0 = fmaxf(mx0, s[j][c]);
                mx1 = fmaxf(mx1, s[j][2 + c]);
            }
        mx0 = fmaxf(mx0, __shfl_xor_sync(FULL_MASK, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(FULL_MASK, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(FULL_MASK, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(FULL_MASK, mx1, 2));
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        // A row that has seen no key yet (past n, or masked so far) keeps base 0: no inf - inf.
        const float b0 = mn0 == NEG_INF ? 0.0f : mn0, b1 = mn1 == NEG_INF ? 0.0f : mn1;
        const float a0 = exp2f(m0 - b0), a1 = exp2f(m1 - b1);
        m0 = mn0;
        m1 = mn1;
        l0 *= a0;
        l1 *= a1;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            o[j][0] *= a0;
            o[j][1] *= a0;
            o[j][2] *= a1;
            o[j][3] *= a1;
        }
        // Weights, their sums (this thread's share; the quad's are added at
        // the end), and the weighted V, 16 keys at a time.
#pragma unroll
        for (int t = 0; t < 4; t++) {
            u32 ph[4], pl[4];
#pragma unroll
            for (int half = 0; half < 2; half++) {
                float* sj = s[2 * t + half];
                const float p0 = exp2f(sj[0] - b0), p1 = exp2f(sj[1] - b0);
                const float p2 = exp2f(sj[2] - b1), p3 = exp2f(sj[3] - b1);
                l0 += p0 + p1;
                l1 += p2 + p3;
                split_f16x2(p0, p1, ph[2 * half], pl[2 * half]);
                split_f16x2(p2, p3, ph[2 * half + 1], pl[2 * half + 1]);
            }
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                u32 b[4];
                const int key = 16 * t + (lane & 7) + 8 * ((lane >> 3) & 1);
                ldmatrix_x4_trans(b, vs_a + (key * S + 8 * j + 8 * (lane >> 4)) * 2);
                mma_f16(o[j], pl, b[0], b[1]);
                mma_f16(o[j], ph, b[0], b[1]);
                mma_f16(o[j + 1], pl, b[2], b[3]);
                mma_f16(o[j + 1], ph, b[2], b[3]);
            }
        }
    }
    // Row sums over the quad, then the normalised rows.
    l0 += __shfl_xor_sync(FULL_MASK, l0, 1);
    l0 += __shfl_xor_sync(FULL_MASK, l0, 2);
    l1 += __shfl_xor_sync(FULL_MASK, l1, 1);
    l1 += __shfl_xor_sync(FULL_MASK, l1, 2);
    const int r0 = wr + g, r1 = r0 + 8;
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int d = 8 * j + 2 * qd;
        if (r0 < rows) *(float2*)(out + ((i64)(q0 + r0) * n_head + h) * D + d) = make_float2(o[j][0] / l0, o[j][1] / l0);
        if (r1 < rows) *(float2*)(out + ((i64)(q0 + r1) * n_head + h) * D + d) = make_float2(o[j][2] / l1, o[j][3] / l1);
    }
}

// The head sizes with a tensor-core path; the host sends others to `attention`.
extern "C" __global__ void __launch_bounds__(ATC_THREADS)
    attention_tc(const float* __restrict__ q, int n, int n_head, int n_head_kv, int head_dim, int start_pos,
                 const int* __restrict__ pos_ptr, int capacity, const u16* __restrict__ k_cache,
                 const u16* __restrict__ v_cache, float scale, int swa, float* __restrict__ out) {
    if (pos_ptr) start_pos = *pos_ptr;
    if (blockIdx.x * ATC_BQ >= n || blockIdx.y >= n_head) return;
    if (head_dim == 64) {
        attention_tc_impl<64>(q, n, n_head, n_head_kv, start_pos, capacity, k_cache, v_cache, scale, swa, out);
    } else if (head_dim == 128) {
        attention_tc_impl<128>(q, n, n_head, n_head_kv, start_pos, capacity, k_cache, v_cache, scale, swa, out);
    }
}
