//! Transactions over several backends, as pure logic: one client's
//! transaction as a state value (`Transaction`), which statements a
//! write that spans backends sends to each (XA START, END, PREPARE, COMMIT,
//! ROLLBACK), how its branches are named so that any hscale instance can
//! find them again (`Xid`), and what recovery does with a branch that was
//! prepared and left behind (`resolve`). The proxy runs the statements and
//! keeps the decisions in the dictionary.
//!
//! The protocol is two-phase commit with presumed abort: every branch is
//! prepared first; then one row in the dictionary (`Decision::Commit`) makes
//! the transaction's outcome durable; then each branch commits. A prepared
//! branch without that row is rolled back by recovery, which first writes
//! `Decision::Abort` under the same key, so that an owner that was only
//! slow can no longer decide to commit (its insert of the row fails).

use std::fmt;

pub mod deadlock;
mod machine;
pub use machine::{
    Before, BeginPlan, CommitPlan, EndPlan, NoSuchSavepoint, Opening, Part, Reach, Refused,
    SavepointStep, ServerStatus, Transaction, Transactions,
};

/// The XA format id of hscale's branches: `XA RECOVER` lists every
/// prepared branch on a server, those of other coordinators (a client's own
/// XA statements) too; hscale resolves only its own.
pub const FORMAT_ID: u32 = hscale_planner::XA_FORMAT_ID;

/// The id of one branch: the transaction (`gtrid`: the instance that
/// coordinates it and its sequence there) and the backend it runs on, with
/// the backend of the transaction's plain part if it has one (`bqual`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Xid {
    pub instance: String,
    pub sequence: u64,
    /// The backend whose plain part may carry the decision
    /// (`Step::RecordIn`): recovery looks for it there too.
    pub decided_on: Option<u32>,
    pub backend: u32,
}

impl Xid {
    /// The transaction's id, shared by its branches: the decision's key.
    pub fn gtrid(&self) -> String {
        format!("{}:{}", self.instance, self.sequence)
    }

    /// The branch's qualifier: its backend, and where the plain part is.
    fn bqual(&self) -> String {
        match self.decided_on {
            None => self.backend.to_string(),
            Some(on) => format!("{}:{on}", self.backend),
        }
    }

    /// The branch's id as XA statements write it. Instance names are made
    /// of letters, digits and dashes (`valid_instance`): no quoting needed.
    pub fn sql(&self) -> String {
        format!("'{}','{}',{FORMAT_ID}", self.gtrid(), self.bqual())
    }

    /// A branch as `XA RECOVER` lists it: its format id, the lengths of its
    /// gtrid and bqual, and both, joined. `None` for branches that are not
    /// hscale's.
    pub fn recovered(
        format_id: u32,
        gtrid_length: usize,
        bqual_length: usize,
        data: &[u8],
    ) -> Option<Xid> {
        if format_id != FORMAT_ID || data.len() != gtrid_length + bqual_length {
            return None;
        }
        let gtrid = std::str::from_utf8(&data[..gtrid_length]).ok()?;
        let bqual = std::str::from_utf8(&data[gtrid_length..]).ok()?;
        let (instance, sequence) = gtrid.rsplit_once(':')?;
        if !valid_instance(instance) {
            return None;
        }
        let (backend, decided_on) = match bqual.split_once(':') {
            Some((backend, on)) => (backend, Some(on.parse().ok()?)),
            None => (bqual, None),
        };
        Some(Xid {
            instance: instance.to_string(),
            sequence: sequence.parse().ok()?,
            decided_on,
            backend: backend.parse().ok()?,
        })
    }
}

impl fmt::Display for Xid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.gtrid(), self.backend)
    }
}

