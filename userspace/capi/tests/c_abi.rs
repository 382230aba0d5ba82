//! `tests/c_program.c`, compiled against `include/peerdirect.h` and linked against
//! libpeerdirect.so built from the current sources, calls every function on this host (which has no
//! peerdirect device: the failure paths, their errnos and messages). The success paths run
//! in the guest: `tests/system/capi.sh`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds libpeerdirect.so from the current sources and returns its directory. Integration
/// tests do not make cargo build a cdylib, and the one in the workspace's target directory may
/// be stale, so this runs cargo itself, in a target directory of its own (no lock shared with
/// the `cargo test` that runs it).
fn library_dir() -> PathBuf {
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("capi-target");
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(&cargo);
    command
        .args([
            "build",
            "--quiet",
            "--locked",
            "--lib",
            "-p",
            "peerdirect-capi",
        ])
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .env_remove("CARGO_TARGET_DIR");
    if profile == "release" {
        command.arg("--release");
    }
    let status = command
        .status()
        .unwrap_or_else(|err| panic!("cannot run {cargo}: {err}"));
    assert!(status.success(), "{cargo} build -p peerdirect-capi failed");
    let dir = target.join(profile);
    assert!(
        dir.join("libpeerdirect.so").is_file(),
        "no libpeerdirect.so in {}",
        dir.display()
    );
    dir
}

#[test]
fn c_program_calls_every_function_through_the_shared_library() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("c_abi");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let library_dir = library_dir();
    // The program loads the library by its soname.
    std::os::unix::fs::symlink(
        library_dir.join("libpeerdirect.so"),
        work.join("libpeerdirect.so.0"),
    )
    .unwrap();
    std::fs::write(work.join("not-a-device"), b"").unwrap();

    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let binary = work.join("c_program");
    let output = Command::new(&cc)
        .args(["-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(manifest.join("include"))
        .arg("-o")
        .arg(&binary)
        .arg(manifest.join("tests/c_program.c"))
        .arg("-L")
        .arg(&library_dir)
        .arg("-lpeerdirect")
        .output()
        .unwrap_or_else(|err| panic!("cannot run the C compiler `{cc}`: {err}"));
    assert!(
        output.status.success(),
        "{cc} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // scripts/valgrind-tests runs the program under memcheck through this variable.
    let mut command = match std::env::var("PEERDIRECT_C_PROGRAM_WRAPPER") {
        Ok(wrapper) if !wrapper.trim().is_empty() => {
            let mut words = wrapper.split_whitespace();
            let mut command = Command::new(words.next().unwrap_or_default());
            command.args(words).arg(&binary);
            command
        }
        _ => Command::new(&binary),
    };
    let output = command
        .arg(work.join("not-a-device"))
        .env("LD_LIBRARY_PATH", &work)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "c_program failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
