//! One client's transaction over the backends it reaches, as a state value
//! with no I/O: the session tells it what each backend answered and asks it
//! what to send where — whether a backend joins with the BEGIN it saw or as
//! an XA branch, which writes to refuse, what COMMIT, ROLLBACK and
//! savepoints send to each backend, what a statement that commits by itself
//! needs first, what is left to settle after an error. The session runs
//! what it says and reports back, as `Merger::step` is driven by its rows.
//!
//! Backends are named by slot (their index in the session's list); `Part`
//! is one backend's share of the transaction.

use bytes::Bytes;
use hscale_planner::{Autocommit, SavepointOp, TxEffect};

/// How writes over several backends commit (`[proxy] transactions`).
#[derive(Debug, Clone, Copy, Default, serde::Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Transactions {
    /// In two phases (XA), atomically.
    #[default]
    Atomic,
    /// A transaction's writes stay on one backend; a write on a second is refused.
    Single,
    /// Each backend commits in turn: not atomic.
    Multi,
}

/// One backend's share of the transaction, as its server last said and as
/// hscale opened it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// A transaction is open there, or autocommit is off.
    pub transaction: bool,
    /// The server's last word was that a transaction is open
    /// (SERVER_STATUS_IN_TRANS), or hscale opened one.
    pub open: bool,
    /// The open transaction changed rows there.
    pub wrote: bool,
    /// hscale began an XA branch there and has not ended it: it ends with
    /// XA statements, whatever the status says (a deadlock leaves it
    /// rollback-only, out of the transaction).
    pub xa: bool,
    /// An error came while `open`: it may have ended the transaction, which
    /// an error packet does not say (`Transaction::to_settle`).
    pub unsure: bool,
    /// LOCK TABLES ran there and no UNLOCK TABLES or START TRANSACTION since.
    pub tables_locked: bool,
    /// Statements hscale cannot see into ran in the open transaction there
    /// (several statements, CALL, EXECUTE, the client's own XA): it may
    /// have committed inside, or be the client's XA transaction, so its
    /// COMMIT cannot carry a decision.
    pub unseen: bool,
}

/// What a backend's answer said of the session there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerStatus {
    pub in_transaction: bool,
    pub autocommit: bool,
    /// The connection had taken the session's latest settings: false where
    /// a branch ended before a SET reached it, whose word on autocommit is
    /// not the session's.
    pub settings_current: bool,
}

/// What a statement about to run on a backend does to the transaction
/// there (the session's `Needs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reach {
    /// It ends the transaction where it runs (DDL, SET autocommit = 1).
    pub ends_transaction: bool,
    /// With autocommit off, MariaDB begins a transaction with it (SET and
    /// USE begin none).
    pub may_begin: bool,
    /// It may commit where hscale cannot see (several statements, CALL,
    /// EXECUTE): a transaction it opens must be plain, which MariaDB may
    /// end inside it (an XA branch refuses that with 1399).
    pub plain_branch: bool,
    /// It reads and changes no rows (COM_STMT_PREPARE): it joins no
    /// transaction, and a backend it alone reached needs no commit.
    pub outside: bool,
}

/// What a backend runs before a statement, to be in the transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opening {
    Nothing,
    /// A `BEGIN` in the same write as the statement, with autocommit off:
    /// the statement would open the transaction by itself, but a SAVEPOINT
    /// opens none (the server's status says no transaction, and a branch
    /// begun there later would drop the savepoint). Were the BEGIN to fail,
    /// the statement still runs in a transaction of its own: autocommit is
    /// off.
    QueuedBegin,
    /// The BEGIN the client sent (or START TRANSACTION, for a chained one).
    Begin(Bytes),
    /// `XA START` with the branch's id.
    XaStart,
}

