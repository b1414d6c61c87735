// gemm.cu: out[t][r] = sum_c x[t][c] * W[r][c] (+ bias[r]) for many rows of
// x (prefill) on tensor cores: `gemm_tck_<type>` for the quantized formats,
// `gemm_tc_<type>` for the float ones.
//
// Each block computes a GTC_BR x GTC_BT tile of out^T (weight rows x tokens)
// with 8 warps of 32 x 32, over steps of GTC_BK columns staged in shared
// memory. Accumulation is f32 in a fixed order (deterministic). Two paths:
//
// - Quantized formats (gemm_int_impl, below): weight tiles decoded into f16,
//   x in two f16 parts split once per launch (`mma.sync.m16n8k16` on f16);
//   the weight bytes and activations of the step after next are loaded into
//   registers while the tensor cores work on the current one.
// - Float formats (gemm_tf32_impl): values decoded with deq8 (dequant.cuh)
//   and multiplied on TF32 as three products of high and low parts (the
//   "3xTF32" scheme of CUTLASS: about f32 accuracy).
//
// `gemm_few_<type>` takes up to GF_MAX_TOKENS rows of x in the quantized
// formats without the tiles (gemm_few.cu, which NVRTC reads after this file
// as one text: source.rs's Module::files). Three units (-DONE_PART,
// source.rs's Module::parts): gemm_few_* alone, gemm_moe_*, the others.
#include "common.cuh"
#include "dequant.cuh"

// Shared with the host's launch geometry: defined once in the worker
// (backend/cuda/source.rs) and passed as -D options. The warp layout below
// assumes these values; GTC_PAD = 4 makes the fragment loads conflict-free.
#if !defined(GTC_BR) || !defined(GTC_BT) || !defined(GTC_BK) || !defined(GTC_THREADS) || !defined(GTC_PAD)
#error "GTC_BR, GTC_BT, GTC_BK, GTC_THREADS and GTC_PAD come from the worker as -D options"
#endif
static_assert(GTC_BR == 128 && GTC_BT == 64 && GTC_BK == 32 && GTC_THREADS == 256 && GTC_PAD == 4,
              "8 warps of 32 x 32 outputs, 4 x 8-value chunks per row and step; two threads per weight row");

__device__ __forceinline__ u32 to_tf32(float f) {
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(f));
    return r;
}

// v = hi + lo with hi and lo both TF32.
__device__ __forceinline__ void split_tf32(float v, u32& hi, u32& lo) {
    hi = to_tf32(v);
    lo = to_tf32(v - __uint_as_float(hi));
}

