//! The Rust view of the ABI must match what the system C compiler makes of
//! include/uapi/peerdirect.h: struct size, every field's offset and size, and the ioctl numbers.

use std::collections::{BTreeMap, BTreeSet};
use std::mem::{align_of, offset_of, size_of, size_of_val};
use std::path::{Path, PathBuf};
use std::process::Command;

use peerdirect::uapi::{self, peerdirect_info};

/// `(field, offset, size)` for the listed fields of `struct peerdirect_info`, which must be all
/// of them: the destructuring fails to compile when the header gains a field not listed here.
macro_rules! fields {
    ($($field:ident),* $(,)?) => {{
        let info = peerdirect_info::default();
        let peerdirect_info { $($field: _),* } = info;
        vec![$((stringify!($field), offset_of!(peerdirect_info, $field), size_of_val(&info.$field))),*]
    }};
}

fn rust_fields() -> Vec<(&'static str, usize, usize)> {
    fields!(
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
    )
}

fn rust_values() -> BTreeMap<String, u64> {
    let mut values = BTreeMap::from([
        ("sizeof".to_owned(), size_of::<peerdirect_info>() as u64),
        ("alignof".to_owned(), align_of::<peerdirect_info>() as u64),
        (
            "PEERDIRECT_IOC_INFO".to_owned(),
            u64::from(uapi::PEERDIRECT_IOC_INFO),
        ),
        (
            "PEERDIRECT_INFO_SIZE_VER0".to_owned(),
            u64::from(uapi::PEERDIRECT_INFO_SIZE_VER0),
        ),
        (
            "PEERDIRECT_IOCTL_TYPE".to_owned(),
            u64::from(uapi::PEERDIRECT_IOCTL_TYPE),
        ),
        (
            "PEERDIRECT_CMD_INFO".to_owned(),
            u64::from(uapi::PEERDIRECT_CMD_INFO),
        ),
        (
            "PEERDIRECT_PROVIDER_OWNED".to_owned(),
            u64::from(uapi::PEERDIRECT_PROVIDER_OWNED),
        ),
    ]);
    for (field, offset, size) in rust_fields() {
        values.insert(format!("offsetof.{field}"), offset as u64);
        values.insert(format!("sizeof.{field}"), size as u64);
    }
    values
}

fn c_program() -> String {
    let mut fields = String::new();
    for (field, _, _) in rust_fields() {
        fields.push_str(&format!("\tFIELD({field});\n"));
    }
    format!(
        r#"#include <stddef.h>
#include <stdio.h>
#include <peerdirect.h>

#define FIELD(f) \
	printf("offsetof.%s %zu\n", #f, offsetof(struct peerdirect_info, f)); \
	printf("sizeof.%s %zu\n", #f, sizeof(((struct peerdirect_info *)0)->f))
#define VALUE(v) printf("%s %llu\n", #v, (unsigned long long)(v))

int main(void)
{{
	VALUE(PEERDIRECT_IOC_INFO);
	VALUE(PEERDIRECT_INFO_SIZE_VER0);
	VALUE(PEERDIRECT_IOCTL_TYPE);
	VALUE(PEERDIRECT_CMD_INFO);
	VALUE(PEERDIRECT_PROVIDER_OWNED);
	printf("sizeof %zu\n", sizeof(struct peerdirect_info));
	printf("alignof %zu\n", _Alignof(struct peerdirect_info));
{fields}	return 0;
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
    assert_eq!(c.len(), 7 + 2 * 17);
}

/// An independent spelling of the expected number, on architectures where `_IOC_NONE` is 0.
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
))]
#[test]
fn info_opcode_is_io_0xbd_0() {
    assert_eq!(uapi::PEERDIRECT_IOC_INFO, 0xbd00);
}
