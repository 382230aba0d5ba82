//! `peerdirect export`: allocate HBM, export it as a dma-buf, write and check a pattern through
//! the dma-buf's mapping, and hold the fd for a while.

use std::fmt;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;

use anyhow::{Context, Result};
use peerdirect::pattern::{self, Mismatch};
use peerdirect::{Device, DmaBuf, ExportFlags, SyncFlags};
use serde_json::{json, Value};

use crate::hold::Watch;
use crate::size::{
    check_alloc_size, human_bytes, parse_align, parse_device, parse_number, parse_seconds,
    parse_size,
};

#[derive(Debug, clap::Args)]
#[command(after_help = "\
The pattern: byte o of the exported range is byte o % 8 of the little-endian 64-bit word \
o / 8, and word i is output i (from 0) of SplitMix64 seeded with SEED; see the peerdirect \
crate's `pattern` module for the formula.

Exit status: 0 on success, 1 on an error (the export revoked while held among them: its device \
going away or reset), 2 on a usage error, 3 when --verify found a byte that is not the \
pattern's.")]
pub struct Args {
    /// Bytes to allocate (K, M, G, T: powers of 1024); rounded up to the page size.
    #[arg(long, allow_hyphen_values = true, value_name = "SIZE", value_parser = parse_size)]
    pub size: u64,
    /// Alignment of the allocation in the HBM BAR: a power of two of at least 4K [default: 2M].
    #[arg(long, allow_hyphen_values = true, value_name = "A", value_parser = parse_align)]
    pub align: Option<u64>,
    /// Start of the exported range in the allocation, a multiple of the page size.
    #[arg(long, allow_hyphen_values = true, value_name = "O", value_parser = parse_size, default_value = "0")]
    pub offset: u64,
    /// Length of the exported range, a multiple of the page size; 0 means to the end.
    #[arg(long, allow_hyphen_values = true, value_name = "L", value_parser = parse_size, default_value = "0")]
    pub length: u64,
    /// Write the pattern with SEED over the whole exported range (exports it read-write).
    #[arg(long, allow_hyphen_values = true, value_name = "SEED", value_parser = parse_number)]
    pub pattern: Option<u64>,
    /// Check that the exported range holds the pattern with SEED (after --pattern, if given).
    #[arg(long, allow_hyphen_values = true, value_name = "SEED", value_parser = parse_number)]
    pub verify: Option<u64>,
    /// Keep the allocation and the dma-buf fd for SECONDS after printing, then free them;
    /// ends at once with an error if the module revokes the export meanwhile.
    #[arg(long, allow_hyphen_values = true, value_name = "SECONDS", value_parser = parse_seconds, default_value = "0")]
    pub hold: u64,
    /// The HBM device: N of /dev/peerdirectN.
    #[arg(long, allow_hyphen_values = true, value_name = "N", value_parser = parse_device, default_value = "0")]
    pub device: u32,
    /// Print a JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The exit status when --verify finds a byte that is not the pattern's.
pub const EXIT_MISMATCH: u8 = 3;

/// --verify found a byte that is not the pattern's; the report has the details.
#[derive(Debug)]
pub struct VerifyFailed;

impl fmt::Display for VerifyFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the exported range does not hold the pattern")
    }
}

impl std::error::Error for VerifyFailed {}

/// Bytes copied through the mapping at a time.
const CHUNK: usize = 1 << 20;

pub fn run(args: &Args) -> Result<()> {
    let device = Device::open_index(args.device)?;
    check_alloc_size(&device, args.size)?;
    let allocation = device.alloc(args.size, args.align)?;
    let mut flags = ExportFlags::CLOEXEC;
    if args.pattern.is_some() {
        flags |= ExportFlags::RDWR;
    }
    // Only an owned device allocates: not a companion.
    let watch = Watch::before_export(&device, false);
    let dma_buf = allocation.export(args.offset, args.length, flags)?;
    let written = args
        .pattern
        .map(|seed| write_pattern(&dma_buf, seed).map(|bytes| Written { seed, bytes }))
        .transpose()?;
    let verified = args
        .verify
        .map(|seed| verify_pattern(&dma_buf, seed))
        .transpose()?;
    let report = Report {
        device: device.path().to_owned(),
        handle: allocation.handle(),
        hbm_offset: allocation.hbm_offset(),
        allocation_length: allocation.length(),
        fd: dma_buf.as_fd().as_raw_fd(),
        offset: args.offset,
        length: dma_buf.length(),
        writable: flags.contains(ExportFlags::RDWR),
        written,
        verified,
        hold: args.hold,
    };

    let mut out = io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report.to_json())
            .context("writing JSON to stdout")?;
        writeln!(out).context("writing to stdout")?;
    } else {
        report.write_text(&mut out)?;
    }
    out.flush().context("writing to stdout")?;
    drop(out);

    watch.hold(args.hold)?;
    allocation.free()?;
    drop(dma_buf);
    match report.verified {
        Some(Verified {
            mismatch: Some(_), ..
        }) => Err(VerifyFailed.into()),
        _ => Ok(()),
    }
}

