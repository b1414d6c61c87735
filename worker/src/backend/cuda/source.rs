//! The kernel sources (M0-W-1430): the `cuda/*.cu` modules and `cuda/*.cuh`
//! headers embedded in the binary, and the constants Rust and CUDA share.
//!
//! The shared constants are defined here only. NVRTC gets each of them as a
//! `-D NAME=value` option ([`defines`]), so a kernel's block size or tile
//! and the launch geometry the host computes from it cannot drift apart; the
//! `.cu` files refuse to compile without them (`#error`). The defines are
//! part of the compile options and so of the disk cache key: a changed
//! constant never loads a stale image.
//!
//! This module is the bottom of `backend::cuda`'s kernel stack: `nvrtc`
//! compiles what it lists, `launch` and `kernels` launch what it names.
//!
//! A [`Module`] is the text of one or more `cuda/*.cu` files
//! ([`Module::files`]), a [`Unit`] what NVRTC compiles of it in one go. The modules whose kernels
//! exist once per weight format (`Module::per_format`) are compiled once per
//! format a model uses, in parallel: a model in two formats compiles a sixth
//! of their code, which is most of the first start on a new machine.

use crate::backend::KvType;
use crate::quant::GgmlType;

/// Defines each constant and lists it in [`SHARED_CONSTANTS`], so that no
/// constant can be shared without reaching NVRTC.
macro_rules! shared_constants {
    ($($(#[$doc:meta])* $name:ident: $ty:ty = $value:expr;)*) => {
        $($(#[$doc])* pub const $name: $ty = $value;)*

        /// Every constant shared with the kernels, by its CUDA name.
        pub const SHARED_CONSTANTS: &[(&str, u64)] = &[$((stringify!($name), $name as u64)),*];
    };
}

shared_constants! {
    /// Largest number of activation rows `mv_*` / `mvw_*` take per launch.
    MV_MAX_TOKENS: usize = 8;
    /// Threads per `mv_*` / `mvw_*` block: one weight row per block (`mv_*`),
    /// or one per warp (`mvw_*`).
    MV_THREADS: u32 = 128;
    /// Output tile of `gemm_*`: `GEMM_BM` weight rows by `GEMM_BN` rows of x,
    /// over slices of `GEMM_BK` columns, with `GEMM_THREADS` threads a block.
    /// `matmul.cu` asserts the values its thread layout assumes.
    GEMM_BM: u32 = 64;
    GEMM_BN: u32 = 64;
    GEMM_BK: u32 = 32;
    GEMM_THREADS: u32 = 256;
    /// Threads of the one block of `sample_select` and `sample_logprobs`.
    SAMPLE_THREADS: u32 = 1024;
    /// `sample_argmax` (greedy, many blocks): threads a block, and most blocks
    /// (its partial results' buffer).
    SAMPLE_ARGMAX_THREADS: u32 = 256;
    SAMPLE_ARGMAX_BLOCKS: usize = 256;
    /// Most log-probabilities `sample_logprobs` returns.
    SAMPLE_MAX_LOGPROBS: usize = 20;
    /// u32 words of the sampling kernels' result block: `[0]` id, `[1]` count,
    /// `[2]` max, `[4..6)` log-sum-exp, then (id, value) pairs from `[8]`.
    SAMPLE_OUT_WORDS: usize = 8 + 2 * SAMPLE_MAX_LOGPROBS;
    /// Threads per `attention` block, and the largest head size it takes (its
    /// shared memory is sized for it; a multiple of 64, see attention.cu).
    ATT_THREADS: u32 = 256;
    ATT_MAX_HEAD_DIM: usize = 256;
    /// `moe_route` (elementwise.cu): the most experts a router chooses
    /// among (lanes of a warp hold them), and rows (warps) a block.
    MOE_MAX_EXPERTS: usize = 256;
    MOE_ROUTE_ROWS: u32 = 4;
    /// `mv1_*` (decode mat-vec, matvec.cu): threads per block, weight rows
    /// per block, and the depth of its pipeline of column tiles.
    MV1_THREADS: u32 = 256;
    MV1_ROWS: u32 = 8;
    MV1_STAGES: u32 = 4;
    /// `mv8_*` / `mv8n_*` (integer mat-vec, matvec.cu): threads per block,
    /// and weight rows per block for one row of x and for several.
    MV8_THREADS: u32 = 128;
    MV8_ROWS: u32 = 2;
    MV8N_ROWS: u32 = 4;
    /// Most rows of x one `mv8n_*` launch takes.
    MV8_MAX_TOKENS: usize = 8;
    /// `mmq_q8_0` (matvec.cu): up to `MMQ_MAX_TOKENS` rows of x, 16 weight
    /// rows a block of `MMQ_WARPS` warps, `MMQ_UNROLL` weight blocks a warp
    /// in flight.
    MMQ_WARPS: u32 = 8;
    MMQ_MAX_TOKENS: usize = 64;
    MMQ_UNROLL: u32 = 4;
    /// `gemm_tc_*` (gemm.cu): output tile of `GTC_BR` weight rows by
    /// `GTC_BT` rows of x over slices of `GTC_BK` columns, `GTC_THREADS`
    /// threads (8 warps of 32 x 32), shared-memory rows padded by `GTC_PAD`.
    GTC_BR: u32 = 128;
    GTC_BT: u32 = 64;
    GTC_BK: u32 = 32;
    GTC_THREADS: u32 = 256;
    GTC_PAD: u32 = 4;
    /// `gemm_few_*` (gemm.cu): warps a block (32 weight rows each), blocks
    /// an SM holds (its `__launch_bounds__`; the host sizes grids by it),
    /// and the most rows of x a launch takes.
    GF_WARPS: u32 = 4;
    GF_BLOCKS_PER_SM: usize = 3;
    GF_MAX_TOKENS: usize = 64;
    /// `attention_split` (attention_split.cu): threads per block, most query heads
    /// per KV head, keys each warp loads before using them, and most chunks
    /// (`attention_combine`'s shared memory).
    ATS_THREADS: u32 = 128;
    ATS_MAX_GROUP: usize = 8;
    ATS_KEYS: u32 = 4;
    ATS_MAX_SPLITS: usize = 1024;
    /// Positions of each chunk of a batched decode step's rows
    /// (`attention_split_*_rows`): a fixed length, so that a row's chunks,
    /// and so its sums, depend on its own context alone. 128: the
    /// tensor-core kernel's least chunk.
    ATS_ROW_CHUNK: usize = 128;
    /// Threads per `attention_combine` block (one block per head: many
    /// warps, so that each reads few chunks).
    ATSC_THREADS: u32 = 512;
    /// `attention_tc` (attention_tc.cu, prefill on tensor cores): threads per
    /// block, query rows per block, keys per step.
    ATC_THREADS: u32 = 128;
    ATC_BQ: u32 = 64;
    ATC_BK: u32 = 64;
}

/// Dynamic shared memory of a `gemm_tc_*` block: W and x tiles, each as TF32
/// high and low parts (over the 48 KB static limit; the loader raises it).
pub const GTC_SMEM_BYTES: u32 = 2 * (GTC_BR + GTC_BT) * (GTC_BK + GTC_PAD) * 4;

/// The head sizes `attention_tc` has a path for, the largest last.
pub const ATC_HEAD_DIMS: [usize; 2] = [64, 128];

/// Dynamic shared memory of an `attention_tc` block: q's high and low parts
/// and one tile of K and of V, rows of the largest head padded by 8 halves.
pub const ATC_SMEM_BYTES: u32 =
    (2 * ATC_BQ + 2 * ATC_BK) * (ATC_HEAD_DIMS[ATC_HEAD_DIMS.len() - 1] as u32 + 8) * 2;

/// The NVRTC options that define [`SHARED_CONSTANTS`] for every module.
pub fn defines() -> Vec<String> {
    SHARED_CONSTANTS
        .iter()
        .map(|(name, v)| format!("-D{name}={v}"))
        .collect()
}

/// Headers every module may include, by the name used in `#include "..."`.
pub const HEADERS: [(&str, &str); 3] = [
    ("common.cuh", include_str!("../../../../cuda/common.cuh")),
    ("dequant.cuh", include_str!("../../../../cuda/dequant.cuh")),
    (
        "attention.cuh",
        include_str!("../../../../cuda/attention.cuh"),
    ),
];

/// One `cuda/*.cu` file, compiled as one CUDA module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Module {
    Embed,
    Matmul,
    Matvec,
    GemmTc,
    Norm,
    Rope,
    Attention,
    AttentionSplit,
    AttentionTc,
    Elementwise,
    Sample,
}

impl Module {
    pub const ALL: [Module; 11] = [
        Module::Embed,
        Module::Matmul,
        Module::Matvec,
        Module::GemmTc,
        Module::Norm,
        Module::Rope,
        Module::Attention,
        Module::AttentionSplit,
        Module::AttentionTc,
        Module::Elementwise,
        Module::Sample,
    ];

    /// The module's name: its first file, the one that includes the headers.
    pub fn file_name(self) -> &'static str {
        self.files()[0]
    }
}

/// Each module's `cuda/` files, in the order NVRTC reads them as one text
/// ([`Module::source`]): a module over 700 lines is cut into files by what
/// its kernels do, the later ones using what the first includes and
/// defines. Adding a file to a module is a line here.
macro_rules! module_files {
    ($($module:ident => [$($file:literal),+ $(,)?],)+) => {
        impl Module {
            /// The module's files, its name first.
            pub fn files(self) -> &'static [&'static str] {
                match self {
                    $(Module::$module => &[$($file),+]),+
                }
            }

            /// The text NVRTC compiles: the module's files, one after another.
            pub fn source(self) -> &'static str {
                match self {
                    $(Module::$module => {
                        concat!($(include_str!(concat!("../../../../cuda/", $file))),+)
                    }),+
                }
            }
        }
    };
}

