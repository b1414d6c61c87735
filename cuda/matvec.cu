// matvec.cu: out[r] = sum_c x[c] * W[r][c] (+ bias[r]) for one row of x
// (decode), W in its stored format: `mv1_<type>` (and `mv1e_<type>` over a
// mixture's chosen experts). The module goes on in matvec_mv8.cu (the
// integer mat-vecs) and matvec_mmq.cu (short prompts on the integer tensor
// cores): NVRTC reads the three as one text (source.rs's Module::files).
//
// Decode reads every weight once per token, so this kernel is about keeping
// enough bytes in flight to stream weights at memory speed. Each block takes
// MV1_ROWS weight rows and walks their columns in tiles of a whole number of
// format blocks (about 1 KB of each row). Tiles are copied into shared
// memory with 16-byte `cp.async` copies, MV1_STAGES - 1 tiles ahead of the one
// being multiplied, so the copies are coalesced and many are in flight
// whatever the format's block size (34 B for Q8_0, 210 B for Q6_K). Values
// are decoded from shared memory by deq8 (dequant.cuh), exactly as the CPU
// decodes them; each thread reads its chunk of x once for all its rows.
//
// Summation order is fixed (a thread's chunks in column order, a butterfly
// per warp, then warps in order), so results are the same bits on every run.
#include "common.cuh"
#include "dequant.cuh"

// Shared with the host's launch geometry: defined once in the worker
// (backend/cuda/source.rs) and passed as -D options.
#if !defined(MV1_THREADS) || !defined(MV1_ROWS) || !defined(MV1_STAGES)
#error "MV1_THREADS, MV1_ROWS and MV1_STAGES come from the worker as -D options"
#endif
static_assert(MV1_THREADS % 32 == 0 && MV1_STAGES >= 2, "whole warps, and at least double buffering");

// One column tile of a format: VALUES values, a whole number of blocks,
// about 1 KB of each row (so that MV1_STAGES tiles of MV1_ROWS rows fit in
// 48 KB of shared memory).
template <int T>
struct Tile {
    static constexpr int BLOCK_VALUES = (T == T_Q4_K || T == T_Q5_K || T == T_Q6_K) ? 256
                                        : (T == T_F32 || T == T_F16 || T == T_BF16) ? 8 : 32;
    static constexpr int BLOCK_BYTES = T == T_F32 ? 32 : (T == T_F16 || T == T_BF16) ? 16 : T == T_Q4_0 ? 18
                                       : T == T_Q4_1 ? 20 : T == T_Q5_0 ? 22 : T == T_Q5_1 ? 24 : T == T_Q8_0 ? 34
                                       : T == T_MXFP4 ? 17 : T == T_Q4_K ? 144 : T == T_Q5_K ? 176 : 210;
    static constexpr int VALUES = T == T_F32 ? 256 : (T == T_F16 || T == T_BF16) ? 512
                                  : (T == T_Q4_0 || T == T_Q4_1 || T == T_Q4_K || T == T_MXFP4) ? 2048 : 1024;
    // Values one thread multiplies at a time (one `chunk`, see dequant.cuh).
    static constexpr int SEG = 8;
    static constexpr int SEGS = VALUES / SEG;
    static constexpr int BYTES = VALUES / BLOCK_VALUES * BLOCK_BYTES;
    // 16-byte pieces of one row's tile, which need not start 16-byte aligned.
    static constexpr int PIECES = BYTES / 16 + 2;
    static constexpr int GROUPS = MV1_THREADS / SEGS;  // threads sharing a segment column
    static constexpr int ROWS_PER_THREAD = MV1_ROWS / GROUPS;
    static constexpr int COPIES = (MV1_ROWS * PIECES + MV1_THREADS - 1) / MV1_THREADS;
};

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16 bytes global -> shared, of which the first `n` are read and the rest
// zero-filled (so nothing past the tensor's end is touched).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int n) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// `n` activations from xp (zeros past `left`), with 16-byte loads when the
// row allows them.
template <int N>
__device__ __forceinline__ void load_x(const float* __restrict__ xp, int left, bool vec, float* xv) {
    if (vec && left >= N) {
#pragma unroll
        for (int i = 0; i < N; i += 4) {
            const float4 a = *(const float4*)(xp + i);
            xv[i] = a.x; xv[i + 1] = a.y; xv[i + 2] = a.z; xv[i + 3] = a.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; i++) xv[i] = i < left ? xp[i] : 0.0f;
    }
}