__device__ __forceinline__ void mma_tf32(float (&c)[4], const u32 (&a)[4], const u32 (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Eight values to shared memory as their TF32 high and low parts.
__device__ __forceinline__ void store_split(const float* v, u32* hi, u32* lo) {
    u32 h[8], l[8];
#pragma unroll
    for (int i = 0; i < 8; i++) split_tf32(v[i], h[i], l[i]);
    ((uint4*)hi)[0] = make_uint4(h[0], h[1], h[2], h[3]);
    ((uint4*)hi)[1] = make_uint4(h[4], h[5], h[6], h[7]);
    ((uint4*)lo)[0] = make_uint4(l[0], l[1], l[2], l[3]);
    ((uint4*)lo)[1] = make_uint4(l[4], l[5], l[6], l[7]);
}

// Writes a warp's 32 x 32 tile of out^T (+ bias): acc[i][j] holds rows
// row0 + 16i + g (+8) and tokens tok0 + 8j + 2q (+1), as mma.sync leaves them.
__device__ __forceinline__ void store_tile(const float (&acc)[2][4][4], int row0, int tok0, int lane, int rows,
                                           int n, const float* __restrict__ bias, float* __restrict__ out) {
    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = row0 + 16 * i + g + 8 * (e >> 1);
                const int t = tok0 + 8 * j + 2 * q + (e & 1);
                if (r < rows && t < n) out[(i64)t * rows + r] = bias ? acc[i][j][e] + bias[r] : acc[i][j][e];
            }
}

// The block's dynamic shared memory: 2 * (GTC_BR + GTC_BT) * (GTC_BK +
// GTC_PAD) * 4 bytes, over the 48 KB static limit (the loader raises the
// kernel's limit; GTC_SMEM_BYTES in source.rs).
template <int T>
__device__ __forceinline__ void gemm_tf32_impl(const u8* __restrict__ W, i64 row_bytes, int rows, int cols,
                                             const float* __restrict__ x, int n, const float* __restrict__ bias,
                                             float* __restrict__ out) {
    // Operands stored already split into TF32 high and low parts: each is
    // read by several warps, so splitting once here saves conversions.
    extern __shared__ __align__(16) u32 smem[];
    u32(*Wh)[GTC_BK + GTC_PAD] = (u32(*)[GTC_BK + GTC_PAD])smem;
    u32(*Wl)[GTC_BK + GTC_PAD] = Wh + GTC_BR;
    u32(*Xh)[GTC_BK + GTC_PAD] = Wl + GTC_BR;
    u32(*Xl)[GTC_BK + GTC_PAD] = Xh + GTC_BT;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int r0 = blockIdx.x * GTC_BR, t0 = blockIdx.y * GTC_BT;
    // Warp tile: 32 weight rows x 32 tokens; warps 4 (rows) x 2 (tokens).
    const int wr = (warp & 3) * 32, wt = (warp >> 2) * 32;
    const int g = lane >> 2, q = lane & 3;

    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[i][j][k] = 0.0f;

    const bool vec = (cols & 3) == 0;
    for (int k0 = 0; k0 < cols; k0 += GTC_BK) {
        // W: GTC_BR rows x 4 chunks of 8 values; two chunks per thread.
#pragma unroll
        for (int l = 0; l < 2; l++) {
            const int idx = tid + l * GTC_THREADS;
            const int row = idx >> 2, part = idx & 3;
            const int c = (k0 >> 3) + part;
            float v[8];
            if (r0 + row < rows && 8 * c < cols) {
                deq8<T>(W + (i64)(r0 + row) * row_bytes, c, cols, v);
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++) v[i] = 0.0f;
            }
            store_split(v, &Wh[row][part * 8], &Wl[row][part * 8]);
        }
        // x: GTC_BT tokens x GTC_BK values; 8 per thread.
        {
            const int tok = tid >> 2, part = tid & 3, kk = k0 + part * 8;
            float v[8];
            const float* xp = x + (i64)(t0 + tok) * cols + kk;
            if (t0 + tok < n && vec && kk + 8 <= cols) {
                const float4 a = *(const float4*)xp, b = *(const float4*)(xp + 4);
                v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++) v[i] = (t0 + tok < n && kk + i < cols) ? xp[i] : 0.0f;
            }
            store_split(v, &Xh[tok][part * 8], &Xl[tok][part * 8]);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GTC_BK; kk += 8) {
            u32 ah[2][4], al[2][4], bh[4][2], bl[4][2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int rr = wr + 16 * i + g;
                ah[i][0] = Wh[rr][kk + q]; al[i][0] = Wl[rr][kk + q];
                ah[i][1] = Wh[rr + 8][kk + q]; al[i][1] = Wl[rr + 8][kk + q];
                ah[i][2] = Wh[rr][kk + q + 4]; al[i][2] = Wl[rr][kk + q + 4];
                ah[i][3] = Wh[rr + 8][kk + q + 4]; al[i][3] = Wl[rr + 8][kk + q + 4];
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int tt = wt + 8 * j + g;
                bh[j][0] = Xh[tt][kk + q]; bl[j][0] = Xl[tt][kk + q];
                bh[j][1] = Xh[tt][kk + q + 4]; bl[j][1] = Xl[tt][kk + q + 4];
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    // Small terms first, so the large one is added last.
                    mma_tf32(acc[i][j], al[i], bh[j]);
                    mma_tf32(acc[i][j], ah[i], bl[j]);
                    mma_tf32(acc[i][j], ah[i], bh[j]);
                }
        }
        __syncthreads();
    }
    store_tile(acc, r0 + wr, t0 + wt, lane, rows, n, bias, out);
}


