// mvr_lab.cu: decode mat-vec with x shared across rows. `mv8_*` gives each
// weight row its own warp, so every warp loads x's split parts again: per 16
// bytes of Q4_K weights a thread loads 64 bytes of x (hi and lo parts of two
// 16-value pieces) and the block's 16-byte header. Here a thread takes the
// same unit (32 weights) of R rows: it loads x once for all R, and issues the
// R rows' weight loads before it multiplies any. The warps of a block split
// the columns, and add their sums in shared memory in warp order.
//   benches/cuda-lab/build mvr_lab && /tmp/mvr_lab
// Prints, per shape and format, GB/s of weight bytes for mv8 (the worker's,
// since this lab the r2u1 / r2u1f layout) and each variant, BAD where the relative L2 difference from mv8
// exceeds 1e-5, and a device-to-device copy's GB/s (read + write) for scale.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_fp16.h>
#include <vector>

#include "lab.cuh"

#include "elementwise.cu"
#include "matvec.cu"

// x of one unit: two 16-value pieces at columns c0 and c1, their scales and sums.
struct XU {
    uint4 h0, l0, h1, l1;
    float d0, d1, s0, s1;
};

__device__ __forceinline__ XU load_xu(const X8& x, int c0, int c1) {
    XU r;
    r.h0 = __ldg((const uint4*)(x.hi + c0));
    r.l0 = __ldg((const uint4*)(x.lo + c0));
    r.h1 = __ldg((const uint4*)(x.hi + c1));
    r.l1 = __ldg((const uint4*)(x.lo + c1));
    r.d0 = __ldg(x.d + (c0 >> 5));
    r.d1 = __ldg(x.d + (c1 >> 5));
    r.s0 = __ldg(x.sum16 + (c0 >> 4));
    r.s1 = __ldg(x.sum16 + (c1 >> 4));
    return r;
}

__device__ __forceinline__ float dot16x(const u32* q, uint4 h, uint4 l) {
    int sh = __dp4a((int)q[0], (int)h.x, 0), sl = __dp4a((int)q[0], (int)l.x, 0);
    sh = __dp4a((int)q[1], (int)h.y, sh);
    sl = __dp4a((int)q[1], (int)l.y, sl);
    sh = __dp4a((int)q[2], (int)h.z, sh);
    sl = __dp4a((int)q[2], (int)l.z, sl);
    sh = __dp4a((int)q[3], (int)h.w, sh);
    sl = __dp4a((int)q[3], (int)l.w, sl);
    return fmaf((float)sl, 0.00390625f, (float)sh);
}

// 32 bytes from a 2-byte aligned address: nine aligned words, shifted.
__device__ __forceinline__ void ld32_a2_lab(const u8* p, u32* o) {
    const u32* a = (const u32*)((size_t)p & ~(size_t)3);
    const int sh = (int)((size_t)p & 2) * 8;
    u32 w[9];
#pragma unroll
    for (int i = 0; i < 9; i++) w[i] = __ldg(a + i);
#pragma unroll
    for (int i = 0; i < 8; i++) o[i] = __funnelshift_r(w[i], w[i + 1], sh);
}

template <int T, int V>
struct Raw;

