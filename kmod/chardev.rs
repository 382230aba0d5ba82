// SPDX-License-Identifier: GPL-2.0

//! `/dev/peerdirectN`: the misc device of one HBM device, and its ioctls.
//!
//! Each open file has its own allocations, and can only name the ones it made (another file's
//! handle is `ENOENT`, as a freed one is): a handle is unique in its file. The device hands
//! handles out in order from one 32-bit counter, so two files' handles also differ, until that
//! counter wraps: then a handle this file still holds is skipped, one another file holds is
//! not.

use crate::{
    allocation::Allocation,
    export,
    hbm::Hbm,
    p2p,
    sys::{
        self,
        misc::{MiscFile, MiscRegistration, PollEvents, POLLHUP, POLLPRI},
        pci::DriverName,
    },
    uapi::{
        peerdirect_alloc, peerdirect_export, peerdirect_export_range, peerdirect_free,
        peerdirect_info, peerdirect_p2p, peerdirect_status, ExtensibleStruct, Request,
        PEERDIRECT_ALLOC_ALIGN_DEFAULT, PEERDIRECT_DRIVER_NAME_LEN, PEERDIRECT_EXPORT_CLOEXEC,
        PEERDIRECT_EXPORT_RDWR, PEERDIRECT_IOC_ALLOC, PEERDIRECT_IOC_EXPORT,
        PEERDIRECT_IOC_EXPORT_RANGE, PEERDIRECT_IOC_FREE, PEERDIRECT_IOC_INFO, PEERDIRECT_IOC_P2P,
        PEERDIRECT_P2P_ACS_REDIRECT, PEERDIRECT_P2P_COMMON_BRIDGE, PEERDIRECT_P2P_PEER_IOMMU,
        PEERDIRECT_P2P_SAME_HOST_BRIDGE, PEERDIRECT_PROVIDER_COMPANION, PEERDIRECT_PROVIDER_OWNED,
        PEERDIRECT_STATUS_SIZE_VER0,
    },
};
use kernel::{
    fs::{
        file::{flags, FileDescriptorReservation},
        File,
    },
    iov::IovIterDest,
    mm::virt::VmaNew,
    new_mutex,
    page::PAGE_SIZE,
    prelude::*,
    rbtree::{RBTree, RBTreeNodeReservation},
    seq_file::SeqFile,
    seq_print,
    sync::{
        atomic::{Atomic, Relaxed},
        poll::PollTable,
        Arc, Mutex,
    },
};

const PAGE: u64 = PAGE_SIZE as u64;

/// An open `/dev/peerdirectN`.
/// `/dev/peerdirectN`: the misc device, registered with the device it serves, which its opens
/// get.
pub(crate) type HbmMisc = MiscRegistration<HbmFile>;

#[pin_data]
pub(crate) struct HbmFile {
    hbm: Arc<Hbm>,
    /// This file's allocations by handle; dropping the file drops them.
    #[pin]
    allocations: Mutex<RBTree<u32, Arc<Allocation>>>,
    /// The status page's `resets` as this file last read it (or at open): `poll` says
    /// `POLLPRI` while the page counts more.
    resets_read: Atomic<u32>,
}

/// The checks every request struct gets: no unknown flag, zero padding.
fn check_flags_and_padding(flags: u32, known: u32, padding: &[u32]) -> Result {
    if flags & !known != 0 {
        return Err(EOPNOTSUPP);
    }
    if padding.iter().any(|&p| p != 0) {
        return Err(EINVAL);
    }
    Ok(())
}

/// The length an ALLOC of `length` bytes gets on a device of `hbm_bytes`: rounded up to a
/// page; `EINVAL` for 0 or more than the device has.
pub(crate) fn alloc_length(length: u64, hbm_bytes: u64) -> Result<u64> {
    if length == 0 || length > hbm_bytes {
        return Err(EINVAL);
    }
    length
        .checked_add(PAGE - 1)
        .map(|l| l & !(PAGE - 1))
        .ok_or(EINVAL)
}

/// The alignment an ALLOC asks for: 0 means the default; a power of two of at least a page.
pub(crate) fn alloc_align(align: u64) -> Result<u64> {
    let align = if align == 0 {
        u64::from(PEERDIRECT_ALLOC_ALIGN_DEFAULT)
    } else {
        align
    };
    if !align.is_power_of_two() || align < PAGE {
        return Err(EINVAL);
    }
    Ok(align)
}

