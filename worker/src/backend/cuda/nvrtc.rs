//! Run-time compilation of the `cuda/*.cu` kernel modules (M0-W-1702).
//!
//! Each compile unit (a module, or a per-format module for one format: see
//! `source::Unit`) is compiled by NVRTC (loaded at run time through cudarc) for
//! the device's real architecture (`--gpu-architecture=sm_XY`), giving CUBIN
//! machine code that the driver loads without a JIT step. The shared headers
//! (`cuda/*.cuh`) are handed to NVRTC as in-memory headers, so `#include
//! "common.cuh"` works without an include path.
//!
//! Compiled CUBIN is cached on disk, keyed by a SHA-256 of the module's
//! source and headers, the options (the unit's format among them) (the shared constants' `-D` defines among
//! them, see `source.rs`), the NVRTC version and the architecture:
//! `$WORKER_ORCD_KERNEL_CACHE`, else `$XDG_CACHE_HOME/worker-orcd/kernels`,
//! else `~/.cache/worker-orcd/kernels`. `WORKER_ORCD_KERNEL_CACHE=off`
//! disables it. A cache that cannot be read or written only costs a compile.

use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::nvrtc::sys as nv;
use sha2::{Digest, Sha256};

use crate::backend::cuda::source::{defines, Unit, HEADERS};
use crate::backend::BackendError;

/// Environment variable naming the kernel cache folder (`off` disables it).
pub const KERNEL_CACHE_ENV: &str = "WORKER_ORCD_KERNEL_CACHE";

/// Whether the NVRTC library can be loaded on this machine.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to open the shared library.
    unsafe { nv::is_culib_present() }
}

/// NVRTC's version, `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32), BackendError> {
    ensure_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints.
    check(
        unsafe { nv::nvrtcVersion(&mut major, &mut minor) },
        "nvrtcVersion",
    )?;
    Ok((major, minor))
}

fn ensure_nvrtc() -> Result<(), BackendError> {
    if nvrtc_available() {
        Ok(())
    } else {
        Err(BackendError::Compile(
            "the NVRTC library (libnvrtc) could not be loaded; put CUDA's lib64 folder on LD_LIBRARY_PATH".into(),
        ))
    }
}

fn check(r: nv::nvrtcResult, what: &str) -> Result<(), BackendError> {
    if r == nv::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(BackendError::Compile(format!("{what} failed: {r:?}")))
    }
}

/// The options every module is compiled with, for architecture `arch`: the
/// target, the language, the constants shared with the host, and
/// `--split-compile=0`: NVRTC optimizes a module's kernels on as many
/// threads as the machine has, which more than halved the first start's
/// slowest module (`benches/results/kernel-choices.md`).
pub fn options(arch: (i32, i32)) -> Vec<String> {
    let mut opts = vec![
        format!("--gpu-architecture=sm_{}{}", arch.0, arch.1),
        "--std=c++17".into(),
        "--split-compile=0".into(),
    ];
    opts.extend(defines());
    opts
}

/// Compiles `source` (named `name` in messages) with the shared headers to
/// CUBIN for compute capability `arch`. A compile error is a
/// `Compile` error carrying NVRTC's log.
pub fn compile_source(name: &str, source: &str, arch: (i32, i32)) -> Result<Vec<u8>, BackendError> {
    compile_with(name, source, arch, &[])
}

/// [`compile_source`] with `extra` options after the shared ones.
fn compile_with(
    name: &str,
    source: &str,
    arch: (i32, i32),
    extra: &[String],
) -> Result<Vec<u8>, BackendError> {
    ensure_nvrtc()?;
    let src = CString::new(source)
        .map_err(|_| BackendError::Compile(format!("{name} holds a NUL byte")))?;
    let cname = CString::new(name).expect("module names hold no NUL");
    let header_srcs: Vec<CString> = HEADERS
        .iter()
        .map(|(_, s)| CString::new(*s).expect("headers hold no NUL"))
        .collect();
    let header_names: Vec<CString> = HEADERS
        .iter()
        .map(|(n, _)| CString::new(*n).expect("names hold no NUL"))
        .collect();
    let header_src_ptrs: Vec<*const c_char> = header_srcs.iter().map(|s| s.as_ptr()).collect();
    let header_name_ptrs: Vec<*const c_char> = header_names.iter().map(|s| s.as_ptr()).collect();

    let mut prog: nv::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer is to a NUL-terminated string that outlives the program.
    check(
        unsafe {
            nv::nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                HEADERS.len() as i32,
                header_src_ptrs.as_ptr(),
                header_name_ptrs.as_ptr(),
            )
        },
        "nvrtcCreateProgram",
    )?;
    let result = compile_program(prog, name, arch, extra);
    // SAFETY: `prog` was created above and is destroyed once.
    unsafe { nv::nvrtcDestroyProgram(&mut prog) };
    result
}

