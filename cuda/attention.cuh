// attention.cuh: what the attention modules share (attention.cu: the KV
// cache and one block per query row and head; attention_split.cu: decode
// over a context split across blocks; attention_tc.cu: prefill on tensor
// cores). They are three modules so that they compile in parallel, and the
// last two for the model's head size only (-DONE_HEAD_PAIRS).
//
// Cache layout, per layer and per K or V: each KV head's part, its rows
// 0..capacity-1 of head_dim values (common.cuh: f16, or a block format's
// levels and scales, -DKV_TYPE). Strides use the capacity, never the filled
// length; kernels read rows through kv_head / kv_load*.
#pragma once
#include "common.cuh"

// The first cached position a query at `pos` sees: 0, or with a sliding
// window of swa > 0 positions (itself included) pos + 1 - swa.
__device__ __forceinline__ int first_visible(int pos, int swa) { return swa > 0 ? max(0, pos + 1 - swa) : 0; }

// Shared with the host's launch geometry: defined once in the worker
// (backend/cuda/source.rs) and passed to NVRTC as -D options.
#if !defined(ATT_THREADS) || !defined(ATT_MAX_HEAD_DIM)
#error "ATT_THREADS and ATT_MAX_HEAD_DIM come from the worker as -D options"
#endif
static_assert(ATT_THREADS % 32 == 0 && ATT_MAX_HEAD_DIM % 64 == 0, "whole warps, and whole dim pairs per lane");
#define ATT_WARPS (ATT_THREADS / 32)
#define ATT_PAIRS_PER_LANE (ATT_MAX_HEAD_DIM / 64)
