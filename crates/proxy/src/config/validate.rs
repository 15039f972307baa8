//! Whether a configuration can work: every problem found, each with the
//! path of its key, before anything starts.

use std::net::SocketAddr;

use super::{Config, Problem};

const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// The problems found so far.
#[derive(Default)]
struct Problems(Vec<Problem>);

impl Problems {
    fn report(&mut self, path: String, message: String) {
        self.0.push(Problem { path, message });
    }
}

impl Config {
    /// Every problem in the configuration; empty when it is valid.
    pub fn validate(&self) -> Vec<Problem> {
        let mut problems = Problems::default();
        self.check_proxy(&mut problems);
        self.check_users(&mut problems);
        self.check_backends(&mut problems);
        self.check_dictionary_and_log(&mut problems);
        problems.0
    }

    fn check_proxy(&self, problems: &mut Problems) {
        if self.proxy.listen.parse::<SocketAddr>().is_err() {
            problems.report(
                "proxy.listen".into(),
                format!(
                    "'{}' is not host:port (e.g. 127.0.0.1:4040)",
                    self.proxy.listen
                ),
            );
        }
        if let Some(http) = &self.proxy.http {
            if http.parse::<SocketAddr>().is_err() {
                problems.report("proxy.http".into(), format!("'{http}' is not host:port"));
            }
        }
        if self.proxy.max_connections == 0 {
            problems.report("proxy.max_connections".into(), "must be at least 1".into());
        }
        if self.proxy.tls_cert.is_some() != self.proxy.tls_key.is_some() {
            problems.report(
                "proxy.tls_cert".into(),
                "tls_cert and tls_key go together".into(),
            );
        }
        if self.proxy.require_tls && (self.proxy.tls_cert.is_none() || self.proxy.tls_key.is_none())
        {
            problems.report(
                "proxy.require_tls".into(),
                "needs tls_cert and tls_key".into(),
            );
        }
        if self.proxy.monitor_ms == 0 {
            problems.report("proxy.monitor_ms".into(), "must be at least 1".into());
        }
        if self.proxy.login_timeout_ms == 0 {
            problems.report("proxy.login_timeout_ms".into(), "must be at least 1".into());
        }
        if self.scans.fan_out == 0 {
            problems.report("scans.fan_out".into(), "must be at least 1".into());
        }
        if let (Some(cert), Some(key)) = (&self.proxy.tls_cert, &self.proxy.tls_key) {
            if let Err(e) = crate::tls::acceptor(cert, key) {
                problems.report("proxy.tls_cert".into(), e.to_string());
            }
        }
    }

    fn check_users(&self, problems: &mut Problems) {
        if self.users.is_empty() {
            problems.report(
                "users".into(),
                "no user may connect: add at least one [[users]]".into(),
            );
        }
        for (i, user) in self.users.iter().enumerate() {
            if user.name.is_empty() {
                problems.report(format!("users[{i}].name"), "must not be empty".into());
            }
            if self.users[..i].iter().any(|u| u.name == user.name) {
                problems.report(
                    format!("users[{i}].name"),
                    format!("'{}' is listed twice", user.name),
                );
            }
            if user.password.starts_with('*')
                && user.password.len() == 41
                && user.password_hash().is_none()
            {
                problems.report(
                    format!("users[{i}].password"),
                    "looks like a *HEX hash but is not 40 hex digits".into(),
                );
            }
        }
    }

    fn check_backends(&self, problems: &mut Problems) {
        if self.backends.is_empty() {
            problems.report(
                "backends".into(),
                "at least one [[backends]] is needed".into(),
            );
        }
        for (i, backend) in self.backends.iter().enumerate() {
            if backend.id == 0 {
                problems.report(format!("backends[{i}].id"), "ids start at 1".into());
            }
            if self.backends[..i].iter().any(|b| b.id == backend.id) {
                problems.report(
                    format!("backends[{i}].id"),
                    format!("id {} is used twice", backend.id),
                );
            }
            if !backend.address.starts_with('/') && !has_port(&backend.address) {
                problems.report(
                    format!("backends[{i}].address"),
                    format!(
                        "'{}' is neither host:port nor a socket path",
                        backend.address
                    ),
                );
            }
            if backend.max_connections == 0 {
                problems.report(
                    format!("backends[{i}].max_connections"),
                    "must be at least 1".into(),
                );
            }
            if let Err(e) = crate::tls::connector(backend.tls, backend.tls_ca.as_deref()) {
                problems.report(format!("backends[{i}].tls_ca"), e.to_string());
            }
            for (r, replica) in backend.replicas.iter().enumerate() {
                if !replica.starts_with('/') && !has_port(replica) {
                    problems.report(
                        format!("backends[{i}].replicas[{r}]"),
                        format!("'{replica}' is neither host:port nor a socket path"),
                    );
                }
                if backend.hosts()[..=r].contains(replica) {
                    problems.report(
                        format!("backends[{i}].replicas[{r}]"),
                        format!("'{replica}' is listed twice"),
                    );
                }
            }
        }
    }

    fn check_dictionary_and_log(&self, problems: &mut Problems) {
        if !self.backends.is_empty()
            && !self
                .backends
                .iter()
                .any(|b| b.id == self.dictionary.backend)
        {
            problems.report(
                "dictionary.backend".into(),
                format!("no backend has id {}", self.dictionary.backend),
            );
        }
        if self.dictionary.schema.is_empty() {
            problems.report("dictionary.schema".into(), "must not be empty".into());
        }
        if !LEVELS.contains(&self.log.level.as_str()) {
            problems.report(
                "log.level".into(),
                format!("'{}' is not one of {}", self.log.level, LEVELS.join(", ")),
            );
        }
        for (category, level) in &self.log.categories {
            if !LEVELS.contains(&level.as_str()) {
                problems.report(
                    format!("log.categories.\"{category}\""),
                    format!("'{level}' is not one of {}", LEVELS.join(", ")),
                );
            }
        }
    }
}

fn has_port(address: &str) -> bool {
    address
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}
