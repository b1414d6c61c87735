// dequant.cuh: decoding of every stored weight format, eight values at a time.
//
// Layouts follow ggml (ggml-common.h, ggml-quants.c) and the worker's CPU
// decoder (worker/src/quant/blocks.rs), which is the oracle:
//   F32, F16, BF16            plain values
//   Q4_0  {f16 d; u8 qs[16]}                     18 B / 32 values: d*(q-8)
//   Q4_1  {f16 d, m; u8 qs[16]}                  20 B / 32 values: d*q + m
//   Q5_0  {f16 d; u8 qh[4]; u8 qs[16]}           22 B / 32 values: d*(q-16)
//   Q5_1  {f16 d, m; u8 qh[4]; u8 qs[16]}        24 B / 32 values: d*q + m
//   Q8_0  {f16 d; i8 qs[32]}                     34 B / 32 values: d*q
//   MXFP4 {u8 e; u8 qs[16]}                      17 B / 32 values: kv[q]*2^(e-128)
//   Q4_K  {f16 d, dmin; u8 scales[12]; u8 qs[128]}            144 B / 256
//   Q5_K  {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]} 176 B / 256
//   Q6_K  {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}       210 B / 256
// In the 32-value formats, value j < 16 is the low nibble of qs[j] and value
// j + 16 its high nibble (the fifth bit of value j is bit j of qh).
//
// A row is split into "chunks" of 8 consecutive values; deq8<T>(row, c, cols, v)
// writes values 8c..8c+7 of the row to v. Chunks never straddle a block.
// Products are written with __fmul_rn so that they are rounded as the CPU
// rounds them (no fused multiply-add), which makes decoding bit-exact.
//
// Template ids are ggml's type ids.

#pragma once

#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q5_1 7
#define T_Q8_0 8
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14
#define T_BF16 30
#define T_MXFP4 39

// X-macro over the formats a module is compiled for: X(symbol suffix,
// template id). The worker compiles its per-format modules once per format
// the model uses, naming it with -DONE_FORMAT_NAME=q4_k -DONE_FORMAT_ID=T_Q4_K
// (a fraction of the compile time of all twelve); without them, every format.
// FOR_EACH_INT_TYPE: the formats of small integers q under a scale (and a
// min), whose GEMM decodes tiles into f16 (gemm.cu, gemm_tck_*; the
// worker's `integer_gemm`); FOR_EACH_FLOAT_TYPE: the others (their values
// are floats, MXFP4's four-bit E2M1 ones too).
#define INT_FORMAT_ID(id)                                                                              \
    ((id) == T_Q4_0 || (id) == T_Q4_1 || (id) == T_Q5_0 || (id) == T_Q5_1 || (id) == T_Q8_0 ||       \
     (id) == T_Q4_K || (id) == T_Q5_K || (id) == T_Q6_K)
#if defined(ONE_FORMAT_NAME) && defined(ONE_FORMAT_ID)
// The extra step expands the two names before X pastes them into symbols.
#define FOR_ONE_TYPE(X, name, id) X(name, id)
#define FOR_EACH_TYPE(X) FOR_ONE_TYPE(X, ONE_FORMAT_NAME, ONE_FORMAT_ID)
#if INT_FORMAT_ID(ONE_FORMAT_ID)
#define FOR_EACH_INT_TYPE(X) FOR_EACH_TYPE(X)
#define FOR_EACH_FLOAT_TYPE(X)
#else
#define FOR_EACH_INT_TYPE(X)
#define FOR_EACH_FLOAT_TYPE(X) FOR_EACH_TYPE(X)
#endif
#else
#define FOR_EACH_FLOAT_TYPE(X) X(f32, T_F32) X(f16, T_F16) X(bf16, T_BF16) X(mxfp4, T_MXFP4)
#define FOR_EACH_INT_TYPE(X) \
    X(q4_0, T_Q4_0) X(q4_1, T_Q4_1) X(q5_0, T_Q5_0) X(q5_1, T_Q5_1) X(q8_0, T_Q8_0) \
    X(q4_k, T_Q4_K) X(q5_k, T_Q5_K) X(q6_k, T_Q6_K)
