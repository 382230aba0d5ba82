//! `peerdirect`: the command-line view of the HBM devices the peerdirect module exports.

mod alloc;
mod companion;
mod devices;
mod doctor;
mod export;
mod hold;
mod provider;
mod register;
mod size;
mod stats;
mod table;
mod topo;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Inspect the accelerator HBM that peerdirect exports for peer-to-peer RDMA.
#[derive(Debug, Parser)]
#[command(
    name = "peerdirect",
    version,
    arg_required_else_help = true,
    after_help = "Exit status: 0 on success, 1 on an error, 2 on a usage error; \
`export --verify` exits 3 when the data is not the pattern. When the reader of its output \
goes away (`peerdirect ... | head`), a command ends killed by SIGPIPE (status 141 in a \
shell), without a message, as coreutils do."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the HBM devices (/dev/peerdirectN) with their PCI address, BAR and size.
    Devices(devices::Args),
    /// Allocate HBM, print its handle, HBM offset and length, and free it again.
    ///
    /// An allocation lives only as long as the open file that made it, here this command:
    /// use `export --hold` to keep one for a while.
    Alloc(alloc::Args),
    /// Allocate HBM, export it as a dma-buf, optionally write and check a pattern through the
    /// dma-buf's mapping, and hold the dma-buf for a while.
    Export(export::Args),
    /// Show, per HBM device, the allocations and dma-bufs the module has (from debugfs; needs
    /// root and debugfs mounted at /sys/kernel/debug).
    Stats(stats::Args),
    /// Allocate HBM, export it and register it with a libfabric provider (dlopen of
    /// libfabric.so.1 >= 1.20) through the registration cache; print the registration's path
    /// (dma_buf, or host_bounce with the provider's reason), key and the cache's counters.
    Register(register::Args),
    /// Show which PCI devices (RDMA NICs, network devices, accelerators) can reach each HBM
    /// device peer-to-peer, as the kernel decides it when their drivers attach, and why not.
    Topo(topo::Args),
    /// Check what this host needs for HBM-to-NIC transfers (the module and its build against
    /// the running kernel, devices, a NIC that reaches the HBM peer-to-peer, libfabric, locked
    /// memory, RDMAV_FORK_SAFE, EFA and verbs settings, FI_MR_DMABUF of HBM tried through the
    /// libfabric provider a job will use), each with what to do. Exits 1 if a check fails.
    Doctor(doctor::Args),
    /// Serve, stop serving or list companion devices (HBM of a PCI device that another driver
    /// owns, habanalabs, exported beside it), or announce their owners' resets. For
    /// administrators (root); the module must be loaded with companion=1.
    Companion(companion::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Before any thread exists: soft-RoCE needs a smaller ofi_rxm universe than libfabric's.
    peerdirect::registrar::libfabric::default_universe_size();
    let result = match cli.command {
        Command::Devices(args) => devices::run(&args),
        Command::Alloc(args) => alloc::run(&args),
        Command::Export(args) => export::run(&args),
        Command::Stats(args) => stats::run(&args),
        Command::Register(args) => register::run(&args),
        Command::Topo(args) => topo::run(&args),
        Command::Doctor(args) => doctor::run(&args),
        Command::Companion(args) => companion::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if stdout_closed(&err) => die_of_sigpipe(),
        Err(err) => {
            eprintln!("peerdirect: {err:#}");
            if err.is::<export::VerifyFailed>() {
                ExitCode::from(export::EXIT_MISMATCH)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Whether `err` is a write to stdout that failed because its reader went away (`peerdirect
/// ... | head`): the only writes whose errors reach here as `io::Error`s (or `serde_json`'s,
/// which carry one) are the commands' writes to stdout.
fn stdout_closed(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .map(std::io::Error::kind)
            .or_else(|| cause.downcast_ref::<serde_json::Error>()?.io_error_kind())
            == Some(std::io::ErrorKind::BrokenPipe)
    })
}

/// Ends the process as coreutils end when their reader goes away: killed by SIGPIPE, which a
/// shell reports as status 141, without a message. Rust's runtime ignores SIGPIPE (so writes
/// fail with EPIPE instead, and libfabric's sockets cannot kill the process); its default
/// action comes back only here, at the end.
fn die_of_sigpipe() -> ExitCode {
    // SAFETY: SIG_DFL installs no handler, so no code of ours runs on a signal; the
    // disposition is the process's, which ends with the raise below.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // SAFETY: raise only sends a signal to this thread; its default action ends the process.
    unsafe { libc::raise(libc::SIGPIPE) };
    // Not reached, SIGPIPE being unblocked and its action the default; the shell's number else.
    ExitCode::from(128 + libc::SIGPIPE as u8)
}

#[cfg(test)]
mod tests {
    use clap::error::ErrorKind;
    use clap::CommandFactory;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("peerdirect").chain(args.iter().copied()))
    }

    #[test]
    fn command_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn devices() {
        let Command::Devices(args) = parse(&["devices"]).unwrap().command else {
            panic!("not devices");
        };
        assert!(!args.json);
    }

    #[test]
    fn devices_json() {
        let Command::Devices(args) = parse(&["devices", "--json"]).unwrap().command else {
            panic!("not devices");
        };
        assert!(args.json);
    }

    fn alloc(args: &[&str]) -> Result<alloc::Args, clap::Error> {
        match parse(&[&["alloc"], args].concat())?.command {
            Command::Alloc(args) => Ok(args),
            other => panic!("{other:?}"),
        }
    }

    fn export(args: &[&str]) -> Result<export::Args, clap::Error> {
        match parse(&[&["export"], args].concat())?.command {
            Command::Export(args) => Ok(args),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn alloc_takes_sizes_with_units() {
        let args = alloc(&["--size", "4M"]).unwrap();
        assert_eq!(args.size, 4 << 20);
        assert_eq!(args.align, None);
        assert_eq!(args.device, 0);
        assert!(!args.json);
        let args = alloc(&["--size", "5000", "--align", "4K", "--device", "1", "--json"]).unwrap();
        assert_eq!(args.size, 5000);
        assert_eq!(args.align, Some(4096));
        assert_eq!(args.device, 1);
        assert!(args.json);
        let args = alloc(&["--size=0x200000", "--align=2MiB"]).unwrap();
        assert_eq!((args.size, args.align), (2 << 20, Some(2 << 20)));
    }

    #[test]
    fn alloc_needs_a_size() {
        let err = alloc(&[]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::MissingRequiredArgument);
        for bad in ["4X", "-1", "", "1.5G"] {
            let err = alloc(&[&format!("--size={bad}")]).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::ValueValidation, "{bad:?}");
        }
        let err = alloc(&["--size", "4K", "--align", "big"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
    }

    /// A negative size reaches the size parser (not clap's flag parsing, which took `-1` for
    /// an unknown flag), and the usage error says that sizes cannot be negative.
    #[test]
    fn negative_sizes_are_usage_errors_that_say_so() {
        for args in [
            &["alloc", "--size", "-1"][..],
            &["alloc", "--size", "4M", "--align", "-4K"],
            &["export", "--size", "-1"],
            &["export", "--size", "4M", "--offset", "-4K"],
            &["export", "--size", "4M", "--length", "-0x1000"],
            &["export", "--size", "4M", "--pattern", "-7"],
            &["register", "--provider", "tcp", "--size", "-8M"],
            &["companion", "export", "--bar-offset", "-4K", "--size", "4K"],
            &["companion", "export", "--bar-offset", "0", "--size", "-4K"],
        ] {
            let err = parse(args).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::ValueValidation, "{args:?}: {err}");
            assert!(
                err.to_string().contains("cannot be negative"),
                "{args:?}: {err}"
            );
        }
        // What follows an option is its value, whatever it starts with: a flag there is not a size.
        let err = alloc(&["--size", "--json"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation, "{err}");
        assert!(err.to_string().contains("not a size"), "{err}");
    }

    /// The options that take a device, seconds or a BAR take a negative value too (clap took
    /// `--hold -1` for an unknown flag `-1`), and the usage error says what to give instead.
    #[test]
    fn negative_devices_seconds_and_bars_are_usage_errors_that_say_what_to_give() {
        let device = "a device is N of /dev/peerdirectN";
        let seconds = "give whole seconds";
        for (args, what) in [
            (&["alloc", "--size", "4M", "--device", "-1"][..], device),
            (&["export", "--size", "4M", "--device", "-1"], device),
            (&["export", "--size", "4M", "--hold", "-1"], seconds),
            (&["register", "--provider", "tcp", "--device", "-2"], device),
            (&["topo", "--device", "-1"], device),
            (
                &[
                    "companion",
                    "export",
                    "--device",
                    "-1",
                    "--bar-offset",
                    "0",
                    "--size",
                    "4K",
                ],
                device,
            ),
            (
                &[
                    "companion",
                    "export",
                    "--bar-offset",
                    "0",
                    "--size",
                    "4K",
                    "--hold",
                    "-30",
                ],
                seconds,
            ),
        ] {
            let err = parse(args).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::ValueValidation, "{args:?}: {err}");
            let err = err.to_string();
            assert!(err.contains("cannot be negative"), "{args:?}: {err}");
            assert!(err.contains(what), "{args:?}: {err}");
        }
        let err = parse(&["companion", "add", "0000:03:00.0", "--bar", "-1"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation, "{err}");
        assert!(err.to_string().contains("-1 is not in 0..=5"), "{err}");
        // Other values that are not numbers say what to give too.
        for (args, what) in [
            (&["alloc", "--size", "4M", "--device", "x"][..], device),
            (&["alloc", "--size", "4M", "--device", "4294967296"], device),
            (&["export", "--size", "4M", "--hold", "1.5"], seconds),
        ] {
            let err = parse(args).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::ValueValidation, "{args:?}: {err}");
            assert!(err.to_string().contains(what), "{args:?}: {err}");
        }
        assert_eq!(
            alloc(&["--size", "4M", "--device", "0x1"]).unwrap().device,
            1
        );
        assert_eq!(
            topo(&["--device", "4294967295"]).unwrap().device,
            Some(u32::MAX)
        );
    }

    #[test]
    fn export_defaults() {
        let args = export(&["--size", "4M"]).unwrap();
        assert_eq!(args.size, 4 << 20);
        assert_eq!(args.align, None);
        assert_eq!(args.offset, 0);
        assert_eq!(args.length, 0);
        assert_eq!(args.pattern, None);
        assert_eq!(args.verify, None);
        assert_eq!(args.hold, 0);
        assert_eq!(args.device, 0);
        assert!(!args.json);
    }

    #[test]
    fn export_every_option() {
        let args = export(&[
            "--size",
            "8M",
            "--align",
            "4K",
            "--offset",
            "1M",
            "--length",
            "2M",
            "--pattern",
            "0x2a",
            "--verify",
            "42",
            "--hold",
            "10",
            "--device",
            "2",
            "--json",
        ])
        .unwrap();
        assert_eq!(args.size, 8 << 20);
        assert_eq!(args.align, Some(4096));
        assert_eq!(args.offset, 1 << 20);
        assert_eq!(args.length, 2 << 20);
        assert_eq!(args.pattern, Some(42));
        assert_eq!(args.verify, Some(42));
        assert_eq!(args.hold, 10);
        assert_eq!(args.device, 2);
        assert!(args.json);
    }

    #[test]
    fn export_refuses_bad_values() {
        for bad in [
            &["--size", "4M", "--pattern", "4K"][..],
            &["--size", "4M", "--verify", "seed"],
            &["--size", "4M", "--hold", "1.5"],
            &["--size", "4M", "--hold=-1"],
            &["--size", "4M", "--offset", "1Q"],
            &["--size", "4M", "--device=-1"],
        ] {
            let err = export(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::ValueValidation, "{bad:?}");
        }
        assert_eq!(
            export(&[]).unwrap_err().kind(),
            ErrorKind::MissingRequiredArgument
        );
    }

    #[test]
    fn stats_json() {
        let Command::Stats(args) = parse(&["stats", "--json"]).unwrap().command else {
            panic!("not stats");
        };
        assert!(args.json);
        let Command::Stats(args) = parse(&["stats"]).unwrap().command else {
            panic!("not stats");
        };
        assert!(!args.json);
    }

    #[test]
    fn unknown_flag_is_rejected() {
        let err = parse(&["devices", "--yaml"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UnknownArgument);
        let err = parse(&["--json"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UnknownArgument);
    }

    #[test]
    fn unknown_subcommand_is_rejected() {
        let err = parse(&["device"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidSubcommand);
    }

    #[test]
    fn a_subcommand_is_required() {
        let err = parse(&[]).unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        );
    }

    #[test]
    fn help_and_version() {
        assert_eq!(
            parse(&["--help"]).unwrap_err().kind(),
            ErrorKind::DisplayHelp
        );
        for subcommand in ["devices", "alloc", "export", "stats"] {
            assert_eq!(
                parse(&[subcommand, "--help"]).unwrap_err().kind(),
                ErrorKind::DisplayHelp,
                "{subcommand}"
            );
        }
        assert_eq!(
            parse(&["--version"]).unwrap_err().kind(),
            ErrorKind::DisplayVersion
        );
    }

    fn topo(args: &[&str]) -> Result<topo::Args, clap::Error> {
        match parse(&[&["topo"], args].concat())?.command {
            Command::Topo(args) => Ok(args),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn topo_options() {
        let args = topo(&[]).unwrap();
        assert_eq!((args.device, args.all, args.json), (None, false, false));
        assert!(args.peers.is_empty());
        let args = topo(&[
            "--device",
            "1",
            "--peer",
            "0000:03:00.0",
            "--peer",
            "04:00.1",
            "--json",
        ])
        .unwrap();
        assert_eq!(args.device, Some(1));
        let peers: Vec<String> = args.peers.iter().map(ToString::to_string).collect();
        assert_eq!(peers, ["0000:03:00.0", "0000:04:00.1"]);
        assert!(args.json);
        assert!(topo(&["--all"]).unwrap().all);
    }

    #[test]
    fn topo_refuses_bad_addresses_and_all_with_peers() {
        let err = topo(&["--peer", "0000:03:20.0"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
        assert!(err.to_string().contains("is not a PCI address"), "{err}");
        let err = topo(&["--all", "--peer", "0000:03:00.0"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ArgumentConflict);
    }

    #[test]
    fn doctor_takes_json() {
        let Command::Doctor(args) = parse(&["doctor", "--json"]).unwrap().command else {
            panic!("not doctor");
        };
        assert!(args.json);
        assert!(!parse(&["doctor"])
            .map(|c| matches!(c.command, Command::Doctor(ref a) if a.json))
            .unwrap());
    }

    #[test]
    fn doctor_takes_a_provider() {
        let Command::Doctor(args) = parse(&["doctor"]).unwrap().command else {
            panic!("not doctor");
        };
        assert_eq!(args.provider, None);
        let Command::Doctor(args) = parse(&["doctor", "--provider", "verbs;ofi_rxm"])
            .unwrap()
            .command
        else {
            panic!("not doctor");
        };
        assert_eq!(args.provider.as_deref(), Some("verbs;ofi_rxm"));
    }
}
