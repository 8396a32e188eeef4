//! examples/service's fatal errors on the real node: a keyspace that is not there prints
//! `error: ` and the library's message on stderr (not the error's Debug form, `Error:
//! KeyspaceMissing {`) and exits 1, a storage failure in the module docs' table. The options
//! errors (exit 2) need no node: tests/service_deploy.rs. Uses the node
//! `CASSANDRA_CONTACT_POINTS` names first (default 127.0.0.1:9042).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn a_missing_keyspace_prints_error_and_its_message_and_exits_1() {
    let status = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "--example", "service"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("cargo runs");
    assert!(status.success(), "cargo build --example service: {status}");
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(|d| d.parent())
        .unwrap()
        .join("examples")
        .join("service");
    let contact = std::env::var("CASSANDRA_CONTACT_POINTS")
        .ok()
        .and_then(|c| c.split(',').next().map(|c| c.trim().to_owned()))
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "127.0.0.1:9042".into());
    let tmp = std::env::temp_dir().join(uuid::Uuid::new_v4().to_string());
    let (file, err) = (tmp.with_extension("toml"), tmp.with_extension("err"));
    let text = format!(
        "storage = \"cassandra\"\n[cassandra]\ncontact_points = [\"{contact}\"]\nkeyspace = \"cm_absent\"\n"
    );
    std::fs::write(&file, text).unwrap();
    let mut child = Command::new(bin)
        .args([
            "--listen",
            "127.0.0.105:0",
            "--config",
            file.to_str().unwrap(),
        ])
        .env_remove("SERVICE_CASSANDRA__CONTACT_POINTS")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("the example starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("still running after 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = std::fs::read_to_string(&err).unwrap();
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: "), "{stderr}");
    assert!(
        last.contains("cm_absent") && !stderr.contains("Error: "),
        "{stderr}"
    );
    assert_eq!(status.code(), Some(1), "{stderr}");
}
