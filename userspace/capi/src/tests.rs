//! The hand-written header against this crate: every function's C type and every struct's
//! layout and constant, compiled with the C compiler (`cc`, or `$CC`) and compared. Also the
//! checks the C functions make before calling into the crate, where no C test reaches them.

use std::collections::BTreeSet;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::mem::{align_of, offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;
use crate::abi::*;
use crate::regcache::*;

/// The C spelling of a Rust type of the ABI, as `stringify!` writes it.
fn c_type(rust: &str) -> String {
    if let Some(pointee) = rust.strip_prefix("*mut ") {
        return format!("{} *", c_type(pointee));
    }
    if let Some(pointee) = rust.strip_prefix("*const ") {
        return format!("const {} *", c_type(pointee));
    }
    match rust {
        "()" => "void",
        "c_int" => "int",
        "c_uint" => "unsigned",
        "c_char" => "char",
        "u32" => "uint32_t",
        "u64" => "uint64_t",
        "usize" => "size_t",
        "PdDevice" => "pd_device",
        "PdAllocation" => "pd_allocation",
        "PdDeviceInfo" => "struct pd_device_info",
        "PdStats" => "struct pd_stats",
        "PdRegCache" => "pd_regcache",
        "PdMr" => "pd_mr",
        "PdMrStorage" => "pd_mr_storage",
        "PdRegcacheStats" => "struct pd_regcache_stats",
        "FidDomain" => "struct fid_domain",
        "FidEp" => "struct fid_ep",
        "PdDomain" => "pd_domain",
        "IbvPd" => "struct ibv_pd",
        "Option<PdInvalidateFn>" | "Option < PdInvalidateFn >" => "pd_invalidate_fn",
        "Option<PdKeyAllocFn>" | "Option < PdKeyAllocFn >" => "pd_key_alloc_fn",
        "Option<PdKeyReleaseFn>" | "Option < PdKeyReleaseFn >" => "pd_key_release_fn",
        "c_void" => "void",
        other => panic!("no C spelling for the Rust type {other}"),
    }
    .to_owned()
}

/// `(name, C declaration of a pointer to it)` per function. The coercion to the listed
/// Rust signature fails to compile if the function differs from it.
macro_rules! signatures {
    ($($name:ident($($arg:ty),*) -> $ret:ty;)*) => {
        vec![$({
            let _: unsafe extern "C" fn($($arg),*) -> $ret = $name;
            let args: Vec<String> = vec![$(c_type(stringify!($arg))),*];
            let args = if args.is_empty() { "void".to_owned() } else { args.join(", ") };
            (
                stringify!($name),
                format!("{} (*check_{})({args}) = {};", c_type(stringify!($ret)), stringify!($name), stringify!($name)),
            )
        }),*]
    };
}

fn signatures() -> Vec<(&'static str, String)> {
    signatures! {
        pd_device_open(c_uint, *mut c_int) -> *mut PdDevice;
        pd_device_open_path(*const c_char, *mut c_int) -> *mut PdDevice;
        pd_device_close(*mut PdDevice) -> ();
        pd_device_info(*const PdDevice, *mut PdDeviceInfo) -> c_int;
        pd_alloc(*mut PdDevice, u64, u64, *mut *mut PdAllocation) -> c_int;
        pd_allocation_free(*mut PdAllocation) -> c_int;
        pd_allocation_length(*const PdAllocation) -> u64;
        pd_allocation_hbm_offset(*const PdAllocation) -> u64;
        pd_allocation_handle(*const PdAllocation) -> u32;
        pd_export(*const PdAllocation, u64, u64, u32, *mut c_int) -> c_int;
        pd_export_range(*const PdDevice, u64, u64, u32, *mut c_int) -> c_int;
        pd_companion_reset_prepare(*const PdDevice) -> c_int;
        pd_companion_reset_done(*const PdDevice) -> c_int;
        pd_stats(c_uint, *mut PdStats) -> c_int;
        pd_regcache_new(*mut c_int) -> *mut PdRegCache;
        pd_regcache_free(*mut PdRegCache) -> ();
        pd_domain_attach(*mut PdRegCache, *mut FidDomain, *mut c_int) -> *mut PdDomain;
        pd_domain_attach_verbs(*mut PdRegCache, *mut IbvPd, *mut c_int) -> *mut PdDomain;
        pd_domain_detach(*mut PdDomain) -> c_int;
        pd_register(*mut PdDomain, *const PdAllocation, u64, u64, u32, *mut *mut PdMr) -> c_int;
        pd_register_in(*mut PdDomain, *const PdAllocation, u64, u64, u32, *mut PdMrStorage, *mut *mut PdMr) -> c_int;
        pd_regcache_set_invalidate_callback(*mut PdRegCache, Option<PdInvalidateFn>, *mut c_void) -> c_int;
        pd_domain_set_keys(*mut PdDomain, Option<PdKeyAllocFn>, Option<PdKeyReleaseFn>, *mut c_void, usize) -> c_int;
        pd_domain_set_iface(*mut PdDomain, u32, c_int) -> c_int;
        pd_domain_set_endpoint(*mut PdDomain, *mut FidEp) -> c_int;
        pd_regcache_stats(*const PdRegCache, *mut PdRegcacheStats) -> c_int;
        pd_regcache_set_host_bounce(*mut PdRegCache, c_int) -> c_int;
        pd_register_dmabuf(*mut PdDomain, c_int, u64, u64, u32, *mut *mut PdMr) -> c_int;
        pd_register_dmabuf_at(*mut PdDomain, c_int, u64, u64, *mut c_void, u32, *mut *mut PdMr) -> c_int;
        pd_register_addr(*mut PdDomain, *const c_void, u64, u32, *mut *mut PdMr) -> c_int;
        pd_register_addr_in(*mut PdDomain, *const c_void, u64, u32, *mut PdMrStorage, *mut *mut PdMr) -> c_int;
        pd_register_export(*mut PdDomain, *const PdDevice, c_int, u64, u64, u32, *mut *mut PdMr) -> c_int;
        pd_register_export_at(*mut PdDomain, *const PdDevice, c_int, u64, u64, *mut c_void, u32, *mut *mut PdMr) -> c_int;
        pd_regcache_invalidate_dmabuf(*mut PdRegCache, c_int) -> c_int;
        pd_mr_release(*mut PdMr) -> ();
        pd_mr_key(*const PdMr) -> u64;
        pd_mr_lkey(*const PdMr) -> u32;
        pd_mr_desc(*const PdMr) -> *mut c_void;
        pd_mr_offset(*const PdMr) -> u64;
        pd_mr_path(*const PdMr) -> u32;
        pd_mr_reason(*const PdMr) -> *const c_char;
        pd_mr_staging(*const PdMr, *mut u64) -> *mut c_void;
        pd_mr_remote(*const PdMr, c_int, *mut u64, *mut u64) -> c_int;
        pd_mr_local(*const PdMr, *mut *mut c_void, *mut u64) -> c_int;
        pd_last_error() -> *const c_char;
        pd_strerror(c_int) -> *const c_char;
        pd_version() -> *const c_char;
    }
}

/// `(name, value)`: sizes, alignments, offsets and constants as Rust has them.
fn rust_layout() -> Vec<(String, u64)> {
    let mut values = Vec::new();
    macro_rules! layout {
        ($($rust:ident $c:literal { $($field:ident),* })*) => {$(
            values.push((format!("sizeof.{}", $c), size_of::<$rust>() as u64));
            values.push((format!("alignof.{}", $c), align_of::<$rust>() as u64));
            $(values.push((format!("offsetof.{}.{}", $c, stringify!($field)), offset_of!($rust, $field) as u64));)*
        )*};
    }
    layout! {
        PdDeviceInfo "pd_device_info" {
            hbm_bytes, hbm_bus_addr, hbm_phys_addr, index, bar_index, numa_node, pci_domain,
            pci_bus, pci_slot, pci_func, reserved0, vendor_id, device_id, provider, reserved1
        }
        PdStats "pd_stats" { allocations, allocated_bytes, exports, hbm_bytes }
        PdRegcacheStats "pd_regcache_stats" {
            hits, misses, registrations, failed_registrations, deregistrations, evictions,
            superseded, invalidations, uncached, entries, bytes, max_count, max_bytes
        }
        PdInvalidation "pd_invalidation" { domain, key, addr, length, cause, held }
        PdMrStorage "pd_mr_storage" { internal }
    }
    for (name, value) in [
        ("PD_EXPORT_CLOEXEC", PD_EXPORT_CLOEXEC),
        ("PD_EXPORT_RDWR", PD_EXPORT_RDWR),
        ("PD_PROVIDER_OWNED", PD_PROVIDER_OWNED),
        ("PD_PROVIDER_COMPANION", PD_PROVIDER_COMPANION),
        ("PD_ACCESS_LOCAL_READ", PD_ACCESS_LOCAL_READ),
        ("PD_ACCESS_LOCAL_WRITE", PD_ACCESS_LOCAL_WRITE),
        ("PD_ACCESS_REMOTE_READ", PD_ACCESS_REMOTE_READ),
        ("PD_ACCESS_REMOTE_WRITE", PD_ACCESS_REMOTE_WRITE),
        ("PD_PATH_DMABUF", PD_PATH_DMABUF),
        ("PD_PATH_HOST_BOUNCE", PD_PATH_HOST_BOUNCE),
        ("PD_PATH_PEERMEM_VA", PD_PATH_PEERMEM_VA),
        ("PD_INVALIDATED_MEMORY", PD_INVALIDATED_MEMORY),
        ("PD_INVALIDATED_DEVICE", PD_INVALIDATED_DEVICE),
        ("PD_INVALIDATED_DOMAIN", PD_INVALIDATED_DOMAIN),
        ("PD_IFACE_SYSTEM", PD_IFACE_SYSTEM),
        ("PD_IFACE_SYNAPSEAI", PD_IFACE_SYNAPSEAI),
    ] {
        values.push((name.to_owned(), value.into()));
    }
    values
}

/// A C expression for each name of [`rust_layout`].
fn c_expression(name: &str) -> String {
    let parts: Vec<_> = name.split('.').collect();
    match parts[..] {
        ["sizeof", ty] => format!("sizeof(struct {ty})"),
        ["alignof", ty] => format!("_Alignof(struct {ty})"),
        ["offsetof", ty, field] => format!("offsetof(struct {ty}, {field})"),
        [constant] => constant.to_owned(),
        _ => unreachable!("{name}"),
    }
}

fn header_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("include")
}

