// elementwise.cu: SwiGLU, GeGLU, GELU, scaling and the residual add, one
// thread per element.
#include "common.cuh"

// GPT-2's GELU, the tanh approximation (M0-W-1433):
//   gelu(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
// The argument is written x * (1 + 0.044715 * x^2) so that it overflows only
// where x^2 does; tanhf saturates to +-1 for any large or infinite argument
// (it is not computed as a ratio of exponentials, which would give inf/inf),
// so the result is x for large positive x and -0 for large negative x.
__device__ __forceinline__ float gelu_tanh(float v) {
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    const float u = k * v * (1.0f + 0.044715f * v * v);
    return 0.5f * v * (1.0f + tanhf(u));
}

// out[i] = act(gate[i]) * up[i]: silu(g) = g / (1 + exp(-g)), or gelu_tanh.
// With xh set (one row, n a multiple of 32), out is also split for the
// next mat-vec as quantize_x8 splits it, saving that launch in decode.
template <bool GELU>
__device__ __forceinline__ void glu(const float* __restrict__ gate, const float* __restrict__ up, i64 n,
                                    float* __restrict__ out, i8* __restrict__ xh, i8* __restrict__ xl,
                                    float* __restrict__ xd, float* __restrict__ xs) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    const float a = GELU ? gelu_tanh(g) : __fdiv_rn(g, 1.0f + expf(-g));
    const float y = __fmul_rn(a, up[i]);
    out[i] = y;
    if (xh) split_x8(y, i, xh, xl, xd, xs);
}

extern "C" __global__ void swiglu(const float* __restrict__ gate, const float* __restrict__ up, i64 n,
                                  float* __restrict__ out, i8* __restrict__ xh, i8* __restrict__ xl,
                                  float* __restrict__ xd, float* __restrict__ xs) {
    pdl_start();
    glu<false>(gate, up, n, out, xh, xl, xd, xs);
}

extern "C" __global__ void geglu(const float* __restrict__ gate, const float* __restrict__ up, i64 n,
                                 float* __restrict__ out, i8* __restrict__ xh, i8* __restrict__ xl,
                                 float* __restrict__ xd, float* __restrict__ xs) {
    pdl_start();
    glu<true>(gate, up, n, out, xh, xl, xd, xs);
}

extern "C" __global__ void gelu(const float* __restrict__ x, i64 n, float* __restrict__ out) {
    pdl_start();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = gelu_tanh(x[i]);
}

// out[t][c] = x[t][start + c], c < cols: one part of a fused projection.
// n = rows * cols (the grid's elements).
extern "C" __global__ void copy_cols(const float* __restrict__ x, int x_cols, int start, int cols,
                                     float* __restrict__ out, i64 n) {
    pdl_start();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const i64 t = i / cols;
    out[i] = x[t * x_cols + start + (int)(i - t * cols)];
}

// keep_rows: row r of x ([rows, cols], a batched decode step's logits) to
// seqs[r].logits, the row's sequence's sampler. Grid (chunks of a row, rows).
extern "C" __global__ void keep_rows(const float* __restrict__ x, int cols, const RowSeq* __restrict__ seqs) {
    pdl_start();
    const int r = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    seqs[r].logits[c] = x[(i64)r * cols + c];
}

// ---- mixture of experts (gpt-oss) ----