// ---- quantized formats: tiles decoded into f16 (gemm_tck_<type>) ----
//
// The short prompts' GEMM (9 to 63 rows of x; from 64 on, cuBLAS: blas.rs).
// Each thread decodes 16 values of one weight row a step, sc * (q - offset)
// - mn in f32, rounded once to f16 as dequant_f16_* rounds them for cuBLAS,
// and the tensor cores multiply them by x's two f16 parts (x rounded, and
// the rounding of the rest: to_f16, once per launch on the host's side), so
// a product has the precision of the cuBLAS path. Nothing is left to apply
// after the products: ncu had the earlier kernel (integer q's on the tensor
// cores, scales applied to each output per sub-block, x split by every
// block) bound by instruction issue, with about 80 instructions a thread
// and step splitting x and 160 applying scales against 16 MMAs a warp.
//
// The columns are split into `splits` ranges of whole steps, one per
// blockIdx.z (short prompts leave most SMs idle otherwise), and range z's
// products go to part + z * n * rows (no bias); gemm_splits_sum adds the
// ranges in order (and the bias; elementwise.cu). Deterministic for a given
// `splits`, which the host picks from the shape alone.

// The stored q's are unsigned; value = sc * (q - offset) - mn.
__device__ __forceinline__ constexpr int q_offset(int T) {
    return T == T_Q4_0 ? 8 : T == T_Q5_0 ? 16 : T == T_Q6_K ? 32 : T == T_Q8_0 ? 128 : 0;
}

