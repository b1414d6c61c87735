// matvec_mv8.cu: the integer mat-vecs of matvec.cu's module (`mv8_*`,
// `mv8m_*`, `mv8q_*`, `mv8n_*`, `mv8e_*`). Not a module of its own: NVRTC
// reads matvec.cu, this file and matvec_mmq.cu as one text (source.rs,
// `Module::files`), so it uses the headers and helpers matvec.cu opens with.

// ---------------------------------------------------------------------------
// `mv8_<type>` / `mv8n_<type>`: the same product on the integer units, for
// Q4_0, Q4_1, Q4_K, Q5_0, Q8_0 and Q6_K (and MXFP4 in `mv8e_*`, over the
// experts a router chose), from x split by `quantize_x8` (elementwise.cu)
// into int8 parts hi and lo (x ~ d * (hi + lo / 256) per 32 values) and
// exact sums of 16. Four weights meet four int8 values in one dp4a, where
// mv1 spends three instructions per value. No shared memory but for the
// final sums: each thread loads a unit of 32 weights (and its block's
// scales) straight into registers.
//
// `mv8_*` (one row of x, decode): groups of MV8_ROWS weight rows, each
// group's warps splitting the columns. A thread takes the same unit of every row of
// the block, so it loads x's parts once for all of them (x is most of the
// bytes a thread loads: 64 of them per 16 bytes of Q4_K weights) and issues
// every row's weight loads before it multiplies any: faster than the former
// warp-per-row layout on large matrices (benches/cuda-lab/mvr_lab.cu;
// figures in benches/results/kernel-choices.md). `mv8n_*` takes any number of rows of x (short prompts, batched
// decode steps) in groups of MV8_MAX_TOKENS along the grid's y, MV8N_ROWS
// weight rows a block with a warp each, each weight unit decoded once for
// all rows of its group; a row's sums are the same in any group.
#if !defined(MV8_THREADS) || !defined(MV8_ROWS) || !defined(MV8N_ROWS) || !defined(MV8_MAX_TOKENS)
#error "MV8_THREADS, MV8_ROWS, MV8N_ROWS and MV8_MAX_TOKENS come from the worker as -D options"
#endif
// mv8q_* turns pairs of neighbouring rows, which R rows a group keep together.
static_assert(MV8_ROWS % 2 == 0 && (MV8_THREADS / 32) * MV8_ROWS <= 32, "row pairs in one warp");

// The quantized x of one row.
struct X8 {
    const i8* __restrict__ hi;
    const i8* __restrict__ lo;
    const float* __restrict__ d;
    const float* __restrict__ sum16;

    // Row t of rows of `cols` values split one after another.
    __device__ __forceinline__ X8 row(int t, int cols) const {
        return {hi + (i64)t * cols, lo + (i64)t * cols, d + (i64)t * (cols / 32), sum16 + (i64)t * (cols / 16)};
    }
};

// The x a unit meets: 16 values from column c0 and 16 from c1 (hi and lo
// parts), the scales of their 32-value blocks and their sums.
struct X8Unit {
    uint4 h0, l0, h1, l1;
    float d0, d1, s0, s1;
};

__device__ __forceinline__ X8Unit x8_unit(const X8& x, int c0, int c1) {
    X8Unit r;
    r.h0 = *(const uint4*)(x.hi + c0);
    r.l0 = *(const uint4*)(x.lo + c0);
    r.h1 = *(const uint4*)(x.hi + c1);
    r.l1 = *(const uint4*)(x.lo + c1);
    r.d0 = x.d[c0 >> 5];
    r.d1 = x.d[c1 >> 5];
    r.s0 = x.sum16[c0 >> 4];
    r.s1 = x.sum16[c1 >> 4];
    return r;
}

// Sixteen weights (a signed byte each in q[0..3]) against x's hi and lo parts.
__device__ __forceinline__ float dot16(const u32* q, uint4 h, uint4 l) {
    int sh = __dp4a((int)q[0], (int)h.x, 0), sl = __dp4a((int)q[0], (int)l.x, 0);
    sh = __dp4a((int)q[1], (int)h.y, sh);
    sl = __dp4a((int)q[1], (int)l.y, sl);
    sh = __dp4a((int)q[2], (int)h.z, sh);
    sl = __dp4a((int)q[2], (int)l.z, sl);
    sh = __dp4a((int)q[3], (int)h.w, sh);
    sl = __dp4a((int)q[3], (int)l.w, sl);
    return fmaf((float)sl, 0.00390625f, (float)sh);
}

