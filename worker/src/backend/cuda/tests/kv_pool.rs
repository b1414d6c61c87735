//! The paged KV pool (`kv_pool.rs`): pages leased, mapped and given back,
//! and a backend's slots on it computing what a cache of its own computes.

use super::*;
use cudarc::driver::result as drv;

use crate::backend::cuda::kv_pool::KvPool;
use crate::model::synthetic::synthetic_model;

fn fill(ptr: u64, bytes: u64, value: u8) {
    let d = dev();
    // SAFETY: the range is a mapped lease of at least `bytes` bytes.
    unsafe { drv::memset_d8_async(ptr, value, bytes as usize, d.cu_stream()) }.unwrap();
}

fn read(ptr: u64, bytes: u64) -> Vec<u8> {
    let d = dev();
    let mut out = vec![0u8; bytes as usize];
    // SAFETY: the range is a mapped lease of at least `bytes` bytes.
    unsafe { drv::memcpy_dtoh_async(&mut out, ptr, d.cu_stream()) }.unwrap();
    d.synchronize().unwrap();
    out
}

/// `file` on the GPU with `--kv-cache-size-mb mb` and `slots` slots.
fn backend(file: &Arc<GgufFile>, mb: Option<u64>, slots: usize) -> CudaBackend {
    let cfg = ModelConfig::try_from(&file.metadata).unwrap();
    let opts = CudaLoadOptions {
        kv_cache_size_mb: mb,
        ..Default::default()
    };
    let mut b = CudaBackend::load(cfg, file, &opts, &mut |_| {}).unwrap();
    b.set_max_sequences(slots).unwrap();
    b
}

/// Leases take the lowest free pages, fail without enough, and give their
/// pages back on drop; a lease on pages that are not consecutive is still
/// one contiguous range, and writing it leaves the other leases' bytes alone.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn pool_leases_map_pages_contiguously_and_give_them_back() {
    let _gpu = shared_gpu();
    let d = dev();
    d.bind().unwrap();
    let before = d.memory_use().kv_cache;
    let page = KvPool::block_bytes(&d, 1).unwrap();
    assert!(
        KvPool::new(&d, page, page + 1).is_err(),
        "blocks are whole pages"
    );
    let pool = KvPool::new(&d, 6 * page, page).unwrap();
    assert_eq!(d.memory_use().kv_cache, before + 6 * page);
    let blocks = pool.blocks();
    assert_eq!(
        (blocks.total, blocks.used, blocks.block_bytes),
        (6, 0, page)
    );

    let a = pool.lease(page + 1).unwrap(); // pages 0, 1
    let b = pool.lease(page).unwrap(); // page 2
    let c = pool.lease(1).unwrap(); // page 3
    assert_eq!(pool.blocks().used, 4);
    assert_eq!((a.bytes(), b.bytes(), c.bytes()), (2 * page, page, page));
    assert!(pool.has_room(2 * page) && !pool.has_room(2 * page + 1));
    match pool.lease(3 * page) {
        Err(BackendError::OutOfMemory { needed, available }) => {
            assert_eq!((needed, available), (3 * page, 2 * page))
        }
        other => panic!(
            "a lease beyond the free pages: {:?}",
            other.map(|l| l.bytes())
        ),
    }
    fill(a.ptr(), a.bytes(), 0xa1);
    fill(c.ptr(), c.bytes(), 0xc3);
    drop(b);
    assert_eq!(pool.blocks().used, 3);

    // Pages 2, 4 and 5: two runs, one range.
    let e = pool.lease(3 * page).unwrap();
    assert_eq!(pool.blocks().used, 6);
    assert!(!pool.has_room(1));
    let pattern: Vec<u8> = (0..e.bytes()).map(|i| (i % 251) as u8).collect();
    // SAFETY: `e` maps `pattern.len()` bytes.
    unsafe { drv::memcpy_htod_async(e.ptr(), &pattern, d.cu_stream()) }.unwrap();
    assert!(
        read(e.ptr(), e.bytes()) == pattern,
        "a lease reads back what was written"
    );
    assert!(read(a.ptr(), a.bytes()).iter().all(|&x| x == 0xa1));
    assert!(read(c.ptr(), c.bytes()).iter().all(|&x| x == 0xc3));

    drop((a, c, e));
    assert_eq!(pool.blocks().used, 0);
    drop(pool);
    assert_eq!(d.memory_use().kv_cache, before);
}

