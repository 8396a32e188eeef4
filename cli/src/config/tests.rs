//! How the options are layered and validated, without a node.

use super::*;

/// No variable at all: not even HOME, so no default config file is read.
fn no_env(_: &str) -> Option<String> {
    None
}

/// Flags naming a service and a cluster, nothing else.
fn named() -> Overrides {
    Overrides {
        service: Some("svc".into()),
        cluster: Some("blue".into()),
        ..Overrides::default()
    }
}

#[test]
fn the_ids_have_no_default_and_only_the_commands_on_a_cluster_need_them() {
    let e = resolve(Source::default(), Overrides::default(), no_env).unwrap_err();
    assert_eq!(e.exit_code(), EXIT_USAGE);
    assert!(e.to_string().contains("service_id: not set"), "{e}");
    let service_only = || Overrides {
        service: Some("svc".into()),
        ..Overrides::default()
    };
    let e = resolve(Source::default(), service_only(), no_env).unwrap_err();
    assert!(e.to_string().contains("cluster_id: not set"), "{e}");
    // delete-cluster names its cluster as its argument; the service it needs.
    let service = Overrides {
        scope: Scope::Service,
        ..service_only()
    };
    let o = resolve(Source::default(), service, no_env).unwrap().options;
    assert_eq!(o.service_id, "svc");
    let e = resolve(
        Source::default(),
        Overrides {
            scope: Scope::Service,
            ..Overrides::default()
        },
        no_env,
    )
    .unwrap_err();
    assert!(e.to_string().contains("service_id: not set"), "{e}");
    // clusters, audit, patch: the whole table, neither.
    let table_wide = Overrides {
        scope: Scope::Table,
        ..Overrides::default()
    };
    resolve(Source::default(), table_wide, no_env).unwrap();
    // Named ids are never replaced.
    let o = resolve(
        Source::default(),
        Overrides {
            scope: Scope::Table,
            ..named()
        },
        no_env,
    )
    .unwrap()
    .options;
    assert_eq!(
        (o.service_id.as_str(), o.cluster_id.as_str()),
        ("svc", "blue")
    );
}

