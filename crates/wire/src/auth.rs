//! mysql_native_password: the nonce hscale sends and the check of a client's answer.

use rand::Rng;
use sha1::{Digest, Sha1};

pub const NATIVE_PASSWORD: &str = "mysql_native_password";
pub const CACHING_SHA2_PASSWORD: &str = "caching_sha2_password";

/// caching_sha2_password's AuthMoreData after a client's scramble: it
/// matched what the server keeps (fast authentication), or the server needs
/// the password itself (over TLS, or encrypted with its RSA key).
pub const SHA2_FAST_AUTH_SUCCESS: u8 = 0x03;
pub const SHA2_PERFORM_FULL_AUTHENTICATION: u8 = 0x04;
/// The client's request for the server's RSA public key.
pub const SHA2_REQUEST_PUBLIC_KEY: u8 = 0x02;

/// SHA256(SHA256(password)): what caching_sha2_password's fast
/// authentication checks a scramble against.
pub fn sha2_digest(password: &[u8]) -> [u8; 32] {
    sha2::Sha256::digest(sha2::Sha256::digest(password)).into()
}

/// A caching_sha2_password scramble is SHA256(pw) XOR SHA256(SHA256(SHA256(pw)),
/// nonce): XOR with SHA256(digest, nonce) yields SHA256(pw), whose SHA256 must
/// be the digest kept for the user.
pub fn verify_sha2_scramble(digest: &[u8; 32], nonce: &[u8], scramble: &[u8]) -> bool {
    if scramble.len() != 32 {
        return false;
    }
    let mask = sha2::Sha256::new()
        .chain_update(digest)
        .chain_update(nonce)
        .finalize();
    let stage1: Vec<u8> = scramble.iter().zip(mask).map(|(s, m)| s ^ m).collect();
    sha2::Sha256::digest(&stage1).as_slice() == digest
}

/// What a client encrypts with the server's RSA key, and the server decrypts:
/// the password and its NUL, XORed with the nonce repeated.
pub fn xor_with_nonce(data: &[u8], nonce: &[u8]) -> Vec<u8> {
    data.iter()
        .zip(nonce.iter().cycle())
        .map(|(d, n)| d ^ n)
        .collect()
}
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
        PasswordHash::of(password.as_bytes())
    }

    /// The hash of a password as a client sent it (bytes, in its character set).
    pub fn of(password: &[u8]) -> PasswordHash {
        match password.is_empty() {
            true => PasswordHash::Empty,
            false => PasswordHash::DoubleSha1(Sha1::digest(native_stage1(password)).into()),
        }
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
            PasswordHash::DoubleSha1(_) => self.stage1(nonce, answer).is_some(),
        }
    }

    /// SHA1(password), which a right answer reveals to whoever stores
    /// SHA1(SHA1(password)): enough to answer a server that stores the same,
    /// as a proxy must. `None` for a wrong answer or an empty password.
    pub fn stage1(&self, nonce: &[u8], answer: &[u8]) -> Option<[u8; 20]> {
        let PasswordHash::DoubleSha1(stored) = self else {
            return None;
        };
        let mask = Sha1::new()
            .chain_update(nonce)
            .chain_update(stored)
            .finalize();
        let stage1: [u8; 20] =
            std::array::from_fn(|i| answer.get(i).copied().unwrap_or(0) ^ mask[i]);
        let right = answer.len() == 20 && Sha1::digest(stage1).as_slice() == stored;
        right.then_some(stage1)
    }
}

/// SHA1(password): what answers a mysql_native_password challenge.
pub fn native_stage1(password: &[u8]) -> [u8; 20] {
    Sha1::digest(password).into()
}

/// What answers a server's challenge for an account: its password, or only
/// SHA1(password) (`PasswordHash::stage1`).
#[derive(Clone, PartialEq, Eq)]
pub enum Secret {
    Plain(String),
    Stage1([u8; 20]),
}

impl Secret {
    /// The mysql_native_password answer to `nonce`.
    pub fn scramble(&self, nonce: &[u8]) -> Vec<u8> {
        match self {
            Secret::Plain(password) => native_scramble(nonce, password),
            Secret::Stage1(stage1) => {
                let stored = Sha1::digest(stage1);
                let mask = Sha1::new()
                    .chain_update(nonce)
                    .chain_update(stored)
                    .finalize();
                stage1.iter().zip(mask).map(|(s, m)| s ^ m).collect()
            }
        }
    }
}

/// Never printed: logs and panics show that there is one, not what it is.
impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Secret::Plain(_) => f.write_str("Secret::Plain(..)"),
            Secret::Stage1(_) => f.write_str("Secret::Stage1(..)"),
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
    fn a_right_answer_gives_what_answers_a_server_with_the_same_password() {
        let hash = PasswordHash::from_hex("*14E65567ABDB5135D0CFD9A70B3032C179A49EE7").unwrap();
        let client_nonce = new_nonce();
        let answer = native_scramble(&client_nonce, "secret");
        let stage1 = hash.stage1(&client_nonce, &answer).unwrap();
        let server_nonce = new_nonce();
        let to_server = Secret::Stage1(stage1).scramble(&server_nonce);
        assert_eq!(to_server, native_scramble(&server_nonce, "secret"));
        assert!(hash.verify(&server_nonce, &to_server));
        let wrong = native_scramble(&client_nonce, "Secret");
        assert_eq!(hash.stage1(&client_nonce, &wrong), None);
        assert_eq!(
            format!("{:?}", Secret::Plain("secret".into())),
            "Secret::Plain(..)"
        );
    }

    #[test]
    fn a_sha2_scramble_of_the_password_matches_its_digest() {
        let nonce = new_nonce();
        let digest = sha2_digest(b"secret");
        let scramble = mysql_common::scramble::scramble_sha256(&nonce, b"secret").unwrap();
        assert!(verify_sha2_scramble(&digest, &nonce, &scramble));
        let wrong = mysql_common::scramble::scramble_sha256(&nonce, b"Secret").unwrap();
        assert!(!verify_sha2_scramble(&digest, &nonce, &wrong));
        assert!(!verify_sha2_scramble(&digest, &nonce, b""));
        let masked = xor_with_nonce(b"secret\0", &nonce);
        assert_eq!(xor_with_nonce(&masked, &nonce), b"secret\0");
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
