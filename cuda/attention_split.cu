// attention_split.cu: decode attention over a context split across blocks
// (`attention_split_*`) and the merge of the chunks (`attention_combine`).
// Compiled for one head-size class a model (-DONE_HEAD_PAIRS, source.rs), in
// three parts (-DONE_PART).
#include "attention.cuh"

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
    const KvHead kh = kv_head(k_cache, n_head_kv, capacity, head_dim, kvh);
    const KvHead vh = kv_head(v_cache, n_head_kv, capacity, head_dim, kvh);
    for (int base = warp; base < cnt; base += ATS_WARPS * ATS_KEYS) {
        u32 kr[ATS_KEYS][PPL], vr[ATS_KEYS][PPL];
#pragma unroll
        for (int u = 0; u < ATS_KEYS; u++) {
            const int j = base + u * ATS_WARPS;
            const int row = j0 + min(j, cnt - 1);
#pragma unroll
            for (int k = 0; k < PPL; k++) {
                const int pr = lane + 32 * k;
                const bool in = j < cnt && pr < npairs;
                kr[u][k] = in ? kv_load2(kh, row, 2 * pr) : 0u;
                vr[u][k] = in ? kv_load2(vh, row, 2 * pr) : 0u;
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

// ---- The same on tensor cores, heads of 64 or 128 dims ---------------------
//
// Each warp takes 16 keys of the chunk at a time (tiles w, w + ATS_WARPS, ...)
// and multiplies on the tensor cores (m16n8k16, f16 in, f32 accumulation),
// the group's query heads as rows: rows 0-7 hold the heads' f16 high parts
// and rows 8-15 the f16 rounding of the rest, so one product gives both and
// their sum keeps about f32 accuracy (as attention_tc's two products do).
// Scores: S = Q K^T with the dims of each 32 in the order one 16-byte load
// of a K row gives them (Q's fragments follow that order); weights: the
// same split of P as rows, times V whose two keys per register come from
// byte permutes of two rows' words (no shared memory, no transposes).
// Scores are in log2 units (q scaled by log2 e); a chunk's max is written
// back in natural units, so `attention_combine` is the same for both kernels.
// A chunk holds whole tiles and at least ATS_TC_MIN_CHUNK keys: a short
// context fills fewer chunks, and the combine skips the empty ones. (128
// keys was the fastest least chunk of 32, 64 and 128 measured:
// benches/results/kernel-choices.md.)
#define ATS_TC_MIN_CHUNK 128
template <int D>
__device__ __forceinline__ void attention_split_tc_impl(const float* __restrict__ q, int n_head, int n_head_kv,
                                                        int start_pos, const int* __restrict__ pos_ptr,
                                                        int capacity, const u16* __restrict__ k_cache,
                                                        const u16* __restrict__ v_cache, float scale, int swa,
                                                        int nsplit, float* __restrict__ part) {
    static_assert(D % 64 == 0, "V's columns in groups of 64");
    constexpr int KS = D / 16, NC = D / 64, OW = D + 1;
    __shared__ float ow[ATS_WARPS][8][OW];
    __shared__ float mw[ATS_WARPS][8], lw[ATS_WARPS][8];
    const int kvh = blockIdx.x, s = blockIdx.y;
    const int group = n_head / n_head_kv;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    if (pos_ptr) start_pos = *pos_ptr;
    const int n_ctx = min(start_pos + 1, capacity), first = first_visible(start_pos, swa);
    int chunk = (n_ctx - first + nsplit - 1) / nsplit;
    chunk = max(ATS_TC_MIN_CHUNK, (chunk + 15) / 16 * 16);
    const int j0 = first + s * chunk, cnt = max(0, min(chunk, n_ctx - j0));
    const int stride = D + 2;
    if (cnt == 0) {  // weight 0 in the combine, which then reads no output
        if (tid < group) {
            float* dst = part + ((i64)(kvh * group + tid) * nsplit + s) * stride;
            dst[0] = NEG_INF;
            dst[1] = 0.0f;
        }
        return;
    }
    // Q's fragments: row gid is head gid's high part, row gid + 8 its low
    // part. k-step 2c + h, columns 2t, 2t+1 and 2t+8, 2t+9 hold dims
    // 32c + 8t + 4h + {0, 1} and + {2, 3} (t = tig): K's load order below.
    const float qscale = scale * 1.4426950408889634f;
    u32 qa[KS][4];
    {
        const bool hv = gid < group;
        const float* qh = q + (i64)(kvh * group + min(gid, group - 1)) * D;
#pragma unroll
        for (int c = 0; c < D / 32; c++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (hv) x = *(const float4*)(qh + 32 * c + 8 * tig + 4 * h);
                split_f16x2(x.x * qscale, x.y * qscale, qa[2 * c + h][0], qa[2 * c + h][1]);
                split_f16x2(x.z * qscale, x.w * qscale, qa[2 * c + h][2], qa[2 * c + h][3]);
            }
    }
    // o[8c + e]: rows gid (high) and gid + 8 (low parts of the weights) of
    // dims 64c + 16 tig + e (c0, c2) and 64c + 16 tig + 8 + e (c1, c3).
    float o[8 * NC][4];
#pragma unroll
    for (int i = 0; i < 8 * NC; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m = NEG_INF, l = 0.0f;  // head gid's, this lane's keys in l
    const KvHead kh = kv_head(k_cache, n_head_kv, capacity, D, kvh);
    const KvHead vh = kv_head(v_cache, n_head_kv, capacity, D, kvh);
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    for (int t0 = 16 * warp; t0 < cnt; t0 += 16 * ATS_WARPS) {
        // Every load of the tile first: K rows t0 + 8h + gid (dims 32c + 8 tig
        // ..+8), V rows t0 + 2 tig + {0, 1, 8, 9} (dims 64c + 8 gid ..+8).
        uint4 kr[2][D / 32], vr[4][NC];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int j = t0 + 8 * h + gid, row = j0 + min(j, cnt - 1);
#pragma unroll
            for (int c = 0; c < D / 32; c++) kr[h][c] = j < cnt ? kv_load8(kh, row, 32 * c + 8 * tig) : zero;
        }
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int j = t0 + 2 * tig + (r & 1) + 8 * (r >> 1), row = j0 + min(j, cnt - 1);
#pragma unroll
            for (int c = 0; c < NC; c++)
                vr[r][c] = j < cnt ? kv_load8(vh, row, 64 * c + 8 * gid) : zero;  // 0: no NaN from stale rows
        }
        // Scores of keys t0 + 8h + 2 tig + {0, 1}: high part in [0..1], low in [2..3].
        float sc[2][4];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            sc[h][0] = sc[h][1] = sc[h][2] = sc[h][3] = 0.0f;
#pragma unroll
            for (int c = 0; c < D / 32; c++) {
                mma_f16(sc[h], qa[2 * c], kr[h][c].x, kr[h][c].y);
                mma_f16(sc[h], qa[2 * c + 1], kr[h][c].z, kr[h][c].w);
            }
        }
        float mx = NEG_INF, p[2][2];
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                p[h][c] = t0 + 8 * h + 2 * tig + c < cnt ? sc[h][c] + sc[h][2 + c] : NEG_INF;
                mx = fmaxf(mx, p[h][c]);
            }
        mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
        const float mn = fmaxf(m, mx);  // finite: key t0 is in the chunk
        const float alpha = exp2f(m - mn);
        m = mn;
        l *= alpha;
#pragma unroll
        for (int i = 0; i < 8 * NC; i++) {
            o[i][0] *= alpha;
            o[i][1] *= alpha;
            o[i][2] *= alpha;
            o[i][3] *= alpha;
        }
        u32 pa[4];  // P as A: rows gid (high parts) and gid + 8 (low), keys 2 tig.. and 2 tig + 8..
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float p0 = exp2f(p[h][0] - mn), p1 = exp2f(p[h][1] - mn);
            l += p0 + p1;
            split_f16x2(p0, p1, pa[2 * h], pa[2 * h + 1]);
        }
        // V as B: keys 2 tig, 2 tig + 1 (and + 8) of one dim per register,
        // the even dims from the rows' low halves, the odd from the high.
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const u32 w[4][4] = {{vr[0][c].x, vr[0][c].y, vr[0][c].z, vr[0][c].w},
                                 {vr[1][c].x, vr[1][c].y, vr[1][c].z, vr[1][c].w},
                                 {vr[2][c].x, vr[2][c].y, vr[2][c].z, vr[2][c].w},
                                 {vr[3][c].x, vr[3][c].y, vr[3][c].z, vr[3][c].w}};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                mma_f16(o[8 * c + 2 * i], pa, __byte_perm(w[0][i], w[1][i], 0x5410),
                        __byte_perm(w[2][i], w[3][i], 0x5410));
                mma_f16(o[8 * c + 2 * i + 1], pa, __byte_perm(w[0][i], w[1][i], 0x7632),
                        __byte_perm(w[2][i], w[3][i], 0x7632));
            }
        }
    }
    // The quad's sums of weights; the warps' states merged in warp order.
    l += __shfl_xor_sync(FULL_MASK, l, 1);
    l += __shfl_xor_sync(FULL_MASK, l, 2);
    if (tig == 0) {
        mw[warp][gid] = m;
        lw[warp][gid] = l;
    }
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const float* oi = o[8 * c + e];
            ow[warp][gid][64 * c + 16 * tig + e] = oi[0] + oi[2];
            ow[warp][gid][64 * c + 16 * tig + 8 + e] = oi[1] + oi[3];
        }
    __syncthreads();
    for (int i = tid; i < group * D; i += ATS_THREADS) {
        const int g = i / D, d = i - g * D;
        float mx = NEG_INF;
        for (int w = 0; w < ATS_WARPS; w++) mx = fmaxf(mx, mw[w][g]);
        float acc = 0.0f, sum = 0.0f;
        for (int w = 0; w < ATS_WARPS; w++)
            if (mw[w][g] != NEG_INF) {
                const float a = exp2f(mw[w][g] - mx);
                acc = fmaf(ow[w][g][d], a, acc);
                sum = fmaf(lw[w][g], a, sum);
            }
        float* dst = part + ((i64)(kvh * group + g) * nsplit + s) * stride;
        dst[2 + d] = acc;
        if (d == 0) {
            dst[0] = mx * 0.6931471805599453f;  // log2 units back to natural
            dst[1] = sum;
        }
    }
}

