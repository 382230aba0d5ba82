//! Plain-text tables: columns padded to their widest cell, two spaces apart.

use std::io::Write;

use anyhow::{Context, Result};

/// Writes `header` and `rows`, each row as long as `header`.
pub fn write(out: &mut impl Write, header: &[&str], rows: &[Vec<String>]) -> Result<()> {
    let header: Vec<String> = header.iter().map(|cell| (*cell).to_owned()).collect();
    let mut widths = vec![0; header.len()];
    for row in std::iter::once(&header).chain(rows) {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    for row in std::iter::once(&header).chain(rows) {
        let line: Vec<_> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:width$}"))
            .collect();
        writeln!(out, "{}", line.join("  ").trim_end()).context("writing to stdout")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let mut out = Vec::new();
        let rows = [
            vec!["a".to_owned(), "1".to_owned(), String::new()],
            vec!["abcd".to_owned(), "22".to_owned(), "x".to_owned()],
        ];
        write(&mut out, &["NAME", "N", "LAST"], &rows).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "NAME  N   LAST\na     1\nabcd  22  x\n"
        );
    }
}