/// A backend with several slots takes their caches from its pool: blocks
/// counted per sequence, `has_room` by free blocks (not only by bytes), all
/// back when the sequences end; and a sequence on pages that are not
/// consecutive gives the same logits, bit for bit, as one on a cache of its
/// own in a one-slot backend.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn slots_share_the_pool_and_compute_as_a_cache_of_their_own() {
    let _gpu = shared_gpu();
    let file = Arc::new(GgufFile::from_bytes(synthetic_model("llama", 31, 4096)).unwrap());
    let cfg = ModelConfig::try_from(&file.metadata).unwrap();
    let mut alone = backend(&file, None, 1);
    assert_eq!(alone.kv_blocks(), None, "one slot: no pool");
    let mut shared = backend(&file, Some(6), 3);
    let blocks = shared.kv_blocks().expect("a pool with three slots");
    let page = blocks.block_bytes;
    assert_eq!(blocks.total as u64, (6u64 << 20).div_ceil(page));
    assert_eq!(blocks.used, 0);
    let per_pos = CudaCache::bytes_for(cfg.n_layer, cfg.n_head_kv, cfg.head_dim, 1);
    // A capacity of just over one page, and a small one.
    let big = (page / per_pos) as usize + 4;
    assert!(big <= cfg.context_length, "the test needs {big} positions");
    let first = shared.open(100).unwrap();
    let second = shared.open(100).unwrap();
    assert_eq!(shared.kv_blocks().unwrap().used, 2);
    let free = blocks.total - 2;
    assert_eq!(
        shared.has_room(big),
        free >= 2,
        "{free} blocks free for a cache of two"
    );
    shared.close(first);
    assert_eq!(shared.kv_blocks().unwrap().used, 1);

    // A sequence again, on the first page and the pages after the second's.
    let pooled = shared.open(big).unwrap();
    let own = alone.open(big).unwrap();
    assert_eq!(shared.kv_blocks().unwrap().used, 3);
    let vocab = cfg.vocab_size as u32;
    let prompt: Vec<u32> = (0..60).map(|i| (i * 13 + 5) % vocab).collect();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    alone
        .forward(own, &prompt, Logits::Last, &mut a, None)
        .unwrap();
    shared
        .forward(pooled, &prompt, Logits::Last, &mut b, None)
        .unwrap();
    assert!(
        a == b,
        "prompt logits differ between a pooled cache and its own"
    );
    for step in 0..24u32 {
        let token = (step * 29 + 1) % vocab;
        alone
            .forward(own, &[token], Logits::Last, &mut a, None)
            .unwrap();
        shared
            .forward(pooled, &[token], Logits::Last, &mut b, None)
            .unwrap();
        assert!(
            a == b,
            "step {step}: logits differ between a pooled cache and its own"
        );
    }
    shared.close(pooled);
    shared.close(second);
    assert_eq!(shared.kv_blocks().unwrap().used, 0);
    assert!(shared.has_room(big));
}

/// Warming up leaves nothing behind that a job could see: no sequence open,
/// the KV cache's bytes (or the pool's blocks) back, and a job's logits the
/// same bits as on a backend that did not warm up; with a KV budget and
/// with a pool as well.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn warm_up_leaves_no_trace_a_job_can_see() {
    let _gpu = shared_gpu();
    let file = Arc::new(GgufFile::from_bytes(synthetic_model("llama", 33, 4096)).unwrap());
    let cfg = ModelConfig::try_from(&file.metadata).unwrap();
    let vocab = cfg.vocab_size as u32;
    let prompt: Vec<u32> = (0..40).map(|i| (i * 11 + 3) % vocab).collect();
    let job = |b: &mut CudaBackend| {
        let mut out = Vec::new();
        let mut all = Vec::new();
        let seq = b.open(64).unwrap();
        b.forward(seq, &prompt, Logits::Last, &mut out, None)
            .unwrap();
        all.extend_from_slice(&out);
        for t in 0..8u32 {
            b.forward(seq, &[t * 5 % vocab], Logits::Last, &mut out, None)
                .unwrap();
            all.extend_from_slice(&out);
        }
        b.close(seq);
        all
    };
    let mut cold = backend(&file, None, 1);
    let want = job(&mut cold);
    drop(cold);
    // (mb, slots): no budget; a budget of 1 MB (1,024 positions here); a
    // pool of three slots.
    for (mb, slots) in [(None, 1), (Some(1), 1), (None, 3)] {
        let mut warm = backend(&file, mb, slots);
        warm.warm_up().unwrap();
        assert!(!warm.seqs.any_open(), "{mb:?} {slots}: no sequence open");
        assert_eq!(warm.kv_blocks().map(|b| b.used), (slots > 1).then_some(0));
        if slots == 1 {
            assert_eq!(warm.memory_use().kv_cache, 0, "{mb:?}");
        }
        assert!(
            job(&mut warm) == want,
            "{mb:?} {slots}: a job after warming up differs"
        );
    }
}

/// Issue 45: a context whose KV cache cannot fit beside the weights is
/// refused when the slots are set (at start, before `ready`), naming the
/// bytes one full context needs; under `--kv-cache-size-mb` the budget
/// decides instead, and a context that fits loads.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn a_context_larger_than_the_free_memory_is_refused_at_start() {
    let _gpu = shared_gpu();
    // 2 layers x K and V x 2 heads of 64 in f16: 1,024 bytes a position,
    // so 2^24 positions (the most a file may state) want 16 GiB: more than
    // a device capped at 4 GiB has.
    let huge = 1u32 << 24;
    let file = Arc::new(GgufFile::from_bytes(synthetic_model("llama", 5, huge)).unwrap());
    let cfg = ModelConfig::try_from(&file.metadata).unwrap();
    assert_eq!(cfg.context_length, huge as usize);
    let opts = CudaLoadOptions {
        vram_cap_bytes: Some(4 << 30),
        ..CudaLoadOptions::default()
    };
    let mut b = CudaBackend::load(cfg, &file, &opts, &mut |_| {}).unwrap();
    for slots in [1, 4] {
        match b.set_max_sequences(slots) {
            Err(BackendError::OutOfMemory { needed, available }) => {
                assert_eq!(needed, 1024 * u64::from(huge), "{slots} slots");
                assert!(available < needed);
            }
            other => panic!("{slots} slots: expected OutOfMemory, got {:?}", other.err()),
        }
    }
    let limited = backend(&file, Some(64), 2);
    drop(limited);
    let small = Arc::new(GgufFile::from_bytes(synthetic_model("llama", 5, 4096)).unwrap());
    drop(backend(&small, None, 4));
}
