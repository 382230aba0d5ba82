//! Driving a removal that does not return at once: since removal waits for importers that
//! cannot be revoked (Documentation/lifecycle.md), tests start it in the background, watch
//! what the module says meanwhile (the device file polls `POLLPRI`, the kernel log names who
//! holds what), let go, and then see it complete.

use std::os::fd::AsFd;
use std::process::Command;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;

use crate::race::bound_device;
use crate::support::{find_nic, join, write_sysfs, Outcome, Tap};
use crate::testmod::TestModule;
use crate::SYSFS_DRIVER;

/// The kernel's first line while removal waits for mappings that cannot be revoked
/// (`Hbm::log_pinned_holders`).
pub(crate) const WAITS_LOG: &str = "removal waits";
/// What the kernel says once removal has revoked the exports: "revoked N export(s); M more
/// were being released".
const REVOKED_LOG: &str = ": revoked ";
/// What the kernel says, after the device's name, when it binds a device (`HbmDriver::probe`).
pub(crate) const BOUND_LOG: &str = ": HBM BAR";

/// An unbind running in a thread of its own.
pub(crate) struct Unbinding {
    done: Receiver<(Outcome, Duration)>,
    started: Instant,
    thread: thread::JoinHandle<()>,
}

impl Unbinding {
    /// Writes `bdf` to the driver's `unbind` in a new thread.
    pub(crate) fn start(bdf: &str) -> Self {
        Self::of_driver(SYSFS_DRIVER, bdf)
    }

    /// Writes `bdf` to the `unbind` of the driver whose sysfs directory is `driver` (a
    /// companion's owner's, say) in a new thread.
    pub(crate) fn of_driver(driver: &str, bdf: &str) -> Self {
        let (tx, done) = mpsc::channel();
        let bdf = bdf.to_owned();
        let unbind = format!("{driver}/unbind");
        let started = Instant::now();
        let thread = thread::spawn(move || {
            let outcome = write_sysfs(&unbind, &bdf);
            let _ = tx.send((outcome, started.elapsed()));
        });
        Self {
            done,
            started,
            thread,
        }
    }

    /// How long ago it started.
    pub(crate) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// `Err` if the unbind has returned already.
    pub(crate) fn expect_pending(&self) -> Outcome {
        match self.done.try_recv() {
            Err(mpsc::TryRecvError::Empty) => Ok(()),
            Ok((outcome, took)) => Err(format!(
                "expected the unbind to wait, got it returned after {} ms ({outcome:?})",
                took.as_millis()
            )),
            Err(mpsc::TryRecvError::Disconnected) => {
                Err("the unbinding thread ended without a word".to_owned())
            }
        }
    }

    /// Waits up to `limit` for the unbind to return; its outcome and how long it took.
    pub(crate) fn finish(self, limit: Duration) -> Result<Duration, String> {
        let answer = match self.done.recv_timeout(limit) {
            Ok(answer) => answer,
            Err(RecvTimeoutError::Timeout) => {
                return Err(format!(
                    "expected the unbind to return within {} s, still waiting after {} s",
                    limit.as_secs(),
                    self.started.elapsed().as_secs()
                ))
            }
            Err(RecvTimeoutError::Disconnected) => {
                join("the unbinding thread", self.thread)?;
                return Err("the unbinding thread ended without a word".to_owned());
            }
        };
        join("the unbinding thread", self.thread)?;
        let (outcome, took) = answer;
        outcome.map(|()| took)
    }
}

/// Waits up to `limit` for `file` (a `/dev/peerdirectN` file) to poll `POLLPRI` and
/// `POLLHUP`: the module started removing the device.
pub(crate) fn expect_going(file: &impl AsFd, limit: Duration) -> Outcome {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = Timespec {
            tv_sec: left.as_secs() as _,
            tv_nsec: left.subsec_nanos() as _,
        };
        let mut fds = [PollFd::new(file, PollFlags::PRI)];
        match poll(&mut fds, Some(&timeout)) {
            Ok(0) => {
                return Err(format!(
                    "expected the device file to poll POLLPRI within {} s, got nothing",
                    limit.as_secs()
                ))
            }
            Ok(_) => {}
            Err(Errno::INTR) => continue,
            Err(errno) => return Err(format!("poll of the device file failed: {errno}")),
        }
        let revents = fds[0].revents();
        return if revents.contains(PollFlags::PRI | PollFlags::HUP) {
            Ok(())
        } else {
            Err(format!(
                "expected the device file to poll POLLPRI | POLLHUP, got {revents:?}"
            ))
        };
    }
}

/// How many "removal waits" reports the kernel log holds so far.
pub(crate) fn waits_reports() -> Result<usize, String> {
    Ok(kernel_log()?
        .lines()
        .filter(|l| l.contains(WAITS_LOG))
        .count())
}