// Q4_K: as Mv8Unit<T_Q4_K>.
template <int V>
struct Raw<T_Q4_K, V> {
    uint4 head, qs;
    static __device__ __forceinline__ int c0(int u) { return (u >> 3) * 256 + 64 * ((u >> 1) & 3) + 16 * (u & 1); }
    static __device__ __forceinline__ int c1(int u) { return c0(u) + 32; }
    __device__ __forceinline__ void load(const u8* __restrict__ row, int u) {
        const u8* b = row + (i64)(u >> 3) * 144;
        head = __ldg((const uint4*)b);
        qs = __ldg((const uint4*)(b + 16 + 32 * ((u >> 1) & 3) + 16 * (u & 1)));
    }
    __device__ __forceinline__ float dot(int u, const XU& x) const {
        const int k = (u >> 1) & 3;
        const float d = f16_to_f32((u16)(head.x & 0xFFFF)), dmin = f16_to_f32((u16)(head.x >> 16));
        float s0, m0, s1, m1;
        k_scale_min_w(head.y, head.z, head.w, 2 * k, d, dmin, &s0, &m0);
        k_scale_min_w(head.y, head.z, head.w, 2 * k + 1, d, dmin, &s1, &m1);
        const u32 q[4] = {qs.x, qs.y, qs.z, qs.w};
        u32 lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo[i] = q[i] & 0x0F0F0F0Fu;
            hi[i] = (q[i] >> 4) & 0x0F0F0F0Fu;
        }
        float a = s0 * x.d0 * dot16x(lo, x.h0, x.l0);
        a = fmaf(-m0, x.s0, a);
        a = fmaf(s1 * x.d1, dot16x(hi, x.h1, x.l1), a);
        return fmaf(-m1, x.s1, a);
    }
};

// Q6_K: as Mv8Unit<T_Q6_K>; V = 0 loads u16s, V = 1 aligned words shifted.
template <int V>
struct Raw<T_Q6_K, V> {
    u32 ql[8], qh[8], sc, dh;
    static __device__ __forceinline__ int c0(int u) { return 32 * u; }
    static __device__ __forceinline__ int c1(int u) { return 32 * u + 16; }
    __device__ __forceinline__ void load(const u8* __restrict__ row, int u) {
        const u8* b = row + (i64)(u >> 3) * 210;
        const int n = (u >> 2) & 1, j = u & 3;
        if (V == 0) {
            const u16* l = (const u16*)(b + 64 * n + 32 * (j & 1));
            const u16* h = (const u16*)(b + 128 + 32 * n);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                ql[i] = __ldg(l + 2 * i) | ((u32)__ldg(l + 2 * i + 1) << 16);
                qh[i] = __ldg(h + 2 * i) | ((u32)__ldg(h + 2 * i + 1) << 16);
            }
        } else {
            ld32_a2_lab(b + 64 * n + 32 * (j & 1), ql);
            ld32_a2_lab(b + 128 + 32 * n, qh);
        }
        sc = __ldg((const u16*)(b + 192 + 8 * n + 2 * j));
        dh = __ldg((const u16*)(b + 208));
    }
    __device__ __forceinline__ float dot(int u, const XU& x) const {
        const int j = u & 3, sh = 4 * (j >> 1);
        u32 q0[4], q1[4];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const u32 q = ((ql[i] >> sh) & 0x0F0F0F0Fu) | (((qh[i] >> (2 * j)) & 0x03030303u) << 4);
            const u32 s = (q + 0x60606060u) ^ 0x80808080u;
            if (i < 4) q0[i] = s;
            else q1[i - 4] = s;
        }
        const float d = f16_to_f32((u16)dh);
        const float s0 = __fmul_rn(d, (float)(i8)(sc & 0xFF)), s1 = __fmul_rn(d, (float)(i8)(sc >> 8));
        return x.d0 * fmaf(s0, dot16x(q0, x.h0, x.l0), s1 * dot16x(q1, x.h1, x.l1));
    }
};

