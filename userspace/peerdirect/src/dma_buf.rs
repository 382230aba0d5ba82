//! A dma-buf exported from an [`crate::Allocation`]: the fd, its CPU mapping and DMA-BUF's own
//! commands.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use rustix::fs::SeekFrom;
use rustix::io::Errno;

use crate::error::Operation;
use crate::sys::dma_buf::{self as sys, Mapping};
use crate::uapi;
use crate::Error;

bitflags::bitflags! {
    /// What [`DmaBuf::sync`] tells the exporter (`DMA_BUF_SYNC_*`). Without [`SyncFlags::END`]
    /// it brackets the start of CPU access, with it the end:
    /// `START_WRITE` before writing through a mapping, `END_WRITE` after.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct SyncFlags: u64 {
        /// The CPU reads.
        const READ = uapi::DMA_BUF_SYNC_READ;
        /// The CPU writes.
        const WRITE = uapi::DMA_BUF_SYNC_WRITE;
        /// CPU access ends (`DMA_BUF_SYNC_END`); without it, it starts.
        const END = uapi::DMA_BUF_SYNC_END;
    }
}

impl SyncFlags {
    /// Before the CPU reads.
    pub const START_READ: Self = Self::READ;
    /// Before the CPU writes.
    pub const START_WRITE: Self = Self::WRITE;
    /// After the CPU has read.
    pub const END_READ: Self = Self::END.union(Self::READ);
    /// After the CPU has written.
    pub const END_WRITE: Self = Self::END.union(Self::WRITE);
}

/// A dma-buf: owns its fd. Exporting makes one ([`crate::Allocation::export`]);
/// [`DmaBuf::from_fd`] adopts one received otherwise.
#[derive(Debug)]
pub struct DmaBuf {
    fd: OwnedFd,
    length: u64,
}

impl DmaBuf {
    /// Takes ownership of the dma-buf `fd`, asking it for its size. It is not checked to be a
    /// dma-buf ([`DmaBuf::from_borrowed`] checks): another file, such as a memfd standing in
    /// for one in a test, works too, but a dma-buf's size never changes and a file's may,
    /// and reading a mapping ([`DmaBuf::mmap`]) past a shrunk file's end dies of `SIGBUS`.
    pub fn from_fd(fd: OwnedFd) -> Result<Self, Error> {
        // A dma-buf answers lseek(0, SEEK_END) with its size.
        let length = rustix::fs::seek(&fd, SeekFrom::End(0))
            .map_err(|errno| Error::dma_buf(Operation::Size, fd.as_raw_fd(), errno))?;
        Ok(Self { fd, length })
    }

    /// A dma-buf of its own for the caller's dma-buf `fd` (a duplicate, close-on-exec), which
    /// the caller keeps and may close at any time; `EINVAL` if `fd` is not a dma-buf.
    pub fn from_borrowed(fd: BorrowedFd<'_>) -> Result<Self, Error> {
        /// `DMA_BUF_MAGIC` of `<uapi/linux/magic.h>`: the dma-buf pseudo file system.
        const DMA_BUF_MAGIC: i64 = 0x444d_4142;
        let error = |errno| Error::dma_buf(Operation::Adopt, fd.as_raw_fd(), errno);
        let statfs = rustix::fs::fstatfs(fd).map_err(error)?;
        if statfs.f_type as i64 != DMA_BUF_MAGIC {
            return Err(error(Errno::INVAL));
        }
        let own = rustix::io::fcntl_dupfd_cloexec(fd, 0).map_err(error)?;
        Self::from_fd(own)
    }

    /// Its size in bytes.
    pub fn length(&self) -> u64 {
        self.length
    }

    /// Maps the whole dma-buf, shared, for reading and, if `writable`, writing. A writable
    /// mapping needs a dma-buf exported with [`crate::ExportFlags::RDWR`] (else `EACCES`).
    ///
    /// The mapping stays valid after this `DmaBuf` is dropped.
    pub fn mmap(&self, writable: bool) -> Result<DmaBufMap, Error> {
        let error = |errno| Error::dma_buf(Operation::Mmap, self.fd.as_raw_fd(), errno);
        let length = usize::try_from(self.length).map_err(|_| error(Errno::NOMEM))?;
        let mapping = Mapping::new(self.fd.as_fd(), length, writable).map_err(error)?;
        Ok(DmaBufMap { mapping })
    }

