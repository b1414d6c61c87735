// matmul.cu: out[t][r] = sum_c x[t][c] * W[r][c] (+ bias[r]) with W in its
// stored format (dequant.cuh), x and out f32 row-major.
//
// Two kernels per format, both computing every output with one thread or one
// warp in a fixed order (deterministic, no atomics):
//   mv_<type>    for up to MV_MAX_TOKENS rows of x (decode): one block per
//                weight row, threads stride over 8-value chunks, decoding in
//                registers; butterfly warp sums, then the warps in order.
//   mvw_<type>   the same with one warp per row, for matrices of many rows.
//   gemm_<type>  for longer x (prefill): 64x64 output tiles; each 32-wide
//                slice of K is decoded into shared memory (never a full
//                dequantized copy of W) and multiplied there in f32.
#include "common.cuh"
#include "dequant.cuh"

// Shared with the host's launch geometry: defined once in the worker
// (backend/cuda/source.rs) and passed to NVRTC as -D options.
#if !defined(MV_MAX_TOKENS) || !defined(MV_THREADS)
#error "MV_MAX_TOKENS and MV_THREADS come from the worker as -D options"
#endif

// Eight activations x[8c..8c+7] (zeros past `left` values), with 16-byte
// loads when the row allows them.
__device__ __forceinline__ void load_x8(const float* __restrict__ xp, int left, bool vec, float* xv) {
    if (vec && left >= 8) {
        const float4 a = *(const float4*)xp, b = *(const float4*)(xp + 4);
        xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w;
        xv[4] = b.x; xv[5] = b.y; xv[6] = b.z; xv[7] = b.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) xv[i] = i < left ? xp[i] : 0.0f;
    }
}

// Adds chunk `c` (8 weights of row `wrow`, decoded) times the same 8 values
// of each of the `n` rows of x to `acc[t]`, in a fixed order: the inner step
// shared by mv_impl and mvw_impl.
template <int T>
__device__ __forceinline__ void mv_chunk(const u8* __restrict__ wrow, int c, int cols, const float* __restrict__ x,
                                         int n, bool vec, float (&acc)[MV_MAX_TOKENS]) {
    float w[8];
    deq8<T>(wrow, c, cols, w);
    const int base = 8 * c, left = cols - base;
#pragma unroll
    for (int t = 0; t < MV_MAX_TOKENS; t++) {
        if (t < n) {
            float xv[8];
            load_x8(x + (i64)t * cols + base, left, vec, xv);
            float s = acc[t];
#pragma unroll
            for (int i = 0; i < 8; i++) s = fmaf(w[i], xv[i], s);
            acc[t] = s;
        }
    }
}

// One block of MV_THREADS per weight row: thread i takes chunks i, i + 128,
// ... (so a 576-wide row needs one round of loads), then each warp sums its
// lanes with a butterfly and the four warp sums are added in warp order.
template <int T>
__device__ __forceinline__ void mv_impl(const u8* __restrict__ W, i64 row_bytes, int rows, int cols,
                                        const float* __restrict__ x, int n, const float* __restrict__ bias,
                                        float* __restrict__ out) {
    __shared__ float red[MV_THREADS / 32][MV_MAX_TOKENS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int r = blockIdx.x;
    if (r >= rows) return;
    const u8* wrow = W + (i64)r * row_bytes;
    const int nchunks = (cols + 7) >> 3;
    const bool vec = (cols & 3) == 0;
    float acc[MV_MAX_TOKENS];
#pragma unroll
    for (int t = 0; t < MV_MAX_TOKENS; t++) acc[t] = 0.0f;
    for (int c = tid; c < nchunks; c += MV_THREADS) {
        mv_chunk<T>(wrow, c, cols, x, n, vec, acc);
    }
#pragma unroll
    for (int t = 0; t < MV_MAX_TOKENS; t++) {
        if (t < n) {
            const float s = warp_sum(acc[t]);
            if (lane == 0) red[warp][t] = s;
        }
    }
    __syncthreads();
    if (tid < n) {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < MV_THREADS / 32; w++) s += red[w][tid];
        out[(i64)tid * rows + r] = bias ? s + bias[r] : s;
    }
}

// One warp per weight row, MV_THREADS / 32 rows per block: for matrices with
// many rows (the LM head), where a block per row would mean tens of
// thousands of tiny blocks. The chunk loop is unrolled so that a lane has
// several chunks' loads in flight.
template <int T>
__device__ __forceinline__ void mvw_impl(const u8* __restrict__ W, i64 row_bytes, int rows, int cols,
                                         const float* __restrict__ x, int n, const float* __restrict__ bias,
                                         float* __restrict__ out) {
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * (MV_THREADS / 32) + (threadIdx.x >> 5);
    if (r >= rows) return;
    const u8* wrow = W + (i64)r * row_bytes;
    const int nchunks = (cols + 7) >> 3;
    const bool vec = (cols & 3) == 0;
    float acc[MV_MAX_TOKENS];
#pragma unroll
    for (int t = 0; t < MV_MAX_TOKENS; t++) acc[t] = 0.0f;
#pragma unroll 4
    for (int c = lane; c < nchunks; c += 32) {
        mv_chunk<T>(wrow, c, cols, x, n, vec, acc);
    }
#pragma unroll
    for (int t = 0; t < MV_MAX_TOKENS; t++) {
        if (t < n) {
            const float s = warp_sum(acc[t]);
            if (lane == 0) out[(i64)t * rows + r] = bias ? s + bias[r] : s;
        }
    }
}