/// The range an EXPORT of (`offset`, `length`) covers in an allocation of `alloc_len` bytes.
pub(crate) fn export_range(offset: u64, length: u64, alloc_len: u64) -> Result<(u64, u64)> {
    if offset % PAGE != 0 || length % PAGE != 0 {
        return Err(EINVAL);
    }
    // Before the range is compared with the allocation: an overflowing sum is EOVERFLOW
    // wherever the offset is (uapi.md).
    if offset.checked_add(length).is_none() {
        return Err(EOVERFLOW);
    }
    if offset >= alloc_len {
        return Err(EINVAL);
    }
    let length = if length == 0 {
        alloc_len - offset
    } else {
        length
    };
    let end = offset.checked_add(length).ok_or(EOVERFLOW)?;
    if end > alloc_len {
        return Err(EINVAL);
    }
    Ok((offset, length))
}

// The floor's driver names are the ABI's `peerdirect_info::driver`.
const _: () = assert!(sys::pci::DRIVER_NAME_LEN == PEERDIRECT_DRIVER_NAME_LEN as usize);

/// `name` as `PEERDIRECT_IOC_INFO` reports a driver's name: NUL-padded (and cut short, which
/// no name of ours needs).
fn driver_name(name: &CStr) -> DriverName {
    let mut padded = DriverName::default();
    let bytes = name.to_bytes();
    let n = bytes.len().min(padded.len() - 1);
    padded[..n].copy_from_slice(&bytes[..n]);
    padded
}

impl HbmFile {
    /// `PEERDIRECT_IOC_INFO`: describe the HBM device.
    fn info(&self, arg: usize) -> Result {
        let mut req = Request::<peerdirect_info>::read(arg)?;
        check_flags_and_padding(
            req.value.flags,
            0,
            &[req.value.__reserved0.into(), req.value.__reserved1],
        )?;
        let info = self.hbm.info()?;
        req.value = peerdirect_info {
            hbm_bytes: info.bytes,
            hbm_bus_addr: info.bus_addr,
            hbm_phys_addr: info.phys_addr,
            bar_index: info.bar.get(),
            numa_node: info
                .numa_node
                .and_then(|n| i32::try_from(n).ok())
                .unwrap_or(-1),
            pci_domain: info.address.domain,
            pci_bus: info.address.bus,
            pci_slot: info.address.slot,
            pci_func: info.address.func,
            vendor_id: info.vendor_id,
            device_id: info.device_id,
            index: info.index,
            provider: if self.hbm.is_companion() {
                PEERDIRECT_PROVIDER_COMPANION
            } else {
                PEERDIRECT_PROVIDER_OWNED
            },
            driver: if self.hbm.is_companion() {
                self.hbm.owner_driver()
            } else {
                driver_name(c"peerdirect")
            },
            ..Default::default()
        };
        req.answer()
    }

    /// `PEERDIRECT_IOC_ALLOC`: a new allocation owned by this file.
    fn alloc(&self, arg: usize) -> Result {
        let mut req = Request::<peerdirect_alloc>::read(arg)?;
        check_flags_and_padding(req.value.flags, 0, &[req.value.__reserved0])?;
        let info = self.hbm.info()?;
        // A companion's memory belongs to its owner's runtime: there is nothing to allocate.
        if self.hbm.is_companion() {
            return Err(EOPNOTSUPP);
        }
        let length = alloc_length(req.value.length, info.bytes)?;
        let align = alloc_align(req.value.align)?;

        let node = RBTreeNodeReservation::new(GFP_KERNEL)?;
        // Held from choosing the handle to inserting it: a handle this file still uses (after
        // the count wrapped) is never chosen, so the insert never replaces an allocation.
        let mut allocations = self.allocations.lock();
        let handle = self.hbm.handles.next(|h| allocations.get(&h).is_some());
        let alloc = Allocation::new(&self.hbm, handle, length, align)?;
        req.value.length = length;
        req.value.handle = handle;
        req.value.hbm_offset = alloc.offset();
        allocations.insert(node.into_node(handle, alloc));
        drop(allocations);
        // A caller that cannot read the answer cannot name the allocation: undo it.
        req.answer().inspect_err(|_| {
            drop(self.allocations.lock().remove(&handle));
        })
    }

