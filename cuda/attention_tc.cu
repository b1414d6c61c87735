// attention_tc.cu: prefill attention on tensor cores (`attention_tc`),
// compiled for one head-size class a model (-DONE_HEAD_PAIRS, source.rs).
#include "attention.cuh"

// ---- Prefill: flash attention on tensor cores ------------------------------
//
// out as `attention` computes it, for many query rows at once: one block of
// ATC_THREADS (4 warps) takes ATC_BQ = 64 query rows of one head (16 a
// warp) and walks the keys that any of them sees, ATC_BK = 64 at a time,
// with the online softmax of `attention`. Scores and the weighted sum of V
// are products on the tensor cores (m16n8k16, f16 in, f32 accumulation): q
// (scaled by scale * log2 e) and the weights p are each split into an f16
// high part and the f16 rounding of the rest, and both are multiplied (K and
// V are f16 values as the cache gives them: exact), which keeps about f32
// accuracy. Every sum has a fixed order; a row's result does not depend on
// the rows beside it.
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
                                                  const float* __restrict__ sinks, float* __restrict__ out) {
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
    const KvHead kh = kv_head(k_cache, n_head_kv, capacity, D, kvh);
    const KvHead vh = kv_head(v_cache, n_head_kv, capacity, D, kvh);

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
    // A sink (gpt-oss) is one more logit of every row, without a value: the
    // maxima start from it and its weight (1 at the start) is counted once
    // per quad (the quad's sums are added at the end).
    const float sink = sinks ? sinks[h] * 1.4426950408889634f : NEG_INF;
    float m0 = sink, m1 = sink;
    float l0 = sinks && qd == 0 ? 1.0f : 0.0f, l1 = l0;
    const u32 qh_a = shared_addr(qh), ql_a = shared_addr(ql), ks_a = shared_addr(ks), vs_a = shared_addr(vs);

    // The first tile any row of the block sees.
    const int k_begin = first_visible(start_pos + q0, swa) / ATC_BK * ATC_BK;
    for (int k0 = k_begin; k0 < n_ctx; k0 += ATC_BK) {
        __syncthreads();  // the previous tile is no longer read (and q is staged)
        for (int i = tid; i < ATC_BK * D / 8; i += ATC_THREADS) {
            const int r = i / (D / 8), d = 8 * (i % (D / 8));
            uint4 kv = make_uint4(0u, 0u, 0u, 0u), vv = kv;
            if (k0 + r < n_ctx) {
                kv = kv_load8(kh, k0 + r, d);
                vv = kv_load8(vh, k0 + r, d);
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
                 const u16* __restrict__ v_cache, float scale, int swa, const float* __restrict__ sinks,
                 float* __restrict__ out, i8* __restrict__ xh, i8* __restrict__ xl, float* __restrict__ xd,
                 float* __restrict__ xs) {
    pdl_start();
    // xh..xs: `attention`'s split of one output row; always null here (prefill).
    if (pos_ptr) start_pos = *pos_ptr;
    if (blockIdx.x * ATC_BQ >= n || blockIdx.y >= n_head) return;
#if !defined(ONE_HEAD_PAIRS) || ONE_HEAD_PAIRS == 1
    if (head_dim == 64)
        attention_tc_impl<64>(q, n, n_head, n_head_kv, start_pos, capacity, k_cache, v_cache, scale, swa, sinks, out);
#endif
#if !defined(ONE_HEAD_PAIRS) || ONE_HEAD_PAIRS == 2
    if (head_dim == 128)
        attention_tc_impl<128>(q, n, n_head, n_head_kv, start_pos, capacity, k_cache, v_cache, scale, swa, sinks, out);
#endif
}
