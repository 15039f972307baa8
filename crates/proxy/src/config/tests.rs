//! Configurations as files give them: the design's example, unknown keys,
//! every problem reported with its path.

use super::*;

const GOOD: &str = r#"
[proxy]
listen = "127.0.0.1:4040"
http = "127.0.0.1:4041"
max_connections = 4096

[[users]]
name = "app"
password = "secret"
admin = true

[[backends]]
id = 1
address = "127.0.0.1:3306"
user = "root"
password = ""
max_connections = 64

[[backends]]
id = 2
address = "127.0.0.1:3307"
user = "root"
password = ""

[dictionary]
backend = 1
schema = "hscale"
refresh_ms = 1000

[log]
level = "info"
[log.categories]
"hscale::router" = "debug"
"#;

#[test]
fn the_design_example_is_valid() {
    let config = Config::parse(GOOD).unwrap();
    assert_eq!(config.validate(), vec![]);
    assert_eq!(config.backends[1].max_connections, 64);
    assert_eq!(config.main_backend().address, "127.0.0.1:3306");
}

#[test]
fn unknown_keys_are_errors() {
    let text = GOOD.replace("max_connections = 4096", "max_conections = 4096");
    let err = Config::parse(&text).unwrap_err().to_string();
    assert!(err.contains("max_conections"), "{err}");
}

#[test]
fn every_problem_is_reported_with_its_path() {
    let text = GOOD
        .replace("listen = \"127.0.0.1:4040\"", "listen = \"nowhere\"")
        .replace("id = 2", "id = 1")
        .replace("\"127.0.0.1:3307\"", "\"localhost\"")
        .replace("level = \"info\"", "level = \"loud\"");
    let problems = Config::parse(&text).unwrap().validate();
    let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "proxy.listen",
            "backends[1].id",
            "backends[1].address",
            "log.level"
        ]
    );
}

#[test]
fn hashed_passwords_are_accepted_and_checked() {
    let good = GOOD.replace(
        "password = \"secret\"",
        "password = \"*14E65567ABDB5135D0CFD9A70B3032C179A49EE7\"",
    );
    let config = Config::parse(&good).unwrap();
    assert_eq!(
        config.users[0].password_hash(),
        Some(PasswordHash::from_plain("secret"))
    );
    let bad = GOOD.replace(
        "password = \"secret\"",
        "password = \"*14E65567ABDB5135D0CFD9A70B3032C179A49EZZ\"",
    );
    let problems = Config::parse(&bad).unwrap().validate();
    assert_eq!(problems[0].path, "users[0].password");
}

#[test]
fn tls_settings_that_cannot_work_are_reported() {
    let text = GOOD
        .replace(
            "max_connections = 4096",
            "max_connections = 4096\ntls_cert = \"/nonexistent/server.pem\"\nrequire_tls = true\ndefault_auth = \"caching_sha2_password\"",
        )
        .replace("max_connections = 64", "max_connections = 64\ntls = \"verify\"");
    let config = Config::parse(&text).unwrap();
    assert_eq!(config.proxy.default_auth, DefaultAuth::CachingSha2Password);
    let problems = config.validate();
    let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        ["proxy.tls_cert", "proxy.require_tls", "backends[0].tls_ca"]
    );
    let text = GOOD.replace(
        "max_connections = 4096",
        "max_connections = 4096\ntls_cert = \"/nonexistent/server.pem\"\ntls_key = \"/nonexistent/key.pem\"",
    );
    let problems = Config::parse(&text).unwrap().validate();
    assert_eq!(problems[0].path, "proxy.tls_cert");
    assert!(
        problems[0].message.contains("/nonexistent/server.pem"),
        "{}",
        problems[0].message
    );
}

#[test]
fn a_replica_set_lists_each_host_once() {
    let text = GOOD.replace(
        "address = \"127.0.0.1:3307\"",
        "address = \"127.0.0.1:3307\"\nreplicas = [\"127.0.0.1:3308\", \"127.0.0.1:3307\", \"nowhere\"]\nfailover_wait_ms = 500",
    );
    let config = Config::parse(&text).unwrap();
    assert_eq!(config.backends[1].failover_wait_ms, 500);
    assert_eq!(config.backends[1].hosts().len(), 4);
    let problems = config.validate();
    let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        ["backends[1].replicas[1]", "backends[1].replicas[2]"]
    );
    let auto = GOOD.replace("id = 2", "id = 2\nfailover = \"auto\"");
    assert_eq!(Config::parse(&auto).unwrap().validate(), vec![]);
    let main = GOOD.replace("id = 1", "id = 1\nfailover = \"auto\"");
    assert_eq!(Config::parse(&main).unwrap().validate(), vec![]);
}

#[test]
fn dictionary_backend_must_exist() {
    let text = GOOD.replace("backend = 1", "backend = 9");
    let problems = Config::parse(&text).unwrap().validate();
    assert_eq!(problems[0].path, "dictionary.backend");
}
