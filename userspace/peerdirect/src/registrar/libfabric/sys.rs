//! libfabric through `dlopen`: the only place of the libfabric registrar with raw pointers.
//!
//! Most of libfabric's API is static inline wrappers over ops tables in `struct fid_*`
//! (`fi_mr_regattr(domain, ..)` is `domain->mr->regattr(&domain->fid, ..)`); this module calls
//! the tables the same way, with the layouts of `bindings.rs` (bindgen of libfabric 2.1's
//! headers, with compile-time layout asserts). Only the real functions (`fi_getinfo`,
//! `fi_freeinfo`, `fi_dupinfo`, `fi_fabric`, `fi_strerror`, `fi_version`) come from
//! `libfabric.so.1`. Every object is owned by a type that closes it on drop, after what
//! depends on it (an `Arc` to the parent keeps the parent open).

#![allow(unsafe_code)]

use core::ffi::{c_char, c_int, c_void, CStr};
use core::ptr::{self, NonNull};
use std::alloc::{self, Layout};
use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use libloading::Library;
use rustix::mm::{self, MapFlags, ProtFlags};

use super::bindings as b;

/// The library loaded at run time.
pub const LIBRARY: &str = "libfabric.so.1";

/// A negative libfabric return value (`-FI_E*`, errno values below 256).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FiErrno(pub(super) i32);

type Result<T> = core::result::Result<T, FiErrno>;

fn check(ret: isize) -> Result<()> {
    if ret < 0 {
        Err(FiErrno(i32::try_from(-ret).unwrap_or(i32::MAX)))
    } else {
        Ok(())
    }
}

/// The functions `libfabric.so.1` exports that this module uses.
pub(super) struct Lib {
    getinfo: unsafe extern "C" fn(
        u32,
        *const c_char,
        *const c_char,
        u64,
        *const b::fi_info,
        *mut *mut b::fi_info,
    ) -> c_int,
    freeinfo: unsafe extern "C" fn(*mut b::fi_info),
    dupinfo: unsafe extern "C" fn(*const b::fi_info) -> *mut b::fi_info,
    fabric:
        unsafe extern "C" fn(*mut b::fi_fabric_attr, *mut *mut b::fid_fabric, *mut c_void) -> c_int,
    strerror: unsafe extern "C" fn(c_int) -> *const c_char,
    version: unsafe extern "C" fn() -> u32,
    /// Keeps the functions above mapped; never unloaded (libfabric's providers register
    /// destructors and threads that must not outlive the library).
    _library: Library,
}

/// Why `libfabric.so.1` could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum LoadError {
    /// `dlopen` failed: the dynamic loader's message.
    NotFound(String),
    /// The library lacks a function: its name.
    MissingSymbol(&'static str),
}

impl Lib {
    /// The process's libfabric, loaded on first use.
    pub(super) fn get() -> core::result::Result<&'static Lib, LoadError> {
        static LIB: OnceLock<core::result::Result<Lib, LoadError>> = OnceLock::new();
        LIB.get_or_init(|| Lib::load(LIBRARY))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Loads `name` with `dlopen`, as libfabric.
    pub(super) fn load(name: &str) -> core::result::Result<Lib, LoadError> {
        let library =
            // SAFETY: loading a library runs its initializers; libfabric's (and those of the
            // system libraries it loads) only set up the library's own state.
            unsafe { Library::new(name) }.map_err(|e| LoadError::NotFound(e.to_string()))?;
        macro_rules! function {
            ($name:literal) => {
                // The pointer stays valid: `_library` is kept with it and never unloaded.
                // SAFETY: the symbol is the libfabric function of this name, whose C
                // signature (fabric.h) is the type of the field it is stored in.
                *unsafe { library.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|_| LoadError::MissingSymbol($name))?
            };
        }
        Ok(Lib {
            getinfo: function!("fi_getinfo"),
            freeinfo: function!("fi_freeinfo"),
            dupinfo: function!("fi_dupinfo"),
            fabric: function!("fi_fabric"),
            strerror: function!("fi_strerror"),
            version: function!("fi_version"),
            _library: library,
        })
    }

    /// `fi_version()`: `major << 16 | minor`.
    pub(super) fn version(&self) -> u32 {
        // SAFETY: fi_version takes nothing and returns the library's version.
        unsafe { (self.version)() }
    }

    /// `fi_strerror(errno)`.
    pub(super) fn strerror(&self, errno: FiErrno) -> String {
        // SAFETY: fi_strerror returns a pointer to a static NUL-terminated string (libc's
        // strerror text or libfabric's own table) for any value.
        let text = unsafe { (self.strerror)(errno.0) };
        if text.is_null() {
            return format!("error {}", errno.0);
        }
        // SAFETY: non-null, NUL-terminated and static (above).
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }
}

/// What `fi_getinfo` is asked for.
pub(super) struct Hints<'a> {
    pub(super) provider: &'a CStr,
    pub(super) ep_type: b::fi_ep_type,
    pub(super) caps: u64,
    pub(super) mode: u64,
    pub(super) mr_mode: c_int,
    pub(super) node: Option<&'a CStr>,
}

/// The first `fi_info` that `fi_getinfo` returned; the list is freed on drop.
pub(super) struct Info {
    lib: &'static Lib,
    info: NonNull<b::fi_info>,
}

// SAFETY: the fi_info list is plain data owned by this value; libfabric keeps no reference to
// it, and it is only read through `&self`.
unsafe impl Send for Info {}
// SAFETY: as above; nothing mutates it after fi_getinfo returned.
unsafe impl Sync for Info {}

/// The fields of an `fi_info` this crate reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct InfoFields {
    pub(super) provider: String,
    pub(super) domain: String,
    pub(super) caps: u64,
    pub(super) mode: u64,
    pub(super) mr_mode: c_int,
    pub(super) ep_type: b::fi_ep_type,
    pub(super) max_msg_size: usize,
}

fn string(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the fi_info strings are NUL-terminated and live as long as the fi_info, which
    // the caller borrows.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

impl Info {
    /// `fi_getinfo(version, node, NULL, node ? FI_SOURCE : 0, hints)`.
    pub(super) fn get(lib: &'static Lib, version: u32, hints: &Hints<'_>) -> Result<Info> {
        // SAFETY: fi_dupinfo(NULL) allocates an fi_info with all its attribute structs (what
        // the inline fi_allocinfo does), or returns NULL.
        let raw = NonNull::new(unsafe { (lib.dupinfo)(ptr::null()) }).ok_or(FiErrno(12))?;
        let h = raw.as_ptr();
        // `prov_name` borrows `hints.provider` only until it is reset to NULL below, before
        // fi_freeinfo (which would free() it) runs.
        // SAFETY: `h` and its attribute structs were just allocated by fi_dupinfo: ours.
        unsafe {
            (*h).caps = hints.caps;
            (*h).mode = hints.mode;
            (*(*h).ep_attr).type_ = hints.ep_type;
            (*(*h).domain_attr).mr_mode = hints.mr_mode;
            (*(*h).domain_attr).threading = b::FI_THREAD_SAFE;
            (*(*h).fabric_attr).prov_name = hints.provider.as_ptr().cast_mut();
        }
        let mut info = ptr::null_mut();
        let (node, flags) = match hints.node {
            Some(node) => (node.as_ptr(), b::FI_SOURCE),
            None => (ptr::null(), 0),
        };
        // SAFETY: `node` is NULL or a NUL-terminated string, the hints are a complete fi_info
        // (above), and `info` receives a list that we own.
        let ret = unsafe { (lib.getinfo)(version, node, ptr::null(), flags, h, &mut info) };
        // SAFETY: the hints are ours; the borrowed provider name is detached first so that
        // fi_freeinfo frees only what fi_dupinfo allocated.
        unsafe {
            (*(*h).fabric_attr).prov_name = ptr::null_mut();
            (lib.freeinfo)(h);
        }
        check(ret as isize)?;
        let info = NonNull::new(info).ok_or(FiErrno(b::FI_ENODATA as i32))?;
        Ok(Info { lib, info })
    }

    pub(super) fn fields(&self) -> InfoFields {
        let i = self.info.as_ptr();
        // SAFETY: fi_getinfo returned a complete fi_info: its attribute pointers are valid
        // for as long as the list, which `self` owns.
        unsafe {
            InfoFields {
                provider: string((*(*i).fabric_attr).prov_name),
                domain: string((*(*i).domain_attr).name),
                caps: (*i).caps,
                mode: (*i).mode,
                mr_mode: (*(*i).domain_attr).mr_mode,
                ep_type: (*(*i).ep_attr).type_,
                max_msg_size: (*(*i).ep_attr).max_msg_size,
            }
        }
    }
}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: the list came from fi_getinfo and is freed once, here.
        unsafe { (self.lib.freeinfo)(self.info.as_ptr()) }
    }
}

/// Closes a fid: `fid->ops->close(fid)`.
///
/// # Safety
///
/// `fid` is an open fid that nothing uses any more.
unsafe fn close(fid: *mut b::fid) {
    // SAFETY: the caller's contract; every fid has ops->close.
    unsafe {
        if let Some(close) = (*(*fid).ops).close {
            close(fid);
        }
    }
}

/// An open fabric (`fi_fabric`).
pub(super) struct Fabric {
    fabric: NonNull<b::fid_fabric>,
}

// SAFETY: the domains are opened with FI_THREAD_SAFE, and a fabric's calls are thread-safe.
unsafe impl Send for Fabric {}
// SAFETY: as above.
unsafe impl Sync for Fabric {}

