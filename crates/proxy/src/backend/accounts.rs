//! The accounts hscale logs in to backends as: its own service account (each
//! backend's `user` / `password`: the dictionary, admin commands, moves) and
//! one per client user (`backend_user` / `backend_password`), so that every
//! client statement runs with the grants of its user's account, enforced by
//! the backends themselves.

use std::collections::HashMap;
use std::sync::OnceLock;

use hscale_wire::auth::{PasswordHash, Secret};

use crate::config::{BackendConfig, UserConfig};

/// An index into `Accounts`; `SERVICE` is the backend's own account.
pub type AccountId = u16;

pub const SERVICE: AccountId = 0;

/// A client user's backend account.
struct Account {
    user: String,
    secret: AccountSecret,
}

enum AccountSecret {
    Known(Secret),
    /// Only a `*HEX` hash is configured: SHA1(password), as the user's first
    /// login proves it.
    Learned(OnceLock<[u8; 20]>),
}

/// Every client user's backend account; users configured with the same
/// account and password share one (and so their idle connections).
#[derive(Default)]
pub struct Accounts {
    accounts: Vec<Account>,
    by_user: HashMap<String, AccountId>,
}

impl Accounts {
    pub fn new(users: &[UserConfig]) -> Accounts {
        let mut accounts = Accounts::default();
        for user in users {
            let name = user
                .backend_user
                .clone()
                .unwrap_or_else(|| user.name.clone());
            let secret = match (&user.backend_password, user.password_hash()) {
                (Some(password), _) => AccountSecret::Known(Secret::Plain(password.clone())),
                (None, Some(PasswordHash::DoubleSha1(_))) if user.password.starts_with('*') => {
                    AccountSecret::Learned(OnceLock::new())
                }
                (None, _) => AccountSecret::Known(Secret::Plain(user.password.clone())),
            };
            // Ids count from 1: 0 is the service account.
            let shared = accounts.accounts.iter().position(|a| {
                a.user == name
                    && matches!((&a.secret, &secret), (AccountSecret::Known(x), AccountSecret::Known(y)) if x == y)
            });
            let shared = shared.map(|at| at + 1);
            let id = shared.unwrap_or_else(|| {
                accounts.accounts.push(Account { user: name, secret });
                accounts.accounts.len()
            });
            accounts.by_user.insert(user.name.clone(), id as AccountId);
        }
        accounts
    }

    /// The account a client user's statements run as.
    pub fn of_user(&self, user: &str) -> AccountId {
        self.by_user.get(user).copied().unwrap_or(SERVICE)
    }

    /// Records what a user's login proved, where the account needs it.
    pub fn learn(&self, id: AccountId, stage1: [u8; 20]) {
        if let Some(AccountSecret::Learned(learned)) = self.account(id).map(|a| &a.secret) {
            let _ = learned.set(stage1);
        }
    }

    /// Who to log in as on `backend` for `id`, and how to answer its
    /// challenge; the account's user name alone while a learned secret is
    /// not known yet.
    pub fn login(
        &self,
        backend: &BackendConfig,
        id: AccountId,
    ) -> Result<(String, Secret), String> {
        let Some(account) = self.account(id) else {
            return Ok((
                backend.user.clone(),
                Secret::Plain(backend.password.clone()),
            ));
        };
        let secret = match &account.secret {
            AccountSecret::Known(secret) => secret.clone(),
            AccountSecret::Learned(learned) => match learned.get() {
                Some(stage1) => Secret::Stage1(*stage1),
                None => return Err(account.user.clone()),
            },
        };
        Ok((account.user.clone(), secret))
    }

    fn account(&self, id: AccountId) -> Option<&Account> {
        (id != SERVICE).then(|| self.accounts.get(usize::from(id) - 1))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, password: &str) -> UserConfig {
        UserConfig {
            name: name.into(),
            password: password.into(),
            ..Default::default()
        }
    }

    fn backend() -> BackendConfig {
        crate::config::Config::parse(
            "[proxy]\nlisten = \"127.0.0.1:1\"\n[[users]]\nname = \"x\"\n[[backends]]\nid = 1\naddress = \"127.0.0.1:2\"\nuser = \"hscale\"\npassword = \"service\"\n",
        )
        .unwrap()
        .backends
        .remove(0)
    }

    #[test]
    fn users_run_as_their_own_account_unless_told_otherwise() {
        let mut shared = user("batch", "pw");
        shared.backend_user = Some("app".into());
        shared.backend_password = Some("app-pw".into());
        let mut also_app = user("web", "other");
        also_app.backend_user = Some("app".into());
        also_app.backend_password = Some("app-pw".into());
        let accounts = Accounts::new(&[user("alice", "secret"), shared, also_app]);
        let login = |user: &str| accounts.login(&backend(), accounts.of_user(user)).unwrap();
        assert_eq!(
            login("alice"),
            ("alice".into(), Secret::Plain("secret".into()))
        );
        assert_eq!(
            login("batch"),
            ("app".into(), Secret::Plain("app-pw".into()))
        );
        assert_eq!(accounts.of_user("batch"), accounts.of_user("web"));
        assert_ne!(accounts.of_user("batch"), accounts.of_user("alice"));
        assert_eq!(
            accounts.login(&backend(), SERVICE).unwrap(),
            ("hscale".into(), Secret::Plain("service".into()))
        );
    }

    #[test]
    fn a_hashed_password_is_answered_once_a_login_proved_it() {
        let accounts = Accounts::new(&[user("carol", "*14E65567ABDB5135D0CFD9A70B3032C179A49EE7")]);
        let carol = accounts.of_user("carol");
        assert_eq!(accounts.login(&backend(), carol), Err("carol".into()));
        accounts.learn(carol, [7; 20]);
        assert_eq!(
            accounts.login(&backend(), carol).unwrap(),
            ("carol".into(), Secret::Stage1([7; 20]))
        );
    }
}