    /// Brackets CPU access through a mapping (`DMA_BUF_IOCTL_SYNC`).
    pub fn sync(&self, flags: SyncFlags) -> Result<(), Error> {
        sys::sync(self.fd.as_fd(), flags.bits())
            .map_err(|errno| Error::dma_buf(Operation::Sync, self.fd.as_raw_fd(), errno))
    }

    /// Names the dma-buf (`DMA_BUF_SET_NAME`), as shown in `/proc/PID/fdinfo/FD` and
    /// `/sys/kernel/debug/dma_buf/bufinfo`: at most 31 bytes, no NUL.
    pub fn set_name(&self, name: &str) -> Result<(), Error> {
        let error = |errno| Error::dma_buf(Operation::SetName, self.fd.as_raw_fd(), errno);
        let name = CString::new(name).map_err(|_| error(Errno::INVAL))?;
        sys::set_name(self.fd.as_fd(), &name).map_err(error)
    }
}

impl AsFd for DmaBuf {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl From<DmaBuf> for OwnedFd {
    fn from(dma_buf: DmaBuf) -> Self {
        dma_buf.fd
    }
}

/// A CPU mapping of a whole dma-buf ([`DmaBuf::mmap`]), unmapped on drop.
///
/// The memory is device memory (HBM, mapped write-combined) that the device, peers and other
/// mappings may change at any time, so it is never lent out as a Rust slice: data moves in
/// and out by plain copies, [`DmaBufMap::read`] and [`DmaBufMap::write`]. Bracket them with
/// [`DmaBuf::sync`].
///
/// When the exporter revokes the dma-buf (its device reset, unbound or removed), its memory
/// is gone: a read or write through the mapping then raises `SIGBUS`, which kills the
/// process unless it handles the signal, and [`DmaBuf::sync`] fails with `ENODEV`. A process
/// that must outlive a reset watches the device ([`crate::Device::status`], or a
/// [`crate::RegCache`]'s listener) and stops touching the mapping once told.
///
/// A mapping of 2 MiB or more starts at a virtual address aligned to 2 MiB (1 GiB from
/// 1 GiB on), so that peerdirect can map it with 2 MiB and 1 GiB page-table entries where the
/// HBM range is aligned too: one fault and one TLB entry per huge page instead of one per
/// 4 KiB.
#[derive(Debug)]
pub struct DmaBufMap {
    mapping: Mapping,
}

impl DmaBufMap {
    /// Its length in bytes: the dma-buf's.
    pub fn length(&self) -> usize {
        self.mapping.len()
    }

    /// Whether it was mapped writable.
    pub fn is_writable(&self) -> bool {
        self.mapping.writable()
    }

    /// Copies bytes `offset..offset + buf.len()` of the dma-buf into `buf`.
    ///
    /// # Panics
    ///
    /// If the range is not inside the dma-buf.
    pub fn read(&self, offset: usize, buf: &mut [u8]) {
        self.mapping.read(offset, buf);
    }

    /// Copies `data` into bytes `offset..offset + data.len()` of the dma-buf.
    ///
    /// # Panics
    ///
    /// If the range is not inside the dma-buf, or the mapping is read-only.
    pub fn write(&mut self, offset: usize, data: &[u8]) {
        self.mapping.write(offset, data);
    }
}

#[cfg(test)]
mod tests {
    use std::fs::{self, OpenOptions};
    use std::os::unix::net::UnixStream;
    use std::path::PathBuf;

    use super::*;

    /// A file of its own under the system temp dir, removed on drop. A regular file stands in
    /// for a dma-buf: it has a size (lseek) and can be mapped, but knows no DMA-BUF ioctls.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(name: &str, len: usize) -> Self {
            let path = std::env::temp_dir().join(format!(
                "peerdirect-dma-buf-test-{}-{name}",
                std::process::id()
            ));
            fs::write(&path, vec![0u8; len]).unwrap();
            Self(path)
        }

