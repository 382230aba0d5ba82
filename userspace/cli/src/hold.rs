//! `--hold SECONDS` of `export` and `companion export`: keeping a dma-buf while watching that
//! the module does not revoke it.
//!
//! The module revokes a device's exports when the device goes away (unbind, removal; for a
//! companion also `companion remove` and its owner's unbind; not unload, which an open device
//! file holds off) and, keeping the device, when it is reset (a companion's owner announces
//! its resets). Either way the held dma-buf is dead, and a command that exited 0 after holding it would tell a script that its importer
//! had the memory all along. The device file's status page (`Device::status`, one load, no
//! system call) says both: revoked in its state, and a reset in its count of resets, which
//! revokes the exports made before it. A module without a status page (older than this tool)
//! leaves a revocation unnoticed here.

use std::fmt;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use peerdirect::{Device, DeviceStatus};

/// How often the status page is read while holding.
const EVERY: Duration = Duration::from_millis(100);

/// A device's status page as it was before an export, to tell when that export is revoked.
pub struct Watch {
    path: PathBuf,
    companion: bool,
    status: Option<DeviceStatus>,
    /// Resets counted before the export: one more revokes it.
    resets: u32,
}

impl Watch {
    /// Reads `device`'s status page; call it before exporting (a reset counted after this read
    /// may have revoked the export). `companion`: whether the device is a companion, whose
    /// exports other things revoke.
    pub fn before_export(device: &Device, companion: bool) -> Self {
        let status = device.status();
        Self {
            path: device.path().to_owned(),
            companion,
            resets: status.as_ref().map_or(0, DeviceStatus::resets),
            status,
        }
    }

    /// Why the exports made since [`Watch::before_export`] are revoked, if the status page says
    /// they are.
    pub fn revoked(&self) -> Option<String> {
        let status = self.status.as_ref()?;
        why_revoked(
            self.companion,
            status.revoked(),
            status.resets().wrapping_sub(self.resets),
        )
    }

    /// Sleeps for `seconds`, reading the status page every [`EVERY`]; stops with
    /// [`Revoked`] as soon as it says the export is revoked (also before and after).
    pub fn hold(&self, seconds: u64) -> Result<(), Revoked> {
        let start = Instant::now();
        let hold = Duration::from_secs(seconds);
        loop {
            if let Some(why) = self.revoked() {
                return Err(Revoked {
                    path: self.path.clone(),
                    held: start.elapsed(),
                    hold,
                    why,
                });
            }
            let left = hold.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Ok(());
            }
            thread::sleep(left.min(EVERY));
        }
    }
}

/// Why the module revoked an export: `revoked` is the status page's state, `resets` the resets
/// it counted since the export; `None` if neither says so.
fn why_revoked(companion: bool, revoked: bool, resets: u32) -> Option<String> {
    if revoked {
        Some(if companion {
            "the companion is going away: `companion remove`, its owner driver unbound, or the PCI device removed".to_owned()
        } else {
            "the HBM device is going away: unbound from peerdirect, or the PCI device removed (hot-unplug, sysfs remove)".to_owned()
        })
    } else if resets > 0 {
        Some(format!(
            "the device was reset ({resets} reset{} since the export{}), which revokes every export made before it; the device stays: export again",
            if resets == 1 { "" } else { "s" },
            if companion { ", announced by its owner" } else { "" },
        ))
    } else {
        None
    }
}

/// The module revoked the held export; exits 1 like any error.
#[derive(Debug)]
pub struct Revoked {
    path: PathBuf,
    held: Duration,
    hold: Duration,
    why: String,
}

impl fmt::Display for Revoked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the export of {} was revoked {:.1} s into the {} s hold: {}; the dma-buf's memory is gone (its CPU mappings fault, importers lose it)",
            self.path.display(),
            self.held.as_secs_f64(),
            self.hold.as_secs(),
            self.why
        )
    }
}

impl std::error::Error for Revoked {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revoked_export_says_why() {
        assert_eq!(why_revoked(false, false, 0), None);
        assert_eq!(why_revoked(true, false, 0), None);
        let gone = why_revoked(false, true, 0).unwrap();
        assert!(
            gone.starts_with("the HBM device is going away: unbound from peerdirect"),
            "{gone}"
        );
        // Going away says more than a reset counted on the way.
        assert_eq!(why_revoked(false, true, 1), Some(gone));
        let companion = why_revoked(true, true, 0).unwrap();
        assert!(companion.contains("`companion remove`"), "{companion}");
        assert_eq!(
            why_revoked(false, false, 1).unwrap(),
            "the device was reset (1 reset since the export), which revokes every export made before it; the device stays: export again"
        );
        assert!(why_revoked(true, false, 2).unwrap().starts_with(
            "the device was reset (2 resets since the export, announced by its owner)"
        ));
    }

    #[test]
    fn the_message_names_the_device_and_when() {
        let revoked = Revoked {
            path: "/dev/peerdirect0".into(),
            held: Duration::from_millis(1300),
            hold: Duration::from_secs(30),
            why: "the device was reset".into(),
        };
        assert_eq!(
            revoked.to_string(),
            "the export of /dev/peerdirect0 was revoked 1.3 s into the 30 s hold: the device was reset; the dma-buf's memory is gone (its CPU mappings fault, importers lose it)"
        );
    }
}