impl Fabric {
    pub(super) fn open(info: &Info) -> Result<Arc<Fabric>> {
        let mut fabric = ptr::null_mut();
        // SAFETY: the fabric_attr comes from fi_getinfo (as fi_fabric wants) and `fabric`
        // receives the new fid.
        let ret = unsafe {
            (info.lib.fabric)(
                (*info.info.as_ptr()).fabric_attr,
                &mut fabric,
                ptr::null_mut(),
            )
        };
        check(ret as isize)?;
        let fabric = NonNull::new(fabric).ok_or(FiErrno(b::FI_ENODATA as i32))?;
        Ok(Arc::new(Fabric { fabric }))
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        // SAFETY: every domain holds an Arc to the fabric, so none is left.
        unsafe { close(ptr::addr_of_mut!((*self.fabric.as_ptr()).fid)) }
    }
}

/// An open domain (`fi_domain`), thread-safe (FI_THREAD_SAFE): opened here, or borrowed from
/// the caller ([`Domain::borrow`]), who opened it and closes it.
pub(super) struct Domain {
    domain: NonNull<b::fid_domain>,
    /// The fabric of a domain opened here, kept open as long as it; `None` when borrowed.
    fabric: Option<Arc<Fabric>>,
}

// SAFETY: opened with threading FI_THREAD_SAFE (Info::get asks for it); a borrowed domain's
// caller promises the same, or that it serializes every use (`Domain::borrow`).
unsafe impl Send for Domain {}
// SAFETY: as above.
unsafe impl Sync for Domain {}

impl Domain {
    pub(super) fn open(fabric: &Arc<Fabric>, info: &Info) -> Result<Arc<Domain>> {
        let mut domain = ptr::null_mut();
        // SAFETY: fi_domain(fabric, info, &domain, NULL): the fabric is open, the info is the
        // one it was opened from.
        let ret = unsafe {
            let f = fabric.fabric.as_ptr();
            let open = (*(*f).ops).domain.ok_or(FiErrno(b::FI_ENOSYS as i32))?;
            open(f, info.info.as_ptr(), &mut domain, ptr::null_mut())
        };
        check(ret as isize)?;
        let domain = NonNull::new(domain).ok_or(FiErrno(b::FI_ENODATA as i32))?;
        Ok(Arc::new(Domain {
            domain,
            fabric: Some(Arc::clone(fabric)),
        }))
    }

    /// A domain the caller opened (`fi_domain`) and will close; never closed here.
    ///
    /// # Safety
    ///
    /// `domain` is an open `struct fid_domain` of a libfabric whose ABI is the one the
    /// bindings describe (>= 1.20), and stays open until this `Domain` and every [`Mr`] made
    /// in it are dropped. Either it was opened with `FI_THREAD_SAFE`, or nothing uses it
    /// (here or elsewhere) concurrently with the registrations, deregistrations and their
    /// drops made through this `Domain`.
    pub(super) unsafe fn borrow(domain: NonNull<b::fid_domain>) -> Arc<Domain> {
        Arc::new(Domain {
            domain,
            fabric: None,
        })
    }

    /// Whether the domain was opened here (else borrowed).
    pub(super) fn is_owned(&self) -> bool {
        self.fabric.is_some()
    }

    fn fid(&self) -> *mut b::fid {
        // SAFETY: the domain is open; this only computes a field address.
        unsafe { ptr::addr_of_mut!((*self.domain.as_ptr()).fid) }
    }

    /// `fi_mr_regattr(domain, {dmabuf = {fd, offset, len, base_addr}, iface, device},
    /// FI_MR_DMABUF)`. Software providers use `base_addr + offset` as the CPU address of the
    /// region, which `memory` (the dma-buf's mapping, or the caller's addresses) provides; the
    /// MR keeps it.
    pub(super) fn register_dma_buf(
        self: &Arc<Self>,
        fd: BorrowedFd<'_>,
        range: DmaBufRange,
        access: u64,
        requested_key: u64,
        hmem: Hmem,
        memory: Arc<Memory>,
    ) -> Result<Mr> {
        let DmaBufRange { offset, len } = range;
        assert!(offset
            .checked_add(len)
            .is_some_and(|end| end <= memory.len as u64));
        // Zeroed first so that the padding after `fd` is defined too: libfabric 2.1's
        // offset-mode MR map reads this struct through the iovec side of the attr's union
        // (Documentation/rdma.md).
        // SAFETY: fi_mr_dmabuf is plain data (an int, integers, a pointer): zero is valid.
        let mut dmabuf: b::fi_mr_dmabuf = unsafe { core::mem::zeroed() };
        dmabuf.fd = fd.as_raw_fd();
        dmabuf.offset = offset;
        dmabuf.len = len as usize;
        dmabuf.base_addr = memory.ptr.as_ptr().cast();
        // SAFETY: fi_mr_attr is plain data (integers, pointers, unions of them): all zeroes is
        // a valid, empty value.
        let mut attr: b::fi_mr_attr = unsafe { core::mem::zeroed() };
        attr.__bindgen_anon_1.dmabuf = &dmabuf;
        attr.iov_count = 1;
        attr.access = access;
        attr.requested_key = requested_key;
        match hmem {
            Hmem::System => attr.iface = b::FI_HMEM_SYSTEM,
            Hmem::SynapseAi(device) => {
                attr.iface = b::FI_HMEM_SYNAPSEAI;
                attr.device.synapseai = device;
            }
        }
        self.regattr(&attr, b::FI_MR_DMABUF, memory)
    }

    /// `fi_mr_regattr` of all of `memory` (host memory) as an iovec.
    pub(super) fn register_host(
        self: &Arc<Self>,
        access: u64,
        requested_key: u64,
        memory: Arc<Memory>,
    ) -> Result<Mr> {
        let iov = b::iovec {
            iov_base: memory.ptr.as_ptr().cast(),
            iov_len: memory.len,
        };
        // SAFETY: as in register_dma_buf.
        let mut attr: b::fi_mr_attr = unsafe { core::mem::zeroed() };
        attr.__bindgen_anon_1.mr_iov = &iov;
        attr.iov_count = 1;
        attr.access = access;
        attr.requested_key = requested_key;
        attr.iface = b::FI_HMEM_SYSTEM;
        self.regattr(&attr, 0, memory)
    }

    fn regattr(
        self: &Arc<Self>,
        attr: &b::fi_mr_attr,
        flags: u64,
        memory: Arc<Memory>,
    ) -> Result<Mr> {
        let mut mr = ptr::null_mut();
        // domain->mr->regattr(&domain->fid, attr, flags, &mr) is what fi_mr_regattr does. The
        // registered memory lives in `memory`, which the Mr keeps until it has closed the MR.
        // SAFETY: `attr` and what it points to (iovec or fi_mr_dmabuf) outlive the call.
        let ret = unsafe {
            let d = self.domain.as_ptr();
            let ops = (*d).mr;
            if ops.is_null() {
                return Err(FiErrno(b::FI_ENOSYS as i32));
            }
            let regattr = (*ops).regattr.ok_or(FiErrno(b::FI_ENOSYS as i32))?;
            regattr(self.fid(), attr, flags, &mut mr)
        };
        check(ret as isize)?;
        let mr = NonNull::new(mr).ok_or(FiErrno(b::FI_ENODATA as i32))?;
        Ok(Mr {
            mr,
            memory,
            bound: None,
            _domain: Arc::clone(self),
        })
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        if self.is_owned() {
            // SAFETY: opened here (a borrowed one is its caller's to close); MRs, CQs, AVs
            // and endpoints hold an Arc to their domain: none is left.
            unsafe { close(self.fid()) }
        }
    }
}

/// Bytes `offset..offset + len` of a dma-buf.
#[derive(Debug, Clone, Copy)]
pub(super) struct DmaBufRange {
    pub(super) offset: u64,
    pub(super) len: u64,
}

/// `fi_mr_attr.iface` and `.device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hmem {
    System,
    SynapseAi(i32),
}

/// Memory the CPU reaches through a raw pointer: a dma-buf's mapping or a host staging
/// buffer. Never lent out as a Rust slice (a NIC and peers write it behind Rust's back); data
/// moves in and out by copies. Or an address range the caller names a dma-buf's bytes by
/// ([`Memory::foreign`]), which only the provider uses and this code never dereferences.
pub(super) struct Memory {
    pub(super) ptr: NonNull<u8>,
    len: usize,
    kind: MemoryKind,
}

enum MemoryKind {
    /// `mmap` of a dma-buf: unmapped on drop.
    Mapped,
    /// `std::alloc` with this layout: freed on drop.
    Heap(Layout),
    /// The caller's addresses for a dma-buf (a device's virtual addresses, say): registered as
    /// the dma-buf's `base_addr`, never read or written here, nothing to release.
    Foreign,
}

// SAFETY: the memory is process-wide; access goes through copies with raw pointers, and the
// callers serialize copies to a region with the transfers that use it (a staging buffer's
// slots belong to one direction's lock, whose holder alone copies into and out of them;
// `&mut` on the map).
unsafe impl Send for Memory {}
// SAFETY: as above.
unsafe impl Sync for Memory {}

