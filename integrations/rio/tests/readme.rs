//! The repository's front page points rio users to this crate and its example, as they are.

use std::path::Path;

/// The front page's "Using it from rio-rs" section, up to the next section.
fn rio_section() -> &'static str {
    let main = include_str!("../../../README.md");
    let from = main
        .find("\n## Using it from rio-rs\n")
        .expect("the section");
    let section = &main[from + 1..];
    let end = section[3..].find("\n## ").map_or(section.len(), |i| i + 3);
    &section[..end]
}

#[test]
fn the_main_readme_names_this_crate_and_the_example_this_readme_runs() {
    let section = rio_section();
    let ours = include_str!("../README.md");
    let name = env!("CARGO_PKG_NAME");
    assert!(
        section.contains(&format!("cargo add {name}")),
        "the front page's install line names {name}:\n{section}"
    );
    let example = format!("cargo run -p {name} --example rio_cluster");
    assert!(section.contains(&example), "{example}:\n{section}");
    assert!(ours.contains(&example), "this README runs {example}");
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/rio_cluster.rs");
    assert!(file.is_file(), "{} exists", file.display());
    // Its links: the crate's directory and this README.
    for link in ["(integrations/rio/)", "(integrations/rio/README.md)"] {
        assert!(section.contains(link), "links {link}:\n{section}");
    }
}