template <int N>
__device__ __forceinline__ float sum_of(const float* v) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < N; i++) s += v[i];
    return s;
}

// Formats whose values carry an offset (d*q + m): their dot product needs
// the sum of the activations.
__device__ __forceinline__ constexpr bool seg_needs_xsum(int T) { return T == T_Q4_1 || T == T_Q4_K; }

// Byte i of w, which holds 4 unsigned bytes, minus `bias`, as a float
// without a conversion instruction (see i2f): 2^23 + byte, built by a byte
// permute, minus 2^23 + bias, exactly.
template <int I>
__device__ __forceinline__ float byte_minus(u32 w, float bias) {
    return __int_as_float(__byte_perm(w, 0x4Bu, 0x4550 + I)) - (8388608.0f + bias);
}

// s + sum over the 4 bytes of w of (byte - bias) * x[i].
__device__ __forceinline__ float dot4(u32 w, float bias, const float* x, float s) {
    s = fmaf(byte_minus<0>(w, bias), x[0], s);
    s = fmaf(byte_minus<1>(w, bias), x[1], s);
    s = fmaf(byte_minus<2>(w, bias), x[2], s);
    return fmaf(byte_minus<3>(w, bias), x[3], s);
}

// Four MXFP4 codes (a byte each, 0..15) as bytes of twice their E2M1
// value plus 12: 12, 13, 14, 15, 16, 18, 20, 24 for codes 0-7 and 12, 11,
// 10, 9, 8, 6, 4, 0 for 8-15 (the selector packs each code's low three bits
// into a nibble).
__device__ __forceinline__ u32 e2m1_plus12(u32 w) {
    const u32 sel = (w & 7u) | ((w >> 4) & 0x70u) | ((w >> 8) & 0x700u) | ((w >> 12) & 0x7000u);
    const u32 pos = __byte_perm(0x0F0E0D0Cu, 0x18141210u, sel), neg = __byte_perm(0x090A0B0Cu, 0x00040608u, sel);
    const u32 mask = ((w >> 3) & 0x01010101u) * 0xFFu;
    return (pos & ~mask) | (neg & mask);
}

// Eight MXFP4 codes, the nibbles of q as qs holds them (byte i: value i's
// code low, value i + 16's high), as signed bytes of twice their E2M1 value
// (0, 1, 2, 3, 4, 6, 8, 12 and their negatives; code 8 is 0), as dp4a takes
// them: lo = values 0-3, hi = values 16-19. Each code's low three bits pick
// from the positive and the negative half-table at once (a selector nibble
// a code), and its sign bit then picks between the two (llama.cpp's
// get_int_from_table_16): twelve instructions a word of eight codes, where
// nibbles split and looked up four at a time took about thirty.
__device__ __forceinline__ void e2m1_doubled_s8(u32 q, u32& lo, u32& hi) {
    const u32 P0 = 0x03020100u, P1 = 0x0C080604u, N0 = 0xFDFEFF00u, N1 = 0xF4F8FAFCu;
    const u32 idx = q & 0x77777777u, pick = 0x32103210u | ((q & 0x88888888u) >> 1);
    const u32 a = __byte_perm(__byte_perm(P0, P1, idx), __byte_perm(N0, N1, idx), pick);
    const u32 b = __byte_perm(__byte_perm(P0, P1, idx >> 16), __byte_perm(N0, N1, idx >> 16), pick >> 16);
    lo = __byte_perm(a, b, 0x6420);
    hi = __byte_perm(a, b, 0x7531);
}

