//! Without a GPU: every `cuda/*.cu` module compiles through the worker's own
//! NVRTC path (with the shared constants as defines), every kernel symbol is
//! defined in its module, and every launcher's parameters match the kernel's
//! C signature.

use super::*;
use crate::backend::cuda::kernels::{AttentionSplit, Embed, Gemm, Matmul, Matvec};

// ------------------------------------------------------ without a GPU (CI)

/// Whether libnvrtc loads; outside CI a test without it is skipped (CI
/// must have it: the nvidia-cuda-nvrtc wheel, nvidia/cu13/lib on
/// LD_LIBRARY_PATH).
fn nvrtc_or_skip() -> bool {
    if !nvrtc_available() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must be able to load libnvrtc (nvidia-cuda-nvrtc wheel, nvidia/cu13/lib on LD_LIBRARY_PATH)"
        );
        eprintln!("skipping: libnvrtc cannot be loaded (set LD_LIBRARY_PATH to a folder holding libnvrtc.so)");
    }
    nvrtc_available()
}

/// Compiles every kernel module with the worker's NVRTC path for sm_80 and
/// sm_90. Needs only libnvrtc, no GPU.
#[test]
fn nvrtc_compiles_every_module_for_sm80_and_sm90() {
    if !nvrtc_or_skip() {
        return;
    }
    // Every .cu in cuda/ is a file of a module the worker embeds, and every
    // .cuh a header.
    let dir = workspace_path("cuda");
    for entry in std::fs::read_dir(&dir).into_iter().flatten() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".cu") {
            assert!(
                Module::ALL
                    .iter()
                    .any(|m| m.files().contains(&name.as_str())),
                "{name} is not embedded in a module"
            );
        } else if name.ends_with(".cuh") {
            assert!(
                HEADERS.iter().any(|(h, _)| *h == name),
                "{name} is not embedded as a header"
            );
        }
    }
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::at(Some(cache_dir.path().to_path_buf()));
    for arch in [(8, 0), (9, 0)] {
        for u in Unit::for_model(None) {
            let (cubin, from_cache) = cache
                .load_or_compile(u, arch)
                .unwrap_or_else(|e| panic!("{} for sm_{}{}: {e}", u.label(), arch.0, arch.1));
            assert!(!from_cache);
            assert!(
                cubin.starts_with(b"\x7fELF"),
                "{} did not give an ELF CUBIN",
                u.label()
            );
            let (again, from_cache) = cache.load_or_compile(u, arch).unwrap();
            assert!(
                from_cache && again == cubin,
                "the disk cache returns what was stored"
            );
        }
    }
}

