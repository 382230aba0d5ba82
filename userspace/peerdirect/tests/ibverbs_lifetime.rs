//! Lifetimes of ibverbs memory regions against their registrar, on a stand-in for libibverbs
//! (`tests/fake_ibverbs.c`, built here with the host's C compiler) that keeps verbs' rules and
//! counts what breaks them: a memory region must be deregistered in its own, still open,
//! context, and a protection domain with regions cannot be deallocated. Also the IOVA each
//! kind of source is registered at, as the stand-in received it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use peerdirect::cache::{Access, ByteRange, ExportId, RegKey, Registrar};
use peerdirect::registrar::ibverbs::{IbverbsError, IbverbsRegistrar};
use peerdirect::registrar::libfabric::{DmaBufSource, MappedDmaBuf};
use peerdirect::DmaBuf;

/// The stand-in library, built once per test process.
fn built() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir =
            std::env::temp_dir().join(format!("peerdirect-fake-ibverbs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let lib = dir.join("libfake_ibverbs.so");
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_ibverbs.c");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
        let status = Command::new(&cc)
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
            .arg(&lib)
            .arg(&source)
            .status()
            .unwrap_or_else(|err| panic!("running {cc}: {err}"));
        assert!(
            status.success(),
            "{cc} failed to build {}",
            source.display()
        );
        lib
    })
}

/// A copy of the stand-in of its own for `test`: each loaded copy has its own counters.
struct Fake {
    path: PathBuf,
    lib: libloading::Library,
}

impl Fake {
    fn new(test: &str) -> Self {
        let path = built().with_file_name(format!("libfake_ibverbs_{test}.so"));
        std::fs::copy(built(), &path).expect("copying the stand-in library");
        // SAFETY: the stand-in's constructors do nothing; its functions are only called below
        // with their C prototypes.
        let lib = unsafe { libloading::Library::new(&path) }.expect("loading the stand-in");
        Self { path, lib }
    }

    fn path(&self) -> &str {
        self.path.to_str().expect("a UTF-8 path")
    }

    fn count(&self, name: &str) -> i32 {
        let symbol = format!("fake_ibv_{name}\0");
        // SAFETY: every fake_ibv_* counter is `int f(void)`.
        let f = unsafe {
            self.lib
                .get::<unsafe extern "C" fn() -> i32>(symbol.as_bytes())
        }
        .expect("a counter of the stand-in");
        // SAFETY: it only reads a static.
        unsafe { f() }
    }

    /// What the stand-in's last `ibv_reg_dmabuf_mr` was given: `(offset, iova)`.
    fn last_registration(&self) -> (u64, u64) {
        let read = |name: &str| {
            let symbol = format!("fake_ibv_last_{name}\0");
            // SAFETY: `uint64_t fake_ibv_last_offset(void)` and `..._iova(void)` read a static.
            unsafe {
                let f = self
                    .lib
                    .get::<unsafe extern "C" fn() -> u64>(symbol.as_bytes())
                    .expect("a register of the stand-in");
                f()
            }
        };
        (read("offset"), read("iova"))
    }

    fn last_violation(&self) -> String {
        // SAFETY: `const char *fake_ibv_last_violation(void)`, a NUL-terminated static buffer.
        unsafe {
            let f = self
                .lib
                .get::<unsafe extern "C" fn() -> *const std::ffi::c_char>(
                    b"fake_ibv_last_violation\0",
                )
                .expect("fake_ibv_last_violation");
            std::ffi::CStr::from_ptr(f()).to_string_lossy().into_owned()
        }
    }

    /// A protection domain of the caller's own, on a context of its own: what a runtime
    /// hands `IbverbsRegistrar::from_raw_pd`.
    fn alloc_pd(&self) -> (*mut std::ffi::c_void, *mut std::ffi::c_void) {
        type Ptr = *mut std::ffi::c_void;
        // SAFETY: the stand-in's prototypes, as <infiniband/verbs.h> has them; the list is
        // freed once, the device pointer in it is static in the stand-in.
        unsafe {
            let list = self
                .lib
                .get::<unsafe extern "C" fn(*mut i32) -> *mut Ptr>(b"ibv_get_device_list\0")
                .expect("ibv_get_device_list");
            let free = self
                .lib
                .get::<unsafe extern "C" fn(*mut Ptr)>(b"ibv_free_device_list\0")
                .expect("ibv_free_device_list");
            let open = self
                .lib
                .get::<unsafe extern "C" fn(Ptr) -> Ptr>(b"ibv_open_device\0")
                .expect("ibv_open_device");
            let alloc_pd = self
                .lib
                .get::<unsafe extern "C" fn(Ptr) -> Ptr>(b"ibv_alloc_pd\0")
                .expect("ibv_alloc_pd");
            let devices = list(std::ptr::null_mut());
            let context = open(*devices);
            free(devices);
            (context, alloc_pd(context))
        }
    }

