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

// f16's largest finite value for anything larger in magnitude (so that a
// product on f16 operands never meets an inf); NaN stays NaN.
__device__ __forceinline__ float f16_range(float f) {
    return fabsf(f) > 65504.0f ? copysignf(65504.0f, f) : f;
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

// Programmatic dependent launch (sm_90 on): the worker launches every
// kernel allowed to start before the kernel ahead of it on the stream has
// finished, so that a decode step's hundreds of short kernels do not each
// wait out the launch of the next. So every kernel begins with this: it lets
// the kernel after it be scheduled now, then waits until the kernel ahead
// has completed and its writes are visible, before it touches memory (a
// test checks that each kernel's body opens with it).
__device__ __forceinline__ void pdl_launch_next() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_start() {
    pdl_launch_next();
    pdl_wait();
}

// Some mat-vecs open with `pdl_launch_next` alone and call `pdl_wait` after
// issuing their first weight loads (matvec.cu, mv8_early): weights never
// change during a step, so the blocks that become resident while the small
// kernel ahead runs (a norm, RoPE, attention), or while the mat-vec before
// that drains its last blocks, spend that time reading weights.

// One value of x split for the integer mat-vec (`mv8_*`, matvec.cu), as
// `quantize_x8` (elementwise.cu) describes: the 32 lanes of the calling warp
// must hold values i..i+31 of one 32-value group, all lanes present.
__device__ __forceinline__ void split_x8(float v, i64 i, i8* __restrict__ xh, i8* __restrict__ xl,
                                         float* __restrict__ xd, float* __restrict__ xs) {
    const int lane = threadIdx.x & 31;
    const float d = warp_max(fabsf(v)) / 127.0f;
    const float inv = d > 0.0f ? 1.0f / d : 0.0f;
    const int h = max(-127, min(127, __float2int_rn(v * inv)));
    const float rest = fmaf(-d, (float)h, v);
    xh[i] = (i8)h;
    xl[i] = (i8)max(-127, min(127, __float2int_rn(rest * inv * 256.0f)));
    // Sums of lanes 0-15 and 16-31, in a fixed order.
    float s = v;
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) s += __shfl_xor_sync(FULL_MASK, s, o);
    if (lane == 0) xd[i >> 5] = d;
    if ((lane & 15) == 0) xs[i >> 4] = s;
}

// Thread block clusters (sm_90 on): this block's rank and the cluster's
// size, the cluster-wide barrier in two halves, and a double read from
// another block's shared memory.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ u32 cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ u32 cluster_blocks() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
__device__ __forceinline__ double ld_cluster(const double* p, u32 rank) {
    u32 local, remote;
    double v;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(local) : "l"(p));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(v) : "r"(remote) : "memory");
    return v;
}
#endif

// Block-wide sum (float or double) for blockDim.x a multiple of 32 and at
// most 1024. `red` is shared scratch of 32 values. Every thread gets the
// result; warps' partial sums (butterflies, as warp_sum) are combined in
// warp order by each thread alike.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    T s = 0;
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

// ---- RMSNorm pieces (norm.cu, rope.cu), one block per row ----

// This thread's share of sum(x^2) over a row of `cols` values, in a fixed
// order: float4 at a time where `vec` (cols a multiple of 4, 16-byte aligned
// rows), unrolled so that a thread's loads are in flight together (a decode
// step's one row is latency-bound). block_sum of it is the row's sum.
__device__ __forceinline__ float row_sq_sum(const float* xr, int cols, bool vec) {
    float s = 0.0f;
    if (vec) {
        const float4* x4 = (const float4*)xr;
#pragma unroll 4
        for (int c = threadIdx.x; c < cols / 4; c += blockDim.x) {
            const float4 v = x4[c];
            s = fmaf(v.x, v.x, s);
            s = fmaf(v.y, v.y, s);
            s = fmaf(v.z, v.z, s);
            s = fmaf(v.w, v.w, s);
        }
    } else {
        for (int c = threadIdx.x; c < cols; c += blockDim.x) s = fmaf(xr[c], xr[c], s);
    }
    return s;
}

// 1 / sqrt(mean(x^2) + eps) from the row's sum of squares.
__device__ __forceinline__ float rms_scale(float sum_sq, int cols, float eps) {
    return 1.0f / sqrtf(sum_sq / (float)cols + eps);
}