// Shared with the host's launch geometry: defined once in the worker
// (backend/cuda/source.rs) and passed to NVRTC as -D options.
#if !defined(GEMM_BM) || !defined(GEMM_BN) || !defined(GEMM_BK) || !defined(GEMM_THREADS)
#error "GEMM_BM, GEMM_BN, GEMM_BK and GEMM_THREADS come from the worker as -D options"
#endif
// gemm_impl's thread layout: 16 x 16 threads of 4 x 4 outputs, and loaders
// of one 8-value chunk (4 per 32-wide slice) for each of 64 rows.
static_assert(GEMM_BM == 64 && GEMM_BN == 64 && GEMM_BK == 32 && GEMM_THREADS == 256,
              "gemm_impl is written for 64x64 tiles, 32-wide slices and 256 threads");

template <int T>
__device__ __forceinline__ void gemm_impl(const u8* __restrict__ W, i64 row_bytes, int rows, int cols,
                                          const float* __restrict__ x, int n, const float* __restrict__ bias,
                                          float* __restrict__ out) {
    __shared__ __align__(16) float Ws[GEMM_BK][GEMM_BM + 4];
    __shared__ __align__(16) float Xs[GEMM_BK][GEMM_BN + 4];
    const int tid = threadIdx.x;
    const int r0 = blockIdx.x * GEMM_BM, t0 = blockIdx.y * GEMM_BN;
    const int tr = tid & 15, tt = tid >> 4;  // this thread's 4 rows and 4 tokens
    // Loader roles: one 8-value chunk of one W row, and 8 values of one x row.
    const int lrow = tid >> 2, lpart = tid & 3;
    const int wr = r0 + lrow, xt = t0 + lrow;
    const u8* wrow = W + (i64)wr * row_bytes;
    const float* xrow = x + (i64)xt * cols;

    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < cols; k0 += GEMM_BK) {
        float v[8];
        const int c = (k0 >> 3) + lpart;
        if (wr < rows && 8 * c < cols) {
            deq8<T>(wrow, c, cols, v);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 8; i++) Ws[lpart * 8 + i][lrow] = v[i];
        const int kx = k0 + lpart * 8;
#pragma unroll
        for (int i = 0; i < 8; i++) Xs[lpart * 8 + i][lrow] = (xt < n && kx + i < cols) ? xrow[kx + i] : 0.0f;
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < GEMM_BK; k++) {
            const float4 a = *(const float4*)&Ws[k][tr * 4];
            const float4 b = *(const float4*)&Xs[k][tt * 4];
            const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int t = t0 + tt * 4 + j;
        if (t >= n) continue;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = r0 + tr * 4 + i;
            if (r < rows) out[(i64)t * rows + r] = bias ? acc[i][j] + bias[r] : acc[i][j];
        }
    }
}

// Two units a format (-DONE_PART, source.rs's Module::parts): mvw_* alone
// takes as long to compile as the rest, and a first start waits for the
// slowest unit.
#define DEF_MATMUL(name, T)                                                                              \
    extern "C" __global__ void __launch_bounds__(MV_THREADS)                                             \
        mv_##name(const u8* W, i64 row_bytes, int rows, int cols, const float* x, int n,                 \
                  const float* bias, float* out) {                                                       \
        pdl_start();                                                                                     \
        mv_impl<T>(W, row_bytes, rows, cols, x, n, bias, out);                                           \
    }                                                                                                    \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS)                                           \
        gemm_##name(const u8* W, i64 row_bytes, int rows, int cols, const float* x, int n,               \
                    const float* bias, float* out) {                                                     \
        pdl_start();                                                                                     \
        gemm_impl<T>(W, row_bytes, rows, cols, x, n, bias, out);                                         \
    }
#define DEF_MATVEC_WARP(name, T)                                                                         \
    extern "C" __global__ void __launch_bounds__(MV_THREADS)                                             \
        mvw_##name(const u8* W, i64 row_bytes, int rows, int cols, const float* x, int n,                \
                   const float* bias, float* out) {                                                      \
        pdl_start();                                                                                     \
        mvw_impl<T>(W, row_bytes, rows, cols, x, n, bias, out);                                          \
    }

#if !defined(ONE_PART) || ONE_PART == 0
FOR_EACH_TYPE(DEF_MATMUL)
#endif
#if !defined(ONE_PART) || ONE_PART == 1
FOR_EACH_TYPE(DEF_MATVEC_WARP)
#endif