fn compile_program(
    prog: nv::nvrtcProgram,
    name: &str,
    arch: (i32, i32),
    extra: &[String],
) -> Result<Vec<u8>, BackendError> {
    let opts: Vec<CString> = options(arch)
        .into_iter()
        .chain(extra.iter().cloned())
        .map(|o| CString::new(o).expect("no NUL"))
        .collect();
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: `prog` is a live program; options are NUL-terminated strings.
    let r = unsafe { nv::nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
    if r != nv::nvrtcResult::NVRTC_SUCCESS {
        let log = program_log(prog).unwrap_or_else(|e| format!("(no log: {e})"));
        return Err(BackendError::Compile(format!(
            "NVRTC could not compile {name} for sm_{}{} ({r:?}):\n{log}",
            arch.0, arch.1
        )));
    }
    let mut size = 0usize;
    // SAFETY: `prog` compiled successfully; the buffer has the reported size.
    check(
        unsafe { nv::nvrtcGetCUBINSize(prog, &mut size) },
        "nvrtcGetCUBINSize",
    )?;
    let mut cubin = vec![0u8; size];
    check(
        unsafe { nv::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut c_char) },
        "nvrtcGetCUBIN",
    )?;
    if cubin.is_empty() {
        return Err(BackendError::Compile(format!(
            "NVRTC produced no CUBIN for {name}"
        )));
    }
    Ok(cubin)
}

fn program_log(prog: nv::nvrtcProgram) -> Result<String, BackendError> {
    let mut size = 0usize;
    // SAFETY: `prog` is live; the buffer has the reported size.
    check(
        unsafe { nv::nvrtcGetProgramLogSize(prog, &mut size) },
        "nvrtcGetProgramLogSize",
    )?;
    let mut log = vec![0u8; size.max(1)];
    check(
        unsafe { nv::nvrtcGetProgramLog(prog, log.as_mut_ptr() as *mut c_char) },
        "nvrtcGetProgramLog",
    )?;
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    Ok(String::from_utf8_lossy(&log[..end]).into_owned())
}

/// Compiles one of the worker's units for `arch`.
pub fn compile_unit(unit: Unit, arch: (i32, i32)) -> Result<Vec<u8>, BackendError> {
    match COMPILE_HELPER.get() {
        Some(exe) => compile_in_helper(exe, unit, arch),
        None => compile_here(unit, arch),
    }
}

/// [`compile_unit`] in this process.
pub fn compile_here(unit: Unit, arch: (i32, i32)) -> Result<Vec<u8>, BackendError> {
    compile_with(&unit.label(), unit.module.source(), arch, &unit.defines())
}

/// The executable whose `compile-unit` command [`compile_unit`] runs, one
/// process a unit, when set by [`compile_in_processes`].
static COMPILE_HELPER: OnceLock<PathBuf> = OnceLock::new();

/// `0` compiles every unit on a thread of the worker itself.
pub const NVRTC_PROCESSES_ENV: &str = "WORKER_ORCD_NVRTC_PROCESSES";

/// Makes [`compile_unit`] run `exe compile-unit STEM ARCH` (the worker's
/// own binary) for each unit, unless [`NVRTC_PROCESSES_ENV`] is `0`.
/// Parallel compiles in one process share NVRTC's locks: together they
/// took several times the slowest unit alone
/// (`benches/results/kernel-choices.md`); in processes of their own they
/// do not wait for each other.
pub fn compile_in_processes(exe: PathBuf) {
    if std::env::var(NVRTC_PROCESSES_ENV).map_or(true, |v| v != "0") {
        let _ = COMPILE_HELPER.set(exe);
    }
}

