// mvq_lab.cu: decode mat-vec for Q4_K on the integer units (dp4a), against
// mv1 (matvec.cu) on the same random weights:
//   benches/cuda-lab/build mvq_lab && /tmp/mvq_lab
// x is first split, per 32 values, into a scale d and two int8 parts,
// x ~ d * (hi + lo / 256) (about 16 bits, so the result stays within ~1e-5
// of the f32 kernel's, unlike llama.cpp's single int8 part), plus the exact
// f32 sum of each 16 values for the formats' offsets.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_fp16.h>
#include <vector>

#include "matvec.cu"

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e = (x);                                                                   \
        if (e != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

// One warp per 32 values: hi, lo (int8 each), d and the two 16-value sums.
extern "C" __global__ void quant_x(const float* __restrict__ x, int cols, i8* __restrict__ xh, i8* __restrict__ xl,
                                   float* __restrict__ xd, float* __restrict__ xs) {
    const int lane = threadIdx.x & 31;
    const int blk = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (blk * 32 >= cols) return;
    const int i = blk * 32 + lane;
    const float v = i < cols ? x[i] : 0.0f;
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float inv = d > 0.0f ? 1.0f / d : 0.0f;
    const int h = max(-127, min(127, __float2int_rn(v * inv)));
    const float r = fmaf(-d, (float)h, v);
    const int l = max(-127, min(127, __float2int_rn(r * inv * 256.0f)));
    xh[i] = (i8)h;
    xl[i] = (i8)l;
    // Sums of 16: lanes 0-15 and 16-31, fixed order.
    float s = v;
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) s += __shfl_xor_sync(FULL_MASK, s, o);
    if (lane == 0) xd[blk] = d;
    if ((lane & 15) == 0) xs[2 * blk + (lane >> 4)] = s;
}

// Q4_K's 6-bit scale and min of sub-block j from the 12 scale bytes held in
// three words (no local-memory array).
__device__ __forceinline__ void k_scale_min_w(u32 a, u32 b, u32 c, int j, float d, float dmin, float* sc, float* mn) {
    int s, m;
    if (j < 4) {
        s = (a >> (8 * j)) & 63;
        m = (b >> (8 * j)) & 63;
    } else {
        const int o = 8 * (j - 4);
        s = ((c >> o) & 0xF) | (((a >> (o + 6)) & 3) << 4);
        m = ((c >> (o + 4)) & 0xF) | (((b >> (o + 6)) & 3) << 4);
    }
    *sc = __fmul_rn(d, (float)s);
    *mn = __fmul_rn(dmin, (float)m);
}

__device__ __forceinline__ int dp4a(u32 a, u32 b, int c) { return __dp4a((int)a, (int)b, c); }

// 16 values: nibble words q[0..3] (each byte one value) against 16 int8 of x.
__device__ __forceinline__ float dot16(const u32* q, uint4 h, uint4 l) {
    int sh = dp4a(q[0], h.x, 0), sl = dp4a(q[0], l.x, 0);
    sh = dp4a(q[1], h.y, sh); sl = dp4a(q[1], l.y, sl);
    sh = dp4a(q[2], h.z, sh); sl = dp4a(q[2], l.z, sl);
    sh = dp4a(q[3], h.w, sh); sl = dp4a(q[3], l.w, sl);
    return fmaf((float)sl, 0.00390625f, (float)sh);
}

// Q4_K: a thread's unit is 16 bytes of qs (32 nibbles: 16 values of
// sub-block 2k, 16 of 2k+1); 8 units per 256-value block. R rows a block,
// 128 / R threads per row; U units loaded before any is multiplied.
struct Q4kUnit {
    uint4 hd, qs;
};