impl Memory {
    /// Maps all `len` bytes of the dma-buf `fd`, shared, readable and writable.
    pub(super) fn map(fd: BorrowedFd<'_>, len: usize) -> rustix::io::Result<Arc<Memory>> {
        // SAFETY: no address hint and no MAP_FIXED: the kernel picks a range that overlaps
        // nothing this process uses.
        let ptr = unsafe {
            mm::mmap(
                ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        }?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(rustix::io::Errno::NOMEM)?;
        Ok(Arc::new(Memory {
            ptr,
            len,
            kind: MemoryKind::Mapped,
        }))
    }

    /// `len` bytes of zeroed, page-aligned host memory.
    pub(super) fn host(len: usize) -> Arc<Memory> {
        let layout = Layout::from_size_align(len.max(1), 4096).expect("a sane staging size");
        // SAFETY: the layout has a nonzero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        Arc::new(Memory {
            ptr,
            len,
            kind: MemoryKind::Heap(layout),
        })
    }

    /// `len` bytes at `base`, the address the caller names a dma-buf's first byte by: what
    /// the provider is given as `base_addr`, never dereferenced here (the copies below
    /// refuse it).
    pub(super) fn foreign(base: NonNull<u8>, len: usize) -> Arc<Memory> {
        Arc::new(Memory {
            ptr: base,
            len,
            kind: MemoryKind::Foreign,
        })
    }

    /// Whether the CPU may copy to and from it here (a mapping or host memory).
    pub(super) fn is_cpu(&self) -> bool {
        !matches!(self.kind, MemoryKind::Foreign)
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The address of its first byte.
    pub(super) fn base(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Whether every page of bytes `offset..offset + len` is mapped in this process now: for
    /// a foreign region, which may name a CPU mapping of the same bytes or addresses nothing
    /// here maps (a device's). Asked with `msync(MS_ASYNC)` over the pages, which fails with
    /// `ENOMEM` when a page is not mapped and otherwise, since Linux 2.6.19, does nothing.
    pub(super) fn is_mapped_here(&self, offset: usize, len: usize) -> bool {
        self.check(offset, len);
        if len == 0 {
            return true;
        }
        let page = rustix::param::page_size();
        let start = self.ptr.as_ptr() as usize + offset;
        let first = start & !(page - 1);
        let end = start + len;
        // SAFETY: MS_ASYNC writes nothing back and touches no byte of the range; the kernel
        // validates the range itself (unmapped: ENOMEM), so any address is fine to pass.
        unsafe { mm::msync(first as *mut _, end - first, mm::MsyncFlags::ASYNC) }.is_ok()
    }

    /// Panics unless `offset..offset + len` is inside the region and the CPU may copy there.
    fn check_copy(&self, offset: usize, len: usize) {
        assert!(
            self.is_cpu(),
            "a CPU copy of a region known only by the caller's address"
        );
        self.check(offset, len);
    }

    fn check(&self, offset: usize, len: usize) {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "bytes {offset}..+{len} are outside the {}-byte region",
            self.len
        );
    }

    /// Copies bytes `offset..offset + buf.len()` into `buf`.
    pub(super) fn read(&self, offset: usize, buf: &mut [u8]) {
        self.check_copy(offset, buf.len());
        // Checked: in bounds, and memory this process maps or owns (not foreign addresses).
        // SAFETY: so valid for `self`'s life; `buf` is Rust-owned, so the two do not overlap.
        unsafe {
            ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), buf.as_mut_ptr(), buf.len())
        }
    }

    /// Copies `data` to bytes `offset..offset + data.len()`.
    pub(super) fn write(&self, offset: usize, data: &[u8]) {
        self.check_copy(offset, data.len());
        // SAFETY: as in read; the memory is writable (a PROT_WRITE mapping or the heap).
        unsafe {
            ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len())
        }
    }

    /// Copies `len` bytes from `src` at `src_offset` to `self` at `offset`.
    pub(super) fn copy_from(&self, offset: usize, src: &Memory, src_offset: usize, len: usize) {
        self.check_copy(offset, len);
        src.check_copy(src_offset, len);
        // SAFETY: both ranges are in bounds of live regions this process maps or owns
        // (checked); `ptr::copy` allows overlap, so even the same region is fine.
        unsafe {
            ptr::copy(
                src.ptr.as_ptr().add(src_offset),
                self.ptr.as_ptr().add(offset),
                len,
            )
        }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        match self.kind {
            MemoryKind::Mapped => {
                // SAFETY: the range is the mapping `map` made, referenced by nothing else (every
                // MR and in-flight operation holds an Arc to this value).
                let _ = unsafe { mm::munmap(self.ptr.as_ptr().cast(), self.len) };
            }
            // SAFETY: allocated by `host` with this layout; nothing references it (above).
            MemoryKind::Heap(layout) => unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) },
            MemoryKind::Foreign => {}
        }
    }
}

/// A memory region (`fid_mr`), closed on drop, then its memory released.
pub(super) struct Mr {
    mr: NonNull<b::fid_mr>,
    memory: Arc<Memory>,
    /// The endpoint it is bound to ([`Mr::bind`]), kept (one of ours: open) until the MR is
    /// closed, as libfabric asks of an `FI_MR_ENDPOINT` MR.
    bound: Option<Arc<BindTo>>,
    /// Keeps the domain open until the MR is closed.
    _domain: Arc<Domain>,
}

// SAFETY: the domain is FI_THREAD_SAFE; key and desc are read-only after registration.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl Mr {
    /// `fi_mr_key(mr)`.
    pub(super) fn key(&self) -> u64 {
        // SAFETY: the MR is open; `key` is set at registration.
        unsafe { (*self.mr.as_ptr()).key }
    }

    /// `fi_mr_desc(mr)`, as an address (for display and for posting).
    pub(super) fn desc(&self) -> usize {
        // SAFETY: as above.
        unsafe { (*self.mr.as_ptr()).mem_desc as usize }
    }

    pub(super) fn memory(&self) -> &Arc<Memory> {
        &self.memory
    }

    /// `fi_mr_bind(mr, &ep->fid, 0)`: binds the MR to `to` (a domain with `FI_MR_ENDPOINT`
    /// creates MRs disabled, to be bound to an endpoint and then enabled; fi_mr(3): flags 0 for
    /// an endpoint). The MR keeps `to` from now on, whatever the call returns: a provider may
    /// hold on to the endpoint until the MR is closed.
    pub(super) fn bind(&mut self, to: Arc<BindTo>) -> Result<()> {
        let ep = to.ep();
        self.bound = Some(to);
        // fi_mr_bind is mr->fid.ops->bind(&mr->fid, &ep->fid, flags).
        // SAFETY: the MR is open; `ep` is an open endpoint of the MR's domain, kept open until
        // the MR is closed (`bound` above, or the caller's promise for a borrowed one).
        unsafe {
            let fid = ptr::addr_of_mut!((*self.mr.as_ptr()).fid);
            let bind = (*(*fid).ops).bind.ok_or(FiErrno(b::FI_ENOSYS as i32))?;
            check(bind(fid, ptr::addr_of_mut!((*ep).fid), 0) as isize)
        }
    }

    /// `fi_mr_enable(mr)`: the MR becomes usable, its key and descriptor final.
    pub(super) fn enable(&self) -> Result<()> {
        // fi_mr_enable is mr->fid.ops->control(&mr->fid, FI_ENABLE, NULL).
        // SAFETY: the MR is open; FI_ENABLE takes no argument.
        unsafe {
            let fid = ptr::addr_of_mut!((*self.mr.as_ptr()).fid);
            let control = (*(*fid).ops).control.ok_or(FiErrno(b::FI_ENOSYS as i32))?;
            check(control(fid, b::FI_ENABLE as c_int, ptr::null_mut()) as isize)
        }
    }
}

/// The endpoint MRs are bound to in a domain with `FI_MR_ENDPOINT`: one of ours, which every
/// MR bound to it keeps open, or one the caller opened and keeps open.
pub(super) enum BindTo {
    Ours(Arc<Endpoint>),
    Theirs(NonNull<b::fid_ep>),
}

// SAFETY: ours is Send + Sync; a borrowed endpoint is only handed to fi_mr_bind, which the
// caller of `BindTo::borrow` promises may be called from any thread.
unsafe impl Send for BindTo {}
// SAFETY: as above.
unsafe impl Sync for BindTo {}

impl BindTo {
    /// An endpoint the caller opened (`fi_endpoint`) and will close; never closed here.
    ///
    /// # Safety
    ///
    /// `ep` is an open, enabled `struct fid_ep` of the domain the MRs are registered in
    /// (libfabric >= 1.20's ABI), that stays open until every MR bound to it is closed, and
    /// that `fi_mr_bind` may name from any thread (an `FI_THREAD_SAFE` domain, or the caller
    /// serializes registrations with its own use of the endpoint).
    pub(super) unsafe fn borrow(ep: NonNull<b::fid_ep>) -> BindTo {
        BindTo::Theirs(ep)
    }

    fn ep(&self) -> *mut b::fid_ep {
        match self {
            BindTo::Ours(endpoint) => endpoint.ep.as_ptr(),
            BindTo::Theirs(ep) => ep.as_ptr(),
        }
    }

    /// Whether both name the same endpoint.
    pub(super) fn same(&self, other: &BindTo) -> bool {
        self.ep() == other.ep()
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // Posted operations hold an Arc to the MR's memory until their completion.
        // SAFETY: the MR is open and closed once, before `memory` goes, as libfabric asks.
        unsafe { close(ptr::addr_of_mut!((*self.mr.as_ptr()).fid)) }
    }
}

