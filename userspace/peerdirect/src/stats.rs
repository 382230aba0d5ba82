//! The module's per-device statistics in debugfs:
//! `/sys/kernel/debug/peerdirect/peerdirectN/stats`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use rustix::io::Errno;
use serde::Serialize;

use crate::error::Operation;
use crate::uapi::DEVICE_PREFIX;
use crate::Error;

/// Where debugfs is mounted.
pub const DEBUGFS: &str = "/sys/kernel/debug";
/// `statfs(2)`'s `f_type` of debugfs (linux/magic.h).
const DEBUGFS_MAGIC: u64 = 0x6462_6720;

/// The statistics file of HBM device `index` (`/dev/peerdirect<index>`).
pub fn stats_path(index: u32) -> PathBuf {
    Path::new(DEBUGFS)
        .join(DEVICE_PREFIX)
        .join(format!("{DEVICE_PREFIX}{index}"))
        .join("stats")
}

/// What the module counts for one HBM device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Allocated ranges, those whose handle was freed but which dma-bufs still hold included.
    pub allocations: u64,
    /// Their bytes.
    pub allocated_bytes: u64,
    /// Live dma-bufs.
    pub exports: u64,
    /// Size of the HBM BAR.
    pub hbm_bytes: u64,
}

impl Stats {
    /// Reads the statistics of HBM device `index`. Needs root, and debugfs mounted at
    /// [`DEBUGFS`] ([`Error::DebugfsNotMounted`] otherwise).
    pub fn read(index: u32) -> Result<Self, Error> {
        let path = stats_path(index);
        match fs::read_to_string(&path) {
            Ok(text) => Self::parse(&path, &text),
            Err(err) if err.kind() == io::ErrorKind::NotFound && !debugfs_mounted() => {
                Err(Error::DebugfsNotMounted {
                    path,
                    debugfs: DEBUGFS.into(),
                })
            }
            Err(err) => {
                let errno = Errno::from_io_error(&err).unwrap_or(Errno::IO);
                Err(Error::os(Operation::Stats, &path, errno))
            }
        }
    }

    /// Parses the text of the statistics file at `path`: `key: value` lines. Keys it does not
    /// know are skipped (a newer module may count more); each known one must be there once.
    pub fn parse(path: &Path, text: &str) -> Result<Self, Error> {
        let bad = |problem: String| Error::BadStats {
            path: path.to_owned(),
            problem,
        };
        let mut values: [Option<u64>; 4] = [None; 4];
        const KEYS: [&str; 4] = ["allocations", "allocated_bytes", "exports", "hbm_bytes"];
        for line in text.lines().filter(|line| !line.trim().is_empty()) {
            let (key, value) = line
                .split_once(':')
                .ok_or_else(|| bad(format!("line {line:?} is not `key: value`")))?;
            let Some(slot) = KEYS.iter().position(|k| *k == key.trim()) else {
                continue;
            };
            let value = value
                .trim()
                .parse()
                .map_err(|_| bad(format!("line {line:?}: the value is not a number")))?;
            if values[slot].replace(value).is_some() {
                return Err(bad(format!("`{}` appears twice", KEYS[slot])));
            }
        }
        let value =
            |slot: usize| values[slot].ok_or_else(|| bad(format!("no `{}` line", KEYS[slot])));
        Ok(Self {
            allocations: value(0)?,
            allocated_bytes: value(1)?,
            exports: value(2)?,
            hbm_bytes: value(3)?,
        })
    }
}

/// Whether [`DEBUGFS`] is a mounted debugfs.
fn debugfs_mounted() -> bool {
    rustix::fs::statfs(DEBUGFS)
        .is_ok_and(|stat| u64::try_from(stat.f_type).is_ok_and(|t| t == DEBUGFS_MAGIC))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Stats, Error> {
        Stats::parse(
            Path::new("/sys/kernel/debug/peerdirect/peerdirect0/stats"),
            text,
        )
    }

    #[test]
    fn path_names_the_device() {
        assert_eq!(
            stats_path(3),
            Path::new("/sys/kernel/debug/peerdirect/peerdirect3/stats")
        );
    }

    #[test]
    fn parses_every_field() {
        let stats =
            parse("allocations: 2\nallocated_bytes: 8192\nexports: 1\nhbm_bytes: 268435456\n")
                .unwrap();
        assert_eq!(
            stats,
            Stats {
                allocations: 2,
                allocated_bytes: 8192,
                exports: 1,
                hbm_bytes: 268435456
            }
        );
    }

    #[test]
    fn tolerates_tabs_unknown_keys_and_any_order() {
        let stats = parse(
            "hbm_bytes:\t1024\nlargest_free: 4096\nexports:\t0\n\nallocated_bytes: 0\nallocations: 0",
        )
        .unwrap();
        assert_eq!(stats.hbm_bytes, 1024);
        assert_eq!(stats.exports, 0);
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        for (text, problem) in [
            (
                "allocations: 1\nallocated_bytes: 1\nexports: 1\n",
                "no `hbm_bytes` line",
            ),
            ("allocations: x\n", "the value is not a number"),
            ("allocations 1\n", "is not `key: value`"),
            (
                "allocations: 1\nallocations: 2\nallocated_bytes: 1\nexports: 1\nhbm_bytes: 1\n",
                "`allocations` appears twice",
            ),
        ] {
            let err = parse(text).unwrap_err();
            assert!(matches!(err, Error::BadStats { .. }), "{err:?}");
            let msg = err.to_string();
            assert!(msg.contains(problem), "{msg}");
            assert!(
                msg.starts_with("read /sys/kernel/debug/peerdirect/peerdirect0/stats: "),
                "{msg}"
            );
        }
    }
}