#define FOR_EACH_TYPE(X) FOR_EACH_FLOAT_TYPE(X) FOR_EACH_INT_TYPE(X)
#endif
// FOR_EACH_F16_TILE_TYPE: the formats whose blocks decode into f16 tiles
// (gemm.cu's decode_f16): the integer ones and MXFP4 (experts' GEMM).
#if defined(ONE_FORMAT_NAME) && defined(ONE_FORMAT_ID)
#if INT_FORMAT_ID(ONE_FORMAT_ID) || ONE_FORMAT_ID == T_MXFP4
#define FOR_EACH_F16_TILE_TYPE(X) FOR_EACH_TYPE(X)
#else
#define FOR_EACH_F16_TILE_TYPE(X)
#endif
#else
#define FOR_EACH_F16_TILE_TYPE(X) FOR_EACH_INT_TYPE(X) X(mxfp4, T_MXFP4)
#endif

// A small integer (|q| < 2^22) to float without an I2F instruction, which
// runs at a quarter of the FP32 rate on sm_80/sm_90 and limited the
// mat-vec kernels: 1.5 * 2^23 + q has q in its low mantissa bits, and the
// subtraction is exact, so the result is bit-identical to (float)q.
__device__ __forceinline__ float i2f(int q) {
    return __int_as_float(0x4B400000 + q) - 12582912.0f;
}