/// Writes the pattern over the whole dma-buf; returns the bytes written.
pub(crate) fn write_pattern(dma_buf: &DmaBuf, seed: u64) -> Result<u64> {
    let mut map = dma_buf.mmap(true)?;
    let mut chunk = vec![0; CHUNK.min(map.length())];
    dma_buf.sync(SyncFlags::START_WRITE)?;
    for start in (0..map.length()).step_by(CHUNK) {
        let chunk = &mut chunk[..CHUNK.min(map.length() - start)];
        pattern::fill(seed, start as u64, chunk);
        map.write(start, chunk);
    }
    dma_buf.sync(SyncFlags::END_WRITE)?;
    Ok(map.length() as u64)
}

/// Compares the whole dma-buf with the pattern, up to the first byte that differs.
pub(crate) fn verify_pattern(dma_buf: &DmaBuf, seed: u64) -> Result<Verified> {
    let map = dma_buf.mmap(false)?;
    let mut chunk = vec![0; CHUNK.min(map.length())];
    let mut verified = Verified {
        seed,
        bytes: 0,
        mismatch: None,
    };
    dma_buf.sync(SyncFlags::START_READ)?;
    for start in (0..map.length()).step_by(CHUNK) {
        let chunk = &mut chunk[..CHUNK.min(map.length() - start)];
        map.read(start, chunk);
        if let Some(mismatch) = pattern::first_mismatch(seed, start as u64, chunk) {
            verified.bytes = mismatch.offset;
            verified.mismatch = Some(mismatch);
            break;
        }
        verified.bytes += chunk.len() as u64;
    }
    dma_buf.sync(SyncFlags::END_READ)?;
    Ok(verified)
}

#[derive(Debug, Clone, PartialEq)]
struct Written {
    seed: u64,
    bytes: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Verified {
    pub(crate) seed: u64,
    /// Bytes found to match, up to the mismatch if any.
    pub(crate) bytes: u64,
    pub(crate) mismatch: Option<Mismatch>,
}

/// What `export` did, for printing.
#[derive(Debug, Clone, PartialEq)]
struct Report {
    device: PathBuf,
    handle: u32,
    /// Of the allocation.
    hbm_offset: u64,
    allocation_length: u64,
    fd: i32,
    /// Of the exported range in the allocation.
    offset: u64,
    length: u64,
    writable: bool,
    written: Option<Written>,
    verified: Option<Verified>,
    hold: u64,
}

impl Report {
    /// Where the exported range starts in the HBM BAR.
    fn export_hbm_offset(&self) -> u64 {
        self.hbm_offset + self.offset
    }

    fn to_json(&self) -> Value {
        json!({
            "device": self.device,
            "allocation": {
                "handle": self.handle,
                "hbm_offset": self.hbm_offset,
                "length": self.allocation_length,
            },
            "export": {
                "fd": self.fd,
                "offset": self.offset,
                "length": self.length,
                "hbm_offset": self.export_hbm_offset(),
                "writable": self.writable,
            },
            "pattern": self.written.as_ref().map(|w| json!({
                "seed": w.seed,
                "bytes_written": w.bytes,
            })),
            "verify": self.verified.as_ref().map(|v| json!({
                "seed": v.seed,
                "bytes_verified": v.bytes,
                "mismatch": v.mismatch.map(|m| json!({
                    "offset": m.offset,
                    "hbm_offset": self.export_hbm_offset() + m.offset,
                    "expected": m.expected,
                    "found": m.found,
                })),
            })),
            "hold_seconds": self.hold,
        })
    }

