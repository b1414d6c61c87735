// gemm_few.cu: `gemm_few_<type>`, part 1 of gemm.cu's module (-DONE_PART).
// Not a module of its own: NVRTC reads gemm.cu and this file as one text
// (source.rs, `Module::files`), so it uses the headers gemm.cu includes and
// gemm_tck's weight loads (RawW, fetch_w) and decode_f16 defined there.

// ---- few rows of x: weights decoded straight into the A fragments (gemm_few_<type>) ----
//
// Short prompts (and, later, a few jobs' decode rows) read every weight once
// while the products are few, so the kernel is the weights' stream: no
// shared-memory staging, no barrier. Each warp takes 32 weight rows (two
// m16 tiles, so each x fragment serves both) over 64-column chunks of its
// column range; a lane decodes 16 consecutive values of each of its four
// rows (g, g + 8, g + 16, g + 24) with gemm_tck's decode_f16, so a product
// has the precision of gemm_tck's and cuBLAS's. Within a chunk the columns
// are permuted alike in A and B: in k-step k (0..3) lane t's fragment slots
// 2t, 2t+1, 2t+8, 2t+9 hold its values 4k .. 4k+3, so its x is 16
// consecutive f16 values a part (two 16-byte loads, from L1: the block's
// warps share the chunk). The chunk after is fetched while this one is
// multiplied. Column ranges along z, products summed by gemm_splits_sum, as
// for gemm_tck. Accumulation order is fixed and a row of x's results do not
// depend on the other rows (mma's columns are apart; n only bounds work).
#if !defined(GF_WARPS) || !defined(GF_BLOCKS_PER_SM) || !defined(GF_MAX_TOKENS)
#error "GF_WARPS, GF_BLOCKS_PER_SM and GF_MAX_TOKENS come from the worker as -D options"
#endif
constexpr int GF_NT = (GF_MAX_TOKENS + 7) / 8;

// Q8_0's 16 values as f16x2 words, bit for bit as decode_f16 gives them,
// in a third of its instructions: a byte q + 128 becomes the f16 1024 + q +
// 128 by one byte permute (0x64 is the high byte of 1024), subtracting 1152
// is exact, and one f16 product rounds d * q once, as decode_f16's f32
// product (exact) rounded to f16 does. Only for |d| <= 511.75, where no
// product passes f16's largest value (decode_f16 clamps those).
__device__ __forceinline__ bool q8_0_f16_exact(const RawW& r) { return (r.hd[0] & 0x7FFFu) <= 0x5FFFu; }

__device__ __forceinline__ void decode_f16_q8_0(const RawW& r, u32 (&out)[8]) {
    const u32 d2 = (r.hd[0] & 0xFFFFu) * 0x00010001u;
    const u32 base = 0x64806480u;  // 1152 twice
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const u32 u = r.q[i] ^ 0x80808080u;
        u32 lo = __byte_perm(u, 0x64646464u, 0x4140u), hi = __byte_perm(u, 0x64646464u, 0x4342u);
        asm("sub.rn.f16x2 %0, %0, %2;\n\tmul.rn.f16x2 %0, %0, %3;\n\t"
            "sub.rn.f16x2 %1, %1, %2;\n\tmul.rn.f16x2 %1, %1, %3;"
            : "+r"(lo), "+r"(hi)
            : "r"(base), "r"(d2));
        out[2 * i] = lo;
        out[2 * i + 1] = hi;
    }
}