// Two floats as f16x2 (round to nearest even; beyond f16's range +-65504,
// as f16_range clamps), `lo` in the low half.
__device__ __forceinline__ u32 pack_f16_sat(float lo, float hi) {
    u32 r;
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// The raw bytes one thread needs for its 16 values of a weight row in one
// step: loaded a step ahead (fetch) and decoded after the step's products
// (decode), so the loads are in flight while the tensor cores work.
struct RawW {
    u32 q[4];   // 16 bytes of packed low bits
    u32 h[4];   // 16 bytes of high bits (Q5_K, Q6_K), or qh (Q5_0/Q5_1: h[0])
    u32 hd[4];  // block header: d (and m / dmin), K-quant scales
};

// Values 16*half .. 16*half+15 of step `s` (columns 32 s ..) of `row`.
template <int T>
__device__ __forceinline__ void fetch_w(const u8* __restrict__ row, int s, int half, RawW& r) {
    if (T == T_Q4_0 || T == T_Q4_1 || T == T_Q5_0 || T == T_Q5_1) {
        constexpr int BB = T == T_Q4_0 ? 18 : T == T_Q4_1 ? 20 : T == T_Q5_0 ? 22 : 24;
        constexpr int QS = T == T_Q4_0 ? 2 : T == T_Q4_1 ? 4 : T == T_Q5_0 ? 6 : 8;
        const u8* b = row + (i64)s * BB;
        ld_words<4, (T == T_Q4_1 || T == T_Q5_1) ? 4 : 2>(b + QS, r.q);
        if (T == T_Q4_1 || T == T_Q5_1) r.hd[0] = *(const u32*)b;
        else r.hd[0] = *(const u16*)b;
        if (T == T_Q5_0) r.h[0] = (u32)((const u16*)(b + 2))[0] | ((u32)((const u16*)(b + 2))[1] << 16);
        if (T == T_Q5_1) r.h[0] = *(const u32*)(b + 4);
    } else if (T == T_Q8_0) {
        const u8* b = row + (i64)s * 34;
        ld_words<4, 2>(b + 2 + 16 * half, r.q);
        r.hd[0] = *(const u16*)b;
    } else if (T == T_Q4_K || T == T_Q5_K) {
        constexpr int BB = T == T_Q4_K ? 144 : 176;
        const u8* b = row + (i64)(s >> 3) * BB;
        const int sb = s & 7;
        const uint4 hd = *(const uint4*)b;  // d, dmin, scales[12]
        r.hd[0] = hd.x; r.hd[1] = hd.y; r.hd[2] = hd.z; r.hd[3] = hd.w;
        ld_words<4, 16>(b + (T == T_Q4_K ? 16 : 48) + 32 * (sb >> 1) + 16 * half, r.q);
        if (T == T_Q5_K) ld_words<4, 16>(b + 16 + 16 * half, r.h);
    } else if (T == T_MXFP4) {
        const u8* b = row + (i64)s * 17;
        ld_a16<4>(b + 1, r.q);  // qs[16]: values 0-15 in the low nibbles, 16-31 in the high
        r.hd[0] = b[0];         // the E8M0 exponent
    } else if (T == T_Q6_K) {
        const u8* b = row + (i64)(s >> 3) * 210;
        const int sb = s & 7, n = sb >> 2, quarter = sb & 3;
        ld_words<4, 2>(b + 64 * n + 32 * (quarter & 1) + 16 * half, r.q);
        ld_words<4, 2>(b + 128 + 32 * n + 16 * half, r.h);
        r.hd[0] = *(const u16*)(b + 192 + 2 * sb);  // this step's two 16-value scales
        r.hd[1] = *(const u16*)(b + 208);
    }
}

// Byte i (0..15) of four words, i not known at compile time, without an
// indexed (local-memory) access.
__device__ __forceinline__ u32 byte_sel(const u32 (&w)[4], int i) {
    const u32 v = i < 4 ? w[0] : i < 8 ? w[1] : i < 12 ? w[2] : w[3];
    return (v >> (8 * (i & 3))) & 0xFFu;
}

// Bits 0..3 of x to bit 4 of bytes 0..3.
__device__ __forceinline__ u32 spread4(u32 x) { return (((x & 0xFu) * 0x00204081u) & 0x01010101u) << 4; }

// A thread's 16 stored q's (unsigned, one a byte, value j in byte j % 4 of
// u[j / 4]) and their scale and min: value = sc * (q - q_offset(T)) - mn.
template <int T>
__device__ __forceinline__ void decode_q(const RawW& r, int s, int half, u32 (&u)[4], float& sc, float& mn) {
    if (T == T_Q8_0) {
        sc = f16_to_f32((u16)r.hd[0]);
        mn = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) u[i] = r.q[i] ^ 0x80808080u;  // the signed q + 128
    } else if (T == T_Q4_0 || T == T_Q4_1 || T == T_Q5_0 || T == T_Q5_1) {
        sc = f16_to_f32((u16)r.hd[0]);
        mn = (T == T_Q4_1 || T == T_Q5_1) ? -f16_to_f32((u16)(r.hd[0] >> 16)) : 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) u[i] = (r.q[i] >> (4 * half)) & 0x0F0F0F0Fu;
        if (T == T_Q5_0 || T == T_Q5_1) {
            const u32 bits = r.h[0] >> (16 * half);
#pragma unroll
            for (int i = 0; i < 4; i++) u[i] |= spread4(bits >> (4 * i));
        }
    } else if (T == T_Q4_K || T == T_Q5_K) {
        const int sb = s & 7;
        const u32 sw[4] = {r.hd[1], r.hd[2], r.hd[3], 0u};  // scales[12] as bytes 0..11
        int qs, qm;
        if (sb < 4) {
            qs = byte_sel(sw, sb) & 63;
            qm = byte_sel(sw, sb + 4) & 63;
        } else {
            qs = (byte_sel(sw, sb + 4) & 0xF) | ((byte_sel(sw, sb - 4) >> 6) << 4);
            qm = (byte_sel(sw, sb + 4) >> 4) | ((byte_sel(sw, sb) >> 6) << 4);
        }
        sc = __fmul_rn(f16_to_f32((u16)r.hd[0]), i2f(qs));
        mn = __fmul_rn(f16_to_f32((u16)(r.hd[0] >> 16)), i2f(qm));
#pragma unroll
        for (int i = 0; i < 4; i++) u[i] = (r.q[i] >> (4 * (sb & 1))) & 0x0F0F0F0Fu;
        if (T == T_Q5_K) {
#pragma unroll
            for (int i = 0; i < 4; i++) u[i] |= ((r.h[i] >> sb) & 0x01010101u) << 4;
        }
    } else {  // Q6_K
        const int quarter = s & 3;
        sc = __fmul_rn(f16_to_f32((u16)r.hd[1]), i2f((i8)((r.hd[0] >> (8 * half)) & 0xFF)));
        mn = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++)
            u[i] = ((r.q[i] >> (4 * (quarter >> 1))) & 0x0F0F0F0Fu) | (((r.h[i] >> (2 * quarter)) & 0x03030303u) << 4);
    }
}

