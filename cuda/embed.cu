// embed.cu: out[t] = decode(table row tokens[t]), for every stored format.
// One block per token; threads stride over 8-value chunks of the row.
#include "common.cuh"
#include "dequant.cuh"

template <int T>
__device__ __forceinline__ void embed_impl(const u8* __restrict__ table, i64 row_bytes, int rows, int cols,
                                           const u32* __restrict__ tokens, int n, float* __restrict__ out) {
    const int t = blockIdx.x;
    if (t >= n) return;
    const u32 id = tokens[t];
    float* o = out + (i64)t * cols;
    const int nchunks = (cols + 7) >> 3;
    for (int c = threadIdx.x; c < nchunks; c += blockDim.x) {
        float v[8];
        if (id < (u32)rows) {
            deq8<T>(table + (i64)id * row_bytes, c, cols, v);
        } else {
            // Unreachable through the worker (ids are checked on the host); a
            // defined result rather than an out-of-bounds read.
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (8 * c + i < cols) o[8 * c + i] = v[i];
    }
}

#define DEF_EMBED(name, T)                                                                           \
    extern "C" __global__ void embed_##name(const u8* table, i64 row_bytes, int rows, int cols,     \
                                            const u32* tokens, int n, float* out) {                 \
        pdl_start();                                                                                \
        embed_impl<T>(table, row_bytes, rows, cols, tokens, n, out);                                 \
    }

FOR_EACH_TYPE(DEF_EMBED)
