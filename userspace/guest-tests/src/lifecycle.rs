//! `--lifecycle`: what becomes of /dev/peerdirect0 and of the files open on it when the PCI
//! device is unbound, rebound, removed and rescanned, and when the module is unloaded; and that
//! a load failing half-way (its PCI driver's name taken) leaves nothing behind.
//!
//! The tests are steps of one sequence that share state (the open files). A failed step that
//! later steps build on (a gate: it changes the device's or the module's state) stops the
//! sequence; the steps after it are reported as not run.

use std::fs;
use std::io;
use std::process::Command;
use std::time::Duration;

use peerdirect::{Device, DeviceInfo, Errno, PciAddress};

use crate::support::{
    errno_name, expect_eq, expect_fdinfo, fdinfo, insmod, module_listed, run_command, wait_for,
    write_sysfs, Outcome,
};
use crate::{INDEX, SYSFS_DRIVER};

/// The module, as rmmod and /proc/modules name it; also the driver's name.
const MODULE: &str = "peerdirect";
const SYSFS_PCI: &str = "/sys/bus/pci";
/// How long a device node or a sysfs entry gets to appear or go away.
const SETTLE: Duration = Duration::from_secs(2);
const PRESENT: &str = "peerdirect-present";
/// The module file in the guest.
const MODULE_PATH: &str = "/lib/peerdirect/peerdirect.ko";
/// The test module that registers a PCI driver named peerdirect
/// (tests/kmod/peerdirect_namesake.c), and its file.
const NAMESAKE: &str = "peerdirect_namesake";
const NAMESAKE_PATH: &str = "/lib/peerdirect/tests/peerdirect_namesake.ko";
/// What insmod says for `EBUSY`.
const EBUSY_TEXT: &str = "Device or resource busy";
/// The module's debugfs directory, made while it loads.
const DEBUGFS_ROOT: &str = "/sys/kernel/debug/peerdirect";

/// What the steps share.
pub(crate) struct State {
    /// Opened while bound; kept open across unbind and rebind.
    a: Option<Device>,
    /// Opened after rebinding.
    b: Option<Device>,
    /// INFO on A, at the start.
    info: DeviceInfo,
}

impl State {
    fn bdf(&self) -> PciAddress {
        self.info.pci_address
    }

    fn a(&self) -> Result<&Device, String> {
        self.a.as_ref().ok_or_else(|| "fd A is not open".to_owned())
    }

    fn b(&self) -> Result<&Device, String> {
        self.b.as_ref().ok_or_else(|| "fd B is not open".to_owned())
    }
}

/// A step of the sequence.
pub(crate) type Step = crate::support::Step<State>;

/// A step whose failure stops the sequence.
fn gate(description: impl Into<String>, run: impl Fn(&mut State) -> Outcome + 'static) -> Step {
    crate::support::gate(description, run)
}

/// A step whose failure the following steps do not depend on.
fn check(description: impl Into<String>, run: impl Fn(&mut State) -> Outcome + 'static) -> Step {
    crate::support::check(description, run)
}

pub(crate) const START: &str = "/dev/peerdirect0 opens as fd A and INFO on A succeeds";

/// Opens fd A and asks it which device it is.
pub(crate) fn start() -> Result<State, String> {
    let a = open_node()?;
    let info = a
        .info()
        .map_err(|err| format!("expected INFO on A to succeed, got {err}"))?;
    Ok(State {
        a: Some(a),
        b: None,
        info,
    })
}