/// A tagged RDM endpoint with its own completion queue (FI_CQ_FORMAT_TAGGED) and address
/// vector (FI_AV_TABLE).
///
/// Several transfers may run on it at once, from several threads: each operation's context
/// names its transfer, and whichever thread reads a completion routes it to its transfer's
/// mailbox ([`Endpoint::completions`]).
pub(super) struct Endpoint {
    ep: NonNull<b::fid_ep>,
    cq: NonNull<b::fid_cq>,
    av: NonNull<b::fid_av>,
    book: Mutex<Book>,
    next_transfer: AtomicU64,
    _domain: Arc<Domain>,
}

/// What the endpoint knows of its operations.
#[derive(Default)]
struct Book {
    /// Operations posted and not yet completed, by their context's address: their context
    /// and memory stay alive here until the completion is read or the endpoint is closed.
    inflight: HashMap<usize, (Booked, Arc<Memory>)>,
    /// Transfers under way ([`Endpoint::begin`]); completions of other (ended) transfers'
    /// operations are dropped.
    open: HashSet<u64>,
    /// Completions read by another transfer's thread, waiting for their own.
    mailbox: HashMap<u64, Vec<Completion>>,
}

/// A completed operation of a transfer.
#[derive(Debug)]
pub(super) struct Completion {
    /// The operation's id within its transfer ([`Op::id`]).
    pub(super) op: u64,
    /// Bytes received, for receives; the operation's length otherwise.
    pub(super) len: usize,
    /// The tag of the message received, for receives (a receive's `ignore` bits may differ
    /// from what it asked for).
    pub(super) tag: u64,
    /// Its error, if it failed (`fi_cq_readerr`).
    pub(super) result: core::result::Result<(), CqError>,
}

/// A failed operation's error entry (`fi_cq_readerr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CqError {
    /// libfabric's error number (`err`).
    pub(super) errno: FiErrno,
    /// The provider's own (`prov_errno`: verbs' `ibv_wc_status`, say).
    pub(super) prov_errno: i32,
    /// What the provider says it means (`fi_cq_strerror`), when it says.
    pub(super) prov_text: Option<String>,
}

/// A transfer under way on an [`Endpoint`], from [`Endpoint::begin`] until dropped.
pub(super) struct Transfer<'a> {
    endpoint: &'a Endpoint,
    id: u64,
}

impl Drop for Transfer<'_> {
    fn drop(&mut self) {
        let mut book = self.endpoint.book();
        book.open.remove(&self.id);
        book.mailbox.remove(&self.id);
    }
}

// SAFETY: the domain is FI_THREAD_SAFE; `book` is behind a mutex.
unsafe impl Send for Endpoint {}
// SAFETY: as above.
unsafe impl Sync for Endpoint {}

/// What an [`Op`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A tagged send (`fi_tsend`).
    Send,
    /// A tagged receive (`fi_trecv`).
    Recv,
    /// An RMA read (`fi_read`) of the peer's memory at `addr` (an address or an offset, as
    /// the peer's domain's `FI_MR_VIRT_ADDR` says) in its MR `key`.
    Read { addr: u64, key: u64 },
    /// An RMA write (`fi_write`) into the peer's memory at `addr` in its MR `key`, as for
    /// [`Kind::Read`].
    Write { addr: u64, key: u64 },
}

impl Kind {
    /// Whether the bytes leave this side's memory (a send or an RMA write).
    pub(super) fn outbound(self) -> bool {
        matches!(self, Self::Send | Self::Write { .. })
    }
}

/// A tagged send or receive, or an RMA read, to post.
#[derive(Debug, Clone, Copy)]
pub(super) struct Op {
    pub(super) kind: Kind,
    /// Where in the MR's memory.
    pub(super) offset: usize,
    pub(super) len: usize,
    /// The peer (`fi_addr_t`; FI_ADDR_UNSPEC for receives from anyone).
    pub(super) peer: u64,
    pub(super) tag: u64,
    /// Receives: the bits of `tag` a message's may differ in (`fi_trecv`'s `ignore`).
    pub(super) ignore: u64,
    /// Names the operation in its completion, within its transfer.
    pub(super) id: u64,
}

/// An operation's context: libfabric may use it as scratch space (FI_CONTEXT2: 8 pointers).
#[repr(C)]
pub(super) struct Context {
    _scratch: b::fi_context2,
    transfer: u64,
    id: u64,
}

/// A posted operation's context, owned through the raw pointer libfabric was given
/// (`Box::into_raw`), so that nothing Rust does to the owner (moving it into and out of
/// the book) invalidates the provider's pointer. Freed on drop.
struct Booked(NonNull<Context>);

impl Booked {
    fn new(transfer: u64, id: u64) -> Booked {
        let context = Box::new(Context {
            // SAFETY: fi_context2 is eight pointers: zero is a valid value.
            _scratch: unsafe { core::mem::zeroed() },
            transfer,
            id,
        });
        Booked(NonNull::from(Box::leak(context)))
    }

    /// The pointer libfabric is given, and gives back in the completion.
    fn as_ptr(&self) -> *mut c_void {
        self.0.as_ptr().cast()
    }

    /// The transfer and the id within it (read through the raw pointer: the provider may be
    /// writing the scratch words meanwhile, so no reference to the whole context is made).
    fn names(&self) -> (u64, u64) {
        let c = self.0.as_ptr();
        // SAFETY: `c` is the live allocation `new` leaked (freed only by drop); the two words
        // are written once, before the pointer is handed out, and never by the provider.
        unsafe {
            (
                ptr::addr_of!((*c).transfer).read(),
                ptr::addr_of!((*c).id).read(),
            )
        }
    }

    fn transfer(&self) -> u64 {
        self.names().0
    }
}

impl Drop for Booked {
    fn drop(&mut self) {
        // SAFETY: from Box::leak in `new`, dropped once; the provider is done with it (its
        // completion was read, or the endpoint is closed).
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

impl Endpoint {
    pub(super) fn open(domain: &Arc<Domain>, info: &Info) -> Result<Endpoint> {
        let d = domain.domain.as_ptr();
        // SAFETY: all three attrs are plain data, valid when zeroed (defaults).
        let mut cq_attr: b::fi_cq_attr = unsafe { core::mem::zeroed() };
        cq_attr.format = b::FI_CQ_FORMAT_TAGGED;
        cq_attr.size = 256;
        // SAFETY: as above.
        let mut av_attr: b::fi_av_attr = unsafe { core::mem::zeroed() };
        av_attr.type_ = b::FI_AV_TABLE;
        let (mut cq, mut av, mut ep) = (ptr::null_mut(), ptr::null_mut(), ptr::null_mut());
        let enosys = FiErrno(b::FI_ENOSYS as i32);
        // The out pointers receive new fids, closed on the error paths and by Drop otherwise
        // (endpoint first).
        // SAFETY: fi_cq_open/fi_av_open/fi_endpoint on an open domain; attrs outlive the calls.
        unsafe {
            let ops = (*d).ops;
            check(
                (*ops).cq_open.ok_or(enosys)?(d, &mut cq_attr, &mut cq, ptr::null_mut()) as isize,
            )?;
            let cq = NonNull::new(cq).ok_or(enosys)?;
            // Each failure below closes what was opened before it.
            let ret = match (*ops).av_open {
                Some(av_open) => av_open(d, &mut av_attr, &mut av, ptr::null_mut()),
                None => -(b::FI_ENOSYS as c_int),
            };
            if ret < 0 || av.is_null() {
                close(ptr::addr_of_mut!((*cq.as_ptr()).fid));
                return Err(FiErrno(if ret < 0 { -ret } else { b::FI_ENOSYS as i32 }));
            }
            let av = NonNull::new_unchecked(av);
            let ret = match (*ops).endpoint {
                Some(endpoint) => endpoint(d, info.info.as_ptr(), &mut ep, ptr::null_mut()),
                None => -(b::FI_ENOSYS as c_int),
            };
            if ret < 0 || ep.is_null() {
                close(ptr::addr_of_mut!((*av.as_ptr()).fid));
                close(ptr::addr_of_mut!((*cq.as_ptr()).fid));
                return Err(FiErrno(if ret < 0 { -ret } else { b::FI_ENOSYS as i32 }));
            }
            let endpoint = Endpoint {
                ep: NonNull::new_unchecked(ep),
                cq,
                av,
                book: Mutex::default(),
                next_transfer: AtomicU64::new(1),
                _domain: Arc::clone(domain),
            };
            endpoint.bind(
                ptr::addr_of_mut!((*cq.as_ptr()).fid),
                b::FI_TRANSMIT as u64 | b::FI_RECV as u64,
            )?;
            endpoint.bind(ptr::addr_of_mut!((*av.as_ptr()).fid), 0)?;
            endpoint.control(b::FI_ENABLE as c_int)?;
            Ok(endpoint)
        }
    }

    fn ep_fid(&self) -> *mut b::fid {
        // SAFETY: field address of the open endpoint.
        unsafe { ptr::addr_of_mut!((*self.ep.as_ptr()).fid) }
    }

    fn bind(&self, fid: *mut b::fid, flags: u64) -> Result<()> {
        // SAFETY: fi_ep_bind(ep, fid, flags): ep->fid.ops->bind; `fid` is an open CQ or AV of
        // the endpoint's domain, closed only after the endpoint.
        unsafe {
            let ep = self.ep_fid();
            let bind = (*(*ep).ops).bind.ok_or(FiErrno(b::FI_ENOSYS as i32))?;
            check(bind(ep, fid, flags) as isize)
        }
    }

    fn control(&self, command: c_int) -> Result<()> {
        // SAFETY: fi_enable: ep->fid.ops->control(&ep->fid, FI_ENABLE, NULL).
        unsafe {
            let ep = self.ep_fid();
            let control = (*(*ep).ops).control.ok_or(FiErrno(b::FI_ENOSYS as i32))?;
            check(control(ep, command, ptr::null_mut()) as isize)
        }
    }

    /// `fi_getname`: the endpoint's address, for peers' address vectors.
    pub(super) fn name(&self) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; 256];
        let mut len = buf.len();
        // SAFETY: fi_getname: ep->cm->getname(&ep->fid, buf, &len) with a buffer of `len`
        // bytes; libfabric writes at most `len` and sets it to the address length.
        unsafe {
            let cm = (*self.ep.as_ptr()).cm;
            let getname = (*cm).getname.ok_or(FiErrno(b::FI_ENOSYS as i32))?;
            check(getname(self.ep_fid(), buf.as_mut_ptr().cast(), &mut len) as isize)?;
        }
        buf.truncate(len.min(256));
        Ok(buf)
    }