// A thread's 16 values as 8 f16x2 words. A q byte becomes the float 2^23 +
// q by one byte permute (0x4B000000 is 2^23), and the subtraction of 2^23 +
// offset is exact.
template <int T>
__device__ __forceinline__ void decode_f16(const RawW& r, int s, int half, u32 (&out)[8]) {
    if (T == T_MXFP4) {
        // Twice the E2M1 value times half the block's scale: exact in f32,
        // rounded once to f16 (exact but for scales past f16's range).
        const float sc = e8m0_half((u8)r.hd[0]);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const u32 w = (r.q[i] >> (4 * half)) & 0x0F0F0F0Fu;
            float v[4];
#pragma unroll
            for (int b = 0; b < 4; b++) v[b] = __fmul_rn(mxfp4_doubled((w >> (8 * b)) & 0xFu), sc);
            out[2 * i] = pack_f16_sat(v[0], v[1]);
            out[2 * i + 1] = pack_f16_sat(v[2], v[3]);
        }
        return;
    }
    u32 u[4];
    float sc, mn;
    decode_q<T>(r, s, half, u, sc, mn);
    constexpr float BASE = 8388608.0f + (float)q_offset(T);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float v[4];
#pragma unroll
        for (int b = 0; b < 4; b++) {
            const float q = __uint_as_float(__byte_perm(u[i], 0x4B000000u, 0x7440u | b)) - BASE;
            v[b] = fmaf(sc, q, -mn);
        }
        out[2 * i] = pack_f16_sat(v[0], v[1]);
        out[2 * i + 1] = pack_f16_sat(v[2], v[3]);
    }
}

// Row stride of the staged operands, in 32-bit words: 32 f16 values and 16
// bytes of padding (80 bytes, so ldmatrix's eight rows hit distinct banks).
#define GQ_STRIDE 20

