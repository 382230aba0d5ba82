// SPDX-License-Identifier: GPL-2.0

//! Plain data: [`plain_struct!`] implements the kernel's `FromBytes` and `AsBytes` for a
//! `repr(C)` struct after proving, at build time, what they require: every field is itself
//! `FromBytes` and `AsBytes`, and the fields, listed in order, cover the struct from its first
//! byte to its last with no gap (so it has no padding).

use kernel::transmute::{AsBytes, FromBytes};

/// The size of the field `_field` points to, which must be plain data (a bound the build
/// checks).
#[doc(hidden)]
// Used in `plain_struct!`'s `const _`, which rustc 1.85's dead-code lint does not count.
#[allow(dead_code)]
pub(crate) const fn plain_field_size<F: FromBytes + AsBytes>(_field: *const F) -> usize {
    core::mem::size_of::<F>()
}

/// `plain_struct!(TYPE { FIELD, ... })`: every field of the `repr(C)` struct `TYPE`, in the
/// order of its declaration. The build fails if a field is missing, repeated or out of order,
/// if there is a gap before a field or after the last, or if a field is not plain data.
macro_rules! plain_struct {
    ($ty:ty { $($field:ident),+ $(,)? }) => {
        const _: () = {
            let value = ::core::mem::MaybeUninit::<$ty>::uninit();
            let base = value.as_ptr();
            let mut end = 0usize;
            $(
                assert!(
                    ::core::mem::offset_of!($ty, $field) == end,
                    ::core::concat!(
                        ::core::stringify!($ty), ".", ::core::stringify!($field),
                        " does not start where the field before it ends"
                    )
                );
                // SAFETY: `base` points to a `MaybeUninit` of the struct, alive for this
                // block; taking a field's address (`addr_of!`) reads and references nothing.
                end += $crate::sys::plain::plain_field_size(unsafe {
                    ::core::ptr::addr_of!((*base).$field)
                });
            )+
            assert!(
                end == ::core::mem::size_of::<$ty>(),
                ::core::concat!(::core::stringify!($ty), " has bytes after its last field")
            );
        };
        // SAFETY: proven above at build time: the fields cover every byte of the struct, and
        // each is `FromBytes`, valid for any bit pattern; so is the struct.
        unsafe impl ::kernel::transmute::FromBytes for $ty {}
        // SAFETY: as above: no padding, every byte belongs to a field that is `AsBytes`, so
        // every byte of the struct is initialized.
        unsafe impl ::kernel::transmute::AsBytes for $ty {}
    };
}
pub(crate) use plain_struct;