pub(crate) fn steps() -> Vec<Step> {
    vec![
        check(
            "fdinfo of A names peerdirect0, its PCI address and HBM size, and says present: true",
            |s| {
                let fdinfo = fdinfo(s.a()?)?;
                expect_fdinfo(&fdinfo, "peerdirect-device", &format!("{MODULE}{INDEX}"))?;
                expect_fdinfo(&fdinfo, "peerdirect-pci", &s.bdf().to_string())?;
                expect_fdinfo(
                    &fdinfo,
                    "peerdirect-hbm-bytes",
                    &s.info.hbm_bytes.to_string(),
                )?;
                expect_fdinfo(&fdinfo, PRESENT, "true")
            },
        ),
        gate(
            format!("writing the device to {SYSFS_DRIVER}/unbind unbinds it"),
            |s| {
                write_sysfs(&format!("{SYSFS_DRIVER}/unbind"), &s.bdf().to_string())?;
                expect_bound(s.bdf(), false)
            },
        ),
        check("after unbind, /dev/peerdirect0 goes away", |_| {
            expect_node(false)
        }),
        check(
            "after unbind, INFO on A fails with ENODEV and the error has a hint",
            |s| expect_enodev_with_hint(s.a()?),
        ),
        check("after unbind, fdinfo of A says present: false", |s| {
            expect_fdinfo(&fdinfo(s.a()?)?, PRESENT, "false")
        }),
        gate(
            "rmmod peerdirect fails while A is open, and the module stays loaded",
            |_| {
                let (succeeded, said) = rmmod()?;
                if succeeded {
                    return Err(format!("expected rmmod {MODULE} to fail, got success"));
                }
                expect_loaded(true).map_err(|err| format!("{err} (rmmod said: {said})"))
            },
        ),
        gate(
            format!(
                "writing the device to {SYSFS_DRIVER}/bind binds it, /dev/peerdirect0 comes back and opens as fd B"
            ),
            |s| {
                write_sysfs(&format!("{SYSFS_DRIVER}/bind"), &s.bdf().to_string())?;
                expect_bound(s.bdf(), true)?;
                expect_node(true)?;
                s.b = Some(open_node()?);
                Ok(())
            },
        ),
        check("INFO on B succeeds and names the same PCI address", |s| {
            expect_info(s.b()?, s.bdf())
        }),
        check(
            "after rebind, INFO on A still fails with ENODEV (the old file stays dead)",
            |s| expect_enodev_with_hint(s.a()?),
        ),
        gate(
            "with A and B closed, removing the device takes it and /dev/peerdirect0 away",
            |s| {
                s.a = None;
                s.b = None;
                let dir = device_dir(s.bdf());
                write_sysfs(&format!("{dir}/remove"), "1")?;
                expect_exists(&dir, false)?;
                expect_node(false)
            },
        ),
        gate("rescanning the PCI bus brings the device back", |s| {
            write_sysfs(&format!("{SYSFS_PCI}/rescan"), "1")?;
            expect_exists(&device_dir(s.bdf()), true)
        }),
        check(
            "the rescanned device has no driver_override, is not bound to peerdirect, and has no /dev/peerdirect0",
            |s| {
                let path = format!("{}/driver_override", device_dir(s.bdf()));
                let driver_override = fs::read_to_string(&path)
                    .map_err(|err| format!("expected to read {path}, got {err}"))?;
                match driver_override.trim() {
                    "" | "(null)" => Ok(()),
                    other => Err(format!(
                        "driver_override: expected (null), got {other:?}"
                    )),
                }?;
                expect_bound(s.bdf(), false)?;
                expect_node(false)
            },
        ),
        gate(
            "with driver_override set to peerdirect, drivers_probe binds the device and /dev/peerdirect0 comes back",
            |s| {
                let bdf = s.bdf();
                write_sysfs(&format!("{}/driver_override", device_dir(bdf)), MODULE)?;
                write_sysfs(&format!("{SYSFS_PCI}/drivers_probe"), &bdf.to_string())?;
                expect_bound(bdf, true)?;
                expect_node(true)
            },
        ),
        check(
            "INFO on a newly opened fd succeeds and names the same PCI address",
            |s| expect_info(&open_node()?, s.bdf()),
        ),
        gate(
            "with no fd open, rmmod peerdirect succeeds, /dev/peerdirect0 goes away and the module is no longer loaded",
            |_| expect_unloads(),
        ),
        gate(
            "a PCI driver already named peerdirect loads (test module peerdirect_namesake)",
            |_| insmod(NAMESAKE_PATH),
        ),
        check(
            "insmod peerdirect then fails half-way with EBUSY, and leaves no module, no /dev/peerdirect0 and no debugfs directory",
            |_| {
                let output = Command::new("insmod")
                    .arg(MODULE_PATH)
                    .output()
                    .map_err(|err| format!("cannot run insmod: {err}"))?;
                let said = String::from_utf8_lossy(&output.stderr);
                if output.status.success() || !said.contains(EBUSY_TEXT) {
                    return Err(format!(
                        "expected insmod {MODULE_PATH} to fail with '{EBUSY_TEXT}', got {} ({})",
                        output.status,
                        said.trim()
                    ));
                }
                expect_loaded(false)?;
                expect_node(false)?;
                expect_exists(DEBUGFS_ROOT, false)
            },
        ),
        gate(
            "once that module is gone, insmod peerdirect succeeds and binds the device again",
            |s| {
                run_command("rmmod", &[NAMESAKE])?;
                insmod(MODULE_PATH)?;
                expect_bound(s.bdf(), true)?;
                expect_node(true)
            },
        ),
        check(
            "INFO succeeds, and the device's debugfs directory is back",
            |s| {
                expect_info(&open_node()?, s.bdf())?;
                expect_exists(&format!("{DEBUGFS_ROOT}/{MODULE}{INDEX}/stats"), true)
            },
        ),
        check("rmmod peerdirect succeeds again", |_| expect_unloads()),
    ]
}

