// SPDX-License-Identifier: GPL-2.0

//! A misc device whose files reach data of its registration and answer `poll`, two things the
//! kernel crate's misc device abstraction (7.3) has not: an open gets only the
//! `MiscDeviceRegistration`, and the file operations have no `poll`. [`MiscRegistration`]
//! registers a [`MiscFile`] with its data (the misc device type the abstraction sees is private
//! here, so every registration of it is one of ours, and an open finds the data beside it), and
//! gives each file at open the abstraction's operations plus `poll`.

use super::mm;
use core::marker::PhantomData;
use kernel::{
    bindings, container_of,
    fs::{File, Kiocb},
    iov::IovIterDest,
    miscdevice::{MiscDevice, MiscDeviceOptions, MiscDeviceRegistration},
    mm::virt::VmaNew,
    prelude::*,
    seq_file::SeqFile,
    sync::poll::PollTable,
};

/// The events a `poll` reports, a mask of `<poll.h>`'s values.
pub(crate) type PollEvents = bindings::__poll_t;
/// Urgent: act now (uapi value, as `<poll.h>` has it).
pub(crate) const POLLPRI: PollEvents = 0x0002;
/// Hung up: it will not come back on this file.
pub(crate) const POLLHUP: PollEvents = 0x0010;

/// What the files of a [`MiscRegistration`] do: each open makes one from the registration's
/// data; the others are the misc device abstraction's callbacks of the same names (`read` is
/// its `read_iter`), plus `poll`.
pub(crate) trait MiscFile: Sized + Send + Sync {
    /// What the registration holds, for every open.
    type Data: Send + Sync;
    /// Opens `file`, a file of the device registered with `data`.
    fn open(file: &File, data: &Self::Data) -> Result<Pin<KBox<Self>>>;
    fn ioctl(me: Pin<&Self>, file: &File, cmd: u32, arg: usize) -> Result<isize>;
    fn mmap(me: Pin<&Self>, file: &File, vma: &VmaNew) -> Result;
    fn show_fdinfo(me: Pin<&Self>, m: &SeqFile, file: &File);
    /// `read`: copies into `dest` and returns how many bytes it copied.
    fn read(me: Pin<&Self>, dest: &mut IovIterDest<'_>) -> Result<usize>;
    /// `poll`: registers what it waits on in `table` and returns the events ready now.
    fn poll(me: &Self, file: &File, table: PollTable<'_>) -> PollEvents;
}

/// A misc device registered with `F`'s files and their data: registered at initialization,
/// deregistered on drop (after which no open runs).
#[pin_data]
pub(crate) struct MiscRegistration<F: MiscFile> {
    #[pin]
    registration: MiscDeviceRegistration<Files<F>>,
    data: F::Data,
}

impl<F: MiscFile> MiscRegistration<F> {
    /// Registers `/dev/NAME`, whose opens get `data`: an open may come at once.
    pub(crate) fn register(name: &'static CStr, data: F::Data) -> impl PinInit<Self, Error> {
        try_pin_init!(Self {
            data,
            registration <- MiscDeviceRegistration::register(MiscDeviceOptions { name }),
        })
    }
}

/// The misc device type of `F`'s files, as the abstraction sees it. Private: no code but
/// [`MiscRegistration::register`] can register it, so every `MiscDeviceRegistration<Files<F>>`
/// is the `registration` of a `MiscRegistration<F>`.
struct Files<F>(PhantomData<F>);

#[vtable]
impl<F: MiscFile> MiscDevice for Files<F> {
    type Ptr = Pin<KBox<F>>;

    fn open(file: &File, misc: &MiscDeviceRegistration<Self>) -> Result<Pin<KBox<F>>> {
        let misc = core::ptr::from_ref(misc);
        // The reference borrows from `misc`, which the caller holds (the misc core holds its
        // lock across open, so the registration, and what contains it, is not dropped).
        // SAFETY: `misc` is the `registration` field of a live, pinned `MiscRegistration<F>`
        // (see `Files`).
        let registration = unsafe { &*container_of!(misc, MiscRegistration<F>, registration) };
        let me = F::open(file, &registration.data)?;
        set_poll_ops::<F>(file);
        Ok(me)
    }

    fn ioctl(me: Pin<&F>, file: &File, cmd: u32, arg: usize) -> Result<isize> {
        F::ioctl(me, file, cmd, arg)
    }

    fn mmap(me: Pin<&F>, file: &File, vma: &VmaNew) -> Result {
        F::mmap(me, file, vma)
    }

    fn show_fdinfo(me: Pin<&F>, m: &SeqFile, file: &File) {
        F::show_fdinfo(me, m, file)
    }

    fn read_iter(kiocb: Kiocb<'_, Self::Ptr>, dest: &mut IovIterDest<'_>) -> Result<usize> {
        F::read(kiocb.file(), dest)
    }
}

/// The file operations of `F`'s files: the misc device abstraction's for [`Files<F>`], plus
/// `poll`.
struct PollOps<F>(PhantomData<F>);

impl<F: MiscFile> PollOps<F> {
    const OPS: bindings::file_operations = bindings::file_operations {
        poll: Some(Self::poll),
        // `into_raw` builds the miscdevice the abstraction registers, whose `fops` points to
        // its `'static` operations table for `Files<F>`.
        // SAFETY: so reading it at compile time copies that table.
        ..unsafe {
            *MiscDeviceOptions {
                name: c"peerdirect",
            }
            .into_raw::<Files<F>>()
            .fops
        }
    };

    /// # Safety
    ///
    /// Only called by the VFS as `poll` of [`PollOps::OPS`], which [`set_poll_ops`] gives only
    /// to files of a [`MiscRegistration<F>`], whose private data the abstraction makes with
    /// `Pin<KBox<F>>::into_foreign` once `Files::<F>::open` returns.
    unsafe extern "C" fn poll(
        file: *mut bindings::file,
        table: *mut bindings::poll_table_struct,
    ) -> PollEvents {
        // SAFETY: by the function's contract `private_data` is that `F`, alive until release,
        // which does not run while the file is being polled.
        let me = unsafe { &*(*file).private_data.cast::<F>() };
        // SAFETY: the VFS passes a valid file, with no fdget_pos region active on this thread.
        let file = unsafe { File::from_raw_file(file) };
        // SAFETY: the VFS passes a null or valid poll table, valid for this call.
        let table = unsafe { PollTable::from_raw(table) };
        F::poll(me, file, table)
    }
}

/// Gives `file`, being opened by a [`MiscRegistration<F>`] (from `Files::<F>::open`), the
/// operations of its misc device plus `F::poll`.
fn set_poll_ops<F: MiscFile>(file: &File) {
    // The table is that device's operations plus a `poll` reading the private data as they do.
    // SAFETY: `file` is being opened by `Files<F>`'s misc device (the caller is its `open`).
    unsafe { mm::file_replace_fops(file, &PollOps::<F>::OPS) };
}