/// Compiles (without linking) `source` against the header in C standard `std`, with every
/// warning an error.
fn compile(name: &str, std: &str, source: &str) {
    let work = std::env::temp_dir().join(format!("peerdirect-capi-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let (c_file, binary) = (work.join(format!("{name}.c")), work.join(name));
    std::fs::write(&c_file, source).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let output = Command::new(&cc)
        .args([std, "-pedantic", "-Wall", "-Wextra", "-Werror", "-c", "-I"])
        .arg(header_dir())
        .arg("-o")
        .arg(&binary)
        .arg(&c_file)
        .output()
        .unwrap_or_else(|err| panic!("cannot run the C compiler `{cc}`: {err}"));
    let _ = std::fs::remove_dir_all(&work);
    assert!(
        output.status.success(),
        "{cc} failed on {name}.c:\n{}\n{source}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn function_types_match_the_header() {
    let checks: String = signatures()
        .iter()
        .map(|(_, check)| format!("{check}\n"))
        .collect();
    // Only compiled: an incompatible pointer initialization is an error under -Werror.
    compile(
        "signatures",
        "-std=c99",
        &format!("#include <peerdirect.h>\n\n{checks}"),
    );
}

#[test]
fn header_rust_and_table_name_the_same_functions() {
    let header = std::fs::read_to_string(header_dir().join("peerdirect.h")).unwrap();
    let source = [include_str!("lib.rs"), include_str!("regcache.rs")].concat();
    let names_after = |text: &str, marker: &str| -> BTreeSet<String> {
        text.match_indices(marker)
            .map(|(at, _)| {
                text[at + marker.len()..]
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .next()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    };
    let in_header: BTreeSet<String> = header
        .lines()
        .filter(|line| !line.starts_with([' ', '\t', '/', '#']) && line.contains('('))
        .filter_map(|line| {
            let before = &line[..line.find('(').unwrap()];
            let name = before.rsplit([' ', '*']).next()?;
            name.starts_with("pd_").then(|| name.to_owned())
        })
        .collect();
    let in_rust = names_after(&source, "extern \"C\" fn ");
    let in_table: BTreeSet<String> = signatures().iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(
        in_header, in_rust,
        "header vs. extern \"C\" fns of lib.rs and regcache.rs"
    );
    assert_eq!(
        in_table, in_rust,
        "signature table vs. extern \"C\" fns of lib.rs"
    );
    assert_eq!(in_rust.len(), 47);
}

#[test]
fn layout_matches_the_header() {
    let values = rust_layout();
    let body: String = values
        .iter()
        .map(|(name, value)| {
            format!(
                "_Static_assert({} == {value}, \"{name}\");\n",
                c_expression(name)
            )
        })
        .collect();
    // _Static_assert and _Alignof are C11.
    compile(
        "layout",
        "-std=c11",
        &format!("#include <stddef.h>\n#include <peerdirect.h>\n\n{body}"),
    );
    // Guard against the comparison passing vacuously.
    assert_eq!(
        values.len(),
        2 + 15 + 2 + 4 + 2 + 13 + 2 + 6 + 2 + 1 + 3 + 13
    );
}

/// No panic may unwind into C: the body of every `extern "C"` function runs inside
/// `error::guard` (directly, through `guard_status` or `shield`, or through a helper that
/// does), drops of handles included.
#[test]
fn every_c_function_runs_inside_the_guard() {
    const GUARDS: [&str; 4] = ["guard(", "guard_status(", "shield(", "guard_fast_path("];
    // Helpers whose whole body is guarded, checked below like the C functions.
    const HELPERS: [&str; 6] = [
        "unsafe fn open(",
        "unsafe fn with_mr<",
        "unsafe fn companion_reset(",
        "unsafe fn register_fd(",
        "unsafe fn register_alloc<",
        "unsafe fn register_at_addr<",
    ];
    let source = [include_str!("lib.rs"), include_str!("regcache.rs")].concat();
    let body_of = |start: usize| -> &str {
        let rest = &source[start..];
        let end = rest.find("\n}\n").map_or(rest.len(), |end| end + 3);
        &rest[..end]
    };
    let guarded = |body: &str, calls: &[&str]| calls.iter().any(|c| body.contains(c));
    for helper in HELPERS {
        let at = source.find(helper).unwrap_or_else(|| panic!("no {helper}"));
        assert!(
            guarded(body_of(at), &GUARDS),
            "{helper} does not guard its body"
        );
    }
    // Called as `name(`, or `name::<` with its generic arguments named.
    let helper_calls: Vec<String> = HELPERS
        .iter()
        .flat_map(|h| {
            let name = h
                .trim_start_matches("unsafe fn ")
                .trim_end_matches(['(', '<']);
            [format!("{name}("), format!("{name}::<")]
        })
        .collect();
    let mut seen = 0;
    for (at, _) in source.match_indices("extern \"C\" fn ") {
        let body = body_of(at);
        let name = body["extern \"C\" fn ".len()..]
            .split('(')
            .next()
            .unwrap_or_default();
        let calls: Vec<&str> = GUARDS
            .iter()
            .copied()
            .chain(helper_calls.iter().map(String::as_str))
            .collect();
        assert!(
            guarded(body, &calls),
            "{name}: its body does not run inside error::guard"
        );
        seen += 1;
    }
    assert_eq!(seen, 47);
}

/// `pd_export` and `pd_export_range` refuse bits other than `PD_EXPORT_*` with `-EINVAL`,
/// naming the function, before any command is sent; the known bits go on to the module, here
/// a regular file that answers `ENOTTY`.
#[test]
fn export_functions_refuse_unknown_flags_before_the_command() {
    let file = std::env::temp_dir().join(format!(
        "peerdirect-capi-{}-export-flags",
        std::process::id()
    ));
    std::fs::write(&file, b"").unwrap();
    let device = Arc::new(Device::open(&file).unwrap());
    std::fs::remove_file(&file).unwrap();
    let dev = PdDevice {
        device: Arc::clone(&device),
        born: crate::handle::Born::now(),
    };
    let alloc = PdAllocation {
        device,
        handle: 1,
        hbm_offset: 0,
        length: 4096,
        source: Default::default(),
        born: crate::handle::Born::now(),
    };
    let last_error = || {
        // SAFETY: `pd_last_error` returns this thread's NUL-terminated message, which lives
        // until the next failure on this thread; it is copied out at once.
        unsafe { CStr::from_ptr(pd_last_error()) }
            .to_string_lossy()
            .into_owned()
    };
    let known = PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR;
    let (einval, enotty) = (-Errno::INVAL.raw_os_error(), -Errno::NOTTY.raw_os_error());
    let mut fd: c_int = -7;

    // SAFETY: `alloc` is a live handle and `fd` a writable `int`, for the whole call.
    let status = unsafe { pd_export(&alloc, 0, 0, known | 0x8, &mut fd) };
    assert_eq!(status, einval);
    assert_eq!(
        last_error(),
        "pd_export: unknown flags 0x8; only PD_EXPORT_CLOEXEC and PD_EXPORT_RDWR exist"
    );
    // SAFETY: as above.
    let status = unsafe { pd_export(&alloc, 0, 0, known, &mut fd) };
    assert_eq!(status, enotty);
    assert!(last_error().starts_with("PEERDIRECT_IOC_EXPORT on "));

    // SAFETY: `dev` is a live handle and `fd` a writable `int`, for the whole call.
    let status = unsafe { pd_export_range(&dev, 0, 4096, known | 0x8000_0000, &mut fd) };
    assert_eq!(status, einval);
    assert_eq!(
        last_error(),
        "pd_export_range: unknown flags 0x80000000; only PD_EXPORT_CLOEXEC and PD_EXPORT_RDWR exist"
    );
    // SAFETY: as above.
    let status = unsafe { pd_export_range(&dev, 0, 4096, known, &mut fd) };
    assert_eq!(status, enotty);
    assert!(last_error().starts_with("PEERDIRECT_IOC_EXPORT_RANGE on "));
    assert_eq!(fd, -7, "a failed export left fd_out alone");
}

/// The header promises that every handle may be used from several threads at once (except
/// releasing it): so each must be `Send + Sync` as Rust sees it.
#[test]
fn every_handle_may_be_shared_between_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<PdDevice>();
    shareable::<PdAllocation>();
    shareable::<PdRegCache>();
    shareable::<PdDomain>();
    shareable::<PdMr>();
}
