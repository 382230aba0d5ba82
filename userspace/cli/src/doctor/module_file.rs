//! What a kernel module says about its build, for `peerdirect doctor`: the file modprobe loads
//! for a kernel release (its `modules.dep` entry), and the ELF sections of that file that
//! name what built it: `.modinfo` (`vermagic=`, `srcversion=`), `.comment` (rustc's
//! "rustc version ..." line) and `.note.gnu.build-id`. The loaded module's srcversion and
//! build id come from /sys/module/NAME, so the two can be told apart.
//!
//! A module is a relocatable ELF64 object; only its section headers are read (little-endian,
//! as on x86_64 and arm64). Compressed modules (`.ko.xz`, `.ko.zst`, `.ko.gz`, as Debian's
//! kernels and DKMS install them) are decompressed with the tool kmod itself would need
//! (`xz -dc`, `zstd -dc`, `gzip -dc`) instead of linking a decompressor for one check.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, ensure, Context, Result};

/// What a module file (or the loaded module) says about its build; `None` for what it lacks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Build {
    /// `vermagic=` of `.modinfo`: the kernel release first ("7.3.4+deb13-amd64 SMP preempt
    /// mod_unload").
    pub vermagic: Option<String>,
    /// `srcversion=` of `.modinfo`: only with `MODULE_VERSION` or
    /// `CONFIG_MODULE_SRCVERSION_ALL`.
    pub srcversion: Option<String>,
    /// The rustc line of `.comment` ("rustc version 1.85.1 (4eb161250 2025-03-15)").
    pub rustc: Option<String>,
    /// The GNU build id in hex: the linker's hash of the module, kept by strip and signing.
    pub build_id: Option<String>,
}

impl Build {
    /// The kernel release of `vermagic`.
    pub fn release(&self) -> Option<&str> {
        self.vermagic.as_deref()?.split_whitespace().next()
    }
}

/// One section: its name and contents (empty for `SHT_NOBITS`).
struct Section<'a> {
    name: &'a [u8],
    data: &'a [u8],
}

const SHT_NOBITS: u32 = 8;
const SHN_XINDEX: usize = 0xffff;
const NT_GNU_BUILD_ID: u32 = 3;

fn u16_at(data: &[u8], at: usize) -> Result<u16> {
    let bytes = range(data, at, 2, "an ELF field")?;
    Ok(u16::from_le_bytes([bytes[0], bytes[1]]))
}

fn u32_at(data: &[u8], at: usize) -> Result<u32> {
    let bytes = range(data, at, 4, "an ELF field")?;
    Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
}

fn u64_at(data: &[u8], at: usize) -> Result<usize> {
    let bytes = range(data, at, 8, "an ELF field")?;
    usize::try_from(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
        .context("ELF offset out of range")
}

/// `len` bytes at `offset`, or an error naming what they were.
fn range<'a>(data: &'a [u8], offset: usize, len: usize, what: &str) -> Result<&'a [u8]> {
    offset
        .checked_add(len)
        .and_then(|end| data.get(offset..end))
        .with_context(|| format!("{what} lies outside the file"))
}

/// The sections of an ELF64 little-endian file, with their names.
fn sections(elf: &[u8]) -> Result<Vec<Section<'_>>> {
    ensure!(elf.starts_with(b"\x7fELF"), "not an ELF file");
    ensure!(
        elf.get(4) == Some(&2) && elf.get(5) == Some(&1),
        "not a 64-bit little-endian ELF file"
    );
    let shoff = u64_at(elf, 0x28)?;
    let shentsize = usize::from(u16_at(elf, 0x3a)?);
    ensure!(shentsize >= 64, "ELF section header size {shentsize} < 64");
    let header = |i: usize| -> Result<&[u8]> {
        let at = i
            .checked_mul(shentsize)
            .and_then(|off| off.checked_add(shoff))
            .context("ELF section header out of range")?;
        range(elf, at, 64, "an ELF section header")
    };
    // More than 0xff00 sections, or a string table index beyond it: the real numbers are in
    // section 0's size and link fields (ELF's extended numbering).
    let mut count = usize::from(u16_at(elf, 0x3c)?);
    let mut strtab = usize::from(u16_at(elf, 0x3e)?);
    if shoff != 0 && (count == 0 || strtab == SHN_XINDEX) {
        let first = header(0)?;
        if count == 0 {
            count = u64_at(first, 32)?;
        }
        if strtab == SHN_XINDEX {
            strtab = u32_at(first, 40)? as usize;
        }
    }
    ensure!(count > 0, "the ELF file has no section headers");
    ensure!(
        strtab < count,
        "the ELF section name table index is out of range"
    );
    let contents = |h: &[u8]| -> Result<&[u8]> {
        if u32_at(h, 4)? == SHT_NOBITS {
            return Ok(&[]);
        }
        range(elf, u64_at(h, 24)?, u64_at(h, 32)?, "an ELF section")
    };
    let names = contents(header(strtab)?)?;
    (0..count)
        .map(|i| {
            let h = header(i)?;
            let start = u32_at(h, 0)? as usize;
            let name = names
                .get(start..)
                .context("an ELF section name is out of range")?;
            let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
            Ok(Section {
                name: &name[..end],
                data: contents(h)?,
            })
        })
        .collect()
}