module_files! {
    Embed => ["embed.cu"],
    Matmul => ["matmul.cu"],
    Matvec => ["matvec.cu", "matvec_mv8.cu", "matvec_mmq.cu"],
    GemmTc => ["gemm.cu", "gemm_few.cu"],
    Norm => ["norm.cu"],
    Rope => ["rope.cu"],
    Attention => ["attention.cu"],
    AttentionSplit => ["attention_split.cu"],
    AttentionTc => ["attention_tc.cu"],
    Elementwise => ["elementwise.cu"],
    Sample => ["sample.cu"],
}

impl Module {
    /// Whether the module's kernels are defined once per weight format
    /// (`FOR_EACH_TYPE` in dequant.cuh).
    pub fn per_format(self) -> bool {
        matches!(
            self,
            Module::Embed | Module::Matmul | Module::Matvec | Module::GemmTc
        )
    }

    /// Whether the module's kernels are defined once per head-size class
    /// ([`head_pairs`], `-DONE_HEAD_PAIRS`).
    pub fn per_head_size(self) -> bool {
        matches!(self, Module::AttentionSplit | Module::AttentionTc)
    }

    /// Whether the module's kernels read or write the KV cache (built per
    /// KV type, `-DKV_TYPE`). `matvec.cu`'s `mv8q_*`, which stores f16 K
    /// and V as it computes them, is not: a quantized cache takes the
    /// separate store (`Kernels::set_qkv_rope`).
    pub fn touches_kv(self) -> bool {
        matches!(
            self,
            Module::Rope | Module::Attention | Module::AttentionSplit | Module::AttentionTc
        )
    }

