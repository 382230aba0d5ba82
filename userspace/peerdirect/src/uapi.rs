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

const _: () = {
    use core::mem::size_of;
    assert!(PEERDIRECT_INFO_SIZE_VER1 as usize == size_of::<peerdirect_info>());
    assert!(PEERDIRECT_ALLOC_SIZE_VER0 as usize == size_of::<peerdirect_alloc>());
    assert!(PEERDIRECT_FREE_SIZE_VER0 as usize == size_of::<peerdirect_free>());
    assert!(PEERDIRECT_EXPORT_SIZE_VER0 as usize == size_of::<peerdirect_export>());
    assert!(PEERDIRECT_COMPANION_SIZE_VER0 as usize == size_of::<peerdirect_companion>());
    assert!(PEERDIRECT_EXPORT_RANGE_SIZE_VER0 as usize == size_of::<peerdirect_export_range>());
    assert!(PEERDIRECT_STATUS_SIZE_VER0 as usize == size_of::<peerdirect_status>());
};

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

/// `PEERDIRECT_IOC_ALLOC`, argument `*mut struct peerdirect_alloc`.
pub const PEERDIRECT_IOC_ALLOC: Opcode = command(ioctl_byte(PEERDIRECT_CMD_ALLOC));

/// `PEERDIRECT_IOC_FREE`, argument `*mut struct peerdirect_free`.
pub const PEERDIRECT_IOC_FREE: Opcode = command(ioctl_byte(PEERDIRECT_CMD_FREE));

/// `PEERDIRECT_IOC_EXPORT`, argument `*mut struct peerdirect_export`.
pub const PEERDIRECT_IOC_EXPORT: Opcode = command(ioctl_byte(PEERDIRECT_CMD_EXPORT));

/// `PEERDIRECT_IOC_P2P`, argument `*mut struct peerdirect_p2p`.
pub const PEERDIRECT_IOC_P2P: Opcode = command(ioctl_byte(PEERDIRECT_CMD_P2P));

/// `PEERDIRECT_DEVICE_PREFIX` without its NUL: device nodes are `/dev/peerdirectN`.
pub const DEVICE_PREFIX: &str = match PEERDIRECT_DEVICE_PREFIX.as_slice().split_last() {
    Some((0, name)) => match core::str::from_utf8(name) {
        Ok(name) => name,
        Err(_) => panic!("PEERDIRECT_DEVICE_PREFIX is not UTF-8"),
    },
    _ => panic!("PEERDIRECT_DEVICE_PREFIX is not NUL-terminated"),
};

// What peerdirect's users need of DMA-BUF's own uapi, linux/dma-buf.h (the layout test checks
// these against the system's header).

/// `struct dma_buf_sync`: the argument of [`DMA_BUF_IOCTL_SYNC`].
#[repr(C)]
#[derive(Debug, Default, Copy, Clone)]
pub struct dma_buf_sync {
    /// `DMA_BUF_SYNC_*`.
    pub flags: u64,
}

/// `DMA_BUF_SYNC_READ`: the CPU reads.
pub const DMA_BUF_SYNC_READ: u64 = 1 << 0;
/// `DMA_BUF_SYNC_WRITE`: the CPU writes.
pub const DMA_BUF_SYNC_WRITE: u64 = 2 << 0;
/// `DMA_BUF_SYNC_START`: CPU access begins.
pub const DMA_BUF_SYNC_START: u64 = 0 << 2;
/// `DMA_BUF_SYNC_END`: CPU access ends.
pub const DMA_BUF_SYNC_END: u64 = 1 << 2;

/// `DMA_BUF_NAME_LEN`: a dma-buf name's bytes, its NUL included.
pub const DMA_BUF_NAME_LEN: usize = 32;

/// `'b'`, DMA-BUF's ioctl type.
const DMA_BUF_BASE: u8 = b'b';

/// `DMA_BUF_IOCTL_SYNC`, `_IOW('b', 0, struct dma_buf_sync)`.
pub const DMA_BUF_IOCTL_SYNC: Opcode = opcode::write::<dma_buf_sync>(DMA_BUF_BASE, 0);

/// `DMA_BUF_SET_NAME`, `_IOW('b', 1, const char *)`; the argument is the string itself.
pub const DMA_BUF_SET_NAME: Opcode = opcode::write::<*const core::ffi::c_char>(DMA_BUF_BASE, 1);

/// `PEERDIRECT_IOC_EXPORT_RANGE` (companion devices), argument
/// `*mut struct peerdirect_export_range`.
pub const PEERDIRECT_IOC_EXPORT_RANGE: Opcode = command(ioctl_byte(PEERDIRECT_CMD_EXPORT_RANGE));

/// `PEERDIRECT_IOC_COMPANION_ADD` (control device), argument `*mut struct peerdirect_companion`.
pub const PEERDIRECT_IOC_COMPANION_ADD: Opcode = command(ioctl_byte(PEERDIRECT_CMD_COMPANION_ADD));

/// `PEERDIRECT_IOC_COMPANION_REMOVE` (control device), argument
/// `*mut struct peerdirect_companion`.
pub const PEERDIRECT_IOC_COMPANION_REMOVE: Opcode =
    command(ioctl_byte(PEERDIRECT_CMD_COMPANION_REMOVE));

/// `PEERDIRECT_IOC_COMPANION_RESET_PREPARE` (control device), argument
/// `*mut struct peerdirect_companion`.
pub const PEERDIRECT_IOC_COMPANION_RESET_PREPARE: Opcode =
    command(ioctl_byte(PEERDIRECT_CMD_COMPANION_RESET_PREPARE));

/// `PEERDIRECT_IOC_COMPANION_RESET_DONE` (control device), argument
/// `*mut struct peerdirect_companion`.
pub const PEERDIRECT_IOC_COMPANION_RESET_DONE: Opcode =
    command(ioctl_byte(PEERDIRECT_CMD_COMPANION_RESET_DONE));

/// `PEERDIRECT_CONTROL_DEVICE` without its NUL: the control device is `/dev/peerdirect-ctl`.
pub const CONTROL_DEVICE: &str = match PEERDIRECT_CONTROL_DEVICE.as_slice().split_last() {
    Some((0, name)) => match core::str::from_utf8(name) {
        Ok(name) => name,
        Err(_) => panic!("PEERDIRECT_CONTROL_DEVICE is not UTF-8"),
    },
    _ => panic!("PEERDIRECT_CONTROL_DEVICE is not NUL-terminated"),
};
