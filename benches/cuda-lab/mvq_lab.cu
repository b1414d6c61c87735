// mvq_lab.cu: the worker's integer decode mat-vec for Q4_K (`mv8_q4_k`, formerly also
// `mv8w_q4_k`, matvec.cu, from x split by `quantize_x8`, elementwise.cu)
// against mv1 on the same random weights:
//   benches/cuda-lab/build mvq_lab && /tmp/mvq_lab
// It prints mv1's GB/s, quantize_x8's time, and each mv8 kernel's GB/s
// (marked BAD where its relative L2 difference from mv1 exceeds 3e-4).
// The tile shapes tried before these two were chosen are in NOTES.md.
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



typedef void (*Mvq)(const u8*, i64, int, int, const i8*, const i8*, const float*, const float*, const float*,
                    float*);

int main() {
    struct Shape { int rows, cols; };
    std::vector<Shape> shapes = {{4096, 4096}, {1024, 4096}, {14336, 4096}, {4096, 14336}, {128256, 4096},
                                 {896, 1024}, {4864, 1024}, {151936, 1024}};
    struct V { const char* name; Mvq k; int r; };
    V vs[] = {{"mv8", mv8_q4_k, MV8_ROWS}};
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
        auto quant = [&]() { quantize_x8<<<(s.cols + 255) / 256, 256>>>(x, s.cols, xh, xl, xd, xs); };
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
                v.k<<<(s.rows + v.r - 1) / v.r, MV8_THREADS>>>(w + (size_t)(it % copies) * bytes, rb, s.rows,
                                                                s.cols, xh, xl, xd, xs, nullptr, o2);
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