// Q4_K's 6-bit scale and min of sub-block j from the 12 scale bytes held in
// three words (no local-memory array).
__device__ __forceinline__ void k_scale_min_w(u32 a, u32 b, u32 c, int j, float d, float dmin, float* sc,
                                              float* mn) {
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

// N words from a 2-byte aligned address that has at least 2 more bytes of
// its tensor after them: N or N + 1 aligned words, shifted (for 32 bytes,
// eight loads where sixteen u16 loads were).
template <int N>
__device__ __forceinline__ void ld_a2(const u8* p, u32* o) {
    const u32* a = (const u32*)((size_t)p & ~(size_t)3);
    const int sh = (int)((size_t)p & 2) * 8;
    u32 w[N + 1];
#pragma unroll
    for (int i = 0; i < N; i++) w[i] = a[i];
    w[N] = sh ? a[N] : 0u;
#pragma unroll
    for (int i = 0; i < N; i++) o[i] = __funnelshift_r(w[i], w[i + 1], sh);
}

// A unit is 32 weights of one row, meeting x at columns col0(u) (16 values)
// and col1(u) (16 more). Q4_0, Q4_1, Q5_0, Q8_0 and Q6_K: unit u is columns 32u.. (one
// block, or an eighth of a Q6_K block). Q4_K: 16 bytes of qs, 16 values of
// sub-block 2k in the low nibbles and 16 of sub-block 2k+1 in the high
// ones, with the block's header (d, dmin, 12 scale bytes); 8 units a block.
// `load` reads a unit's bytes, `dot` multiplies them with x.
template <int T>
struct Mv8Unit;

template <>
struct Mv8Unit<T_Q4_K> {
    uint4 head, qs;
    static __device__ __forceinline__ int col0(int u) { return (u >> 3) * 256 + 64 * ((u >> 1) & 3) + 16 * (u & 1); }
    static __device__ __forceinline__ int col1(int u) { return col0(u) + 32; }
    __device__ __forceinline__ void load(const u8* __restrict__ row, int u) {
        const u8* b = row + (i64)(u >> 3) * 144;
        head = ld_weights16(b);
        qs = ld_weights16(b + 16 + 32 * ((u >> 1) & 3) + 16 * (u & 1));
    }
    __device__ __forceinline__ float dot(int u, const X8Unit& x) const {
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
        float a = s0 * x.d0 * dot16(lo, x.h0, x.l0);
        a = fmaf(-m0, x.s0, a);
        a = fmaf(s1 * x.d1, dot16(hi, x.h1, x.l1), a);
        return fmaf(-m1, x.s1, a);
    }
};

// Bits i..i+3 of h, one into bit 4 of each byte (the fifth bit of 4 values).
__device__ __forceinline__ u32 spread4(u32 h, int i) {
    return (((h >> i) & 0xFu) * 0x00204081u & 0x01010101u) << 4;
}

// Blocks of 22 bytes sit only 2-byte aligned: loaded as u16s.
template <>
struct Mv8Unit<T_Q5_0> {
    u32 dh, qh, qs[4];
    static __device__ __forceinline__ int col0(int u) { return 32 * u; }
    static __device__ __forceinline__ int col1(int u) { return 32 * u + 16; }
    __device__ __forceinline__ void load(const u8* __restrict__ row, int u) {
        const u16* b = (const u16*)(row + (i64)u * 22);
        dh = b[0];
        qh = b[1] | ((u32)b[2] << 16);
#pragma unroll
        for (int i = 0; i < 4; i++) qs[i] = b[3 + 2 * i] | ((u32)b[4 + 2 * i] << 16);
    }
    __device__ __forceinline__ float dot(int, const X8Unit& x) const {
        u32 lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo[i] = (qs[i] & 0x0F0F0F0Fu) | spread4(qh, 4 * i);
            hi[i] = ((qs[i] >> 4) & 0x0F0F0F0Fu) | spread4(qh, 16 + 4 * i);
        }
        const float d = f16_to_f32((u16)dh);
        const float q = dot16(lo, x.h0, x.l0) + dot16(hi, x.h1, x.l1);  // sum of (value + 16) * x
        return d * fmaf(x.d0, q, -16.0f * (x.s0 + x.s1));
    }
};

