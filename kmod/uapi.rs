// SPDX-License-Identifier: GPL-2.0

//! The ABI, derived from `include/uapi/peerdirect.h` (never written by hand here), and the
//! iommufd-style handling of its extensible request structs.

use kernel::{
    ioctl::_IO,
    page::PAGE_SIZE,
    prelude::*,
    transmute::{AsBytes, FromBytes},
    uaccess::{UserPtr, UserSlice},
};

#[allow(
    dead_code,
    non_camel_case_types,
    non_upper_case_globals,
    unreachable_pub,
    clippy::all,
    clippy::pedantic
)]
mod generated {
    include!("../include/uapi/peerdirect_uapi.rs");
}

pub(crate) use generated::{
    peerdirect_alloc, peerdirect_companion, peerdirect_export, peerdirect_export_range,
    peerdirect_free, peerdirect_info, peerdirect_p2p, peerdirect_status,
    PEERDIRECT_ALLOC_ALIGN_DEFAULT, PEERDIRECT_COMPANION_BAR_DEFAULT, PEERDIRECT_DRIVER_NAME_LEN,
    PEERDIRECT_EXPORT_CLOEXEC, PEERDIRECT_EXPORT_RDWR, PEERDIRECT_P2P_ACS_REDIRECT,
    PEERDIRECT_P2P_COMMON_BRIDGE, PEERDIRECT_P2P_PEER_IOMMU, PEERDIRECT_P2P_SAME_HOST_BRIDGE,
    PEERDIRECT_PROVIDER_COMPANION, PEERDIRECT_PROVIDER_OWNED, PEERDIRECT_STATUS_OFFSET,
    PEERDIRECT_STATUS_REVOKED, PEERDIRECT_STATUS_SIZE_VER0, PEERDIRECT_STATUS_VERSION,
};

pub(crate) const PEERDIRECT_IOC_INFO: u32 = _IO(
    generated::PEERDIRECT_IOCTL_TYPE,
    generated::PEERDIRECT_CMD_INFO,
);
pub(crate) const PEERDIRECT_IOC_ALLOC: u32 = _IO(
    generated::PEERDIRECT_IOCTL_TYPE,
    generated::PEERDIRECT_CMD_ALLOC,
);
pub(crate) const PEERDIRECT_IOC_FREE: u32 = _IO(
    generated::PEERDIRECT_IOCTL_TYPE,
    generated::PEERDIRECT_CMD_FREE,
);
pub(crate) const PEERDIRECT_IOC_EXPORT: u32 = _IO(
    generated::PEERDIRECT_IOCTL_TYPE,
    generated::PEERDIRECT_CMD_EXPORT,
);
pub(crate) const PEERDIRECT_IOC_P2P: u32 = _IO(
    generated::PEERDIRECT_IOCTL_TYPE,
    generated::PEERDIRECT_CMD_P2P,
);
pub(crate) const PEERDIRECT_IOC_EXPORT_RANGE: u32 = _IO(
    generated::PEERDIRECT_IOCTL_TYPE,
    generated::PEERDIRECT_CMD_EXPORT_RANGE,
);
pub(crate) const PEERDIRECT_IOC_COMPANION_ADD: u32 = _IO(
    generated::PEERDIRECT_IOCTL_TYPE,
    generated::PEERDIRECT_CMD_COMPANION_ADD,
);
pub(crate) const PEERDIRECT_IOC_COMPANION_REMOVE: u32 = _IO(
    generated::PEERDIRECT_IOCTL_TYPE,
    generated::PEERDIRECT_CMD_COMPANION_REMOVE,
);
pub(crate) const PEERDIRECT_IOC_COMPANION_RESET_PREPARE: u32 = _IO(
    generated::PEERDIRECT_IOCTL_TYPE,
    generated::PEERDIRECT_CMD_COMPANION_RESET_PREPARE,
);
pub(crate) const PEERDIRECT_IOC_COMPANION_RESET_DONE: u32 = _IO(
    generated::PEERDIRECT_IOCTL_TYPE,
    generated::PEERDIRECT_CMD_COMPANION_RESET_DONE,
);

