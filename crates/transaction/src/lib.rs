//! Transactions over several backends, as pure logic: which statements a
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

/// The XA format id of hscale's branches: `XA RECOVER` lists every
/// prepared branch on a server, those of other coordinators (a client's own
/// XA statements) too; hscale resolves only its own.
pub const FORMAT_ID: u32 = 0x6873_6331;

/// The id of one branch: the transaction (`gtrid`: the instance that
/// coordinates it and its sequence there) and the backend it runs on
/// (`bqual`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Xid {
    pub instance: String,
    pub sequence: u64,
    pub backend: u32,
}

impl Xid {
    /// The transaction's id, shared by its branches: the decision's key.
    pub fn gtrid(&self) -> String {
        format!("{}:{}", self.instance, self.sequence)
    }

    /// The branch's id as XA statements write it. Instance names are made
    /// of letters, digits and dashes (`valid_instance`): no quoting needed.
    pub fn sql(&self) -> String {
        format!("'{}','{}',{FORMAT_ID}", self.gtrid(), self.backend)
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
        Some(Xid {
            instance: instance.to_string(),
            sequence: sequence.parse().ok()?,
            backend: bqual.parse().ok()?,
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
}

/// How a transaction that reached `branches` commits: in one phase when
/// at most one branch wrote (no XA round trip: a branch that only read
/// commits beside it), in two when several did. `None` when two or more
/// wrote and one of them is plain: nothing can make that atomic (the
/// session refuses the write that would lead there).
pub fn commit_steps(instance: &str, sequence: u64, branches: &[Branch]) -> Option<Vec<Step>> {
    let xid = |branch: &Branch| Xid {
        instance: instance.to_string(),
        sequence,
        backend: branch.backend,
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
    if branches.iter().any(|b| b.wrote && !b.xa) {
        return None;
    }
    let prepare = branches
        .iter()
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
        .filter(|b| b.wrote)
        .map(|branch| (branch.backend, vec![statements::commit(&xid(branch))]))
        .collect();
    Some(vec![Step::Run(prepare), Step::Record, Step::Run(commit)])
}

/// How a transaction that reached `branches` rolls back. An XA branch's
/// XA END may fail (a deadlock left it rollback-only, or it ended): its
/// XA ROLLBACK is what counts.
pub fn rollback_steps(instance: &str, sequence: u64, branches: &[Branch]) -> Vec<Step> {
    let each = branches
        .iter()
        .map(|branch| {
            let statements = match branch.xa {
                true => statements::rollback(
                    &Xid {
                        instance: instance.to_string(),
                        sequence,
                        backend: branch.backend,
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
mod tests {
    use super::*;

    fn xid() -> Xid {
        Xid {
            instance: "4242-0a1b2c3d".into(),
            sequence: 17,
            backend: 2,
        }
    }

    #[test]
    fn a_branch_id_reads_back_from_what_xa_recover_lists() {
        let xid = xid();
        assert_eq!(xid.sql(), format!("'4242-0a1b2c3d:17','2',{FORMAT_ID}"));
        let gtrid = xid.gtrid();
        let data = format!("{gtrid}2");
        assert_eq!(
            Xid::recovered(FORMAT_ID, gtrid.len(), 1, data.as_bytes()),
            Some(xid)
        );
    }

    #[test]
    fn branches_of_other_coordinators_are_not_hscale_s() {
        let data = b"4242-0a1b2c3d:172";
        // A client's own XA transaction, format 1.
        assert_eq!(Xid::recovered(1, 16, 1, data), None);
        // Lengths that do not add up, a gtrid without a sequence, a bqual
        // that is not a backend id, a name hscale would not give.
        assert_eq!(Xid::recovered(FORMAT_ID, 16, 2, data), None);
        assert_eq!(Xid::recovered(FORMAT_ID, 4, 1, b"abcd2"), None);
        assert_eq!(Xid::recovered(FORMAT_ID, 6, 1, b"a-b:12x"), None);
        assert_eq!(Xid::recovered(FORMAT_ID, 6, 1, b"a'b:122"), None);
    }

    #[test]
    fn a_branch_is_ended_before_it_is_prepared_or_rolled_back() {
        let xid = xid();
        let [end, prepare] = statements::prepare(&xid);
        assert!(end.starts_with("XA END '") && prepare.starts_with("XA PREPARE '"));
        assert_eq!(statements::rollback(&xid, false).len(), 2);
        assert_eq!(
            statements::rollback(&xid, true),
            [format!("XA ROLLBACK {}", xid.sql())]
        );
        assert!(statements::commit(&xid).starts_with("XA COMMIT '"));
        assert!(statements::start(&xid).starts_with("XA START '"));
    }

    #[test]
    fn recovery_leaves_running_transactions_and_follows_the_decision() {
        let found = |in_flight, owner_alive, decision| Found {
            in_flight,
            owner_alive,
            decision,
        };
        assert_eq!(
            resolve(found(true, false, Some(Decision::Commit))),
            Resolution::Leave
        );
        assert_eq!(resolve(found(false, true, None)), Resolution::Leave);
        assert_eq!(
            resolve(found(false, false, Some(Decision::Commit))),
            Resolution::Commit
        );
        assert_eq!(
            resolve(found(false, false, Some(Decision::Abort))),
            Resolution::Rollback
        );
        // Presumed abort: no decision is a rollback, fenced by a record.
        assert_eq!(resolve(found(false, false, None)), Resolution::Abort);
    }

    fn branch(backend: u32, xa: bool, wrote: bool) -> Branch {
        Branch { backend, xa, wrote }
    }

    fn run(steps: &[Step], at: usize) -> Vec<(u32, Vec<String>)> {
        match &steps[at] {
            Step::Run(each) => each.clone(),
            Step::Record => panic!("step {at} is the record"),
        }
    }

    #[test]
    fn a_transaction_on_one_backend_commits_in_one_phase() {
        let plain = commit_steps("i", 1, &[branch(1, false, true)]).unwrap();
        assert_eq!(plain, [Step::Run(vec![(1, vec!["COMMIT".into()])])]);
        let xa = commit_steps("i", 1, &[branch(2, true, true)]).unwrap();
        let x = format!("'i:1','2',{FORMAT_ID}");
        assert_eq!(
            xa,
            [Step::Run(vec![(
                2,
                vec![format!("XA END {x}"), format!("XA COMMIT {x} ONE PHASE")]
            )])]
        );
    }

    #[test]
    fn branches_that_only_read_do_not_make_a_second_phase() {
        let steps = commit_steps(
            "i",
            3,
            &[
                branch(1, true, false),
                branch(2, true, true),
                branch(3, false, false),
            ],
        )
        .unwrap();
        assert_eq!(steps.len(), 1, "one phase: one writer");
        let each = run(&steps, 0);
        assert!(each[0].1[1].starts_with("XA COMMIT") && each[0].1[1].ends_with("ONE PHASE"));
        assert_eq!(each[2].1, ["COMMIT"]);
        // Nothing written anywhere: each ends in one phase too.
        let none = commit_steps("i", 3, &[branch(1, true, false), branch(2, true, false)]).unwrap();
        assert_eq!(none.len(), 1);
    }

    #[test]
    fn two_writers_prepare_then_record_then_commit() {
        let steps = commit_steps(
            "i",
            4,
            &[
                branch(1, true, true),
                branch(2, true, true),
                branch(3, true, false),
            ],
        )
        .unwrap();
        assert_eq!(steps.len(), 3);
        assert_eq!(steps[1], Step::Record);
        let prepare = run(&steps, 0);
        assert!(prepare[0].1[0].starts_with("XA END") && prepare[0].1[1].starts_with("XA PREPARE"));
        assert!(
            prepare[2].1[1].starts_with("XA ROLLBACK"),
            "the reader ends"
        );
        let commit = run(&steps, 2);
        assert_eq!(commit.iter().map(|(b, _)| *b).collect::<Vec<_>>(), [1, 2]);
        assert!(commit
            .iter()
            .all(|(_, s)| s.len() == 1 && s[0].starts_with("XA COMMIT '")));
    }

    #[test]
    fn a_plain_writer_beside_another_writer_cannot_commit_atomically() {
        assert_eq!(
            commit_steps("i", 5, &[branch(1, false, true), branch(2, true, true)]),
            None
        );
    }

    #[test]
    fn a_rollback_ends_every_branch_as_it_began() {
        let steps = rollback_steps("i", 6, &[branch(1, false, true), branch(2, true, false)]);
        let each = run(&steps, 0);
        assert_eq!(each[0].1, ["ROLLBACK"]);
        assert_eq!(each[1].1.len(), 2);
        assert!(each[1].1[1].starts_with("XA ROLLBACK"));
    }

    #[test]
    fn decisions_read_back_as_written() {
        for decision in [Decision::Commit, Decision::Abort] {
            assert_eq!(Decision::parse(decision.as_str()), Some(decision));
        }
        assert_eq!(Decision::parse("maybe"), None);
    }
}