/// The value of `key` in `.modinfo` (NUL-separated `key=value` strings).
fn modinfo_value(modinfo: &[u8], key: &str) -> Option<String> {
    modinfo.split(|&b| b == 0).find_map(|entry| {
        let value = entry.strip_prefix(key.as_bytes())?.strip_prefix(b"=")?;
        Some(String::from_utf8_lossy(value).trim_end().to_owned())
    })
}

/// The rustc line of `.comment` (NUL-separated strings, one per compiler that contributed).
fn rustc_of(comment: &[u8]) -> Option<String> {
    comment
        .split(|&b| b == 0)
        .find(|s| s.starts_with(b"rustc "))
        .map(|s| String::from_utf8_lossy(s).into_owned())
}

/// The GNU build id of a note section (or of the loaded module's
/// /sys/module/NAME/notes/.note.gnu.build-id, which holds the same bytes), in hex.
pub fn build_id_of(notes: &[u8]) -> Option<String> {
    let pad = |n: usize| n.checked_add(3).map(|n| n & !3);
    let mut at = 0;
    while at + 12 <= notes.len() {
        let namesz = u32_at(notes, at).ok()? as usize;
        let descsz = u32_at(notes, at + 4).ok()? as usize;
        let kind = u32_at(notes, at + 8).ok()?;
        let name = notes.get(at + 12..(at + 12).checked_add(namesz)?)?;
        let desc_at = at + 12 + pad(namesz)?;
        let desc = notes.get(desc_at..desc_at.checked_add(descsz)?)?;
        if kind == NT_GNU_BUILD_ID && name == b"GNU\0" {
            return Some(desc.iter().map(|b| format!("{b:02x}")).collect());
        }
        at = desc_at + pad(descsz)?;
    }
    None
}

/// What an ELF module file says about its build.
pub fn build_of(elf: &[u8]) -> Result<Build> {
    let sections = sections(elf)?;
    let find = |name: &[u8]| sections.iter().find(|s| s.name == name).map(|s| s.data);
    let modinfo = find(b".modinfo").context("no .modinfo section: not a kernel module")?;
    Ok(Build {
        vermagic: modinfo_value(modinfo, "vermagic"),
        srcversion: modinfo_value(modinfo, "srcversion"),
        rustc: find(b".comment").and_then(rustc_of),
        build_id: find(b".note.gnu.build-id").and_then(build_id_of),
    })
}

/// The file of module `name` in `modules.dep` text (a path relative to /lib/modules/RELEASE,
/// as depmod writes it, or absolute), whatever its compression.
pub fn modules_dep_entry<'a>(modules_dep: &'a str, name: &str) -> Option<&'a str> {
    modules_dep.lines().find_map(|line| {
        let (path, _) = line.split_once(':')?;
        let file = path.rsplit('/').next()?;
        let stem = [".ko", ".ko.xz", ".ko.zst", ".ko.gz"]
            .iter()
            .find_map(|suffix| file.strip_suffix(suffix))?;
        (stem == name).then_some(path)
    })
}

