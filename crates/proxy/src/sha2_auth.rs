//! What caching_sha2_password keeps between logins: each user's digest
//! since a full login proved the password (fast authentication), and
//! hscale's RSA key, with which clients without TLS encrypt their password.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// hscale's RSA key pair, and its public key as clients ask for it (PEM).
pub struct RsaKey {
    pub private: rsa::RsaPrivateKey,
    pub public_pem: String,
}

#[derive(Default)]
pub struct Sha2Logins {
    /// SHA256(SHA256(password)) by user.
    digests: Mutex<HashMap<String, [u8; 32]>>,
    /// Made at the first full login that needs it.
    rsa: tokio::sync::OnceCell<Arc<RsaKey>>,
}

impl Sha2Logins {
    /// The RSA key, made on first use (2048 bits, off the runtime's threads).
    pub async fn rsa_key(&self) -> Option<Arc<RsaKey>> {
        let make = || async {
            tokio::task::spawn_blocking(|| {
                use rsa::pkcs8::EncodePublicKey;
                let private = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048).ok()?;
                let public_pem = private
                    .to_public_key()
                    .to_public_key_pem(rsa::pkcs8::LineEnding::LF)
                    .ok()?;
                Some(Arc::new(RsaKey {
                    private,
                    public_pem,
                }))
            })
            .await
            .ok()
            .flatten()
            .ok_or(())
        };
        self.rsa.get_or_try_init(make).await.ok().cloned()
    }

    /// The digest kept for `user`'s fast login.
    pub fn digest(&self, user: &str) -> Option<[u8; 32]> {
        let digests = self.digests.lock().unwrap_or_else(|e| e.into_inner());
        digests.get(user).copied()
    }

    pub fn keep_digest(&self, user: &str, digest: [u8; 32]) {
        let mut digests = self.digests.lock().unwrap_or_else(|e| e.into_inner());
        digests.insert(user.to_owned(), digest);
    }
}