    /// Into how many units a model's build of the module is cut
    /// (`-DONE_PART`, `Kernel::part`): the modules that took longest to
    /// compile, since a first start waits for its slowest unit.
    pub fn parts(self) -> u8 {
        match self {
            Module::Matmul | Module::Sample => 2,
            Module::Matvec | Module::GemmTc | Module::AttentionSplit => 3,
            _ => 1,
        }
    }

    /// Whether a model of `set` uses part `part` of the module: all of them,
    /// but `attention_split.cu`'s scalar kernels (part 1: groups of up to 4
    /// query heads, part 2: 5 to 8) only for heads of other sizes than the
    /// tensor-core kernel's (part 0, with the combine), and part 2 only for
    /// such groups: compiling the scalar kernel beside the tensor-core one
    /// made its unit a first start's slowest.
    /// `matvec.cu`'s part 1 (`mmq_*`, short prompts) only for a format with
    /// such a kernel that the layers' matrices are stored in (it doubled
    /// the Q8_0 unit's compile time, and the reference model's Q8_0 matrix
    /// is its embedding, never multiplied by a prompt), its part 2
    /// (`mv1e_*`) only for the formats experts are stored in; `gemm.cu`'s
    /// part 1 (`gemm_few_*`) likewise only for the layers' formats, its part
    /// 2 (`gemm_moe_*`) only for the experts' (those with f16 tiles).
    pub fn part_needed(self, part: u8, format: Option<GgmlType>, set: &KernelSet<'_>) -> bool {
        match (self, part) {
            (_, 0) => true,
            (Module::AttentionSplit, _) => {
                !split_on_tensor_cores(set.head_dim) && (part == 1 || set.group > 4)
            }
            (Module::Matvec, 2) => format.is_none_or(|f| set.expert_formats.contains(&f)),
            (Module::Matvec, _) => {
                format.is_none_or(|f| has_mmq(f) && set.layer_formats.contains(&f))
            }
            (Module::GemmTc, 2) => {
                format.is_none_or(|f| set.expert_formats.contains(&f) && f16_tiles(f))
            }
            (Module::GemmTc, _) => format.is_none_or(|f| set.layer_formats.contains(&f)),
            _ => true,
        }
    }
}