/// The contents of a module file, decompressed.
pub fn read(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".ko.xz") {
        ("xz", "xz-utils")
    } else if name.ends_with(".ko.zst") {
        ("zstd", "zstd")
    } else if name.ends_with(".ko.gz") {
        ("gzip", "gzip")
    } else {
        return std::fs::read(path).with_context(|| format!("reading {name}"));
    };
    let (program, package) = tool;
    let out = Command::new(program)
        .arg("-dc")
        .arg(path)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| {
            format!("{name} is compressed and `{program} -dc` cannot run (install {package})")
        })?;
    if !out.status.success() {
        bail!(
            "`{program} -dc {name}` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// The version number of a rustc line, from `.comment` ("rustc version 1.85.1 (...)") or
/// `CONFIG_RUSTC_VERSION_TEXT` ("rustc 1.85.1 (...)").
pub fn rustc_version(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("rustc ")?;
    let rest = rest.strip_prefix("version ").unwrap_or(rest);
    rest.split_whitespace().next()
}

/// `CONFIG_RUSTC_VERSION_TEXT` of a kernel `.config`.
pub fn config_rustc(config: &str) -> Option<String> {
    config.lines().find_map(|line| {
        let value = line.strip_prefix("CONFIG_RUSTC_VERSION_TEXT=")?;
        Some(value.trim_matches('"').to_owned())
    })
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A relocatable ELF64 little-endian file with these sections (after the null section,
    /// before `.shstrtab`), the section headers at the end, as a linker lays out a module.
    pub fn elf(sections: &[(&str, &[u8])]) -> Vec<u8> {
        let mut names = vec![0u8];
        let mut name_at = Vec::new();
        for name in sections.iter().map(|s| s.0).chain([".shstrtab"]) {
            name_at.push(names.len() as u32);
            names.extend_from_slice(name.as_bytes());
            names.push(0);
        }
        let mut file = vec![0u8; 64];
        let mut placed = Vec::new();
        for data in sections.iter().map(|s| s.1).chain([names.as_slice()]) {
            placed.push((file.len() as u64, data.len() as u64));
            file.extend_from_slice(data);
        }
        while !file.len().is_multiple_of(8) {
            file.push(0);
        }
        let shoff = file.len() as u64;
        file.extend_from_slice(&[0u8; 64]);
        for (i, (offset, size)) in placed.iter().enumerate() {
            let mut h = [0u8; 64];
            h[0..4].copy_from_slice(&name_at[i].to_le_bytes());
            h[4..8].copy_from_slice(&1u32.to_le_bytes()); // SHT_PROGBITS
            h[24..32].copy_from_slice(&offset.to_le_bytes());
            h[32..40].copy_from_slice(&size.to_le_bytes());
            file.extend_from_slice(&h);
        }
        let count = placed.len() as u16 + 1;
        file[0..4].copy_from_slice(b"\x7fELF");
        file[4] = 2; // ELFCLASS64
        file[5] = 1; // ELFDATA2LSB
        file[6] = 1; // EV_CURRENT
        file[16..18].copy_from_slice(&1u16.to_le_bytes()); // ET_REL
        file[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
        file[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        file[0x34..0x36].copy_from_slice(&64u16.to_le_bytes());
        file[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        file[0x3c..0x3e].copy_from_slice(&count.to_le_bytes());
        file[0x3e..0x40].copy_from_slice(&(count - 1).to_le_bytes());
        file
    }

    /// A GNU build-id note with this id.
    pub fn build_id_note(id: &[u8]) -> Vec<u8> {
        let mut note = Vec::new();
        note.extend_from_slice(&4u32.to_le_bytes());
        note.extend_from_slice(&(id.len() as u32).to_le_bytes());
        note.extend_from_slice(&NT_GNU_BUILD_ID.to_le_bytes());
        note.extend_from_slice(b"GNU\0");
        note.extend_from_slice(id);
        note
    }

    /// `.modinfo` and `.comment` as Debian's dkms build of peerdirect.ko has them (rustc
    /// 1.85.1 for trixie-backports' 7.3.4), the rustc line after others, as the linker
    /// merges them.
    pub fn debian_module(build_id: &[u8]) -> Vec<u8> {
        elf(&[
            (".note.gnu.build-id", &build_id_note(build_id)),
            (".text", b"\xc3"),
            (
                ".modinfo",
                b"author=The peerdirect developers\0license=GPL v2\0\
alias=pci:v00001DA3d00001020sv*sd*bc*sc*i*\0depends=\0name=peerdirect\0\
vermagic=7.3.4+deb13-amd64 SMP preempt mod_unload \0",
            ),
            (
                ".comment",
                b"\0GCC: (Debian 14.2.0-19) 14.2.0\0rustc version 1.85.1 (4eb161250 2025-03-15) (built from a source tarball)\0",
            ),
        ])
    }

    #[test]
    fn a_module_names_its_kernel_compiler_and_build_id() {
        let build = build_of(&debian_module(&[0xb5, 0x56, 0xf9, 0x2a])).unwrap();
        assert_eq!(
            build.vermagic.as_deref(),
            Some("7.3.4+deb13-amd64 SMP preempt mod_unload")
        );
        assert_eq!(build.release(), Some("7.3.4+deb13-amd64"));
        assert_eq!(build.srcversion, None);
        assert_eq!(
            build.rustc.as_deref(),
            Some("rustc version 1.85.1 (4eb161250 2025-03-15) (built from a source tarball)")
        );
        assert_eq!(build.build_id.as_deref(), Some("b556f92a"));
        assert_eq!(
            rustc_version(build.rustc.as_deref().unwrap()),
            Some("1.85.1")
        );
    }

    #[test]
    fn srcversion_and_a_signature_after_the_sections() {
        let mut file = elf(&[(
            ".modinfo",
            b"srcversion=0D2A9C3B3E4F5A6B7C8D9E0\0vermagic=7.3.4 SMP preempt mod_unload \0",
        )]);
        // A signed module: the signature follows the ELF data.
        file.extend_from_slice(b"PKCS#7...\0\0\x02\0\0\0\0\0\0\x08~Module signature appended~\n");
        let build = build_of(&file).unwrap();
        assert_eq!(build.srcversion.as_deref(), Some("0D2A9C3B3E4F5A6B7C8D9E0"));
        assert_eq!(build.release(), Some("7.3.4"));
        assert_eq!((build.rustc, build.build_id), (None, None));
    }

    #[test]
    fn what_is_not_a_module_is_refused() {
        let msg = |bytes: &[u8]| build_of(bytes).unwrap_err().to_string();
        assert_eq!(msg(b"#!/bin/sh\n"), "not an ELF file");
        let mut file = elf(&[(".text", b"\xc3")]);
        assert!(msg(&file).contains("no .modinfo"), "{}", msg(&file));
        file[4] = 1;
        assert_eq!(msg(&file), "not a 64-bit little-endian ELF file");
        let file = debian_module(&[1]);
        for cut in [0x30, file.len() - 70, file.len() - 1] {
            assert!(build_of(&file[..cut]).is_err(), "cut at {cut}");
        }
        // A section pointing past the end of the file.
        let mut file = elf(&[(".modinfo", b"vermagic=7.3.4 \0")]);
        let shoff = u64_at(&file, 0x28).unwrap();
        let size_at = shoff + 64 + 32;
        file[size_at..size_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(msg(&file).contains("outside the file"), "{}", msg(&file));
    }

    #[test]
    fn build_ids_are_found_among_other_notes() {
        let mut notes = Vec::new();
        // An odd-sized "Linux" note first, as modules carry.
        notes.extend_from_slice(&6u32.to_le_bytes());
        notes.extend_from_slice(&1u32.to_le_bytes());
        notes.extend_from_slice(&0x100u32.to_le_bytes());
        notes.extend_from_slice(b"Linux\0\0\0\x01\0\0\0");
        notes.extend_from_slice(&build_id_note(&[0xde, 0xad, 0xbe, 0xef]));
        assert_eq!(build_id_of(&notes).as_deref(), Some("deadbeef"));
        assert_eq!(build_id_of(&notes[..notes.len() - 1]), None);
        assert_eq!(build_id_of(&[]), None);
    }

    #[test]
    fn modules_dep_names_the_file_modprobe_loads() {
        let dep = "kernel/drivers/dma-buf/udmabuf.ko.xz:\n\
updates/dkms/peerdirect.ko.xz: kernel/drivers/infiniband/core/ib_core.ko.xz\n\
updates/dkms/peerdirect_peermem.ko: updates/dkms/peerdirect.ko.xz\n";
        assert_eq!(
            modules_dep_entry(dep, "peerdirect"),
            Some("updates/dkms/peerdirect.ko.xz")
        );
        assert_eq!(
            modules_dep_entry(dep, "peerdirect_peermem"),
            Some("updates/dkms/peerdirect_peermem.ko")
        );
        assert_eq!(modules_dep_entry(dep, "peer"), None);
        assert_eq!(
            modules_dep_entry("extra/peerdirect.ko.zst:\n", "peerdirect"),
            Some("extra/peerdirect.ko.zst")
        );
    }

    #[test]
    fn rustc_versions_compare_by_number() {
        assert_eq!(
            rustc_version("rustc version 1.95.0 (59807616e 2026-04-14)"),
            Some("1.95.0")
        );
        assert_eq!(
            rustc_version("rustc 1.85.1 (4eb161250 2025-03-15) (built from a source tarball)"),
            Some("1.85.1")
        );
        assert_eq!(rustc_version("GCC: (Debian 14.2.0-19) 14.2.0"), None);
        let config =
            "CONFIG_CC_VERSION_TEXT=\"x86_64-linux-gnu-gcc-14 (Debian 14.2.0-19) 14.2.0\"\n\
CONFIG_RUSTC_VERSION_TEXT=\"rustc 1.85.1 (4eb161250 2025-03-15) (built from a source tarball)\"\n";
        assert_eq!(
            config_rustc(config).as_deref(),
            Some("rustc 1.85.1 (4eb161250 2025-03-15) (built from a source tarball)")
        );
        assert_eq!(config_rustc("CONFIG_RUST=y\n"), None);
    }

    #[test]
    fn plain_files_are_read_as_they_are() {
        let path =
            std::env::temp_dir().join(format!("peerdirect-module-{}.ko", std::process::id()));
        std::fs::write(&path, debian_module(&[7])).unwrap();
        let build = build_of(&read(&path).unwrap()).unwrap();
        assert_eq!(build.build_id.as_deref(), Some("07"));
        std::fs::remove_file(&path).unwrap();
        assert!(read(&path).is_err());
    }
}