__device__ __forceinline__ void k_scale_min(const u8* q, int j, float d, float dmin, float* sc, float* mn) {
    int s, m;
    if (j < 4) {
        s = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        s = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
    *sc = __fmul_rn(d, i2f(s));
    *mn = __fmul_rn(dmin, i2f(m));
}

// Twice an MXFP4 code's E2M1 value (0, 1, 2, 3, 4, 6, 8, 12 and their
// negatives), from a byte permute of the eight magnitudes held in two words:
// a lookup in registers. (A __constant__ table indexed by the code
// serialises a warp's differing codes: benches/results/kernel-choices.md.)
__device__ __forceinline__ float mxfp4_doubled(u32 code) {
    const int m = (int)(__byte_perm(0x03020100u, 0x0C080604u, code & 7u) & 0xFFu);
    return i2f((code & 8u) ? -m : m);  // +0 for code 8, as the table has it
}

__device__ __forceinline__ float e8m0_half(u8 e) {
    return e < 2 ? __uint_as_float(0x00200000u << e) : __uint_as_float(((u32)e - 1u) << 23);
}

// Eight bytes at p as two little-endian words, loaded with the widest access
// the format's layout guarantees (A = the alignment of p in bytes, given
// 256-byte aligned tensors and whole-block rows).
template <int A>
__device__ __forceinline__ void ld8(const u8* p, u32& lo, u32& hi) {
    if (A >= 8) {
        const uint2 v = *(const uint2*)p;
        lo = v.x;
        hi = v.y;
    } else if (A >= 4) {
        lo = *(const u32*)p;
        hi = *(const u32*)(p + 4);
    } else if (A >= 2) {
        const u16* q = (const u16*)p;
        lo = (u32)q[0] | ((u32)q[1] << 16);
        hi = (u32)q[2] | ((u32)q[3] << 16);
    } else {
        lo = ld_u32(p);
        hi = ld_u32(p + 4);
    }
}

// N little-endian words from a 2-byte aligned p, from the 16-byte aligned
// chunks that hold them (2 loads for N = 4, 3 for N = 8; a warp's narrow
// loads of consecutive 2-byte aligned blocks cost the load units several
// times the bytes), shifted into place by whole words (two selects) and
// half words (a funnel shift). Reads up to 16 bytes past p + 4N: weights
// only, whose device blocks have that tail (WEIGHT_TAIL_BYTES, ops.rs).
// 16 bytes of weights, marked to leave L2 first: a decode step streams
// gigabytes of weights through L2, which would otherwise evict the small
// data every kernel rereads (the residual row, norm weights, the KV cache,
// the kernels' code).
__device__ __forceinline__ uint4 ld_weights16(const void* p) {
    uint4 v;
    asm("{\n\t.reg .b64 pol;\n\tcreatepolicy.fractional.L2::evict_first.b64 pol, 1.0;\n\t"
        "ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], pol;\n\t}"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// STREAM: the loads marked with ld_weights16's policy (decode's mat-vecs
// only: it slowed the prefill GEMMs, which are bound by instruction issue;
// benches/results/kernel-choices.md).
template <int N, bool STREAM = false>
__device__ __forceinline__ void ld_a16(const u8* p, u32* w) {
    constexpr int C = (4 * N + 14) / 16 + 1;
    const uint4* a = (const uint4*)((u64)p & ~(u64)15);
    const int off = (int)((u64)p & 15), sh = (off & 3) * 8;  // any byte alignment
    u32 x[4 * C];
#pragma unroll
    for (int c = 0; c < C; c++) {
        const uint4 v = STREAM ? ld_weights16(a + c) : a[c];
        x[4 * c] = v.x;
        x[4 * c + 1] = v.y;
        x[4 * c + 2] = v.z;
        x[4 * c + 3] = v.w;
    }
    u32 v[N + 2], u[N + 1];
#pragma unroll
    for (int j = 0; j < N + 2; j++) v[j] = (off & 8) ? x[j + 2] : x[j];
#pragma unroll
    for (int j = 0; j < N + 1; j++) u[j] = (off & 4) ? v[j + 1] : v[j];
#pragma unroll
    for (int i = 0; i < N; i++) w[i] = __funnelshift_r(u[i], u[i + 1], sh);
}

// N little-endian words from p, which is A-byte aligned (A = 2, 4 or 16):
// aligned loads, funnel-shifted when p is only 2-byte aligned. Four words
// from a 2-byte aligned p come from whole 16-byte chunks and may read up to
// 16 bytes past p + 16 (weights only: their blocks have that tail); else no
// byte past p + 4N is read (the last half word is read as such), so a block
// at the very end of an allocation is safe (compute-sanitizer, M0-W-1431).
template <int N, int A>
__device__ __forceinline__ void ld_words(const u8* p, u32* w) {
    if (A >= 16 && N == 4) {
        const uint4 v = *(const uint4*)p;
        w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
    } else if (A >= 4) {
#pragma unroll
        for (int i = 0; i < N; i++) w[i] = ((const u32*)p)[i];
    } else if (N == 4) {
        ld_a16<4>(p, w);  // two loads where five were
    } else {
        const u32* q = (const u32*)((u64)p & ~(u64)3);
        const u32 sh = ((u32)(u64)p & 3) * 8;  // 0 or 16
        u32 prev = q[0];
#pragma unroll
        for (int i = 0; i + 1 < N; i++) {
            const u32 next = q[i + 1];
            w[i] = __funnelshift_r(prev, next, sh);
            prev = next;
        }
        const u32 tail = sh ? (u32) * (const u16*)(q + N) : 0u;
        w[N - 1] = __funnelshift_r(prev, tail, sh);
    }
}

__device__ __forceinline__ u32 byte_of(u32 lo, u32 hi, int i) {
    return ((i < 4 ? lo : hi) >> (8 * (i & 3))) & 0xFFu;
}

template <int T>
__device__ __forceinline__ void deq8(const u8* __restrict__ row, int c, int cols, float* v) {
    if (T == T_F32) {
        const float* p = (const float*)row + 8 * c;
        int left = cols - 8 * c;
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = i < left ? p[i] : 0.0f;
    } else if (T == T_F16 || T == T_BF16) {
        const u16* p = (const u16*)row + 8 * c;
        int left = cols - 8 * c;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u16 h = i < left ? p[i] : (u16)0;
            v[i] = T == T_F16 ? f16_to_f32(h) : bf16_to_f32(h);
        }
    } else if (T == T_Q4_0 || T == T_Q4_1 || T == T_Q5_0 || T == T_Q5_1 || T == T_Q8_0 || T == T_MXFP4) {
        const int bytes = T == T_Q4_0 ? 18 : T == T_Q4_1 ? 20 : T == T_Q5_0 ? 22 : T == T_Q5_1 ? 24 : T == T_Q8_0 ? 34 : 17;
        const u8* b = row + (c >> 2) * bytes;
        const int p = c & 3;  // values 8p..8p+7 of the block
        u32 lo, hi;
        if (T == T_Q8_0) {
            const float d = f16_to_f32(*(const u16*)b);
            ld8<2>(b + 2 + 8 * p, lo, hi);
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = __fmul_rn(d, i2f((i8)byte_of(lo, hi, i)));
        } else {
            // Nibble source: qs[8(p&1) + i], low nibble for p < 2, high for p >= 2.
            const int qs_off = T == T_Q4_0 ? 2 : T == T_Q4_1 ? 4 : T == T_Q5_0 ? 6 : T == T_Q5_1 ? 8 : 1;
            const u8* qs = b + qs_off + 8 * (p & 1);
            if (T == T_Q4_0 || T == T_Q5_0) ld8<2>(qs, lo, hi);
            else if (T == T_Q4_1) ld8<4>(qs, lo, hi);
            else if (T == T_Q5_1) ld8<8>(qs, lo, hi);
            else ld8<1>(qs, lo, hi);
            const int sh = (p >> 1) * 4;
            if (T == T_Q4_0) {
                const float d = f16_to_f32(*(const u16*)b);
#pragma unroll
                for (int i = 0; i < 8; i++) v[i] = __fmul_rn(d, i2f((int)((byte_of(lo, hi, i) >> sh) & 0xF) - 8));
            } else if (T == T_Q4_1) {
                const float d = f16_to_f32(*(const u16*)b), m = f16_to_f32(*(const u16*)(b + 2));
#pragma unroll
                for (int i = 0; i < 8; i++) v[i] = __fadd_rn(__fmul_rn(d, i2f((byte_of(lo, hi, i) >> sh) & 0xF)), m);
            } else if (T == T_Q5_0 || T == T_Q5_1) {
                const u32 qh = T == T_Q5_0 ? ((u32)((const u16*)(b + 2))[0] | ((u32)((const u16*)(b + 2))[1] << 16))
                                           : *(const u32*)(b + 4);
                const int j0 = 8 * p;  // value index in the block
                const float d = f16_to_f32(*(const u16*)b);
                const float m = T == T_Q5_1 ? f16_to_f32(*(const u16*)(b + 2)) : 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const int q = ((byte_of(lo, hi, i) >> sh) & 0xF) | (((qh >> (j0 + i)) & 1) << 4);
                    v[i] = T == T_Q5_0 ? __fmul_rn(d, i2f(q - 16)) : __fadd_rn(__fmul_rn(d, i2f(q)), m);
                }
            } else {  // MXFP4
                const float d = e8m0_half(b[0]);
#pragma unroll
                for (int i = 0; i < 8; i++) v[i] = __fmul_rn(mxfp4_doubled((byte_of(lo, hi, i) >> sh) & 0xF), d);
            }
        }
    } else if (T == T_Q4_K || T == T_Q5_K) {
        const int bytes = T == T_Q4_K ? 144 : 176;
        const u8* b = row + (c >> 5) * bytes;
        const int o = 8 * (c & 31);           // first value in the block, 0..248
        const int k = o >> 6;                 // 64-value group
        const int hi = (o >> 5) & 1;          // high nibbles: second sub-block of the group
        const int l0 = o & 31;
        const float d = f16_to_f32(*(const u16*)b), dmin = f16_to_f32(*(const u16*)(b + 2));
        float sc, mn;
        k_scale_min(b + 4, 2 * k + hi, d, dmin, &sc, &mn);
        u32 lo, hw, qhl = 0, qhh = 0;
        ld8<8>(b + (T == T_Q4_K ? 16 : 48) + 32 * k + l0, lo, hw);
        if (T == T_Q5_K) ld8<8>(b + 16 + l0, qhl, qhh);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int q = (byte_of(lo, hw, i) >> (4 * hi)) & 0xF;
            if (T == T_Q5_K) q |= ((byte_of(qhl, qhh, i) >> (2 * k + hi)) & 1) << 4;
            v[i] = __fsub_rn(__fmul_rn(sc, i2f(q)), mn);
        }
    } else if (T == T_Q6_K) {
        const u8* b = row + (c >> 5) * 210;
        const int o = 8 * (c & 31);
        const int n = o >> 7, r = o & 127, quarter = r >> 5, l0 = r & 31;
        const float d = f16_to_f32(*(const u16*)(b + 208));
        const float ds = __fmul_rn(d, i2f(((const i8*)(b + 192))[o >> 4]));
        u32 ll, lh, hl, hh;
        ld8<2>(b + 64 * n + l0 + (quarter & 1) * 32, ll, lh);
        ld8<2>(b + 128 + 32 * n + l0, hl, hh);
        const int sh = (quarter >> 1) * 4;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int q = ((byte_of(ll, lh, i) >> sh) & 0xF) | (((byte_of(hl, hh, i) >> (2 * quarter)) & 3) << 4);
            v[i] = __fmul_rn(ds, i2f(q - 32));
        }
    }
}
