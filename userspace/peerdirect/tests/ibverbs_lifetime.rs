//! Lifetimes of ibverbs memory regions against their registrar, on a stand-in for libibverbs
//! (`tests/fake_ibverbs.c`, built here with the host's C compiler) that keeps verbs' rules and
//! counts what breaks them: a memory region must be deregistered in its own, still open,
//! context, and a protection domain with regions cannot be deallocated.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use peerdirect::cache::{Access, ByteRange, ExportId, RegKey, Registrar};
use peerdirect::registrar::ibverbs::IbverbsRegistrar;
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

/// A file that `DmaBuf::from_fd` takes (the stand-in ignores the fd).
fn source() -> DmaBuf {
    let mut file = tempfile();
    file.write_all(&[0; 4096]).expect("writing the file");
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

/// `EBUSY`, as the stand-in returns it.
fn libc_ebusy() -> i32 {
    rustix::io::Errno::BUSY.raw_os_error()
}
