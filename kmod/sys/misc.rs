// SPDX-License-Identifier: GPL-2.0

//! `poll` for a misc device, which the kernel crate's misc device abstraction (7.3) has no
//! operation for: a file operations table that is the abstraction's own plus `poll`, given to
//! each file at open ([`set_poll_ops`]).

use super::mm;
use core::marker::PhantomData;
use kernel::{
    bindings,
    fs::File,
    miscdevice::{MiscDevice, MiscDeviceOptions},
    prelude::*,
    sync::poll::PollTable,
};

/// The events a `poll` reports, a mask of `<poll.h>`'s values.
pub(crate) type PollEvents = bindings::__poll_t;
/// Urgent: act now (uapi value, as `<poll.h>` has it).
pub(crate) const POLLPRI: PollEvents = 0x0002;
/// Hung up: it will not come back on this file.
pub(crate) const POLLHUP: PollEvents = 0x0010;

/// A misc device whose files answer `poll`.
pub(crate) trait Poll: MiscDevice<Ptr = Pin<KBox<Self>>> + Sync {
    /// `poll` on an open file whose private data is `me`: registers what it waits on in
    /// `table` and returns the events ready now.
    fn poll(me: &Self, file: &File, table: PollTable<'_>) -> PollEvents;
}

/// The file operations of `T`'s files: the misc device abstraction's, plus `poll`.
struct PollOps<T>(PhantomData<T>);

impl<T: Poll> PollOps<T> {
    const OPS: bindings::file_operations = bindings::file_operations {
        poll: Some(Self::poll),
        // `into_raw` builds the miscdevice the abstraction registers, whose `fops` points to
        // its `'static` operations table for `T`.
        // SAFETY: so reading it at compile time copies that table.
        ..unsafe {
            *MiscDeviceOptions {
                name: c"peerdirect",
            }
            .into_raw::<T>()
            .fops
        }
    };

    /// # Safety
    ///
    /// Only called by the VFS as `poll` of [`PollOps::OPS`], which [`set_poll_ops`] gives only
    /// to files of `T`'s misc device, whose private data the abstraction makes with
    /// `Pin<KBox<T>>::into_foreign` once `T::open` returns.
    unsafe extern "C" fn poll(
        file: *mut bindings::file,
        table: *mut bindings::poll_table_struct,
    ) -> PollEvents {
        // SAFETY: by the function's contract `private_data` is that `T`, alive until release,
        // which does not run while the file is being polled.
        let me = unsafe { &*(*file).private_data.cast::<T>() };
        // SAFETY: the VFS passes a valid file, with no fdget_pos region active on this thread.
        let file = unsafe { File::from_raw_file(file) };
        // SAFETY: the VFS passes a null or valid poll table, valid for this call.
        let table = unsafe { PollTable::from_raw(table) };
        T::poll(me, file, table)
    }
}

/// Gives `file`, being opened by `T`'s misc device (call it from `T::open`), the operations of
/// `T`'s misc device plus `T::poll`.
pub(crate) fn set_poll_ops<T: Poll>(file: &File) {
    // SAFETY: `file` is being opened by `T`'s misc device (the caller is its `open`), and the
    // table is that device's operations plus a `poll` reading the private data as they do.
    unsafe { mm::file_replace_fops(file, &PollOps::<T>::OPS) };
}