    /// Releases what [`Fake::alloc_pd`] made, as its owner would; returns `ibv_dealloc_pd`'s
    /// status (EBUSY while regions are left in it).
    fn release_pd(&self, context: *mut std::ffi::c_void, pd: *mut std::ffi::c_void) -> i32 {
        type Ptr = *mut std::ffi::c_void;
        // SAFETY: the stand-in's prototypes; both were made by `alloc_pd`, released once.
        unsafe {
            let dealloc = self
                .lib
                .get::<unsafe extern "C" fn(Ptr) -> i32>(b"ibv_dealloc_pd\0")
                .expect("ibv_dealloc_pd");
            let close = self
                .lib
                .get::<unsafe extern "C" fn(Ptr) -> i32>(b"ibv_close_device\0")
                .expect("ibv_close_device");
            let status = dealloc(pd);
            if status == 0 {
                close(context);
            }
            status
        }
    }

    /// No rule was broken, and every region, domain and context is released.
    fn assert_clean(&self) {
        assert_eq!(
            self.count("violations"),
            0,
            "libibverbs misused: {}",
            self.last_violation()
        );
        let live = ["live_mrs", "live_pds", "live_contexts"].map(|name| self.count(name));
        assert_eq!(
            live,
            [0, 0, 0],
            "memory regions, protection domains, contexts left"
        );
    }
}

/// A file that `DmaBuf::from_fd` takes (the stand-in ignores the fd), of 64 KiB.
fn source() -> DmaBuf {
    let mut file = tempfile();
    file.write_all(&[0; 64 << 10]).expect("writing the file");
    DmaBuf::from_fd(file.into()).expect("a dma-buf stand-in")
}

fn tempfile() -> std::fs::File {
    let path = built().with_file_name(format!("source-{:?}", std::thread::current().id()));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .expect("a temporary file");
    let _ = std::fs::remove_file(&path);
    file
}

fn key(registrar: &IbverbsRegistrar) -> RegKey {
    RegKey {
        domain: registrar.domain(),
        export: ExportId::new(0, 1),
        range: ByteRange::new(0, 4096).expect("a range"),
        access: Access::all(),
    }
}

#[test]
fn a_region_deregistered_through_another_registrar_uses_its_own_open_context() {
    let fake = Fake::new("cross");
    let a = IbverbsRegistrar::open_with(fake.path(), "fake0").expect("opening fake0");
    let b = IbverbsRegistrar::open_with(fake.path(), "fake0").expect("opening fake0 again");
    let source = source();
    let mr = a.register(&source, &key(&a)).expect("registering");
    drop(a);
    b.deregister(mr);
    drop(b);
    fake.assert_clean();
}

#[test]
fn a_region_that_outlives_its_registrar_is_deregistered_when_dropped() {
    let fake = Fake::new("outlives");
    let registrar = IbverbsRegistrar::open_with(fake.path(), "fake0").expect("opening fake0");
    let source = source();
    let mr = registrar
        .register(&source, &key(&registrar))
        .expect("registering");
    drop(registrar);
    assert_eq!(fake.count("live_contexts"), 1, "closed under a live region");
    drop(mr);
    fake.assert_clean();
}

#[test]
fn regions_deregistered_by_their_registrar_leave_nothing() {
    let fake = Fake::new("plain");
    let registrar = IbverbsRegistrar::open_with(fake.path(), "fake0").expect("opening fake0");
    let source = source();
    let mrs: Vec<_> = (0..3)
        .map(|_| {
            registrar
                .register(&source, &key(&registrar))
                .expect("registering")
        })
        .collect();
    assert_eq!(fake.count("live_mrs"), 3);
    for mr in mrs {
        registrar.deregister(mr);
    }
    drop(registrar);
    fake.assert_clean();
}

#[test]
fn a_borrowed_protection_domain_stays_its_owners() {
    let fake = Fake::new("borrowed");
    let (context, pd) = fake.alloc_pd();
    let pd = std::ptr::NonNull::new(pd).expect("a protection domain");
    // `pd` is released below only once the registrar and its regions are gone.
    // SAFETY: `pd` is a live ibv_pd of the stand-in at `fake.path()`; single-threaded here.
    let borrowed = unsafe { IbverbsRegistrar::from_raw_pd(fake.path(), pd) };
    let registrar = borrowed.expect("borrowing the pd");
    assert_eq!(registrar.device(), "fake0");
    let source = source();
    let mrs: Vec<_> = (0..2)
        .map(|_| {
            registrar
                .register(&source, &key(&registrar))
                .expect("registering")
        })
        .collect();
    assert_eq!((mrs[0].iova, mrs[0].length), (0, 4096));
    drop(registrar);
    // The regions outlive the registrar; the domain is still the caller's.
    assert_eq!(fake.count("live_mrs"), 2);
    assert_eq!(fake.release_pd(context, pd.as_ptr()), libc_ebusy());
    drop(mrs);
    assert_eq!(
        fake.count("live_pds"),
        1,
        "the registrar released the caller's pd"
    );
    assert_eq!(fake.release_pd(context, pd.as_ptr()), 0);
    fake.assert_clean();
}

