// SPDX-License-Identifier: GPL-2.0

//! An HBM device as the rest of the module sees it: where its BAR is, and whether the device
//! is still bound.
//!
//! [`Hbm`] is shared (`Arc`) by the driver's per-device data and every open file, because
//! files outlive an unbind: after [`Hbm::remove`] they stay valid but every request on them
//! fails with `ENODEV`.

use crate::{
    memory::{self, HbmMemory},
    p2p,
    status::StatusPage,
    sys::{
        self,
        dma_buf::{AttachInfo, DmaBuf, Registry},
        pci::{BarIndex, BarPlace, DriverName},
    },
    uapi::PEERDIRECT_STATUS_REVOKED,
};
use kernel::{
    new_condvar, new_mutex, new_poll_condvar, new_srcu, pci,
    prelude::*,
    rbtree::RBTreeNodeReservation,
    sync::{
        aref::ARef,
        atomic::{Acquire, Atomic, Full, Relaxed, Release},
        poll::PollCondVar,
        srcu::{self, Srcu},
        Arc, CondVar, Mutex,
    },
    time::{delay::fsleep, Delta},
};

/// A PCI address, `domain:bus:slot.func`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PciAddress {
    pub(crate) domain: u32,
    pub(crate) bus: u8,
    pub(crate) slot: u8,
    pub(crate) func: u8,
}

impl PciAddress {
    /// From the domain and the `bus << 8 | devfn` id of a PCI function.
    pub(crate) fn new(domain: u32, dev_id: u16) -> Self {
        let [bus, devfn] = dev_id.to_be_bytes();
        Self {
            domain,
            bus,
            slot: devfn >> 3,
            func: devfn & 0x7,
        }
    }
}

impl kernel::fmt::Display for PciAddress {
    fn fmt(&self, f: &mut kernel::fmt::Formatter<'_>) -> kernel::fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.slot, self.func
        )
    }
}

/// What peerdirect recorded of an HBM device when it bound it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HbmInfo {
    pub(crate) bar: BarIndex,
    pub(crate) bytes: u64,
    pub(crate) bus_addr: u64,
    pub(crate) phys_addr: u64,
    pub(crate) numa_node: Option<u32>,
    pub(crate) address: PciAddress,
    pub(crate) vendor_id: u16,
    pub(crate) device_id: u16,
    /// N of `/dev/peerdirectN`.
    pub(crate) index: u32,
}

impl HbmInfo {
    /// Where the BAR was found, for the checks at every map and CPU fault.
    pub(crate) fn place(&self) -> BarPlace {
        BarPlace::new(self.bar, self.phys_addr, self.bus_addr, self.bytes)
    }
}

/// An export as debugfs lists it.
pub(crate) struct ExportRecord {
    pub(crate) handle: u32,
    /// Offset of the exported range in the BAR.
    pub(crate) offset: u64,
    pub(crate) len: u64,
    /// The process that exported it, as its own PID namespace sees it.
    pub(crate) pid: i32,
}

/// Mappings handed to importers, counted so that removal can wait for them: revocable ones
/// (they provide `invalidate_mappings`) unmap when told to; the others (EFA's pinned memory
/// registrations) only when their owner lets go. The latter are also counted per BAR, across
/// bindings, in [`HbmMemory`]. Counted with atomics: map and unmap take no lock of ours.
pub(crate) struct Mappings {
    /// The revocable mappings, and [`REMOVAL_WAITS`] once removal waits for them to go: in
    /// one word, so that an unmap learns both from the one atomic it makes.
    revocable: Atomic<u64>,
    pub(crate) pinned: Atomic<u64>,
}

/// Set in [`Mappings::revocable`] while removal or a reset waits for the count to reach 0.
const REMOVAL_WAITS: u64 = 1 << 63;

impl Mappings {
    /// How many revocable mappings importers hold.
    pub(crate) fn revocable(&self) -> u64 {
        self.revocable.load(Acquire) & !REMOVAL_WAITS
    }
}

/// Allocation handles of a device: counted up, never 0, and never one the caller (a file)
/// still uses. After 2^32 allocations the count wraps; a handle the file still holds is then
/// skipped instead of being handed out twice, but one another file holds is not: handles are
/// unique in a file, and on the device only until the wrap.
pub(crate) struct Handles(Atomic<u32>);

impl Handles {
    pub(crate) const fn new(first: u32) -> Self {
        Self(Atomic::new(first))
    }