// sum_k W[8 c + k] * x[k] over chunk `c` of a row (8 values, never
// straddling a block), the format's scales applied once to the
// integer-valued partial sum rather than to every value: this rounds
// differently from decoding each value (deq8) and multiplying, by a few
// units in the last place of the sum. Formats not specialised here decode
// with deq8.
template <int T>
__device__ __forceinline__ float seg_dot(const u8* __restrict__ row, int c, int left, const float* x, float xsum) {
    u32 q[2];
    if (T == T_Q4_0 || T == T_Q4_1) {
        const int bytes = T == T_Q4_0 ? 18 : 20;
        const u8* b = row + (c >> 2) * bytes;
        const int p = c & 3;  // values 8p..8p+7: low nibbles of qs[8(p&1)..] for p < 2, else high
        ld_words<2, T == T_Q4_0 ? 2 : 4>(b + bytes - 16 + 8 * (p & 1), q);
        const int sh = (p >> 1) * 4;
        const float bias = T == T_Q4_0 ? 8.0f : 0.0f;
        const float acc = dot4((q[1] >> sh) & 0x0F0F0F0Fu, bias, x + 4, dot4((q[0] >> sh) & 0x0F0F0F0Fu, bias, x, 0.0f));
        const float d = f16_to_f32(*(const u16*)b);
        if (T == T_Q4_0) return d * acc;
        return fmaf(d, acc, f16_to_f32(*(const u16*)(b + 2)) * xsum);
    } else if (T == T_Q8_0) {
        const u8* b = row + (c >> 2) * 34;
        ld_words<2, 2>(b + 2 + 8 * (c & 3), q);
        const float acc = dot4(q[1] ^ 0x80808080u, 128.0f, x + 4, dot4(q[0] ^ 0x80808080u, 128.0f, x, 0.0f));
        return f16_to_f32(*(const u16*)b) * acc;
    } else if (T == T_Q4_K) {
        const u8* b = row + (c >> 5) * 144;
        const int o = 8 * (c & 31), k = o >> 6, hi = (o >> 5) & 1, l0 = o & 31;
        const float d = f16_to_f32(*(const u16*)b), dmin = f16_to_f32(*(const u16*)(b + 2));
        float sc, mn;
        k_scale_min(b + 4, 2 * k + hi, d, dmin, &sc, &mn);
        ld_words<2, 8>(b + 16 + 32 * k + l0, q);
        const int sh = 4 * hi;
        const float acc = dot4((q[1] >> sh) & 0x0F0F0F0Fu, 0.0f, x + 4, dot4((q[0] >> sh) & 0x0F0F0F0Fu, 0.0f, x, 0.0f));
        return fmaf(sc, acc, -mn * xsum);
    } else if (T == T_Q6_K) {
        const u8* b = row + (c >> 5) * 210;
        const int o = 8 * (c & 31), n = o >> 7, r = o & 127, quarter = r >> 5, l0 = r & 31;
        u32 h[2];
        ld_words<2, 2>(b + 64 * n + l0 + (quarter & 1) * 32, q);
        ld_words<2, 2>(b + 128 + 32 * n + l0, h);
        const int lsh = (quarter >> 1) * 4, hsh = 2 * quarter;
        const u32 q0 = ((q[0] >> lsh) & 0x0F0F0F0Fu) | (((h[0] >> hsh) & 0x03030303u) << 4);
        const u32 q1 = ((q[1] >> lsh) & 0x0F0F0F0Fu) | (((h[1] >> hsh) & 0x03030303u) << 4);
        const float ds = __fmul_rn(f16_to_f32(*(const u16*)(b + 208)), i2f(((const i8*)(b + 192))[o >> 4]));
        return ds * dot4(q1, 32.0f, x + 4, dot4(q0, 32.0f, x, 0.0f));
    } else if (T == T_MXFP4) {
        // Codes to twice their E2M1 value plus 12 (0..24, a byte each) by
        // two byte permutes (codes 0-7, 8-15) and the sign bit's choice
        // between them, so dot4 takes them as Q4_0's nibbles; the block's
        // scale (halved) multiplies the integer-valued sum once.
        const u8* b = row + (c >> 2) * 17;
        const int p = c & 3;  // values 8p..8p+7: low nibbles of qs[8(p&1)..] for p < 2, else high
        // Eight bytes at any alignment: three aligned words funnel-shifted
        // (up to 3 bytes past them read: the tile's buffer has room).
        const u8* src = b + 1 + 8 * (p & 1);
        const u32* wq = (const u32*)((u64)src & ~(u64)3);
        const u32 shb = ((u32)(u64)src & 3) * 8;
        const u32 a0 = wq[0], a1 = wq[1], a2 = wq[2];
        q[0] = __funnelshift_r(a0, a1, shb);
        q[1] = __funnelshift_r(a1, a2, shb);
        const int sh = (p >> 1) * 4;
        const float acc = dot4(e2m1_plus12((q[1] >> sh) & 0x0F0F0F0Fu), 12.0f, x + 4,
                               dot4(e2m1_plus12((q[0] >> sh) & 0x0F0F0F0Fu), 12.0f, x, 0.0f));
        return e8m0_half(b[0]) * acc;
    } else {
        float w[8];
        deq8<T>(row, c, left, w);
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) acc = fmaf(w[k], x[k], acc);
        return acc;
    }
}