// The low and high nibbles of 16 bytes, a byte each.
__device__ __forceinline__ void split_nibbles(const u32* qs, u32* lo, u32* hi) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        lo[i] = qs[i] & 0x0F0F0F0Fu;
        hi[i] = (qs[i] >> 4) & 0x0F0F0F0Fu;
    }
}

// Q4_0: 18-byte blocks {d, qs[16]}, value j = d * (nibble - 8), the low
// nibble of byte j (j < 16) or the high one of byte j - 16.
template <>
struct Mv8Unit<T_Q4_0> {
    u32 dh, qs[4];
    static __device__ __forceinline__ int col0(int u) { return 32 * u; }
    static __device__ __forceinline__ int col1(int u) { return 32 * u + 16; }
    __device__ __forceinline__ void load(const u8* __restrict__ row, int u) {
        const u16* b = (const u16*)(row + (i64)u * 18);
        dh = b[0];
#pragma unroll
        for (int i = 0; i < 4; i++) qs[i] = b[1 + 2 * i] | ((u32)b[2 + 2 * i] << 16);
    }
    __device__ __forceinline__ float dot(int, const X8Unit& x) const {
        u32 lo[4], hi[4];
        split_nibbles(qs, lo, hi);
        const float d = f16_to_f32((u16)dh);
        const float q = dot16(lo, x.h0, x.l0) + dot16(hi, x.h1, x.l1);  // sum of (value + 8) * x
        return d * fmaf(x.d0, q, -8.0f * (x.s0 + x.s1));
    }
};

// Q4_1: 20-byte blocks {d, m, qs[16]} (4-byte aligned), value j = d *
// nibble + m, nibbles as Q4_0's.
template <>
struct Mv8Unit<T_Q4_1> {
    u32 dm, qs[4];
    static __device__ __forceinline__ int col0(int u) { return 32 * u; }
    static __device__ __forceinline__ int col1(int u) { return 32 * u + 16; }
    __device__ __forceinline__ void load(const u8* __restrict__ row, int u) {
        const u32* b = (const u32*)(row + (i64)u * 20);
        dm = b[0];
#pragma unroll
        for (int i = 0; i < 4; i++) qs[i] = b[1 + i];
    }
    __device__ __forceinline__ float dot(int, const X8Unit& x) const {
        u32 lo[4], hi[4];
        split_nibbles(qs, lo, hi);
        const float d = f16_to_f32((u16)(dm & 0xFFFF)), m = f16_to_f32((u16)(dm >> 16));
        const float q = dot16(lo, x.h0, x.l0) + dot16(hi, x.h1, x.l1);
        return fmaf(d * x.d0, q, m * (x.s0 + x.s1));
    }
};

// MXFP4: 17-byte blocks {e, qs[16]} at any byte alignment, value j the
// E2M1 code in qs[j]'s low nibble (j < 16) or qs[j - 16]'s high one, times
// 2^(e - 127). The codes become signed bytes of twice their value (exact)
// for dp4a, and the halved scale multiplies the integer sums once. qs comes
// from whole 16-byte chunks (ld_a16: at most 16 bytes past the block, the
// weights' tail), e by a byte load.
template <>
struct Mv8Unit<T_MXFP4> {
    u32 e, qs[4];
    static __device__ __forceinline__ int col0(int u) { return 32 * u; }
    static __device__ __forceinline__ int col1(int u) { return 32 * u + 16; }
    __device__ __forceinline__ void load(const u8* __restrict__ row, int u) {
        const u8* b = row + (i64)u * 17;
        e = __ldg(b);
        ld_a16<4, true>(b + 1, qs);
    }
    __device__ __forceinline__ float dot(int, const X8Unit& x) const {
        u32 lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; i++) e2m1_doubled_s8(qs[i], lo[i], hi[i]);
        return e8m0_half((u8)e) * x.d0 * (dot16(lo, x.h0, x.l0) + dot16(hi, x.h1, x.l1));
    }
};

