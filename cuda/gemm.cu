// gemm.cu: out[t][r] = sum_c x[t][c] * W[r][c] (+ bias[r]) for many rows of
// x (prefill) on tensor cores: `gemm_tc_<type>`.
//
// Each block computes a GTC_BR x GTC_BT tile of out^T (weight rows x tokens).
// Per step of GTC_BK columns it decodes its weight rows' chunks with deq8
// (dequant.cuh: the values the CPU decodes, in f32) and its tokens' x into
// shared memory, then its 8 warps multiply with `mma.sync.m16n8k8` on TF32.
// TF32 keeps 10 mantissa bits, too few for a reference worker, so every
// operand is split into a TF32 high part and the TF32 rounding of the rest,
// and three products are summed (hi*hi + hi*lo + lo*hi, the "3xTF32" scheme
// of CUTLASS): about f32 accuracy at a third of the tensor-core rate, still
// several times the CUDA cores' f32 rate. Accumulation is f32 in a fixed
// order (deterministic).
#include "common.cuh"
#include "dequant.cuh"

// Shared with the host's launch geometry: defined once in the worker
// (backend/cuda/source.rs) and passed as -D options. The warp layout below
// assumes these values; GTC_PAD = 4 makes the fragment loads conflict-free.
#if !defined(GTC_BR) || !defined(GTC_BT) || !defined(GTC_BK) || !defined(GTC_THREADS) || !defined(GTC_PAD)
#error "GTC_BR, GTC_BT, GTC_BK, GTC_THREADS and GTC_PAD come from the worker as -D options"
#endif
static_assert(GTC_BR == 128 && GTC_BT == 64 && GTC_BK == 32 && GTC_THREADS == 256 && GTC_PAD == 4,
              "8 warps of 32 x 32 outputs, 4 x 8-value chunks per row and step");

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

// The block's dynamic shared memory: 2 * (GTC_BR + GTC_BT) * (GTC_BK +
// GTC_PAD) * 4 bytes, over the 48 KB static limit (the loader raises the
// kernel's limit; GTC_SMEM_BYTES in source.rs).
template <int T>
__device__ __forceinline__ void gemm_tc_impl(const u8* __restrict__ W, i64 row_bytes, int rows, int cols,
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
    // acc[i][j]: rows wr + 16i + g (+8), tokens wt + 8j + 2q (+1).
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = r0 + wr + 16 * i + g + 8 * (e >> 1);
                const int t = t0 + wt + 8 * j + 2 * q + (e & 1);
                if (r < rows && t < n) out[(i64)t * rows + r] = bias ? acc[i][j][e] + bias[r] : acc[i][j][e];
            }
}

#define DEF_GEMM_TC(name, T)                                                                             \
    extern "C" __global__ void __launch_bounds__(GTC_THREADS)                                            \
        gemm_tc_##name(const u8* W, i64 row_bytes, int rows, int cols, const float* x, int n,            \
                       const float* bias, float* out) {                                                  \
        gemm_tc_impl<T>(W, row_bytes, rows, cols, x, n, bias, out);                                      \
    }

FOR_EACH_TYPE(DEF_GEMM_TC)