// (v * scale) * g, rounded as the CPU reference rounds it.
__device__ __forceinline__ float4 scale_by(float4 v, float scale, float4 g) {
    return make_float4(__fmul_rn(__fmul_rn(v.x, scale), g.x), __fmul_rn(__fmul_rn(v.y, scale), g.y),
                       __fmul_rn(__fmul_rn(v.z, scale), g.z), __fmul_rn(__fmul_rn(v.w, scale), g.w));
}

// o[c] = (x[c] * scale) * w[c] over the row; o may be x itself (each thread
// writes only what it read).
__device__ __forceinline__ void row_scale_write(const float* xr, const float* __restrict__ w, int cols, float scale,
                                                float* o, bool vec) {
    if (vec) {
        const float4 *x4 = (const float4*)xr, *w4 = (const float4*)w;
#pragma unroll 4
        for (int c = threadIdx.x; c < cols / 4; c += blockDim.x) ((float4*)o)[c] = scale_by(x4[c], scale, w4[c]);
    } else {
        for (int c = threadIdx.x; c < cols; c += blockDim.x) o[c] = __fmul_rn(__fmul_rn(xr[c], scale), w[c]);
    }
}

// ---- tensor-core building blocks (gemm.cu, attention.cu) ----

// Four 8x8 matrices of 16-bit values from shared memory: lane l gives the
// address of row l % 8 of matrix l / 8, and gets, of each matrix, row l / 4,
// values 2 (l % 4) and the one after (.trans: the transposed matrix's).
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// Hints that bring a line toward the SM before a load needs it (no
// registers held, no fault: an address past the data is dropped).
__device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

