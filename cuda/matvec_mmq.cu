// matvec_mmq.cu: `mmq_q8_0`, the last part of matvec.cu's module (part 1,
// -DONE_PART). Not a module of its own: NVRTC reads matvec.cu,
// matvec_mv8.cu and this file as one text (source.rs, `Module::files`), so
// it uses the headers and x8 helpers the earlier files define.

// ---- short prompts in Q8_0 on the integer tensor cores (mmq_q8_0) ----
//
// 9 to MMQ_MAX_TOKENS rows of x (short prompts): Q8_0's weights are int8
// already and x is split by `quantize_x8` as for mv8_* (x ~ d * (hi + lo /
// 256) per 32 values), so each 32-value block of 16 weight rows meets 8 rows
// of x in two mma.m16n8k32 (hi, lo), and one scale product per output
// applies both blocks' scales: no decoding, no shared-memory staging. The
// weights stream from global memory straight into the A fragments.
// `gemm_tck_q8_0` (f16 tiles) ran short prompts well behind llama.cpp
// (benches/results/kernel-choices.md).
//
// The summation order does not depend on n. Within a 32-value block the
// values are permuted alike in A and B: lane t of a quad takes bytes 8t ..
// 8t+7 (two words: the fragment's k-slots 4t.. and 16+4t..).
#if !defined(MMQ_WARPS) || !defined(MMQ_MAX_TOKENS) || !defined(MMQ_UNROLL)
#error "MMQ_WARPS, MMQ_MAX_TOKENS and MMQ_UNROLL come from the worker as -D options"
#endif

