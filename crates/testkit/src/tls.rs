//! Certificates for tests: a CA of the test run's own, and a server
//! certificate it signs for `localhost` and `127.0.0.1`, which the test
//! servers and hscale's client listener both present.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

/// PEM files in one folder.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Writes a new CA and a server certificate signed by it into `dir`, with
/// the names MariaDB's options and hscale's configuration read
/// (`ca.pem`, `server.pem`, `server-key.pem`).
pub fn make_certificates(dir: &Path) -> TlsFiles {
    std::fs::create_dir_all(dir).expect("tls dir");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "hscale test CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("ca key"))
        .expect("ca certificate");
    let mut params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .expect("server params");
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let key = KeyPair::generate().expect("server key");
    let cert = params.signed_by(&key, &ca).expect("server certificate");
    let files = TlsFiles {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server-key.pem"),
    };
    std::fs::write(&files.ca, ca.pem()).expect("write ca");
    std::fs::write(&files.cert, cert.pem()).expect("write cert");
    std::fs::write(&files.key, key.serialize_pem()).expect("write key");
    files
}