/// Waits up to `limit` for a "removal waits" report beyond the first `seen`: removal has
/// revoked every export, revocable importers have unmapped, and it now waits for those that
/// cannot be revoked.
pub(crate) fn expect_waiting(seen: usize, limit: Duration) -> Outcome {
    let deadline = Instant::now() + limit;
    while waits_reports()? <= seen {
        if Instant::now() >= deadline {
            return Err(format!(
                "expected the kernel to report within {} s that removal waits, got no new '{WAITS_LOG}' line",
                limit.as_secs()
            ));
        }
        thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// The last removal's revocation report (`Hbm::remove`): how many exports it revoked, and
/// how many it skipped because their release had begun.
pub(crate) fn revocation_report() -> Result<(u64, u64), String> {
    let log = kernel_log()?;
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains(REVOKED_LOG))
        .ok_or_else(|| format!("expected a kernel line with '{REVOKED_LOG}', got none"))?;
    parse_revoked(line)
}

/// The revocation report of the last removal of device `index` at `bdf`, which has returned:
/// (revoked, skipped as being released), (0, 0) if it found no export (it says nothing then).
pub(crate) fn last_removal_report(index: u32, bdf: &str) -> Result<(u64, u64), String> {
    removal_report_in(&kernel_log()?, index, bdf)
}

/// [`last_removal_report`] in the kernel log `log`: the report between the device's last
/// bind and its last removal.
fn removal_report_in(log: &str, index: u32, bdf: &str) -> Result<(u64, u64), String> {
    let lines: Vec<&str> = log.lines().collect();
    let removed = format!("peerdirect{index}: removed {bdf}");
    let end = lines
        .iter()
        .rposition(|l| l.contains(&removed))
        .ok_or_else(|| format!("expected a kernel line with '{removed}', got none"))?;
    let bound = format!("peerdirect{index}{BOUND_LOG}");
    let start = lines[..end]
        .iter()
        .rposition(|l| l.contains(&bound))
        .map_or(0, |i| i + 1);
    lines[start..end]
        .iter()
        .rev()
        .find(|l| l.contains(REVOKED_LOG))
        .map_or(Ok((0, 0)), |line| parse_revoked(line))
}

/// The numbers of a revocation report line.
fn parse_revoked(line: &str) -> Result<(u64, u64), String> {
    let numbers: Vec<u64> = line
        .split_once(REVOKED_LOG)
        .map_or("", |(_, rest)| rest)
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|word| word.parse().ok())
        .collect();
    match numbers[..] {
        [revoked, releasing] => Ok((revoked, releasing)),
        _ => Err(format!("cannot read the revocation report {line:?}")),
    }
}

pub(crate) fn kernel_log() -> Result<String, String> {
    let output = Command::new("dmesg")
        .output()
        .map_err(|err| format!("cannot run dmesg: {err}"))?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The kernel log's lines from the last "removal waits" report on: it must name each of
/// `expected` (the holders: handles, pids, importers).
pub(crate) fn expect_waits_log(expected: &[String]) -> Outcome {
    expect_log_report(WAITS_LOG, expected)
}

/// The kernel log's lines from the last one that holds `marker` on: they must name each of
/// `expected`.
pub(crate) fn expect_log_report(marker: &str, expected: &[String]) -> Outcome {
    let log = kernel_log()?;
    let lines: Vec<&str> = log.lines().collect();
    let Some(first) = lines.iter().rposition(|l| l.contains(marker)) else {
        let tail = &lines[lines.len().saturating_sub(10)..];
        return Err(format!(
            "expected a kernel line with '{marker}', got none; the log ends:\n{}",
            tail.join("\n")
        ));
    };
    let report = lines[first..].join("\n");
    for word in expected {
        if !report.contains(word.as_str()) {
            return Err(format!(
                "expected the report from '{marker}' on to name {word:?}, got:\n{report}"
            ));
        }
    }
    Ok(())
}

/// The bound device's PCI address, the NIC's, and the test importer module, loaded; `None`
/// after reporting what is missing as a failed test.
pub(crate) fn importer_setup(tap: &mut Tap) -> Option<(String, String, TestModule)> {
    let setup =
        (|| Ok::<_, String>((bound_device()?, find_nic()?, TestModule::load_importer()?)))();
    if let Err(err) = &setup {
        tap.report(
            "the device is bound, the NIC found, the importer loaded",
            &Err(err.clone()),
        );
    }
    setup.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removal_reports_belong_to_the_last_removal() {
        let bound = "[ 5.1] peerdirect 0000:01:00.0: peerdirect0: HBM BAR2 256 MiB at bus address 0xfe000000";
        let revoked = "[ 6.2] peerdirect 0000:01:00.0: peerdirect0: revoked 300 export(s); 2 more were being released";
        let removed = "[ 6.3] peerdirect0: removed 0000:01:00.0";
        let log = [bound, revoked, removed].join("\n");
        assert_eq!(removal_report_in(&log, 0, "0000:01:00.0"), Ok((300, 2)));
        // Bound again and removed with nothing exported: no report of its own.
        let log = [bound, revoked, removed, bound, removed].join("\n");
        assert_eq!(removal_report_in(&log, 0, "0000:01:00.0"), Ok((0, 0)));
        let none = removal_report_in(bound, 0, "0000:01:00.0").unwrap_err();
        assert!(none.contains("peerdirect0: removed 0000:01:00.0"), "{none}");
        assert_eq!(parse_revoked(revoked), Ok((300, 2)));
    }
}
