//! Keeps `docs::tracing` true: the spans and event messages in the code, read from the source.

use std::collections::BTreeSet;
use std::path::Path;

/// Every `.rs` file under `dir`, without its unit-test module (`#[cfg(test)] mod tests`).
fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            let code = match text.find("#[cfg(test)]\nmod tests") {
                Some(i) => text[..i].to_owned(),
                None => text,
            };
            out.push((path.display().to_string(), code));
        }
    }
}

/// The span names: the method after each `#[instrument`, and the name of each `…_span!`.
fn spans(code: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (i, _) in code.match_indices("#[instrument") {
        let after = &code[i..];
        let fn_at = after.find("fn ").expect("an instrumented fn") + 3;
        let name: String = after[fn_at..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        names.push(name);
    }
    for (i, _) in code.match_indices("_span!(") {
        if let Some(literal) = first_literal(&code[i..]) {
            names.push(literal);
        }
    }
    names
}

/// The first string literal of `text`, its line continuations and escaped quotes undone.
fn first_literal(text: &str) -> Option<String> {
    let start = text.find('"')? + 1;
    let mut out = String::new();
    let mut chars = text[start..].chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => match chars.next()? {
                '\n' => {
                    while chars.peek().is_some_and(|c| c.is_whitespace()) {
                        chars.next();
                    }
                }
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    None
}

/// The message of every event (`error!` … `trace!`): its first string literal.
fn event_messages(code: &str) -> Vec<String> {
    let mut messages = Vec::new();
    for level in ["error!(", "warn!(", "info!(", "debug!(", "trace!("] {
        for (i, _) in code.match_indices(level) {
            let before = code[..i].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue; // another macro's name ending in the level's
            }
            let call = &code[i..];
            let end = call.find(");").unwrap_or(call.len());
            if let Some(m) = first_literal(&call[..end]) {
                messages.push(m);
            }
        }
    }
    messages
}

/// The names in the first column of the page's "## Spans" table.
fn page_spans(page: &str) -> BTreeSet<String> {
    let section = &page[page.find("## Spans").unwrap()..page.find("## Events").unwrap()];
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .map(|l| l[..l.find('`').unwrap()].to_owned())
        .collect()
}

#[test]
fn the_tracing_page_lists_every_span_and_event_of_the_code_and_no_other_span() {
    let page = include_str!("tracing.md");
    let mut files = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    let mut in_code = BTreeSet::new();
    let mut missing_events = Vec::new();
    for (path, code) in &files {
        if path.contains("/docs/") {
            continue; // this file's own examples
        }
        in_code.extend(spans(code));
        for m in event_messages(code) {
            if !page.contains(&m.replace('|', "\\|")) {
                missing_events.push(format!("{path}: {m:?}"));
            }
        }
    }
    assert!(
        in_code.len() >= 13,
        "the reader found too few spans: {in_code:?}"
    );
    assert_eq!(
        in_code,
        page_spans(page),
        "docs/tracing.md's span table and the code's spans differ"
    );
    assert!(
        missing_events.is_empty(),
        "events not on docs/tracing.md:\n{}",
        missing_events.join("\n")
    );
}