#define ATTENTION_SPLIT(NAME, PPL, G)                                                                            \
    extern "C" __global__ void __launch_bounds__(ATS_THREADS)                                                    \
        NAME(const float* __restrict__ q, int n_head, int n_head_kv, int head_dim, int start_pos,                \
             const int* __restrict__ pos_ptr, int capacity, const u16* __restrict__ k_cache,                     \
             const u16* __restrict__ v_cache, float scale, int swa, int nsplit, float* __restrict__ part) {      \
        pdl_start();                                                                                             \
        attention_split_impl<PPL, G>(q, n_head, n_head_kv, head_dim, start_pos, pos_ptr, capacity, k_cache,       \
                                     v_cache, scale, swa, nsplit, part);                                         \
    }
// Heads of exactly D dims, on tensor cores (any group of up to 8: the
// group's heads are rows).
#define ATTENTION_SPLIT_TC(NAME, D)                                                                              \
    extern "C" __global__ void __launch_bounds__(ATS_THREADS)                                                    \
        NAME(const float* __restrict__ q, int n_head, int n_head_kv, int head_dim, int start_pos,                \
             const int* __restrict__ pos_ptr, int capacity, const u16* __restrict__ k_cache,                     \
             const u16* __restrict__ v_cache, float scale, int swa, int nsplit, float* __restrict__ part) {      \
        pdl_start();                                                                                             \
        attention_split_tc_impl<D>(q, n_head, n_head_kv, start_pos, pos_ptr, capacity, k_cache, v_cache, scale,  \
                                   swa, nsplit, part);                                                           \
    }