#[test]
fn flags_override_the_file_and_defaults_fill_the_rest() {
    let dir = std::env::temp_dir().join(format!("cm-cli-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("a.toml");
    std::fs::write(
        &path,
        "keyspace = \"from_file\"\ntable = \"t1\"\nttl = true\nservice_id = \"shop\"\ncluster_id = \"green\"\n",
    )
    .unwrap();
    let o = resolve(
        Source {
            file: Some(&path),
            key: None,
        },
        Overrides {
            table: Some("t2".into()),
            cluster: Some("blue".into()),
            ..Overrides::default()
        },
        no_env,
    )
    .unwrap();
    assert!(o.ttl_explicit, "the file sets ttl");
    let o = o.options;
    assert_eq!(o.keyspace, "from_file");
    assert_eq!(o.table, "t2");
    assert!(o.ttl);
    assert_eq!(o.service_id, "shop");
    assert_eq!(o.cluster_id, "blue");
}

#[test]
fn serial_datacenter_comes_from_the_flag_and_local_quorum_requires_it() {
    let local = Overrides {
        consistency: Some(ConsistencyProfile::LocalQuorum),
        ..named()
    };
    let e = resolve(Source::default(), local, no_env).unwrap_err();
    assert_eq!(e.exit_code(), EXIT_USAGE);
    assert!(e.to_string().contains("serial_datacenter"), "{e}");
    let o = resolve(
        Source::default(),
        Overrides {
            consistency: Some(ConsistencyProfile::LocalQuorum),
            serial_datacenter: Some("dc1".into()),
            ..named()
        },
        no_env,
    )
    .unwrap()
    .options;
    assert_eq!(o.serial_datacenter.as_deref(), Some("dc1"));
}

#[test]
fn an_unknown_option_in_the_file_is_a_usage_error_naming_it() {
    let dir = std::env::temp_dir().join(format!("cm-cli-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("b.toml");
    std::fs::write(&path, "keyspaec = \"x\"\n").unwrap();
    let e = resolve(
        Source {
            file: Some(&path),
            key: None,
        },
        Overrides::default(),
        no_env,
    )
    .unwrap_err();
    assert_eq!(e.exit_code(), EXIT_USAGE);
    assert!(e.to_string().contains("keyspaec"), "{e}");
}

#[test]
fn credentials_come_from_the_environment_in_pairs() {
    let env = |k: &str| (k == ENV_USERNAME).then(|| "ops".to_owned());
    let e = resolve(Source::default(), named(), env).unwrap_err();
    assert_eq!(e.exit_code(), EXIT_USAGE);
    assert!(e.to_string().contains(ENV_PASSWORD), "{e}");
    let env = |k: &str| match k {
        ENV_USERNAME => Some("ops".to_owned()),
        ENV_PASSWORD => Some("s3cret".to_owned()),
        _ => None,
    };
    let o = resolve(Source::default(), named(), env).unwrap();
    assert!(!o.ttl_explicit);
    let o = o.options;
    assert_eq!(o.credentials.unwrap().username, "ops");
}

#[test]
fn an_invalid_value_is_the_library_s_configuration_error() {
    let e = resolve(
        Source::default(),
        Overrides {
            keyspace: Some("no-dashes".into()),
            ..Overrides::default()
        },
        no_env,
    )
    .unwrap_err();
    assert_eq!(e.exit_code(), EXIT_USAGE);
    assert!(e.to_string().contains("keyspace"), "{e}");
}

#[test]
fn the_default_config_path_is_xdg_config_home_then_home_dot_config() {
    let env = |k: &str| match k {
        "XDG_CONFIG_HOME" => Some("/x".to_owned()),
        "HOME" => Some("/h".to_owned()),
        _ => None,
    };
    assert_eq!(
        default_config_path(&env),
        Some(PathBuf::from("/x/cassandra-membership/config.toml"))
    );
    let env = |k: &str| match k {
        "XDG_CONFIG_HOME" => Some(String::new()),
        "HOME" => Some("/h".to_owned()),
        _ => None,
    };
    assert_eq!(
        default_config_path(&env),
        Some(PathBuf::from("/h/.config/cassandra-membership/config.toml"))
    );
    assert_eq!(default_config_path(&no_env), None);
}

#[test]
fn tls_flags_fill_the_file_s_tls_section() {
    let dir = std::env::temp_dir().join(format!("cm-cli-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tls.toml");
    std::fs::write(
        &path,
        "[app.db]\nttl = true\n[app.db.tls]\nca_file = \"/etc/ca.pem\"\n\
         cert_file = \"c.pem\"\nkey_file = \"k.pem\"\n",
    )
    .unwrap();
    let o = resolve(
        Source {
            file: Some(&path),
            key: Some("app.db"),
        },
        Overrides {
            tls_server_name: Some("db.internal".into()),
            ..named()
        },
        no_env,
    )
    .unwrap();
    assert!(o.ttl_explicit, "the nested table sets ttl");
    let tls = o.options.tls.unwrap();
    assert_eq!(tls.ca_file, Some(PathBuf::from("/etc/ca.pem")));
    assert_eq!(tls.server_name.as_deref(), Some("db.internal"));
    // Relative to the config file's directory.
    assert_eq!(tls.cert_file, Some(dir.join("c.pem")));
    assert_eq!(tls.key_file, Some(dir.join("k.pem")));
    assert!(tls.verify);
}

#[test]
fn refusals_access_and_schema_have_their_own_exit_codes() {
    assert_eq!(CliError::Refused("x".into()).exit_code(), EXIT_REFUSED);
    assert_eq!(CliError::Usage("x".into()).exit_code(), EXIT_USAGE);
    assert_eq!(CliError::Failed("x".into()).exit_code(), EXIT_FAILED);
    let schema = MembershipError::SchemaMismatch {
        table: "k.t".into(),
        detail: "x".into(),
    };
    assert_eq!(CliError::from(schema).exit_code(), EXIT_DENIED);
}
