// attention.cu: the KV store and causal grouped-query attention, one
// block per query row and head (short contexts; head sizes without a
// tensor-core path). The cache layout is in attention.cuh and common.cuh.
#include "attention.cuh"

// Writes rows t of k and v ([n, n_head_kv * head_dim] f32) to positions
// start_pos + t of the layer's cache planes, as kv_put stores them (a
// quantized cache: the thread of each block's first value stores the
// block). Positions past the capacity are dropped (the host refuses them
// before launching).
// start_pos is read from pos_ptr when that is not null (graph replay).
extern "C" __global__ void kv_store(const float* __restrict__ k, const float* __restrict__ v, int n, int n_head_kv,
                                    int head_dim, int start_pos, const int* __restrict__ pos_ptr, int capacity,
                                    u16* __restrict__ k_cache, u16* __restrict__ v_cache) {
    pdl_start();
    if (pos_ptr) start_pos = *pos_ptr;
    const int kv_dim = n_head_kv * head_dim;
    const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (i64)n * kv_dim) return;
    const int t = (int)(idx / kv_dim), j = (int)(idx % kv_dim);
    const int h = j / head_dim, d = j % head_dim;
    if (start_pos + t >= capacity || d % KV_BLOCK != 0) return;
    kv_put(k_cache, n_head_kv, capacity, head_dim, h, start_pos + t, d, k + idx);
    kv_put(v_cache, n_head_kv, capacity, head_dim, h, start_pos + t, d, v + idx);
}

// Dot product of q (shared, f32) with cached row pos of head_dim values.
__device__ __forceinline__ float dot_q_k(const float* __restrict__ q, const KvHead& k, int pos, int head_dim) {
    float s = 0.0f;
    if ((head_dim & 7) == 0) {
#pragma unroll 8
        for (int d = 0; d < head_dim; d += 8) {
            const uint4 w = kv_load8(k, pos, d);
            const u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                s = fmaf(q[d + 2 * i], f16_to_f32((u16)(ws[i] & 0xFFFFu)), s);
                s = fmaf(q[d + 2 * i + 1], f16_to_f32((u16)(ws[i] >> 16)), s);
            }
        }
    } else {
        for (int d = 0; d < head_dim; d++) s = fmaf(q[d], kv_load1(k, pos, d), s);
    }
    return s;
}

// out[t][h] = softmax_j(scale * q[t][h] . K[j]) V[j] over positions
// j = 0..start_pos + t, with K, V from KV head h / (n_head / n_head_kv); with
// a sliding window (swa > 0) only the swa positions up to start_pos + t.
// start_pos is read from pos_ptr when that is not null (graph replay).
// With sinks (gpt-oss), head h's softmax also counts exp(sinks[h]) in its
// denominator: the running maximum and sum start from the sink's logit.
//
// One block of ATT_THREADS per (row t, head h). Keys are taken ATT_THREADS at
// a time: thread i scores key i of the chunk on its own; the block finds the
// chunk's maximum and the sum of its weights (online softmax: earlier sums and
// outputs are rescaled when the maximum grows); then warp w accumulates
// weight * V over keys w, w + ATT_WARPS, ... with each lane holding dim
// pairs lane, lane + 32, ... . At the end the warps' outputs are added in warp
// order. Every sum has a fixed order. head_dim must be even.
// With xh set (one row, head_dim a multiple of 32), out is also split for
// the output projection's mat-vec as quantize_x8 splits it, saving that
// launch in decode.
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
    attention(const float* __restrict__ q, int n, int n_head, int n_head_kv, int head_dim, int start_pos,
              const int* __restrict__ pos_ptr, int capacity, const u16* __restrict__ k_cache,
              const u16* __restrict__ v_cache, float scale, int swa, const float* __restrict__ sinks,
              float* __restrict__ out, i8* __restrict__ xh,
              i8* __restrict__ xl, float* __restrict__ xd, float* __restrict__ xs) {
    pdl_start();
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
    const KvHead kh = kv_head(k_cache, n_head_kv, capacity, head_dim, kvh);
    const KvHead vh = kv_head(v_cache, n_head_kv, capacity, head_dim, kvh);
    __syncthreads();

    // Lane `lane` accumulates dims 2 * (lane + 32 k) and the one after (head_dim is even).
    float m = sinks ? sinks[h] : NEG_INF, l = sinks ? 1.0f : 0.0f;
    float o[2 * ATT_PAIRS_PER_LANE];
#pragma unroll
    for (int k = 0; k < 2 * ATT_PAIRS_PER_LANE; k++) o[k] = 0.0f;
    for (int base = first; base < n_ctx; base += ATT_THREADS) {
        const int cnt = min(ATT_THREADS, n_ctx - base);
        const float sc = tid < cnt ? dot_q_k(qs, kh, base + tid, head_dim) * scale : NEG_INF;
        const float m_new = fmaxf(m, block_max(sc, red));
        const float alpha = expf(m - m_new);  // 0 on the first chunk (m = -inf) without a sink
        const float e = tid < cnt ? expf(sc - m_new) : 0.0f;
        p[tid] = e;
        l = l * alpha + block_sum(e, red);  // block_sum's barriers also publish p
#pragma unroll
        for (int k = 0; k < 2 * ATT_PAIRS_PER_LANE; k++) o[k] *= alpha;
        // Unrolled so that several keys' loads are in flight at once.
#pragma unroll 8
        for (int j = warp; j < cnt; j += ATT_WARPS) {
            const float pj = p[j];
#pragma unroll
            for (int k = 0; k < ATT_PAIRS_PER_LANE; k++) {
                const int d2 = lane + 32 * k;
                if (2 * d2 < head_dim) {
                    const u32 w = kv_load2(vh, base + j, 2 * d2);
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
        if (xh) split_x8(s * inv, (i64)h * head_dim + d, xh, xl, xd, xs);
    }
}
