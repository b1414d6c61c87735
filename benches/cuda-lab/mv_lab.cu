// mv_lab.cu: a standalone check and timing of the decode mat-vec kernels,
// built with nvcc on a GPU machine (no Rust needed):
//   benches/cuda-lab/build mv_lab && /tmp/mv_lab q4_k,q6_k,q8_0
// For each format and shape: the new kernel (matvec.cu, mvs1_/mvs_) against
// the current one (matmul.cu, mv_/mvw_) on the same random weights, relative
// L2 difference of the outputs, and the median time of each over rotating
// copies of the weights (more bytes than L2 holds) in GB/s of weight bytes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_fp16.h>
#include <vector>

#include "lab.cuh"

#include "matmul.cu"
#include "matvec.cu"


typedef void (*Kern)(const u8*, i64, int, int, const float*, int, const float*, float*);
typedef void (*Kern1)(const u8*, i64, int, int, const float*, const float*, float*);

struct Fmt {
    const char* name;
    int id, block_values, block_bytes;
    Kern mv, mvw; Kern1 mv1;
};

#define FMT(name, T, bv, bb) {#name, T, bv, bb, mv_##name, mvw_##name, mv1_##name}
static Fmt FMTS[] = {
    FMT(q4_k, T_Q4_K, 256, 144), FMT(q6_k, T_Q6_K, 256, 210), FMT(q8_0, T_Q8_0, 32, 34),
    FMT(q5_k, T_Q5_K, 256, 176), FMT(q4_0, T_Q4_0, 32, 18),   FMT(q4_1, T_Q4_1, 32, 20),
    FMT(q5_0, T_Q5_0, 32, 22),   FMT(q5_1, T_Q5_1, 32, 24),   FMT(mxfp4, T_MXFP4, 32, 17),
    FMT(f16, T_F16, 8, 16),      FMT(bf16, T_BF16, 8, 16),    FMT(f32, T_F32, 8, 32),
};


// Random weights with sane scales: random quant bytes, scale fields set to
// small finite values, float formats to values in [-1, 1].
static void fill(const Fmt& f, u8* w, size_t bytes) {
    for (size_t i = 0; i + 4 <= bytes; i += 4) { unsigned v = next_u32(); memcpy(w + i, &v, 4); }
    size_t nb = bytes / f.block_bytes;
    for (size_t b = 0; b < nb; b++) {
        u8* p = w + b * f.block_bytes;
        switch (f.id) {
        case T_Q4_K: case T_Q5_K: put_f16(p, unif(0.001f, 0.01f)); put_f16(p + 2, unif(0.001f, 0.01f)); break;
        case T_Q6_K: put_f16(p + 208, unif(0.001f, 0.01f)); break;
        case T_Q8_0: case T_Q4_0: case T_Q5_0: put_f16(p, unif(-0.02f, 0.02f)); break;
        case T_Q4_1: case T_Q5_1: put_f16(p, unif(0.001f, 0.02f)); put_f16(p + 2, unif(-0.1f, 0.1f)); break;
        case T_MXFP4: p[0] = 118 + next_u32() % 10; break;
        case T_F16: for (int i = 0; i < 8; i++) put_f16(p + 2 * i, unif(-1, 1)); break;
        case T_BF16: for (int i = 0; i < 8; i++) { float v = unif(-1, 1); unsigned u; memcpy(&u, &v, 4);
                                                   unsigned short h = u >> 16; memcpy(p + 2 * i, &h, 2); } break;
        case T_F32: for (int i = 0; i < 8; i++) { float v = unif(-1, 1); memcpy(p + 4 * i, &v, 4); } break;
        }
    }
}

static void launch(Kern k, int grid, int block, const u8* w, i64 rb, int rows, int cols, const float* x, int n,
                   float* out) {
    k<<<grid, block>>>(w, rb, rows, cols, x, n, nullptr, out);
}

// The current kernel's choice (worker/src/backend/cuda/kernels/matmul.rs): warp per row from 4096 rows.
static void old_mv(const Fmt& f, const u8* w, i64 rb, int rows, int cols, const float* x, int n, float* out) {
    if (rows >= 4096) launch(f.mvw, (rows + 3) / 4, 128, w, rb, rows, cols, x, n, out);
    else launch(f.mv, rows, 128, w, rb, rows, cols, x, n, out);
}
static void new_mv(const Fmt& f, const u8* w, i64 rb, int rows, int cols, const float* x, int n, float* out) {
    if (n != 1) return old_mv(f, w, rb, rows, cols, x, n, out);
    f.mv1<<<(rows + MV1_ROWS - 1) / MV1_ROWS, MV1_THREADS>>>(w, rb, rows, cols, x, nullptr, out);
}