// For each row t of logits ([n, experts], the router's products and bias):
// the `used` highest logits, the lower expert first on a tie, into
// ids[t * used + k] in that order, and their softmax into weights (the
// exponentials in f32 from the highest, their sum in f64, as the CPU
// backend computes them). A warp per row (MOE_ROUTE_ROWS a block): lane l
// holds experts l, l + 32, ... (at most MOE_MAX_EXPERTS), and each choice
// is a warp's arg-max over the experts not chosen yet.
#if !defined(MOE_MAX_EXPERTS) || !defined(MOE_ROUTE_ROWS)
#error "MOE_MAX_EXPERTS and MOE_ROUTE_ROWS come from the worker as -D options"
#endif
static_assert(MOE_MAX_EXPERTS % 32 == 0, "whole lanes");
extern "C" __global__ void __launch_bounds__(MOE_ROUTE_ROWS * 32)
    moe_route(const float* __restrict__ logits, int n, int experts, int used, int* __restrict__ ids,
              float* __restrict__ weights) {
    pdl_start();
    constexpr int PER_LANE = MOE_MAX_EXPERTS / 32;
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * MOE_ROUTE_ROWS + (threadIdx.x >> 5);
    if (t >= n) return;
    const float* l = logits + (i64)t * experts;
    int* id = ids + (i64)t * used;
    float* w = weights + (i64)t * used;
    float v[PER_LANE];
    bool open[PER_LANE];
#pragma unroll
    for (int j = 0; j < PER_LANE; j++) {
        const int e = lane + 32 * j;
        open[j] = e < experts;
        v[j] = open[j] ? l[e] : NEG_INF;
    }
    for (int k = 0; k < used; k++) {
        float bv = NEG_INF;
        int be = -1;
#pragma unroll
        for (int j = 0; j < PER_LANE; j++)
            if (open[j] && (be < 0 || v[j] > bv)) {
                bv = v[j];
                be = lane + 32 * j;
            }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float ov = __shfl_xor_sync(FULL_MASK, bv, off);
            const int oe = __shfl_xor_sync(FULL_MASK, be, off);
            if (oe >= 0 && (be < 0 || ov > bv || (ov == bv && oe < be))) {
                bv = ov;
                be = oe;
            }
        }
#pragma unroll
        for (int j = 0; j < PER_LANE; j++)
            if (be == lane + 32 * j) open[j] = false;
        if (lane == 0) id[k] = be;
    }
    if (lane != 0) return;
    const float top = l[id[0]];
    double sum = 0.0;
    for (int k = 0; k < used; k++) {
        const float p = expf(l[id[k]] - top);
        w[k] = p;
        sum += (double)p;
    }
    for (int k = 0; k < used; k++) w[k] = (float)((double)w[k] / sum);
}

// gpt-oss's clamped SwiGLU (llama.cpp's swiglu_oai, alpha 1.702, limit 7):
// out[i] = min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1),
// rounded step by step as the CPU backend computes it. With xh set (n a
// multiple of 32), out is also split as quantize_x8 splits it, for the
// experts' down product on mv8e_* (saving that launch in decode).
extern "C" __global__ void swiglu_oai(const float* __restrict__ gate, const float* __restrict__ up, i64 n,
                                      float* __restrict__ out, i8* __restrict__ xh, i8* __restrict__ xl,
                                      float* __restrict__ xd, float* __restrict__ xs) {
    pdl_start();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = fminf(gate[i], 7.0f), u = fminf(fmaxf(up[i], -7.0f), 7.0f);
    const float s = __fdiv_rn(g, __fadd_rn(1.0f, expf(__fmul_rn(-1.702f, g))));
    const float y = __fmul_rn(s, __fadd_rn(u, 1.0f));
    out[i] = y;
    if (xh) split_x8(y, i, xh, xl, xd, xs);
}

// out[t][c] = the sum over k in order of weights[t * used + k] * y[s][c],
// s = t * used + k (or pos[t * used + k] where rows of y were gathered by
// expert): the chosen experts' outputs (biases added) weighed by the
// router. A thread per output value (n = rows * cols).
extern "C" __global__ void moe_sum(const float* __restrict__ y, const int* __restrict__ pos,
                                   const float* __restrict__ weights, int used, int cols, i64 n,
                                   float* __restrict__ out) {
    pdl_start();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const i64 t = i / cols, c = i - t * cols;
    float acc = 0.0f;
    for (int k = 0; k < used; k++) {
        const i64 s = t * used + k, row = pos ? pos[s] : s;
        acc = __fadd_rn(acc, __fmul_rn(y[row * cols + c], weights[s]));
    }
    out[i] = acc;
}