/// Why the transaction cannot take a statement. Backends are named by id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// `transactions = "single"`: a write on a second backend.
    SecondWriter { first: u32, second: u32 },
    /// The transaction began where hscale could not see it (XA START, a
    /// stored procedure, several statements): it cannot reach `backend`.
    UnseenBegin { backend: u32 },
    /// Two writers, `plain`'s a transaction that cannot be prepared.
    Unpreparable { plain: u32, other: u32 },
    /// A statement that may commit out of sight, while `open` hold parts.
    UnseenCommits { what: &'static str, open: Vec<u32> },
    /// A SET of autocommit hscale cannot replay on `open`.
    AutocommitElsewhere { what: &'static str, open: Vec<u32> },
    /// A SET of autocommit to a value hscale cannot read, over XA branches.
    AutocommitOverBranches,
    /// A ROLLBACK TO SAVEPOINT hscale cannot read, on several backends.
    UnreadSavepoint,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |ids: &[u32]| {
            ids.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Refused::SecondWriter { first, second } => write!(
                f,
                "a write on backend {second} in a transaction that wrote on backend {first}: with transactions = \"single\" a transaction writes on one backend"
            ),
            Refused::UnseenBegin { backend } => write!(
                f,
                "a transaction hscale did not see begin (XA START, a stored procedure, a multi-statement query) cannot reach backend {backend}"
            ),
            Refused::Unpreparable { plain, other } => write!(
                f,
                "a transaction that writes on backends {plain} and {other}, where the one on backend {plain} is not an XA branch and cannot carry the commit decision (it began with START TRANSACTION and options, under LOCK TABLES, or beside another such part, or the account may not write the decision there): it writes on one backend"
            ),
            Refused::UnseenCommits { what, open } => write!(
                f,
                "{what} while the transaction is open on backend {} too: a COMMIT or ROLLBACK in it would leave that part behind",
                list(open)
            ),
            Refused::AutocommitElsewhere { what, open } => write!(
                f,
                "a SET of autocommit {what} while the transaction is open on backend {} too: COMMIT first, or SET autocommit = 1 alone",
                list(open)
            ),
            Refused::AutocommitOverBranches => f.write_str(
                "a SET of autocommit to a value hscale cannot read, or beside a user variable, in a transaction over XA branches: COMMIT first, or SET autocommit = 1 alone",
            ),
            Refused::UnreadSavepoint => f.write_str(
                "a ROLLBACK TO SAVEPOINT hscale cannot read, in a transaction on several backends",
            ),
        }
    }
}

/// How a BEGIN / START TRANSACTION runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeginPlan {
    /// hscale answers it; each backend opens the transaction with its
    /// first statement there. `commit_first`: the one in progress is
    /// committed first, as the server would.
    Here { commit_first: bool },
    /// The main backend's server runs it; the others commit first.
    OnServer,
}

/// How COMMIT / ROLLBACK runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndPlan {
    /// Some parts are XA branches (or a chained one will be): ended by the
    /// protocol (`commit_steps`, `rollback_steps`), answered by hscale.
    Branches,
    /// A BEGIN hscale answered that reached no backend: nothing to end.
    Nothing,
    /// The statement runs on each of `quiet`, then on `last`, whose answer
    /// the client gets. Each commits in turn.
    Each { quiet: Vec<usize>, last: usize },
}

/// What a statement that is not transaction control needs first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Before {
    Nothing,
    /// Every XA branch committed (the server cannot end one: 1399); then,
    /// `then_autocommit`, the SET replayed where parts remain
    /// (`autocommit_on_elsewhere`).
    EndBranches {
        then_autocommit: bool,
    },
    /// Commit the other backends' parts (the statement's server commits its own).
    CommitOthers,
    /// A SET of autocommit that commits where it was off: replayed on the
    /// other parts first (`autocommit_on_elsewhere`).
    SetAutocommitElsewhere,
}

/// How the transaction commits on every backend but one (whose server
/// commits it), or everywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitPlan {
    Branches,
    /// A COMMIT on each.
    Each(Vec<usize>),
}

/// One backend's part of a savepoint statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SavepointStep {
    /// The client's statement.
    Statement(usize),
    /// A ROLLBACK of the whole part: the savepoint was set before the
    /// transaction reached that backend.
    WholeRollback(usize),
    /// The same for an XA branch: XA END and XA ROLLBACK.
    RollBackBranch(usize),
}