template <>
struct Mv8Unit<T_Q8_0> {
    u32 dh, qs[8];
    static __device__ __forceinline__ int col0(int u) { return 32 * u; }
    static __device__ __forceinline__ int col1(int u) { return 32 * u + 16; }
    __device__ __forceinline__ void load(const u8* __restrict__ row, int u) {
        const u8* b = row + (i64)u * 34;
        dh = *(const u16*)b;
        // From whole 16-byte chunks (dequant.cuh): faster than seventeen
        // u16 loads. (The same for Q6_K's ql and qh was slower, on more
        // registers; it keeps ld_a2<8>. Figures in
        // benches/results/kernel-choices.md.)
        ld_a16<8, true>(b + 2, qs);
    }
    __device__ __forceinline__ float dot(int, const X8Unit& x) const {
        const float d = f16_to_f32((u16)dh);
        // Halves copied out: a pointer into qs put it in local memory.
        const u32 q0[4] = {qs[0], qs[1], qs[2], qs[3]}, q1[4] = {qs[4], qs[5], qs[6], qs[7]};
        return d * x.d0 * (dot16(q0, x.h0, x.l0) + dot16(q1, x.h1, x.l1));
    }
};

// Q6_K: unit u is values 32 j .. 32 j + 31 of half n of block u / 8 (v = u % 8,
// n = v / 4, j = v % 4): the low (j < 2) or high nibbles of 32 bytes of ql
// and bits 2 j, 2 j + 1 of 32 bytes of qh, with one int8 scale per 16 values.
// Units j and j + 2 read the same bytes; neighbouring lanes take them, so the
// loads meet in the same sectors. Blocks sit 2-byte aligned: ql and qh come
// through ld_a2<8> (each is followed by more of the block).
template <>
struct Mv8Unit<T_Q6_K> {
    u32 ql[8], qh[8], sc, dh;
    static __device__ __forceinline__ int col0(int u) { return 32 * u; }
    static __device__ __forceinline__ int col1(int u) { return 32 * u + 16; }
    __device__ __forceinline__ void load(const u8* __restrict__ row, int u) {
        const u8* b = row + (i64)(u >> 3) * 210;
        const int n = (u >> 2) & 1, j = u & 3;
        ld_a2<8>(b + 64 * n + 32 * (j & 1), ql);
        ld_a2<8>(b + 128 + 32 * n, qh);
        sc = *(const u16*)(b + 192 + 8 * n + 2 * j);
        dh = *(const u16*)(b + 208);
    }
    __device__ __forceinline__ float dot(int u, const X8Unit& x) const {
        const int j = u & 3, sh = 4 * (j >> 1);
        // 6-bit q in bytes, minus 32 without borrows: (q + 0x60) ^ 0x80 per byte.
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
        return x.d0 * fmaf(s0, dot16(q0, x.h0, x.l0), s1 * dot16(q1, x.h1, x.l1));
    }
};

// Formats whose mat-vec loads its first weights before waiting for the
// kernel ahead: not the K-quants, which it slowed while it sped the others
// (benches/results/kernel-choices.md).
__device__ __forceinline__ constexpr bool mv8_early(int T) { return T != T_Q4_K && T != T_Q6_K; }

// Warps that share one group of rows in `mv8_*`: a row's units spread over
// as few warps as cover them (1, 2 or all), so that narrow rows (the 0.5B
// shapes' 896 columns are 28 units) keep every thread busy. The host's
// launch geometry computes the same (launch.rs, mv8_group_warps).
__device__ __forceinline__ int mv8_group_warps(int cols) {
    const int units = cols / 32;
    return units <= 32 ? 1 : units <= 64 ? 2 : MV8_THREADS / 32;
}

// Writes each output as it is: out[row] = s.
struct Mv8Store {
    float* __restrict__ out;
    struct Pre {};
    __device__ __forceinline__ Pre prepare(int) const { return Pre{}; }
    __device__ __forceinline__ void operator()(int row, float s, Pre) const {
        if (row >= 0) out[row] = s;
    }
};

