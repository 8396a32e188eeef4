//! The README is a front page: short, its Rust blocks shown exactly as they compile (they are doc
//! tests, see `ReadmeDoctests` in src/lib.rs), and its links into the guide name pages that exist.

use std::collections::BTreeSet;

const README: &str = include_str!("../README.md");
const GUIDE: &str = include_str!("../src/docs/mod.rs");
const GUIDE_URL: &str = "https://docs.rs/cassandra-membership/latest/cassandra_membership/docs/";

#[test]
fn the_readme_is_at_most_200_lines() {
    let lines = README.lines().count();
    assert!(lines <= 200, "README.md has {lines} lines");
}

#[test]
fn the_readme_rust_blocks_hide_no_lines() {
    // rustdoc hides `# ` lines of a doc test; GitHub shows them as they are.
    let mut in_rust = false;
    for (n, line) in README.lines().enumerate() {
        if let Some(fence) = line.strip_prefix("```") {
            in_rust = !in_rust && fence.starts_with("rust");
            continue;
        }
        assert!(
            !(in_rust && (line == "#" || line.starts_with("# "))),
            "README.md line {}: a hidden doc-test line: {line}",
            n + 1
        );
    }
}

#[test]
fn the_readme_links_only_to_guide_pages_that_exist() {
    let pages: BTreeSet<&str> = GUIDE
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(" {}"))
        .collect();
    assert!(pages.contains("fencing"), "the guide's pages: {pages:?}");
    let linked: BTreeSet<&str> = README
        .split(GUIDE_URL)
        .skip(1)
        .map(|rest| rest.split(['/', ')', '#']).next().unwrap_or_default())
        .collect();
    assert!(!linked.is_empty(), "the README links into the guide");
    for page in &linked {
        assert!(
            pages.contains(page),
            "README links to docs::{page}, which does not exist"
        );
    }
}

#[test]
fn the_readme_names_the_paths_the_example_service_serves() {
    let constants = include_str!("../examples/service/constants.rs");
    let main = include_str!("../examples/service/main.rs");
    for (name, path) in [
        ("READYZ", "/readyz"),
        ("LIVEZ", "/livez"),
        ("WORK", "/work"),
        ("MEMBERS", "/members"),
    ] {
        assert!(
            README.contains(&format!("`GET {path}`")),
            "README names {path}"
        );
        assert!(
            constants.contains(&format!("const {name}: &str = \"{path}\";")),
            "examples/service/constants.rs names {path} {name}"
        );
        assert!(
            main.contains(&format!(".route({name}, ")),
            "examples/service serves {name}"
        );
    }
}