/// `rmmod peerdirect` succeeds, the device node goes away and the module is no longer loaded.
fn expect_unloads() -> Outcome {
    let (succeeded, said) = rmmod()?;
    if !succeeded {
        return Err(format!("expected rmmod {MODULE} to succeed, got {said}"));
    }
    expect_node(false)?;
    expect_loaded(false)
}

fn open_node() -> Result<Device, String> {
    Device::open_index(INDEX).map_err(|err| format!("expected open to succeed, got {err}"))
}

fn expect_info(device: &Device, bdf: PciAddress) -> Outcome {
    let info = device
        .info()
        .map_err(|err| format!("expected INFO to succeed, got {err}"))?;
    expect_eq("pci_address", bdf.to_string(), info.pci_address.to_string())
}

fn expect_enodev_with_hint(device: &Device) -> Outcome {
    let err = match device.info() {
        Ok(info) => {
            return Err(format!(
                "expected ENODEV, got success (pci_address {})",
                info.pci_address
            ))
        }
        Err(err) => err,
    };
    if err.errno() != Some(Errno::NODEV) {
        return Err(format!(
            "expected ENODEV, got {} ({err})",
            err.errno().map_or("no errno", errno_name)
        ));
    }
    match err.hint() {
        Some(_) => Ok(()),
        None => Err(format!(
            "expected the ENODEV error to have a hint, got none ({err})"
        )),
    }
}

fn device_dir(bdf: PciAddress) -> String {
    format!("{SYSFS_PCI}/devices/{bdf}")
}

/// Waits for `path` to exist (or to be gone) within [`SETTLE`].
fn expect_exists(path: &str, exists: bool) -> Outcome {
    if wait_for(SETTLE, || fs::symlink_metadata(path).is_ok() == exists).is_ok() {
        return Ok(());
    }
    let (expected, got) = if exists {
        ("to appear", "still absent")
    } else {
        ("to go away", "still present")
    };
    Err(format!(
        "expected {path} {expected} within {}s, got it {got}",
        SETTLE.as_secs()
    ))
}

fn expect_node(exists: bool) -> Outcome {
    expect_exists(&peerdirect::device_path(INDEX).to_string_lossy(), exists)
}