// One row of x: groups of R weight rows, each group's columns split over
// its warps (a thread takes units t, t + 32 G, ... of every row of its
// group), MV8_THREADS / 32 / G groups a block. Summation order is fixed: a
// thread's units in order, a butterfly per warp, the group's warps in order.
// Every thread of the block then calls epi(row, s, pre): threads below
// groups * R with their row and its sum plus bias, the others (and rows past
// the end) with row -1; a row's neighbour of the same group is the next
// thread. pre is what epi.prepare(row) gave for that row while the block's
// first weights were on their way (before the wait for the kernel ahead).
template <int T, int R, typename Epi>
__device__ __forceinline__ void mv8_one(int blk, const u8* __restrict__ W, i64 row_bytes, int rows, int cols,
                                        const X8& x, const float* __restrict__ bias, const Epi& epi) {
    constexpr int WARPS = MV8_THREADS / 32;
    __shared__ float red[WARPS][R];
    const int G = mv8_group_warps(cols), groups = WARPS / G;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int grp = warp / G, t = threadIdx.x - grp * G * 32;
    const int r0 = (blk * groups + grp) * R, nr = min(R, rows - r0);
    const int units = cols / 32;
    const u8* base = W + (i64)r0 * row_bytes;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    // Where the format gains by it (mv8_early), the first unit's weights are
    // loaded before the wait for the kernel ahead (see pdl_launch_next: x is
    // what that kernel writes, the weights are not) and that unit is
    // multiplied ahead of the loop (a loop carrying loaded weights from one
    // turn to the next took 9 registers more: Q4_K 54 -> 63).
    int mine = -1;
    if (threadIdx.x < groups * R) {
        mine = (blk * groups + threadIdx.x / R) * R + threadIdx.x % R;
        if (mine >= rows) mine = -1;
    }
    int u0 = t;
    typename Epi::Pre pre;
    if constexpr (mv8_early(T)) {
        Mv8Unit<T> w[R];
#pragma unroll
        for (int r = 0; r < R; r++)
            if (t < units && r < nr) w[r].load(base + (i64)r * row_bytes, t);
        pre = epi.prepare(mine);
        pdl_wait();
        if (t < units) {
            const X8Unit xu = x8_unit(x, Mv8Unit<T>::col0(t), Mv8Unit<T>::col1(t));
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < nr) acc[r] += w[r].dot(t, xu);
        }
        u0 += G * 32;
    } else {
        pre = epi.prepare(mine);
        pdl_wait();
    }
    for (int u = u0; u < units && nr > 0; u += G * 32) {
        Mv8Unit<T> w[R];
#pragma unroll
        for (int r = 0; r < R; r++)
            if (r < nr) w[r].load(base + (i64)r * row_bytes, u);
        const X8Unit xu = x8_unit(x, Mv8Unit<T>::col0(u), Mv8Unit<T>::col1(u));
#pragma unroll
        for (int r = 0; r < R; r++)
            if (r < nr) acc[r] += w[r].dot(u, xu);
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float s = warp_sum(acc[r]);
        if (lane == 0) red[warp][r] = s;
    }
    __syncthreads();
    float s = 0.0f;
    if (mine >= 0) {
        const int g = threadIdx.x / R, r = threadIdx.x % R;
        for (int w = g * G; w < (g + 1) * G; w++) s += red[w][r];
        s = bias ? s + bias[mine] : s;
    }
    epi(mine, s, pre);
}

// Up to three matrices of the same format and width, one row of x (Q, K
// and V; gate and up): the blocks of matrix 0, then 1, then 2, each block
// as `mv8_one` lays it out for its matrix alone, so every output has the
// bits a launch of its own gives. One launch where there were three: the
// small K and V products no longer run as grids of their own (a tail each).
// epis.at(m) is matrix m's epilogue (Mv8Stores: each output as it is).
template <int T, int R, typename Epis>
__device__ __forceinline__ void mv8_many(const u8* const (&W)[3], i64 row_bytes, const int (&rows)[3], int cols,
                                         const X8& x, const float* const (&bias)[3], const Epis& epis) {
    const int per = R * (MV8_THREADS / 32) / mv8_group_warps(cols);
    int blk = blockIdx.x;
#pragma unroll
    for (int m = 0; m < 3; m++) {
        const int nb = (rows[m] + per - 1) / per;
        if (blk < nb) {
            mv8_one<T, R>(blk, W[m], row_bytes, rows[m], cols, x, bias[m], epis.at(m));
            return;
        }
        blk -= nb;
    }
    pdl_wait();
}

