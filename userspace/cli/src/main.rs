//! `peerdirect`: the command-line view of the HBM devices the peerdirect module exports.

mod devices;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Inspect the accelerator HBM that peerdirect exports for peer-to-peer RDMA.
#[derive(Debug, Parser)]
#[command(name = "peerdirect", version, arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the HBM devices (/dev/peerdirectN) with their PCI address, BAR and size.
    Devices(devices::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Devices(args) => devices::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("peerdirect: {err:#}");
            ExitCode::FAILURE
        }
    }
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
        let Command::Devices(args) = parse(&["devices"]).unwrap().command;
        assert!(!args.json);
    }

    #[test]
    fn devices_json() {
        let Command::Devices(args) = parse(&["devices", "--json"]).unwrap().command;
        assert!(args.json);
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
        assert_eq!(
            parse(&["devices", "--help"]).unwrap_err().kind(),
            ErrorKind::DisplayHelp
        );
        assert_eq!(
            parse(&["--version"]).unwrap_err().kind(),
            ErrorKind::DisplayVersion
        );
    }
}