/// A request struct that grows only at its end and starts with its `__u32 size`.
pub(crate) trait ExtensibleStruct: FromBytes + AsBytes + Default {
    /// Size of the struct's first version: the smallest a caller may send.
    const SIZE_VER0: usize;
    /// Records how many bytes the kernel filled, for the caller to read back.
    fn set_size(&mut self, size: u32);
}

/// Each request struct, with every field in order (`plain_struct!` proves the list complete:
/// the build fails otherwise).
macro_rules! extensible_struct {
    ($($ty:ident => $ver0:ident { $($field:ident),+ $(,)? }),* $(,)?) => {$(
        crate::sys::plain::plain_struct!($ty { $($field),+ });

        impl ExtensibleStruct for $ty {
            const SIZE_VER0: usize = generated::$ver0 as usize;

            fn set_size(&mut self, size: u32) {
                self.size = size;
            }
        }
    )*};
}

extensible_struct! {
    peerdirect_info => PEERDIRECT_INFO_SIZE_VER0 {
        size, flags, hbm_bytes, hbm_bus_addr, hbm_phys_addr, bar_index, numa_node, pci_domain, pci_bus, pci_slot, pci_func, __reserved0, vendor_id, device_id, index, provider, __reserved1, driver
    },
    peerdirect_alloc => PEERDIRECT_ALLOC_SIZE_VER0 {
        size, flags, length, align, handle, __reserved0, hbm_offset
    },
    peerdirect_free => PEERDIRECT_FREE_SIZE_VER0 {
        size, flags, handle, __reserved0
    },
    peerdirect_export => PEERDIRECT_EXPORT_SIZE_VER0 {
        size, flags, handle, fd, offset, length
    },
    peerdirect_p2p => PEERDIRECT_P2P_SIZE_VER0 {
        size, flags, pci_domain, pci_bus, pci_slot, pci_func, __reserved0, distance, path, common_bridge, acs_bridge, acs_bridges, __reserved1, host_bridge_vendor, host_bridge_device, __reserved2
    },
    peerdirect_companion => PEERDIRECT_COMPANION_SIZE_VER0 {
        size, flags, pci_domain, pci_bus, pci_slot, pci_func, bar, index, __reserved0
    },
    peerdirect_export_range => PEERDIRECT_EXPORT_RANGE_SIZE_VER0 {
        size, flags, bar_offset, length, fd, __reserved0
    },
}

/// Larger requests are refused outright, so a caller cannot make us scan megabytes of zeros.
const MAX_REQUEST_SIZE: usize = PAGE_SIZE;

/// How many bytes of a caller's `user_size`-byte struct we exchange, given our struct of
/// `ksize` bytes whose first version has `ver0` bytes: `EINVAL` below `ver0`, `E2BIG` above
/// [`MAX_REQUEST_SIZE`].
pub(crate) fn request_len(user_size: u32, ver0: usize, ksize: usize) -> Result<usize> {
    let user_size = usize::try_from(user_size).map_err(|_| E2BIG)?;
    if user_size < ver0 {
        return Err(EINVAL);
    }
    if user_size > MAX_REQUEST_SIZE {
        return Err(E2BIG);
    }
    Ok(user_size.min(ksize))
}

/// A request struct read from the caller, to be answered in place.
pub(crate) struct Request<T: ExtensibleStruct> {
    pub(crate) value: T,
    user: UserPtr,
    len: usize,
}