struct Mv8Stores {
    float* const (&out)[3];
    __device__ __forceinline__ Mv8Store at(int m) const { return Mv8Store{out[m]}; }
};

// Q, K and V of one row of x (`mv8q_*`, matrices 0, 1 and 2), each written
// as mv8m_* writes it but Q's and K's heads turned first (RoPE, adjacent
// pairs: rope.cu's style 0) and K's and V's rows also stored in the layer's
// cache planes at the step's position, as qk_rope_store turns and stores
// them, with the same bits: one launch fewer a layer. A row's pair is the
// next thread's (R even, rows a multiple of head_dim). The angle's cosine
// and sine are taken in `prepare`, while the block's first weights load:
// done after the products, their double-precision latency lengthened every
// block's life (benches/results/kernel-choices.md). The position comes from pos_ptr
// in a replayed decode graph: written by a copy before the graph's first
// kernel, so it may be read before the wait for the kernel ahead.
struct QkvRope {
    float* const (&out)[3];
    int head_dim, n_rot;
    const double* __restrict__ inv_freq_table;
    float freq_base, freq_scale, mscale;
    int start_pos;
    const int* __restrict__ pos_ptr;
    int capacity;
    u16* __restrict__ k_cache;
    u16* __restrict__ v_cache;
    struct Epi {
        const QkvRope& p;
        int m;
        // The row's position and its pair's angle (cs 0 and sn 0: no turn).
        struct Pre {
            int at;
            double cs, sn;
        };
        __device__ __forceinline__ Pre prepare(int row) const {
            Pre pre{0, 0.0, 0.0};
            if (row < 0) return pre;
            pre.at = p.pos_ptr ? *p.pos_ptr : p.start_pos;
            const int d = row % p.head_dim;
            if (m < 2 && d < p.n_rot)
                rope_angle(d >> 1, (double)pre.at * (double)p.freq_scale, p.n_rot, p.inv_freq_table, p.freq_base,
                           p.mscale, &pre.cs, &pre.sn);
            return pre;
        }
        __device__ __forceinline__ void operator()(int row, float s, const Pre& pre) const {
            const float other = __shfl_xor_sync(0xffffffffu, s, 1);
            if (row < 0) return;
            const int d = row % p.head_dim;
            float y = s;
            if (m < 2 && d < p.n_rot) {
                const bool first = (d & 1) == 0;
                float y0, y1;
                rope_apply(first ? s : other, first ? other : s, pre.cs, pre.sn, &y0, &y1);
                y = first ? y0 : y1;
            }
            p.out[m][row] = y;
            if (m > 0 && pre.at < p.capacity) {
                u16* cache = m == 1 ? p.k_cache : p.v_cache;
                cache[((i64)(row / p.head_dim) * p.capacity + pre.at) * p.head_dim + d] = f32_to_f16(y);
            }
        }
    };
    __device__ __forceinline__ Epi at(int m) const { return Epi{*this, m}; }
};