/// A savepoint the client set, and the parts it is set on.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Savepoint {
    name: String,
    slots: Vec<usize>,
}

/// A ROLLBACK TO or RELEASE of a savepoint hscale does not know, while
/// other backends than the main one hold parts: MariaDB's own answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoSuchSavepoint;

/// The transaction in progress. `R`: what keeps an XA transaction's
/// number registered while it runs (the proxy's `xa::Running`).
#[derive(Debug)]
pub struct Transaction<R> {
    mode: Transactions,
    /// The backends' ids, by slot.
    ids: Vec<u32>,
    main: usize,
    parts: Vec<Part>,
    /// The BEGIN / START TRANSACTION that opened it, as a command: each
    /// backend it reaches later opens it too.
    begin: Option<Bytes>,
    /// hscale answered the BEGIN and no backend has the transaction yet:
    /// the first it reaches opens it (with its first read, in the same
    /// write). Once one has, the backends' status says whether it is open.
    begun_here: bool,
    /// Its parts are XA branches where it reaches a backend (a BEGIN
    /// hscale answered, with several backends in atomic mode).
    xa_begin: bool,
    /// The backends' last word on autocommit: with it off, a backend the
    /// transaction reaches opens it by itself.
    autocommit: bool,
    /// Oldest first.
    savepoints: Vec<Savepoint>,
    /// A connection lost in the middle of it took its part along: the rest
    /// is rolled back before the next command.
    lost: bool,
    /// The XA transaction's number, once a branch began.
    running: Option<R>,
    /// Whether the client's account may write the commit decision on each
    /// backend (`None`: not known yet): there its part may be the plain
    /// one that carries the decision (`Step::RecordIn`).
    recordable: Vec<Option<bool>>,
}

impl<R> Transaction<R> {
    /// `ids`: the backends' ids, by slot; `main`: the slot whose server
    /// answers what no other backend needs to see.
    pub fn new(mode: Transactions, ids: Vec<u32>, main: usize) -> Transaction<R> {
        let backends = ids.len();
        Transaction {
            mode,
            main,
            parts: vec![Part::default(); ids.len()],
            ids,
            begin: None,
            begun_here: false,
            xa_begin: false,
            autocommit: true,
            savepoints: Vec::new(),
            lost: false,
            running: None,
            recordable: vec![None; backends],
        }
    }

    /// COM_RESET_CONNECTION, COM_CHANGE_USER: every connection went, and
    /// its part with it.
    pub fn reset(&mut self) {
        *self = Transaction::new(self.mode, std::mem::take(&mut self.ids), self.main);
    }

    /// Whether the first part a transaction opens on `slot` would be its
    /// plain part, were the account known to write the decision there.
    pub fn asks_recordable(&self, slot: usize) -> bool {
        self.recordable[slot].is_none() && self.opens_branches() && self.nothing_reached()
    }

    pub fn set_recordable(&mut self, slot: usize, recordable: bool) {
        self.recordable[slot] = Some(recordable);
    }

    /// No backend holds a part yet: the next one reached opens the first.
    fn nothing_reached(&self) -> bool {
        !self.parts.iter().any(|p| p.open || p.xa)
    }

    /// The backend of the transaction's plain part, which may carry the
    /// decision (`Xid::decided_on`) if it writes.
    pub fn plain_part(&self) -> Option<u32> {
        (0..self.parts.len())
            .find(|&slot| self.parts[slot].open && !self.parts[slot].xa)
            .map(|slot| self.ids[slot])
    }

    pub fn part(&self, slot: usize) -> &Part {
        &self.parts[slot]
    }

    pub fn autocommit(&self) -> bool {
        self.autocommit
    }

    pub fn in_transaction(&self) -> bool {
        self.begun_here || self.parts.iter().any(|p| p.transaction)
    }

    /// Some backend is in the transaction (a BEGIN hscale answered is not
    /// yet).
    pub fn reached_any(&self) -> bool {
        self.parts.iter().any(|p| p.transaction)
    }

