//! Device set-up (M0-W-1400, M0-W-1010) and memory kinds.

use super::*;

// ------------------------------------------------------------ device set-up

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn device_init_reads_facts_and_applies_vram_only_settings() {
    let _gpu = shared_gpu();
    let _ = GPU;
    let d = dev();
    let info = d.info();
    assert_eq!(info.backend, crate::backend::BackendKind::Cuda);
    assert!(!info.name.is_empty());
    assert!(info.sm.is_some() && info.total_memory_bytes.unwrap() > 0);
    let limits = d.limits();
    eprintln!("device {} sm {:?}, limits {limits:?}", info.name, info.sm);
    assert!(limits.prefers_l1, "L1 preferred (M0-W-1010)");
    assert!(
        limits.malloc_heap_bytes <= 8 << 20,
        "heap limit as low as allowed: {}",
        limits.malloc_heap_bytes
    );
    // The per-thread stack is what the kernels need (none of them 1 KiB,
    // the default, which would hold 264 MiB of local memory on an H100).
    let stack = d
        .ctx
        .get_limit(cudarc::driver::sys::CUlimit::CU_LIMIT_STACK_SIZE)
        .unwrap();
    assert!(
        stack < 1024,
        "stack limit lowered to the kernels' need: {stack}"
    );
    // The probe: a fresh allocation is plain device memory.
    let b = d.alloc(device::Purpose::Scratch, 1000).unwrap();
    assert_eq!(device::memory_type(b.ptr()).unwrap(), MemoryKind::Device);
    assert_eq!(b.ptr() % 256, 0);
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn device_id_equal_to_the_count_is_invalid() {
    let _gpu = shared_gpu();
    let _ = dev();
    let count = cudarc::driver::result::device::get_count().unwrap() as usize;
    match CudaDevice::new(count) {
        Err(BackendError::InvalidDevice(msg)) => assert!(msg.contains(&count.to_string())),
        Err(e) => panic!("expected InvalidDevice, got {e}"),
        Ok(_) => panic!("expected InvalidDevice, got a device"),
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn host_mapped_memory_is_not_device_memory() {
    let _gpu = shared_gpu();
    // Each test runs on its own thread: make the context current here.
    dev().bind().unwrap();
    let h = host_mapped_buffer().unwrap();
    assert_eq!(device::memory_type(h.dptr).unwrap(), MemoryKind::Host);
    unsafe { cudarc::driver::sys::cuMemFreeHost(h.host) };
}