    /// `PEERDIRECT_IOC_FREE`: drop this file's handle; the memory follows its last dma-buf.
    fn free(&self, arg: usize) -> Result {
        let mut req = Request::<peerdirect_free>::read(arg)?;
        check_flags_and_padding(req.value.flags, 0, &[req.value.__reserved0])?;
        // Answered first (the answer is the request): a caller that cannot read it back gets
        // EFAULT with its allocation still there, not an error for a FREE that happened.
        req.write_back()?;
        let alloc = self.allocations.lock().remove(&req.value.handle);
        // Dropped outside the lock: the last reference returns the range to the heap.
        drop(alloc.ok_or(ENOENT)?);
        Ok(())
    }

    /// `PEERDIRECT_IOC_P2P`: the kernel's P2P verdict between this HBM and a PCI device.
    fn p2p(&self, arg: usize) -> Result {
        let mut req = Request::<peerdirect_p2p>::read(arg)?;
        let peerdirect_p2p {
            pci_domain,
            pci_bus,
            pci_slot,
            pci_func,
            ..
        } = req.value;
        check_flags_and_padding(
            req.value.flags,
            0,
            &[
                req.value.__reserved0.into(),
                req.value.__reserved1.into(),
                req.value.__reserved2,
            ],
        )?;
        let devfn = sys::pci::devfn(pci_slot, pci_func)?;
        let live = self.hbm.live()?;
        let path = p2p::query(live.pci_device(), pci_domain, pci_bus, devfn)?;
        drop(live);
        let (host_bridge_vendor, host_bridge_device) = path.host_bridge.unwrap_or_default();
        let flag = |set: bool, bit: u32| if set { bit } else { 0 };
        req.value = peerdirect_p2p {
            pci_domain,
            pci_bus,
            pci_slot,
            pci_func,
            distance: path
                .distance
                .and_then(|d| i32::try_from(d).ok())
                .unwrap_or(-1),
            path: flag(path.common_bridge.is_some(), PEERDIRECT_P2P_COMMON_BRIDGE)
                | flag(path.acs_bridge.is_some(), PEERDIRECT_P2P_ACS_REDIRECT)
                | flag(path.same_host_bridge, PEERDIRECT_P2P_SAME_HOST_BRIDGE)
                | flag(path.peer_iommu, PEERDIRECT_P2P_PEER_IOMMU),
            common_bridge: path.common_bridge.unwrap_or(0),
            acs_bridge: path.acs_bridge.unwrap_or(0),
            acs_bridges: path.acs_bridges,
            host_bridge_vendor,
            host_bridge_device,
            ..Default::default()
        };
        req.answer()
    }

    /// `PEERDIRECT_IOC_EXPORT_RANGE`: a dma-buf fd for a range of a companion's BAR.
    fn export_range(&self, arg: usize) -> Result {
        let req = Request::<peerdirect_export_range>::read(arg)?;
        check_flags_and_padding(
            req.value.flags,
            PEERDIRECT_EXPORT_CLOEXEC | PEERDIRECT_EXPORT_RDWR,
            &[req.value.__reserved0],
        )?;
        let info = self.hbm.info()?;
        if !self.hbm.is_companion() {
            return Err(EOPNOTSUPP);
        }
        if !sys::task::capable_sys_admin() {
            return Err(EPERM);
        }
        if req.value.length == 0 {
            return Err(EINVAL);
        }
        // The whole BAR is the "allocation" the range must lie in.
        let (offset, length) = export_range(req.value.bar_offset, req.value.length, info.bytes)?;
        let alloc = Allocation::borrowed(&self.hbm, offset, length)?;
        let flags = req.value.flags;
        export_fd(req, &alloc, 0, length, flags, |req, fd| req.value.fd = fd)
    }

