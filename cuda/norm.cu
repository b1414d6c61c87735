// norm.cu: RMSNorm, out[t] = x[t] * (1 / sqrt(mean(x[t]^2) + eps)) * w.
// One block per row; the sum of squares is kept in f32 and reduced in a
// fixed order (block_sum). Products are rounded as the CPU reference rounds
// them: (x * scale) * w.
#include "common.cuh"

extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, int cols, float eps,
                                    int rows, float* __restrict__ out) {
    __shared__ float red[32];
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = x + (i64)r * cols;
    float* o = out + (i64)r * cols;
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s = fmaf(xr[c], xr[c], s);
    s = block_sum(s, red);
    const float scale = 1.0f / sqrtf(s / (float)cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) o[c] = __fmul_rn(__fmul_rn(xr[c], scale), w[c]);
}