    /// The backend's connection holds a part: it stays with the client.
    pub fn holds(&self, slot: usize) -> bool {
        self.parts[slot].transaction || self.parts[slot].xa
    }

    /// The slots whose backends are in the transaction.
    pub fn slots(&self) -> Vec<usize> {
        (0..self.parts.len())
            .filter(|&slot| self.parts[slot].transaction)
            .collect()
    }

    pub fn has_branches(&self) -> bool {
        self.parts.iter().any(|p| p.xa)
    }

    pub fn tables_locked(&self) -> bool {
        self.parts.iter().any(|p| p.tables_locked)
    }

    /// The transactions this session opens are XA branches: atomic mode
    /// with several backends.
    fn opens_branches(&self) -> bool {
        self.mode == Transactions::Atomic && self.parts.len() > 1
    }

    /// The XA transaction's number, begun by `start` if none runs yet.
    pub fn running_or(&mut self, start: impl FnOnce() -> R) -> &R {
        self.running.get_or_insert_with(start)
    }

    /// An autocommitted statement's write over `slots` is one XA
    /// transaction of its own.
    pub fn statement_is_atomic(&self, slots: &[usize]) -> bool {
        self.mode == Transactions::Atomic
            && !self.in_transaction()
            && slots.iter().any(|&slot| slot != slots[0])
    }

    // What the servers said.

    /// A backend's answer, with its status flags.
    pub fn observe(&mut self, slot: usize, status: Option<ServerStatus>) {
        if let Some(status) = status {
            if status.in_transaction {
                // A backend has it now (one that opened it by itself, with
                // autocommit off, too).
                self.begun_here = false;
            }
            let part = &mut self.parts[slot];
            part.open = status.in_transaction;
            part.transaction = part.open || !status.autocommit;
            if status.settings_current {
                self.autocommit = status.autocommit;
            }
            if !part.open {
                // With autocommit off too: the transaction that wrote ended.
                part.wrote = false;
                part.unseen = false;
            }
        }
        if !self.in_transaction() {
            self.begin = None;
            self.savepoints.clear();
        }
    }

    /// An error answer: inside a transaction over several backends it may
    /// have ended this part (a deadlock), which the error does not say.
    pub fn failed(&mut self, slot: usize) {
        let several = self.parts.len() > 1;
        let part = &mut self.parts[slot];
        if part.open && several {
            part.unsure = true;
        }
    }

    /// The backend's connection is gone, and its server rolled back the
    /// part it held.
    pub fn lost(&mut self, slot: usize) {
        self.lost |= self.parts[slot].open;
        self.parts[slot] = Part::default();
    }

    /// Statements hscale cannot see into run there.
    pub fn runs_unseen(&mut self, slot: usize) {
        self.parts[slot].unseen = true;
    }

    /// A write ran there.
    pub fn wrote(&mut self, slot: usize) {
        let part = &mut self.parts[slot];
        if part.transaction {
            part.wrote = true;
        }
    }

    pub fn set_tables_locked(&mut self, slot: usize, locked: bool) {
        self.parts[slot].tables_locked = locked;
    }

    // Reaching a backend.

    /// What `slot` runs first to join the transaction, before a statement
    /// that reaches it as `reach` says.
    pub fn opening(&self, slot: usize, reach: Reach) -> Result<Opening, Refused> {
        if reach.outside {
            return Ok(Opening::Nothing);
        }
        let part = &self.parts[slot];
        let joins = !part.transaction && self.in_transaction();
        if joins && self.begin.is_none() && self.autocommit {
            // What ran here would run outside the transaction.
            return Err(Refused::UnseenBegin {
                backend: self.ids[slot],
            });
        }
        // An XA branch opens where a transaction hscale answered the BEGIN
        // of reaches a backend, and with autocommit off where a backend has
        // no transaction open yet; but the first part is a plain one where
        // it may carry the decision (a transaction that stays on one
        // backend sends no XA statement).
        let plain_first = self.nothing_reached() && self.recordable[slot] == Some(true);
        let starts_branch = self.opens_branches()
            && !reach.ends_transaction
            && !reach.plain_branch
            && !part.xa
            && !part.open
            && !part.tables_locked
            && !plain_first
            && ((joins && self.xa_begin) || (!self.autocommit && reach.may_begin));
        if starts_branch {
            return Ok(Opening::XaStart);
        }
        // A statement that ends the transaction opens none (in atomic mode
        // a plain part would be a branch that cannot be prepared).
        match &self.begin {
            Some(begin) if joins && !(self.xa_begin && reach.ends_transaction) => {
                Ok(Opening::Begin(begin.clone()))
            }
            _ if plain_first && !self.autocommit && reach.may_begin && !reach.ends_transaction => {
                Ok(Opening::QueuedBegin)
            }
            _ => Ok(Opening::Nothing),
        }
    }