// c = a b on the integer tensor cores (m16n8k32, s8 in, s32 out).
__device__ __forceinline__ void mma_s8(int (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};\n"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}

// One Q8_0 block of two weight rows (g and g + 8 of a 16-row tile) as this
// lane's share of an A fragment: bytes 8t .. 8t+7 and both rows' scales
// (ld_a2 reads up to 2 bytes past them: the block's next bytes, or the
// weight tail).
struct MmqA {
    u32 qa[2], qb[2];
    u16 da, db;
};

__device__ __forceinline__ MmqA mmq_load_a(const u8* ra, const u8* rb, int kb, int t) {
    const u8* pa = ra + (i64)kb * 34;
    const u8* pb = rb + (i64)kb * 34;
    MmqA r;
    ld_a2<2>(pa + 2 + 8 * t, r.qa);
    ld_a2<2>(pb + 2 + 8 * t, r.qb);
    r.da = *(const u16*)pa;
    r.db = *(const u16*)pb;
    return r;
}

// x's share of a B fragment: token tok's values 8t .. 8t+7 of block kb, hi and lo.
__device__ __forceinline__ void x8_frag(const X8& x, int cols, int tok, int kb, int t, uint2* h, uint2* l) {
    const i64 o = (i64)tok * cols + 32 * kb + 8 * t;
    *h = *(const uint2*)(x.hi + o);
    *l = *(const uint2*)(x.lo + o);
}

// A block: 16 weight rows, MMQ_WARPS warps each taking a contiguous range
// of the rows' 32-value blocks, MMQ_UNROLL blocks' weights in flight a warp.
// The warps' partial sums are added in warp order in shared memory.
//
// Each A fragment load touches 8 rows (lines), so the load/store unit, not
// the memory, bounds the kernel, and every 8 rows of x add their own x
// loads: it beats gemm_tck_q8_0 up to ~20 rows of x, so the worker sends it
// short prompts only (kernels/matvec/mod.rs, MMQ_MAX_ROWS). Built for fewer
// rows (fewer registers) it was slower. Figures in
// benches/results/kernel-choices.md.
// Staging x in shared memory (cp.async) instead was slower at every n.
__device__ __forceinline__ void mmq_rows(const u8* __restrict__ W, i64 row_bytes, int rows, int cols, int n,
                                         const X8& x, const float* __restrict__ bias, float* __restrict__ out) {
    constexpr int NT = (MMQ_MAX_TOKENS + 7) / 8;
    __shared__ float red[MMQ_WARPS][8 * NT][16];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = blockIdx.x * 16;
    // Rows past the matrix read row 0 (their sums are never written).
    const u8* ra = W + (i64)(r0 + g < rows ? r0 + g : 0) * row_bytes;
    const u8* rb = W + (i64)(r0 + g + 8 < rows ? r0 + g + 8 : 0) * row_bytes;
    const int kblocks = cols / 32, per = (kblocks + MMQ_WARPS - 1) / MMQ_WARPS;
    const int kb0 = min(kblocks, warp * per), kb1 = min(kblocks, kb0 + per);
    const int nx = (n + 7) / 8;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = 0.0f;
    // The first blocks' weights before the wait for the kernel ahead
    // (weights do not change; see pdl_launch_next).
    MmqA a[MMQ_UNROLL];
#pragma unroll
    for (int u = 0; u < MMQ_UNROLL; u++)
        if (kb0 + u < kb1) a[u] = mmq_load_a(ra, rb, kb0 + u, t);
    pdl_wait();
    for (int kb = kb0; kb < kb1; kb += MMQ_UNROLL) {
        if (kb != kb0) {
#pragma unroll
            for (int u = 0; u < MMQ_UNROLL; u++)
                if (kb + u < kb1) a[u] = mmq_load_a(ra, rb, kb + u, t);
        }
#pragma unroll
        for (int u = 0; u < MMQ_UNROLL; u++) {
            if (kb + u >= kb1) break;
            const u32 frag[4] = {a[u].qa[0], a[u].qb[0], a[u].qa[1], a[u].qb[1]};
            const float da = f16_to_f32(a[u].da), db = f16_to_f32(a[u].db);
#pragma unroll
            for (int j = 0; j < NT; j++) {
                if (j >= nx) break;
                uint2 h = make_uint2(0u, 0u), l = make_uint2(0u, 0u);
                if (8 * j + g < n) x8_frag(x, cols, 8 * j + g, kb + u, t, &h, &l);
                const int t0 = 8 * j + 2 * t;
                const float x0 = t0 < n ? x.d[(i64)t0 * kblocks + kb + u] : 0.0f;
                const float x1 = t0 + 1 < n ? x.d[(i64)(t0 + 1) * kblocks + kb + u] : 0.0f;
                int ch[4], cl[4];
                mma_s8(ch, frag, h.x, h.y);
                mma_s8(cl, frag, l.x, l.y);
                acc[j][0] = fmaf(da * x0, fmaf((float)cl[0], 0.00390625f, (float)ch[0]), acc[j][0]);
                acc[j][1] = fmaf(da * x1, fmaf((float)cl[1], 0.00390625f, (float)ch[1]), acc[j][1]);
                acc[j][2] = fmaf(db * x0, fmaf((float)cl[2], 0.00390625f, (float)ch[2]), acc[j][2]);
                acc[j][3] = fmaf(db * x1, fmaf((float)cl[3], 0.00390625f, (float)ch[3]), acc[j][3]);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NT; j++) {
        if (j >= nx) break;
        const int t0 = 8 * j + 2 * t;
        red[warp][t0][g] = acc[j][0];
        red[warp][t0 + 1][g] = acc[j][1];
        red[warp][t0][g + 8] = acc[j][2];
        red[warp][t0 + 1][g + 8] = acc[j][3];
    }
    __syncthreads();
    for (int k = threadIdx.x; k < 16 * n; k += MMQ_WARPS * 32) {
        const int r = k & 15, tok = k >> 4, row = r0 + r;
        if (row >= rows) continue;
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < MMQ_WARPS; w++) s += red[w][tok][r];
        out[(i64)tok * rows + row] = bias ? s + bias[row] : s;
    }
}

#if (!defined(ONE_PART) || ONE_PART == 1) && (!defined(ONE_FORMAT_ID) || ONE_FORMAT_ID == T_Q8_0)
extern "C" __global__ void __launch_bounds__(MMQ_WARPS * 32)
    mmq_q8_0(const u8* W, i64 row_bytes, int rows, int cols, int n, const i8* xh, const i8* xl, const float* xd,
             const float* xs, const float* bias, float* out) {
    pdl_launch_next(); /* mmq_rows waits after its first loads */
    mmq_rows(W, row_bytes, rows, cols, n, X8{xh, xl, xd, xs}, bias, out);
}
#endif