// n <= NX rows of x: R weight rows a block, MV8_THREADS / R threads a row
// (out is [n][rows]). Summation order is fixed (a thread's units in order,
// then a butterfly, then warps in order), and the same for every row of x
// whatever n is.
template <int T, int R, int NX>
__device__ __forceinline__ void mv8_rows(const u8* __restrict__ W, i64 row_bytes, int rows, int cols, int n,
                                         const X8& x, const float* __restrict__ bias, float* __restrict__ out) {
    constexpr int TPR = MV8_THREADS / R;
    static_assert(TPR % 32 == 0 && MV8_THREADS % 32 == 0, "whole warps per row");
    __shared__ float red[NX][MV8_THREADS / 32];
    const int r = blockIdx.x * R + threadIdx.x / TPR, t = threadIdx.x % TPR;
    const int units = cols / 32;
    float acc[NX];
#pragma unroll
    for (int i = 0; i < NX; i++) acc[i] = 0.0f;
    const u8* row = W + (i64)r * row_bytes;
    Mv8Unit<T> w;
    // The first unit's weights before the wait, as in mv8_one.
    if (mv8_early(T) && r < rows && t < units) w.load(row, t);
    pdl_wait();
    if (r < rows) {
        for (int u = t; u < units; u += TPR) {
            if (!mv8_early(T) || u != t) w.load(row, u);
#pragma unroll
            for (int i = 0; i < NX; i++) {
                if (i >= n) break;
                const X8Unit xu = x8_unit(x.row(i, cols), Mv8Unit<T>::col0(u), Mv8Unit<T>::col1(u));
                acc[i] += w.dot(u, xu);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < NX; i++) {
        const float s = warp_sum(acc[i]);
        if ((threadIdx.x & 31) == 0) red[i][threadIdx.x >> 5] = s;
    }
    __syncthreads();
    constexpr int WPR = TPR / 32;
    for (int k = threadIdx.x; k < R * n; k += MV8_THREADS) {
        const int j = k % R, i = k / R, rj = blockIdx.x * R + j;
        if (rj >= rows) continue;
        float s = 0.0f;
        for (int w = 0; w < WPR; w++) s += red[i][j * WPR + w];
        out[(i64)i * rows + rj] = bias ? s + bias[rj] : s;
    }
}

#define DEF_MV8(name, T)                                                                                 \
    extern "C" __global__ void __launch_bounds__(MV8_THREADS)                                            \
        mv8_##name(const u8* W, i64 row_bytes, int rows, int cols, const i8* xh, const i8* xl,           \
                   const float* xd, const float* xs, const float* bias, float* out) {                    \
        pdl_launch_next(); /* mv8_one and mv8_rows wait after their first loads */                      \
        mv8_one<T, MV8_ROWS>(blockIdx.x, W, row_bytes, rows, cols, X8{xh, xl, xd, xs}, bias, Mv8Store{out}); \
    }                                                                                                    \
    extern "C" __global__ void __launch_bounds__(MV8_THREADS)                                            \
        mv8m_##name(const u8* W0, const u8* W1, const u8* W2, i64 row_bytes, int rows0, int rows1,       \
                    int rows2, int cols, const i8* xh, const i8* xl, const float* xd, const float* xs,   \
                    const float* b0, const float* b1, const float* b2, float* o0, float* o1, float* o2) { \
        pdl_launch_next(); /* mv8_many waits in mv8_one */                                              \
        const u8* const W[3] = {W0, W1, W2};                                                             \
        const int rows[3] = {rows0, rows1, rows2};                                                       \
        const float* const bias[3] = {b0, b1, b2};                                                       \
        float* const out[3] = {o0, o1, o2};                                                              \
        mv8_many<T, MV8_ROWS>(W, row_bytes, rows, cols, X8{xh, xl, xd, xs}, bias, Mv8Stores{out});       \
    }                                                                                                    \
    extern "C" __global__ void __launch_bounds__(MV8_THREADS)                                            \
        mv8q_##name(const u8* W0, const u8* W1, const u8* W2, i64 row_bytes, int rows0, int rows1,       \
                    int rows2, int cols, const i8* xh, const i8* xl, const float* xd, const float* xs,   \
                    const float* b0, const float* b1, const float* b2, float* o0, float* o1, float* o2,  \
                    int head_dim, int n_rot, const double* inv_freq_table, float freq_base,              \
                    float freq_scale, float mscale, int start_pos, const int* pos_ptr, int capacity,     \
                    u16* k_cache, u16* v_cache) {                                                        \
        pdl_launch_next(); /* mv8_many waits in mv8_one */                                              \
        const u8* const W[3] = {W0, W1, W2};                                                             \
        const int rows[3] = {rows0, rows1, rows2};                                                       \
        const float* const bias[3] = {b0, b1, b2};                                                       \
        float* const out[3] = {o0, o1, o2};                                                              \
        const QkvRope e{out,       head_dim,  n_rot,    inv_freq_table, freq_base, freq_scale,           \
                        mscale,    start_pos, pos_ptr,  capacity,       k_cache,   v_cache};             \
        mv8_many<T, MV8_ROWS>(W, row_bytes, rows, cols, X8{xh, xl, xd, xs}, bias, e);                    \
    }                                                                                                    \
    extern "C" __global__ void __launch_bounds__(MV8_THREADS)                                            \
        mv8n_##name(const u8* W, i64 row_bytes, int rows, int cols, int n, const i8* xh, const i8* xl,   \
                    const float* xd, const float* xs, const float* bias, float* out) {                   \
        pdl_launch_next(); /* mv8_one and mv8_rows wait after their first loads */                      \
        const int g0 = blockIdx.y * MV8_MAX_TOKENS; /* this block's group of rows of x */               \
        mv8_rows<T, MV8N_ROWS, MV8_MAX_TOKENS>(W, row_bytes, rows, cols, min(MV8_MAX_TOKENS, n - g0),    \
                                               X8{xh, xl, xd, xs}.row(g0, cols), bias,                   \
                                               out + (i64)g0 * rows);                                    \
    }

