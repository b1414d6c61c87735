// attn_lab.cu: decode attention over a long context, the context split
// across blocks (attention.cu: attention_split + attention_combine) against
// one block per head (attention), same random f16 cache: relative L2
// difference and median microseconds.
//   benches/cuda-lab/build attn_lab && /tmp/attn_lab
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_fp16.h>

#include "lab.cuh"

#include "attention.cu"
#include "attention_split.cu"
#include "attention_tc.cu"


int main() {
    struct Case { int n_head, n_kv, hd, capacity, n_ctx; };
    Case cases[] = {{32, 8, 128, 4096, 64},    {32, 8, 128, 4096, 512},   {32, 8, 128, 4096, 4096},
                    {32, 8, 128, 16384, 16384}, {32, 8, 128, 16384, 100}, {14, 2, 64, 4096, 4096},
                    {14, 2, 64, 4096, 512},     {9, 3, 64, 2048, 2048},   {9, 3, 64, 2048, 40}};
    printf("%5s %4s %4s %6s %6s %6s %6s %10s %9s %9s %6s\n", "heads", "kv", "hd", "cap", "ctx", "split", "chunk",
           "rel_err", "old us", "new us", "x");
    for (Case c : cases) {
        size_t cache = (size_t)c.n_kv * c.capacity * c.hd;
        std::vector<__half> hk(cache), hv(cache);
        for (size_t i = 0; i < cache; i++) { hk[i] = __float2half(unif(-1, 1)); hv[i] = __float2half(unif(-1, 1)); }
        std::vector<float> hq((size_t)c.n_head * c.hd);
        for (auto& v : hq) v = unif(-1, 1);
        int nsplit = std::max((264 + c.n_kv - 1) / c.n_kv, (c.capacity + ATS_MAX_CHUNK - 1) / ATS_MAX_CHUNK);
        int chunk = (c.capacity + nsplit - 1) / nsplit;
        u16 *k, *v; float *q, *o1, *o2, *part; int* pos;
        CK(cudaMalloc(&k, cache * 2)); CK(cudaMalloc(&v, cache * 2));
        CK(cudaMalloc(&q, hq.size() * 4)); CK(cudaMalloc(&o1, hq.size() * 4)); CK(cudaMalloc(&o2, hq.size() * 4));
        CK(cudaMalloc(&part, (size_t)c.n_head * nsplit * (c.hd + 2) * 4)); CK(cudaMalloc(&pos, 4));
        CK(cudaMemcpy(k, hk.data(), cache * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(v, hv.data(), cache * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(q, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
        int p = c.n_ctx - 1;
        CK(cudaMemcpy(pos, &p, 4, cudaMemcpyHostToDevice));
        float scale = 1.0f / sqrtf((float)c.hd);
        auto run_old = [&]() {
            attention<<<dim3(1, c.n_head), ATT_THREADS>>>(q, 1, c.n_head, c.n_kv, c.hd, 0, pos, c.capacity, k, v, scale, o1);
        };
        auto run_new = [&]() {
            attention_split<<<dim3(c.n_kv, nsplit), ATS_THREADS>>>(q, c.n_head, c.n_kv, c.hd, 0, pos, c.capacity, k, v,
                                                                   scale, chunk, nsplit, part);
            attention_combine<<<c.n_head, 128>>>(part, c.n_head, c.hd, nsplit, o2);
        };
        run_old(); run_new(); CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
        std::vector<float> a(hq.size()), b(hq.size());
        CK(cudaMemcpy(a.data(), o1, a.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(b.data(), o2, b.size() * 4, cudaMemcpyDeviceToHost));
        double num = 0, den = 0; bool bad = false;
        for (size_t i = 0; i < a.size(); i++) {
            if (!std::isfinite(a[i]) || !std::isfinite(b[i])) bad = true;
            num += (a[i] - b[i]) * (double)(a[i] - b[i]); den += (double)a[i] * a[i];
        }
        float us[4];
        auto run_split = [&]() {
            attention_split<<<dim3(c.n_kv, nsplit), ATS_THREADS>>>(q, c.n_head, c.n_kv, c.hd, 0, pos, c.capacity, k, v,
                                                                   scale, chunk, nsplit, part);
        };
        auto run_comb = [&]() { attention_combine<<<c.n_head, 128>>>(part, c.n_head, c.hd, nsplit, o2); };
        for (int which = 0; which < 4; which++) {
            cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
            std::vector<float> ts;
            for (int it = 0; it < 60; it++) {
                cudaEventRecord(e0);
                if (which == 0) run_old(); else if (which == 1) run_new(); else if (which == 2) run_split(); else run_comb();
                cudaEventRecord(e1); cudaEventSynchronize(e1);
                float ms; cudaEventElapsedTime(&ms, e0, e1); if (it >= 10) ts.push_back(ms);
            }
            us[which] = median(ts) * 1000;
        }
        CK(cudaGetLastError());
        printf("%5d %4d %4d %6d %6d %6d %6d %10.2e %9.1f %9.1f %6.2f\n", c.n_head, c.n_kv, c.hd, c.capacity, c.n_ctx,
               nsplit, chunk, bad ? NAN : sqrt(num / den), us[0], us[1], us[0] / us[1]);
        printf("      split alone %.1f us, combine alone %.1f us\n", us[2], us[3]);
        cudaFree(k); cudaFree(v); cudaFree(q); cudaFree(o1); cudaFree(o2); cudaFree(part); cudaFree(pos);
    }
}
