//! The main README's rio setup block is this crate's README block (which is a doc test here).

fn rust_block(text: &str, fence: &str) -> String {
    let start = text.find(fence).expect("the block") + fence.len();
    let end = start + text[start..].find("```").expect("its end");
    text[start..end].to_owned()
}

#[test]
fn the_main_readme_shows_the_setup_code_that_compiles_here() {
    let main = include_str!("../../../README.md");
    let main = &main[main.find("## Using it from rio-rs").expect("the section")..];
    let ours = include_str!("../README.md");
    assert_eq!(
        rust_block(main, "```rust,ignore"),
        rust_block(ours, "```rust,no_run")
    );
}
