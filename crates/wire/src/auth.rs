//! mysql_native_password: the nonce hscale sends and the check of a client's answer.

use rand::Rng;
use sha1::{Digest, Sha1};

pub const NATIVE_PASSWORD: &str = "mysql_native_password";
pub const NONCE_LEN: usize = 20;

/// A nonce of printable ASCII without NUL, as servers send it: some clients treat
/// the nonce as a C string.
pub fn new_nonce() -> [u8; NONCE_LEN] {
    let mut rng = rand::rng();
    let mut nonce = [0u8; NONCE_LEN];
    for b in &mut nonce {
        *b = rng.random_range(0x21..0x7f);
    }
    nonce
}

/// What the server stores for a password: SHA1(SHA1(password)), the `*HEX` form
/// of `mysql.user`. An empty password has no hash: it accepts only an empty answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PasswordHash {
    Empty,
    DoubleSha1([u8; 20]),
}

impl PasswordHash {
    pub fn from_plain(password: &str) -> PasswordHash {
        if password.is_empty() {
            return PasswordHash::Empty;
        }
        let stage1 = Sha1::digest(password.as_bytes());
        PasswordHash::DoubleSha1(Sha1::digest(stage1).into())
    }

    /// Parses `*` followed by 40 hex digits.
    pub fn from_hex(hash: &str) -> Option<PasswordHash> {
        let hex = hash.strip_prefix('*')?;
        if hex.len() != 40 {
            return None;
        }
        let mut out = [0u8; 20];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(PasswordHash::DoubleSha1(out))
    }

    /// Checks a client's scramble: it is SHA1(pw) XOR SHA1(nonce + SHA1(SHA1(pw))),
    /// so XOR with SHA1(nonce + stored) yields SHA1(pw), whose SHA1 must be stored.
    pub fn verify(&self, nonce: &[u8], answer: &[u8]) -> bool {
        match self {
            PasswordHash::Empty => answer.is_empty(),
            PasswordHash::DoubleSha1(stored) => {
                if answer.len() != 20 {
                    return false;
                }
                let mut hasher = Sha1::new();
                hasher.update(nonce);
                hasher.update(stored);
                let mask = hasher.finalize();
                let stage1: Vec<u8> = answer.iter().zip(mask).map(|(a, m)| a ^ m).collect();
                Sha1::digest(&stage1).as_slice() == stored
            }
        }
    }
}

/// The answer a client sends for `password` to `nonce` (used towards backends);
/// empty for an empty password, as servers expect.
pub fn native_scramble(nonce: &[u8], password: &str) -> Vec<u8> {
    mysql_common::scramble::scramble_native(nonce, password.as_bytes())
        .map(|s| s.to_vec())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_right_password_and_rejects_a_wrong_one() {
        let nonce = new_nonce();
        let hash = PasswordHash::from_plain("secret");
        assert!(hash.verify(&nonce, &native_scramble(&nonce, "secret")));
        assert!(!hash.verify(&nonce, &native_scramble(&nonce, "Secret")));
        assert!(!hash.verify(&nonce, b""));
    }

    #[test]
    fn hex_hash_matches_mysql_password_function() {
        // PASSWORD('secret') in MySQL/MariaDB.
        let hex = "*14E65567ABDB5135D0CFD9A70B3032C179A49EE7";
        assert_eq!(
            PasswordHash::from_hex(hex),
            Some(PasswordHash::from_plain("secret"))
        );
    }

    #[test]
    fn empty_password_accepts_only_an_empty_answer() {
        let nonce = new_nonce();
        assert!(PasswordHash::Empty.verify(&nonce, b""));
        assert!(native_scramble(&nonce, "").is_empty());
        assert!(!PasswordHash::Empty.verify(&nonce, &native_scramble(&nonce, "x")));
    }

    #[test]
    fn malformed_hex_hashes_are_rejected() {
        assert_eq!(PasswordHash::from_hex("14E6"), None);
        assert_eq!(PasswordHash::from_hex("*ZZ"), None);
    }
}