        fn open(&self, writable: bool) -> DmaBuf {
            let file = OpenOptions::new()
                .read(true)
                .write(writable)
                .open(&self.0)
                .unwrap();
            DmaBuf::from_fd(OwnedFd::from(file)).unwrap()
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = fs::remove_file(&self.0);
        }
    }

    #[test]
    fn only_a_dma_buf_is_adopted() {
        let file = TempFile::new("adopt", 4096);
        let regular = file.open(false);
        let err = DmaBuf::from_borrowed(regular.as_fd()).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::INVAL));
        assert!(err.to_string().contains("not a dma-buf"), "{err}");
    }

    #[test]
    fn length_is_the_size() {
        let file = TempFile::new("length", 12288);
        assert_eq!(file.open(false).length(), 12288);
    }

    #[test]
    fn written_bytes_reach_the_file_and_other_mappings() {
        let file = TempFile::new("rw", 8192);
        let buf = file.open(true);
        let mut map = buf.mmap(true).unwrap();
        assert_eq!(map.length(), 8192);
        assert!(map.is_writable());
        map.write(4090, b"across a page");
        let other = buf.mmap(false).unwrap();
        assert!(!other.is_writable());
        let mut read = [0; 13];
        other.read(4090, &mut read);
        assert_eq!(&read, b"across a page");
        drop(map);
        drop(buf);
        // The mapping outlives the fd.
        other.read(4090, &mut read);
        assert_eq!(&read, b"across a page");
        assert_eq!(&fs::read(&file.0).unwrap()[4090..4103], b"across a page");
    }

    #[test]
    fn mappings_are_aligned_for_huge_entries() {
        use crate::sys::dma_buf::huge_alignment;
        assert_eq!(huge_alignment(4096), 0);
        assert_eq!(huge_alignment((2 << 20) - 4096), 0);
        assert_eq!(huge_alignment(2 << 20), 2 << 20);
        assert_eq!(huge_alignment((1 << 30) - 4096), 2 << 20);
        assert_eq!(huge_alignment(16 << 30), 1 << 30);
        // 4 MiB and two pages: aligned to 2 MiB, both ends reachable.
        let len = (4 << 20) + 8192;
        let file = TempFile::new("aligned", len);
        let buf = file.open(true);
        for _ in 0..4 {
            let mut map = buf.mmap(true).unwrap();
            assert_eq!(map.mapping.addr() % (2 << 20), 0);
            map.write(0, b"head");
            map.write(len - 4, b"tail");
            let mut read = [0; 4];
            map.read(len - 4, &mut read);
            assert_eq!(&read, b"tail");
        }
        let data = fs::read(&file.0).unwrap();
        assert_eq!((&data[..4], &data[len - 4..]), (&b"head"[..], &b"tail"[..]));
    }

    #[test]
    fn read_only_file_cannot_be_mapped_writable() {
        let file = TempFile::new("ro", 4096);
        let buf = file.open(false);
        let err = buf.mmap(true).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::ACCESS));
        assert!(err.hint().unwrap().contains("RDWR"), "{err}");
        assert!(buf.mmap(false).is_ok());
    }

    #[test]
    #[should_panic(expected = "outside the 4096-byte mapping")]
    fn reads_past_the_end_panic() {
        let file = TempFile::new("past", 4096);
        let map = file.open(false).mmap(false).unwrap();
        map.read(4000, &mut [0; 97]);
    }

    #[test]
    #[should_panic(expected = "read-only dma-buf mapping")]
    fn writes_to_a_read_only_mapping_panic() {
        let file = TempFile::new("rowrite", 4096);
        let mut map = file.open(false).mmap(false).unwrap();
        map.write(0, b"x");
    }

    #[test]
    fn a_regular_file_knows_no_dma_buf_commands() {
        let file = TempFile::new("notty", 4096);
        let buf = file.open(true);
        let err = buf.sync(SyncFlags::START_READ).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::NOTTY));
        assert!(
            err.to_string()
                .starts_with("DMA_BUF_IOCTL_SYNC on dma-buf fd "),
            "{err}"
        );
        assert_eq!(buf.set_name("x").unwrap_err().errno(), Some(Errno::NOTTY));
        // A name with a NUL never reaches the kernel.
        assert_eq!(
            buf.set_name("a\0b").unwrap_err().errno(),
            Some(Errno::INVAL)
        );
    }

    #[test]
    fn a_socket_has_no_size() {
        let (socket, _peer) = UnixStream::pair().unwrap();
        let err = DmaBuf::from_fd(OwnedFd::from(socket)).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::SPIPE));
        assert!(
            err.to_string().starts_with("lseek SEEK_END on dma-buf fd "),
            "{err}"
        );
    }

    #[test]
    fn sync_flags_are_dma_buf_sync_values() {
        assert_eq!(SyncFlags::START_READ.bits(), 1);
        assert_eq!(SyncFlags::START_WRITE.bits(), 2);
        assert_eq!((SyncFlags::READ | SyncFlags::WRITE).bits(), 3);
        assert_eq!(SyncFlags::END_READ.bits(), 5);
        assert_eq!(SyncFlags::END_WRITE.bits(), 6);
    }
}