// Rows mode (a batched decode step, `CudaOps::attention_rows`): row r of q
// is the next token of sequence seqs[r], over that sequence's own cache.
// Grid (KV head, chunk, row). A row's context is cut into chunks of
// ATS_ROW_CHUNK positions, as many as it fills (rows_nsplit): a count that
// depends on the row alone, so its sums, and so its output, are the same
// bits whichever rows share the step. Blocks past a row's chunks return.
// part: [rows][n_head][max_splits][head_dim + 2], each row's states packed
// as attention_split packs one query's (max_splits: the host's bound on
// every row's count).
#if !defined(ATS_ROW_CHUNK)
#error "ATS_ROW_CHUNK comes from the worker as a -D option"
#endif
__device__ __forceinline__ int rows_nsplit(int pos, int capacity, int swa) {
    const int n_ctx = min(pos + 1, capacity), first = first_visible(pos, swa);
    return min(ATS_MAX_SPLITS, max(1, (n_ctx - first + ATS_ROW_CHUNK - 1) / ATS_ROW_CHUNK));
}
#define ATTENTION_SPLIT_ROWS(NAME, CALL)                                                                         \
    extern "C" __global__ void __launch_bounds__(ATS_THREADS)                                                    \
        NAME(const float* __restrict__ q, int n_head, int n_head_kv, int head_dim,                               \
             const RowSeq* __restrict__ seqs, int layer, float scale, int swa, int max_splits,                   \
             float* __restrict__ part) {                                                                         \
        pdl_start();                                                                                             \
        const RowSeq sq = seqs[blockIdx.z];                                                                      \
        const int nsplit = rows_nsplit(sq.pos, sq.capacity, swa);                                                \
        if ((int)blockIdx.y >= nsplit || nsplit > max_splits) return;                                            \
        const u16* k_cache = row_k_plane(sq, layer, n_head_kv, head_dim);                                        \
        const u16* v_cache = kv_next_plane(k_cache, n_head_kv, sq.capacity, head_dim);                           \
        const float* qr = q + (i64)blockIdx.z * n_head * head_dim;                                               \
        float* pr = part + (i64)blockIdx.z * n_head * max_splits * (head_dim + 2);                               \
        CALL;                                                                                                    \
    }
