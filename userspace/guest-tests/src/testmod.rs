//! The test modules' debugfs command channel (tests/kmod: peerdirect_importer,
//! peerdirect_ibimport, peerdirect_peermem_core, peerdirect_pte): this process writes one command line to the
//! module's `run` file and reads the module's answer, `key=value` lines, back as a [`Report`].
//! [`Report`] also reads peerdirect's own debugfs stats (`key: value` lines).

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;

use crate::support::{expect_eq, insmod, Outcome};
use crate::INDEX;

/// The dma-buf importer module (tests/kmod/peerdirect_importer.c).
pub(crate) const IMPORTER: &str = "peerdirect_importer";
const IMPORTER_PATH: &str = "/lib/peerdirect/tests/peerdirect_importer.ko";
const IMPORTER_RUN_FILE: &str = "/sys/kernel/debug/peerdirect_importer/run";

/// The page-table reader (tests/kmod/peerdirect_pte.c).
const PTE: &str = "peerdirect_pte";
const PTE_PATH: &str = "/lib/peerdirect/tests/peerdirect_pte.ko";
const PTE_RUN_FILE: &str = "/sys/kernel/debug/peerdirect_pte/run";

/// A test module's debugfs command file, open for commands.
pub(crate) struct TestModule {
    /// The module's name, for messages.
    name: &'static str,
    file: File,
}

impl TestModule {
    /// Loads the module from `path` unless `run_file` exists already, and opens that file.
    pub(crate) fn load(name: &'static str, path: &str, run_file: &str) -> Result<Self, String> {
        if !Path::new(run_file).exists() {
            insmod(path)?;
        }
        Self::open(name, run_file)
    }

    /// Loads the importer module unless it is loaded already, and opens its command file.
    pub(crate) fn load_importer() -> Result<Self, String> {
        Self::load(IMPORTER, IMPORTER_PATH, IMPORTER_RUN_FILE)
    }

    /// Loads the page-table reader unless it is loaded already, and opens its command file.
    pub(crate) fn load_pte() -> Result<Self, String> {
        Self::load(PTE, PTE_PATH, PTE_RUN_FILE)
    }

    /// Opens the command file of a module already loaded.
    pub(crate) fn open(name: &'static str, run_file: &str) -> Result<Self, String> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(run_file)
            .map_err(|err| format!("cannot open {run_file}: {err}"))?;
        Ok(Self { name, file })
    }

    /// Sends one command line (in one write) and reads its result back. A refused write (a
    /// malformed command, no such fd, device or id) is an `Err` carrying the module's
    /// `error=` line.
    pub(crate) fn command(&mut self, line: &str) -> Result<Report, String> {
        let written = self.file.write(line.as_bytes());
        let mut text = String::new();
        self.file
            .read_to_string(&mut text)
            .map_err(|err| format!("reading the result of '{line}' failed: {err}"))?;
        match written {
            Ok(n) if n == line.len() => Ok(Report::parse(self.name, &text, '=')),
            Ok(n) => Err(format!("'{line}': short write ({n} bytes)")),
            Err(err) => Err(format!("'{line}' was refused: {err}; {}", text.trim())),
        }
    }
}

/// `key<separator>value` lines: a test module's answer (`=`), debugfs stats (`:`).
#[derive(Debug)]
pub(crate) struct Report {
    /// Who reported, for messages.
    source: &'static str,
    separator: char,
    values: BTreeMap<String, String>,
}

impl Report {
    /// Reads the lines of `text` that hold `separator`; keys and values are trimmed.
    pub(crate) fn parse(source: &'static str, text: &str, separator: char) -> Self {
        Self {
            source,
            separator,
            values: text
                .lines()
                .filter_map(|line| line.split_once(separator))
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .collect(),
        }
    }

    /// The value of `key`, if reported.
    pub(crate) fn value(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }

    pub(crate) fn get(&self, key: &str) -> Result<&str, String> {
        self.value(key).ok_or_else(|| {
            format!(
                "{} reported no {key}{} ({})",
                self.source,
                self.separator,
                self.summary()
            )
        })
    }

    /// A signed number, decimal or `0x` hex (an errno-style result reads `attach=-95`).
    pub(crate) fn int(&self, key: &str) -> Result<i64, String> {
        let value = self.get(key)?;
        match value.strip_prefix("0x") {
            Some(hex) => i64::from_str_radix(hex, 16),
            None => value.parse(),
        }
        .map_err(|_| format!("{key}={value} is not a number"))
    }

    /// An unsigned number, decimal or `0x` hex.
    pub(crate) fn uint(&self, key: &str) -> Result<u64, String> {
        let value = self.get(key)?;
        match value.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => value.parse(),
        }
        .map_err(|_| format!("{key}={value} is not a number"))
    }

    /// Checks the numbers of `keys` (the whole report on a mismatch).
    pub(crate) fn expect(&self, keys: &[(&str, i64)]) -> Outcome {
        for &(key, expected) in keys {
            expect_eq(key, expected, self.int(key)?)
                .map_err(|err| format!("{err}\n{}", self.summary()))?;
        }
        Ok(())
    }

    /// Every line on one line, for diagnostics.
    pub(crate) fn summary(&self) -> String {
        self.values
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// peerdirect0's debugfs stats, all of its keys (the library's `Stats` knows only some).
pub(crate) fn stats() -> Result<Report, String> {
    let path = peerdirect::stats_path(INDEX);
    let text = fs::read_to_string(&path)
        .map_err(|err| format!("expected to read {}, got {err}", path.display()))?;
    Ok(Report::parse("peerdirect's debugfs stats", &text, ':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_parse_both_separators() {
        let report = Report::parse(
            "the importer",
            "id=3\nmap=-19\ndma_first=0xd0200000\nnoise\n",
            '=',
        );
        assert_eq!(report.int("map"), Ok(-19));
        assert_eq!(report.int("dma_first"), Ok(0xd020_0000));
        assert_eq!(report.uint("dma_first"), Ok(0xd020_0000));
        assert_eq!(report.uint("id"), Ok(3));
        assert!(report.uint("map").unwrap_err().contains("map=-19"));
        let missing = report.get("pinned").unwrap_err();
        assert!(
            missing.starts_with("the importer reported no pinned= (dma_first=0xd0200000 id=3"),
            "{missing}"
        );
        let stats = Report::parse(
            "stats",
            "hbm_bytes: 268435456\nmappings_revocable: 2\nmappings_pinned: 1\npresent: true\n",
            ':',
        );
        assert_eq!(stats.get("mappings_pinned"), Ok("1"));
        assert_eq!(stats.get("present"), Ok("true"));
    }

    #[test]
    fn expect_names_the_mismatch_and_the_report() {
        let report = Report::parse("the core", "get=0\nmapped=1\n", '=');
        assert_eq!(report.expect(&[("get", 0), ("mapped", 1)]), Ok(()));
        let err = report.expect(&[("get", 0), ("mapped", 0)]).unwrap_err();
        assert_eq!(err, "mapped: expected 0, got 1\nget=0 mapped=1");
    }
}
