//! The crash report of `peerdirect-guest-tests` (src/crash.rs), on the host: the program is
//! made to fault in a thread of a known name, and its output must say so.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

#[test]
fn a_crash_reports_its_signal_thread_and_stack_then_dies_of_the_signal() {
    let out = Command::new(env!("CARGO_BIN_EXE_peerdirect-guest-tests"))
        .args(["--crash-in", "faulter"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(11), "{:?}: {stderr}", out.status);
    let first = stderr.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("# fatal signal 11 at address 0x8 in thread ")
            && first.ends_with(" (faulter); its stack:"),
        "{stderr}"
    );
    let frames: Vec<&str> = stderr.lines().skip(1).collect();
    assert!(
        frames.iter().all(|l| l.starts_with("#   ")),
        "every frame a TAP comment: {stderr}"
    );
    // The faulting function is the program's own, under the handler and the signal return.
    assert!(
        frames
            .iter()
            .any(|l| l.contains("peerdirect-guest-tests+0x")),
        "no frame of the program: {stderr}"
    );
    assert!(
        frames.iter().any(|l| l.contains("libc.so.6+0x")),
        "no frame of libc (the signal return, the thread start): {stderr}"
    );
}