    /// The next handle for which `taken` is false. `taken` must be false for some handle (a
    /// file holds far fewer than 2^32 allocations: each needs memory).
    pub(crate) fn next(&self, taken: impl Fn(u32) -> bool) -> u32 {
        loop {
            let handle = self.0.fetch_add(1, Relaxed);
            if handle != 0 && !taken(handle) {
                return handle;
            }
        }
    }
}

/// A bound (or formerly bound) HBM device.
#[pin_data]
pub(crate) struct Hbm {
    info: HbmInfo,
    present: Atomic<bool>,
    pdev: ARef<pci::Device>,
    /// For a companion device, the name of the driver that owns it and its p2pdma state
    /// (bound when the companion was added; the companion goes before it unbinds).
    owner_driver: Option<DriverName>,
    /// The kernel's P2P verdicts for importers seen at attach.
    pub(crate) verdicts: p2p::Cache,
    /// What userspace maps from the device file to see the device go.
    pub(crate) status: StatusPage,
    pub(crate) memory: Arc<HbmMemory>,
    pub(crate) handles: Handles,
    /// Live dma-bufs exported from this device.
    pub(crate) exports: Atomic<u64>,
    /// The live exports, to revoke on removal and reset (each leaves it in its release).
    pub(crate) exported: Arc<Registry<ExportRecord>>,
    /// Resets of the device under way (an AER recovery may enclose a reset): while it is not
    /// 0, no export is recorded (`EBUSY`). Written and read under `exported`'s lock.
    resetting: Atomic<u32>,
    /// Resets begun since the device was bound (what the status page counts), for debugfs.
    resets: Atomic<u32>,
    pub(crate) mappings: Mappings,
    /// Whether removal has revoked everything ([`Hbm::revoke_for_removal`]); held while it
    /// does, and while a reset revokes ([`Hbm::reset_prepare`]), so that one revokes and
    /// waits for revocable importers at a time.
    #[pin]
    revoked: Mutex<bool>,
    /// Taken to signal `unmapped` and to wait on it.
    #[pin]
    unmapped_lock: Mutex<()>,
    /// Signalled when the last revocable mapping goes away.
    #[pin]
    unmapped: CondVar,
    /// Wakes those polling the device's files when it starts going away.
    #[pin]
    pub(crate) events: PollCondVar,
    /// Read-held by [`Live`] guards; removal waits for them.
    #[pin]
    gate: Srcu,
}

/// The device while it is bound: see [`Hbm::live`].
pub(crate) struct Live<'a> {
    hbm: &'a Hbm,
    _guard: srcu::Guard<'a>,
}

impl Live<'_> {
    pub(crate) fn pci_device(&self) -> &pci::Device {
        &self.hbm.pdev
    }
}

/// The bound device, as `p2p::route` asks for it.
impl core::ops::Deref for Live<'_> {
    type Target = pci::Device;

    fn deref(&self) -> &pci::Device {
        self.pci_device()
    }
}

impl Hbm {
    pub(crate) fn new(
        info: HbmInfo,
        pdev: ARef<pci::Device>,
        owner_driver: Option<DriverName>,
    ) -> Result<Arc<Self>> {
        Arc::pin_init(
            try_pin_init!(Self {
                memory: memory::of_bar(info.phys_addr, info.bytes)?,
                info,
                present: Atomic::new(true),
                pdev,
                owner_driver,
                verdicts: p2p::Cache::new()?,
                status: StatusPage::new()?,
                handles: Handles::new(1),
                exports: Atomic::new(0),
                exported: Arc::pin_init(Registry::new(), GFP_KERNEL)?,
                resetting: Atomic::new(0),
                resets: Atomic::new(0),
                mappings: Mappings {
                    revocable: Atomic::new(0),
                    pinned: Atomic::new(0),
                },
                revoked <- new_mutex!(false),
                unmapped_lock <- new_mutex!(()),
                unmapped <- new_condvar!(),
                events <- new_poll_condvar!("Hbm::events"),
                gate <- new_srcu!("Hbm::gate"),
            }),
            GFP_KERNEL,
        )
    }

    /// The device's description, or `ENODEV` once it is gone.
    pub(crate) fn info(&self) -> Result<&HbmInfo> {
        if self.present.load(Acquire) {
            Ok(&self.info)
        } else {
            Err(ENODEV)
        }
    }