// R rows a block, WARPS warps splitting the columns, U units in flight a thread.
template <int T, int V, int R, int U, int WARPS>
__global__ void __launch_bounds__(WARPS * 32)
    mvr(const u8* __restrict__ W, i64 row_bytes, int rows, int cols, const i8* xh, const i8* xl, const float* xd,
        const float* xs, const float* __restrict__ bias, float* __restrict__ out) {
    const X8 x{xh, xl, xd, xs};
    __shared__ float red[R][WARPS];
    const int r0 = blockIdx.x * R, nr = min(R, rows - r0);
    const int units = cols / 32;
    const u8* base = W + (i64)r0 * row_bytes;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    for (int u0 = threadIdx.x; u0 < units; u0 += U * WARPS * 32) {
        Raw<T, V> w[U][R];
#pragma unroll
        for (int i = 0; i < U; i++) {
            const int u = u0 + i * WARPS * 32;
#pragma unroll
            for (int r = 0; r < R; r++)
                if (u < units && r < nr) w[i][r].load(base + (i64)r * row_bytes, u);
        }
#pragma unroll
        for (int i = 0; i < U; i++) {
            const int u = u0 + i * WARPS * 32;
            if (u >= units) break;
            const XU xu = load_xu(x, Raw<T, V>::c0(u), Raw<T, V>::c1(u));
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < nr) acc[r] += w[i][r].dot(u, xu);
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float s = warp_sum(acc[r]);
        if (lane == 0) red[r][warp] = s;
    }
    __syncthreads();
    if (threadIdx.x < nr) {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; w++) s += red[threadIdx.x][w];
        out[r0 + threadIdx.x] = bias ? s + bias[r0 + threadIdx.x] : s;
    }
}

typedef void (*Mvq)(const u8*, i64, int, int, const i8*, const i8*, const float*, const float*, const float*,
                    float*);

struct Var {
    const char* name;
    Mvq k;
    int rows_per_block, threads;
};

static void fill(int type, std::vector<u8>& host, size_t blocks) {
    for (size_t i = 0; i + 4 <= host.size(); i += 4) {
        unsigned v = next_u32();
        memcpy(&host[i], &v, 4);
    }
    for (size_t b = 0; b < blocks; b++) {
        if (type == T_Q4_K) {
            put_f16(&host[b * 144], unif(0.001f, 0.01f));
            put_f16(&host[b * 144 + 2], unif(0.001f, 0.01f));
        } else {
            put_f16(&host[b * 210 + 208], unif(0.0005f, 0.002f));
        }
    }
}