__device__ __forceinline__ float q4k_unit(const Q4kUnit& w, int u, const i8* __restrict__ xh,
                                          const i8* __restrict__ xl, const float* __restrict__ xd,
                                          const float* __restrict__ xs) {
    const int sb = u >> 3, k = (u >> 1) & 3, h = u & 1;
    const float d = f16_to_f32((u16)(w.hd.x & 0xFFFF)), dmin = f16_to_f32((u16)(w.hd.x >> 16));
    float s0, m0, s1, m1;
    k_scale_min_w(w.hd.y, w.hd.z, w.hd.w, 2 * k, d, dmin, &s0, &m0);
    k_scale_min_w(w.hd.y, w.hd.z, w.hd.w, 2 * k + 1, d, dmin, &s1, &m1);
    const int c0 = sb * 256 + 64 * k + 16 * h, c1 = c0 + 32;  // first column of each 16
    const uint4 h0 = *(const uint4*)(xh + c0), l0 = *(const uint4*)(xl + c0);
    const uint4 h1 = *(const uint4*)(xh + c1), l1 = *(const uint4*)(xl + c1);
    const u32 q[4] = {w.qs.x, w.qs.y, w.qs.z, w.qs.w};
    u32 lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        lo[i] = q[i] & 0x0F0F0F0Fu;
        hi[i] = (q[i] >> 4) & 0x0F0F0F0Fu;
    }
    float acc = s0 * xd[c0 >> 5] * dot16(lo, h0, l0);
    acc = fmaf(-m0, xs[c0 >> 4], acc);
    acc = fmaf(s1 * xd[c1 >> 5], dot16(hi, h1, l1), acc);
    return fmaf(-m1, xs[c1 >> 4], acc);
}

