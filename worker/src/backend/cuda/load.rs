//! Loading a model onto the GPU: the device and its kernels, the check that
//! the model fits, every weight uploaded in its stored format, the scratch
//! and first sequence's sampler reserved.

use super::*;

/// Bytes the device copy of one tensor takes: matrices as stored, vectors as f32.
pub(super) fn device_bytes(info: &crate::gguf::TensorInfo) -> u64 {
    if info.dims.len() <= 1 {
        info.n_elements * 4
    } else {
        info.n_bytes
    }
}

/// The device block a tensor is given: its bytes, and a matrix's tail
/// (`ops::WEIGHT_TAIL_BYTES`).
pub(super) fn device_block_bytes(info: &crate::gguf::TensorInfo) -> u64 {
    match info.dims.len() {
        0 | 1 => device_bytes(info),
        _ => ops::weight_block_bytes(info.n_bytes as usize),
    }
}

impl CudaBackend {
    /// Sets up GPU `opts.gpu_device`, checks that the model fits, and uploads
    /// every weight in its stored format. `on_bytes` is told each chunk copied.
    pub fn load(
        cfg: ModelConfig,
        file: &GgufFile,
        opts: &CudaLoadOptions,
        on_bytes: &mut dyn FnMut(u64),
    ) -> Result<Self, BackendError> {
        // Refused before the GPU is touched (M0-W-1222).
        if opts.upload_chunk_bytes == 0 {
            return Err(BackendError::ModelLoadFailed(
                "the upload chunk size must be positive".into(),
            ));
        }
        opts.kv_type.check_head_dim(cfg.head_dim)?;
        // Only the kernels of the model's matrix formats are compiled.
        let names = Weights::<CudaWeight>::tensor_names(&cfg, file);
        let (mut formats, mut layer_formats, mut expert_formats) =
            (Vec::new(), Vec::new(), Vec::new());
        for (name, info) in names.iter().filter_map(|n| Some((n, file.tensor(n)?))) {
            if info.dims.len() < 2 {
                continue;
            }
            if !formats.contains(&info.ggml_type) {
                formats.push(info.ggml_type);
            }
            if name.starts_with("blk.") && !layer_formats.contains(&info.ggml_type) {
                layer_formats.push(info.ggml_type);
            }
            if info.dims.len() == 3 && !expert_formats.contains(&info.ggml_type) {
                expert_formats.push(info.ggml_type);
            }
        }
        let set = KernelSet {
            formats: &formats,
            layer_formats: &layer_formats,
            expert_formats: &expert_formats,
            head_dim: cfg.head_dim,
            group: cfg.n_head / cfg.n_head_kv.max(1),
            kv_type: opts.kv_type,
        };
        let dev = CudaDevice::with_cap(opts.gpu_device, opts.vram_cap_bytes, Some(set))?;
        dev.bind()?;

        // Fail fast, before allocating anything, when the model does not fit.
        let mut weight_bytes = 0u64;
        for name in &names {
            let info = file.tensor(name).ok_or_else(|| {
                BackendError::ModelLoadFailed(format!("tensor {name} is missing"))
            })?;
            weight_bytes += align_up(device_block_bytes(info));
        }
        let kv_limit_bytes = opts.kv_cache_size_mb.map(|mb| mb << 20);
        let per_pos =
            CudaCache::bytes_of(opts.kv_type, cfg.n_layer, cfg.n_head_kv, cfg.head_dim, 1);
        let mut min_kv = per_pos * cfg.context_length.min(MIN_KV_POSITIONS) as u64;
        if let Some(limit) = kv_limit_bytes {
            min_kv = min_kv.min(limit);
        }
        let needed = weight_bytes
            + align_up(min_kv)
            + decode_scratch_bytes(&cfg)
            + DeviceSampler::bytes_for(cfg.vocab_size);
        let available = dev.available_bytes()?;
        if needed > available {
            return Err(BackendError::OutOfMemory { needed, available });
        }

        let mut uploader = upload::Uploader::new(dev.clone(), opts.upload_chunk_bytes)?;
        let mut weight_bufs = Vec::with_capacity(names.len());
        let weights = Weights::load(&cfg, file, &mut |spec| {
            let info = spec.info;
            let data = file.tensor_data(info);
            let w = if spec.rows == 1 {
                // Vectors (norm weights, biases) are kept as f32; GGUF files
                // store them as F32, which is uploaded byte for byte.
                let f32_bytes;
                let bytes: &[u8] = if info.ggml_type == GgmlType::F32 {
                    data
                } else {
                    let mut v = vec![0f32; spec.cols];
                    quant::dequantize(info.ggml_type, data, &mut v).map_err(|e| {
                        BackendError::ModelLoadFailed(format!("{}: {e}", info.name))
                    })?;
                    f32_bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
                    &f32_bytes
                };
                let mem = dev.alloc(Purpose::Weights, bytes.len() as u64)?;
                uploader.upload(bytes, mem.ptr(), on_bytes)?;
                CudaWeight {
                    mem,
                    ty: GgmlType::F32,
                    rows: 1,
                    cols: spec.cols,
                    row_bytes: spec.cols * 4,
                }
            } else {
                let ty = info.ggml_type;
                let row_bytes = ty.bytes_for(spec.cols as u64).ok_or_else(|| {
                    BackendError::ModelLoadFailed(format!(
                        "{}: {} columns are not whole {ty} blocks",
                        info.name, spec.cols
                    ))
                })? as usize;
                if row_bytes * spec.rows != data.len() {
                    return Err(BackendError::ModelLoadFailed(format!(
                        "{}: size does not match its shape",
                        info.name
                    )));
                }
                let mem = dev.alloc(Purpose::Weights, ops::weight_block_bytes(data.len()))?;
                uploader.upload(data, mem.ptr(), on_bytes)?;
                CudaWeight {
                    mem,
                    ty,
                    rows: spec.rows,
                    cols: spec.cols,
                    row_bytes,
                }
            };
            device::check_aligned(&info.name, w.ptr())?;
            weight_bufs.push(WeightBuffer {
                name: info.name.clone(),
                ptr: w.ptr(),
                bytes: w.mem.bytes(),
            });
            Ok(w)
        })?;
        let upload_stats = uploader.finish()?;

        let host_mapped = if std::env::var_os(TEST_HOST_MAPPED_WEIGHT_ENV).is_some() {
            Some(host_mapped_buffer()?)
        } else {
            None
        };
        let mut ops = CudaOps::new(dev.clone());
        ops.prepare_rope(cfg.rope_freq_base, cfg.n_rot, weights.rope_freq_factors())?;
        // The widest row of x that a decode mat-vec splits for `mv8_*`.
        let x8_cols = names
            .iter()
            .filter_map(|n| file.tensor(n))
            .filter(|i| i.dims.len() > 1 && kernels::has_mv8(i.ggml_type))
            .map(|i| i.dims[0] as usize)
            .max();
        if let Some(cols) = x8_cols {
            ops.reserve_x8(cols)?;
        }
        // The widest row of x any product takes (batched steps' f16 block).
        let widest = names
            .iter()
            .filter_map(|n| file.tensor(n))
            .filter(|i| i.dims.len() > 1)
            .map(|i| i.dims[0] as usize)
            .max();
        if let Some(cols) = widest {
            ops.set_widest_input(cols);
        }
        ops.reserve_rows(graph::ROWS_GRAPH_STEP)?;
        if let Some(m) = cfg.moe {
            ops.reserve_moe(m.used, m.n_ff, cfg.n_embd)?;
        }
        // Prefill's cuBLAS handle and f16 scratch, sized for the layers'
        // matrices (an LM head multiplied for many rows goes in more chunks).
        ops.prepare_blas(
            names
                .iter()
                .filter(|n| n.starts_with("blk."))
                .filter_map(|n| file.tensor(n))
                .filter(|i| i.dims.len() == 2 && i.ggml_type.block_len() > 1)
                .map(|i| (i.dims[1] as usize, i.dims[0] as usize)),
        );
        let slot = CudaSlot::new(&dev, cfg.vocab_size)?;
        ops.keep_logits_in(slot.sampler.logits_ptr(), cfg.vocab_size);
        let graph_host = graph::GraphHost::new(&dev, cfg.vocab_size)?;
        let use_graphs = std::env::var(CUDA_GRAPHS_ENV).map_or(true, |v| v != "0");
        let rows_graphs = graph::RowsGraphs::new(&dev);
        Ok(CudaBackend {
            cfg,
            dev,
            ops,
            weights,
            weight_bufs,
            host_mapped,
            seqs: Slots::new(vec![slot]),
            kv_limit_bytes,
            kv_pool: None,
            upload_stats,
            graph_host,
            use_graphs,
            sample_tables: Default::default(),
            rows_graphs,
            prefix: None,
            prefix_share: None,
        })
    }
}

/// Scratch one decode step needs (the activations of `model::forward` for one
/// token), with slack for the pool's granularity.
pub(super) fn decode_scratch_bytes(cfg: &ModelConfig) -> u64 {
    let floats: usize = model::step_buffers(cfg, 1).iter().sum();
    align_up(floats as u64 * 4) + (4 << 20)
}

pub(super) fn host_mapped_buffer() -> Result<HostMapped, BackendError> {
    use cudarc::driver::sys;
    let mut host = std::ptr::null_mut();
    let mut dptr = 0u64;
    // SAFETY: pinned, device-mapped host allocation of 4 KiB on the bound
    // context; freed in CudaBackend's Drop.
    unsafe {
        sys::cuMemHostAlloc(&mut host, 4096, sys::CU_MEMHOSTALLOC_DEVICEMAP)
            .result()
            .map_err(|e| BackendError::VramResidencyFailed(format!("test hook: {e:?}")))?;
        sys::cuMemHostGetDevicePointer_v2(&mut dptr, host, 0)
            .result()
            .map_err(|e| BackendError::VramResidencyFailed(format!("test hook: {e:?}")))?;
    }
    Ok(HostMapped { host, dptr })
}
