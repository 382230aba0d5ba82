//! `peerdirect ... | head -c 1`: when the reader of its output goes away, the command ends as
//! coreutils do, killed by SIGPIPE (a shell reports status 141) without a word on stderr, not
//! with "Broken pipe" and status 1. Run on the host: without HBM devices, `devices --json`
//! still prints `[]`, and `doctor` its checks.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output, Stdio};

/// The `peerdirect` binary run with `args`, its stdout a pipe whose reading end is closed
/// before it starts: its first write to stdout fails with EPIPE.
fn into_a_closed_pipe(args: &[&str]) -> Output {
    let (reader, writer) = io::pipe().unwrap();
    drop(reader);
    Command::new(env!("CARGO_BIN_EXE_peerdirect"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn a_closed_stdout_ends_the_command_by_sigpipe_without_a_message() {
    for args in [
        &["devices", "--json"][..],
        &["doctor"],
        &["doctor", "--json"],
    ] {
        let out = into_a_closed_pipe(args);
        assert_eq!(
            (out.status.signal(), out.status.code()),
            (Some(libc::SIGPIPE), None),
            "{args:?}: {:?}, stderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stderr), "", "{args:?}");
    }
}
