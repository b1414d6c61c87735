// rope.cu: rotary position embedding in place, both pairings:
//   style 0 (normal, llama): pairs (2i, 2i+1)
//   style 1 (NEOX: qwen2, phi3, gpt-oss): pairs (i, i + n_rot/2)
// theta_i = (start_pos + t) * freq_scale * freq_base^(-2i / n_rot). The
// angle, its sine and cosine and the rotation are computed in double, as the
// CPU reference does, so large positions lose no precision. Dimensions from
// n_rot to head_dim are left as they are. One thread per rotated pair.
// When pos_ptr is not null the start position is read from it (a decode step
// replayed from a CUDA graph), otherwise start_pos is used. inv_freq, when not
// null, holds freq_base^(-2i / n_rot) for i < n_rot / 2, computed on the host
// exactly as the CPU reference computes it (saving a pow per thread), each
// divided by its frequency factor where the model has them (Llama 3.1's
// rope_freqs, Phi-3's LongRoPE tables: then the table is required). The
// cosine and sine are multiplied by mscale (rope.scaling.attn_factor).
// x2 (n_head2 heads a row, or null and 0) is rotated in the same launch,
// as x: Q and K of a layer in one kernel.
#include "common.cuh"

// Turns dims (a, b) of pair i of one head at position pos (already times
// freq_scale), as described above.
__device__ __forceinline__ void rope_pair(float* head, int i, double pos, int n_rot,
                                          const double* __restrict__ inv_freq_table, float freq_base, float mscale,
                                          int style) {
    const int a = style == 0 ? 2 * i : i;
    const int b = style == 0 ? 2 * i + 1 : i + n_rot / 2;
    double cs, sn;
    rope_angle(i, pos, n_rot, inv_freq_table, freq_base, mscale, &cs, &sn);
    rope_apply(head[a], head[b], cs, sn, &head[a], &head[b]);
}

extern "C" __global__ void rope(float* __restrict__ x, float* __restrict__ x2, int rows, int n_head, int n_head2,
                                int head_dim, int n_rot, int start_pos, const int* __restrict__ pos_ptr,
                                const double* __restrict__ inv_freq_table, float freq_base, float freq_scale,
                                float mscale, int style) {
    pdl_start();
    if (pos_ptr) start_pos = *pos_ptr;
    const int half = n_rot / 2, heads = n_head + n_head2;
    const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const i64 total = (i64)rows * heads * half;
    if (idx >= total) return;
    const int i = (int)(idx % half);
    const int h = (int)((idx / half) % heads);
    const int t = (int)(idx / ((i64)half * heads));
    float* head = h < n_head ? x + ((i64)t * n_head + h) * head_dim : x2 + ((i64)t * n_head2 + h - n_head) * head_dim;
    const double pos = (double)(start_pos + t) * (double)freq_scale;
    rope_pair(head, i, pos, n_rot, inv_freq_table, freq_base, mscale, style);
}