#define ATTENTION_SPLIT_BOTH(NAME, PPL, G)                                                                       \
    ATTENTION_SPLIT(NAME, PPL, G)                                                                                \
    ATTENTION_SPLIT_ROWS(NAME##_rows, (attention_split_impl<PPL, G>(qr, n_head, n_head_kv, head_dim, sq.pos,     \
                                                                    nullptr, sq.capacity, k_cache, v_cache,      \
                                                                    scale, swa, nsplit, pr)))
#define ATTENTION_SPLIT_TC_BOTH(NAME, D)                                                                         \
    ATTENTION_SPLIT_TC(NAME, D)                                                                                  \
    ATTENTION_SPLIT_ROWS(NAME##_rows, (attention_split_tc_impl<D>(qr, n_head, n_head_kv, sq.pos, nullptr,       \
                                                                  sq.capacity, k_cache, v_cache, scale, swa,     \
                                                                  nsplit, pr)))
static_assert(ATS_MAX_GROUP == 8, "the instances below take groups of up to 4 or 8 heads");
// A model's units hold only its head size's instances (-DONE_HEAD_PAIRS=P,
// see source.rs's head_pairs): most of this module's compile time. Three
// units (-DONE_PART), compiled side by side (a first start waits for the
// slowest): the tensor-core kernel with attention_combine (every model), the
// scalar kernel for groups of up to 4, and for groups of 8, the last two only
// for heads of other sizes than 64 and 128 (source.rs, part_needed).
#if !defined(ONE_PART) || ONE_PART == 0
#if !defined(ONE_HEAD_PAIRS) || ONE_HEAD_PAIRS == 1
ATTENTION_SPLIT_TC_BOTH(attention_split_tc_64, 64)
#endif
#if !defined(ONE_HEAD_PAIRS) || ONE_HEAD_PAIRS == 2
ATTENTION_SPLIT_TC_BOTH(attention_split_tc_128, 128)
#endif
#endif
#if !defined(ONE_PART) || ONE_PART == 1
#if !defined(ONE_HEAD_PAIRS) || ONE_HEAD_PAIRS == 1
ATTENTION_SPLIT_BOTH(attention_split_64_g4, 1, 4)
#endif
#if !defined(ONE_HEAD_PAIRS) || ONE_HEAD_PAIRS == 2
ATTENTION_SPLIT_BOTH(attention_split_128_g4, 2, 4)
#endif
#if !defined(ONE_HEAD_PAIRS) || ONE_HEAD_PAIRS == 4
ATTENTION_SPLIT_BOTH(attention_split_256_g4, 4, 4)
#endif
#endif
#if !defined(ONE_PART) || ONE_PART == 2
#if !defined(ONE_HEAD_PAIRS) || ONE_HEAD_PAIRS == 1
ATTENTION_SPLIT_BOTH(attention_split_64_g8, 1, 8)
#endif
#if !defined(ONE_HEAD_PAIRS) || ONE_HEAD_PAIRS == 2
ATTENTION_SPLIT_BOTH(attention_split_128_g8, 2, 8)
#endif
#if !defined(ONE_HEAD_PAIRS) || ONE_HEAD_PAIRS == 4
ATTENTION_SPLIT_BOTH(attention_split_256_g8, 4, 8)
#endif
#endif

