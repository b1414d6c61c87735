// gemm_lab.cu: the prefill matrix product on tensor cores (gemm.cu,
// gemm_tc_<type>) against the f32 tiles (matmul.cu, gemm_<type>) on
// the same random weights: relative L2 difference and TFLOP/s, medians.
//   benches/cuda-lab/build gemm_lab && /tmp/gemm_lab q4_k,q8_0
// It measured gemm.cu as it was up to commit 12c72d8: the quantized formats'
// gemm_tc_* has since become gemm_tck_* (x's f16 parts from to_f16, column
// ranges), so rerun it on a checkout of that commit.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_fp16.h>
#include <vector>

#include "lab.cuh"

#include "matmul.cu"
#include "gemm.cu"

// As GTC_SMEM_BYTES in source.rs.
#define GTC_SMEM_BYTES (2 * (GTC_BR + GTC_BT) * (GTC_BK + GTC_PAD) * 4)


typedef void (*Kern)(const u8*, i64, int, int, const float*, int, const float*, float*);
struct Fmt { const char* name; int id, block_values, block_bytes; Kern old_k, new_k; };
#define FMT(name, T, bv, bb) {#name, T, bv, bb, gemm_##name, gemm_tc_##name}
static Fmt FMTS[] = {FMT(q4_k, T_Q4_K, 256, 144), FMT(q6_k, T_Q6_K, 256, 210), FMT(q8_0, T_Q8_0, 32, 34),
                     FMT(q4_1, T_Q4_1, 32, 20), FMT(q4_0, T_Q4_0, 32, 18), FMT(q5_0, T_Q5_0, 32, 22),
                     FMT(q5_1, T_Q5_1, 32, 24), FMT(q5_k, T_Q5_K, 256, 176), FMT(f16, T_F16, 8, 16)};

static void fill(const Fmt& f, u8* w, size_t bytes) {
    for (size_t i = 0; i + 4 <= bytes; i += 4) { unsigned v = next_u32(); memcpy(w + i, &v, 4); }
    for (size_t b = 0; b < bytes / f.block_bytes; b++) {
        u8* p = w + b * f.block_bytes;
        switch (f.id) {
        case T_Q4_K: case T_Q5_K: put_f16(p, unif(0.001f, 0.01f)); put_f16(p + 2, unif(0.001f, 0.01f)); break;
        case T_Q6_K: put_f16(p + 208, unif(0.001f, 0.01f)); break;
        case T_Q8_0: case T_Q4_0: case T_Q5_0: put_f16(p, unif(-0.02f, 0.02f)); break;
        case T_Q4_1: case T_Q5_1: put_f16(p, unif(0.001f, 0.02f)); put_f16(p + 2, unif(-0.1f, 0.1f)); break;
        case T_F16: for (int i = 0; i < 8; i++) put_f16(p + 2 * i, unif(-1, 1)); break;
        }
    }
}

int main(int argc, char** argv) {
    const char* only = argc > 1 ? argv[1] : "q4_k,q6_k,q8_0,q4_1,q4_0,q5_0,q5_1,q5_k,f16";
    struct Shape { int rows, cols, n; };
    Shape shapes[] = {{4096, 4096, 512}, {14336, 4096, 512}, {4096, 14336, 512}, {1024, 4096, 512},
                      {4096, 4096, 16}, {4096, 4096, 128}, {896, 896, 512}, {4864, 896, 512}, {896, 4864, 512},
                      {576, 576, 100}, {1536, 576, 37}, {4096, 4096, 3000}};
    printf("%-5s %6s %6s %5s %10s %9s %9s %6s\n", "fmt", "rows", "cols", "n", "rel_err", "old TF/s", "new TF/s", "x");
    for (const Fmt& f : FMTS) {
        if (!strstr(only, f.name)) continue;
        for (Shape s : shapes) {
            if (s.cols % f.block_values) continue;
            i64 rb = (i64)s.cols / f.block_values * f.block_bytes;
            size_t bytes = (size_t)rb * s.rows;
            std::vector<u8> host(bytes); fill(f, host.data(), bytes);
            std::vector<float> hx((size_t)s.n * s.cols); for (auto& v : hx) v = unif(-1, 1);
            std::vector<float> hb(s.rows); for (auto& v : hb) v = unif(-1, 1);
            u8* w; float *x, *o1, *o2, *bias;
            CK(cudaMalloc(&w, bytes)); CK(cudaMalloc(&x, hx.size() * 4)); CK(cudaMalloc(&bias, s.rows * 4));
            CK(cudaMalloc(&o1, (size_t)s.n * s.rows * 4)); CK(cudaMalloc(&o2, (size_t)s.n * s.rows * 4));
            CK(cudaMemcpy(w, host.data(), bytes, cudaMemcpyHostToDevice));
            CK(cudaFuncSetAttribute(f.new_k, cudaFuncAttributeMaxDynamicSharedMemorySize, GTC_SMEM_BYTES));
            CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(bias, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice));
            CK(cudaMemset(o1, 0xFF, (size_t)s.n * s.rows * 4)); CK(cudaMemset(o2, 0xFF, (size_t)s.n * s.rows * 4));
            dim3 g_old((s.rows + 63) / 64, (s.n + 63) / 64), g_new((s.rows + GTC_BR - 1) / GTC_BR, (s.n + GTC_BT - 1) / GTC_BT);
            f.old_k<<<g_old, 256>>>(w, rb, s.rows, s.cols, x, s.n, bias, o1);
            f.new_k<<<g_new, GTC_THREADS, GTC_SMEM_BYTES>>>(w, rb, s.rows, s.cols, x, s.n, bias, o2);
            CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
            std::vector<float> a((size_t)s.n * s.rows), b(a.size());
            CK(cudaMemcpy(a.data(), o1, a.size() * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(b.data(), o2, b.size() * 4, cudaMemcpyDeviceToHost));
            double num = 0, den = 0; bool bad = false;
            for (size_t i = 0; i < a.size(); i++) {
                if (!std::isfinite(a[i]) || !std::isfinite(b[i])) bad = true;
                num += (a[i] - b[i]) * (double)(a[i] - b[i]); den += (double)a[i] * a[i];
            }
            float err = bad ? NAN : (float)sqrt(num / den);
            float tf[2];
            for (int which = 0; which < 2; which++) {
                cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
                std::vector<float> ts;
                for (int it = 0; it < 25; it++) {
                    cudaEventRecord(e0);
                    if (which == 0) f.old_k<<<g_old, 256>>>(w, rb, s.rows, s.cols, x, s.n, bias, o1);
                    else f.new_k<<<g_new, GTC_THREADS, GTC_SMEM_BYTES>>>(w, rb, s.rows, s.cols, x, s.n, bias, o2);
                    cudaEventRecord(e1); cudaEventSynchronize(e1);
                    float ms; cudaEventElapsedTime(&ms, e0, e1); if (it >= 5) ts.push_back(ms);
                }
                tf[which] = 2.0 * s.rows * s.cols * s.n / median(ts) / 1e9;
            }
            CK(cudaGetLastError());
            printf("%-5s %6d %6d %5d %10.2e %9.1f %9.1f %6.2f\n", f.name, s.rows, s.cols, s.n, err, tf[0], tf[1], tf[1] / tf[0]);
            cudaFree(w); cudaFree(x); cudaFree(o1); cudaFree(o2); cudaFree(bias);
        }
    }
}
