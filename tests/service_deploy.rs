//! examples/service as deployed: deploy/kubernetes.yaml agrees with the service's constants
//! (ports, probe paths, the termination grace against the leave's bound and the drain, the pod
//! IP and the options file wired in), deploy/service.toml is what its ConfigMap holds and parses
//! into the library's options with the service's own loader, environment variables override the
//! file, and the silo's endpoint is never an unspecified address; the service as a process (on
//! the in-memory table) reads its flags as flags: `--flag=value`, an unknown flag and an
//! advertised port 0. No Cassandra needed.

// figment::Jail's closures return figment's own (large) error type: its API, not ours.
#![allow(clippy::result_large_err)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cassandra_membership::MembershipOptions;
use yaml_rust2::{Yaml, YamlLoader};

#[allow(dead_code)]
#[path = "../examples/service/config.rs"]
mod config;
#[allow(dead_code)]
#[path = "../examples/service/constants.rs"]
mod constants;

use config::{Settings, Storage};
use constants::*;

fn repo(path: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(path)
        .display()
        .to_string()
}

fn manifest() -> Vec<Yaml> {
    let text = std::fs::read_to_string(repo("deploy/kubernetes.yaml")).unwrap();
    YamlLoader::load_from_str(&text).unwrap()
}

fn of_kind<'a>(docs: &'a [Yaml], kind: &str) -> &'a Yaml {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind))
        .unwrap_or_else(|| panic!("no {kind} in deploy/kubernetes.yaml"))
}

fn container(docs: &[Yaml]) -> &Yaml {
    let containers = &of_kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"];
    assert_eq!(containers.as_vec().map(Vec::len), Some(1), "one container");
    &containers[0]
}

fn env_var<'a>(container: &'a Yaml, name: &str) -> &'a Yaml {
    container["env"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|e| e["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {name} in the container's env"))
}

/// The settings from `args` alone: in a figment `Jail` (a lock, and the `SERVICE_*` variables
/// other tests set are gone), so no test's environment leaks into another's.
fn load(args: &[&str]) -> Result<Settings, config::Refused> {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let mut loaded = None;
    figment::Jail::expect_with(|jail| {
        jail.clear_env();
        loaded = Some(Settings::load_with(&args, |_| None));
        Ok(())
    });
    loaded.unwrap()
}

#[test]
fn the_manifest_s_probes_and_ports_are_the_service_s_constants() {
    let docs = manifest();
    let c = container(&docs);
    assert_eq!(c["ports"][0]["containerPort"].as_i64(), Some(PORT.into()));
    for (probe, path) in [
        ("startupProbe", LIVEZ),
        ("readinessProbe", READYZ),
        ("livenessProbe", LIVEZ),
    ] {
        assert_eq!(c[probe]["httpGet"]["path"].as_str(), Some(path), "{probe}");
        assert_eq!(
            c[probe]["httpGet"]["port"].as_i64(),
            Some(PORT.into()),
            "{probe}"
        );
    }
    let service = of_kind(&docs, "Service");
    assert_eq!(
        service["spec"]["ports"][0]["targetPort"].as_i64(),
        Some(PORT.into())
    );
    assert_eq!(
        service["spec"]["selector"]["app"],
        of_kind(&docs, "Deployment")["spec"]["template"]["metadata"]["labels"]["app"]
    );
}