    /// `slot` ran its opening: the transaction is open there.
    pub fn opened(&mut self, slot: usize, xa: bool) {
        let part = &mut self.parts[slot];
        part.transaction = true;
        part.open = true;
        part.xa = xa;
        self.begun_here = false;
    }

    /// Whether a write on `slots` may run: `transactions = "single"` keeps
    /// a transaction's writes on one backend; atomic mode takes one writer
    /// that is not an XA branch (its commit carries the decision) but
    /// refuses a second, and one under LOCK TABLES or where the account
    /// cannot write the decision.
    pub fn check_writers(&self, slots: &[usize]) -> Result<(), Refused> {
        match self.mode {
            Transactions::Multi => return Ok(()),
            // A statement outside a transaction commits in two phases.
            Transactions::Atomic if !self.in_transaction() => return Ok(()),
            Transactions::Atomic | Transactions::Single => {}
        }
        let mut writers: Vec<usize> = (0..self.parts.len())
            .filter(|&slot| self.parts[slot].wrote && self.parts[slot].transaction)
            .collect();
        for &slot in slots {
            if !writers.contains(&slot) {
                writers.push(slot);
            }
        }
        if writers.len() < 2 {
            return Ok(());
        }
        if self.mode == Transactions::Single {
            return Err(Refused::SecondWriter {
                first: self.ids[writers[0]],
                second: self.ids[writers[1]],
            });
        }
        // The parts that are not XA branches, or will not be: one not
        // reached yet opens as a branch, or as the plain part if it is the
        // first and may carry the decision.
        let mut plain_taken = self.plain_part().is_some();
        let mut plain = Vec::new();
        for &slot in &writers {
            let part = &self.parts[slot];
            let is_plain = match (part.xa, part.open) {
                (true, _) => false,
                (false, true) => true,
                (false, false) => {
                    let opens_branch = !part.tables_locked
                        && (self.xa_begin || !self.autocommit)
                        && self.opens_branches();
                    let first = !plain_taken && self.recordable[slot] == Some(true);
                    plain_taken |= first;
                    !opens_branch || first
                }
            };
            if is_plain {
                plain.push(slot);
            }
        }
        let carries_decision = |slot: usize| {
            let part = &self.parts[slot];
            !part.tables_locked
                && !part.unseen
                && self.recordable[slot] == Some(true)
                && self.opens_branches()
        };
        match plain[..] {
            [] => Ok(()),
            [last] if carries_decision(last) => Ok(()),
            [first, ..] => {
                let other = *writers.iter().find(|&&w| w != first).expect("two writers");
                Err(Refused::Unpreparable {
                    plain: self.ids[first],
                    other: self.ids[other],
                })
            }
        }
    }

    /// A statement that may commit or roll back where hscale cannot see
    /// (`what`) could leave another backend's part behind: refused while
    /// another backend holds one.
    pub fn check_unseen_commits(&self, slot: usize, what: &'static str) -> Result<(), Refused> {
        let open = self.open_except(slot);
        match open.is_empty() {
            true => Ok(()),
            false => Err(Refused::UnseenCommits { what, open }),
        }
    }