    /// `PEERDIRECT_IOC_EXPORT`: a dma-buf fd for a range of one of this file's allocations.
    fn export(&self, arg: usize) -> Result {
        let req = Request::<peerdirect_export>::read(arg)?;
        check_flags_and_padding(
            req.value.flags,
            PEERDIRECT_EXPORT_CLOEXEC | PEERDIRECT_EXPORT_RDWR,
            &[],
        )?;
        let alloc = self
            .allocations
            .lock()
            .get(&req.value.handle)
            .cloned()
            .ok_or(ENOENT)?;
        let (offset, length) = export_range(req.value.offset, req.value.length, alloc.len())?;
        let flags = req.value.flags;
        export_fd(req, &alloc, offset, length, flags, |req, fd| {
            req.value.fd = fd
        })
    }
}

/// Exports `length` bytes at `offset` of `alloc` with `PEERDIRECT_EXPORT_*` `flags`, puts the
/// new fd's number into the answer (`set_fd`) and answers `req`. The fd becomes visible only
/// once the caller has its number; on failure both the reservation and the dma-buf are
/// dropped.
fn export_fd<T: ExtensibleStruct>(
    mut req: Request<T>,
    alloc: &Arc<Allocation>,
    offset: u64,
    length: u64,
    flags: u32,
    set_fd: impl FnOnce(&mut Request<T>, i32),
) -> Result {
    let cloexec = flags & PEERDIRECT_EXPORT_CLOEXEC != 0;
    let fd =
        FileDescriptorReservation::get_unused_fd_flags(if cloexec { flags::O_CLOEXEC } else { 0 })?;
    let writable = flags & PEERDIRECT_EXPORT_RDWR != 0;
    let file = export::export(alloc, offset, length, writable)?;
    set_fd(
        &mut req,
        i32::try_from(fd.reserved_fd()).map_err(|_| EMFILE)?,
    );
    req.answer()?;
    fd.fd_install(file);
    Ok(())
}

impl MiscFile for HbmFile {
    type Data = Arc<Hbm>;

    fn open(_file: &File, hbm: &Arc<Hbm>) -> Result<Pin<KBox<Self>>> {
        KBox::try_pin_init(
            try_pin_init!(Self {
                hbm: hbm.clone(),
                allocations <- new_mutex!(RBTree::new()),
                resets_read: Atomic::new(hbm.status.read().resets),
            }),
            GFP_KERNEL,
        )
    }

    /// Once the device starts going away, `POLLPRI` (act now: let go of its registrations)
    /// with `POLLHUP` (it will not come back on this file). While it stays, `POLLPRI` alone
    /// once the status page counts a reset this file has not read (its exports made before
    /// are revoked), until a `read` reads the page; else no event.
    fn poll(me: &Self, file: &File, table: PollTable<'_>) -> PollEvents {
        table.register_wait(file, &me.hbm.events);
        if !me.hbm.is_present() {
            POLLPRI | POLLHUP
        } else if me.hbm.status.read().resets != me.resets_read.load(Relaxed) {
            POLLPRI
        } else {
            0
        }
    }

    /// The status page's `struct peerdirect_status`, as `mmap` shows it, for a buffer of at
    /// least its first version's size (`EINVAL`); never waits, whatever the file offset. The
    /// resets it counts are read: `poll` says no more of them.
    fn read(me: Pin<&Self>, dest: &mut IovIterDest<'_>) -> Result<usize> {
        let status = me.hbm.status.read();
        let mut bytes = [0u8; size_of::<peerdirect_status>()];
        for (word, value) in
            bytes
                .chunks_exact_mut(4)
                .zip([status.version, status.state, status.resets])
        {
            word.copy_from_slice(&value.to_ne_bytes());
        }
        if dest.len() < PEERDIRECT_STATUS_SIZE_VER0 as usize {
            return Err(EINVAL);
        }
        let len = bytes.len().min(dest.len());
        if dest.copy_to_iter(&bytes[..len]) != len {
            return Err(EFAULT);
        }
        me.resets_read.store(status.resets, Relaxed);
        Ok(len)
    }

    fn ioctl(me: Pin<&Self>, _file: &File, cmd: u32, arg: usize) -> Result<isize> {
        match cmd {
            PEERDIRECT_IOC_INFO => me.info(arg)?,
            PEERDIRECT_IOC_ALLOC => me.alloc(arg)?,
            PEERDIRECT_IOC_FREE => me.free(arg)?,
            PEERDIRECT_IOC_EXPORT => me.export(arg)?,
            PEERDIRECT_IOC_P2P => me.p2p(arg)?,
            PEERDIRECT_IOC_EXPORT_RANGE => me.export_range(arg)?,
            _ => return Err(ENOTTY),
        }
        Ok(0)
    }