/// The pod is SIGKILLed at the end of its grace: the grace must exceed the longest shutdown —
/// an interrupted join, then the leave's bound and the read after it with the drain alongside
/// — and the options in
/// the ConfigMap must not set a longer leave.
#[test]
fn the_termination_grace_exceeds_the_leave_s_bound_plus_the_drain_and_an_interrupted_join() {
    let docs = manifest();
    let grace =
        of_kind(&docs, "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            .as_i64()
            .unwrap();
    assert_eq!(Duration::from_secs(grace as u64), TERMINATION_GRACE);
    // The leave's calls end by its `leave_timeout` whatever their own timeouts; the read after
    // it has a bound of its own.
    assert!(JOIN_GRACE + MAX_LEAVE_TIMEOUT + AFTER_LEAVE_READ + DRAIN < TERMINATION_GRACE);
    assert!(MembershipOptions::default().leave_timeout <= MAX_LEAVE_TIMEOUT);
    let settings = load(&["--config", &repo("deploy/service.toml")]).unwrap();
    assert!(settings.cassandra.membership.leave_timeout <= MAX_LEAVE_TIMEOUT);
}

#[test]
fn the_pod_ip_the_options_file_and_the_password_are_wired_in() {
    let docs = manifest();
    let c = container(&docs);
    assert_eq!(
        env_var(c, POD_IP)["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        Some("status.podIP")
    );
    let config_path = env_var(c, "SERVICE_CONFIG")["value"].as_str().unwrap();
    let pod = &of_kind(&docs, "Deployment")["spec"]["template"]["spec"];
    let mount_of = |volume: &str| {
        let name = c["volumeMounts"]
            .as_vec()
            .unwrap()
            .iter()
            .find(|m| m["name"].as_str() == Some(volume))
            .unwrap_or_else(|| panic!("volume {volume} not mounted"));
        name["mountPath"].as_str().unwrap().to_owned()
    };
    let volume = |name: &str| {
        pod["volumes"]
            .as_vec()
            .unwrap()
            .iter()
            .find(|v| v["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no volume {name}"))
            .clone()
    };
    // The options file: the ConfigMap's key, mounted where SERVICE_CONFIG points.
    let config_map = of_kind(&docs, "ConfigMap");
    assert_eq!(
        volume("config")["configMap"]["name"],
        config_map["metadata"]["name"]
    );
    assert_eq!(config_path, format!("{}/service.toml", mount_of("config")));
    let file = std::fs::read_to_string(repo("deploy/service.toml")).unwrap();
    assert_eq!(
        config_map["data"]["service.toml"].as_str(),
        Some(file.as_str()),
        "the ConfigMap holds deploy/service.toml"
    );
    // The password: a Secret volume, where the options' password_file points.
    assert!(
        volume("cassandra-password")["secret"]["secretName"]
            .as_str()
            .is_some()
    );
    let settings = load(&["--config", &repo("deploy/service.toml")]).unwrap();
    let credentials = settings.cassandra.credentials.expect("credentials");
    let password_file = credentials.password_file.expect("password_file");
    assert!(
        password_file.starts_with(mount_of("cassandra-password")),
        "{}",
        password_file.display()
    );
    assert!(credentials.password.is_none(), "no password in the file");
}

/// The example file is a complete deployment's: the library's options, valid.
#[test]
fn the_example_options_file_parses_into_the_library_s_options() {
    let settings = load(&["--config", &repo("deploy/service.toml")]).unwrap();
    assert_eq!(settings.storage, Storage::Cassandra);
    assert_eq!(settings.listen, format!("0.0.0.0:{PORT}"));
    assert_eq!(settings.advertise, None);
    assert_eq!(settings.log_format, config::LogFormat::Json);
    let o = &settings.cassandra;
    assert_eq!(o.contact_points.len(), 3);
    assert_eq!(
        (o.service_id.as_str(), o.cluster_id.as_str()),
        ("shop", "blue")
    );
    assert!(o.ttl);
    assert_eq!(o.membership.leave_timeout, Duration::from_secs(60));
    o.validate().unwrap();
}

/// `SERVICE_*` variables override the file; flags override both.
#[test]
fn environment_variables_override_the_file_and_flags_override_both() {
    let file = repo("deploy/service.toml");
    figment::Jail::expect_with(|jail| {
        jail.clear_env();
        jail.set_env("SERVICE_CONFIG", &file);
        jail.set_env("SERVICE_ADVERTISE", "10.1.2.3");
        jail.set_env("SERVICE_CASSANDRA__KEYSPACE", "from_env");
        jail.set_env("SERVICE_CASSANDRA__MEMBERSHIP__LEAVE_TIMEOUT", "20s");
        jail.set_env(
            "SERVICE_CASSANDRA__CONTACT_POINTS",
            "[10.0.0.5:9042,10.0.0.6:9042]",
        );
        // Another name with the prefix (Kubernetes injects some) is not the service's.
        jail.set_env("SERVICE_PORT_HTTP", "80");
        let settings = Settings::load(&["--cluster".into(), "green".into()]).unwrap();
        assert_eq!(settings.advertise.as_deref(), Some("10.1.2.3"));
        assert_eq!(settings.cassandra.keyspace, "from_env");
        assert_eq!(
            settings.cassandra.membership.leave_timeout,
            Duration::from_secs(20)
        );
        assert_eq!(
            settings.cassandra.contact_points,
            ["10.0.0.5:9042", "10.0.0.6:9042"]
        );
        assert_eq!(settings.cassandra.cluster_id, "green", "the flag wins");
        assert_eq!(settings.cassandra.service_id, "shop", "the file's");
        Ok(())
    });
}

#[test]
fn a_leave_timeout_above_the_grace_s_share_is_refused_naming_the_option() {
    figment::Jail::expect_with(|jail| {
        jail.clear_env();
        jail.set_env("SERVICE_CASSANDRA__MEMBERSHIP__LEAVE_TIMEOUT", "5m");
        let refused = Settings::load(&[]).unwrap_err().to_string();
        assert!(refused.contains("leave_timeout"), "{refused}");
        Ok(())
    });
}

#[test]
fn an_unknown_option_in_the_file_is_refused_naming_it() {
    let path = std::env::temp_dir().join(format!("service-{}.toml", uuid::Uuid::new_v4()));
    std::fs::write(&path, "[cassandra]\nkeyspce = \"x\"\n").unwrap();
    let refused = load(&["--config", &path.display().to_string()]);
    let _ = std::fs::remove_file(&path);
    let refused = refused.unwrap_err().to_string();
    assert!(refused.contains("keyspce"), "{refused}");
}

/// A syntax error in the options file names the line, not its text: toml's own message quotes
/// the line, here an inline password.
#[test]
fn a_syntax_error_in_the_options_file_names_the_line_not_its_text() {
    let path = std::env::temp_dir().join(format!("service-{}.toml", uuid::Uuid::new_v4()));
    let text = "[cassandra.credentials]\nusername = \"ops\"\npassword = \"hunter2-inline\" oops\n";
    std::fs::write(&path, text).unwrap();
    let refused = load(&["--config", &path.display().to_string()]);
    let _ = std::fs::remove_file(&path);
    let refused = refused.unwrap_err().to_string();
    assert!(
        !refused.contains("hunter2"),
        "the password is quoted: {refused}"
    );
    assert!(refused.contains("line 3"), "{refused}");
}

/// A password in the environment is the string it is, digits only included (figment would read
/// `73571234` as a number, refuse it and quote it).
#[test]
fn a_numeric_password_from_the_environment_is_taken_as_a_string() {
    use secrecy::ExposeSecret;
    figment::Jail::expect_with(|jail| {
        jail.clear_env();
        jail.set_env("SERVICE_CASSANDRA__CREDENTIALS__USERNAME", "ops");
        jail.set_env("SERVICE_CASSANDRA__CREDENTIALS__PASSWORD", "73571234");
        let settings = Settings::load_with(&[], |_| None).unwrap_or_else(|r| panic!("{r}"));
        let credentials = settings.cassandra.credentials.expect("credentials");
        assert_eq!(credentials.username, "ops");
        let password = credentials.password.expect("a password");
        assert_eq!(password.expose_secret(), "73571234");
        Ok(())
    });
}

/// A listen value that is not `IP:PORT` is refused naming where it came from, not left to a
/// bind error ("invalid socket address", exit 1).
#[test]
fn a_listen_address_that_is_not_ip_port_is_refused_naming_the_flag() {
    let refused = load(&["--listen", "localhost:8080"])
        .unwrap_err()
        .to_string();
    for name in ["--listen", "SERVICE_LISTEN", "localhost:8080"] {
        assert!(refused.contains(name), "{name} not in {refused}");
    }
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// The bind address is not the silo's endpoint when it is unspecified: refused, naming the flag
/// and both variables.
#[test]
fn an_unspecified_endpoint_is_refused_naming_the_flag_and_the_variables() {
    let settings = load(&["--listen", "0.0.0.0:8080"]).unwrap();
    for listen in ["0.0.0.0:8080", "[::]:8080"] {
        let refused = settings
            .endpoint(addr(listen), None)
            .unwrap_err()
            .to_string();
        for name in ["--advertise", "SERVICE_ADVERTISE", "POD_IP"] {
            assert!(refused.contains(name), "{refused}");
        }
    }
    let advertised_unspecified = load(&["--advertise", "0.0.0.0"]).unwrap();
    assert!(
        advertised_unspecified
            .endpoint(addr("127.0.0.1:8080"), None)
            .is_err()
    );
}

#[test]
fn the_endpoint_is_the_advertised_address_else_the_pod_ip_else_the_listen_address() {
    let listen = addr("0.0.0.0:8080");
    let plain = load(&[]).unwrap();
    assert_eq!(
        plain.endpoint(listen, Some("10.0.0.7")).unwrap(),
        addr("10.0.0.7:8080")
    );
    assert_eq!(
        plain.endpoint(addr("127.0.0.5:9000"), None).unwrap(),
        addr("127.0.0.5:9000")
    );
    let ip_only = load(&["--advertise", "10.0.0.8"]).unwrap();
    assert_eq!(
        ip_only.endpoint(listen, Some("10.0.0.7")).unwrap(),
        addr("10.0.0.8:8080"),
        "the advertised address wins over POD_IP"
    );
    let with_port = load(&["--advertise", "10.0.0.9:30000"]).unwrap();
    assert_eq!(
        with_port.endpoint(listen, None).unwrap(),
        addr("10.0.0.9:30000")
    );
    let garbage = load(&["--advertise", "pod-7"]).unwrap();
    assert!(garbage.endpoint(listen, None).is_err());
}

/// `cmd` started under figment's `Jail` lock: a `Jail` test clears the process environment
/// (PATH included) while it runs, and a process spawned meanwhile would inherit none of it.
fn spawn(cmd: &mut Command) -> Child {
    let mut child = None;
    figment::Jail::expect_with(|_| {
        child = Some(cmd.spawn().expect("starts"));
        Ok(())
    });
    child.unwrap()
}

/// Builds the example and returns its binary (as tests/example_service.rs does).
fn build() -> PathBuf {
    let status = spawn(
        Command::new(env!("CARGO"))
            .args(["build", "--quiet", "--example", "service"])
            .current_dir(env!("CARGO_MANIFEST_DIR")),
    )
    .wait()
    .expect("cargo runs");
    assert!(status.success(), "cargo build --example service failed");
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|d| d.parent()).unwrap();
    profile_dir
        .join("examples")
        .join(format!("service{}", std::env::consts::EXE_SUFFIX))
}

struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The example with exactly `args`, none of the service's variables set.
fn run(args: &[&str]) -> Running {
    run_with_env(args, &[])
}

/// [`run`] with `env` set.
fn run_with_env(args: &[&str], env: &[(&str, &str)]) -> Running {
    let mut cmd = Command::new(build());
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("SERVICE_") || k == "POD_IP" || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    let mut child = spawn(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()));
    let (tx, lines) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("service: {line}");
            let _ = tx.send(line);
        }
    });
    let (etx, stderr) = mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            println!("service (stderr): {line}");
            let _ = etx.send(line);
        }
    });
    Running {
        child,
        lines,
        stderr,
    }
}