    /// The ids of the backends but `slot`'s where the transaction is open.
    fn open_except(&self, slot: usize) -> Vec<u32> {
        (0..self.parts.len())
            .filter(|&other| other != slot && self.parts[other].open)
            .map(|other| self.ids[other])
            .collect()
    }

    // BEGIN, COMMIT, ROLLBACK.

    pub fn begin_plan(&self, deferred: bool) -> BeginPlan {
        match deferred && (self.opens_branches() || !self.in_transaction()) {
            // In atomic mode the BEGIN commits what is in progress (XA
            // branches only hscale can), and the new transaction's parts
            // are XA branches, autocommit on or off.
            true => BeginPlan::Here {
                commit_first: self.in_transaction(),
            },
            false => BeginPlan::OnServer,
        }
    }

    /// hscale answered a BEGIN: each backend the transaction reaches opens
    /// it with its first statement there.
    pub fn begun_here(&mut self, begin: Bytes) {
        self.begin = Some(begin);
        self.begun_here = true;
        self.xa_begin = self.opens_branches();
    }

    /// The main backend's server ran `begin`: backends the transaction
    /// reaches later open it too.
    pub fn begun_on_server(&mut self, begin: Bytes) {
        self.set_tables_locked(self.main, false);
        // It committed the transaction before, and its savepoints.
        self.savepoints.clear();
        if self.in_transaction() {
            self.begin = Some(begin);
        }
    }

    pub fn end_plan(&self, plain: bool, chain: bool, release: bool) -> EndPlan {
        // A chained transaction begins as a BEGIN hscale answered, so that
        // its parts are XA branches too.
        if self.has_branches() || (chain && self.opens_branches()) {
            return EndPlan::Branches;
        }
        // AND NO CHAIN, NO RELEASE: as plain.
        let plain = plain || (!chain && !release);
        if self.begun_here && plain {
            return EndPlan::Nothing;
        }
        let mut quiet = self.slots();
        let last = quiet.pop().unwrap_or(self.main);
        EndPlan::Each { quiet, last }
    }

    /// A BEGIN hscale answered ended before it reached a backend.
    pub fn ended_unbegun(&mut self) {
        self.begun_here = false;
        self.begin = None;
        self.savepoints.clear();
    }

    /// A COMMIT or ROLLBACK ran on each part (`EndPlan::Each`).
    pub fn ended_each(&mut self, start_transaction: impl FnOnce() -> Bytes) {
        // Its savepoints end with it, chained or not.
        self.savepoints.clear();
        if self.in_transaction() && self.autocommit && self.begin.is_none() {
            // Chained from no transaction hscale saw begin: a plain one,
            // which later backends can open too.
            self.begin = Some(start_transaction());
        }
    }

    /// The parts to end by the protocol, with their XA number (a new one if
    /// none began: it is ended all the same).
    pub fn branches(&mut self, start: impl FnOnce() -> R) -> (Vec<(usize, crate::Branch)>, R) {
        let branches = (0..self.parts.len())
            .filter(|&slot| self.parts[slot].xa || self.parts[slot].open)
            .map(|slot| {
                let part = &self.parts[slot];
                (
                    slot,
                    crate::Branch {
                        backend: self.ids[slot],
                        xa: part.xa,
                        wrote: part.wrote,
                    },
                )
            })
            .collect();
        let running = self.running.take().unwrap_or_else(start);
        (branches, running)
    }

    /// `slot`'s branch ended (committed or rolled back, by XA statements).
    pub fn branch_ended(&mut self, slot: usize) {
        self.parts[slot].xa = false;
        self.parts[slot].wrote = false;
    }

    /// Every branch ended; `autocommit` is the session's (a connection that
    /// ended its branch may not have taken its latest SET).
    pub fn branches_ended(&mut self, autocommit: bool) {
        for slot in 0..self.parts.len() {
            self.branch_ended(slot);
        }
        self.autocommit = autocommit;
        self.lost = false;
        self.savepoints.clear();
        self.xa_begin = false;
        // Also a BEGIN hscale answered that reached no backend.
        self.begun_here = false;
    }