    /// The device as bound, until the returned guard is dropped; `ENODEV` once it is gone.
    /// Whatever uses what the driver's binding holds (the p2pdma state the kernel's P2P
    /// distance reads) does so through it: removal waits for every guard taken before the
    /// device was marked gone, and the binding's managed resources are released only after
    /// removal returns. Maps need no guard: they run under their buffer's reservation lock,
    /// under which removal revokes it (see [`Hbm::register_export`]).
    pub(crate) fn live(&self) -> Result<Live<'_>> {
        let guard = self.gate.read_lock();
        self.info()?;
        Ok(Live {
            hbm: self,
            _guard: guard,
        })
    }

    /// The description as recorded, whether or not the device is still there (for logs and
    /// fdinfo).
    pub(crate) fn recorded(&self) -> &HbmInfo {
        &self.info
    }

    pub(crate) fn is_present(&self) -> bool {
        self.present.load(Acquire)
    }

    /// The PCI device.
    pub(crate) fn pdev(&self) -> &pci::Device {
        &self.pdev
    }

    /// Whether another driver owns the device (a companion device: no heap use).
    pub(crate) fn is_companion(&self) -> bool {
        self.owner_driver.is_some()
    }

    /// The name of the driver that owns a companion device (`PEERDIRECT_IOC_INFO`); all NULs
    /// for a device peerdirect owns.
    pub(crate) fn owner_driver(&self) -> DriverName {
        self.owner_driver.unwrap_or_default()
    }

    /// Resets begun since the device was bound, and how many of them are not done yet.
    pub(crate) fn resets(&self) -> (u32, u32) {
        (self.resets.load(Relaxed), self.resetting.load(Relaxed))
    }

    /// Records a new export (exported for [`Hbm::exported`]), unless the device is gone
    /// (`ENODEV`) or being reset (`EBUSY`): a removal, or a reset, revokes every export
    /// recorded before it.
    pub(crate) fn register_export(
        &self,
        dmabuf: &DmaBuf,
        record: ExportRecord,
        node: RBTreeNodeReservation<usize, ExportRecord>,
    ) -> Result {
        let mut exported = self.exported.lock();
        self.info()?;
        if self.resetting.load(Relaxed) > 0 {
            return Err(EBUSY);
        }
        exported.insert(dmabuf, record, node)
    }

    /// Counts a mapping made for an importer.
    #[inline]
    pub(crate) fn mapped(&self, revocable: bool) {
        if revocable {
            self.mappings.revocable.fetch_add(1, Relaxed);
        } else {
            self.mappings.pinned.fetch_add(1, Relaxed);
            self.memory.pinned_mappings.fetch_add(1, Relaxed);
        }
    }

    /// Counts a mapping undone by an importer.
    #[inline]
    pub(crate) fn unmapped(&self, revocable: bool) {
        if !revocable {
            self.mappings.pinned.fetch_sub(1, Release);
            self.memory.pinned_mappings.fetch_sub(1, Relaxed);
        } else if self.mappings.revocable.fetch_sub(1, Full) == REMOVAL_WAITS | 1 {
            self.wake_removal();
        }
    }

    /// Tells removal, which waits for it, that the last revocable mapping went.
    #[cold]
    fn wake_removal(&self) {
        // Only removal waits. It sets the mark in the count's own word, then reads the count
        // under this lock before it sleeps. Either our decrement came first (removal reads 0
        // and does not sleep), or we see the mark and signal under this lock, when removal has
        // read the count and is asleep: no signal is lost.
        let _lock = self.unmapped_lock.lock();
        self.unmapped.notify_all();
    }

    /// Marks the device gone (unbind, removal) and revokes its exports: later requests and
    /// maps fail with `ENODEV`, importers are told to drop their mappings, CPU mappings are
    /// zapped, and pollers of the device's files are woken. Returns once no importer maps any
    /// of the device's exports: revocable ones unmap when told; for those that cannot be
    /// revoked (pinned memory registrations) it waits until their owners let go, saying every
    /// few seconds who they are. Uninterruptible: no peer may DMA into the BAR once it
    /// returns (the BAR may be handed to another driver, or be gone).
    pub(crate) fn remove(&self) {
        self.revoke_for_removal();
        // Cannot fail: not killable.
        let _ = self.wait_pinned_released(Wait::Uninterruptible);
    }

    /// [`Hbm::remove`]'s first part, which takes bounded time: marks the device gone, revokes
    /// every export and waits until importers that can be revoked have unmapped them. Once
    /// it has returned, in any thread, it returns at once.
    pub(crate) fn revoke_for_removal(&self) {
        let mut revoked = self.revoked.lock();
        if *revoked {
            return;
        }
        // Requests, and attaches and P2P queries under the gate, see the device gone from
        // here on (all of them once the gate is synchronized below).
        self.present.xchg(false, Full);
        // Attaches that look their importer up from here on miss, and find the device gone.
        self.verdicts.close();
        // Attaches and P2P queries that saw the device present finish before anything goes;
        // later ones see it gone. Maps are held off export by export, by the revocation below.
        self.gate.synchronize();
        // Before any export is revoked: caches stop handing out registrations of them, and
        // processes polling the device file learn that they must let go of them.
        self.status.set(PEERDIRECT_STATUS_REVOKED);
        self.events.notify_all();
        // No export is recorded after this point (`register_export`), so this is all of them.
        self.revoke_exports(|| ());
        // Revocable importers unmap in bounded time once invalidated (the dma-buf contract);
        // the BAR must not go away under their DMA.
        self.wait_revocable_unmapped();
        *revoked = true;
    }

    /// [`Hbm::remove`]'s second part, after [`Hbm::revoke_for_removal`]: returns once no
    /// importer that cannot be revoked maps any export (their owners must let go: it says
    /// every few seconds who they are), or with `EINTR` once the calling task is sent a fatal
    /// signal if `wait` is [`Wait::Killable`]. Several may wait at once.
    pub(crate) fn wait_pinned_released(&self, wait: Wait) -> Result {
        let (mut waited, mut nag_at) = (Delta::ZERO, Delta::ZERO);
        loop {
            let pinned = self.mappings.pinned.load(Acquire);
            if pinned == 0 {
                break;
            }
            if wait == Wait::Killable && sys::task::fatal_signal_pending() {
                return Err(EINTR);
            }
            if waited >= nag_at {
                self.log_pinned_holders(pinned, waited);
                // Pollers that came after the first wake-up (a process that just opened the
                // file to find out) learn it too.
                self.events.notify_all();
                nag_at = waited + NAG_INTERVAL;
            }
            // Short sleeps, not interrupted by signals: a killable wait looks for fatal ones
            // between them.
            fsleep(PINNED_POLL);
            waited += PINNED_POLL;
        }
        if waited > Delta::ZERO {
            dev_info!(
                self.pdev.as_ref(),
                "every mapping that could not be revoked is released, after {} ms\n",
                waited.as_millis()
            );
        }
        Ok(())
    }

    /// Revokes every export recorded, running `locked` first under the lock that records
    /// them (so that none is recorded after it if `locked` or the device's state forbids it),
    /// and says how many it revoked.
    fn revoke_exports(&self, locked: impl FnOnce()) {
        let (mut revoked, mut releasing) = (0usize, 0usize);
        {
            let exported = self.exported.lock();
            locked();
            for export in exported.iter() {
                if export.revoke() {
                    revoked += 1;
                } else {
                    releasing += 1;
                }
            }
        }
        if revoked + releasing > 0 {
            dev_info!(
                self.pdev.as_ref(),
                "peerdirect{}: revoked {} export(s); {} more were being released\n",
                self.info.index,
                revoked,
                releasing
            );
        }
    }

    /// Returns once importers that can be revoked map none of the device's exports; every
    /// export is revoked and no new one can be recorded (removal, reset), so that is soon.
    /// Removal and resets call it under `revoked`'s lock: one at a time.
    fn wait_revocable_unmapped(&self) {
        // No mapping is counted from here on: every export is revoked (maps fail), and each
        // map that was counted before its export's revocation was counted before it ended.
        // (Added: the kernel's atomics have no `or`; one waits at a time, and the count never
        // reaches the mark's bit.)
        self.mappings.revocable.fetch_add(REMOVAL_WAITS, Full);
        let mut lock = self.unmapped_lock.lock();
        while self.mappings.revocable() > 0 {
            self.unmapped.wait(&mut lock);
        }
        drop(lock);
        self.mappings.revocable.fetch_sub(REMOVAL_WAITS, Relaxed);
    }

    /// The device is about to be reset (or an error on it is being recovered from; the PCI
    /// core holds the device lock): nothing may reach its BAR until [`Hbm::reset_done`].
    /// Counts the reset on the status page and wakes pollers, then revokes every export as
    /// removal does (importers told to unmap, CPU mappings zapped, maps and faults refused),
    /// refuses new exports until the reset is done, and waits for revocable importers to
    /// unmap. A reset cannot be refused or put off, so importers that cannot be revoked
    /// (pinned memory registrations) keep their mappings: it says who they are. `ENODEV`
    /// once the device is being removed (a companion's owner may reset it meanwhile; an
    /// owned device's reset and removal both hold its lock).
    pub(crate) fn reset_prepare(&self) -> Result {
        let removed = self.revoked.lock();
        if *removed {
            return Err(ENODEV);
        }
        self.resets.fetch_add(1, Relaxed);
        self.status.count_reset();
        self.events.notify_all();
        self.revoke_exports(|| {
            self.resetting.fetch_add(1, Relaxed);
        });
        self.wait_revocable_unmapped();
        drop(removed);
        let pinned = self.mappings.pinned.load(Acquire);
        if pinned > 0 {
            dev_warn!(
                self.pdev.as_ref(),
                "peerdirect{}: reset with {} mapping(s) that cannot be revoked: their importers' DMA may reach the device while it resets\n",
                self.info.index,
                pinned
            );
            self.list_pinned_holders();
        }
        dev_info!(
            self.pdev.as_ref(),
            "peerdirect{}: reset begins: exports revoked\n",
            self.info.index
        );
        Ok(())
    }

    /// The reset [`Hbm::reset_prepare`] prepared for is over: exports can be made again (those
    /// made before stay revoked) once every reset under way is done. `EINVAL` if none is.
    pub(crate) fn reset_done(&self) -> Result {
        let exported = self.exported.lock();
        if self.resetting.load(Relaxed) == 0 {
            return Err(EINVAL);
        }
        self.resetting.fetch_sub(1, Relaxed);
        drop(exported);
        dev_info!(
            self.pdev.as_ref(),
            "peerdirect{}: reset done: new exports work\n",
            self.info.index
        );
        Ok(())
    }

    /// Says which exports are still mapped by importers that cannot be revoked, by whom, and
    /// which processes exported them.
    fn log_pinned_holders(&self, pinned: u64, waited: Delta) {
        let index = self.info.index;
        dev_warn!(
            self.pdev.as_ref(),
            "peerdirect{}: removal waits ({} s so far) for {} mapping(s) that cannot be revoked (pinned memory registrations); the processes below must deregister them or exit\n",
            index,
            waited.as_millis() / 1000,
            pinned
        );
        self.list_pinned_holders();
    }

    /// Says, for each export mapped by an importer that cannot be revoked, by whom, and which
    /// process exported it.
    fn list_pinned_holders(&self) {
        let index = self.info.index;
        // The reservation lock is taken under `exported`, as revocation does.
        let exported = self.exported.lock();
        for export in exported.iter() {
            let e = export.record();
            let mut infos = [AttachInfo::EMPTY; MAX_LISTED];
            let n = export.attachments(&mut infos);
            for a in infos[..n.min(MAX_LISTED)]
                .iter()
                .filter(|a| !a.revocable && a.entries > 0)
            {
                dev_warn!(
                    self.pdev.as_ref(),
                    "peerdirect{}:   dma-buf h{} [{:#x}+{:#x}] exported by pid {}, mapped by {}\n",
                    index,
                    e.handle,
                    e.offset,
                    e.len,
                    e.pid,
                    a.importer()
                );
            }
            if n > MAX_LISTED {
                dev_warn!(
                    self.pdev.as_ref(),
                    "peerdirect{}:   dma-buf h{}: {} more attachment(s) not listed\n",
                    index,
                    e.handle,
                    n - MAX_LISTED
                );
            }
        }
    }
}

/// How [`Hbm::wait_pinned_released`] waits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Until the mappings are released, whatever the calling task is sent: removal that
    /// cannot fail (an unbind, an unplug).
    Uninterruptible,
    /// Until then, or until the calling task is sent a fatal signal (a request it may give
    /// up: the companion remove ioctl).
    Killable,
}

/// How many attachments of one dma-buf removal's log and debugfs list.
pub(crate) const MAX_LISTED: usize = 16;

/// How often removal checks whether pinned mappings are gone.
const PINNED_POLL: Delta = Delta::from_millis(50);
/// How often it says who it waits for.
const NAG_INTERVAL: Delta = Delta::from_secs(5);

#[cfg(peerdirect_kunit)]
#[kunit_tests(peerdirect_handles)]
mod tests {
    use super::*;

    #[test]
    fn handles_skip_zero_and_taken_after_wrapping() {
        let handles = Handles::new(u32::MAX - 1);
        assert_eq!(handles.next(|_| false), u32::MAX - 1);
        // u32::MAX is still held, 0 is never a handle, 1 is still held.
        assert_eq!(handles.next(|h| h == u32::MAX || h == 1), 2);
        assert_eq!(handles.next(|_| false), 3);
    }
}
