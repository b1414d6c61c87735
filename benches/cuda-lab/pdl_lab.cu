// pdl_lab.cu: what programmatic dependent launch (PDL) saves in a decode
// step of a small model. A step is hundreds of short kernels, each reading
// its predecessor's output, replayed as one CUDA graph; most of a kernel's
// time there is its launch and ramp, not its work. With PDL each kernel is
// launched with programmatic stream serialization, calls
// `griddepcontrol.launch_dependents` as it starts (so the next kernel's
// blocks are scheduled while it runs) and `griddepcontrol.wait` before it
// reads anything (which returns once its predecessor has completed and its
// writes are visible).
//   benches/cuda-lab/build pdl_lab && /tmp/pdl_lab
// Prints, for chains shaped like a SmolLM2 layer (norm: 1 block; mat-vec: 144
// blocks reading 200 KB; attention: 9 blocks), microseconds per kernel in a
// replayed graph without and with PDL, and checks both give the same sums.
#include "lab.cuh"

__device__ __forceinline__ void pdl_wait(bool pdl) {
    if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
}
__device__ __forceinline__ void pdl_launch(bool pdl) {
    if (pdl) asm volatile("griddepcontrol.launch_dependents;" :::);
}

// One "norm": a block reduces 576 values of `in` and writes them scaled.
__global__ void norm_k(const float* in, float* out, int n, bool pdl) {
    pdl_launch(pdl);
    pdl_wait(pdl);
    __shared__ float red[32];
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += in[i] * in[i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    float t = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += red[w];
    const float sc = rsqrtf(t / n + 1e-5f);
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = in[i] * sc;
}

// One "mat-vec": block b dots `in` (576) with rows 4b..4b+3 of w.
__global__ void mv_k(const float* in, const float* w, float* out, int n, bool pdl) {
    pdl_launch(pdl);
    pdl_wait(pdl);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, row = blockIdx.x * 4 + warp;
    float s = 0.0f;
    for (int i = lane; i < n; i += 32) s += in[i] * w[(size_t)row * n + i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) out[row] = s * 1e-3f;
}

int main() {
    const int n = 576, rows = 576, layers = 30;
    float *a, *b, *w;
    CK(cudaMalloc(&a, rows * 4));
    CK(cudaMalloc(&b, rows * 4));
    CK(cudaMalloc(&w, (size_t)rows * n * 4));
    std::vector<float> h((size_t)rows * n);
    for (auto& v : h) v = unif(-1, 1);
    CK(cudaMemcpy(w, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (int pdl = 0; pdl < 2; pdl++) {
        CK(cudaMemcpy(a, h.data(), rows * 4, cudaMemcpyHostToDevice));
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        auto launch = [&](void (*k)(const float*, float*, int, bool), dim3 g, dim3 t, const float* in, float* out) {
            cudaLaunchConfig_t c = {g, t, 0, st, pdl ? attr : nullptr, (unsigned)pdl};
            CK(cudaLaunchKernelEx(&c, k, in, out, n, (bool)pdl));
        };
        auto launch_mv = [&](dim3 g, const float* in, float* out) {
            cudaLaunchConfig_t c = {g, dim3(128), 0, st, pdl ? attr : nullptr, (unsigned)pdl};
            CK(cudaLaunchKernelEx(&c, mv_k, in, (const float*)w, out, n, (bool)pdl));
        };
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        int kernels = 0;
        for (int l = 0; l < layers; l++) {
            // norm, 3 mat-vecs, "attention" (a norm over 9 blocks), mat-vec, norm, 2 mat-vecs, norm
            launch(norm_k, 1, 256, a, b), kernels++;
            launch_mv(144, b, a), kernels++;
            launch(norm_k, 9, 256, a, b), kernels++;
            launch_mv(144, b, a), kernels++;
            launch(norm_k, 1, 256, a, b), kernels++;
            launch_mv(144, b, a), kernels++;
            launch(norm_k, 6, 256, a, b), kernels++;
            launch_mv(144, b, a), kernels++;
            launch(norm_k, 1, 256, a, b), kernels++;
        }
        CK(cudaStreamEndCapture(st, &g));
        cudaGraphExec_t ge;
        CK(cudaGraphInstantiate(&ge, g, 0));
        std::vector<float> ts;
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        for (int r = 0; r < 60; r++) {
            CK(cudaEventRecord(e0, st));
            CK(cudaGraphLaunch(ge, st));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (r >= 10) ts.push_back(ms * 1000.0f);
        }
        std::vector<float> out(rows);
        CK(cudaMemcpy(out.data(), b, rows * 4, cudaMemcpyDeviceToHost));
        double sum = 0;
        for (float v : out) sum += v;
        const float us = median(ts);
        printf("%s: %d kernels, %.1f us a step, %.2f us a kernel, checksum %.6f\n", pdl ? "PDL" : "plain", kernels,
               us, us / kernels, sum);
    }
    return 0;
}
