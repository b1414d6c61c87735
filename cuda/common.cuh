// common.cuh: prepended by the worker to every kernel module before NVRTC
// compiles it (NVRTC gets no include path). It holds what every module
// shares: fixed-width integer types, f16/bf16 conversions (through PTX, so no
// CUDA headers are needed), and warp/block reductions whose summation order
// is fixed (M0-W-1031: the same inputs give the same bits on every run).

#pragma once

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define FULL_MASK 0xffffffffu
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Round to nearest even, as half::f16::from_f32 does.
__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf16_to_f32(u16 h) {
    return __uint_as_float(((u32)h) << 16);
}

// Little-endian loads from byte pointers whose alignment is not known.
__device__ __forceinline__ u16 ld_u16(const u8* p) {
    return (u16)p[0] | ((u16)p[1] << 8);
}
__device__ __forceinline__ u32 ld_u32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// Butterfly sum: every lane ends with the same value, and the order of the
// additions is fixed by the lane numbers (a + b == b + a exactly).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Block-wide sum for blockDim.x a multiple of 32 and at most 1024. `red` is
// shared scratch of 32 floats. Every thread gets the result; warps' partial
// sums are combined in warp order by each thread alike.
__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int w = 0; w < nwarps; w++) s += red[w];
    return s;
}

__device__ __forceinline__ float block_max(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float m = red[0];
    for (int w = 1; w < nwarps; w++) m = fmaxf(m, red[w]);
    return m;
}
