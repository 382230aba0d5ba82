//! The Rust view of the ABI must match what the system C compiler makes of
//! include/uapi/peerdirect.h: struct size, every field's offset and size, and the ioctl numbers;
//! likewise for the parts of the system's linux/dma-buf.h the crate defines itself.

use std::collections::{BTreeMap, BTreeSet};
use std::mem::{align_of, offset_of, size_of, size_of_val};
use std::path::{Path, PathBuf};
use std::process::Command;

use peerdirect::uapi::{
    self, dma_buf_sync, peerdirect_alloc, peerdirect_export, peerdirect_free, peerdirect_info,
    peerdirect_p2p, peerdirect_status,
};

/// `(struct, field, offset, size)` for the listed fields of a struct, which must be all of
/// them: the destructuring fails to compile when the header gains a field not listed here.
macro_rules! fields {
    ($ty:ident { $($field:ident),* $(,)? }) => {{
        let value = $ty::default();
        let $ty { $($field: _),* } = value;
        vec![$((stringify!($ty), stringify!($field), offset_of!($ty, $field), size_of_val(&value.$field))),*]
    }};
}

/// `(struct, size, alignment)` of every struct compared.
macro_rules! structs {
    ($($ty:ident),* $(,)?) => {
        vec![$((stringify!($ty), size_of::<$ty>(), align_of::<$ty>())),*]
    };
}

fn rust_structs() -> Vec<(&'static str, usize, usize)> {
    structs!(
        peerdirect_info,
        peerdirect_alloc,
        peerdirect_free,
        peerdirect_export,
        peerdirect_p2p,
        peerdirect_status,
        dma_buf_sync,
    )
}

fn rust_fields() -> Vec<(&'static str, &'static str, usize, usize)> {
    let mut fields = fields!(peerdirect_info {
        size,
        flags,
        hbm_bytes,
        hbm_bus_addr,
        hbm_phys_addr,
        bar_index,
        numa_node,
        pci_domain,
        pci_bus,
        pci_slot,
        pci_func,
        __reserved0,
        vendor_id,
        device_id,
        index,
        provider,
        __reserved1,
        driver,
    });
    fields.extend(fields!(peerdirect_alloc {
        size,
        flags,
        length,
        align,
        handle,
        __reserved0,
        hbm_offset,
    }));
    fields.extend(fields!(peerdirect_free {
        size,
        flags,
        handle,
        __reserved0,
    }));
    fields.extend(fields!(peerdirect_export {
        size,
        flags,
        handle,
        fd,
        offset,
        length,
    }));
    fields.extend(fields!(peerdirect_p2p {
        size,
        flags,
        pci_domain,
        pci_bus,
        pci_slot,
        pci_func,
        __reserved0,
        distance,
        path,
        common_bridge,
        acs_bridge,
        acs_bridges,
        __reserved1,
        host_bridge_vendor,
        host_bridge_device,
        __reserved2,
    }));
    fields.extend(fields!(peerdirect_status {
        version,
        state,
        resets
    }));
    fields.extend(fields!(dma_buf_sync { flags }));
    fields
}

