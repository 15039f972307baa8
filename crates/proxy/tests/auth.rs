//! caching_sha2_password for clients, as MySQL 8 connectors log in: the
//! first login of a user sends its password (over TLS in clear, else
//! encrypted with hscale's RSA key after asking for it), later ones a
//! scramble checked against the digest kept (fast authentication). Checked
//! packet by packet with a bare client, and with real clients: the Rust
//! `mysql` driver (RSA exchange) and the mariadb CLI (over TLS).

use hscale::config::{Config, DefaultAuth};
use hscale_testkit::{cluster, Proxy};
use hscale_wire::packets::{BackendHello, ServerGreeting};
use hscale_wire::stream::PacketStream;
use hscale_wire::CapabilityFlags;
use mysql::prelude::Queryable;

fn sha2_config(users: &[(&str, &str)]) -> Config {
    let mut config = cluster().config_over_tcp();
    config.proxy.default_auth = DefaultAuth::CachingSha2Password;
    config.proxy.tls_cert = Some(cluster().tls.cert.clone());
    config.proxy.tls_key = Some(cluster().tls.key.clone());
    for (name, password) in users {
        config.users.push(hscale::config::UserConfig {
            name: name.to_string(),
            password: password.to_string(),
            // Statements run as the servers' root: the login is the point.
            backend_user: Some("root".into()),
            backend_password: Some(String::new()),
            ..Default::default()
        });
    }
    config
}

/// Logs in with caching_sha2_password's scramble and returns the packets
/// hscale answered with up to the OK or the error.
async fn sha2_exchange(port: u16, user: &str, password: &str) -> Vec<Vec<u8>> {
    let socket = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut stream = PacketStream::new(socket, 1 << 20);
    let greeting = stream.read_packet().await.unwrap().unwrap();
    let server = ServerGreeting::parse(&greeting.payload).unwrap();
    assert_eq!(server.auth_plugin, "caching_sha2_password");
    let scramble = mysql_common::scramble::scramble_sha256(&server.nonce, password.as_bytes())
        .map(|s| s.to_vec())
        .unwrap_or_default();
    let mut hello = Vec::new();
    BackendHello {
        capabilities: CapabilityFlags::CLIENT_PROTOCOL_41
            | CapabilityFlags::CLIENT_SECURE_CONNECTION
            | CapabilityFlags::CLIENT_PLUGIN_AUTH
            | CapabilityFlags::CLIENT_LONG_PASSWORD,
        collation: 45,
        user,
        auth_response: &scramble,
        database: None,
        auth_plugin: "caching_sha2_password",
    }
    .write(&mut hello);
    stream.send_packet(1, &hello).await.unwrap();
    let mut answers = Vec::new();
    loop {
        let packet = stream
            .read_packet()
            .await
            .unwrap()
            .unwrap()
            .payload
            .to_vec();
        let last = matches!(packet.first(), Some(0x00 | 0xff)) || packet == [0x01, 0x04];
        answers.push(packet);
        if last {
            return answers;
        }
    }
}

#[tokio::test]
async fn a_kept_digest_lets_the_next_login_through_without_the_password() {
    let config = sha2_config(&[("sha2_fast", "s3cret")]);
    let proxy = tokio::task::spawn_blocking(move || Proxy::start(config))
        .await
        .unwrap();
    let port = proxy.port;
    // Nothing kept yet: hscale asks for the password.
    assert_eq!(
        sha2_exchange(port, "sha2_fast", "s3cret").await,
        [vec![0x01, 0x04]]
    );
    // A real client's first login: the password, encrypted with hscale's
    // RSA key, which it asks for.
    tokio::task::spawn_blocking(move || {
        let mut c = hscale_testkit::connect(port, "sha2_fast", "s3cret", None);
        assert_eq!(c.query_first::<i32, _>("SELECT 6 * 7").unwrap(), Some(42));
    })
    .await
    .unwrap();
    // Now the scramble alone: fast authentication, then the OK.
    let answers = sha2_exchange(port, "sha2_fast", "s3cret").await;
    assert_eq!(answers[0], [0x01, 0x03]);
    assert_eq!(answers[1][0], 0x00, "{answers:?}");
    // A wrong password against the kept digest goes on to the full
    // exchange, as an unknown user's login does: the answers do not tell
    // which users exist, or logged in lately.
    assert_eq!(
        sha2_exchange(port, "sha2_fast", "wrong").await,
        [vec![0x01, 0x04]]
    );
    assert_eq!(
        sha2_exchange(port, "no_such_user", "s3cret").await,
        [vec![0x01, 0x04]]
    );
    tokio::task::spawn_blocking(move || drop(proxy))
        .await
        .unwrap();
}

#[test]
fn a_first_login_over_rsa_or_tls_proves_the_password_and_a_wrong_one_is_denied() {
    let config = sha2_config(&[
        ("sha2_rsa", "pw-rsa"),
        ("sha2_tls", "pw-tls"),
        ("sha2_empty", ""),
    ]);
    let proxy = Proxy::start(config);
    // The Rust driver without TLS: the RSA key exchange.
    let denied = hscale_testkit::try_connect(proxy.port, "sha2_rsa", "not-it", None).unwrap_err();
    assert!(
        matches!(&denied, mysql::Error::MySqlError(e) if e.code == 1045),
        "{denied:?}"
    );
    // An unknown user goes through the same RSA exchange to its 1045.
    let unknown =
        hscale_testkit::try_connect(proxy.port, "no_such_user", "pw-rsa", None).unwrap_err();
    assert!(
        matches!(&unknown, mysql::Error::MySqlError(e) if e.code == 1045),
        "{unknown:?}"
    );
    let mut c = hscale_testkit::connect(proxy.port, "sha2_rsa", "pw-rsa", None);
    let user: String = c.query_first("SELECT CURRENT_USER()").unwrap().unwrap();
    assert!(user.starts_with("root@"), "{user}");
    // The mariadb client over TLS: the password in clear, inside TLS.
    let ca = format!("--ssl-ca={}", cluster().tls.ca.display());
    let cli = |password: &str| {
        std::process::Command::new("mariadb")
            .args(["-h127.0.0.1", &format!("-P{}", proxy.port), "-usha2_tls"])
            .arg(format!("-p{password}"))
            .args(["--ssl-verify-server-cert", &ca, "--batch", "-e", "SELECT 7"])
            .output()
            .unwrap()
    };
    let wrong = cli("nope");
    assert!(!wrong.status.success());
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("1045"));
    for _ in 0..2 {
        let right = cli("pw-tls");
        assert!(
            right.status.success(),
            "{}",
            String::from_utf8_lossy(&right.stderr)
        );
        assert!(String::from_utf8_lossy(&right.stdout).contains('7'));
    }
    // An empty password needs no exchange.
    let mut empty = hscale_testkit::connect(proxy.port, "sha2_empty", "", None);
    assert_eq!(empty.query_first::<i32, _>("SELECT 1").unwrap(), Some(1));
}