// Steps s_begin .. s_end of the tile of weight rows blockIdx.x * GTC_BR..
// and rows t0.. of x into out (+ bias where given). xh, xl: x's high and
// low f16 parts, [n][cols] each.
template <int T>
__device__ __forceinline__ void gemm_int_impl(const u8* __restrict__ W, i64 row_bytes, int rows, int cols,
                                              const u16* __restrict__ xh, const u16* __restrict__ xl, int n,
                                              int t0, const float* __restrict__ bias, float* __restrict__ out,
                                              int s_begin, int s_end) {
    extern __shared__ __align__(16) u32 smem[];
    // Two buffers of: weights [GTC_BR][GQ_STRIDE], x's high and low parts
    // [GTC_BT][GQ_STRIDE] each, all f16.
    constexpr int W_WORDS = GTC_BR * GQ_STRIDE, X_WORDS = GTC_BT * GQ_STRIDE;
    constexpr int BUF = W_WORDS + 2 * X_WORDS;
    static_assert(2 * BUF * 4 <= 2 * (GTC_BR + GTC_BT) * (GTC_BK + GTC_PAD) * 4, "fits GTC_SMEM_BYTES");

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int r0 = blockIdx.x * GTC_BR;
    const int wr = (warp & 3) * 32, wt = (warp >> 2) * 32;
    // Staging roles: weight row wrow, values 16*whalf..; token xt, values 8*xpart..
    const int wrow = tid >> 1, whalf = tid & 1;
    const int xt = tid >> 2, xpart = tid & 3;
    const bool wvalid = r0 + wrow < rows, xvalid = t0 + xt < n;
    const u8* wsrc = W + (i64)(wvalid ? r0 + wrow : 0) * row_bytes;
    const i64 xoff = (i64)(xvalid ? t0 + xt : 0) * cols + 8 * xpart;
    const u16* xhs = xh + xoff;
    const u16* xls = xl + xoff;
    // This warp's tokens that exist (warp-uniform): groups of 8 past the
    // prompt's end skip their products (a 20-token prompt fills 20 of 64).
    const int live = n - (t0 + wt);

    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    // A step's loads: weight bytes and x's two parts, two steps ahead (one
    // step's products are too short to hide the memory's latency; with one
    // step ahead the weights streamed slowly: benches/results/kernel-choices.md).
    struct Loads {
        RawW w;
        uint4 xh, xl;
    };
    auto fetch = [&](int s, Loads& l) {
        if (s >= s_end) return;
        if (wvalid) fetch_w<T>(wsrc, s, whalf, l.w);
        if (xvalid) {
            l.xh = *(const uint4*)(xhs + s * GTC_BK);
            l.xl = *(const uint4*)(xls + s * GTC_BK);
        }
    };
    auto stage = [&](int s, const Loads& l) {
        if (s >= s_end) return;
        u32* buf = smem + ((s - s_begin) & 1) * BUF;
        u32 w[8];
        if (wvalid) {
            decode_f16<T>(l.w, s, whalf, w);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) w[i] = 0u;
        }
        uint4* wd = (uint4*)(buf + wrow * GQ_STRIDE + 8 * whalf);
        wd[0] = make_uint4(w[0], w[1], w[2], w[3]);
        wd[1] = make_uint4(w[4], w[5], w[6], w[7]);
        *(uint4*)(buf + W_WORDS + xt * GQ_STRIDE + 4 * xpart) = l.xh;
        *(uint4*)(buf + W_WORDS + X_WORDS + xt * GQ_STRIDE + 4 * xpart) = l.xl;
    };
    auto products = [&](int s) {
        if (live <= 0) return;
        const u32* buf = smem + ((s - s_begin) & 1) * BUF;
        const u32 wbase = shared_addr(buf), xhbase = shared_addr(buf + W_WORDS);
        const u32 xlbase = shared_addr(buf + W_WORDS + X_WORDS);
#pragma unroll
        for (int kk = 0; kk < GTC_BK; kk += 16) {
            u32 a[2][4], bh[4][2], bl[4][2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int row = wr + 16 * i + (lane & 7) + 8 * ((lane >> 3) & 1);
                ldmatrix_x4(a[i], wbase + (row * GQ_STRIDE) * 4 + (kk + 8 * (lane >> 4)) * 2);
            }
#pragma unroll
            for (int p = 0; p < 2; p++) {
                if (live <= 16 * p) break;
                const int tok = wt + 16 * p + (lane & 7) + 8 * (lane >> 4);
                const u32 off = (tok * GQ_STRIDE) * 4 + (kk + 8 * ((lane >> 3) & 1)) * 2;
                u32 r[4];
                ldmatrix_x4(r, xhbase + off);
                bh[2 * p][0] = r[0]; bh[2 * p][1] = r[1]; bh[2 * p + 1][0] = r[2]; bh[2 * p + 1][1] = r[3];
                ldmatrix_x4(r, xlbase + off);
                bl[2 * p][0] = r[0]; bl[2 * p][1] = r[1]; bl[2 * p + 1][0] = r[2]; bl[2 * p + 1][1] = r[3];
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                if (live <= 8 * j) break;
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    // The small part first, so the large one is added last.
                    mma_f16(acc[i][j], a[i], bl[j][0], bl[j][1]);
                    mma_f16(acc[i][j], a[i], bh[j][0], bh[j][1]);
                }
            }
        }
    };

    // Two sets of loads, a and b, used in turn (the loop is unrolled by
    // two so that each is a set of registers). An empty range (none is
    // launched: the host checks) writes zeros.
    Loads a, b;
    a.xh = a.xl = b.xh = b.xl = make_uint4(0u, 0u, 0u, 0u);
    fetch(s_begin, a);
    fetch(s_begin + 1, b);
    stage(s_begin, a);
    __syncthreads();
    for (int s = s_begin; s < s_end; s += 2) {
        fetch(s + 2, a);
        products(s);
        stage(s + 1, b);
        __syncthreads();
        if (s + 1 >= s_end) break;
        fetch(s + 3, b);
        products(s + 1);
        stage(s + 2, a);
        __syncthreads();
    }
    store_tile(acc, r0 + wr, t0 + wt, lane, rows, n, bias, out);
}

// Two blocks per SM: registers are capped at 128 a thread.
#define DEF_GEMM_TCK(name, T)                                                                            \
    extern "C" __global__ void __launch_bounds__(GTC_THREADS, 2)                                         \
        gemm_tck_##name(const u8* W, i64 row_bytes, int rows, int cols, const u16* xh, int n, int splits, \
                        float* part) {                                                                   \
        pdl_start();                                                                                     \
        const int steps = cols / GTC_BK, per = (steps + splits - 1) / splits;                           \
        const int s0 = blockIdx.z * per, s1 = min(steps, s0 + per);                                      \
        gemm_int_impl<T>(W, row_bytes, rows, cols, xh, xh + (i64)n * cols, n, blockIdx.y * GTC_BT, nullptr, \
                         part + (i64)blockIdx.z * n * rows, s0, s1);                                     \
    }

