// norm.cu: RMSNorm and LayerNorm, one block per row. Row sums are kept in
// f32 and reduced in a fixed order (block_sum: a butterfly inside each warp,
// then the warps' partial sums in warp order), so a row gives the same bits
// on every run. Products are rounded as the CPU reference rounds them.
#include "common.cuh"

// out[t] = x[t] * (1 / sqrt(mean(x[t]^2) + eps)) * w, rounded as (x * scale) * w;
// with ADD, x[t] += y[t] first (written back: the residual add before the
// next norm, one launch instead of two, with add_assign's rounding), and with
// yw also set, y[t] is itself normalised by yw first (Gemma 3's norm on each
// block's output before its residual add: three launches in one, the bits of
// rms_norm then add_rms_norm, whose blocks are as wide).
// With xh set (one row, cols a multiple of 32), out is also split for the
// next mat-vec as quantize_x8 splits it, saving that launch in decode.
template <bool ADD>
__device__ __forceinline__ void rms_norm_row(float* x, const float* __restrict__ y, const float* __restrict__ yw,
                                             const float* __restrict__ w, int cols, float eps, int rows,
                                             float* __restrict__ out, i8* __restrict__ xh, i8* __restrict__ xl,
                                             float* __restrict__ xd, float* __restrict__ xs) {
    __shared__ float red[32];
    const int r = blockIdx.x;
    if (r >= rows) return;
    float* xr = x + (i64)r * cols;
    const float* yr = ADD ? y + (i64)r * cols : nullptr;
    float* o = out + (i64)r * cols;
    // Rows of whole float4s (every model's widths) in 16-byte loads: see row_sq_sum.
    const bool vec = (cols & 3) == 0 && (((u64)xr | (u64)yr | (u64)yw | (u64)w | (u64)o) & 15) == 0;
    float y_scale = 1.0f;
    if (ADD && yw) y_scale = rms_scale(block_sum(row_sq_sum(yr, cols, vec), red), cols, eps);
    float s = 0.0f;
    if (vec) {
        float4* x4 = (float4*)xr;
#pragma unroll 4
        for (int c = threadIdx.x; c < cols / 4; c += blockDim.x) {
            float4 v = x4[c];
            if (ADD) {
                float4 a = ((const float4*)yr)[c];
                if (yw) a = scale_by(a, y_scale, ((const float4*)yw)[c]);
                v = make_float4(v.x + a.x, v.y + a.y, v.z + a.z, v.w + a.w);
                x4[c] = v;
            }
            s = fmaf(v.x, v.x, s);
            s = fmaf(v.y, v.y, s);
            s = fmaf(v.z, v.z, s);
            s = fmaf(v.w, v.w, s);
        }
    } else {
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {
            float v = xr[c];
            if (ADD) {
                const float a = yw ? __fmul_rn(__fmul_rn(yr[c], y_scale), yw[c]) : yr[c];
                v = v + a;
                xr[c] = v;
            }
            s = fmaf(v, v, s);
        }
    }
    // block_sum begins with a barrier, so `red` may be reused.
    const float scale = rms_scale(block_sum(s, red), cols, eps);
    row_scale_write(xr, w, cols, scale, o, vec);
    if (xh && rows == 1) {
        __syncthreads();  // the row's outputs, written by other threads, are visible
        for (int c = threadIdx.x; c < cols; c += blockDim.x) split_x8(o[c], c, xh, xl, xd, xs);
    }
}

extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, int cols, float eps,
                                    int rows, float* __restrict__ out, i8* __restrict__ xh, i8* __restrict__ xl,
                                    float* __restrict__ xd, float* __restrict__ xs) {
    pdl_start();
    rms_norm_row<false>((float*)x, nullptr, nullptr, w, cols, eps, rows, out, xh, xl, xd, xs);  // x is only read
}

extern "C" __global__ void add_rms_norm(float* __restrict__ x, const float* __restrict__ y,
                                        const float* __restrict__ yw, const float* __restrict__ w, int cols,
                                        float eps, int rows, float* __restrict__ out, i8* __restrict__ xh,
                                        i8* __restrict__ xl, float* __restrict__ xd, float* __restrict__ xs) {
    pdl_start();
    rms_norm_row<true>(x, y, yw, w, cols, eps, rows, out, xh, xl, xd, xs);
}

// add_rms_norm for one row split for the next mat-vec (decode), over a
// cluster of blocks (sm_90 on), one value a thread: block r of the cluster
// takes columns r * blockDim.x .. ; the blocks' sums of squares meet through
// shared memory and are added in rank order (the same bits in every block
// and on every run). The one-block add_rms_norm spends ~5.5 us of latency on
// a 4096-value row (8 values a thread, each split by its warp in turn),
// twice a layer, while the rest of the GPU waits for it.
// The sum and the scale are taken in f64 as the CPU reference takes them
// (each square exact, so the scale is the CPU's but at a rounding tie).
// Used from NORM_CLUSTER_MIN_COLS values on only (launch.rs says why).
extern "C" __global__ void __launch_bounds__(1024)
    add_rms_norm_cluster(float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ w, int cols,
                         float eps, float* __restrict__ out, i8* __restrict__ xh, i8* __restrict__ xl,
                         float* __restrict__ xd, float* __restrict__ xs) {
    pdl_start();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ double red[32];
    __shared__ double part;
    const int c = cluster_rank() * blockDim.x + threadIdx.x;
    const float v = x[c] + y[c];
    const float g = w[c];
    x[c] = v;  // no other thread reads x[c]
    const double s = block_sum((double)v * (double)v, red);
    if (threadIdx.x == 0) part = s;
    cluster_arrive();
    cluster_wait();
    double total = 0.0;
    for (u32 r = 0; r < cluster_blocks(); r++) total += ld_cluster(&part, r);
    // A block's `part` must outlive the other blocks' reads: each arrives
    // now and waits for all before it exits.
    cluster_arrive();
    const float scale = (float)(1.0 / sqrt(total / (double)cols + (double)eps));
    const float o = __fmul_rn(__fmul_rn(v, scale), g);
    out[c] = o;
    split_x8(o, c, xh, xl, xd, xs);
    cluster_wait();
#endif
}

// GPT-2's LayerNorm (M0-W-1432):
//   out[t] = (x[t] - mean) / sqrt(var + eps) * w + b,   var = mean((x[t] - mean)^2)
// The variance is taken in a second pass over the row (which stays in L1/L2)
// rather than as E[x^2] - mean^2, which loses the variance to cancellation
// when the mean is large. `b` may be null (no bias). Rounded as
// ((x - mean) * scale) * w + b, the CPU reference's order.
extern "C" __global__ void layer_norm(const float* __restrict__ x, const float* __restrict__ w,
                                      const float* __restrict__ b, int cols, float eps, int rows,
                                      float* __restrict__ out) {
    pdl_start();
    __shared__ float red[32];
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = x + (i64)r * cols;
    float* o = out + (i64)r * cols;
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += xr[c];
    // block_sum begins with a barrier, so `red` may be reused by the second call.
    const float mean = block_sum(s, red) / (float)cols;
    float q = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float d = xr[c] - mean;
        q = fmaf(d, d, q);
    }
    const float var = block_sum(q, red) / (float)cols;
    const float scale = 1.0f / sqrtf(var + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float y = __fmul_rn(__fmul_rn(__fsub_rn(xr[c], mean), scale), w[c]);
        o[c] = b ? __fadd_rn(y, b[c]) : y;
    }
}
