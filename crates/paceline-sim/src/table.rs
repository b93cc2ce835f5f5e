//! Plain-text tables for the terminal: a header row, aligned columns, the
//! first column left-aligned and the rest right-aligned (they hold numbers).
//! Private to the crate: the scenarios' `table` functions are what the
//! command line prints.

/// Renders `rows` under `header`.
pub(crate) fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let cols = header.len();
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(cols) {
            width[i] = width[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let head: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    push_row(&mut out, &head, &width);
    let rule: Vec<String> = width.iter().map(|&w| "-".repeat(w)).collect();
    push_row(&mut out, &rule, &width);
    for row in rows {
        push_row(&mut out, row, &width);
    }
    out
}

fn push_row(out: &mut String, row: &[String], width: &[usize]) {
    let mut line = String::new();
    for (i, w) in width.iter().enumerate() {
        let cell = row.get(i).map(String::as_str).unwrap_or("");
        let pad = w.saturating_sub(cell.chars().count());
        if i > 0 {
            line.push_str("  ");
            line.push_str(&" ".repeat(pad));
            line.push_str(cell);
        } else {
            line.push_str(cell);
            line.push_str(&" ".repeat(pad));
        }
    }
    out.push_str(line.trim_end());
    out.push('\n');
}

/// A count with thousands separators.
pub(crate) fn count(n: u64) -> String {
    paceline_wire::problem::thousands(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_align_right() {
        let t = render(
            &["measure", "cooperative", "naive"],
            &[vec!["requests sent".into(), "50".into(), "412".into()]],
        );
        assert!(t.lines().nth(2).unwrap().ends_with("412"));
    }

    #[test]
    fn columns_align() {
        let t = render(&["a", "bb"], &[vec!["long name".into(), "1".into()]]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "a          bb");
        assert_eq!(lines[1], "---------  --");
        assert_eq!(lines[2], "long name   1");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(count(12), "12");
    }
}