/// A model's kernels compile per weight format: for every format, each
/// per-format unit holds exactly the kernels `Kernels::load` looks up in it
/// (its own format's; no other's) and has its own cache key. This is what a
/// GPU start with a model's formats needs from NVRTC.
#[test]
fn per_format_units_hold_only_their_format() {
    if !nvrtc_available() {
        eprintln!("skipping: libnvrtc cannot be loaded");
        return;
    }
    let per_format_units: usize = Module::ALL
        .iter()
        .filter(|m| m.per_format())
        .map(|m| m.parts() as usize)
        .sum();
    let set = |formats| {
        Some(KernelSet {
            formats,
            layer_formats: formats,
            expert_formats: formats,
            head_dim: 64,
            group: 8,
            kv_type: KvType::F16,
        })
    };
    let units = Unit::for_model(set(&[GgmlType::Q4K, GgmlType::Q4K]));
    // Q4_K once (no F32: no matrix is stored in it); the other modules whole
    // (in the parts heads of 64 need).
    let q4k = [GgmlType::Q4K];
    let needed = |m: &Module| {
        let format = m.per_format().then_some(GgmlType::Q4K);
        (0..m.parts())
            .filter(|&p| m.part_needed(p, format, &set(&q4k).unwrap()))
            .count()
    };
    assert_eq!(units.len(), Module::ALL.iter().map(needed).sum::<usize>());
    assert!(units.iter().all(|u| u.format != Some(GgmlType::F32)));
    let opts = crate::backend::cuda::nvrtc::options((9, 0));
    let key = |u: Unit| crate::backend::cuda::nvrtc::cache_key(u, &opts, (13, 0));
    let units: Vec<Unit> = Unit::for_model(set(&GgmlType::ALL))
        .into_iter()
        .filter(|u| u.format.is_some())
        .collect();
    // Every part of every per-format module (experts in every format), but
    // matvec.cu's mmq part only for the formats with such a kernel, and
    // gemm.cu's experts' part only for those with f16 tiles.
    let count = |f: fn(GgmlType) -> bool| GgmlType::ALL.iter().filter(|&&t| f(t)).count();
    let mmq_formats = count(crate::backend::cuda::source::has_mmq);
    let tile_formats = count(crate::backend::cuda::source::f16_tiles);
    assert_eq!(
        units.len(),
        GgmlType::ALL.len() * (per_format_units - 2) + mmq_formats + tile_formats
    );
    let compiled: Vec<(Unit, Vec<u8>)> = std::thread::scope(|s| {
        let handles: Vec<_> = units
            .iter()
            .map(|&u| {
                s.spawn(move || {
                    (
                        u,
                        compile_unit(u, (9, 0)).unwrap_or_else(|e| panic!("{}: {e}", u.label())),
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (u, cubin) in compiled {
        let has = |sym: &str| {
            cubin
                .windows(sym.len() + 2)
                .any(|w| w[0] == 0 && &w[1..=sym.len()] == sym.as_bytes() && w[sym.len() + 1] == 0)
        };
        for k in Kernel::all().into_iter().filter(|k| k.module() == u.module) {
            let sym = k.symbol();
            assert_eq!(
                has(&sym),
                k.format() == u.format && k.part() == u.part,
                "{}: symbol {sym} present: {}",
                u.label(),
                has(&sym)
            );
        }
        assert_ne!(
            key(u),
            key(Unit::whole(u.module)),
            "{}: one format keyed as all",
            u.label()
        );
        for other in GgmlType::ALL.into_iter().filter(|&f| Some(f) != u.format) {
            let o = Unit {
                format: Some(other),
                ..u
            };
            assert_ne!(
                key(u),
                key(o),
                "{} and {}: one cache key",
                u.label(),
                o.label()
            );
        }
    }
}

/// A model's per-head-size units (`attention_split.cu`, `attention_tc.cu`)
/// hold its head size's instances and no other's, each under a cache key
/// of its own; `Unit::for_model` picks them from the head size.
#[test]
fn head_size_units_hold_only_their_head_size() {
    if !nvrtc_available() {
        eprintln!("skipping: libnvrtc cannot be loaded");
        return;
    }
    let opts = crate::backend::cuda::nvrtc::options((9, 0));
    let key = |u: Unit| crate::backend::cuda::nvrtc::cache_key(u, &opts, (13, 0));
    let modules: Vec<Module> = Module::ALL
        .into_iter()
        .filter(|m| m.per_head_size())
        .collect();
    assert_eq!(modules.len(), 2);
    let mut keys: Vec<String> = modules.iter().map(|&m| key(Unit::whole(m))).collect();
    for (head_dim, pairs) in [(64, 1u8), (96, 2), (128, 2), (256, 4)] {
        let set = KernelSet {
            formats: &[GgmlType::Q8_0],
            layer_formats: &[GgmlType::Q8_0],
            expert_formats: &[],
            head_dim,
            group: 8,
            kv_type: KvType::F16,
        };
        let units: Vec<Unit> = Unit::for_model(Some(set))
            .into_iter()
            .filter(|u| u.module.per_head_size())
            .collect();
        let needed = |m: &Module| {
            (0..m.parts())
                .filter(|&p| m.part_needed(p, None, &set))
                .count()
        };
        assert_eq!(units.len(), modules.iter().map(needed).sum::<usize>());
        for u in units {
            assert_eq!(u.head_pairs, Some(pairs), "head size {head_dim}");
            if head_dim == 96 {
                continue; // the same units as 128
            }
            let cubin = compile_unit(u, (9, 0)).unwrap_or_else(|e| panic!("{}: {e}", u.label()));
            for k in Kernel::all().into_iter().filter(|k| k.module() == u.module) {
                let sym = k.symbol();
                let has = cubin.windows(sym.len() + 2).any(|w| {
                    w[0] == 0 && &w[1..=sym.len()] == sym.as_bytes() && w[sym.len() + 1] == 0
                });
                let want = k.part() == u.part && k.head_pairs().is_none_or(|p| p == pairs);
                assert_eq!(has, want, "{}: symbol {sym}", u.label());
            }
            keys.push(key(u));
        }
    }
    let mut distinct = keys.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), keys.len(), "one cache key per unit");
}

/// `attention_split.cu`'s parts: the tensor-core kernel and the combine
/// (part 0) for every model; the scalar kernel for groups of up to 4 (part 1)
/// and of 5 to 8 (part 2) only for heads of other sizes than 64 and 128,
/// part 2 only for such groups.
#[test]
fn attention_split_compiles_the_models_group_only() {
    for (head_dim, group, parts) in [
        (64, 3, vec![0]),
        (64, 7, vec![0]),
        (128, 4, vec![0]),
        (128, 8, vec![0]),
        (80, 1, vec![0, 1]),
        (80, 4, vec![0, 1]),
        (96, 5, vec![0, 1, 2]),
        (256, 8, vec![0, 1, 2]),
    ] {
        let set = KernelSet {
            formats: &[GgmlType::Q4K],
            layer_formats: &[GgmlType::Q4K],
            expert_formats: &[],
            head_dim,
            group,
            kv_type: KvType::F16,
        };
        let got: Vec<u8> = Unit::for_model(Some(set))
            .into_iter()
            .filter(|u| u.module == Module::AttentionSplit)
            .filter_map(|u| u.part)
            .collect();
        assert_eq!(got, parts, "heads of {head_dim}, group {group}");
    }
    assert_eq!(
        Kernel::AttentionSplit(AttentionSplit::Tc(1)).part(),
        Some(0)
    );
    assert_eq!(
        Kernel::AttentionSplit(AttentionSplit::Scalar(1, 4)).part(),
        Some(1)
    );
    assert_eq!(
        Kernel::AttentionSplit(AttentionSplit::Scalar(4, 8)).part(),
        Some(2)
    );
}

/// `mmq_*` (matvec.cu's part 1) compiles only where the layers' matrices
/// are stored in its format: not for the reference model (Q4_1 layers, a
/// Q8_0 embedding), which would wait on it at its first start.
#[test]
fn mmq_compiles_only_for_layers_in_its_format() {
    let mmq_units = |layer_formats: &[GgmlType]| -> Vec<Option<GgmlType>> {
        let set = KernelSet {
            formats: &[GgmlType::Q4_1, GgmlType::Q8_0],
            layer_formats,
            expert_formats: &[],
            head_dim: 64,
            group: 3,
            kv_type: KvType::F16,
        };
        Unit::for_model(Some(set))
            .into_iter()
            .filter(|u| u.module == Module::Matvec && u.part == Some(1))
            .map(|u| u.format)
            .collect()
    };
    assert_eq!(mmq_units(&[GgmlType::Q4_1]), vec![]);
    assert_eq!(
        mmq_units(&[GgmlType::Q4_1, GgmlType::Q8_0]),
        vec![Some(GgmlType::Q8_0)]
    );
    assert_eq!(Kernel::Matvec(Matvec::Mmq(GgmlType::Q8_0)).part(), Some(1));
    assert_eq!(
        Kernel::Matvec(Matvec::MatVec8(GgmlType::Q8_0)).part(),
        Some(0)
    );
}

/// A kernel names its part exactly where its module is cut into parts, and
/// a part that exists; every part of such a module holds some kernel.
#[test]
fn kernels_of_cut_modules_name_their_part() {
    for k in Kernel::all() {
        let parts = k.module().parts();
        match k.part() {
            Some(p) => assert!(
                parts > 1 && p < parts,
                "{}: part {p} of {parts}",
                k.symbol()
            ),
            None => assert_eq!(parts, 1, "{} names no part", k.symbol()),
        }
    }
    for m in Module::ALL.into_iter().filter(|m| m.parts() > 1) {
        for p in 0..m.parts() {
            assert!(
                Kernel::all()
                    .iter()
                    .any(|k| k.module() == m && k.part() == Some(p)),
                "{} part {p} holds no kernel",
                m.file_name()
            );
        }
    }
}

#[test]
fn nvrtc_reports_a_broken_kernel_with_its_log() {
    if !nvrtc_available() {
        eprintln!("skipping: libnvrtc cannot be loaded");
        return;
    }
    let src = "#include \"common.cuh\"\nextern \"C\" __global__ void broken(float* x) { x[0] = undefined_name; }\n";
    match compile_source("broken.cu", src, (9, 0)) {
        Err(BackendError::Compile(msg)) => {
            assert!(
                msg.contains("undefined_name"),
                "the NVRTC log names the error: {msg}"
            )
        }
        other => panic!("expected a compile error, got {:?}", other.map(|b| b.len())),
    }
}

#[test]
fn every_kernel_symbol_is_defined_in_its_module() {
    for k in Kernel::all() {
        let src = k.module().source();
        let sym = k.symbol();
        let defined = match k {
            Kernel::Embed(Embed::Embed(_)) => src.contains("embed_##name"),
            Kernel::Matmul(Matmul::Mv(_)) => src.contains("mv_##name"),
            Kernel::Matmul(Matmul::Mvw(_)) => src.contains("mvw_##name"),
            Kernel::Matmul(Matmul::Gemm(_)) => src.contains("gemm_##name"),
            Kernel::Matvec(Matvec::MatVec1(_)) => src.contains("mv1_##name"),
            Kernel::Matvec(Matvec::MatVecExperts(_)) => src.contains("mv1e_##name"),
            Kernel::Matvec(Matvec::MatVec8Experts(t)) => {
                src.contains("mv8e_##name")
                    && src.contains(&format!("DEF_MV8E({}, ", t.name().to_ascii_lowercase()))
            }
            Kernel::Matvec(Matvec::MatVec8(t)) => {
                src.contains("mv8_##name")
                    && src.contains(&format!("DEF_MV8({}, ", t.name().to_ascii_lowercase()))
            }
            Kernel::Matvec(Matvec::MatVec8Many(_)) => src.contains("mv8m_##name"),
            Kernel::Matvec(Matvec::MatVec8Qkv(_)) => src.contains("mv8q_##name"),
            Kernel::Matvec(Matvec::MatVec8N(_)) => src.contains("mv8n_##name"),
            Kernel::Matvec(Matvec::Mmq(_)) => src.contains(&format!(")\n    {sym}(")),
            Kernel::Gemm(Gemm::Tc(_)) => src.contains("gemm_tc_##name"),
            Kernel::Gemm(Gemm::Tck(_)) => src.contains("gemm_tck_##name"),
            Kernel::Gemm(Gemm::Few(_)) => src.contains("gemm_few_##name"),
            Kernel::Gemm(Gemm::DequantF16(_)) => src.contains("dequant_f16_##name"),
            Kernel::Gemm(Gemm::Moe(_)) => src.contains("gemm_moe_##name"),
            Kernel::AttentionSplit(AttentionSplit::Scalar(pairs, group)) => {
                src.contains(" NAME(")
                    && src.contains(&format!("ATTENTION_SPLIT_BOTH({sym}, {pairs}, {group})"))
            }
            Kernel::AttentionSplit(AttentionSplit::Tc(pairs)) => {
                src.contains(" NAME(")
                    && src.contains(&format!(
                        "ATTENTION_SPLIT_TC_BOTH({sym}, {})",
                        64 * pairs as usize
                    ))
            }
            Kernel::AttentionSplit(AttentionSplit::ScalarRows(pairs, group)) => {
                src.contains("ATTENTION_SPLIT_ROWS(NAME##_rows")
                    && src.contains(&format!(
                        "ATTENTION_SPLIT_BOTH({}, {pairs}, {group})",
                        sym.trim_end_matches("_rows")
                    ))
            }
            Kernel::AttentionSplit(AttentionSplit::TcRows(pairs)) => {
                src.contains("ATTENTION_SPLIT_ROWS(NAME##_rows")
                    && src.contains(&format!(
                        "ATTENTION_SPLIT_TC_BOTH({}, {})",
                        sym.trim_end_matches("_rows"),
                        64 * pairs as usize
                    ))
            }
            _ => src.contains(&format!(" {sym}(")) || src.contains(&format!("\n    {sym}(")),
        };
        assert!(
            defined,
            "{sym} is not defined in {}",
            k.module().file_name()
        );
    }
}

/// Every kernel may be scheduled before the kernel ahead of it on the
/// stream has ended (programmatic dependent launch), so every kernel's body
/// must open with `pdl_start();`, which waits for it before memory is
/// touched: a kernel without it would race with the one ahead. The
/// mat-vecs open with `pdl_launch_next();` and wait inside the device
/// function they call, after their first weight loads: each such function
/// must call `pdl_wait();` before it reads x.
#[test]
fn every_kernel_opens_with_pdl_start() {
    const WAIT_AFTER_WEIGHTS: [&str; 5] = [
        "mv8_one<",
        "mv8_many<",
        "mv8_rows<",
        "mmq_rows(",
        "gemm_few_impl<",
    ];
    let mut kernels = 0;
    for m in Module::ALL {
        let src = m.source();
        for (at, _) in src.match_indices("extern \"C\" __global__") {
            let body = at + src[at..].find('{').expect("a kernel body");
            let rest = src[body + 1..].trim_start_matches(|c: char| c.is_whitespace() || c == '\\');
            let first = rest.lines().next().unwrap_or("");
            let name = src[at..body].split('(').next().unwrap_or("").trim();
            if first.starts_with("pdl_launch_next();") {
                let end = rest.find("extern \"C\"").unwrap_or(rest.len());
                let callee = WAIT_AFTER_WEIGHTS.iter().find(|f| rest[..end].contains(*f));
                assert!(
                    callee.is_some(),
                    "{}: `{name}` opens with pdl_launch_next() but calls no function that waits",
                    m.file_name()
                );
            } else {
                assert!(
                    first.starts_with("pdl_start();"),
                    "{}: the kernel at `{name}` opens with `{first}`, not pdl_start()",
                    m.file_name()
                );
            }
            kernels += 1;
        }
    }
    assert!(kernels >= 30, "only {kernels} kernel definitions found");
    // Each function a kernel leaves the wait to waits before it reads x
    // (`mv8_many` reads x only through `mv8_one`).
    let src = Module::Matvec.source();
    for (f, reads_x) in [
        ("mv8_one", "x8_unit("),
        ("mv8_rows", "x8_unit("),
        ("mv8_many", "mv8_one<"),
        ("mmq_rows", "x8_frag("),
    ] {
        let def = format!("void {f}(");
        let at = src
            .find(&def)
            .unwrap_or_else(|| panic!("{def} not in matvec.cu"));
        let body = &src[at..at + src[at..].find("\n}\n").expect("the function's end")];
        let x = body
            .find(reads_x)
            .unwrap_or_else(|| panic!("{def} does not call {reads_x}"));
        if f != "mv8_many" {
            let wait = body
                .find("pdl_wait();")
                .unwrap_or_else(|| panic!("{def} never calls pdl_wait()"));
            assert!(wait < x, "{def}: pdl_wait() after x is read");
        }
    }
}

/// The parameter list of `k`'s definition in its module source, each
/// parameter reduced to its C type (`const float*`, `int`, ...); where the
/// definition opens is the family's word (`Family::definition`).
fn c_signature(k: Kernel) -> Vec<String> {
    let src = k.module().source();
    let (after, heads) = k.definition();
    let at = src
        .find(after)
        .unwrap_or_else(|| panic!("{}: no {after:?} in its module", k.symbol()));
    let start = heads
        .iter()
        .find_map(|h| src[at..].find(h.as_str()).map(|i| at + i + h.len()))
        .unwrap_or_else(|| {
            panic!(
                "{} is not defined in {}",
                k.symbol(),
                k.module().file_name()
            )
        });
    c_params(&src[start..])
}

/// A parameter list (from just after its opening parenthesis), each
/// parameter reduced to its C type.
fn c_params(list: &str) -> Vec<String> {
    let end = list.find(')').expect("a closed parameter list");
    list[..end]
        .replace('\\', " ")
        .split(',')
        .map(|p| {
            let p = p.replace("__restrict__", " ");
            let ty = p
                .trim()
                .trim_end_matches(|c: char| c.is_ascii_alphanumeric() || c == '_');
            ty.split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .replace(" *", "*")
        })
        .collect()
}

/// Every kernel has a launcher, and the launcher pushes exactly the
/// kernel's parameters: as many, in the same order, of the same C types
/// (pointer element types and constness included). A mismatch here would
/// be a launch reading its arguments wrongly on the GPU.
#[test]
fn every_launcher_pushes_its_kernels_c_signature() {
    for k in Kernel::all() {
        assert_eq!(
            k.pushed(),
            c_signature(k),
            "{}: launcher parameters vs the .cu signature",
            k.symbol()
        );
    }
}

/// The shared constants are defined once, in Rust: each reaches NVRTC as
/// a define, no source defines it again, each module that uses one refuses
/// to compile without it, and a changed value changes the cache key.
#[test]
fn shared_constants_reach_nvrtc_as_defines_and_key_the_cache() {
    use crate::backend::cuda::source::SHARED_CONSTANTS;
    let opts = crate::backend::cuda::nvrtc::options((9, 0));
    let sources: Vec<&str> = Module::ALL
        .iter()
        .map(|m| m.source())
        .chain(HEADERS.iter().map(|(_, s)| *s))
        .collect();
    for (name, value) in SHARED_CONSTANTS {
        assert!(
            opts.contains(&format!("-D{name}={value}")),
            "{name} is not passed to NVRTC: {opts:?}"
        );
        assert!(
            sources
                .iter()
                .all(|s| !s.contains(&format!("#define {name} "))),
            "{name} is defined again in CUDA"
        );
        assert!(
            sources
                .iter()
                .any(|s| s.contains(&format!("defined({name})"))),
            "no module checks that {name} is set"
        );
    }
    let key = |opts: &[String]| {
        crate::backend::cuda::nvrtc::cache_key(Unit::whole(Module::Matmul), opts, (13, 0))
    };
    let mut changed = opts.clone();
    let i = changed
        .iter()
        .position(|o| o.starts_with("-DMV_THREADS="))
        .unwrap();
    changed[i] = "-DMV_THREADS=256".into();
    assert_ne!(
        key(&opts),
        key(&changed),
        "a changed constant must not load a stale image"
    );
    assert_eq!(key(&opts), key(&opts.clone()));
}

/// Every unit a model may compile is named by its stem alone (a compile
/// helper process is told its unit that way); other names are refused.
#[test]
fn units_are_found_again_by_their_stem() {
    let set = KernelSet {
        formats: &GgmlType::ALL,
        layer_formats: &GgmlType::ALL,
        expert_formats: &GgmlType::ALL,
        head_dim: 80,
        group: 8,
        kv_type: KvType::F16,
    };
    let units: Vec<Unit> = Unit::for_model(None)
        .into_iter()
        .chain(Unit::for_model(Some(set)))
        .collect();
    assert!(units.len() > 40, "{} units", units.len());
    for u in units {
        assert_eq!(Unit::from_stem(&u.stem()), Some(u), "{}", u.stem());
    }
    for bad in [
        "",
        "matvec-q9_0-p0",
        "nothing",
        "matvec-p0-q8_0",
        "matvec-q8_0-p",
    ] {
        assert_eq!(Unit::from_stem(bad), None, "{bad:?}");
    }
}

/// Issue 45: the modules that read or write the KV cache compile for a
/// q8_0 and a q4_0 cache (`-DKV_TYPE`, cuda/common.cuh), for heads of 64,
/// 128 (the tensor-core kernels) and 256 (the scalar split kernel); the
/// others are built once, as for an f16 cache, and named so.
#[test]
fn quantized_kv_units_compile() {
    if !nvrtc_or_skip() {
        return;
    }
    for (kv_type, head_dim) in [(KvType::Q8_0, 128), (KvType::Q4_0, 64), (KvType::Q8_0, 256)] {
        let set = KernelSet {
            formats: &[GgmlType::Q8_0],
            layer_formats: &[GgmlType::Q8_0],
            expert_formats: &[],
            head_dim,
            group: 8,
            kv_type,
        };
        let units = Unit::for_model(Some(set));
        for u in &units {
            assert_eq!(u.kv.is_some(), u.module.touches_kv(), "{}", u.label());
            assert_eq!(Unit::from_stem(&u.stem()), Some(*u), "{}", u.stem());
        }
        for u in units.into_iter().filter(|u| u.kv.is_some()) {
            assert!(u.stem().ends_with(&format!("-k{kv_type}")), "{}", u.stem());
            let cubin =
                compile_unit(u, (9, 0)).unwrap_or_else(|e| panic!("{} for sm_90: {e}", u.label()));
            assert!(cubin.starts_with(b"\x7fELF"), "{}", u.label());
        }
    }
}