/// What the process did within 30 s: `Ok(joined line)` if it joined, `Err(exit code, stderr)`
/// if it exited first.
fn outcome(mut r: Running) -> Result<String, (Option<i32>, String)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        while let Ok(line) = r.lines.try_recv() {
            if line.starts_with("joined as ") {
                return Ok(line);
            }
        }
        if let Some(status) = r.child.try_wait().unwrap() {
            std::thread::sleep(Duration::from_millis(200));
            let err: Vec<String> = r.stderr.try_iter().collect();
            return Err((status.code(), err.join("\n")));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("neither joined nor exited within 30 s");
}

/// `--listen=0.0.0.0:0` (the `--flag=value` form) is the flag, and overrides `SERVICE_LISTEN`:
/// ignored, the service would bind the variable's address and join under it. Honoured, it is
/// refused as `--listen 0.0.0.0:0` is without an advertised address: exit 2, naming `--listen`.
#[test]
fn listen_with_an_equals_sign_is_honoured() {
    match outcome(run_with_env(
        &["--listen=0.0.0.0:0", "--cluster", "flag-eq"],
        &[("SERVICE_LISTEN", "127.0.0.104:0")],
    )) {
        Ok(joined) => panic!("--listen=0.0.0.0:0 was ignored: {joined}"),
        Err((code, stderr)) => {
            assert_eq!(code, Some(2), "exit {code:?}: {stderr}");
            assert!(stderr.contains("--listen"), "{stderr}");
        }
    }
}