// Before attention, one launch for what otherwise takes up to five (Gemma 3:
// Q's norm, K's norm, RoPE of both, the KV store; llama: RoPE, the store).
// Block (t, h) takes head h of row t: heads 0..n_head-1 of q, then the
// n_head_kv heads of k. A head is normalised when its weight (qw, kw) is not
// null, as rms_norm normalises a head-wide group (blocks as wide, so the
// same bits), then rotated as rope rotates it (n_rot 0: not at all), in
// place; a K head is then stored in the layer's cache planes (common.cuh)
// beside V's head of the same row, as kv_store stores them. One head of one row at position pos
// (q, k, v: the row's heads).
__device__ __forceinline__ void qk_rope_store_head(float* __restrict__ q, float* __restrict__ k,
                                                   const float* __restrict__ v, int h, int n_head, int n_head_kv,
                                                   int head_dim, const float* __restrict__ qw,
                                                   const float* __restrict__ kw, float eps, int n_rot,
                                                   const double* __restrict__ inv_freq_table, float freq_base,
                                                   float freq_scale, float mscale, int style, int pos, int capacity,
                                                   u16* __restrict__ k_cache, u16* __restrict__ v_cache,
                                                   float* red) {
    const bool is_k = h >= n_head;
    if (h >= n_head + n_head_kv) return;
    const int kh = h - n_head;
    float* head = is_k ? k + (i64)kh * head_dim : q + (i64)h * head_dim;
    const float* w = is_k ? kw : qw;
    if (w) {
        const bool vec = (head_dim & 3) == 0 && (((u64)head | (u64)w) & 15) == 0;
        const float scale = rms_scale(block_sum(row_sq_sum(head, head_dim, vec), red), head_dim, eps);
        row_scale_write(head, w, head_dim, scale, head, vec);
        __syncthreads();  // the pairs below cross threads
    }
    if (n_rot > 0) {
        const double angle_pos = (double)pos * (double)freq_scale;
        for (int i = threadIdx.x; i < n_rot / 2; i += blockDim.x)
            rope_pair(head, i, angle_pos, n_rot, inv_freq_table, freq_base, mscale, style);
    }
    if (!is_k || pos >= capacity) return;
    __syncthreads();
    const float* vh = v + (i64)kh * head_dim;
    for (int d = threadIdx.x * KV_BLOCK; d < head_dim; d += blockDim.x * KV_BLOCK) {
        kv_put(k_cache, n_head_kv, capacity, head_dim, kh, pos, d, head + d);
        kv_put(v_cache, n_head_kv, capacity, head_dim, kh, pos, d, vh + d);
    }
}

// qk_rope_store: rows t = 0..n-1 at positions start_pos + t of one cache.
// start_pos is read from pos_ptr when that is not null (graph replay).
extern "C" __global__ void qk_rope_store(float* __restrict__ q, float* __restrict__ k, const float* __restrict__ v,
                                         int n_head, int n_head_kv, int head_dim, const float* __restrict__ qw,
                                         const float* __restrict__ kw, float eps, int n_rot,
                                         const double* __restrict__ inv_freq_table, float freq_base,
                                         float freq_scale, float mscale, int style, int start_pos,
                                         const int* __restrict__ pos_ptr, int capacity, u16* __restrict__ k_cache,
                                         u16* __restrict__ v_cache) {
    pdl_start();
    __shared__ float red[32];
    if (pos_ptr) start_pos = *pos_ptr;
    const int t = blockIdx.x;
    qk_rope_store_head(q + (i64)t * n_head * head_dim, k + (i64)t * n_head_kv * head_dim,
                       v + (i64)t * n_head_kv * head_dim, blockIdx.y, n_head, n_head_kv, head_dim, qw, kw, eps,
                       n_rot, inv_freq_table, freq_base, freq_scale, mscale, style, start_pos + t, capacity, k_cache,
                       v_cache, red);
}

// qk_rope_store_rows: the same for a batched decode step, row r at its own
// sequence's position and into its own cache (seqs[r], layer `layer`): each
// row's bits as qk_rope_store gives them for that row alone.
extern "C" __global__ void qk_rope_store_rows(float* __restrict__ q, float* __restrict__ k,
                                              const float* __restrict__ v, int n_head, int n_head_kv, int head_dim,
                                              const float* __restrict__ qw, const float* __restrict__ kw, float eps,
                                              int n_rot, const double* __restrict__ inv_freq_table, float freq_base,
                                              float freq_scale, float mscale, int style,
                                              const RowSeq* __restrict__ seqs, int layer) {
    pdl_start();
    __shared__ float red[32];
    const int r = blockIdx.x;
    const RowSeq s = seqs[r];
    u16* k_cache = row_k_plane(s, layer, n_head_kv, head_dim);
    u16* v_cache = kv_next_plane(k_cache, n_head_kv, s.capacity, head_dim);
    qk_rope_store_head(q + (i64)r * n_head * head_dim, k + (i64)r * n_head_kv * head_dim,
                       v + (i64)r * n_head_kv * head_dim, blockIdx.y, n_head, n_head_kv, head_dim, qw, kw, eps,
                       n_rot, inv_freq_table, freq_base, freq_scale, mscale, style, s.pos, s.capacity, k_cache,
                       v_cache, red);
}