fn compile_in_helper(exe: &Path, unit: Unit, arch: (i32, i32)) -> Result<Vec<u8>, BackendError> {
    let failed = |why: String| {
        BackendError::Compile(format!(
            "compiling {} in a helper process: {why}",
            unit.label()
        ))
    };
    let out = std::process::Command::new(exe)
        .arg("compile-unit")
        .arg(unit.stem())
        .arg(format!("{}{}", arch.0, arch.1))
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| failed(format!("{} did not start: {e}", exe.display())))?;
    if out.status.success() && !out.stdout.is_empty() {
        Ok(out.stdout)
    } else {
        Err(failed(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    }
}

/// What a cached image depends on, hashed: the module's source, every
/// header, the compile options (architecture and shared-constant defines)
/// and the NVRTC version. The first 8 bytes of the SHA-256, in hex.
pub fn cache_key(unit: Unit, options: &[String], nvrtc: (i32, i32)) -> String {
    let mut h = Sha256::new();
    h.update(unit.module.file_name());
    h.update([0]);
    h.update(unit.module.source());
    for (name, src) in HEADERS {
        h.update([0]);
        h.update(name);
        h.update([0]);
        h.update(src);
    }
    for o in options.iter().chain(&unit.defines()) {
        h.update([0]);
        h.update(o);
    }
    h.update(format!("\0nvrtc {}.{}", nvrtc.0, nvrtc.1));
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The on-disk CUBIN cache.
pub struct KernelCache {
    dir: Option<PathBuf>,
}

impl KernelCache {
    /// The cache folder from the environment (see the module docs).
    pub fn from_env() -> Self {
        let dir = match std::env::var_os(KERNEL_CACHE_ENV) {
            Some(v) if v == "off" => None,
            Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
            _ => std::env::var_os("XDG_CACHE_HOME")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
                .map(|base| base.join("worker-orcd").join("kernels")),
        };
        KernelCache { dir }
    }

    pub fn at(dir: Option<PathBuf>) -> Self {
        KernelCache { dir }
    }

    /// The file a unit's CUBIN for `arch` is cached in.
    pub fn path_for(&self, unit: Unit, arch: (i32, i32)) -> Result<Option<PathBuf>, BackendError> {
        let Some(dir) = &self.dir else {
            return Ok(None);
        };
        let hex = cache_key(unit, &options(arch), nvrtc_version()?);
        let stem = unit.stem();
        Ok(Some(dir.join(format!(
            "{stem}-sm{}{}-{hex}.cubin",
            arch.0, arch.1
        ))))
    }

    /// The cached CUBIN, if present and readable.
    pub fn get(&self, unit: Unit, arch: (i32, i32)) -> Result<Option<Vec<u8>>, BackendError> {
        Ok(self
            .path_for(unit, arch)?
            .and_then(|p| std::fs::read(p).ok())
            .filter(|b| !b.is_empty()))
    }

    /// Stores CUBIN (write to a temporary file, then rename). Failures are
    /// logged and otherwise ignored.
    pub fn put(&self, unit: Unit, arch: (i32, i32), cubin: &[u8]) {
        let Ok(Some(path)) = self.path_for(unit, arch) else {
            return;
        };
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, cubin)?;
            std::fs::rename(&tmp, &path)
        };
        if let Err(e) = write() {
            tracing::warn!(path = %path.display(), error = %e, "could not cache compiled kernels");
        }
    }

    /// The cached CUBIN, or a fresh compile (then cached). The flag says
    /// whether it came from the cache.
    pub fn load_or_compile(
        &self,
        unit: Unit,
        arch: (i32, i32),
    ) -> Result<(Vec<u8>, bool), BackendError> {
        if let Some(cubin) = self.get(unit, arch)? {
            return Ok((cubin, true));
        }
        let cubin = compile_unit(unit, arch)?;
        self.put(unit, arch, &cubin);
        Ok((cubin, false))
    }
}
