// rope.cu: rotary position embedding in place, both pairings:
//   style 0 (normal, llama): pairs (2i, 2i+1)
//   style 1 (NEOX: qwen2, phi3, gpt-oss): pairs (i, i + n_rot/2)
// theta_i = (start_pos + t) * freq_scale * freq_base^(-2i / n_rot). The
// angle, its sine and cosine and the rotation are computed in double, as the
// CPU reference does, so large positions lose no precision. Dimensions from
// n_rot to head_dim are left as they are. One thread per rotated pair.
// When pos_ptr is not null the start position is read from it (a decode step
// replayed from a CUDA graph), otherwise start_pos is used. inv_freq, when not
// null, holds freq_base^(-2i / n_rot) for i < n_rot / 2, computed on the host
// exactly as the CPU reference computes it (saving a pow per thread), each
// divided by its frequency factor where the model has them (Llama 3.1's
// rope_freqs, Phi-3's LongRoPE tables: then the table is required). The
// cosine and sine are multiplied by mscale (rope.scaling.attn_factor).
// x2 (n_head2 heads a row, or null and 0) is rotated in the same launch,
// as x: Q and K of a layer in one kernel.
#include "common.cuh"

extern "C" __global__ void rope(float* __restrict__ x, float* __restrict__ x2, int rows, int n_head, int n_head2,
                                int head_dim, int n_rot, int start_pos, const int* __restrict__ pos_ptr,
                                const double* __restrict__ inv_freq_table, float freq_base, float freq_scale,
                                float mscale, int style) {
    if (pos_ptr) start_pos = *pos_ptr;
    const int half = n_rot / 2, heads = n_head + n_head2;
    const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const i64 total = (i64)rows * heads * half;
    if (idx >= total) return;
    const int i = (int)(idx % half);
    const int h = (int)((idx / half) % heads);
    const int t = (int)(idx / ((i64)half * heads));
    float* head = h < n_head ? x + ((i64)t * n_head + h) * head_dim : x2 + ((i64)t * n_head2 + h - n_head) * head_dim;
    const double pos = (double)(start_pos + t) * (double)freq_scale;
    const double inv_freq =
        inv_freq_table ? inv_freq_table[i] : pow((double)freq_base, -2.0 * (double)i / (double)n_rot);
    double sn, cs;
    sincos(pos * inv_freq, &sn, &cs);
    sn *= (double)mscale;
    cs *= (double)mscale;
    const int a = style == 0 ? 2 * i : i;
    const int b = style == 0 ? 2 * i + 1 : i + half;
    const double x0 = head[a], x1 = head[b];
    head[a] = (float)(x0 * cs - x1 * sn);
    head[b] = (float)(x0 * sn + x1 * cs);
}