    /// `fi_av_insert` of one address: the peer's `fi_addr_t`.
    pub(super) fn insert(&self, address: &[u8]) -> Result<u64> {
        let mut fi_addr = 0u64;
        // SAFETY: fi_av_insert: av->ops->insert(av, addr, 1, &fi_addr, 0, NULL); `address` is
        // an endpoint name of this provider (from `name`) and outlives the call.
        let n = unsafe {
            let av = self.av.as_ptr();
            let insert = (*(*av).ops).insert.ok_or(FiErrno(b::FI_ENOSYS as i32))?;
            insert(
                av,
                address.as_ptr().cast(),
                1,
                &mut fi_addr,
                0,
                ptr::null_mut(),
            )
        };
        check(n as isize)?;
        if n != 1 {
            return Err(FiErrno(b::FI_EOTHER as i32));
        }
        Ok(fi_addr)
    }

    /// Posts a tagged send (`fi_tsend`) or receive (`fi_trecv`) of `len` bytes of `mr`'s
    /// memory at `offset`, an RMA read (`fi_read`) into them or an RMA write (`fi_write`) out
    /// of them, identified by `id` in its completion. `Err(FI_EAGAIN)` means: read
    /// completions, then retry.
    pub(super) fn post(&self, transfer: &Transfer<'_>, mr: &Mr, op: &Op) -> Result<()> {
        let Op {
            kind,
            offset,
            len,
            peer,
            tag,
            ignore,
            id,
        } = *op;
        mr.memory.check(offset, len);
        let context = Booked::new(transfer.id, id);
        let ctx = context.as_ptr();
        // Held across the post, so that no completion of it is read before it is booked.
        let mut book = self.book();
        // fi_tsend/fi_trecv: ep->tagged->send/recv; fi_read/fi_write: ep->rma->read/write. The
        // memory and the context box stay in `inflight` until the completion naming `ctx` is
        // read or the endpoint is closed. A read only writes our buffer and a write only reads
        // it; remote address and key are the peer's to check.
        // SAFETY: the buffer is inside `mr`'s memory (checked), `desc` is `mr`'s, both outlive it.
        let ret = unsafe {
            let tagged = (*self.ep.as_ptr()).tagged;
            // Wrapping: a foreign region's addresses are the caller's, not an allocation of
            // this process, so only the provider may make anything of them.
            let buf = mr.memory.ptr.as_ptr().wrapping_add(offset).cast::<c_void>();
            let desc = (*mr.mr.as_ptr()).mem_desc;
            let rma = (*self.ep.as_ptr()).rma;
            if matches!(kind, Kind::Read { .. } | Kind::Write { .. }) && rma.is_null() {
                return Err(FiErrno(b::FI_ENOSYS as i32));
            }
            if let Kind::Read { addr, key } = kind {
                (*rma).read.ok_or(FiErrno(b::FI_ENOSYS as i32))?(
                    self.ep.as_ptr(),
                    buf,
                    len,
                    desc,
                    peer,
                    addr,
                    key,
                    ctx,
                )
            } else if let Kind::Write { addr, key } = kind {
                (*rma).write.ok_or(FiErrno(b::FI_ENOSYS as i32))?(
                    self.ep.as_ptr(),
                    buf,
                    len,
                    desc,
                    peer,
                    addr,
                    key,
                    ctx,
                )
            } else if kind == Kind::Send {
                (*tagged).send.ok_or(FiErrno(b::FI_ENOSYS as i32))?(
                    self.ep.as_ptr(),
                    buf,
                    len,
                    desc,
                    peer,
                    tag,
                    ctx,
                )
            } else {
                (*tagged).recv.ok_or(FiErrno(b::FI_ENOSYS as i32))?(
                    self.ep.as_ptr(),
                    buf,
                    len,
                    desc,
                    peer,
                    tag,
                    ignore,
                    ctx,
                )
            }
        };
        check(ret)?;
        book.inflight
            .insert(ctx as usize, (context, Arc::clone(&mr.memory)));
        Ok(())
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        // Only maps are updated under it; a panic elsewhere leaves them consistent.
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a transfer: its operations' completions are routed to it until it is dropped.
    pub(super) fn begin(&self) -> Transfer<'_> {
        let id = self.next_transfer.fetch_add(1, Relaxed);
        self.book().open.insert(id);
        Transfer { endpoint: self, id }
    }

    /// How many of `transfer`'s operations are posted and not completed.
    pub(super) fn pending(&self, transfer: &Transfer<'_>) -> usize {
        self.book()
            .inflight
            .values()
            .filter(|(c, _)| c.transfer() == transfer.id)
            .count()
    }

    /// Asks the provider to cancel `transfer`'s pending operations (`fi_cancel`); each then
    /// completes with `FI_ECANCELED`, or normally if it was already done.
    ///
    /// Under the book's lock, which completions are also read under: each context cancelled
    /// is one the provider has not reported yet, so still alive, and still this transfer's
    /// (a context read and freed meanwhile could be reused by another transfer's operation).
    pub(super) fn cancel(&self, transfer: &Transfer<'_>) {
        let book = self.book();
        for (&ctx, _) in book
            .inflight
            .iter()
            .filter(|(_, (c, _))| c.transfer() == transfer.id)
        {
            // fi_cancel: ep->ops->cancel(&ep->fid, context). Its result is only a hint:
            // completions tell.
            // SAFETY: ctx is an operation posted on this open endpoint and still booked (the
            // lock is held), so alive and not yet reported by the provider.
            unsafe {
                let ops = (*self.ep.as_ptr()).ops;
                if let Some(cancel) = ops.as_ref().and_then(|ops| ops.cancel) {
                    cancel(self.ep_fid(), ctx as *mut c_void);
                }
            }
        }
    }

    /// Reads completions (`fi_cq_read`, which also drives manual progress) and routes them:
    /// `transfer`'s into `done` (with those other threads read for it before), other open
    /// transfers' into their mailboxes. An error is the completion queue's own, not an
    /// operation's (those are [`Completion::result`]).
    pub(super) fn completions(
        &self,
        transfer: &Transfer<'_>,
        done: &mut Vec<Completion>,
    ) -> Result<()> {
        // Held from the read to the routing: a context is booked exactly as long as the
        // provider may still report it, which is what `cancel` relies on.
        let mut book = self.book();
        if let Some(mail) = book.mailbox.remove(&transfer.id) {
            done.extend(mail);
        }
        // SAFETY: fi_cq_tagged_entry is plain data: zero is valid.
        let mut entries: [b::fi_cq_tagged_entry; 16] = unsafe { core::mem::zeroed() };
        // SAFETY: fi_cq_read: cq->ops->read(cq, buf, count) with room for `count` entries of
        // the CQ's format (FI_CQ_FORMAT_TAGGED).
        let n = unsafe {
            let cq = self.cq.as_ptr();
            match (*(*cq).ops).read {
                Some(read) => read(cq, entries.as_mut_ptr().cast(), entries.len()),
                None => -(b::FI_ENOSYS as isize),
            }
        };
        let mut read: Vec<(*mut c_void, usize, u64, core::result::Result<(), CqError>)> =
            Vec::new();
        if n == -(b::FI_EAVAIL as isize) {
            // SAFETY: zeroed fi_cq_err_entry is valid (plain data).
            let mut err: b::fi_cq_err_entry = unsafe { core::mem::zeroed() };
            err.src_addr = u64::MAX;
            // SAFETY: fi_cq_readerr: cq->ops->readerr(cq, &err, 0) into our entry.
            let got = unsafe {
                let cq = self.cq.as_ptr();
                match (*(*cq).ops).readerr {
                    Some(readerr) => readerr(cq, &mut err, 0),
                    None => -(b::FI_ENOSYS as isize),
                }
            };
            check(got)?;
            let mut buf = [0 as c_char; 128];
            // `err_data` is the provider's buffer (we passed err_data_size 0), valid until the
            // next read of the CQ; strerror returns NULL or a NUL-terminated string, copied out.
            // SAFETY: fi_cq_strerror (cq->ops->strerror) before the next read, as said above.
            let prov_text = unsafe {
                let cq = self.cq.as_ptr();
                (*(*cq).ops).strerror.and_then(|strerror| {
                    let text = strerror(
                        cq,
                        err.prov_errno,
                        err.err_data,
                        buf.as_mut_ptr(),
                        buf.len(),
                    );
                    (!text.is_null()).then(|| CStr::from_ptr(text).to_string_lossy().into_owned())
                })
            };
            let error = CqError {
                errno: FiErrno(err.err),
                prov_errno: err.prov_errno,
                prov_text: prov_text.filter(|t| !t.is_empty()),
            };
            read.push((err.op_context, err.len, err.tag, Err(error)));
        } else if n < 0 && n != -(b::FI_EAGAIN as isize) {
            return Err(FiErrno(i32::try_from(-n).unwrap_or(i32::MAX)));
        } else {
            let n = usize::try_from(n).unwrap_or(0).min(entries.len());
            read.extend(
                entries[..n]
                    .iter()
                    .map(|e| (e.op_context, e.len, e.tag, Ok(()))),
            );
        }
        for (context, len, tag, result) in read {
            // A context not booked is not ours (or already counted): ignored.
            let Some((c, _memory)) = book.inflight.remove(&(context as usize)) else {
                continue;
            };
            let (owner, op) = c.names();
            let completion = Completion {
                op,
                len,
                tag,
                result,
            };
            if owner == transfer.id {
                done.push(completion);
            } else if book.open.contains(&owner) {
                book.mailbox.entry(owner).or_default().push(completion);
            }
            // Else its transfer ended (after cancelling it): only its memory goes now.
        }
        Ok(())
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let book = self.book.get_mut().unwrap_or_else(|e| e.into_inner());
        if !book.inflight.is_empty() {
            // Operations that neither completed nor could be cancelled (a failed transfer's
            // rendezvous chunks nobody takes): the provider still holds their contexts and may
            // still use their memory, and closing the endpoint under them crashed libfabric
            // 2.1's ofi_rxm over verbs (a NULL dereference inside fi_close; compare
            // ofiwg/libfabric#11828). Left open, with their contexts, memory and domain, for
            // the life of the process.
            std::mem::forget(std::mem::take(&mut book.inflight));
            std::mem::forget(Arc::clone(&self._domain));
            return;
        }
        self.drain();
        // SAFETY: closing the endpoint ends its operations (none is left); then its CQ and AV,
        // only it uses.
        unsafe {
            close(self.ep_fid());
            close(ptr::addr_of_mut!((*self.av.as_ptr()).fid));
            close(ptr::addr_of_mut!((*self.cq.as_ptr()).fid));
        }
    }
}