// Queues this thread's copies of tile `tile` of rows r0.. into `buf`.
template <int T>
__device__ __forceinline__ void mv1_fetch(const u8* __restrict__ W, i64 row_bytes, int rows, int r0, int tile,
                                          u8 (*buf)[Tile<T>::PIECES * 16]) {
    using Tl = Tile<T>;
    const u8* end = W + (i64)rows * row_bytes;
#pragma unroll
    for (int l = 0; l < Tl::COPIES; l++) {
        const int idx = threadIdx.x + l * MV1_THREADS;
        if (idx >= MV1_ROWS * Tl::PIECES) break;
        const int j = idx / Tl::PIECES, p = idx % Tl::PIECES;
        const u8* start = W + (i64)(r0 + j) * row_bytes + (i64)tile * Tl::BYTES;
        const u8* a = (const u8*)((u64)start & ~(u64)15) + 16 * p;
        const i64 avail = r0 + j < rows ? end - a : 0;
        const int n = avail >= 16 ? 16 : avail > 0 ? (int)avail : 0;
        cp_async16(&buf[j][16 * p], n > 0 ? a : W, n);
    }
}

template <int T>
__device__ __forceinline__ void mv1_impl(const u8* __restrict__ W, i64 row_bytes, int rows, int cols,
                                         const float* __restrict__ x, const float* __restrict__ bias,
                                         float* __restrict__ out) {
    using Tl = Tile<T>;
    constexpr int RPT = Tl::ROWS_PER_THREAD;
    __shared__ __align__(16) u8 buf[MV1_STAGES][MV1_ROWS][Tl::PIECES * 16];
    __shared__ float red[MV1_THREADS / 32][RPT];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int seg = tid % Tl::SEGS, g = tid / Tl::SEGS;
    const int r0 = blockIdx.x * MV1_ROWS;
    const int ntiles = (cols + Tl::VALUES - 1) / Tl::VALUES;
    const bool vec = (cols & 3) == 0;

    float acc[RPT];
#pragma unroll
    for (int i = 0; i < RPT; i++) acc[i] = 0.0f;

#pragma unroll
    for (int s = 0; s < MV1_STAGES - 1; s++) {
        if (s < ntiles) mv1_fetch<T>(W, row_bytes, rows, r0, s, buf[s]);
        cp_async_commit();
    }
    for (int tile = 0; tile < ntiles; tile++) {
        cp_async_wait<MV1_STAGES - 2>();
        // Every thread's copies of this tile have landed, and every thread is
        // done with the tile before it, whose buffer is refilled next.
        __syncthreads();
        const int ahead = tile + MV1_STAGES - 1;
        if (ahead < ntiles) mv1_fetch<T>(W, row_bytes, rows, r0, ahead, buf[ahead % MV1_STAGES]);
        cp_async_commit();

        const int v0 = tile * Tl::VALUES, left = cols - v0;
        if (Tl::SEG * seg >= left) continue;
        float xv[Tl::SEG];
        load_x<Tl::SEG>(x + v0 + Tl::SEG * seg, left - Tl::SEG * seg, vec, xv);
        const float xsum = seg_needs_xsum(T) ? sum_of<Tl::SEG>(xv) : 0.0f;
        u8(*b)[Tl::PIECES * 16] = buf[tile % MV1_STAGES];
#pragma unroll
        for (int i = 0; i < RPT; i++) {
            const int j = g + i * Tl::GROUPS;
            const u8* start = W + (i64)(r0 + j) * row_bytes + (i64)tile * Tl::BYTES;
            acc[i] += seg_dot<T>(&b[j][(u64)start & 15], seg, left, xv, xsum);
        }
    }
    cp_async_wait<0>();

#pragma unroll
    for (int i = 0; i < RPT; i++) {
        const float s = warp_sum(acc[i]);
        if (lane == 0) red[warp][i] = s;
    }
    __syncthreads();
    constexpr int WARPS_PER_GROUP = Tl::SEGS / 32;
    if (tid < MV1_ROWS && r0 + tid < rows) {
        const int j = tid, gj = j % Tl::GROUPS, i = j / Tl::GROUPS;
        float s = 0.0f;
        for (int w = gj * WARPS_PER_GROUP; w < (gj + 1) * WARPS_PER_GROUP; w++) s += red[w][i];
        out[r0 + j] = bias ? s + bias[r0 + j] : s;
    }
}