    /// COMMIT AND CHAIN over branches: the next transaction begins as a
    /// BEGIN hscale answered.
    pub fn chain(&mut self, start_transaction: impl FnOnce() -> Bytes) {
        if self.autocommit {
            self.begin = Some(start_transaction());
            self.begun_here = true;
            self.xa_begin = true;
        }
    }

    /// What a statement with `effect` on `slot` needs first.
    pub fn before(&mut self, slot: usize, effect: TxEffect) -> Result<Before, Refused> {
        let ends = match effect {
            TxEffect::CommitsFirst => true,
            TxEffect::SetsAutocommit { to, .. } => to == Autocommit::On && !self.autocommit,
            TxEffect::None | TxEffect::Hides(_) | TxEffect::ClientXa => false,
        };
        if ends && self.xa_begin && self.begun_here {
            // A BEGIN hscale answered, which reached no backend yet: the
            // statement ends it before it began anywhere.
            self.begun_here = false;
            self.xa_begin = false;
        }
        if ends {
            // Its savepoints end with it, also where autocommit off keeps
            // the server's status "in a transaction".
            self.savepoints.clear();
        }
        if self.has_branches() {
            return match effect {
                TxEffect::CommitsFirst => Ok(Before::EndBranches {
                    then_autocommit: false,
                }),
                TxEffect::SetsAutocommit {
                    to: Autocommit::On,
                    user_variable: false,
                } if !self.autocommit => Ok(Before::EndBranches {
                    then_autocommit: true,
                }),
                TxEffect::SetsAutocommit {
                    to: Autocommit::On | Autocommit::Unread,
                    ..
                } if !self.autocommit => Err(Refused::AutocommitOverBranches),
                _ => Ok(Before::Nothing),
            };
        }
        let others =
            (0..self.parts.len()).any(|other| other != slot && self.parts[other].transaction);
        Ok(match effect {
            _ if !others => Before::Nothing,
            TxEffect::SetsAutocommit { .. } if !self.autocommit => Before::SetAutocommitElsewhere,
            TxEffect::CommitsFirst => Before::CommitOthers,
            _ => Before::Nothing,
        })
    }