/// `registrar`'s key for `offset..offset + length`.
fn key_at(registrar: &IbverbsRegistrar, offset: u64, length: u64) -> RegKey {
    RegKey {
        range: ByteRange::new(offset, length).expect("a range"),
        ..key(registrar)
    }
}

#[test]
fn a_dma_buf_alone_is_registered_at_iova_equal_to_its_offset() {
    let fake = Fake::new("iova_offset");
    let registrar = IbverbsRegistrar::open_with(fake.path(), "fake0").expect("opening fake0");
    let mr = registrar
        .register(&source(), &key_at(&registrar, 0x3000, 0x2000))
        .expect("registering");
    assert_eq!(fake.last_registration(), (0x3000, 0x3000));
    assert_eq!((mr.iova, mr.length), (0x3000, 0x2000));
    drop((mr, registrar));
    fake.assert_clean();
}

#[test]
fn a_source_at_the_callers_address_is_registered_at_that_address_plus_the_offset() {
    let fake = Fake::new("iova_base");
    let registrar = IbverbsRegistrar::open_with(fake.path(), "fake0").expect("opening fake0");
    // A runtime's device virtual address, as HCL names HBM.
    let base = 0x1000_0000_0000;
    let source = DmaBufSource::at(source(), base).expect("a source at the device address");
    let mr = registrar
        .register(&source, &key_at(&registrar, 0x3000, 0x2000))
        .expect("registering");
    // The dma-buf offset stays the offset; only the IOVA moves.
    assert_eq!(fake.last_registration(), (0x3000, base + 0x3000));
    assert_eq!((mr.iova, mr.length), (base + 0x3000, 0x2000));
    drop((mr, registrar));
    fake.assert_clean();
}

#[test]
fn a_mapped_source_is_registered_at_iova_equal_to_its_offset() {
    let fake = Fake::new("iova_mapped");
    let registrar = IbverbsRegistrar::open_with(fake.path(), "fake0").expect("opening fake0");
    let mapped = MappedDmaBuf::new(source()).expect("mapping the file");
    assert!(mapped.is_mapped());
    let mr = registrar
        .register(&*mapped, &key_at(&registrar, 0x1000, 0x1000))
        .expect("registering");
    assert_eq!(fake.last_registration(), (0x1000, 0x1000));
    assert_eq!(mr.iova, 0x1000);
    drop((mr, registrar));
    fake.assert_clean();
}

/// A source whose base leaves no room for the range below 2^64: refused before the call.
struct AtTheTop(DmaBuf);

impl peerdirect::registrar::ibverbs::IbvSource for AtTheTop {
    fn dma_buf(&self) -> &DmaBuf {
        &self.0
    }

    fn iova_base(&self) -> Option<u64> {
        Some(u64::MAX - 0x2fff)
    }
}

#[test]
fn iovas_past_the_top_of_the_address_space_are_refused() {
    let fake = Fake::new("iova_overflow");
    let registrar = IbverbsRegistrar::open_with(fake.path(), "fake0").expect("opening fake0");
    let source = AtTheTop(source());
    // A range whose end (IOVA + length) is 2^64 - 1 fits, as for `DmaBufSource::at`; one
    // byte more does not.
    let mr = registrar
        .register(&source, &key_at(&registrar, 0x1000, 0x1fff))
        .expect("the top of the address space");
    assert_eq!(mr.iova, u64::MAX - 0x1fff);
    drop(mr);
    let err = registrar
        .register(&source, &key_at(&registrar, 0x1000, 0x2000))
        .expect_err("past the top");
    assert!(
        matches!(err, IbverbsError::Register { errno, .. } if errno == rustix::io::Errno::OVERFLOW),
        "{err:?}"
    );
    assert_eq!(fake.count("live_mrs"), 0, "registered anyway");
    drop(registrar);
    fake.assert_clean();
}

/// `EBUSY`, as the stand-in returns it.
fn libc_ebusy() -> i32 {
    rustix::io::Errno::BUSY.raw_os_error()
}