impl<T: ExtensibleStruct> Request<T> {
    /// Reads the struct at `arg`: its `size` first, then what we know of it; bytes past our
    /// struct must be zero (`E2BIG` otherwise), as `copy_struct_from_user` does.
    pub(crate) fn read(arg: usize) -> Result<Self> {
        let user = UserPtr::from_addr(arg);
        let user_size: u32 = UserSlice::new(user, size_of::<u32>()).reader().read()?;
        let len = request_len(user_size, T::SIZE_VER0, size_of::<T>())?;

        // `user_size` as read above is what counts; a `size` field changed since is ignored.
        let mut reader = UserSlice::new(user, user_size as usize).reader();
        let mut value = T::default();
        reader.read_slice(&mut value.as_bytes_mut()[..len])?;
        let mut chunk = [0u8; 64];
        while !reader.is_empty() {
            let n = reader.len().min(chunk.len());
            reader.read_slice(&mut chunk[..n])?;
            if chunk[..n].iter().any(|&b| b != 0) {
                return Err(E2BIG);
            }
        }
        Ok(Self { value, user, len })
    }

    /// Writes the answer back: as many bytes as both sides know, `size` set to that count.
    pub(crate) fn answer(mut self) -> Result {
        self.write_back()
    }

    /// [`Request::answer`], keeping the request: for a command that answers before it acts
    /// (what it would write back does not depend on the act), so that a caller whose argument
    /// cannot be written gets `EFAULT` with nothing done.
    pub(crate) fn write_back(&mut self) -> Result {
        // CAST: `len <= MAX_REQUEST_SIZE`, far below `u32::MAX`.
        self.value.set_size(self.len as u32);
        UserSlice::new(self.user, self.len)
            .writer()
            .write_slice(&self.value.as_bytes()[..self.len])
    }
}

#[cfg(peerdirect_kunit)]
#[kunit_tests(peerdirect_uapi)]
mod tests {
    use super::*;

    #[test]
    fn request_len_follows_the_extensible_struct_rules() {
        assert!(matches!(request_len(0, 64, 64), Err(e) if e == EINVAL));
        assert!(matches!(request_len(63, 64, 64), Err(e) if e == EINVAL));
        assert_eq!(request_len(64, 64, 64).unwrap(), 64);
        // An older caller gets what it knows; a newer one what we know.
        assert_eq!(request_len(64, 64, 80).unwrap(), 64);
        assert_eq!(request_len(72, 64, 64).unwrap(), 64);
        assert_eq!(request_len(PAGE_SIZE as u32, 64, 64).unwrap(), 64);
        assert!(matches!(request_len(PAGE_SIZE as u32 + 1, 64, 64), Err(e) if e == E2BIG));
        assert!(matches!(request_len(u32::MAX, 64, 64), Err(e) if e == E2BIG));
    }

    #[test]
    fn structs_match_the_header() {
        assert_eq!(
            size_of::<peerdirect_info>(),
            generated::PEERDIRECT_INFO_SIZE_VER1 as usize
        );
        assert_eq!(size_of::<peerdirect_alloc>(), peerdirect_alloc::SIZE_VER0);
        assert_eq!(size_of::<peerdirect_free>(), peerdirect_free::SIZE_VER0);
        assert_eq!(size_of::<peerdirect_export>(), peerdirect_export::SIZE_VER0);
        assert_eq!(
            size_of::<peerdirect_companion>(),
            peerdirect_companion::SIZE_VER0
        );
        assert_eq!(
            size_of::<peerdirect_export_range>(),
            peerdirect_export_range::SIZE_VER0
        );
        assert_eq!(PEERDIRECT_IOC_INFO, 0xbd00);
        assert_eq!(PEERDIRECT_IOC_ALLOC, 0xbd01);
        assert_eq!(PEERDIRECT_IOC_FREE, 0xbd02);
        assert_eq!(PEERDIRECT_IOC_EXPORT, 0xbd03);
        assert_eq!(PEERDIRECT_IOC_COMPANION_ADD, 0xbd10);
        assert_eq!(PEERDIRECT_IOC_COMPANION_REMOVE, 0xbd11);
        assert_eq!(PEERDIRECT_IOC_COMPANION_RESET_PREPARE, 0xbd12);
        assert_eq!(PEERDIRECT_IOC_COMPANION_RESET_DONE, 0xbd13);
    }
}
