//! Typed device pointers for kernel arguments.
//!
//! A kernel parameter `const float*` is a [`DevPtr<f32>`], a `float*` a
//! [`DevPtrMut<f32>`]; the f16 KV cache is `DevPtr<f16>` / `DevPtrMut<f16>`
//! (`u16*` in CUDA), stored weights `DevPtr<u8>`. So an f16 cache cannot
//! be passed where an f32 activation is wanted, nor an input where the
//! kernel writes. Both are the bare 64-bit address on the wire
//! (`#[repr(transparent)]`), pushed to the kernel as cudarc pushes a `u64`.
//! A null pointer exists only for optional parameters ([`DevPtr::or_null`]).

use std::fmt;
use std::marker::PhantomData;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::DeviceRepr;
use half::f16;

/// An element type a kernel reads or writes, with its name in the kernels'
/// C (`common.cuh` typedefs), for checking launchers against the sources.
pub trait Elem: Copy {
    #[cfg(test)]
    const C_NAME: &'static str;
}

macro_rules! elem {
    ($($t:ty => $c:literal),*) => {
        $(impl Elem for $t {
            #[cfg(test)]
            const C_NAME: &'static str = $c;
        })*
    };
}

// `u8`: stored weight bytes (any GGUF format); `i8`: x split for the
// integer mat-vec (`quantize_x8`); `f16`: the KV cache's half
// floats, which the kernels handle as raw `u16` bits.
elem!(f32 => "float", f64 => "double", i32 => "int", u32 => "u32", u64 => "u64", u8 => "u8", i8 => "i8", f16 => "u16");

/// A device address of `T` values the kernel only reads (`const T*`).
#[repr(transparent)]
pub struct DevPtr<T> {
    addr: CUdeviceptr,
    _elem: PhantomData<fn() -> T>,
}

/// A device address of `T` values the kernel writes (`T*`).
#[repr(transparent)]
pub struct DevPtrMut<T> {
    addr: CUdeviceptr,
    _elem: PhantomData<fn() -> T>,
}

macro_rules! pointer_common {
    ($ty:ident) => {
        impl<T> $ty<T> {
            /// The pointer to `T` values at `addr` (a device address the caller
            /// vouches holds them; a launch reads or writes through it).
            pub fn new(addr: CUdeviceptr) -> Self {
                $ty {
                    addr,
                    _elem: PhantomData,
                }
            }

            pub fn addr(self) -> CUdeviceptr {
                self.addr
            }

            /// The address `elems` values of `T` further on.
            pub fn offset(self, elems: usize) -> Self {
                Self::new(self.addr + (elems * std::mem::size_of::<T>()) as u64)
            }
        }

        impl<T> Clone for $ty<T> {
            fn clone(&self) -> Self {
                *self
            }
        }

        impl<T> Copy for $ty<T> {}

        impl<T> fmt::Debug for $ty<T> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(
                    f,
                    "{}<{}>({:#x})",
                    stringify!($ty),
                    std::any::type_name::<T>(),
                    self.addr
                )
            }
        }

        // SAFETY: `#[repr(transparent)]` over a `u64` device address, which is
        // what a pointer parameter of a kernel receives.
        unsafe impl<T> DeviceRepr for $ty<T> {}
    };
}

pointer_common!(DevPtr);
pointer_common!(DevPtrMut);

impl<T> DevPtr<T> {
    /// `p`, or null for an optional parameter left out.
    pub fn or_null(p: Option<Self>) -> Self {
        p.unwrap_or(Self::new(0))
    }
}

impl<T> DevPtrMut<T> {
    /// `p`, or null for an optional output left out.
    pub fn or_null(p: Option<Self>) -> Self {
        p.unwrap_or(Self::new(0))
    }
}

impl<T> DevPtrMut<T> {
    /// The same memory, read only.
    pub fn as_const(self) -> DevPtr<T> {
        DevPtr::new(self.addr)
    }
}

/// One kernel parameter: a value pushed by cudarc, with its C type.
pub trait Param: DeviceRepr {
    #[cfg(test)]
    fn c_type() -> String;
}

impl<T: Elem> Param for DevPtr<T> {
    #[cfg(test)]
    fn c_type() -> String {
        format!("const {}*", T::C_NAME)
    }
}

impl<T: Elem> Param for DevPtrMut<T> {
    #[cfg(test)]
    fn c_type() -> String {
        format!("{}*", T::C_NAME)
    }
}

macro_rules! scalar_param {
    ($($t:ty => $c:literal),*) => {
        $(impl Param for $t {
            #[cfg(test)]
            fn c_type() -> String {
                $c.into()
            }
        })*
    };
}

scalar_param!(i32 => "int", i64 => "i64", u32 => "u32", f32 => "float", f64 => "double");