/// How many times [`Endpoint::drain`] reads the completion queue.
const DRAIN_READS: usize = 256;

impl Endpoint {
    /// Before the endpoint is closed: reads its completion queue [`DRAIN_READS`] times, each
    /// read driving the provider's progress, so that what the provider has received but not
    /// yet handled (a message nobody asked for, a rendezvous request, flow-control credits) is
    /// handled while its connections are open.
    ///
    /// libfabric 2.1's ofi_rxm (Debian trixie's) closes a connection's endpoint, then handles
    /// the completions left in its queue, and for a message received there posts a new
    /// receive buffer on the endpoint it just closed: a use after free, which crashed a
    /// program closing an endpoint that a peer had sent to since its last read (fixed in
    /// libfabric after 2.1: ofiwg/libfabric 697688386, "fix the msg_ep use-after-free at
    /// connection teardown"). ofi_rxm handles at most one such completion per read
    /// (`FI_OFI_RXM_COMP_PER_PROGRESS`, default 1), and none of them shows in our queue, so
    /// the reads are counted rather than stopped at the first empty one. What a peer sends
    /// after the last read still reaches the old code path: stop peers first.
    fn drain(&self) {
        let transfer = self.begin();
        let mut done = Vec::new();
        for _ in 0..DRAIN_READS {
            // Nothing of ours is in flight (the caller checked): what is read is dropped.
            if self.completions(&transfer, &mut done).is_err() {
                break;
            }
            done.clear();
        }
    }
}

/// A C string for a provider or node name.
pub(super) fn c_string(s: &str) -> Option<CString> {
    CString::new(s).ok()
}

#[cfg(test)]
mod tests {
    //! The endpoint against an in-process provider (ops tables of our own), to make the
    //! interleavings of threads that a real provider only makes by chance.

    use super::*;
    use std::sync::Condvar;
    use std::time::{Duration, Instant};

    /// What the fake provider saw and holds; one endpoint at a time (the one test using it).
    #[derive(Default)]
    struct Fake {
        /// Contexts posted and not reported.
        posted: Vec<usize>,
        /// Contexts whose completion the next `fi_cq_read` reports.
        ready: Vec<usize>,
        /// `fi_cancel` calls, and those naming a context already reported (so, on the
        /// endpoint's side, perhaps freed and reused).
        cancels: usize,
        stale_cancels: Vec<usize>,
        /// The first cancel waits (bounded) for another thread to read completions.
        first_cancel: bool,
        other_read: bool,
        /// `fi_cq_read` calls, and how many there had been at each `close` of a fake object.
        reads: usize,
        reads_at_close: Vec<usize>,
    }

    static FAKE: Mutex<Option<Fake>> = Mutex::new(None);
    /// Held by each test that uses the fake provider: one at a time.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    /// `close` calls on the fake's objects.
    static CLOSES: AtomicU64 = AtomicU64::new(0);
    static WAKE: Condvar = Condvar::new();

    fn fake() -> MutexGuard<'static, Option<Fake>> {
        FAKE.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until `done` holds, for at most `limit`; whether it held.
    fn wait_for(limit: Duration, done: impl Fn(&Fake) -> bool) -> bool {
        let deadline = Instant::now() + limit;
        let mut state = fake();
        loop {
            if state.as_ref().is_some_and(&done) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = WAKE
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn with_fake<T>(f: impl FnOnce(&mut Fake) -> T) -> T {
        let mut state = fake();
        let out = f(state.as_mut().expect("the fake provider is set up"));
        WAKE.notify_all();
        out
    }

    unsafe extern "C" fn close(_: *mut b::fid) -> c_int {
        CLOSES.fetch_add(1, Relaxed);
        if let Some(f) = fake().as_mut() {
            f.reads_at_close.push(f.reads);
        }
        0
    }

    unsafe extern "C" fn send(
        _: *mut b::fid_ep,
        _: *const c_void,
        _: usize,
        _: *mut c_void,
        _: b::fi_addr_t,
        _: u64,
        context: *mut c_void,
    ) -> isize {
        with_fake(|f| f.posted.push(context as usize));
        0
    }

    unsafe extern "C" fn cancel(_: b::fid_t, context: *mut c_void) -> isize {
        let first = with_fake(|f| {
            f.cancels += 1;
            if !f.posted.contains(&(context as usize)) {
                f.stale_cancels.push(context as usize);
            }
            // The first cancel: the other posted operation completes now, and another
            // thread may read it while this call lasts.
            let first = !f.first_cancel;
            if first {
                f.first_cancel = true;
                f.ready = f
                    .posted
                    .iter()
                    .copied()
                    .filter(|&c| c != context as usize)
                    .collect();
            }
            first
        });
        if first {
            // Bounded: an endpoint that holds its book across the cancels keeps the reader
            // out, and this times out.
            wait_for(Duration::from_millis(300), |f| f.other_read);
        }
        0
    }

    unsafe extern "C" fn cq_read(_: *mut b::fid_cq, buf: *mut c_void, count: usize) -> isize {
        let ready: Vec<usize> = with_fake(|f| {
            f.reads += 1;
            let n = f.ready.len().min(count);
            let ready: Vec<usize> = f.ready.drain(..n).collect();
            f.posted.retain(|c| !ready.contains(c));
            ready
        });
        if ready.is_empty() {
            return -(b::FI_EAGAIN as isize);
        }
        let entries = buf.cast::<b::fi_cq_tagged_entry>();
        for (i, &context) in ready.iter().enumerate() {
            // SAFETY: the caller gave room for `count` tagged entries; i < count.
            unsafe {
                let mut entry: b::fi_cq_tagged_entry = core::mem::zeroed();
                entry.op_context = context as *mut c_void;
                entries.add(i).write(entry);
            }
        }
        ready.len() as isize
    }

    /// Leaks a zeroed `T` (plain data: ops tables and fids) for the fake's objects.
    fn leak<T>() -> &'static mut T {
        // SAFETY: only instantiated with bindgen's plain C structs, valid when zeroed.
        Box::leak(Box::new(unsafe { core::mem::zeroed::<T>() }))
    }

    /// An endpoint and an MR of 4 KiB host memory, on the fake provider.
    fn fake_endpoint() -> (Endpoint, Mr) {
        let fid_ops = leak::<b::fi_ops>();
        fid_ops.close = Some(close);
        let ep_ops = leak::<b::fi_ops_ep>();
        ep_ops.cancel = Some(cancel);
        let tagged = leak::<b::fi_ops_tagged>();
        tagged.send = Some(send);
        let cq_ops = leak::<b::fi_ops_cq>();
        cq_ops.read = Some(cq_read);
        let ep = leak::<b::fid_ep>();
        ep.fid.ops = fid_ops;
        ep.ops = ep_ops;
        ep.tagged = tagged;
        let cq = leak::<b::fid_cq>();
        cq.fid.ops = fid_ops;
        cq.ops = cq_ops;
        let av = leak::<b::fid_av>();
        av.fid.ops = fid_ops;
        let mr = leak::<b::fid_mr>();
        mr.fid.ops = fid_ops;
        // SAFETY: a fake domain nothing calls into; it outlives everything (leaked).
        let domain = unsafe { Domain::borrow(NonNull::from(leak::<b::fid_domain>())) };
        let endpoint = Endpoint {
            ep: NonNull::from(ep),
            cq: NonNull::from(cq),
            av: NonNull::from(av),
            book: Mutex::default(),
            next_transfer: AtomicU64::new(1),
            _domain: Arc::clone(&domain),
        };
        let mr = Mr {
            mr: NonNull::from(mr),
            memory: Memory::host(4096),
            bound: None,
            _domain: domain,
        };
        (endpoint, mr)
    }

    /// What the fake domain's `fi_mr_regattr` was given: flags, requested key, iface, device
    /// id, fd, base address.
    type Regattr = (u64, u64, u32, i32, i32, usize);
    static REGATTR: Mutex<Vec<Regattr>> = Mutex::new(Vec::new());

    unsafe extern "C" fn regattr(
        _: *mut b::fid,
        attr: *const b::fi_mr_attr,
        flags: u64,
        mr: *mut *mut b::fid_mr,
    ) -> c_int {
        // SAFETY: the endpoint passes a valid attr, and with FI_MR_DMABUF its dmabuf member;
        // the device union is read as the int every member of it starts with.
        let seen = unsafe {
            let attr = &*attr;
            let dmabuf = &*attr.__bindgen_anon_1.dmabuf;
            (
                flags,
                attr.requested_key,
                attr.iface,
                attr.device.synapseai,
                dmabuf.fd,
                dmabuf.base_addr as usize,
            )
        };
        REGATTR.lock().unwrap().push(seen);
        let fid_ops = leak::<b::fi_ops>();
        fid_ops.close = Some(close);
        let fake = leak::<b::fid_mr>();
        fake.fid.ops = fid_ops;
        fake.key = seen.1;
        // SAFETY: the caller's out pointer.
        unsafe { *mr = fake };
        0
    }

    /// A dma-buf registration passes the requested key, the iface and its device id, the fd
    /// and the caller's base address to `fi_mr_regattr` as they were given.
    #[test]
    fn a_dma_buf_registration_names_its_key_iface_and_device() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let mr_ops = leak::<b::fi_ops_mr>();
        mr_ops.regattr = Some(regattr);
        let d = leak::<b::fid_domain>();
        d.mr = mr_ops;
        // SAFETY: a fake domain whose only op is regattr; it outlives everything (leaked).
        let domain = unsafe { Domain::borrow(NonNull::from(d)) };
        use std::os::fd::AsFd;
        let file = std::fs::File::open("/dev/null").unwrap();
        let base = NonNull::new(0x7f00_0000_0000 as *mut u8).unwrap();
        let range = DmaBufRange {
            offset: 4096,
            len: 8192,
        };
        let access = b::FI_RECV as u64;
        for (hmem, key) in [(Hmem::System, 0x7001), (Hmem::SynapseAi(3), 0x7002)] {
            let memory = Memory::foreign(base, 1 << 20);
            let mr = domain
                .register_dma_buf(file.as_fd(), range, access, key, hmem, memory)
                .unwrap();
            assert_eq!(mr.key(), key);
        }
        let fd = file.as_raw_fd();
        assert_eq!(
            *REGATTR.lock().unwrap(),
            [
                (
                    b::FI_MR_DMABUF,
                    0x7001,
                    b::FI_HMEM_SYSTEM,
                    0,
                    fd,
                    base.as_ptr() as usize
                ),
                (
                    b::FI_MR_DMABUF,
                    0x7002,
                    b::FI_HMEM_SYNAPSEAI,
                    3,
                    fd,
                    base.as_ptr() as usize
                ),
            ]
        );
    }