/// Formats of small integers under a scale, whose GEMM is `gemm_tck_*`
/// (gemm.cu's `FOR_EACH_INT_TYPE`, `gemm_int_impl`); the others have
/// `gemm_tc_*`.
pub fn integer_gemm(t: GgmlType) -> bool {
    use GgmlType::*;
    matches!(t, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4K | Q5K | Q6K)
}

/// Formats whose blocks decode into f16 tiles (gemm.cu's `decode_f16`,
/// `FOR_EACH_F16_TILE_TYPE`): the integer ones and MXFP4, which have a
/// `gemm_moe_*`.
pub fn f16_tiles(t: GgmlType) -> bool {
    integer_gemm(t) || t == GgmlType::Mxfp4
}

/// `-DKV_TYPE`'s value for a quantized cache type (common.cuh).
fn kv_type_id(t: KvType) -> u8 {
    match t {
        KvType::F16 => 0,
        KvType::Q8_0 => 1,
        KvType::Q4_0 => 2,
    }
}

/// Formats with an `mmq_*` kernel (short prompts on the integer tensor
/// cores): those stored as int8 already.
pub fn has_mmq(t: GgmlType) -> bool {
    t == GgmlType::Q8_0
}

/// What a model needs compiled: the formats of its matrices, its head
/// size (which `attention_split.cu` and `attention_tc.cu` instances) and
/// its query heads per KV head (`attention_split.cu`'s part for groups of
/// 5 to 8 only where the model has them).
#[derive(Clone, Copy, Debug)]
pub struct KernelSet<'a> {
    pub formats: &'a [GgmlType],
    /// The formats of the layers' matrices (those a prompt's rows meet).
    pub layer_formats: &'a [GgmlType],
    /// The formats of a mixture of experts' 3-D expert matrices.
    pub expert_formats: &'a [GgmlType],
    pub head_dim: usize,
    pub group: usize,
    /// The KV cache's type (`-DKV_TYPE` of the modules that read or write it).
    pub kv_type: KvType,
}

/// Whether decode attention over a split context runs on tensor cores
/// (`attention_split_tc_*`) for heads of `head_dim` dims.
pub fn split_on_tensor_cores(head_dim: usize) -> bool {
    head_dim == 64 || head_dim == 128
}

/// The head-size class of `attention_split`'s instances (and
/// `attention_tc`'s): dims held per lane pair, 1 (up to 64), 2 (up to 128)
/// or 4 (up to 256).
pub fn head_pairs(head_dim: usize) -> u8 {
    match head_dim {
        0..=64 => 1,
        65..=128 => 2,
        _ => 4,
    }
}

/// One NVRTC compilation: a module, and for a per-format module the one
/// weight format it is built for (`None`: every format, one image); for a
/// per-head-size module, the one head-size class (`None`: every class); for
/// a module in [`Module::parts`], the one part (`None`: all of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Unit {
    pub module: Module,
    pub format: Option<GgmlType>,
    pub head_pairs: Option<u8>,
    pub part: Option<u8>,
    /// A quantized KV cache's type, for a module in [`Module::touches_kv`]
    /// (`None`: f16).
    pub kv: Option<KvType>,
}

impl Unit {
    /// Every module with every format, one image each.
    pub fn whole(module: Module) -> Unit {
        Unit {
            module,
            format: None,
            head_pairs: None,
            part: None,
            kv: None,
        }
    }

    /// The units a model needs: per-format modules for its formats,
    /// per-head-size modules for its head size only (most of their
    /// compile time is instances for other head sizes); `None`: every
    /// module whole.
    pub fn for_model(set: Option<KernelSet<'_>>) -> Vec<Unit> {
        let Some(set) = set else {
            return Module::ALL.into_iter().map(Unit::whole).collect();
        };
        let wanted = Unit::formats_compiled(set.formats);
        let mut units = Vec::new();
        for module in Module::ALL {
            let one = Unit {
                head_pairs: module.per_head_size().then(|| head_pairs(set.head_dim)),
                kv: Unit::kv_of(module, set.kv_type),
                ..Unit::whole(module)
            };
            let formats: Vec<Unit> = if module.per_format() {
                wanted
                    .iter()
                    .map(|&f| Unit {
                        format: Some(f),
                        ..one
                    })
                    .collect()
            } else {
                vec![one]
            };
            for u in formats {
                match module.parts() {
                    1 => units.push(u),
                    n => units.extend(
                        (0..n)
                            .filter(|&p| module.part_needed(p, u.format, &set))
                            .map(|p| Unit { part: Some(p), ..u }),
                    ),
                }
            }
        }
        units
    }