/// `--advertise=10.0.0.7` is the flag too: the silo joins as 10.0.0.7 (ignored, it would join
/// under its listen address).
#[test]
fn advertise_with_an_equals_sign_is_honoured() {
    match outcome(run(&[
        "--listen",
        "127.0.0.104:0",
        "--advertise=10.0.0.7",
        "--cluster",
        "flag-adv",
    ])) {
        Ok(joined) => assert!(
            joined.starts_with("joined as 10.0.0.7:"),
            "--advertise=10.0.0.7 was ignored: {joined}"
        ),
        Err((code, stderr)) => panic!("--advertise=10.0.0.7 refused, exit {code:?}: {stderr}"),
    }
}

/// A misspelt flag (`--advertize`) is refused (exit 2), not ignored: ignored, the silo would
/// join under its listen address.
#[test]
fn an_unknown_flag_is_refused_with_exit_2() {
    match outcome(run(&[
        "--listen",
        "127.0.0.104:0",
        "--advertize",
        "10.0.0.7",
        "--cluster",
        "flag-typo",
    ])) {
        Ok(joined) => panic!("--advertize was accepted silently: {joined}"),
        Err((code, stderr)) => assert_eq!(code, Some(2), "exit {code:?}: {stderr}"),
    }
}

/// An advertised port 0 is not an endpoint anyone can reach, any more than 0.0.0.0 is; the
/// service refuses the one and accepts the other.
#[test]
fn an_advertised_port_0_is_refused_with_exit_2() {
    match outcome(run(&[
        "--listen",
        "127.0.0.104:0",
        "--advertise",
        "10.0.0.7:0",
        "--cluster",
        "flag-port0",
    ])) {
        Ok(joined) => panic!("advertised port 0 accepted: {joined}"),
        Err((code, stderr)) => assert_eq!(code, Some(2), "exit {code:?}: {stderr}"),
    }
}

/// A fatal error is its `Display` on stderr (`error: …`, not `Error: InvalidConfiguration {`),
/// and an option the service cannot use exits 2: a password file that is not there, and a
/// `[cassandra.tls]` section in a build without the feature `rustls` (which names the feature).
#[test]
fn an_unusable_option_prints_error_and_its_message_and_exits_2() {
    let cassandra = "storage = \"cassandra\"\n[cassandra]\ncontact_points = [\"127.0.0.104:9\"]\n";
    for (section, expect) in [
        (
            "[cassandra.credentials]\nusername = \"u\"\npassword_file = \"/nonexistent/pw\"\n",
            "error: invalid configuration: credentials.password_file",
        ),
        ("[cassandra.tls]\n", "TLS needs the crate feature `rustls`"),
    ] {
        let file = std::env::temp_dir().join(format!("service-{}.toml", uuid::Uuid::new_v4()));
        std::fs::write(&file, format!("{cassandra}{section}")).unwrap();
        let args = [
            "--listen",
            "127.0.0.104:0",
            "--config",
            file.to_str().unwrap(),
        ];
        match outcome(run(&args)) {
            Ok(joined) => panic!("{section}: joined: {joined}"),
            Err((code, stderr)) => {
                assert_eq!(code, Some(2), "{section}: exit {code:?}: {stderr}");
                let last = stderr.lines().last().unwrap_or_default();
                assert!(last.starts_with("error: "), "{last}");
                assert!(last.contains(expect), "{last}");
                assert!(!stderr.contains("Error: "), "Debug form: {stderr}");
            }
        }
    }
}

/// The library's events reach stderr: as text by default (RUST_LOG unset: info), as one JSON
/// object a line with `--log-format json` or `SERVICE_LOG_FORMAT=json`; RUST_LOG=warn hides the
/// join's info event. stdout keeps the lines a watcher reads.
#[test]
fn the_library_s_events_are_logged_as_text_or_json_per_rust_log() {
    let joined_event = |args: &[&str], env: &[(&str, &str)]| {
        let mut all = vec!["--listen", "127.0.0.104:0", "--cluster", "logs"];
        all.extend_from_slice(args);
        let r = run_with_env(&all, env);
        r.lines.recv_timeout(Duration::from_secs(60)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(line) = r.lines.try_recv()
                && line.starts_with("joined as ")
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(300));
        let err: Vec<String> = r.stderr.try_iter().collect();
        err.into_iter().find(|l| l.contains("joined"))
    };
    let text = joined_event(&[], &[]).expect("an info event for the join on stderr");
    assert!(text.contains(" INFO ") && !text.starts_with('{'), "{text}");
    assert!(!text.contains('\x1b'), "colour escapes on a pipe: {text}");
    for (args, env) in [
        (&["--log-format", "json"][..], &[][..]),
        (&[][..], &[("SERVICE_LOG_FORMAT", "json")][..]),
    ] {
        let json = joined_event(args, env).expect("a JSON event for the join on stderr");
        let v: serde_json::Value = serde_json::from_str(&json).expect(&json);
        assert_eq!(v["level"], "INFO", "{json}");
    }
    assert_eq!(joined_event(&[], &[("RUST_LOG", "warn")]), None);
}
