// elementwise.cu: SwiGLU, GELU and the residual add, one thread per element.
#include "common.cuh"

// out[i] = silu(gate[i]) * up[i] = gate / (1 + exp(-gate)) * up
extern "C" __global__ void swiglu(const float* __restrict__ gate, const float* __restrict__ up, i64 n,
                                  float* __restrict__ out) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    out[i] = __fmul_rn(__fdiv_rn(g, 1.0f + expf(-g)), up[i]);
}

// GPT-2's GELU, the tanh approximation (M0-W-1433):
//   out[i] = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
// The argument is written x * (1 + 0.044715 * x^2) so that it overflows only
// where x^2 does; tanhf saturates to +-1 for any large or infinite argument
// (it is not computed as a ratio of exponentials, which would give inf/inf),
// so the result is x for large positive x and -0 for large negative x.
extern "C" __global__ void gelu(const float* __restrict__ x, i64 n, float* __restrict__ out) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    const float u = k * v * (1.0f + 0.044715f * v * v);
    out[i] = 0.5f * v * (1.0f + tanhf(u));
}

// x[i] += y[i]
extern "C" __global__ void add_assign(float* __restrict__ x, const float* __restrict__ y, i64 n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = x[i] + y[i];
}
