//! The report (Markdown for `bench-results/results.md`, echoed to stdout) and latency statistics.

use std::fmt::Write as _;
use std::time::Duration;

pub(crate) struct Report {
    md: String,
}

impl Report {
    pub(crate) fn new() -> Self {
        Report { md: String::new() }
    }
    /// The report as written so far, in Markdown.
    pub(crate) fn markdown(&self) -> &str {
        &self.md
    }
    pub(crate) fn section(&mut self, title: &str, intro: &str) {
        println!("\n## {title}\n{intro}");
        let _ = write!(self.md, "\n## {title}\n\n{intro}\n\n");
    }
    pub(crate) fn table(&mut self, header: &[&str], rows: &[Vec<String>]) {
        let mut t = format!(
            "| {} |\n|{}|\n",
            header.join(" | "),
            header.iter().map(|_| "---").collect::<Vec<_>>().join("|")
        );
        for r in rows {
            let _ = writeln!(t, "| {} |", r.join(" | "));
        }
        println!("{t}");
        self.md.push_str(&t);
        self.md.push('\n');
    }
    pub(crate) fn line(&mut self, s: &str) {
        println!("{s}");
        let _ = writeln!(self.md, "{s}\n");
    }
}

#[derive(Clone, Copy)]
pub(crate) struct Stats {
    pub(crate) median: Duration,
    pub(crate) p99: Duration,
}

pub(crate) fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort();
    let at = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    Stats {
        median: at(0.5),
        p99: at(0.99),
    }
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}
