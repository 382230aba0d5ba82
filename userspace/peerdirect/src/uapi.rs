//! The kernel ABI, as bindgen derives it from `include/uapi/peerdirect.h` (scripts/gen-uapi),
//! plus the values bindgen cannot expand.

#![allow(
    non_camel_case_types,
    non_upper_case_globals,
    missing_docs,
    clippy::unnecessary_operation,
    clippy::identity_op
)]

use rustix::ioctl::{opcode, Opcode};

include!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../include/uapi/peerdirect_uapi.rs"
));

const _: () =
    assert!(PEERDIRECT_INFO_SIZE_VER0 as usize == core::mem::size_of::<peerdirect_info>());

/// A type or command number of the header (a `u32` for bindgen) as the byte `_IO` takes;
/// evaluated at compile time, so a number that does not fit fails the build.
const fn ioctl_byte(value: u32) -> u8 {
    assert!(value <= 0xff, "ioctl type and command numbers are bytes");
    value as u8
}

/// `_IO(PEERDIRECT_IOCTL_TYPE, nr)`: every peerdirect command is encoded this way.
pub const fn command(nr: u8) -> Opcode {
    opcode::none(ioctl_byte(PEERDIRECT_IOCTL_TYPE), nr)
}

/// `PEERDIRECT_IOC_INFO`, argument `*mut struct peerdirect_info`.
pub const PEERDIRECT_IOC_INFO: Opcode = command(ioctl_byte(PEERDIRECT_CMD_INFO));

/// `PEERDIRECT_DEVICE_PREFIX` without its NUL: device nodes are `/dev/peerdirectN`.
pub const DEVICE_PREFIX: &str = match PEERDIRECT_DEVICE_PREFIX.as_slice().split_last() {
    Some((0, name)) => match core::str::from_utf8(name) {
        Ok(name) => name,
        Err(_) => panic!("PEERDIRECT_DEVICE_PREFIX is not UTF-8"),
    },
    _ => panic!("PEERDIRECT_DEVICE_PREFIX is not NUL-terminated"),
};