// The formats with a unit above, among those this module is compiled for.
#if !defined(ONE_PART) || ONE_PART == 0
#if !defined(ONE_FORMAT_ID) || ONE_FORMAT_ID == T_Q4_K
DEF_MV8(q4_k, T_Q4_K)
#endif
#if !defined(ONE_FORMAT_ID) || ONE_FORMAT_ID == T_Q4_0
DEF_MV8(q4_0, T_Q4_0)
#endif
#if !defined(ONE_FORMAT_ID) || ONE_FORMAT_ID == T_Q4_1
DEF_MV8(q4_1, T_Q4_1)
#endif
#if !defined(ONE_FORMAT_ID) || ONE_FORMAT_ID == T_Q5_0
DEF_MV8(q5_0, T_Q5_0)
#endif
#if !defined(ONE_FORMAT_ID) || ONE_FORMAT_ID == T_Q8_0
DEF_MV8(q8_0, T_Q8_0)
#endif
#if !defined(ONE_FORMAT_ID) || ONE_FORMAT_ID == T_Q6_K
DEF_MV8(q6_k, T_Q6_K)
#endif
#endif  // part 0

// `mv8e_<type>`: mv8 over the experts a router chose, the grid laid out as
// mv1e_*'s (row y: slot s, expert ids[s]; z = 1: the second matrix, its
// bias and output): x's row s / x_div from its parts as `quantize_x8` (or
// swiglu_oai) split them. The expert id is moe_route's output, so the
// kernel waits for the kernel ahead before its first load. Part 2 of the
// module, with mv1e_*: compiled only for the formats a model stores
// experts in.
#define DEF_MV8E(name, T)                                                                                \
    extern "C" __global__ void __launch_bounds__(MV8_THREADS)                                            \
        mv8e_##name(const u8* W, i64 row_bytes, int rows, int cols, int experts, const int* ids,         \
                    int x_div, const i8* xh, const i8* xl, const float* xd, const float* xs,             \
                    const float* bias, float* out, const u8* W2, const float* bias2, float* out2) {      \
        pdl_start();                                                                                     \
        const int s = blockIdx.y, e = block_expert(ids, experts, W, bias, out, W2, bias2, out2);        \
        if (e < 0) return;                                                                               \
        mv8_one<T, MV8_ROWS>(blockIdx.x, W + (i64)e * rows * row_bytes, row_bytes, rows, cols,          \
                             X8{xh, xl, xd, xs}.row(s / x_div, cols), bias ? bias + (i64)e * rows : nullptr, \
                             Mv8Store{out + (i64)s * rows});                                             \
    }
#if !defined(ONE_PART) || ONE_PART == 2
#if !defined(ONE_FORMAT_ID) || ONE_FORMAT_ID == T_MXFP4
DEF_MV8E(mxfp4, T_MXFP4)
#endif
#if !defined(ONE_FORMAT_ID) || ONE_FORMAT_ID == T_Q4_K
DEF_MV8E(q4_k, T_Q4_K)
#endif
#if !defined(ONE_FORMAT_ID) || ONE_FORMAT_ID == T_Q4_0
DEF_MV8E(q4_0, T_Q4_0)
#endif
#if !defined(ONE_FORMAT_ID) || ONE_FORMAT_ID == T_Q4_1
DEF_MV8E(q4_1, T_Q4_1)
#endif
#if !defined(ONE_FORMAT_ID) || ONE_FORMAT_ID == T_Q5_0
DEF_MV8E(q5_0, T_Q5_0)
#endif
#if !defined(ONE_FORMAT_ID) || ONE_FORMAT_ID == T_Q8_0
DEF_MV8E(q8_0, T_Q8_0)
#endif
#if !defined(ONE_FORMAT_ID) || ONE_FORMAT_ID == T_Q6_K
DEF_MV8E(q6_k, T_Q6_K)
#endif
#endif  // part 2