#if !defined(ONE_PART) || ONE_PART == 0
FOR_EACH_INT_TYPE(DEF_GEMM_TCK)
#endif

// `gemm_moe_<type>`: a mixture of experts' products for many rows of x
// (prefill), every expert in one launch. x's rows are gathered by expert
// (moe_gather_f16: a token's row once for each expert it is routed to) and
// split into f16 parts, xh [m][cols] then xl; tiles[y] = (expert, first
// row, rows <= GTC_BT, 0) is the y-th tile of rows, all of one expert, so
// block (x, y) multiplies that expert's weight rows x * GTC_BR.. (expert e's
// rows of W are e * rows..) with them, as gemm_tck does, and writes
// out[first..][..] with bias row e added. Part 2 of the module: compiled
// only for the formats experts are stored in.
#define DEF_GEMM_MOE(name, T)                                                                            \
    extern "C" __global__ void __launch_bounds__(GTC_THREADS, 2)                                         \
        gemm_moe_##name(const u8* W, i64 row_bytes, int rows, int cols, int experts, const int* tiles,    \
                        const u16* xh, int m, const float* bias, float* out) {                           \
        pdl_start();                                                                                     \
        const int4 tl = ((const int4*)tiles)[blockIdx.y];                                                \
        if (tl.x < 0 || tl.x >= experts || tl.y < 0 || tl.z <= 0 || tl.y + tl.z > m) return;            \
        gemm_int_impl<T>(W + (i64)tl.x * rows * row_bytes, row_bytes, rows, cols, xh + (i64)tl.y * cols,  \
                         xh + ((i64)m + tl.y) * cols, tl.z, 0, bias ? bias + (i64)tl.x * rows : nullptr,  \
                         out + (i64)tl.y * rows, 0, cols / GTC_BK);                                      \
    }

#if !defined(ONE_PART) || ONE_PART == 2
FOR_EACH_F16_TILE_TYPE(DEF_GEMM_MOE)
#endif

// gemm_tc_<type> for the float formats (3xTF32). Two blocks per SM.
#define DEF_GEMM_TC(name, T)                                                                             \
    extern "C" __global__ void __launch_bounds__(GTC_THREADS, 2)                                         \
        gemm_tc_##name(const u8* W, i64 row_bytes, int rows, int cols, const float* x, int n,            \
                       const float* bias, float* out) {                                                  \
        pdl_start();                                                                                     \
        gemm_tf32_impl<T>(W, row_bytes, rows, cols, x, n, bias, out);                                    \
    }

#if !defined(ONE_PART) || ONE_PART == 0
FOR_EACH_FLOAT_TYPE(DEF_GEMM_TC)
#endif


// ---- prefill on cuBLAS (backend/cuda/blas.rs) ----
//
// dequant_f16_<type>: rows r0 .. r0 + nrows of W decoded as the CPU decodes
// them (deq8) and rounded to f16 (beyond f16's range: +-65504), row-major
// [nrows][cols], for cuBLAS's f16 GEMM with f32 accumulation. A thread per
// 8-value chunk: cols is a multiple of 8, out 16-byte aligned.
#define DEF_DEQUANT_F16(name, T)                                                                         \
    extern "C" __global__ void dequant_f16_##name(const u8* W, i64 row_bytes, int rows, int cols, int r0, \
                                                  int nrows, u16* out) {                                 \
        pdl_start();                                                                                     \
        const int chunks = cols >> 3;                                                                    \
        const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;                                        \
        if (i >= (i64)nrows * chunks || r0 + nrows > rows) return;                                       \
        const int r = (int)(i / chunks), c = (int)(i - (i64)r * chunks);                                 \
        float v[8];                                                                                      \
        deq8<T>(W + (i64)(r0 + r) * row_bytes, c, cols, v);                                              \
        ((uint4*)out)[i] = make_uint4(pack_f16(f16_range(v[0]), f16_range(v[1])),                        \
                                      pack_f16(f16_range(v[2]), f16_range(v[3])),                        \
                                      pack_f16(f16_range(v[4]), f16_range(v[5])),                        \
                                      pack_f16(f16_range(v[6]), f16_range(v[7])));                       \
    }

#if !defined(ONE_PART) || ONE_PART == 0
FOR_EACH_TYPE(DEF_DEQUANT_F16)
#endif