int main(int argc, char** argv) {
    const char* only = argc > 1 ? argv[1] : nullptr;  // a comma-separated list of formats
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    {  // copy bandwidth: bytes read plus written
        size_t bytes = 1ull << 30;
        void *a, *b;
        CK(cudaMalloc(&a, bytes)); CK(cudaMalloc(&b, bytes));
        cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
        std::vector<float> ts;
        for (int i = 0; i < 12; i++) {
            cudaEventRecord(e0); CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice)); cudaEventRecord(e1);
            cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); if (i >= 2) ts.push_back(ms);
        }
        printf("copy: %.0f GB/s (read + write)\n", 2.0 * bytes / median(ts) / 1e6);
        cudaFree(a); cudaFree(b);
    }
    struct Shape { int rows, cols; };
    int only_rows = 0, only_cols = 0;
    if (const char* e = getenv("MV_LAB_SHAPE")) sscanf(e, "%dx%d", &only_rows, &only_cols);
    // MV_LAB_SHAPE=ROWSxCOLS: that shape alone (for a profiler run).
    std::vector<Shape> shapes = {{4096, 4096}, {1024, 4096}, {14336, 4096}, {4096, 14336}, {128256, 4096},
                      {896, 896}, {128, 896}, {4864, 896}, {896, 4864}, {151936, 896}, {576, 576}, {1536, 576}};
    printf("%-6s %7s %6s %2s %10s %9s %9s %6s\n", "fmt", "rows", "cols", "n", "rel_err", "old GB/s", "new GB/s", "x");
    for (const Fmt& f : FMTS) {
        if (only && !strstr(only, f.name)) continue;
        for (Shape s : shapes) {
            if (s.cols % f.block_values) continue;
            if (only_rows && (s.rows != only_rows || s.cols != only_cols)) continue;
            const bool hot = f.id == T_Q4_K || f.id == T_Q6_K || f.id == T_Q8_0;
            if (!hot && s.rows > 20000) continue;  // the LM head shapes for the common formats only
            i64 rb = (i64)s.cols / f.block_values * f.block_bytes;
            size_t bytes = (size_t)rb * s.rows;
            int copies = (int)std::max<size_t>(1, (size_t)(400u << 20) / bytes + 1);
            std::vector<u8> host(bytes);
            fill(f, host.data(), bytes);
            u8* w;
            CK(cudaMalloc(&w, bytes * copies));
            for (int c = 0; c < copies; c++) CK(cudaMemcpy(w + c * bytes, host.data(), bytes, cudaMemcpyHostToDevice));
            const int NT = 8;
            std::vector<float> hx((size_t)NT * s.cols);
            for (auto& v : hx) v = unif(-1, 1);
            float *x, *o1, *o2;
            CK(cudaMalloc(&x, hx.size() * 4));
            CK(cudaMalloc(&o1, (size_t)NT * s.rows * 4)); CK(cudaMalloc(&o2, (size_t)NT * s.rows * 4));
            CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
            for (int n : {1}) {
                CK(cudaMemset(o1, 0xFF, (size_t)NT * s.rows * 4)); CK(cudaMemset(o2, 0xFF, (size_t)NT * s.rows * 4));
                old_mv(f, w, rb, s.rows, s.cols, x, n, o1);
                new_mv(f, w, rb, s.rows, s.cols, x, n, o2);
                CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
                std::vector<float> a((size_t)n * s.rows), b((size_t)n * s.rows);
                CK(cudaMemcpy(a.data(), o1, a.size() * 4, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(b.data(), o2, b.size() * 4, cudaMemcpyDeviceToHost));
                double num = 0, den = 0; bool nan = false;
                for (size_t i = 0; i < a.size(); i++) {
                    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) nan = true;
                    num += (a[i] - b[i]) * (double)(a[i] - b[i]); den += (double)a[i] * a[i];
                }
                float err = nan ? NAN : (float)sqrt(num / std::max(den, 1e-30));
                float gb[2];
                for (int which = 0; which < 2; which++) {
                    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
                    std::vector<float> ts;
                    for (int it = 0; it < 60; it++) {
                        const u8* wc = w + (size_t)(it % copies) * bytes;
                        cudaEventRecord(e0);
                        if (which == 0) old_mv(f, wc, rb, s.rows, s.cols, x, n, o1);
                        else new_mv(f, wc, rb, s.rows, s.cols, x, n, o2);
                        cudaEventRecord(e1); cudaEventSynchronize(e1);
                        float ms; cudaEventElapsedTime(&ms, e0, e1); if (it >= 10) ts.push_back(ms);
                    }
                    gb[which] = bytes / median(ts) / 1e6;
                    cudaEventDestroy(e0); cudaEventDestroy(e1);
                }
                CK(cudaGetLastError());
                printf("%-6s %7d %6d %2d %10.2e %9.0f %9.0f %6.2f\n", f.name, s.rows, s.cols, n, err, gb[0], gb[1],
                       gb[1] / gb[0]);
            }
            cudaFree(w); cudaFree(x); cudaFree(o1); cudaFree(o2);
        }
    }
    return 0;
}