__device__ __forceinline__ u32 shared_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// c += a b on f16 (m16n8k16, f32 accumulation).
__device__ __forceinline__ void mma_f16(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as f16x2 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ u32 pack_f16(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// a and b as f16 high parts plus the f16 rounding of what is left: about 22
// bits of values near 1, fewer as the low part nears f16's subnormal range
// (below ~1e-3 the high part's 11 bits are all that is kept).
__device__ __forceinline__ void split_f16x2(float a, float b, u32& hi, u32& lo) {
    hi = pack_f16(a, b);
    lo = pack_f16(a - f16_to_f32((u16)(hi & 0xFFFFu)), b - f16_to_f32((u16)(hi >> 16)));
}

// RoPE of pair i of a head at position pos (already times freq_scale): the
// angle, its sine and cosine (times mscale) and the turn of (x0, x1) in
// double, rounded once to f32, as the CPU reference computes them. inv_freq,
// when not null, holds freq_base^(-2i / n_rot) from the host (rope.cu). Shared
// by rope.cu and the mat-vec that turns Q and K as it writes them (matvec.cu),
// which takes the angle's cosine and sine ahead of the turn.
__device__ __forceinline__ void rope_angle(int i, double pos, int n_rot, const double* __restrict__ inv_freq_table,
                                           float freq_base, float mscale, double* cs, double* sn) {
    const double inv_freq =
        inv_freq_table ? inv_freq_table[i] : pow((double)freq_base, -2.0 * (double)i / (double)n_rot);
    sincos(pos * inv_freq, sn, cs);
    *sn *= (double)mscale;
    *cs *= (double)mscale;
}

__device__ __forceinline__ void rope_apply(double x0, double x1, double cs, double sn, float* y0, float* y1) {
    *y0 = (float)(x0 * cs - x1 * sn);
    *y1 = (float)(x0 * sn + x1 * cs);
}

// ---- The KV cache's storage (backend::KvType, -DKV_TYPE) -------------------
//
// A cache is, layer after layer, a K plane then a V plane; a plane holds
// each KV head's rows one after another, and a head's part holds its
// `capacity` rows (positions) of head_dim values. KV_TYPE 0: the values as
// f16, a plane [n_head_kv][capacity][head_dim]. KV_TYPE 1 (q8_0) and 2
// (q4_0): ggml's block formats of those names (32 values a block sharing an
// f16 scale; q8_0 a signed byte a level, q4_0 a nibble of level + 8), a
// head's part being its levels [capacity][KV_LEVEL_BYTES(head_dim)] then its
// f16 scales [capacity][head_dim / 32], padded to 16 bytes: a prefix copy is
// one 2-D copy of each. q4_0 keeps value 2i in the low nibble of byte i and
// 2i + 1 in the high. Readers get f16 values (level times scale, rounded),
// so the attention kernels' arithmetic is the f16 cache's. A quantized
// head_dim is a multiple of 32 (the host checks): rows of levels are whole
// 16-byte units, and every head's part starts 16-byte aligned.
#ifndef KV_TYPE
#define KV_TYPE 0
#endif
#if KV_TYPE == 0
#define KV_BLOCK 1
#define KV_LEVEL_BYTES(hd) ((hd) * 2)
#define KV_SCALE_BYTES(hd) 0
#elif KV_TYPE == 1
#define KV_BLOCK 32
#define KV_LEVEL_BYTES(hd) (hd)
#define KV_SCALE_BYTES(hd) ((hd) / 16)
#elif KV_TYPE == 2
#define KV_BLOCK 32
#define KV_LEVEL_BYTES(hd) ((hd) / 2)
#define KV_SCALE_BYTES(hd) ((hd) / 16)
#else
#error "KV_TYPE is 0 (f16), 1 (q8_0) or 2 (q4_0)"
#endif

// Bytes of one head's part of a plane (backend::KvType::head_bytes).
__device__ __forceinline__ i64 kv_head_bytes(int capacity, int head_dim) {
    return (i64)capacity * KV_LEVEL_BYTES(head_dim) + ((i64)capacity * KV_SCALE_BYTES(head_dim) + 15) / 16 * 16;
}

// Bytes of one plane.
__device__ __forceinline__ i64 kv_plane_bytes(int n_head_kv, int capacity, int head_dim) {
    return n_head_kv * kv_head_bytes(capacity, head_dim);
}

// One KV head's rows of one plane, for reading.
struct KvHead {
    const u8* levels;
    const u16* scales;  // quantized types only
    int head_dim;
};

__device__ __forceinline__ KvHead kv_head(const u16* plane, int n_head_kv, int capacity, int head_dim, int kvh) {
    const u8* base = (const u8*)plane + kvh * kv_head_bytes(capacity, head_dim);
    return KvHead{base, (const u16*)(base + (i64)capacity * KV_LEVEL_BYTES(head_dim)), head_dim};
}

#if KV_TYPE != 0
// The f16 value of `level` times a block's scale.
__device__ __forceinline__ float kv_value_of(int level, float scale) { return f16_to_f32(f32_to_f16(level * scale)); }
__device__ __forceinline__ float kv_scale(const KvHead& h, int pos, int d) {
    return f16_to_f32(h.scales[(i64)pos * (h.head_dim / 32) + d / 32]);
}
// Level j (0..3) of a word of q8_0 levels or (0..7) of q4_0 nibbles.
__device__ __forceinline__ int kv_level(u32 w, int j) {
#if KV_TYPE == 1
    return (int)(signed char)((w >> (8 * j)) & 0xFFu);
#else
    return (int)((w >> (4 * j)) & 0xFu) - 8;
#endif
}
#endif

// Values d, d + 1 of row pos as f16x2 (d even; d in the low half).
__device__ __forceinline__ u32 kv_load2(const KvHead& h, int pos, int d) {
#if KV_TYPE == 0
    return *(const u32*)((const u16*)h.levels + (i64)pos * h.head_dim + d);
#else
    const float s = kv_scale(h, pos, d);
#if KV_TYPE == 1
    const u32 w = *(const u16*)(h.levels + (i64)pos * h.head_dim + d);
#else
    const u32 w = h.levels[(i64)pos * (h.head_dim / 2) + d / 2];
#endif
    return pack_f16(kv_value_of(kv_level(w, 0), s), kv_value_of(kv_level(w, 1), s));
#endif
}

// Values d..d+7 of row pos as four f16x2 words (d a multiple of 8).
__device__ __forceinline__ uint4 kv_load8(const KvHead& h, int pos, int d) {
#if KV_TYPE == 0
    return *(const uint4*)((const u16*)h.levels + (i64)pos * h.head_dim + d);
#else
    const float s = kv_scale(h, pos, d);
#if KV_TYPE == 1
    const u32* p = (const u32*)(h.levels + (i64)pos * h.head_dim + d);
    const u32 w[2] = {p[0], p[1]};
    u32 r[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const u32 wi = w[i >> 1];
        const int j = 2 * (i & 1);
        r[i] = pack_f16(kv_value_of(kv_level(wi, j), s), kv_value_of(kv_level(wi, j + 1), s));
    }
#else
    const u32 w = *(const u32*)(h.levels + (i64)pos * (h.head_dim / 2) + d / 2);
    u32 r[4];
#pragma unroll
    for (int i = 0; i < 4; i++) r[i] = pack_f16(kv_value_of(kv_level(w, 2 * i), s), kv_value_of(kv_level(w, 2 * i + 1), s));
#endif
    return make_uint4(r[0], r[1], r[2], r[3]);
#endif
}

// Value d of row pos (any head_dim for f16).
__device__ __forceinline__ float kv_load1(const KvHead& h, int pos, int d) {
#if KV_TYPE == 0
    return f16_to_f32(((const u16*)h.levels)[(i64)pos * h.head_dim + d]);
#else
    const u32 w2 = kv_load2(h, pos, d & ~1);
    return f16_to_f32((u16)((d & 1) ? w2 >> 16 : w2 & 0xFFFFu));
#endif
}

// Stores values d0..d0 + KV_BLOCK - 1 of head kvh's row pos of a plane
// (x: those values; d0 a multiple of KV_BLOCK): rounded to f16, or one
// block quantized as ggml's quantize_row_q8_0_ref / q4_0_ref does it.
__device__ __forceinline__ void kv_put(u16* plane, int n_head_kv, int capacity, int head_dim, int kvh, int pos,
                                       int d0, const float* __restrict__ x) {
    // kv_head's layout; the plane is writable, so are its parts.
    const KvHead h = kv_head(plane, n_head_kv, capacity, head_dim, kvh);
    u8* base = (u8*)h.levels;
#if KV_TYPE == 0
    ((u16*)base)[(i64)pos * head_dim + d0] = f32_to_f16(x[0]);
#else
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++) {
        const float a = fabsf(x[j]);
        if (amax < a) {
            amax = a;
            max = x[j];
        }
    }
    u16* scales = (u16*)h.scales;
#if KV_TYPE == 1
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    u8* lv = base + (i64)pos * head_dim + d0;
    for (int j = 0; j < 32; j++) lv[j] = (u8)(signed char)roundf(x[j] * id);
#else
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    u8* lv = base + (i64)pos * (head_dim / 2) + d0 / 2;
    for (int j = 0; j < 16; j++) {
        const int a = min(15, (int)(signed char)(x[2 * j] * id + 8.5f));
        const int b = min(15, (int)(signed char)(x[2 * j + 1] * id + 8.5f));
        lv[j] = (u8)(a | (b << 4));
    }
#endif
    scales[(i64)pos * (head_dim / 32) + d0 / 32] = f32_to_f16(d);
#endif
}

// One sequence of a batched decode step (rows mode: row r of q, k, v is the
// next token of sequence seqs[r]); the host's RowSeq, the same fields in this
// order. cache: the sequence's KV cache, layer after layer, each a K plane
// then a V plane (above);
// logits: where the row's logits go (the sequence's sampler); pos: the row's
// position (the sequence's length before the step).
struct RowSeq {
    u16* cache;
    float* logits;
    int pos;
    int capacity;
};

// Layer `layer`'s K plane of a RowSeq's cache (its V plane follows it:
// kv_next_plane).
__device__ __forceinline__ u16* row_k_plane(const RowSeq& s, int layer, int n_head_kv, int head_dim) {
    return (u16*)((u8*)s.cache + 2 * layer * kv_plane_bytes(n_head_kv, s.capacity, head_dim));
}

// The V plane after a K plane.
__device__ __forceinline__ u16* kv_next_plane(u16* k_plane, int n_head_kv, int capacity, int head_dim) {
    return (u16*)((u8*)k_plane + kv_plane_bytes(n_head_kv, capacity, head_dim));
}
__device__ __forceinline__ const u16* kv_next_plane(const u16* k_plane, int n_head_kv, int capacity, int head_dim) {
    return (const u16*)((const u8*)k_plane + kv_plane_bytes(n_head_kv, capacity, head_dim));
}
