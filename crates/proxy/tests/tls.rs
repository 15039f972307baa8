//! TLS on both hops, with real clients: the mariadb CLI verifying hscale's
//! certificate against the test run's CA, a client refused for staying in
//! clear where TLS is required, and backends reached over TLS, verified, by
//! an account that the server lets in over TLS only.

use hscale::config::{BackendTls, Config};
use hscale_testkit::{cluster, Proxy};
use mysql::prelude::Queryable;

/// The cluster's servers over TCP, and hscale presenting the test
/// certificate to clients.
fn tls_config() -> Config {
    let mut config = cluster().config_over_tcp();
    config.proxy.tls_cert = Some(cluster().tls.cert.clone());
    config.proxy.tls_key = Some(cluster().tls.key.clone());
    config
}

fn cli(port: u16, tls: &[&str], sql: &str) -> std::process::Output {
    std::process::Command::new("mariadb")
        .args(["-h127.0.0.1", &format!("-P{port}"), "-uroot", "--batch"])
        .args(tls)
        .args(["-e", sql])
        .output()
        .expect("mariadb client")
}

#[test]
fn the_mariadb_client_verifies_hscales_certificate_and_talks_over_tls() {
    let proxy = Proxy::start(tls_config());
    let ca = format!("--ssl-ca={}", cluster().tls.ca.display());
    let verified = cli(
        proxy.port,
        &["--ssl", "--ssl-verify-server-cert", &ca],
        "status; SELECT 40 + 2",
    );
    let out = String::from_utf8_lossy(&verified.stdout);
    assert!(
        verified.status.success(),
        "{}",
        String::from_utf8_lossy(&verified.stderr)
    );
    assert!(out.contains("Cipher in use is"), "{out}");
    assert!(out.contains("\n42\n"), "{out}");
    // Another CA's word is not enough.
    let other = hscale_testkit::tls::make_certificates(&hscale_testkit::scratch("tls_other_ca"));
    let wrong_ca = format!("--ssl-ca={}", other.ca.display());
    let refused = cli(
        proxy.port,
        &["--ssl", "--ssl-verify-server-cert", &wrong_ca],
        "SELECT 1",
    );
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("2026"), "{said}");
    // A client that does not ask stays in clear, and works.
    let clear = cli(proxy.port, &["--skip-ssl"], "status");
    assert!(clear.status.success());
    assert!(String::from_utf8_lossy(&clear.stdout).contains("Not in use"));
}

#[test]
fn require_tls_refuses_a_client_that_stays_in_clear() {
    let mut config = tls_config();
    config.proxy.require_tls = true;
    let proxy = Proxy::start(config);
    let err = hscale_testkit::try_connect(proxy.port, "root", "", None).unwrap_err();
    assert!(
        matches!(&err, mysql::Error::MySqlError(e) if e.code == 3159),
        "{err:?}"
    );
    let clear = cli(proxy.port, &["--skip-ssl"], "SELECT 1");
    assert!(!clear.status.success());
    assert!(String::from_utf8_lossy(&clear.stderr).contains("3159"));
    let ca = format!("--ssl-ca={}", cluster().tls.ca.display());
    let tls = cli(proxy.port, &["--ssl-verify-server-cert", &ca], "SELECT 7");
    assert!(
        tls.status.success(),
        "{}",
        String::from_utf8_lossy(&tls.stderr)
    );
}

#[test]
fn backends_are_reached_over_verified_tls_by_an_account_that_requires_it() {
    let db = cluster().database("tls_backend");
    // An account the backends let in over TLS only.
    cluster().account("tls_app", "pw", &db, Some("SSL"));
    let mut config = tls_config();
    config.users.push(hscale::config::UserConfig {
        name: "tls_app".into(),
        password: "pw".into(),
        ..Default::default()
    });
    let in_clear = config.clone();
    for backend in &mut config.backends {
        backend.tls = BackendTls::Verify;
        backend.tls_ca = Some(cluster().tls.ca.clone());
    }
    let proxy = Proxy::start(config.clone());
    let mut app = hscale_testkit::connect(proxy.port, "tls_app", "pw", Some(&db));
    let cipher: Option<(String, String)> = app
        .query_first("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .unwrap();
    let cipher = cipher.unwrap().1;
    assert!(!cipher.is_empty(), "the backend connection is in clear");
    app.query_drop("CREATE TABLE t (id INT PRIMARY KEY)")
        .unwrap();
    app.query_drop("INSERT INTO t VALUES (1), (2)").unwrap();
    let ids: Vec<i32> = app.query("SELECT id FROM t ORDER BY id").unwrap();
    assert_eq!(ids, [1, 2]);
    // hscale's own connections (the dictionary) go over TLS too.
    let mut root = hscale_testkit::connect(proxy.port, "root", "", Some(&db));
    root.query_drop("HSCALE SETUP_TABLE('t', 'id', 't_default', 1, 'MOD(2)')")
        .unwrap();
    root.query_drop("HSCALE ADD_PARTITION('t', 'odd', 1, 2)")
        .unwrap();
    let odd: Vec<i32> = cluster()
        .direct(2, Some(&db))
        .query("SELECT id FROM t_odd")
        .unwrap();
    assert_eq!(odd, [1]);
    drop(proxy);

    // In clear, the account is refused by the server itself.
    let proxy = Proxy::start(in_clear);
    let err = hscale_testkit::try_connect(proxy.port, "tls_app", "pw", None).unwrap_err();
    assert!(
        matches!(&err, mysql::Error::MySqlError(e) if e.code == 1429 && e.message.contains("Access denied")),
        "{err:?}"
    );
    drop(proxy);

    // A certificate another CA signed is refused, with the reason.
    let other = hscale_testkit::tls::make_certificates(&hscale_testkit::scratch("tls_backend_ca"));
    for backend in &mut config.backends {
        backend.tls_ca = Some(other.ca.clone());
    }
    let proxy = Proxy::start(config);
    let err = hscale_testkit::try_connect(proxy.port, "root", "", None).unwrap_err();
    assert!(
        matches!(&err, mysql::Error::MySqlError(e) if e.code == 1429 && e.message.contains("TLS")),
        "{err:?}"
    );
}

/// A client over TLS moves between workers with its TLS session
/// (`move_clients = "always"`, two workers): every answer arrives, in order,
/// encrypted, as the client goes back and forth.
#[test]
fn a_client_over_tls_moves_between_workers_with_its_session() {
    let mut config = tls_config();
    config.proxy.threads = 2;
    config.proxy.move_clients = hscale::config::MoveClients::Always;
    let proxy = Proxy::start(config);
    let ca = format!("--ssl-ca={}", cluster().tls.ca.display());
    let statements: String = (0..50).map(|i| format!("SELECT {i} * 2; ")).collect();
    let out = cli(
        proxy.port,
        &[
            "--ssl",
            "--ssl-verify-server-cert",
            &ca,
            "--skip-column-names",
        ],
        &format!("status; {statements}"),
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = said.lines().collect();
    let answers = &lines[lines.len().saturating_sub(50)..];
    let expected: Vec<String> = (0..50).map(|i| (i * 2).to_string()).collect();
    assert_eq!(answers, expected);
    assert!(said.contains("Cipher in use is"), "{said}");
    let moved = proxy
        .shared
        .balance
        .moved
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(moved >= 40, "moved {moved} times");
}
