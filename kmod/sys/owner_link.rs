// SPDX-License-Identifier: GPL-2.0

//! A device link to a PCI device another driver owns ([`OwnerLink`], `helpers/owner_link.c`):
//! the driver core then tells peerdirect before that driver unbinds, and waits for it, outside
//! every notifier chain and without the device's lock.

use super::{
    pci::{raw_pci_dev, DeviceLock},
    raw,
};
use core::{marker::PhantomData, ptr::NonNull};
use kernel::{ffi::c_ulong, prelude::*};

/// What an [`OwnerLink`] tells.
pub(crate) trait OwnerUnbinds {
    /// The driver of the PCI device linked under `key` is about to unbind (its unbind, its
    /// module's unload, the device's removal): its `remove()` runs, and the BARs go, only once
    /// this returns. Process context, no lock of the module's held, no notifier chain: it may
    /// sleep as long as it must. May come more than once for a link (root can rebind its
    /// consumer device), and after the link was dropped, until it is destroyed.
    fn owner_unbinds(key: usize);
}

/// Called by owner_link.c when the link's consumer device unbinds.
///
/// # Safety
///
/// None beyond the C side's contract: only owner_link.c calls it, in process context.
unsafe extern "C" fn owner_unbinds<H: OwnerUnbinds>(key: c_ulong) {
    H::owner_unbinds(key);
}

/// The queue that destroys dropped links; made before the first [`OwnerLink`], drained and
/// freed when this is dropped (module exit, after every link was dropped).
pub(crate) struct OwnerLinks(());

impl OwnerLinks {
    /// Only the module initializer makes one.
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: allocates owner_link.c's queue, once (the only caller is the module
        // initializer, before anything links); freed in `drop`.
        kernel::error::to_result(unsafe { raw::peerdirect_owner_links_init() })?;
        Ok(Self(()))
    }
}

impl Drop for OwnerLinks {
    fn drop(&mut self) {
        // SAFETY: made by `new`. Every link was dropped (their owners go before this), and none
        // is made after, so the destroys queued are all there is; they run before this returns.
        unsafe { raw::peerdirect_owner_links_exit() }
    }
}

/// A managed device link from a consumer device of the module's (a faux device,
/// `/sys/devices/faux/peerdirect-companion.N`) to a PCI device whose driver is bound: while it
/// lives, that driver's unbind first calls [`OwnerUnbinds::owner_unbinds`] and waits for it.
/// Dropping it destroys the consumer device in a work item (so that it may be dropped from
/// `owner_unbinds` itself); until then `owner_unbinds` may still come.
pub(crate) struct OwnerLink<H: OwnerUnbinds> {
    link: NonNull<raw::OwnerLink>,
    _events: PhantomData<H>,
}

// SAFETY: the link is only passed back to owner_link.c's destroy, which any thread may call.
unsafe impl<H: OwnerUnbinds> Send for OwnerLink<H> {}
// SAFETY: `&OwnerLink` gives no access to the link.
unsafe impl<H: OwnerUnbinds> Sync for OwnerLink<H> {}

impl<H: OwnerUnbinds> OwnerLink<H> {
    /// Links the locked device, whose driver must be bound (else `ENODEV`), telling `H` with
    /// `key`. `ENOMEM` if the consumer cannot be made, `ENODEV` too while no [`OwnerLinks`]
    /// lives.
    pub(crate) fn new(owner: &DeviceLock<'_>, key: usize) -> Result<Self> {
        // `owner_unbinds::<H>` is a static function, valid for the module's life.
        // SAFETY: the device is valid and locked, so its driver stays as it is until linked.
        let link = unsafe {
            raw::peerdirect_owner_link_create(
                raw_pci_dev(owner.device()),
                key,
                Some(owner_unbinds::<H>),
            )
        };
        Ok(Self {
            link: super::util::from_err_ptr(link)?,
            _events: PhantomData,
        })
    }
}

impl<H: OwnerUnbinds> Drop for OwnerLink<H> {
    fn drop(&mut self) {
        // SAFETY: made by `new` (so the queue existed, and outlives every link: the module
        // drops its links before its `OwnerLinks`), destroyed once, here.
        unsafe { raw::peerdirect_owner_link_destroy(self.link.as_ptr()) }
    }
}