    fn write_text(&self, out: &mut impl Write) -> Result<()> {
        let mut text = format!(
            "{}: handle {}, {} bytes ({}) at HBM offset {:#x}\n\
             dma-buf fd {}: bytes {:#x}..{:#x} of the allocation, {} bytes ({}) at HBM offset {:#x}, {}\n",
            self.device.display(),
            self.handle,
            self.allocation_length,
            human_bytes(self.allocation_length),
            self.hbm_offset,
            self.fd,
            self.offset,
            self.offset + self.length,
            self.length,
            human_bytes(self.length),
            self.export_hbm_offset(),
            if self.writable { "read-write" } else { "read-only" },
        );
        if let Some(written) = &self.written {
            text += &format!(
                "wrote {} bytes of pattern {:#x}\n",
                written.bytes, written.seed
            );
        }
        if let Some(verified) = &self.verified {
            text += &match verified.mismatch {
                None => format!(
                    "verified {} bytes of pattern {:#x}: ok\n",
                    verified.bytes, verified.seed
                ),
                Some(m) => format!(
                    "verify pattern {:#x}: MISMATCH at byte {:#x} of the dma-buf (HBM offset {:#x}): expected {:#04x}, found {:#04x}\n",
                    verified.seed,
                    m.offset,
                    self.export_hbm_offset() + m.offset,
                    m.expected,
                    m.found
                ),
            };
        }
        if self.hold > 0 {
            text += &format!("holding the dma-buf for {} s\n", self.hold);
        }
        out.write_all(text.as_bytes()).context("writing to stdout")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        Report {
            device: "/dev/peerdirect0".into(),
            handle: 3,
            hbm_offset: 0x40_0000,
            allocation_length: 4 << 20,
            fd: 4,
            offset: 0x1000,
            length: 0x2000,
            writable: true,
            written: Some(Written {
                seed: 42,
                bytes: 0x2000,
            }),
            verified: Some(Verified {
                seed: 42,
                bytes: 0x2000,
                mismatch: None,
            }),
            hold: 5,
        }
    }

    #[test]
    fn json_shape() {
        assert_eq!(
            report().to_json(),
            json!({
                "device": "/dev/peerdirect0",
                "allocation": {"handle": 3, "hbm_offset": 4194304, "length": 4194304},
                "export": {
                    "fd": 4,
                    "offset": 4096,
                    "length": 8192,
                    "hbm_offset": 4198400,
                    "writable": true
                },
                "pattern": {"seed": 42, "bytes_written": 8192},
                "verify": {"seed": 42, "bytes_verified": 8192, "mismatch": null},
                "hold_seconds": 5
            })
        );
    }

    #[test]
    fn json_without_pattern_and_with_a_mismatch() {
        let report = Report {
            writable: false,
            written: None,
            verified: Some(Verified {
                seed: 7,
                bytes: 16,
                mismatch: Some(Mismatch {
                    offset: 16,
                    expected: 0xab,
                    found: 0,
                }),
            }),
            ..report()
        };
        let json = report.to_json();
        assert_eq!(json["pattern"], Value::Null);
        assert_eq!(json["export"]["writable"], false);
        assert_eq!(
            json["verify"],
            json!({
                "seed": 7,
                "bytes_verified": 16,
                "mismatch": {"offset": 16, "hbm_offset": 4198416, "expected": 171, "found": 0}
            })
        );
    }

    #[test]
    fn text() {
        let mut out = Vec::new();
        report().write_text(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "/dev/peerdirect0: handle 3, 4194304 bytes (4 MiB) at HBM offset 0x400000\n\
             dma-buf fd 4: bytes 0x1000..0x3000 of the allocation, 8192 bytes (8 KiB) at HBM offset 0x401000, read-write\n\
             wrote 8192 bytes of pattern 0x2a\n\
             verified 8192 bytes of pattern 0x2a: ok\n\
             holding the dma-buf for 5 s\n"
        );
    }

    #[test]
    fn text_with_a_mismatch() {
        let report = Report {
            written: None,
            verified: Some(Verified {
                seed: 7,
                bytes: 16,
                mismatch: Some(Mismatch {
                    offset: 16,
                    expected: 0xab,
                    found: 0,
                }),
            }),
            hold: 0,
            ..report()
        };
        let mut out = Vec::new();
        report.write_text(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.ends_with(
                "verify pattern 0x7: MISMATCH at byte 0x10 of the dma-buf (HBM offset 0x401010): expected 0xab, found 0x00\n"
            ),
            "{text}"
        );
    }
}