template <int R, int U>
__global__ void __launch_bounds__(128) mvq_q4_k(const u8* __restrict__ W, i64 row_bytes, int rows, int cols,
                                                const i8* __restrict__ xh, const i8* __restrict__ xl,
                                                const float* __restrict__ xd, const float* __restrict__ xs,
                                                float* __restrict__ out) {
    constexpr int TPR = 128 / R;
    const int r = blockIdx.x * R + threadIdx.x / TPR, t = threadIdx.x % TPR;
    const int units = cols / 256 * 8;
    float acc = 0.0f;
    if (r < rows) {
        const u8* row = W + (i64)r * row_bytes;
        for (int u0 = t; u0 < units; u0 += U * TPR) {
            Q4kUnit w[U];
#pragma unroll
            for (int i = 0; i < U; i++) {
                const int u = u0 + i * TPR;
                if (u < units) {
                    const u8* b = row + (i64)(u >> 3) * 144;
                    w[i].hd = *(const uint4*)b;
                    w[i].qs = *(const uint4*)(b + 16 + 32 * ((u >> 1) & 3) + 16 * (u & 1));
                }
            }
#pragma unroll
            for (int i = 0; i < U; i++) {
                const int u = u0 + i * TPR;
                if (u < units) acc += q4k_unit(w[i], u, xh, xl, xd, xs);
            }
        }
    }
    // Sum the row's threads: warps hold whole rows when TPR >= 32.
    __shared__ float red[4];
    if (TPR >= 32) {
        acc = warp_sum(acc);
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = acc;
        __syncthreads();
        constexpr int WPR = TPR / 32;
        if (threadIdx.x < R && blockIdx.x * R + threadIdx.x < rows) {
            float s = 0.0f;
            for (int w = 0; w < WPR; w++) s += red[threadIdx.x * WPR + w];
            out[blockIdx.x * R + threadIdx.x] = s;
        }
    } else {
#pragma unroll
        for (int o = TPR / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(FULL_MASK, acc, o);
        if (t == 0 && r < rows) out[r] = acc;
    }
}

static unsigned long long rng = 0x9E3779B97F4A7C15ull;
static inline unsigned next_u32() {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (unsigned)(rng >> 16);
}
static inline float unif(float lo, float hi) { return lo + (hi - lo) * (next_u32() & 0xFFFFFF) / 16777216.0f; }
static inline void put_f16(u8* p, float f) { __half h = __float2half(f); memcpy(p, &h, 2); }
static float median(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

typedef void (*Mvq)(const u8*, i64, int, int, const i8*, const i8*, const float*, const float*, float*);

int main() {
    struct Shape { int rows, cols; };
    std::vector<Shape> shapes = {{4096, 4096}, {1024, 4096}, {14336, 4096}, {4096, 14336}, {128256, 4096},
                                 {896, 1024}, {4864, 1024}, {151936, 1024}};
    struct V { const char* name; Mvq k; int r; };
    V vs[] = {{"r1u1", mvq_q4_k<1, 1>, 1}, {"r4u1", mvq_q4_k<4, 1>, 4}, {"r2u2", mvq_q4_k<2, 2>, 2},
              {"r4u2", mvq_q4_k<4, 2>, 4}, {"r4u4", mvq_q4_k<4, 4>, 4}, {"r8u2", mvq_q4_k<8, 2>, 8},
              {"r8u4", mvq_q4_k<8, 4>, 8}, {"r16u2", mvq_q4_k<16, 2>, 16}};
    printf("%7s %6s %9s %9s | %s\n", "rows", "cols", "mv1 GB/s", "quant us", "variant: GB/s (kernel alone) rel_err");
    for (Shape s : shapes) {
        const i64 rb = (i64)s.cols / 256 * 144;
        const size_t bytes = (size_t)rb * s.rows;
        const int copies = (int)std::max<size_t>(1, (size_t)(400u << 20) / bytes + 1);
        std::vector<u8> host(bytes);
        for (size_t i = 0; i + 4 <= bytes; i += 4) { unsigned v = next_u32(); memcpy(&host[i], &v, 4); }
        for (size_t b = 0; b < bytes / 144; b++) {
            put_f16(&host[b * 144], unif(0.001f, 0.01f));
            put_f16(&host[b * 144 + 2], unif(0.001f, 0.01f));
        }
        u8* w;
        CK(cudaMalloc(&w, bytes * copies));
        for (int c = 0; c < copies; c++) CK(cudaMemcpy(w + c * bytes, host.data(), bytes, cudaMemcpyHostToDevice));
        std::vector<float> hx(s.cols);
        for (auto& v : hx) v = unif(-1, 1) * (next_u32() % 50 == 0 ? 20.0f : 1.0f);  // a few outliers
        float *x, *o1, *o2, *xd, *xs;
        i8 *xh, *xl;
        CK(cudaMalloc(&x, s.cols * 4));
        CK(cudaMalloc(&o1, s.rows * 4)); CK(cudaMalloc(&o2, s.rows * 4));
        CK(cudaMalloc(&xh, s.cols)); CK(cudaMalloc(&xl, s.cols));
        CK(cudaMalloc(&xd, s.cols / 32 * 4)); CK(cudaMalloc(&xs, s.cols / 16 * 4));
        CK(cudaMemcpy(x, hx.data(), s.cols * 4, cudaMemcpyHostToDevice));
        cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
        auto timed = [&](auto&& f) {
            std::vector<float> ts;
            // 20 launches back to back per sample, as a decode graph runs them
            // (a lone launch timed with events is mostly launch latency).
            for (int it = 0; it < 12; it++) {
                cudaEventRecord(e0);
                for (int j = 0; j < 20; j++) f(it * 20 + j);
                cudaEventRecord(e1); cudaEventSynchronize(e1);
                float ms; cudaEventElapsedTime(&ms, e0, e1); if (it >= 2) ts.push_back(ms / 20);
            }
            return median(ts);
        };
        const int qgrid = (s.cols / 32 + 7) / 8;
        auto quant = [&]() { quant_x<<<qgrid, 256>>>(x, s.cols, xh, xl, xd, xs); };
        auto mv1 = [&](int it) {
            mv1_q4_k<<<(s.rows + MV1_ROWS - 1) / MV1_ROWS, MV1_THREADS>>>(w + (size_t)(it % copies) * bytes, rb,
                                                                           s.rows, s.cols, x, nullptr, o1);
        };
        mv1(0); quant(); CK(cudaDeviceSynchronize());
        std::vector<float> a(s.rows), b(s.rows);
        CK(cudaMemcpy(a.data(), o1, s.rows * 4, cudaMemcpyDeviceToHost));
        const float t_mv1 = timed(mv1);
        const float t_q = timed([&](int) { quant(); });
        printf("%7d %6d %9.0f %9.1f |", s.rows, s.cols, bytes / t_mv1 / 1e6, t_q * 1e3);
        for (const V& v : vs) {
            auto run = [&](int it) {
                v.k<<<(s.rows + v.r - 1) / v.r, 128>>>(w + (size_t)(it % copies) * bytes, rb, s.rows, s.cols, xh, xl,
                                                        xd, xs, o2);
            };
            CK(cudaMemset(o2, 0xFF, s.rows * 4));
            run(0); CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(b.data(), o2, s.rows * 4, cudaMemcpyDeviceToHost));
            double num = 0, den = 0; bool nan = false;
            for (int i = 0; i < s.rows; i++) {
                if (!std::isfinite(b[i])) nan = true;
                num += (a[i] - b[i]) * (double)(a[i] - b[i]); den += (double)a[i] * a[i];
            }
            const float t = timed(run);
            printf(" %s %4.0f%s", v.name, bytes / t / 1e6, sqrt(num / den) > 3e-4 || nan ? "(BAD)" : "");
        }
        printf("\n");
        cudaFree(w); cudaFree(x); cudaFree(o1); cudaFree(o2); cudaFree(xh); cudaFree(xl); cudaFree(xd); cudaFree(xs);
    }
    return 0;
}