    fn send_op(id: u64) -> Op {
        Op {
            kind: Kind::Send,
            offset: 0,
            len: 64,
            peer: 0,
            tag: 0,
            ignore: 0,
            id,
        }
    }

    /// A transfer that fails cancels its operations while another thread reads completions
    /// (another transfer's, or the same endpoint's progress): the reader must not complete,
    /// free and let a new post reuse a context the canceller is about to name.
    #[test]
    fn cancel_names_only_contexts_the_provider_has_not_reported() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        *fake() = Some(Fake::default());
        let (endpoint, mr) = fake_endpoint();
        let failing = endpoint.begin();
        endpoint.post(&failing, &mr, &send_op(1)).unwrap();
        endpoint.post(&failing, &mr, &send_op(2)).unwrap();
        let mut read = Vec::new();
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                assert!(
                    wait_for(Duration::from_secs(5), |f| f.first_cancel),
                    "no cancel within 5 s"
                );
                let other = endpoint.begin();
                let mut done = Vec::new();
                endpoint.completions(&other, &mut done).unwrap();
                with_fake(|f| f.other_read = true);
            });
            endpoint.cancel(&failing);
            reader.join().unwrap();
        });
        endpoint.completions(&failing, &mut read).unwrap();
        let state = fake().take().unwrap();
        assert_eq!(state.cancels, 2, "both posted operations are cancelled");
        assert!(
            state.stale_cancels.is_empty(),
            "fi_cancel named {} context(s) the provider had already reported complete \
             (on the endpoint's side freed, and free to be reused by another post)",
            state.stale_cancels.len()
        );
        assert_eq!(
            read.len(),
            1,
            "the completed operation reaches its transfer"
        );
        assert_eq!(endpoint.pending(&failing), 1);
    }

    /// An endpoint whose operations the provider still holds (neither completed nor
    /// cancelled) is left open, with their contexts and memory; one with none is closed (its
    /// endpoint, AV and CQ).
    #[test]
    fn an_endpoint_with_operations_the_provider_still_holds_is_left_open() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        *fake() = Some(Fake::default());
        let (endpoint, mr) = fake_endpoint();
        let transfer = endpoint.begin();
        endpoint.post(&transfer, &mr, &send_op(1)).unwrap();
        let held = Arc::clone(&mr.memory);
        drop(transfer);
        let before = CLOSES.load(Relaxed);
        drop(endpoint);
        assert_eq!(
            CLOSES.load(Relaxed),
            before,
            "closed under a held operation"
        );
        assert_eq!(
            Arc::strong_count(&held),
            3,
            "the operation's memory is kept (the MR's, the leaked operation's, this test's)"
        );

        let (endpoint, mr) = fake_endpoint();
        let transfer = endpoint.begin();
        endpoint.post(&transfer, &mr, &send_op(1)).unwrap();
        with_fake(|f| f.ready = f.posted.clone());
        let mut done = Vec::new();
        endpoint.completions(&transfer, &mut done).unwrap();
        assert_eq!(done.len(), 1);
        drop(transfer);
        let before = CLOSES.load(Relaxed);
        drop(endpoint);
        assert_eq!(
            CLOSES.load(Relaxed),
            before + 3,
            "endpoint, AV and CQ closed"
        );
        fake().take();
    }

    /// An endpoint with nothing of ours in flight reads its queue [`DRAIN_READS`] times
    /// before it is closed (what the provider received meanwhile is handled while its
    /// connections are open: libfabric 2.1's ofi_rxm handled it after, on freed memory), and
    /// drops what it reads.
    #[test]
    fn an_endpoint_reads_its_queue_before_it_is_closed() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        *fake() = Some(Fake::default());
        let (endpoint, _mr) = fake_endpoint();
        // A completion of nothing booked: the provider's own, as far as the endpoint knows.
        with_fake(|f| f.ready = vec![0x1000]);
        drop(endpoint);
        let f = fake().take().expect("set up above");
        assert_eq!(
            f.reads_at_close, [DRAIN_READS; 3],
            "reads before each close (endpoint, AV, CQ)"
        );
        assert!(f.ready.is_empty(), "the queue's completion was read");
    }
}

#[cfg(test)]
pub(super) mod fake {
    //! An in-process provider for the registrar's tests: a library that is never asked for
    //! anything but error strings, and a borrowed domain whose MRs write down, in order, what
    //! is done to them (each domain has a log of its own, reached through its fids' `context`,
    //! so tests may run at once).

    use super::*;