/// Constants and ioctl numbers, as `(name, value)`; the C side prints each by name.
fn rust_constants() -> Vec<(&'static str, u64)> {
    vec![
        ("PEERDIRECT_IOC_INFO", uapi::PEERDIRECT_IOC_INFO.into()),
        ("PEERDIRECT_IOC_ALLOC", uapi::PEERDIRECT_IOC_ALLOC.into()),
        ("PEERDIRECT_IOC_FREE", uapi::PEERDIRECT_IOC_FREE.into()),
        ("PEERDIRECT_IOC_EXPORT", uapi::PEERDIRECT_IOC_EXPORT.into()),
        ("PEERDIRECT_IOC_P2P", uapi::PEERDIRECT_IOC_P2P.into()),
        (
            "PEERDIRECT_INFO_SIZE_VER0",
            uapi::PEERDIRECT_INFO_SIZE_VER0.into(),
        ),
        (
            "PEERDIRECT_INFO_SIZE_VER1",
            uapi::PEERDIRECT_INFO_SIZE_VER1.into(),
        ),
        (
            "PEERDIRECT_DRIVER_NAME_LEN",
            uapi::PEERDIRECT_DRIVER_NAME_LEN.into(),
        ),
        (
            "PEERDIRECT_ALLOC_SIZE_VER0",
            uapi::PEERDIRECT_ALLOC_SIZE_VER0.into(),
        ),
        (
            "PEERDIRECT_FREE_SIZE_VER0",
            uapi::PEERDIRECT_FREE_SIZE_VER0.into(),
        ),
        (
            "PEERDIRECT_EXPORT_SIZE_VER0",
            uapi::PEERDIRECT_EXPORT_SIZE_VER0.into(),
        ),
        (
            "PEERDIRECT_P2P_SIZE_VER0",
            uapi::PEERDIRECT_P2P_SIZE_VER0.into(),
        ),
        ("PEERDIRECT_IOCTL_TYPE", uapi::PEERDIRECT_IOCTL_TYPE.into()),
        ("PEERDIRECT_CMD_INFO", uapi::PEERDIRECT_CMD_INFO.into()),
        ("PEERDIRECT_CMD_ALLOC", uapi::PEERDIRECT_CMD_ALLOC.into()),
        ("PEERDIRECT_CMD_FREE", uapi::PEERDIRECT_CMD_FREE.into()),
        ("PEERDIRECT_CMD_EXPORT", uapi::PEERDIRECT_CMD_EXPORT.into()),
        ("PEERDIRECT_CMD_P2P", uapi::PEERDIRECT_CMD_P2P.into()),
        (
            "PEERDIRECT_P2P_COMMON_BRIDGE",
            uapi::PEERDIRECT_P2P_COMMON_BRIDGE.into(),
        ),
        (
            "PEERDIRECT_P2P_ACS_REDIRECT",
            uapi::PEERDIRECT_P2P_ACS_REDIRECT.into(),
        ),
        (
            "PEERDIRECT_P2P_SAME_HOST_BRIDGE",
            uapi::PEERDIRECT_P2P_SAME_HOST_BRIDGE.into(),
        ),
        (
            "PEERDIRECT_P2P_PEER_IOMMU",
            uapi::PEERDIRECT_P2P_PEER_IOMMU.into(),
        ),
        (
            "PEERDIRECT_PROVIDER_OWNED",
            uapi::PEERDIRECT_PROVIDER_OWNED.into(),
        ),
        (
            "PEERDIRECT_ALLOC_ALIGN_DEFAULT",
            uapi::PEERDIRECT_ALLOC_ALIGN_DEFAULT.into(),
        ),
        (
            "PEERDIRECT_EXPORT_CLOEXEC",
            uapi::PEERDIRECT_EXPORT_CLOEXEC.into(),
        ),
        (
            "PEERDIRECT_EXPORT_RDWR",
            uapi::PEERDIRECT_EXPORT_RDWR.into(),
        ),
        ("DMA_BUF_IOCTL_SYNC", uapi::DMA_BUF_IOCTL_SYNC.into()),
        ("DMA_BUF_SET_NAME", uapi::DMA_BUF_SET_NAME.into()),
        ("DMA_BUF_SYNC_READ", uapi::DMA_BUF_SYNC_READ),
        ("DMA_BUF_SYNC_WRITE", uapi::DMA_BUF_SYNC_WRITE),
        ("DMA_BUF_SYNC_START", uapi::DMA_BUF_SYNC_START),
        ("DMA_BUF_SYNC_END", uapi::DMA_BUF_SYNC_END),
        ("DMA_BUF_NAME_LEN", uapi::DMA_BUF_NAME_LEN as u64),
    ]
}