    /// A SET that turns autocommit on commits the transaction (MariaDB
    /// does where it was off): the slots where the same SET runs first,
    /// committing their parts; refused where hscale cannot replay it (a
    /// user variable, a value it cannot read) and other parts are open.
    pub fn autocommit_on_elsewhere(
        &self,
        slot: usize,
        to: Autocommit,
        user_variable: bool,
    ) -> Result<Vec<usize>, Refused> {
        let refuse = |what: &'static str| {
            let open = self.open_except(slot);
            match open.is_empty() {
                // Nothing to commit there: the backends take the setting later.
                true => Ok(Vec::new()),
                false => Err(Refused::AutocommitElsewhere { what, open }),
            }
        };
        match to {
            Autocommit::Off => Ok(Vec::new()),
            Autocommit::Unread => refuse("to a value hscale cannot read"),
            Autocommit::On if user_variable => {
                refuse("beside a user variable, which only one connection keeps")
            }
            Autocommit::On => Ok(self.slots().into_iter().filter(|&s| s != slot).collect()),
        }
    }

    /// How to commit every part but `except`'s (whose server commits it).
    pub fn commit_plan(&self, except: Option<usize>) -> CommitPlan {
        match self.has_branches() {
            true => CommitPlan::Branches,
            false => CommitPlan::Each(
                self.slots()
                    .into_iter()
                    .filter(|&slot| Some(slot) != except)
                    .collect(),
            ),
        }
    }

    /// `CommitPlan::Each` ran.
    pub fn committed_each(&mut self) {
        self.savepoints.clear();
        self.begun_here = false;
    }

    // After an error.

    /// Whether a part may have ended without a word (`to_settle`).
    pub fn unsettled(&self) -> bool {
        self.lost || self.parts.iter().any(|p| p.unsure)
    }

    /// The parts an error may have ended, to ask their servers; and whether
    /// a lost connection ended the transaction already.
    pub fn to_settle(&mut self) -> (Vec<usize>, bool) {
        let unsure = (0..self.parts.len())
            .filter(|&slot| std::mem::take(&mut self.parts[slot].unsure))
            .collect();
        (unsure, std::mem::take(&mut self.lost))
    }

    /// Whether `slot`'s server says its part ended (after `to_settle`).
    pub fn ended_on(&self, slot: usize) -> bool {
        !self.parts[slot].open
    }

    /// The transaction ended on one backend and was rolled back on all.
    pub fn settled(&mut self) {
        self.lost = false;
        self.begun_here = false;
        self.savepoints.clear();
        if !self.in_transaction() {
            self.begin = None;
        }
    }

    // Savepoints.

    /// What SAVEPOINT, ROLLBACK TO or RELEASE `name` runs on each backend;
    /// the last step's answer is the client's.
    pub fn savepoint_steps(
        &self,
        op: SavepointOp,
        name: &str,
    ) -> Result<Vec<SavepointStep>, NoSuchSavepoint> {
        let open = self.slots();
        let known = self.savepoints.iter().position(|s| s.name == name);
        let mut steps: Vec<SavepointStep> = match (op, known) {
            (SavepointOp::Set, _) => match open.is_empty() {
                // The main backend opens the transaction with it.
                true => vec![SavepointStep::Statement(self.main)],
                false => open
                    .iter()
                    .map(|&slot| SavepointStep::Statement(slot))
                    .collect(),
            },
            // Only the server can say what it knows of the name.
            (_, None) if open.iter().all(|&slot| slot == self.main) => {
                vec![SavepointStep::Statement(self.main)]
            }
            // Not set, or gone. (One set inside a multi-statement query is
            // not known here: an error, never a rollback on one backend only.)
            (_, None) => return Err(NoSuchSavepoint),
            (SavepointOp::RollbackTo, Some(i)) => {
                let set_on = &self.savepoints[i].slots;
                let whole = |slot: usize| match self.parts[slot].xa {
                    true => SavepointStep::RollBackBranch(slot),
                    false => SavepointStep::WholeRollback(slot),
                };
                // Whole rollbacks first: the client's answer is the savepoint's.
                let (set, unset): (Vec<usize>, Vec<usize>) =
                    open.iter().partition(|slot| set_on.contains(slot));
                unset
                    .into_iter()
                    .map(whole)
                    .chain(set.into_iter().map(SavepointStep::Statement))
                    .collect()
            }
            (SavepointOp::Release, Some(i)) => open
                .iter()
                .filter(|slot| self.savepoints[i].slots.contains(slot))
                .map(|&slot| SavepointStep::Statement(slot))
                .collect(),
        };
        if !matches!(steps.last(), Some(SavepointStep::Statement(_))) {
            // No backend holds the savepoint any more: the server says so.
            steps.push(SavepointStep::Statement(self.main));
        }
        Ok(steps)
    }

    /// The savepoint statement succeeded.
    pub fn savepoint_done(&mut self, op: SavepointOp, name: String) {
        let known = self.savepoints.iter().position(|s| s.name == name);
        match (op, known) {
            // Outside a transaction a savepoint is gone at once.
            (SavepointOp::Set, _) if !self.in_transaction() => {}
            (SavepointOp::Set, _) => {
                // Setting a name again moves it.
                self.savepoints.retain(|s| s.name != name);
                let slots = self.slots();
                self.savepoints.push(Savepoint { name, slots });
            }
            (SavepointOp::RollbackTo, Some(i)) => self.savepoints.truncate(i + 1),
            // It and those set after it are gone.
            (SavepointOp::Release, Some(i)) => self.savepoints.truncate(i),
            (_, None) => {}
        }
    }

    /// A ROLLBACK TO SAVEPOINT hscale cannot read: only where the main
    /// backend alone holds the transaction, whose server answers it.
    pub fn check_unread_savepoint(&self) -> Result<(), Refused> {
        match self.slots().iter().any(|&slot| slot != self.main) {
            true => Err(Refused::UnreadSavepoint),
            false => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
