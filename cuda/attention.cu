// attention.cu: the f16 KV cache and causal grouped-query attention.
//
// Cache layout, per layer and per K or V: [n_head_kv][capacity][head_dim]
// f16; position p of KV head h is at (h * capacity + p) * head_dim. Strides
// use the capacity, never the filled length.
#include "common.cuh"

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

// out[t][h] = softmax_j(q[t][h] . K[j] / sqrt(head_dim)) V[j] over positions
// j = 0..start_pos + t, with K, V from KV head h / (n_head / n_head_kv).
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
              const u16* __restrict__ v_cache, float scale, float* __restrict__ out) {
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
    for (int base = 0; base < n_ctx; base += ATT_THREADS) {
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
// is split into `nsplit` chunks of `chunk` positions and each block takes one
// KV head and one chunk, for all the query heads that share that KV head
// (each K and V row is read once per group, not once per head). A block
// writes its chunk's softmax state (max, sum of weights, unnormalised output)
// to `part`; attention_combine then merges the chunks of each head in chunk
// order. The grid is fixed by the capacity, not the filled length (so a
// captured graph replays for any position): chunks past the end write an
// empty state. Every sum has a fixed order.
#if !defined(ATS_THREADS) || !defined(ATS_MAX_GROUP) || !defined(ATS_MAX_CHUNK) || !defined(ATS_MAX_SPLITS)
#error "ATS_THREADS, ATS_MAX_GROUP, ATS_MAX_CHUNK and ATS_MAX_SPLITS come from the worker as -D options"
#endif
static_assert(ATS_THREADS % 32 == 0, "whole warps");
#define ATS_WARPS (ATS_THREADS / 32)

// part: [n_head][nsplit][head_dim + 2] floats: max, sum, then output.
extern "C" __global__ void __launch_bounds__(ATS_THREADS)
    attention_split(const float* __restrict__ q, int n_head, int n_head_kv, int head_dim, int start_pos,
                    const int* __restrict__ pos_ptr, int capacity, const u16* __restrict__ k_cache,
                    const u16* __restrict__ v_cache, float scale, int chunk, int nsplit, float* __restrict__ part) {
    __shared__ __align__(16) float qs[ATS_MAX_GROUP][ATT_MAX_HEAD_DIM];
    __shared__ float p[ATS_MAX_GROUP][ATS_MAX_CHUNK];
    __shared__ float red[32];
    __shared__ float ogrp[ATS_WARPS][ATS_MAX_GROUP][ATT_MAX_HEAD_DIM / 2 + 1];
    const int kvh = blockIdx.x, s = blockIdx.y;
    const int group = n_head / n_head_kv;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (pos_ptr) start_pos = *pos_ptr;
    const int n_ctx = min(start_pos + 1, capacity);
    const int j0 = s * chunk, cnt = max(0, min(chunk, n_ctx - j0));
    const int stride = head_dim + 2;
    if (cnt == 0) {
        for (int g = 0; g < group; g++) {
            float* dst = part + ((i64)(kvh * group + g) * nsplit + s) * stride;
            for (int d = tid; d < stride; d += ATS_THREADS) dst[d] = d == 0 ? NEG_INF : 0.0f;
        }
        return;
    }
    for (int i = tid; i < group * head_dim; i += ATS_THREADS) {
        const int g = i / head_dim, d = i % head_dim;
        qs[g][d] = q[(i64)(kvh * group + g) * head_dim + d];
    }
    const u16* kh = k_cache + (i64)kvh * capacity * head_dim;
    const u16* vh = v_cache + (i64)kvh * capacity * head_dim;
    __syncthreads();

    // Scores: thread i takes keys i, i + ATS_THREADS, ... of the chunk, for
    // every head of the group, reading each key row once.
    for (int j = tid; j < cnt; j += ATS_THREADS) {
        const u16* kr = kh + (i64)(j0 + j) * head_dim;
        float sc[ATS_MAX_GROUP];
#pragma unroll
        for (int g = 0; g < ATS_MAX_GROUP; g++) sc[g] = 0.0f;
        // Unrolled so that several loads of the row are in flight at once.
#pragma unroll 8
        for (int d = 0; d < head_dim; d += 8) {
            const uint4 w = *(const uint4*)(kr + d);
            const u32 ws[4] = {w.x, w.y, w.z, w.w};
            float kv[8];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                kv[2 * i] = f16_to_f32((u16)(ws[i] & 0xFFFFu));
                kv[2 * i + 1] = f16_to_f32((u16)(ws[i] >> 16));
            }
#pragma unroll
            for (int g = 0; g < ATS_MAX_GROUP; g++) {
                if (g < group) {
#pragma unroll
                    for (int i = 0; i < 8; i++) sc[g] = fmaf(qs[g][d + i], kv[i], sc[g]);
                }
            }
        }
#pragma unroll
        for (int g = 0; g < ATS_MAX_GROUP; g++)
            if (g < group) p[g][j] = sc[g] * scale;
    }
    __syncthreads();
    // Per head: the chunk's max, then weights and their sum (block reductions in a fixed order).
    float mx[ATS_MAX_GROUP], sum[ATS_MAX_GROUP];
#pragma unroll
    for (int g = 0; g < ATS_MAX_GROUP; g++) {
        if (g >= group) break;
        float m = NEG_INF;
        for (int j = tid; j < cnt; j += ATS_THREADS) m = fmaxf(m, p[g][j]);
        mx[g] = block_max(m, red);
        float e = 0.0f;
        for (int j = tid; j < cnt; j += ATS_THREADS) {
            const float w = expf(p[g][j] - mx[g]);
            p[g][j] = w;
            e += w;
        }
        sum[g] = block_sum(e, red);  // its barriers also publish p[g]
    }
    // Weighted V: warp w takes keys w, w + ATS_WARPS, ...; lane holds dim pairs lane, lane + 32, ...
    float o[ATS_MAX_GROUP][2 * ATT_PAIRS_PER_LANE];
#pragma unroll
    for (int g = 0; g < ATS_MAX_GROUP; g++)
#pragma unroll
        for (int k = 0; k < 2 * ATT_PAIRS_PER_LANE; k++) o[g][k] = 0.0f;
#pragma unroll 8
    for (int j = warp; j < cnt; j += ATS_WARPS) {
        const u32* vr = (const u32*)(vh + (i64)(j0 + j) * head_dim);
#pragma unroll
        for (int k = 0; k < ATT_PAIRS_PER_LANE; k++) {
            const int d2 = lane + 32 * k;
            if (2 * d2 < head_dim) {
                const u32 w = vr[d2];
                const float v0 = f16_to_f32((u16)(w & 0xFFFFu)), v1 = f16_to_f32((u16)(w >> 16));
#pragma unroll
                for (int g = 0; g < ATS_MAX_GROUP; g++) {
                    if (g < group) {
                        o[g][2 * k] = fmaf(p[g][j], v0, o[g][2 * k]);
                        o[g][2 * k + 1] = fmaf(p[g][j], v1, o[g][2 * k + 1]);
                    }
                }
            }
        }
    }
    // Warps' outputs added in warp order, one dim pair at a time. (Unrolled,
    // so that o stays in registers.)
#pragma unroll
    for (int k = 0; k < ATT_PAIRS_PER_LANE; k++) {
        const int d2 = lane + 32 * k;
        if (32 * k >= head_dim / 2) break;  // the same for every thread
#pragma unroll
        for (int half = 0; half < 2; half++) {
            if (2 * d2 < head_dim) {
#pragma unroll
                for (int g = 0; g < ATS_MAX_GROUP; g++)
                    if (g < group) ogrp[warp][g][d2] = o[g][2 * k + half];
            }
            __syncthreads();
            for (int i = tid; i < group * 32; i += ATS_THREADS) {
                const int g = i / 32, dd = 32 * k + i % 32;  // the pairs written in this round
                if (2 * dd >= head_dim) continue;
                float acc = 0.0f;
                for (int w = 0; w < ATS_WARPS; w++) acc += ogrp[w][g][dd];
                part[((i64)(kvh * group + g) * nsplit + s) * stride + 2 + 2 * dd + half] = acc;
            }
            __syncthreads();
        }
    }
    if (tid == 0) {
#pragma unroll
        for (int g = 0; g < ATS_MAX_GROUP; g++) {
            if (g >= group) break;
            float* dst = part + ((i64)(kvh * group + g) * nsplit + s) * stride;
            dst[0] = mx[g];
            dst[1] = sum[g];
        }
    }
}

// out[h] = the merge of head h's chunk states, in chunk order. One block per
// head; the chunks' weights are computed once into shared memory so that the
// output loop's loads do not wait on one another.
extern "C" __global__ void attention_combine(const float* __restrict__ part, int n_head, int head_dim, int nsplit,
                                             float* __restrict__ out) {
    __shared__ float wgt[ATS_MAX_SPLITS];
    __shared__ float red[32];
    const int h = blockIdx.x, tid = threadIdx.x;
    if (h >= n_head) return;
    const int stride = head_dim + 2;
    const float* ph = part + (i64)h * nsplit * stride;
    float m = NEG_INF;
    for (int s = tid; s < nsplit; s += blockDim.x) m = fmaxf(m, ph[(i64)s * stride]);
    m = block_max(m, red);
    float l = 0.0f;
    for (int s = tid; s < nsplit; s += blockDim.x) {
        const float ls = ph[(i64)s * stride + 1];
        const float a = ls == 0.0f ? 0.0f : expf(ph[(i64)s * stride] - m);  // 0: an empty chunk
        wgt[s] = a;
        l = fmaf(ls, a, l);
    }
    l = block_sum(l, red);  // its barriers also publish wgt
    for (int d = tid; d < head_dim; d += blockDim.x) {
        float o = 0.0f;
#pragma unroll 16
        for (int s = 0; s < nsplit; s++) o = fmaf(ph[(i64)s * stride + 2 + d], wgt[s], o);
        out[(i64)h * head_dim + d] = o / l;
    }
}
