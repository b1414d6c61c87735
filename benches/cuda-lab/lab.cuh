// lab.cuh: what every kernel lab here shares: a CUDA call check, a seeded
// xorshift generator (the same numbers on every run) and the median.
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_fp16.h>
#include <vector>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e = (x);                                                                   \
        if (e != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static unsigned long long rng = 0x9E3779B97F4A7C15ull;
static inline unsigned next_u32() {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (unsigned)(rng >> 16);
}
static inline float unif(float lo, float hi) { return lo + (hi - lo) * (next_u32() & 0xFFFFFF) / 16777216.0f; }
static inline void put_f16(unsigned char* p, float f) { __half h = __float2half(f); memcpy(p, &h, 2); }
static float median(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }
