//! docker-compose.yml and the CI workflow agree with what CONTRIBUTING.md and the scripts expect. No
//! Docker needed: the files are parsed, not run (CI runs them, on runners that have Docker).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use yaml_rust2::{Yaml, YamlLoader};

/// Each compose service: the backend it is (`CASSANDRA_BACKEND`), its image, the host port of CQL
/// (9042 in the container; CONTRIBUTING.md gives it) and any other published port. The cassandra
/// service takes the tests' default contact point.
const SERVICES: [(&str, &str, u16, &[&str]); 2] = [
    ("cassandra", "cassandra:5.0", 9042, &[]),
    // The shard-aware port ScyllaDB announces, dialled by the driver on the node's address.
    (
        "scylla",
        "scylladb/scylla:",
        9043,
        &["127.0.0.1:19042:19042"],
    ),
];

fn read(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("read {}: {e}", full.display()))
}

fn yaml(path: &str) -> Yaml {
    let mut docs = YamlLoader::load_from_str(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(docs.len(), 1, "{path} is one YAML document");
    docs.remove(0)
}

fn services() -> Yaml {
    yaml("docker-compose.yml")["services"].clone()
}

fn strings(node: &Yaml) -> Vec<&str> {
    node.as_vec()
        .unwrap_or_else(|| panic!("expected a list, found {node:?}"))
        .iter()
        .map(|s| {
            s.as_str()
                .unwrap_or_else(|| panic!("expected text, found {s:?}"))
        })
        .collect()
}

/// The value of the shell assignment `name="..."` in `script`.
fn shell_value<'a>(script: &'a str, name: &str) -> &'a str {
    let prefix = format!("{name}=\"");
    script
        .lines()
        .find_map(|line| line.strip_prefix(&prefix)?.split('"').next())
        .unwrap_or_else(|| panic!("no {name}=\"...\" line"))
}

/// The request timeouts scripts/cassandra.sh writes into the Maven node's cassandra.yaml
/// (`name_timeout: 10000ms`), in milliseconds.
fn maven_node_timeouts() -> BTreeMap<String, u64> {
    let script = read("scripts/cassandra.sh");
    let timeouts: BTreeMap<String, u64> = script
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(": ")?;
            let ms = value.strip_suffix("ms")?.parse().ok()?;
            (name.ends_with("_timeout") && !name.contains(' ')).then(|| (name.to_owned(), ms))
        })
        .collect();
    for expected in ["write_request_timeout", "cas_contention_timeout"] {
        assert!(
            timeouts.contains_key(expected),
            "scripts/cassandra.sh sets {expected}: {timeouts:?}"
        );
    }
    timeouts
}

#[test]
fn the_compose_services_are_exactly_the_backends_test_sh_accepts() {
    let services = services();
    let compose: BTreeSet<&str> = services
        .as_hash()
        .expect("services")
        .keys()
        .map(|k| k.as_str().expect("service name"))
        .collect();
    let known: BTreeSet<&str> = SERVICES.iter().map(|(name, ..)| *name).collect();
    let script = read("scripts/test.sh");
    let test_sh: BTreeSet<&str> = shell_value(&script, "backends").split(' ').collect();
    assert_eq!(compose, known, "docker-compose.yml services");
    assert_eq!(test_sh, known, "scripts/test.sh backends");
}

#[test]
fn each_service_runs_its_image_publishes_cql_on_its_port_and_has_a_healthcheck() {
    let services = services();
    for (name, image, port, others) in SERVICES {
        let service = &services[name];
        let actual = service["image"].as_str().expect("image");
        assert!(actual.starts_with(image), "{name}: image {actual}");
        // On 127.0.0.1 only: the Maven nodes of test.sh's later stages use other loopback addresses.
        let cql = format!("127.0.0.1:{port}:9042");
        let expected: Vec<&str> = std::iter::once(cql.as_str())
            .chain(others.iter().copied())
            .collect();
        assert_eq!(
            strings(&service["ports"]),
            expected,
            "{name} publishes CQL (9042 in the container) on host port {port}"
        );
        let check = strings(&service["healthcheck"]["test"]);
        assert!(
            check.first() == Some(&"CMD") && check.contains(&"cqlsh"),
            "{name}: test.sh waits for a healthcheck that asks CQL: {check:?}"
        );
    }
}

#[test]
fn the_dockerized_nodes_get_the_request_timeouts_of_the_maven_node() {
    let services = services();
    let cassandra_opts = services["cassandra"]["environment"]["JVM_EXTRA_OPTS"]
        .as_str()
        .expect("cassandra: JVM_EXTRA_OPTS")
        .split_whitespace()
        .collect::<BTreeSet<_>>();
    let scylla_args = strings(&services["scylla"]["command"]);
    assert!(
        cassandra_opts.contains("-Dcassandra.config.allow_system_properties=true"),
        "Cassandra reads -Dcassandra.settings.* only when allowed"
    );
    for (name, ms) in maven_node_timeouts() {
        let cassandra = format!("-Dcassandra.settings.{name}={ms}ms");
        assert!(
            cassandra_opts.contains(cassandra.as_str()),
            "cassandra: {cassandra}"
        );
        let scylla = format!("--{}-in-ms={ms}", name.replace('_', "-"));
        assert!(scylla_args.contains(&scylla.as_str()), "scylla: {scylla}");
    }
}

#[test]
fn scylla_creates_vnode_keyspaces_so_that_conditional_writes_work() {
    let services = services();
    let args = strings(&services["scylla"]["command"]);
    assert!(args.contains(&"--enable-tablets=false"), "{args:?}");
}

#[test]
fn contributing_gives_the_dockerized_commands_and_ports() {
    let contributing = read("CONTRIBUTING.md");
    let section = contributing
        .split("\n## Running Cassandra\n")
        .nth(1)
        .expect("CONTRIBUTING.md has a Running Cassandra section")
        .split("\n## ")
        .next()
        .unwrap();
    for expected in [
        "CASSANDRA_RUNTIME=docker scripts/test.sh".to_owned(),
        "CASSANDRA_RUNTIME=docker CASSANDRA_BACKEND=scylla scripts/test.sh".to_owned(),
    ]
    .into_iter()
    .chain(
        SERVICES
            .iter()
            .map(|(_, _, port, _)| format!("127.0.0.1:{port}")),
    ) {
        assert!(
            section.contains(&expected),
            "CONTRIBUTING.md, Running Cassandra: {expected}"
        );
    }
}

#[test]
fn ci_runs_test_sh_on_the_maven_node_and_on_every_compose_service() {
    let workflow = yaml(".github/workflows/ci.yml");
    let job = &workflow["jobs"]["test"];
    let runs: BTreeSet<(&str, &str)> = job["strategy"]["matrix"]["include"]
        .as_vec()
        .expect("a matrix of includes")
        .iter()
        .map(|run| {
            let field = |key: &str| {
                run[key]
                    .as_str()
                    .unwrap_or_else(|| panic!("{key} in {run:?}"))
            };
            (field("runtime"), field("backend"))
        })
        .collect();
    let expected: BTreeSet<(&str, &str)> = std::iter::once(("maven", "cassandra"))
        .chain(SERVICES.iter().map(|(name, ..)| ("docker", *name)))
        .collect();
    assert_eq!(runs, expected);
    assert_eq!(
        job["env"]["CASSANDRA_RUNTIME"].as_str(),
        Some("${{ matrix.runtime }}")
    );
    assert_eq!(
        job["env"]["CASSANDRA_BACKEND"].as_str(),
        Some("${{ matrix.backend }}")
    );
    let steps = job["steps"].as_vec().expect("steps");
    assert!(
        steps.iter().any(|s| s["run"].as_str() == Some(".ci/run")),
        "CI runs .ci/run, which runs scripts/test.sh"
    );
}

/// The text between `start` and the next `end` in `script`.
fn between<'a>(script: &'a str, start: &str, end: char) -> &'a str {
    let from = script
        .find(start)
        .unwrap_or_else(|| panic!("no {start:?} in the script"))
        + start.len();
    script[from..].split(end).next().unwrap_or_default()
}

#[test]
fn ci_runs_every_release_cassandra_sh_starts_and_the_ring_on_both_paxos_variants() {
    let cassandra_sh = read("scripts/cassandra.sh");
    let test_sh = read("scripts/test.sh");
    // The default release and the older ones test.sh's own stage runs: the supported set.
    let default_release = between(&cassandra_sh, "version=${CASSANDRA_VERSION:-", '}');
    let mut releases: BTreeSet<&str> = between(&test_sh, "${CASSANDRA_OLDER_RELEASES-", '}')
        .split_whitespace()
        .collect();
    releases.insert(default_release);
    let workflow = yaml(".github/workflows/ci.yml");
    let job = &workflow["jobs"]["test"];
    for (variable, field) in [
        ("CASSANDRA_VERSION", "version"),
        ("CASSANDRA_OLDER_RELEASES", "older_releases"),
        ("CASSANDRA_RING_PAXOS_VARIANTS", "ring_variants"),
    ] {
        assert_eq!(
            job["env"][variable].as_str(),
            Some(format!("${{{{ matrix.{field} }}}}").as_str())
        );
    }
    let runs = job["strategy"]["matrix"]["include"]
        .as_vec()
        .expect("a matrix of includes");
    let mut main_releases = BTreeSet::new();
    let mut ring_variants = BTreeSet::new();
    for run in runs {
        // An unset field reads as '' in the workflow, and '' skips a stage: every run says.
        let field = |key: &str| {
            run[key]
                .as_str()
                .unwrap_or_else(|| panic!("{key} in {run:?}"))
        };
        if field("runtime") == "maven" {
            let version = field("version");
            main_releases.insert(if version.is_empty() {
                default_release
            } else {
                version
            });
        }
        for release in field("older_releases").split_whitespace() {
            assert!(releases.contains(release), "older release {release}");
        }
        ring_variants.extend(field("ring_variants").split_whitespace());
    }
    assert_eq!(
        main_releases, releases,
        "a Maven job's main stage on each release"
    );
    // Each Paxos variant test.sh's three-node stage runs by default, in some job.
    let variants: BTreeSet<&str> = between(&test_sh, "${CASSANDRA_RING_PAXOS_VARIANTS-", '}')
        .split_whitespace()
        .collect();
    assert_eq!(variants, BTreeSet::from(["v1", "v2"]));
    assert_eq!(ring_variants, variants);
}