int main() {
    {  // the copy bandwidth, for scale
        const size_t n = 1ull << 30;
        void *a, *b;
        CK(cudaMalloc(&a, n));
        CK(cudaMalloc(&b, n));
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        std::vector<float> ts;
        for (int i = 0; i < 6; i++) {
            cudaEventRecord(e0);
            CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            float ms;
            cudaEventElapsedTime(&ms, e0, e1);
            if (i) ts.push_back(ms);
        }
        printf("copy 1 GiB: %.0f GB/s (read + write)\n", 2.0 * n / median(ts) / 1e6);
        cudaFree(a);
        cudaFree(b);
    }
    struct Shape { int rows, cols; };
    std::vector<Shape> shapes = {{4096, 4096}, {1024, 4096}, {14336, 4096}, {4096, 14336}, {128256, 4096}};
    Var q4[] = {{"mv8", mv8_q4_k, MV8_ROWS, MV8_THREADS},
                {"r2u1", mvr<T_Q4_K, 0, 2, 1, 4>, 2, 128},
                {"r4u1", mvr<T_Q4_K, 0, 4, 1, 4>, 4, 128},
                {"r8u1", mvr<T_Q4_K, 0, 8, 1, 4>, 8, 128},
                {"r2u2", mvr<T_Q4_K, 0, 2, 2, 4>, 2, 128},
                {"r4u2", mvr<T_Q4_K, 0, 4, 2, 4>, 4, 128},
                {"r4u1w8", mvr<T_Q4_K, 0, 4, 1, 8>, 4, 256},
                {"r4u1w2", mvr<T_Q4_K, 0, 4, 1, 2>, 4, 64}};
    Var q6[] = {{"mv8", mv8_q6_k, MV8_ROWS, MV8_THREADS},
                {"r2u1", mvr<T_Q6_K, 0, 2, 1, 4>, 2, 128},
                {"r4u1", mvr<T_Q6_K, 0, 4, 1, 4>, 4, 128},
                {"r2u1f", mvr<T_Q6_K, 1, 2, 1, 4>, 2, 128},
                {"r4u1f", mvr<T_Q6_K, 1, 4, 1, 4>, 4, 128},
                {"r2u2f", mvr<T_Q6_K, 1, 2, 2, 4>, 2, 128},
                {"r8u1f", mvr<T_Q6_K, 1, 8, 1, 4>, 8, 128},
                {"r4u1fw8", mvr<T_Q6_K, 1, 4, 1, 8>, 4, 256}};
    for (int type : {T_Q4_K, T_Q6_K}) {
        const int bb = type == T_Q4_K ? 144 : 210;
        Var* vs = type == T_Q4_K ? q4 : q6;
        const int nv = 8;
        printf("\n%s\n%7s %6s | variant GB/s\n", type == T_Q4_K ? "Q4_K" : "Q6_K", "rows", "cols");
        for (Shape s : shapes) {
            const i64 rb = (i64)s.cols / 256 * bb;
            const size_t bytes = (size_t)rb * s.rows;
            const int copies = (int)std::max<size_t>(1, (size_t)(400u << 20) / bytes + 1);
            std::vector<u8> host(bytes);
            fill(type, host, bytes / bb);
            u8* w;
            CK(cudaMalloc(&w, bytes * copies));
            for (int c = 0; c < copies; c++)
                CK(cudaMemcpy(w + c * bytes, host.data(), bytes, cudaMemcpyHostToDevice));
            std::vector<float> hx(s.cols);
            for (auto& v : hx) v = unif(-1, 1) * (next_u32() % 50 == 0 ? 20.0f : 1.0f);
            float *x, *o, *xd, *xs;
            i8 *xh, *xl;
            CK(cudaMalloc(&x, s.cols * 4));
            CK(cudaMalloc(&o, s.rows * 4));
            CK(cudaMalloc(&xh, s.cols));
            CK(cudaMalloc(&xl, s.cols));
            CK(cudaMalloc(&xd, s.cols / 32 * 4));
            CK(cudaMalloc(&xs, s.cols / 16 * 4));
            CK(cudaMemcpy(x, hx.data(), s.cols * 4, cudaMemcpyHostToDevice));
            quantize_x8<<<(s.cols + 255) / 256, 256>>>(x, s.cols, xh, xl, xd, xs);
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            auto timed = [&](auto&& f) {
                std::vector<float> ts;
                for (int it = 0; it < 12; it++) {
                    cudaEventRecord(e0);
                    for (int j = 0; j < 20; j++) f(it * 20 + j);
                    cudaEventRecord(e1);
                    cudaEventSynchronize(e1);
                    float ms;
                    cudaEventElapsedTime(&ms, e0, e1);
                    if (it >= 2) ts.push_back(ms / 20);
                }
                return median(ts);
            };
            std::vector<float> ref(s.rows), got(s.rows);
            printf("%7d %6d |", s.rows, s.cols);
            for (int vi = 0; vi < nv; vi++) {
                const Var& v = vs[vi];
                auto run = [&](int it) {
                    v.k<<<(s.rows + v.rows_per_block - 1) / v.rows_per_block, v.threads>>>(
                        w + (size_t)(it % copies) * bytes, rb, s.rows, s.cols, xh, xl, xd, xs, nullptr, o);
                };
                CK(cudaMemset(o, 0xFF, s.rows * 4));
                run(0);
                CK(cudaGetLastError());
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy((vi ? got : ref).data(), o, s.rows * 4, cudaMemcpyDeviceToHost));
                double num = 0, den = 0;
                bool nan = false;
                for (int i = 0; vi && i < s.rows; i++) {
                    if (!std::isfinite(got[i])) nan = true;
                    num += (ref[i] - got[i]) * (double)(ref[i] - got[i]);
                    den += (double)ref[i] * ref[i];
                }
                const float t = timed(run);
                printf(" %s %4.0f%s", v.name, bytes / t / 1e6, vi && (sqrt(num / den) > 1e-5 || nan) ? "(BAD)" : "");
            }
            printf("\n");
            cudaFree(w); cudaFree(x); cudaFree(o); cudaFree(xh); cudaFree(xl); cudaFree(xd); cudaFree(xs);
        }
    }
    return 0;
}