// Eight values a, b as to_f16 splits them (x rounded to f16, clamped to
// its range, and the rounding of the rest) into the i-th 16 bytes of hi and lo.
__device__ __forceinline__ void store_f16_parts(float4 a, float4 b, u16* __restrict__ hi, u16* __restrict__ lo,
                                                i64 i) {
    uint4 h, l;
    split_f16x2(f16_range(a.x), f16_range(a.y), h.x, l.x);
    split_f16x2(f16_range(a.z), f16_range(a.w), h.y, l.y);
    split_f16x2(f16_range(b.x), f16_range(b.y), h.z, l.z);
    split_f16x2(f16_range(b.z), f16_range(b.w), h.w, l.w);
    ((uint4*)hi)[i] = h;
    ((uint4*)lo)[i] = l;
}

// Rows of x gathered by expert for gemm_moe_*: row i of the result is x's
// row order[i] / used (order: the (token, choice) slots sorted by expert),
// split into f16 parts as to_f16 splits it (hi [m][cols], then lo). A
// thread per 8 values: n8 = m * cols / 8, cols a multiple of 8, x 32-byte
// aligned rows (activation blocks start on 256 bytes, cols * 4 a multiple
// of 32).
extern "C" __global__ void moe_gather_f16(const float* __restrict__ x, const int* __restrict__ order, int used,
                                          int cols, i64 n8, u16* __restrict__ hi, u16* __restrict__ lo) {
    pdl_start();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n8) return;
    const int per_row = cols / 8;
    const i64 r = i / per_row, c8 = i - r * per_row;
    const float4* src = (const float4*)(x + (i64)(order[r] / used) * cols) + 2 * c8;
    const float4 a = src[0], b = src[1];
    store_f16_parts(a, b, hi, lo, i);
}

// x[i] *= factor
extern "C" __global__ void scale(float* __restrict__ x, i64 n, float factor) {
    pdl_start();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = x[i] * factor;
}

// x[i] += y[i]
extern "C" __global__ void add_assign(float* __restrict__ x, const float* __restrict__ y, i64 n) {
    pdl_start();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = x[i] + y[i];
}

// One row of x for the integer mat-vec (`mv8_*`, matvec.cu): per 32 values a
// scale d = max|x| / 127 and two int8 parts, x ~ d * (hi + lo / 256) (about
// 15 bits, so a dot product stays within ~1e-4 of f32, where llama.cpp's one
// int8 part is off by ~1e-2), and the exact f32 sum of every 16 values (for
// the formats' offsets). A warp per 32 values: cols must be a multiple of 32,
// so whole warps return together.
extern "C" __global__ void quantize_x8(const float* __restrict__ x, int cols, i8* __restrict__ xh,
                                       i8* __restrict__ xl, float* __restrict__ xd, float* __restrict__ xs) {
    pdl_start();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    split_x8(x[i], i, xh, xl, xd, xs);
}

// After gemm_tck_* (gemm.cu): out[i] = the sum over z of part[z * len + i],
// in z order (+ bias[i % rows]).
extern "C" __global__ void gemm_splits_sum(const float* __restrict__ part, int splits, i64 len, int rows,
                                           const float* __restrict__ bias, float* __restrict__ out) {
    pdl_start();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len) return;
    float s = 0.0f;
    for (int z = 0; z < splits; z++) s += part[(i64)z * len + i];
    out[i] = bias ? s + bias[i % rows] : s;
}

// ---- prefill on cuBLAS (backend/cuda/blas.rs) ----

// x as two f16 parts for the f16 GEMM: hi = x rounded (clamped to f16's
// range, NaN kept), lo = the rounding of x - hi; the GEMM multiplies both,
// so x keeps about 22 significant bits. A thread per 8 values: n8 = len / 8,
// x and the parts 32- and 16-byte aligned (activation blocks start on 256
// bytes; len is rows x cols with cols a multiple of 8).
extern "C" __global__ void to_f16(const float* __restrict__ x, i64 n8, u16* __restrict__ hi, u16* __restrict__ lo) {
    pdl_start();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n8) return;
    const float4 a = ((const float4*)x)[2 * i], b = ((const float4*)x)[2 * i + 1];
    store_f16_parts(a, b, hi, lo, i);
}

// out[i] += bias[i % rows] (the bias after a cuBLAS product).
extern "C" __global__ void add_bias(float* __restrict__ out, const float* __restrict__ bias, i64 len, int rows) {
    pdl_start();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len) return;
    out[i] = out[i] + bias[i % rows];
}