    /// The status page (`PEERDIRECT_STATUS_OFFSET`), read-only; also after the device is gone,
    /// when it says so.
    fn mmap(me: Pin<&Self>, _file: &File, vma: &VmaNew) -> Result {
        me.hbm.status.map(vma)
    }

    fn show_fdinfo(me: Pin<&Self>, m: &SeqFile, _file: &File) {
        let info = me.hbm.recorded();
        let allocations = me.allocations.lock();
        let bytes: u64 = allocations.values().map(|a| a.len()).sum();
        seq_print!(
            m,
            "peerdirect-device:\tpeerdirect{}\npeerdirect-pci:\t{}\npeerdirect-hbm-bytes:\t{}\npeerdirect-present:\t{}\npeerdirect-allocations:\t{}\npeerdirect-allocated-bytes:\t{}\n",
            info.index,
            info.address,
            info.bytes,
            me.hbm.is_present(),
            allocations.iter().count(),
            bytes
        );
    }
}

#[cfg(peerdirect_kunit)]
#[kunit_tests(peerdirect_requests)]
mod tests {
    use super::*;

    #[test]
    fn alloc_arguments() {
        assert!(matches!(alloc_length(0, 1 << 30), Err(e) if e == EINVAL));
        assert!(matches!(alloc_length((1 << 30) + 1, 1 << 30), Err(e) if e == EINVAL));
        assert_eq!(alloc_length(1, 1 << 30).unwrap(), PAGE);
        assert_eq!(alloc_length(1 << 30, 1 << 30).unwrap(), 1 << 30);
        assert_eq!(alloc_align(0).unwrap(), 2 << 20);
        assert_eq!(alloc_align(PAGE).unwrap(), PAGE);
        assert!(matches!(alloc_align(3), Err(e) if e == EINVAL));
        assert!(matches!(alloc_align(PAGE / 2), Err(e) if e == EINVAL));
    }

    #[test]
    fn export_arguments() {
        let mib = 1 << 20;
        assert_eq!(export_range(0, 0, 4 * mib).unwrap(), (0, 4 * mib));
        assert_eq!(export_range(mib, 0, 4 * mib).unwrap(), (mib, 3 * mib));
        assert_eq!(export_range(mib, mib, 4 * mib).unwrap(), (mib, mib));
        assert!(matches!(export_range(1, PAGE, 4 * mib), Err(e) if e == EINVAL));
        assert!(matches!(export_range(0, PAGE + 1, 4 * mib), Err(e) if e == EINVAL));
        assert!(matches!(export_range(4 * mib, 0, 4 * mib), Err(e) if e == EINVAL));
        assert!(matches!(export_range(0, 8 * mib, 4 * mib), Err(e) if e == EINVAL));
        assert!(matches!(export_range(PAGE, !(PAGE - 1), 4 * mib), Err(e) if e == EOVERFLOW));
        assert!(matches!(export_range(!(PAGE - 1), PAGE, 4 * mib), Err(e) if e == EOVERFLOW));
    }

    #[test]
    fn p2p_address() {
        use sys::pci::devfn;
        assert_eq!(devfn(0, 0).unwrap(), 0);
        assert_eq!(devfn(3, 1).unwrap(), 0x19);
        assert_eq!(devfn(31, 7).unwrap(), 0xff);
        assert!(matches!(devfn(32, 0), Err(e) if e == EINVAL));
        assert!(matches!(devfn(0, 8), Err(e) if e == EINVAL));
    }

    #[test]
    fn flags_and_padding() {
        assert!(check_flags_and_padding(0, 0, &[0, 0]).is_ok());
        assert!(check_flags_and_padding(3, 3, &[]).is_ok());
        assert!(matches!(check_flags_and_padding(4, 3, &[]), Err(e) if e == EOPNOTSUPP));
        assert!(matches!(check_flags_and_padding(0, 0, &[0, 1]), Err(e) if e == EINVAL));
    }
}