#define DEF_MV1(name, T)                                                                                 \
    extern "C" __global__ void __launch_bounds__(MV1_THREADS)                                            \
        mv1_##name(const u8* W, i64 row_bytes, int rows, int cols, const float* x, const float* bias,    \
                   float* out) {                                                                         \
        pdl_start();                                                                                     \
        mv1_impl<T>(W, row_bytes, rows, cols, x, bias, out);                                             \
    }

// Part 0 of the module (-DONE_PART, source.rs's Module::parts): the
// mat-vecs; part 1: mmq_* (matvec_mmq.cu), compiled only where the layers
// need it.
#if !defined(ONE_PART) || ONE_PART == 0
FOR_EACH_TYPE(DEF_MV1)
#endif

// The expert this block of an `mv1e_*` or `mv8e_*` launch multiplies: row
// y of the grid is slot s, its expert ids[s] (-1 if out of range: never,
// moe_route writes ids below experts); z = 1 takes the second matrix, its
// bias and output.
__device__ __forceinline__ int block_expert(const int* ids, int experts, const u8*& W, const float*& bias,
                                            float*& out, const u8* W2, const float* bias2, float* out2) {
    if (blockIdx.z == 1) {
        W = W2;
        bias = bias2;
        out = out2;
    }
    const int e = ids[blockIdx.y];
    return e >= 0 && e < experts ? e : -1;
}

// `mv1e_<type>`: mv1 over the experts a router chose (mixture of experts):
// row y of the grid is slot s of n * used; it multiplies expert ids[s]'s
// `rows` rows of W (experts stacked, expert e's rows e * rows..), with row
// s / x_div of x (x_div = used: a token's slots share its x; 1: each slot
// has its own, the down product), adds bias row ids[s] (bias `[experts,
// rows]`, or none) and writes row s of out. The expert id is read on the
// device, so a decode step reads only the chosen experts' weights and
// needs no copy to the host. With W2 (blockIdx.z = 1), a second matrix of
// the same shape and its bias and output in the same launch (gate and up).
// Part 2 of the module: compiled only for the formats a model stores
// experts in.
#define DEF_MV1E(name, T)                                                                                \
    extern "C" __global__ void __launch_bounds__(MV1_THREADS)                                            \
        mv1e_##name(const u8* W, i64 row_bytes, int rows, int cols, int experts, const int* ids,         \
                    int x_div, const float* x, const float* bias, float* out, const u8* W2,              \
                    const float* bias2, float* out2) {                                                   \
        pdl_start();                                                                                     \
        const int s = blockIdx.y, e = block_expert(ids, experts, W, bias, out, W2, bias2, out2);        \
        if (e < 0) return;                                                                               \
        mv1_impl<T>(W + (i64)e * rows * row_bytes, row_bytes, rows, cols, x + (i64)(s / x_div) * cols,    \
                    bias ? bias + (i64)e * rows : nullptr, out + (i64)s * rows);                          \
    }
#if !defined(ONE_PART) || ONE_PART == 2
FOR_EACH_TYPE(DEF_MV1E)
#endif