    /// The formats compiled for a model stored in `formats`: each once. F32
    /// only where a matrix is stored in it: the f32 vectors the worker keeps
    /// (norm weights, biases) are read by the norm and mat-vec kernels
    /// themselves, never multiplied as matrices (the F32 matmul unit was the
    /// slowest compile of a first start).
    pub fn formats_compiled(formats: &[GgmlType]) -> Vec<GgmlType> {
        let mut wanted = Vec::new();
        for &f in formats {
            if !wanted.contains(&f) {
                wanted.push(f);
            }
        }
        wanted
    }

    /// The KV type `module` is built for in a model whose cache is of
    /// `kv_type`: `None` for f16 (the default build) or a module that does
    /// not touch the cache.
    pub fn kv_of(module: Module, kv_type: KvType) -> Option<KvType> {
        (module.touches_kv() && kv_type != KvType::F16).then_some(kv_type)
    }

    /// The `-D` options that select the unit's format (dequant.cuh),
    /// head-size class (attention.cuh) or KV type (common.cuh).
    pub fn defines(self) -> Vec<String> {
        let mut v = Vec::new();
        if let Some(f) = self.format {
            v.push(format!(
                "-DONE_FORMAT_NAME={}",
                f.name().to_ascii_lowercase()
            ));
            v.push(format!("-DONE_FORMAT_ID=T_{}", f.name()));
        }
        if let Some(p) = self.head_pairs {
            v.push(format!("-DONE_HEAD_PAIRS={p}"));
        }
        if let Some(p) = self.part {
            v.push(format!("-DONE_PART={p}"));
        }
        if let Some(t) = self.kv {
            v.push(format!("-DKV_TYPE={}", kv_type_id(t)));
        }
        v
    }

    /// `matmul.cu`, `matmul.cu [q4_k]` for one format, `attention_tc.cu
    /// [heads <= 128]` for one head-size class, `sample.cu [part 1]`
    /// (messages).
    pub fn label(self) -> String {
        let mut label = self.module.file_name().to_string();
        if let Some(f) = self.format {
            label += &format!(" [{}]", f.name().to_ascii_lowercase());
        }
        if let Some(p) = self.head_pairs {
            label += &format!(" [heads <= {}]", 64 * p as usize);
        }
        if let Some(p) = self.part {
            label += &format!(" [part {p}]");
        }
        if let Some(t) = self.kv {
            label += &format!(" [kv {t}]");
        }
        label
    }

    /// The cache file's stem: `matmul`, `matmul-q4_k-p1`,
    /// `attention_tc-h128`.
    pub fn stem(self) -> String {
        let mut stem = self.module.file_name().trim_end_matches(".cu").to_string();
        if let Some(f) = self.format {
            stem += &format!("-{}", f.name().to_ascii_lowercase());
        }
        if let Some(p) = self.head_pairs {
            stem += &format!("-h{}", 64 * p as usize);
        }
        if let Some(p) = self.part {
            stem += &format!("-p{p}");
        }
        if let Some(t) = self.kv {
            stem += &format!("-k{t}");
        }
        stem
    }

    /// The unit named by its [`Unit::stem`] (how a compile helper process
    /// is told which unit to compile).
    pub fn from_stem(stem: &str) -> Option<Unit> {
        let mut parts = stem.split('-');
        let file = format!("{}.cu", parts.next()?);
        let module = Module::ALL.into_iter().find(|m| m.file_name() == file)?;
        let mut unit = Unit::whole(module);
        for p in parts {
            if let Some(h) = p.strip_prefix('h') {
                unit.head_pairs = Some(u8::try_from(h.parse::<usize>().ok()? / 64).ok()?);
            } else if let Some(n) = p.strip_prefix('p') {
                unit.part = Some(n.parse().ok()?);
            } else if let Some(t) = p.strip_prefix('k') {
                unit.kv = Some(t.parse().ok()?);
            } else {
                unit.format = Some(GgmlType::from_name(p)?);
            }
        }
        (unit.stem() == stem).then_some(unit)
    }
}
