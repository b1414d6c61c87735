// elementwise.cu: SwiGLU and the residual add, one thread per element.
#include "common.cuh"

// out[i] = silu(gate[i]) * up[i] = gate / (1 + exp(-gate)) * up
extern "C" __global__ void swiglu(const float* __restrict__ gate, const float* __restrict__ up, i64 n,
                                  float* __restrict__ out) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    out[i] = __fmul_rn(__fdiv_rn(g, 1.0f + expf(-g)), up[i]);
}

// x[i] += y[i]
extern "C" __global__ void add_assign(float* __restrict__ x, const float* __restrict__ y, i64 n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = x[i] + y[i];
}