/// The name of the driver the device is bound to, if any.
fn bound_driver(bdf: PciAddress) -> Result<Option<String>, String> {
    let link = format!("{}/driver", device_dir(bdf));
    match fs::read_link(&link) {
        Ok(target) => {
            Ok(Some(target.file_name().map_or_else(String::new, |name| {
                name.to_string_lossy().into_owned()
            })))
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(format!("expected to read {link}, got {err}")),
    }
}

/// Checks whether the device is bound to peerdirect.
fn expect_bound(bdf: PciAddress, bound: bool) -> Outcome {
    let driver = bound_driver(bdf)?;
    if (driver.as_deref() == Some(MODULE)) == bound {
        return Ok(());
    }
    let got = driver.map_or_else(|| "no driver".to_owned(), |d| format!("driver {d}"));
    let expected = if bound { "bound to" } else { "not bound to" };
    Err(format!("expected {bdf} {expected} {MODULE}, got {got}"))
}

/// Runs `rmmod peerdirect`: whether it succeeded, and what it said.
fn rmmod() -> Result<(bool, String), String> {
    let output = Command::new("rmmod")
        .arg(MODULE)
        .output()
        .map_err(|err| format!("expected to run rmmod, got {err}"))?;
    let said = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    Ok((
        output.status.success(),
        format!("{said} ({})", output.status),
    ))
}

fn expect_loaded(loaded: bool) -> Outcome {
    const PROC_MODULES: &str = "/proc/modules";
    let modules = fs::read_to_string(PROC_MODULES)
        .map_err(|err| format!("expected to read {PROC_MODULES}, got {err}"))?;
    let listed = module_listed(&modules, MODULE);
    if listed == loaded {
        return Ok(());
    }
    let (expected, got) = if loaded {
        ("listed", "absent")
    } else {
        ("absent", "listed")
    };
    Err(format!(
        "expected {MODULE} {expected} in {PROC_MODULES}, got it {got}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::{fdinfo_value, run_sequence};

    const FDINFO: &str = "pos:\t0\nflags:\t02100002\nmnt_id:\t17\nino:\t123\n\
        peerdirect-device:\tpeerdirect0\npeerdirect-pci:\t0000:03:00.0\n\
        peerdirect-hbm-bytes:\t268435456\npeerdirect-present:\ttrue\n";

    #[test]
    fn fdinfo_values_by_key() {
        assert_eq!(fdinfo_value(FDINFO, "pos"), Some("0"));
        assert_eq!(
            fdinfo_value(FDINFO, "peerdirect-device"),
            Some("peerdirect0")
        );
        // The value keeps its own colons.
        assert_eq!(fdinfo_value(FDINFO, "peerdirect-pci"), Some("0000:03:00.0"));
        assert_eq!(
            fdinfo_value(FDINFO, "peerdirect-hbm-bytes"),
            Some("268435456")
        );
        assert_eq!(fdinfo_value(FDINFO, PRESENT), Some("true"));
        assert_eq!(fdinfo_value(FDINFO, "peerdirect"), None);
        assert_eq!(fdinfo_value(FDINFO, "peerdirect-present\t"), None);
        assert_eq!(fdinfo_value("", PRESENT), None);
    }

    #[test]
    fn expect_fdinfo_diagnoses() {
        assert_eq!(expect_fdinfo(FDINFO, PRESENT, "true"), Ok(()));
        assert_eq!(
            expect_fdinfo(FDINFO, PRESENT, "false"),
            Err("peerdirect-present: expected \"false\", got \"true\"".to_owned())
        );
        let missing = expect_fdinfo("pos:\t0\n", PRESENT, "true").unwrap_err();
        assert!(
            missing.starts_with("peerdirect-present: expected \"true\", got no "),
            "{missing}"
        );
    }

    fn state() -> State {
        // Tests run in parallel threads: each call gets its own file.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "peerdirect-guest-tests-lifecycle-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        fs::write(&path, b"").unwrap();
        let a = Device::open(&path).unwrap();
        fs::remove_file(&path).unwrap();
        State {
            a: Some(a),
            b: None,
            info: DeviceInfo {
                path: path.clone(),
                index: INDEX,
                pci_address: PciAddress {
                    domain: 0,
                    bus: 3,
                    slot: 0,
                    func: 0,
                },
                vendor_id: 0x1af4,
                device_id: 0x1110,
                bar_index: 2,
                hbm_bytes: 1 << 28,
                hbm_bus_addr: 0,
                hbm_phys_addr: 0,
                numa_node: None,
                provider: peerdirect::Provider::Owned,
                driver: Some("peerdirect".to_owned()),
            },
        }
    }

    fn run(start: Result<State, String>, steps: &[Step]) -> Vec<(String, Outcome)> {
        let mut reported = Vec::new();
        run_sequence(START, start, steps, |_| {}, &mut |description, outcome| {
            reported.push((description.to_owned(), outcome.clone()));
        });
        reported
    }

    fn fail(_: &mut State) -> Outcome {
        Err("expected x, got y".to_owned())
    }

    #[test]
    fn a_failed_gate_stops_the_sequence_a_failed_check_does_not() {
        let steps = [
            check("check fails", fail),
            gate("gate passes", |s| s.a().map(drop)),
            gate("gate fails", fail),
            check("check after", |_| Ok(())),
            gate("gate after", |_| Ok(())),
        ];
        let not_run = Err("not run: \"gate fails\" failed".to_owned());
        assert_eq!(
            run(Ok(state()), &steps),
            [
                (START.to_owned(), Ok(())),
                (
                    "check fails".to_owned(),
                    Err("expected x, got y".to_owned())
                ),
                ("gate passes".to_owned(), Ok(())),
                ("gate fails".to_owned(), Err("expected x, got y".to_owned())),
                ("check after".to_owned(), not_run.clone()),
                ("gate after".to_owned(), not_run),
            ]
        );
    }

    #[test]
    fn nothing_runs_when_a_does_not_open() {
        let steps = steps();
        let reported = run(
            Err("expected open to succeed, got ENOENT".to_owned()),
            &steps,
        );
        assert_eq!(reported.len(), 1 + steps.len());
        assert_eq!(
            reported[0],
            (
                START.to_owned(),
                Err("expected open to succeed, got ENOENT".to_owned())
            )
        );
        for (description, outcome) in &reported[1..] {
            assert_eq!(
                outcome,
                &Err(format!("not run: \"{START}\" failed")),
                "{description}"
            );
        }
    }

    /// A regular file answers INFO with ENOTTY and has no peerdirect lines in its fdinfo.
    #[test]
    fn file_checks_fail_on_a_file_that_is_not_a_peerdirect_device() {
        let state = state();
        let a = state.a().unwrap();
        let diagnostic = expect_enodev_with_hint(a).unwrap_err();
        assert!(
            diagnostic.starts_with("expected ENODEV, got ENOTTY"),
            "{diagnostic}"
        );
        let fdinfo = fdinfo(a).unwrap();
        assert!(fdinfo_value(&fdinfo, "pos").is_some(), "{fdinfo}");
        let diagnostic = expect_fdinfo(&fdinfo, PRESENT, "true").unwrap_err();
        assert!(
            diagnostic.contains("got no peerdirect-present line"),
            "{diagnostic}"
        );
        let diagnostic = expect_info(a, state.bdf()).unwrap_err();
        assert!(
            diagnostic.starts_with("expected INFO to succeed, got "),
            "{diagnostic}"
        );
    }
}