#if !defined(ONE_PART) || ONE_PART == 0
// out[h] = the merge of head h's chunk states, in chunk order. One block of
// ATSC_THREADS per head; the chunks' weights are computed once into shared
// memory. Warp w adds chunks w, w + ATSC_WARPS, ... (lanes over dims, so each
// chunk's output is one coalesced read, and the reads of different chunks
// are independent); the warps' sums are then added in warp order. With xh
// set (head_dim a multiple of 32), out is also split as `attention` splits it.
#if !defined(ATSC_THREADS)
#error "ATSC_THREADS comes from the worker as a -D option"
#endif
static_assert(ATSC_THREADS % 32 == 0, "whole warps");
#define ATSC_WARPS (ATSC_THREADS / 32)
// Head h's merge: ph its chunk states, orow its row of out.
__device__ __forceinline__ void attention_combine_head(const float* __restrict__ ph, int h, int head_dim, int nsplit,
                                                       const float* __restrict__ sinks, float* __restrict__ orow,
                                                       i8* __restrict__ xh, i8* __restrict__ xl,
                                                       float* __restrict__ xd, float* __restrict__ xs) {
    __shared__ float wgt[ATS_MAX_SPLITS];
    __shared__ float red[32];
    __shared__ float accw[ATSC_WARPS][ATT_MAX_HEAD_DIM];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int stride = head_dim + 2;
    float m = NEG_INF;
    for (int s = tid; s < nsplit; s += ATSC_THREADS) m = fmaxf(m, ph[(i64)s * stride]);
    m = block_max(m, red);
    // A sink (gpt-oss): one more logit without a value, in the maximum and the sum.
    if (sinks) m = fmaxf(m, sinks[h]);
    float l = sinks && tid == 0 ? expf(sinks[h] - m) : 0.0f;  // counted once in the block's sum
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
        if (a == 0.0f) continue;  // an empty chunk (its output is not written) or one that weighs nothing
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
        orow[(i64)h * head_dim + d] = o / l;
        if (xh) split_x8(o / l, (i64)h * head_dim + d, xh, xl, xd, xs);
    }
}

extern "C" __global__ void __launch_bounds__(ATSC_THREADS)
    attention_combine(const float* __restrict__ part, int n_head, int head_dim, int nsplit,
                      const float* __restrict__ sinks, float* __restrict__ out, i8* __restrict__ xh,
                      i8* __restrict__ xl, float* __restrict__ xd, float* __restrict__ xs) {
    pdl_start();
    const int h = blockIdx.x;
    if (h >= n_head) return;
    attention_combine_head(part + (i64)h * nsplit * (head_dim + 2), h, head_dim, nsplit, sinks, out, xh, xl, xd,
                           xs);
}

// attention_combine_rows: the same for a batched step's rows (grid: head,
// row), each row's chunks as attention_split_*_rows wrote them.
extern "C" __global__ void __launch_bounds__(ATSC_THREADS)
    attention_combine_rows(const float* __restrict__ part, int n_head, int head_dim,
                           const RowSeq* __restrict__ seqs, int swa, int max_splits,
                           const float* __restrict__ sinks, float* __restrict__ out) {
    pdl_start();
    const int h = blockIdx.x, r = blockIdx.y;
    if (h >= n_head) return;
    const RowSeq sq = seqs[r];
    const int nsplit = min(rows_nsplit(sq.pos, sq.capacity, swa), max_splits);
    const float* pr = part + ((i64)r * n_head * max_splits + (i64)h * nsplit) * (head_dim + 2);
    attention_combine_head(pr, h, head_dim, nsplit, sinks, out + (i64)r * n_head * head_dim, nullptr, nullptr,
                           nullptr, nullptr);
}
#endif
