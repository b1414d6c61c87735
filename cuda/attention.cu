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

#define ATT_THREADS 128
#define ATT_MAX_HEAD_DIM 256

// out[t][h] = softmax_j(q[t][h] . K[j] / sqrt(head_dim)) V[j] over positions
// j = 0..start_pos + t, with K, V from KV head h / (n_head / n_head_kv).
//
// start_pos is read from pos_ptr when that is not null (graph replay).
// One block of ATT_THREADS per (row t, head h). Keys are taken ATT_THREADS at
// a time: each warp scores keys w, w+4, ... (lanes split the head dims, one
// butterfly sum per key), then the chunk's softmax weights update a running
// maximum, sum and output (online softmax). Every sum has a fixed order.
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
    attention(const float* __restrict__ q, int n, int n_head, int n_head_kv, int head_dim, int start_pos,
              const int* __restrict__ pos_ptr, int capacity, const u16* __restrict__ k_cache, const u16* __restrict__ v_cache, float scale,
              float* __restrict__ out) {
    __shared__ float qs[ATT_MAX_HEAD_DIM];
    __shared__ float p[ATT_THREADS];
    __shared__ float red[32];
    const int t = blockIdx.x, h = blockIdx.y;
    if (t >= n || h >= n_head) return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (pos_ptr) start_pos = *pos_ptr;
    const int kvh = h / (n_head / n_head_kv);
    const int n_ctx = min(start_pos + t + 1, capacity);
    const float* qrow = q + ((i64)t * n_head + h) * head_dim;
    for (int d = tid; d < head_dim; d += ATT_THREADS) qs[d] = qrow[d];
    const u16* kh = k_cache + (i64)kvh * capacity * head_dim;
    const u16* vh = v_cache + (i64)kvh * capacity * head_dim;
    __syncthreads();

    float m = NEG_INF, l = 0.0f, o0 = 0.0f, o1 = 0.0f;
    for (int base = 0; base < n_ctx; base += ATT_THREADS) {
        const int cnt = min(ATT_THREADS, n_ctx - base);
        for (int j = warp; j < cnt; j += ATT_THREADS / 32) {
            const u16* kr = kh + (i64)(base + j) * head_dim;
            float s = 0.0f;
            for (int d = lane; d < head_dim; d += 32) s = fmaf(qs[d], f16_to_f32(kr[d]), s);
            s = warp_sum(s);
            if (lane == 0) p[j] = s * scale;
        }
        __syncthreads();
        const float sc = tid < cnt ? p[tid] : NEG_INF;
        const float m_new = fmaxf(m, block_max(sc, red));
        const float alpha = expf(m - m_new);  // 0 on the first chunk (m = -inf)
        const float e = tid < cnt ? expf(sc - m_new) : 0.0f;
        __syncthreads();
        p[tid] = e;
        l = l * alpha + block_sum(e, red);  // block_sum's barriers also publish p
        float a0 = 0.0f, a1 = 0.0f;
        for (int j = 0; j < cnt; j++) {
            const u16* vr = vh + (i64)(base + j) * head_dim;
            const float pj = p[j];
            if (tid < head_dim) a0 = fmaf(pj, f16_to_f32(vr[tid]), a0);
            if (tid + ATT_THREADS < head_dim) a1 = fmaf(pj, f16_to_f32(vr[tid + ATT_THREADS]), a1);
        }
        o0 = o0 * alpha + a0;
        o1 = o1 * alpha + a1;
        m = m_new;
        __syncthreads();
    }
    float* orow = out + ((i64)t * n_head + h) * head_dim;
    const float inv = 1.0f / l;
    if (tid < head_dim) orow[tid] = o0 * inv;
    if (tid + ATT_THREADS < head_dim) orow[tid + ATT_THREADS] = o1 * inv;
}