/// Whether an instance name can be written into an XA id as it is.
pub fn valid_instance(instance: &str) -> bool {
    !instance.is_empty()
        && instance.len() <= 40
        && instance
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// The statements of one branch, in the order they run.
pub mod statements {
    use super::Xid;

    /// Opens the branch, before the first statement on its backend.
    pub fn start(xid: &Xid) -> String {
        format!("XA START {}", xid.sql())
    }

    /// Ends and prepares it: after this the server keeps it across a lost
    /// connection and a restart until XA COMMIT or XA ROLLBACK.
    pub fn prepare(xid: &Xid) -> [String; 2] {
        [
            format!("XA END {}", xid.sql()),
            format!("XA PREPARE {}", xid.sql()),
        ]
    }

    pub fn commit(xid: &Xid) -> String {
        format!("XA COMMIT {}", xid.sql())
    }

    /// Rolls back a branch, prepared or not (`ended`: XA END ran).
    pub fn rollback(xid: &Xid, ended: bool) -> Vec<String> {
        let mut statements = Vec::with_capacity(2);
        if !ended {
            statements.push(format!("XA END {}", xid.sql()));
        }
        statements.push(format!("XA ROLLBACK {}", xid.sql()));
        statements
    }
}

/// A backend a transaction reached, as its end sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Branch {
    pub backend: u32,
    /// Opened with XA START; otherwise a plain transaction (BEGIN, or
    /// autocommit off), which cannot be prepared.
    pub xa: bool,
    /// It changed rows.
    pub wrote: bool,
}

/// One step of ending a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Statements for each backend, the backends at once; each backend's in
    /// order, one write. An error fails the step.
    Run(Vec<(u32, Vec<String>)>),
    /// The commit decision, made durable in the dictionary: past it, the
    /// transaction commits whatever fails.
    Record,
    /// The commit decision, written in the plain part on this backend as
    /// that part commits, in one query: the decision is durable exactly
    /// when the part is (a last resource: the one writer that is not an XA
    /// branch commits in one phase between the others' two).
    RecordIn(u32),
}

/// How a transaction `xid` names (its `backend` aside) that reached
/// `branches` commits: in one phase when at most one branch wrote (no XA
/// round trip: a branch that only read commits beside it), in two when
/// several did: the XA writers prepared, the decision recorded — in the
/// plain writer's part as it commits if there is one, else in the
/// dictionary — and the XA writers committed. `None` when two plain parts
/// wrote: nothing can make that atomic (the session refuses the write that
/// would lead there).
pub fn commit_steps(xid: &Xid, branches: &[Branch]) -> Option<Vec<Step>> {
    let xid = |branch: &Branch| Xid {
        backend: branch.backend,
        ..xid.clone()
    };
    let writers = branches.iter().filter(|b| b.wrote).count();
    if writers <= 1 {
        let each = branches
            .iter()
            .map(|branch| {
                let statements = match branch.xa {
                    true => vec![
                        format!("XA END {}", xid(branch).sql()),
                        format!("XA COMMIT {} ONE PHASE", xid(branch).sql()),
                    ],
                    false => vec!["COMMIT".to_string()],
                };
                (branch.backend, statements)
            })
            .collect();
        return Some(vec![Step::Run(each)]);
    }
    let plain_writers: Vec<u32> = branches
        .iter()
        .filter(|b| b.wrote && !b.xa)
        .map(|b| b.backend)
        .collect();
    let record = match plain_writers[..] {
        [] => Step::Record,
        [last] => Step::RecordIn(last),
        _ => return None,
    };
    let prepare = branches
        .iter()
        .filter(|branch| branch.xa || !branch.wrote)
        .map(|branch| {
            let statements = match (branch.xa, branch.wrote) {
                (true, true) => statements::prepare(&xid(branch)).to_vec(),
                // What only read has nothing to make durable.
                (true, false) => statements::rollback(&xid(branch), false),
                (false, _) => vec!["COMMIT".to_string()],
            };
            (branch.backend, statements)
        })
        .collect();
    let commit = branches
        .iter()
        .filter(|b| b.wrote && b.xa)
        .map(|branch| (branch.backend, vec![statements::commit(&xid(branch))]))
        .collect();
    Some(vec![Step::Run(prepare), record, Step::Run(commit)])
}

/// How a transaction `xid` names that reached `branches` rolls back. An
/// XA branch's XA END may fail (a deadlock left it rollback-only, or it
/// ended): its XA ROLLBACK is what counts.
pub fn rollback_steps(xid: &Xid, branches: &[Branch]) -> Vec<Step> {
    let each = branches
        .iter()
        .map(|branch| {
            let statements = match branch.xa {
                true => statements::rollback(
                    &Xid {
                        backend: branch.backend,
                        ..xid.clone()
                    },
                    false,
                ),
                false => vec!["ROLLBACK".to_string()],
            };
            (branch.backend, statements)
        })
        .collect();
    vec![Step::Run(each)]
}

/// What became of recording the commit decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    Durable,
    /// Another decision was there first: recovery's abort, or a commit.
    Preempted(Decision),
    /// Refused: nothing was recorded.
    Refused,
    /// The connection went before the answer: the row may be there.
    Unknown,
}