    /// A call the fake provider received.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Call {
        /// `fi_mr_regattr` with this requested key, making the MR at this address.
        Regattr { key: u64, mr: usize },
        /// `fi_mr_bind(mr, bfid, flags)`.
        Bind { mr: usize, fid: usize, flags: u64 },
        /// `fi_mr_enable(mr)`.
        Enable { mr: usize },
        /// `fi_close` of an MR.
        CloseMr { mr: usize },
        /// `fi_close` of an endpoint.
        CloseEp { ep: usize },
    }

    /// `FI_KEY_NOTAVAIL`: an MR's key before it is enabled (as cxi's are).
    pub(crate) const KEY_NOTAVAIL: u64 = u64::MAX;
    /// The descriptor an enabled MR gets.
    pub(crate) const DESC: usize = 0xde5c;

    /// A fake domain's log and behaviour.
    pub(crate) struct Log {
        calls: Mutex<Vec<Call>>,
        /// MRs are made disabled (`FI_MR_ENDPOINT`): key `KEY_NOTAVAIL` and no descriptor
        /// until enabled; else both are set at registration.
        disabled: bool,
        /// What `fi_mr_bind` and `fi_mr_enable` return.
        bind_ret: c_int,
        enable_ret: c_int,
    }

    impl Log {
        pub(crate) fn calls(&self) -> Vec<Call> {
            self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
        }

        fn push(&self, call: Call) {
            self.calls
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(call);
        }
    }

    /// The log a fid's context points to.
    ///
    /// # Safety
    ///
    /// `fid` is one of the fake's, whose context is a leaked `Log`.
    unsafe fn log<'a>(fid: *mut b::fid) -> &'a Log {
        // SAFETY: the caller's contract: the context was set to a leaked Log, never freed.
        unsafe { &*(*fid).context.cast::<Log>() }
    }

    /// Leaks a zeroed `T` (plain data: ops tables and fids) for the fake's objects.
    fn leak<T>() -> &'static mut T {
        // SAFETY: only instantiated with bindgen's plain C structs, valid when zeroed.
        Box::leak(Box::new(unsafe { core::mem::zeroed::<T>() }))
    }

    unsafe extern "C" fn close_mr(fid: *mut b::fid) -> c_int {
        // SAFETY: called by Mr's drop on a fake MR, whose context is its domain's log.
        unsafe { log(fid) }.push(Call::CloseMr { mr: fid as usize });
        0
    }

    unsafe extern "C" fn close_ep(fid: *mut b::fid) -> c_int {
        // SAFETY: called by Endpoint's drop on the fake endpoint, whose context is the log.
        unsafe { log(fid) }.push(Call::CloseEp { ep: fid as usize });
        0
    }

    unsafe extern "C" fn close_quietly(_: *mut b::fid) -> c_int {
        0
    }

    /// `fi_cq_read` of a queue that never has a completion.
    unsafe extern "C" fn cq_empty(_: *mut b::fid_cq, _: *mut c_void, _: usize) -> isize {
        -(b::FI_EAGAIN as isize)
    }

    unsafe extern "C" fn bind(fid: *mut b::fid, bfid: *mut b::fid, flags: u64) -> c_int {
        // SAFETY: `fid` is a fake MR (only they have this op).
        let log = unsafe { log(fid) };
        log.push(Call::Bind {
            mr: fid as usize,
            fid: bfid as usize,
            flags,
        });
        log.bind_ret
    }

    unsafe extern "C" fn control(fid: *mut b::fid, command: c_int, _: *mut c_void) -> c_int {
        // SAFETY: `fid` is a fake MR (only they have this op).
        let log = unsafe { log(fid) };
        assert_eq!(
            command,
            b::FI_ENABLE as c_int,
            "the only control asked of an MR"
        );
        log.push(Call::Enable { mr: fid as usize });
        if log.enable_ret == 0 {
            // Enabled: the key and the descriptor are final now.
            // SAFETY: `fid` is the first member of a fake, leaked fid_mr.
            unsafe {
                let mr = fid.cast::<b::fid_mr>();
                (*mr).key = requested_key_of(mr);
                (*mr).mem_desc = DESC as *mut c_void;
            }
        }
        log.enable_ret
    }

    /// The key an MR was registered with, which the fake keeps next to it.
    ///
    /// # Safety
    ///
    /// `mr` is a fake MR (made by `regattr`, inside a `FakeMr`).
    unsafe fn requested_key_of(mr: *mut b::fid_mr) -> u64 {
        // SAFETY: the caller's contract: `mr` is the first field of a repr(C) FakeMr.
        unsafe { (*mr.cast::<FakeMr>()).requested_key }
    }

    /// A fake MR: the fid_mr the caller sees, and the key to give it when enabled.
    #[repr(C)]
    struct FakeMr {
        mr: b::fid_mr,
        requested_key: u64,
    }

    unsafe extern "C" fn regattr(
        fid: *mut b::fid,
        attr: *const b::fi_mr_attr,
        _: u64,
        mr: *mut *mut b::fid_mr,
    ) -> c_int {
        // SAFETY: `fid` is the fake domain's; the registrar passes a valid attr.
        let (log, key) = unsafe { (log(fid), (*attr).requested_key) };
        let ops = leak::<b::fi_ops>();
        ops.close = Some(close_mr);
        ops.bind = Some(bind);
        ops.control = Some(control);
        let fake = Box::leak(Box::new(FakeMr {
            // SAFETY: fid_mr is plain data: zero is valid.
            mr: unsafe { core::mem::zeroed() },
            requested_key: key,
        }));
        fake.mr.fid.ops = ops;
        // SAFETY: reading the domain fid's context (the log), to share it with the MR.
        fake.mr.fid.context = unsafe { (*fid).context };
        if log.disabled {
            fake.mr.key = KEY_NOTAVAIL;
        } else {
            fake.mr.key = key;
            fake.mr.mem_desc = DESC as *mut c_void;
        }
        let made: *mut b::fid_mr = &mut fake.mr;
        log.push(Call::Regattr {
            key,
            mr: made as usize,
        });
        // SAFETY: the caller's out pointer.
        unsafe { *mr = made };
        0
    }

    unsafe extern "C" fn no_getinfo(
        _: u32,
        _: *const c_char,
        _: *const c_char,
        _: u64,
        _: *const b::fi_info,
        _: *mut *mut b::fi_info,
    ) -> c_int {
        -(b::FI_ENOSYS as c_int)
    }
    unsafe extern "C" fn no_freeinfo(_: *mut b::fi_info) {}
    unsafe extern "C" fn no_dupinfo(_: *const b::fi_info) -> *mut b::fi_info {
        ptr::null_mut()
    }
    unsafe extern "C" fn no_fabric(
        _: *mut b::fi_fabric_attr,
        _: *mut *mut b::fid_fabric,
        _: *mut c_void,
    ) -> c_int {
        -(b::FI_ENOSYS as c_int)
    }
    unsafe extern "C" fn strerror(_: c_int) -> *const c_char {
        c"fake provider error".as_ptr()
    }
    unsafe extern "C" fn version() -> u32 {
        2 << 16 | 1
    }

    /// A library whose only useful functions are `fi_strerror` ("fake provider error") and
    /// `fi_version` (2.1): what a registrar of a borrowed domain calls.
    pub(crate) fn lib() -> &'static Lib {
        static LIB: OnceLock<Lib> = OnceLock::new();
        LIB.get_or_init(|| Lib {
            getinfo: no_getinfo,
            freeinfo: no_freeinfo,
            dupinfo: no_dupinfo,
            fabric: no_fabric,
            strerror,
            version,
            _library: libloading::os::unix::Library::this().into(),
        })
    }

    /// A borrowed domain whose `fi_mr_regattr` makes fake MRs (disabled ones if `disabled`,
    /// as a domain with `FI_MR_ENDPOINT` makes them), whose `fi_mr_bind` and `fi_mr_enable`
    /// return `bind_ret` and `enable_ret`; and its log.
    pub(crate) fn domain(
        disabled: bool,
        bind_ret: c_int,
        enable_ret: c_int,
    ) -> (Arc<Domain>, &'static Log) {
        let log: &'static Log = Box::leak(Box::new(Log {
            calls: Mutex::default(),
            disabled,
            bind_ret,
            enable_ret,
        }));
        let mr_ops = leak::<b::fi_ops_mr>();
        mr_ops.regattr = Some(regattr);
        let d = leak::<b::fid_domain>();
        d.mr = mr_ops;
        d.fid.context = ptr::from_ref(log).cast_mut().cast();
        // SAFETY: a fake domain whose only op is regattr; it outlives everything (leaked).
        (unsafe { Domain::borrow(NonNull::from(d)) }, log)
    }

    /// An endpoint of `domain` (made by [`domain`]) whose close is written to the log.
    pub(crate) fn endpoint(domain: &Arc<Domain>) -> Endpoint {
        let context = {
            let d = domain.domain.as_ptr();
            // SAFETY: the fake domain is leaked, so alive.
            unsafe { (*d).fid.context }
        };
        let ep_ops = leak::<b::fi_ops>();
        ep_ops.close = Some(close_ep);
        let other_ops = leak::<b::fi_ops>();
        other_ops.close = Some(close_quietly);
        let ep = leak::<b::fid_ep>();
        ep.fid.ops = ep_ops;
        ep.fid.context = context;
        let cq_ops = leak::<b::fi_ops_cq>();
        cq_ops.read = Some(cq_empty);
        let cq = leak::<b::fid_cq>();
        cq.fid.ops = other_ops;
        cq.ops = cq_ops;
        let av = leak::<b::fid_av>();
        av.fid.ops = other_ops;
        Endpoint {
            ep: NonNull::from(ep),
            cq: NonNull::from(cq),
            av: NonNull::from(av),
            book: Mutex::default(),
            next_transfer: AtomicU64::new(1),
            _domain: Arc::clone(domain),
        }
    }

    /// A `struct fid_ep` nothing calls into, as a runtime's endpoint the registrar only names
    /// in `fi_mr_bind`: its address.
    pub(crate) fn foreign_endpoint() -> NonNull<b::fid_ep> {
        NonNull::from(leak::<b::fid_ep>())
    }

    /// The address `fi_mr_bind` is given for an endpoint: its fid's.
    pub(crate) fn fid_of(ep: NonNull<b::fid_ep>) -> usize {
        // SAFETY: only a field address is computed.
        unsafe { ptr::addr_of_mut!((*ep.as_ptr()).fid) as usize }
    }

    /// The address `fi_mr_bind` is given for one of our endpoints.
    pub(crate) fn fid_of_ours(endpoint: &Endpoint) -> usize {
        endpoint.ep_fid() as usize
    }
}