fn rust_values() -> BTreeMap<String, u64> {
    let mut values: BTreeMap<String, u64> = rust_constants()
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
    for (ty, size, align) in rust_structs() {
        values.insert(format!("sizeof.{ty}"), size as u64);
        values.insert(format!("alignof.{ty}"), align as u64);
    }
    for (ty, field, offset, size) in rust_fields() {
        values.insert(format!("offsetof.{ty}.{field}"), offset as u64);
        values.insert(format!("sizeof.{ty}.{field}"), size as u64);
    }
    values
}

fn c_program() -> String {
    let mut body = String::new();
    for (name, _) in rust_constants() {
        body.push_str(&format!("\tVALUE({name});\n"));
    }
    for (ty, _, _) in rust_structs() {
        body.push_str(&format!("\tSTRUCT({ty});\n"));
    }
    for (ty, field, _, _) in rust_fields() {
        body.push_str(&format!("\tFIELD({ty}, {field});\n"));
    }
    format!(
        r#"#include <stddef.h>
#include <stdio.h>
#include <linux/dma-buf.h>
#include <peerdirect.h>

#define STRUCT(t) \
	printf("sizeof.%s %zu\n", #t, sizeof(struct t)); \
	printf("alignof.%s %zu\n", #t, _Alignof(struct t))
#define FIELD(t, f) \
	printf("offsetof.%s.%s %zu\n", #t, #f, offsetof(struct t, f)); \
	printf("sizeof.%s.%s %zu\n", #t, #f, sizeof(((struct t *)0)->f))
#define VALUE(v) printf("%s %llu\n", #v, (unsigned long long)(v))

int main(void)
{{
{body}	return 0;
}}
"#
    )
}

fn c_values() -> BTreeMap<String, u64> {
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../include/uapi");
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("uapi_layout");
    std::fs::create_dir_all(&work).unwrap();
    let source = work.join("layout.c");
    let binary = work.join("layout");
    std::fs::write(&source, c_program()).unwrap();

    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let status = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(&include)
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .status()
        .unwrap_or_else(|err| panic!("cannot run the C compiler `{cc}`: {err}"));
    assert!(
        status.success(),
        "{cc} failed to compile {}",
        source.display()
    );

    let output = Command::new(&binary).output().unwrap();
    assert!(output.status.success(), "{} failed", binary.display());
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let (name, value) = line.split_once(' ').unwrap();
            (name.to_owned(), value.parse().unwrap())
        })
        .collect()
}

#[test]
fn rust_and_c_agree_on_the_abi() {
    let rust = rust_values();
    let c = c_values();
    let names: BTreeSet<_> = rust.keys().chain(c.keys()).collect();
    let mismatches: Vec<_> = names
        .into_iter()
        .filter(|name| rust.get(*name) != c.get(*name))
        .map(|name| format!("{name}: Rust {:?}, C {:?}", rust.get(name), c.get(name)))
        .collect();
    assert!(
        mismatches.is_empty(),
        "ABI mismatch:\n{}",
        mismatches.join("\n")
    );
    // Guard against the comparison passing vacuously.
    assert_eq!(
        c.len(),
        rust_constants().len() + 2 * rust_structs().len() + 2 * rust_fields().len()
    );
    assert_eq!(rust_fields().len(), 18 + 7 + 4 + 6 + 16 + 3 + 1);
}

/// An independent spelling of the expected number, on architectures where `_IOC_NONE` is 0.
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
))]
#[test]
fn opcodes_are_io_0xbd_n() {
    assert_eq!(uapi::PEERDIRECT_IOC_INFO, 0xbd00);
    assert_eq!(uapi::PEERDIRECT_IOC_ALLOC, 0xbd01);
    assert_eq!(uapi::PEERDIRECT_IOC_FREE, 0xbd02);
    assert_eq!(uapi::PEERDIRECT_IOC_EXPORT, 0xbd03);
    assert_eq!(uapi::PEERDIRECT_IOC_P2P, 0xbd04);
}