template <int T>
__device__ __forceinline__ void gemm_few_impl(const u8* __restrict__ W, i64 row_bytes, int rows, int cols,
                                              const u16* __restrict__ xh, int n, float* __restrict__ out,
                                              int c_begin, int c_end) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = (blockIdx.x * GF_WARPS + warp) * 32;
    // The lane's 16 values of a chunk: step 2c + sub (32 columns), half.
    const int sub = t >> 1, half = t & 1;
    // Rows past the matrix read row 0 (their sums are never written).
    const u8* wrow[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = r0 + g + 8 * i;
        wrow[i] = W + (i64)(r < rows ? r : 0) * row_bytes;
    }
    const u16* xl = xh + (i64)n * cols;
    const int nx = (n + 7) / 8;
    const i64 chunk_bytes = 64 * row_bytes / cols;
    float acc[2][GF_NT][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int j = 0; j < GF_NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[m][j][e] = 0.0f;

    // The first chunk's weights before the wait for the kernel ahead (x is
    // what it writes; weights do not change).
    RawW raw[4];
    if (c_begin < c_end) {
#pragma unroll
        for (int i = 0; i < 4; i++) fetch_w<T>(wrow[i], 2 * c_begin + sub, half, raw[i]);
    }
    pdl_wait();
    for (int c = c_begin; c < c_end; c++) {
        u32 a[4][8];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (T == T_Q8_0 && q8_0_f16_exact(raw[i])) decode_f16_q8_0(raw[i], a[i]);
            else decode_f16<T>(raw[i], 2 * c + sub, half, a[i]);
        }
        if (c + 1 < c_end) {
#pragma unroll
            for (int i = 0; i < 4; i++) fetch_w<T>(wrow[i], 2 * c + 2 + sub, half, raw[i]);
            // x of the next chunk into L1, a line (64 values of a row, of a
            // part) a thread of the block: its first loads here came from
            // L2 with every warp waiting on them.
            for (int k = threadIdx.x; k < 2 * n; k += GF_WARPS * 32) prefetch_l1(xh + (i64)k * cols + 64 * (c + 1));
        }
        if (c + 3 < c_end) {
            // The weights three chunks ahead into L2, from four points of
            // each row's chunk (they come to registers a chunk ahead).
#pragma unroll
            for (int i = 0; i < 4; i++) prefetch_l2(wrow[i] + (i64)(c + 3) * chunk_bytes + t * chunk_bytes / 3);
        }
#pragma unroll
        for (int j = 0; j < GF_NT; j++) {
            if (j >= nx) break;
            const int tok = 8 * j + g;
            uint4 h0 = make_uint4(0u, 0u, 0u, 0u), h1 = h0, l0 = h0, l1 = h0;
            if (tok < n) {
                const i64 o = (i64)tok * cols + 64 * c + 16 * t;
                h0 = *(const uint4*)(xh + o);
                h1 = *(const uint4*)(xh + o + 8);
                l0 = *(const uint4*)(xl + o);
                l1 = *(const uint4*)(xl + o + 8);
            }
            const u32 bh[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
            const u32 bl[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
#pragma unroll
                for (int m = 0; m < 2; m++) {
                    const u32 fa[4] = {a[2 * m][2 * k], a[2 * m + 1][2 * k], a[2 * m][2 * k + 1],
                                       a[2 * m + 1][2 * k + 1]};
                    // The small part first, so the large one is added last.
                    mma_f16(acc[m][j], fa, bl[2 * k], bl[2 * k + 1]);
                    mma_f16(acc[m][j], fa, bh[2 * k], bh[2 * k + 1]);
                }
            }
        }
    }
    // acc[m][j]: rows r0 + 16 m + g (+ 8), tokens 8 j + 2 t (+ 1).
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int j = 0; j < GF_NT; j++) {
            if (j >= nx) break;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = r0 + 16 * m + g + 8 * (e >> 1), tok = 8 * j + 2 * t + (e & 1);
                if (row < rows && tok < n) out[(i64)tok * rows + row] = acc[m][j][e];
            }
        }
}

// GF_BLOCKS_PER_SM (3) blocks of GF_WARPS warps an SM: registers capped at
// 168 a thread.
#define DEF_GEMM_FEW(name, T)                                                                            \
    extern "C" __global__ void __launch_bounds__(GF_WARPS * 32, GF_BLOCKS_PER_SM)                        \
        gemm_few_##name(const u8* W, i64 row_bytes, int rows, int cols, const u16* xh, int n, int splits, \
                        float* part) {                                                                   \
        pdl_launch_next(); /* gemm_few_impl waits after its first loads */                               \
        const int chunks = cols / 64, per = (chunks + splits - 1) / splits;                              \
        const int c0 = blockIdx.z * per, c1 = min(chunks, c0 + per);                                     \
        gemm_few_impl<T>(W, row_bytes, rows, cols, xh, n, part + (i64)blockIdx.z * n * rows, c0, c1);   \
    }

#if !defined(ONE_PART) || ONE_PART == 1
FOR_EACH_INT_TYPE(DEF_GEMM_FEW)
#endif