/// How the last step the session ran went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Went {
    /// Nothing ran yet.
    Started,
    /// A `Step::Run`, and the backends where it failed.
    Ran {
        failed: Vec<u32>,
    },
    Recorded(Recorded),
}

/// What the session does next to commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Statements for each backend, the backends at once.
    Run(Vec<(u32, Vec<String>)>),
    /// Record the commit decision.
    Record,
    /// Record it in the plain part on this backend as that part commits.
    RecordIn(u32),
    /// Nothing is decided and something failed: roll every branch back
    /// (`rollback_steps`); the failure is the client's answer.
    RollBack,
    /// Whether the decision is durable is not known: close every branch's
    /// connection, recovery reads the decision once it can. The client
    /// gets an error that says so.
    Abandon,
    /// Committed: the client gets OK. `leave`: branches whose commit failed
    /// after the decision, whose connections are closed for recovery to
    /// commit them.
    Finish { leave: Vec<u32> },
}

/// A commit in progress, as pure logic: given how the last step went,
/// what the session runs next (`Commit::next`). Before the decision any
/// failure rolls everything back; after it nothing does.
#[derive(Debug)]
pub struct Commit {
    steps: std::vec::IntoIter<Step>,
    two_phase: bool,
    decided: bool,
    leave: Vec<u32>,
}

/// Two plain parts wrote: nothing can commit them atomically.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAtomic;

impl Commit {
    pub fn new(xid: &Xid, branches: &[Branch]) -> Result<Commit, NotAtomic> {
        let steps = commit_steps(xid, branches).ok_or(NotAtomic)?;
        Ok(Commit {
            two_phase: steps.len() > 1,
            steps: steps.into_iter(),
            decided: false,
            leave: Vec::new(),
        })
    }

    /// In two phases: several branches wrote.
    pub fn two_phase(&self) -> bool {
        self.two_phase
    }

    /// The decision is durable: the transaction commits whatever fails.
    pub fn decided(&self) -> bool {
        self.decided
    }

    pub fn next(&mut self, went: Went) -> Next {
        match went {
            Went::Started => {}
            Went::Ran { failed } if failed.is_empty() => {}
            Went::Ran { .. } if !self.decided => return Next::RollBack,
            // Past the decision: recovery commits what did not.
            Went::Ran { failed } => self.leave.extend(failed),
            Went::Recorded(Recorded::Durable | Recorded::Preempted(Decision::Commit)) => {
                self.decided = true
            }
            Went::Recorded(Recorded::Preempted(Decision::Abort) | Recorded::Refused) => {
                return Next::RollBack
            }
            Went::Recorded(Recorded::Unknown) => return Next::Abandon,
        }
        match self.steps.next() {
            Some(Step::Run(each)) => Next::Run(each),
            Some(Step::Record) => Next::Record,
            Some(Step::RecordIn(backend)) => Next::RecordIn(backend),
            None => Next::Finish {
                leave: std::mem::take(&mut self.leave),
            },
        }
    }
}

/// A transaction's outcome as the dictionary records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Commit,
    Abort,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Commit => "commit",
            Decision::Abort => "abort",
        }
    }

    pub fn parse(text: &str) -> Option<Decision> {
        match text {
            "commit" => Some(Decision::Commit),
            "abort" => Some(Decision::Abort),
            _ => None,
        }
    }
}

/// What recovery knows of a prepared branch's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// Its instance is this one, and the transaction is still running here.
    pub in_flight: bool,
    /// Its instance is another one whose lease is current: it finishes its
    /// own transactions.
    pub owner_alive: bool,
    /// The decision recorded for it, if any.
    pub decision: Option<Decision>,
}

/// What recovery does with a prepared branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// Its owner is at work on it: leave it.
    Leave,
    Commit,
    Rollback,
    /// No decision yet: record `Decision::Abort` (if that insert finds a
    /// commit already there, resolve again with it), then roll back.
    Abort,
}

pub fn resolve(found: Found) -> Resolution {
    match found {
        Found {
            in_flight: true, ..
        }
        | Found {
            owner_alive: true, ..
        } => Resolution::Leave,
        Found {
            decision: Some(Decision::Commit),
            ..
        } => Resolution::Commit,
        Found {
            decision: Some(Decision::Abort),
            ..
        } => Resolution::Rollback,
        Found { decision: None, .. } => Resolution::Abort,
    }
}

#[cfg(test)]
mod tests;
