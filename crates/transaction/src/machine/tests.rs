//! The transaction state machine: what each statement opens, joins or
//! ends on which backend, and what a commit or rollback sends where.

use super::*;

const MAIN: usize = 0;

fn atomic() -> Transaction<u64> {
    Transaction::new(Transactions::Atomic, vec![1, 2, 3], MAIN)
}

fn begin() -> Bytes {
    Bytes::from_static(b"\x03BEGIN")
}

fn open(autocommit: bool) -> Option<ServerStatus> {
    Some(ServerStatus {
        in_transaction: true,
        autocommit,
        settings_current: true,
    })
}

fn closed(autocommit: bool) -> Option<ServerStatus> {
    Some(ServerStatus {
        in_transaction: false,
        autocommit,
        settings_current: true,
    })
}

fn statement() -> Reach {
    Reach {
        may_begin: true,
        ..Reach::default()
    }
}

/// A statement on `slot` as the session runs it: its opening, then the
/// server's status, then a write if it wrote.
fn run(tx: &mut Transaction<u64>, slot: usize, writes: bool) -> Opening {
    let opening = tx.opening(slot, statement()).unwrap();
    if opening != Opening::Nothing {
        tx.running_or(|| 7);
        tx.opened(slot, opening == Opening::XaStart);
    }
    let autocommit = tx.autocommit();
    tx.observe(
        slot,
        Some(ServerStatus {
            in_transaction: tx.part(slot).open || !autocommit,
            autocommit,
            settings_current: true,
        }),
    );
    if writes {
        tx.wrote(slot);
    }
    opening
}

fn writers(branches: &[(usize, crate::Branch)]) -> Vec<u32> {
    branches
        .iter()
        .filter(|(_, b)| b.wrote)
        .map(|(_, b)| b.backend)
        .collect()
}

#[test]
fn a_command_that_reads_no_rows_joins_no_transaction() {
    let mut tx = atomic();
    tx.begun_here(begin());
    assert_eq!(run(&mut tx, 1, true), Opening::XaStart);
    let prepare = Reach {
        outside: true,
        ..Reach::default()
    };
    assert_eq!(tx.opening(2, prepare), Ok(Opening::Nothing));
    assert!(!tx.holds(2));
    assert_eq!(tx.opening(2, statement()), Ok(Opening::XaStart));
}

#[test]
fn a_begin_hscale_answers_opens_xa_branches_where_the_transaction_goes() {
    let mut tx = atomic();
    assert_eq!(
        tx.begin_plan(true),
        BeginPlan::Here {
            commit_first: false
        }
    );
    assert_eq!(
        tx.begin_plan(false),
        BeginPlan::OnServer,
        "WITH CONSISTENT SNAPSHOT"
    );
    tx.begun_here(begin());
    assert!(tx.in_transaction() && !tx.reached_any());
    assert_eq!(run(&mut tx, 1, true), Opening::XaStart);
    assert_eq!(run(&mut tx, 1, true), Opening::Nothing, "open already");
    assert_eq!(run(&mut tx, 2, false), Opening::XaStart);
    assert!(tx.holds(1) && tx.holds(2) && !tx.holds(0));
    assert_eq!(tx.slots(), [1, 2]);
    // A second BEGIN commits it first.
    assert_eq!(tx.begin_plan(true), BeginPlan::Here { commit_first: true });
    assert_eq!(tx.end_plan(true, false, false), EndPlan::Branches);
    let (branches, running) = tx.branches(|| 99);
    assert_eq!(running, 7, "the number its branches began with");
    assert_eq!(branches.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(writers(&branches), [2], "backend ids, not slots");
    assert!(branches.iter().all(|(_, b)| b.xa));
    for (slot, _) in &branches {
        tx.branch_ended(*slot);
        tx.observe(*slot, closed(true));
    }
    tx.branches_ended(true);
    assert!(!tx.in_transaction() && !tx.has_branches());
    assert_eq!(tx.opening(1, statement()).unwrap(), Opening::Nothing);
}

#[test]
fn a_begin_that_reached_no_backend_ends_with_nothing_sent() {
    let mut tx = atomic();
    tx.begun_here(begin());
    assert_eq!(tx.end_plan(true, false, false), EndPlan::Nothing);
    tx.ended_unbegun();
    assert!(!tx.in_transaction());
    // A statement that commits by itself ends it before it began.
    tx.begun_here(begin());
    assert_eq!(tx.before(1, TxEffect::CommitsFirst), Ok(Before::Nothing));
    assert!(!tx.in_transaction());
}

#[test]
fn one_backend_in_single_or_multi_mode_is_a_plain_transaction() {
    for mode in [Transactions::Single, Transactions::Multi] {
        let mut tx: Transaction<u64> = Transaction::new(mode, vec![1, 2], MAIN);
        tx.begun_here(begin());
        assert_eq!(run(&mut tx, 1, true), Opening::Begin(begin()));
        assert_eq!(run(&mut tx, 0, false), Opening::Begin(begin()));
        assert_eq!(
            tx.end_plan(true, false, false),
            EndPlan::Each {
                quiet: vec![0],
                last: 1
            }
        );
        let refused = tx.check_writers(&[0]);
        match mode {
            Transactions::Single => assert_eq!(
                refused,
                Err(Refused::SecondWriter {
                    first: 2,
                    second: 1
                })
            ),
            _ => assert_eq!(refused, Ok(())),
        }
    }
    // With one backend there is nothing to prepare: plain in atomic mode too.
    let mut tx: Transaction<u64> = Transaction::new(Transactions::Atomic, vec![1], MAIN);
    tx.begun_here(begin());
    assert_eq!(run(&mut tx, 0, true), Opening::Begin(begin()));
}

#[test]
fn a_writer_that_cannot_be_prepared_stays_alone() {
    let mut tx = atomic();
    // START TRANSACTION READ WRITE: the server's, a plain part.
    assert_eq!(tx.begin_plan(false), BeginPlan::OnServer);
    tx.observe(MAIN, open(true));
    tx.begun_on_server(begin());
    tx.wrote(MAIN);
    assert_eq!(tx.opening(1, statement()).unwrap(), Opening::Begin(begin()));
    assert_eq!(
        tx.check_writers(&[1]),
        Err(Refused::Unpreparable { plain: 1, other: 2 })
    );
    // Outside a transaction a write over several backends is one XA
    // transaction of its own.
    let tx = atomic();
    assert_eq!(tx.check_writers(&[0, 1]), Ok(()));
    assert!(tx.statement_is_atomic(&[0, 1]) && !tx.statement_is_atomic(&[1, 1]));
}

#[test]
fn a_transaction_begun_out_of_sight_cannot_reach_another_backend() {
    let mut tx = atomic();
    // A CALL that ran BEGIN on the main backend.
    tx.observe(MAIN, open(true));
    assert_eq!(
        tx.opening(1, statement()),
        Err(Refused::UnseenBegin { backend: 2 })
    );
    assert!(tx.check_unseen_commits(1, "a CALL").is_err());
    assert_eq!(tx.check_unseen_commits(MAIN, "a CALL"), Ok(()));
}

#[test]
fn autocommit_off_opens_a_branch_on_each_backend_it_reaches() {
    let mut tx = atomic();
    tx.observe(MAIN, closed(false));
    assert!(!tx.autocommit() && tx.in_transaction());
    assert_eq!(run(&mut tx, 1, true), Opening::XaStart);
    assert_eq!(run(&mut tx, 2, true), Opening::XaStart);
    // SET and USE begin nothing.
    assert_eq!(
        tx.opening(MAIN, Reach::default()).unwrap(),
        Opening::Nothing
    );
    // A CALL may commit inside: what it opens is plain.
    let call = Reach {
        plain_branch: true,
        ..statement()
    };
    assert_eq!(tx.opening(MAIN, call).unwrap(), Opening::Nothing);
    assert_eq!(tx.check_writers(&[1, 2]), Ok(()));
    // SET autocommit = 1 commits: every branch first, then the SET
    // where parts remain (autocommit off holds each reached backend).
    let on = TxEffect::SetsAutocommit {
        to: Autocommit::On,
        user_variable: false,
    };
    assert_eq!(
        tx.before(1, on),
        Ok(Before::EndBranches {
            then_autocommit: true
        })
    );
    assert_eq!(
        tx.autocommit_on_elsewhere(1, Autocommit::On, false),
        Ok(vec![0, 2])
    );
    let unread = TxEffect::SetsAutocommit {
        to: Autocommit::Unread,
        user_variable: false,
    };
    assert_eq!(tx.before(1, unread), Err(Refused::AutocommitOverBranches));
    // A connection that ended its branch before taking the session's
    // SET does not speak for the session.
    tx.observe(
        2,
        Some(ServerStatus {
            in_transaction: false,
            autocommit: true,
            settings_current: false,
        }),
    );
    assert!(!tx.autocommit());
}

#[test]
fn plain_parts_commit_before_a_statement_that_commits_by_itself() {
    let mut tx: Transaction<u64> = Transaction::new(Transactions::Multi, vec![1, 2], MAIN);
    tx.begun_here(begin());
    run(&mut tx, 0, true);
    run(&mut tx, 1, true);
    assert_eq!(
        tx.before(1, TxEffect::CommitsFirst),
        Ok(Before::CommitOthers)
    );
    assert_eq!(tx.commit_plan(Some(1)), CommitPlan::Each(vec![0]));
    assert_eq!(tx.before(1, TxEffect::None), Ok(Before::Nothing));
    // SET autocommit = 1 beside a user variable cannot be replayed.
    let mut off: Transaction<u64> = Transaction::new(Transactions::Multi, vec![1, 2], MAIN);
    off.observe(0, closed(false));
    run(&mut off, 0, true);
    run(&mut off, 1, true);
    let effect = TxEffect::SetsAutocommit {
        to: Autocommit::On,
        user_variable: true,
    };
    assert_eq!(off.before(1, effect), Ok(Before::SetAutocommitElsewhere));
    assert!(matches!(
        off.autocommit_on_elsewhere(1, Autocommit::On, true),
        Err(Refused::AutocommitElsewhere { open, .. }) if open == [1]
    ));
    assert_eq!(
        off.autocommit_on_elsewhere(1, Autocommit::On, false),
        Ok(vec![0])
    );
}

#[test]
fn commit_and_chain_over_branches_begins_the_next_as_hscale_s() {
    let mut tx = atomic();
    tx.begun_here(begin());
    run(&mut tx, 1, true);
    assert_eq!(tx.end_plan(false, true, false), EndPlan::Branches);
    let (branches, _) = tx.branches(|| 0);
    for (slot, _) in branches {
        tx.branch_ended(slot);
        tx.observe(slot, closed(true));
    }
    tx.branches_ended(true);
    tx.chain(|| Bytes::from_static(b"\x03START TRANSACTION"));
    assert!(tx.in_transaction());
    assert_eq!(
        run(&mut tx, 2, true),
        Opening::XaStart,
        "the chained one's parts are branches"
    );
    // Plain parts: the server chains, and later backends open the
    // chained one with START TRANSACTION.
    let mut tx: Transaction<u64> = Transaction::new(Transactions::Multi, vec![1, 2], MAIN);
    tx.observe(MAIN, open(true));
    assert_eq!(
        tx.end_plan(false, true, false),
        EndPlan::Each {
            quiet: vec![],
            last: 0
        }
    );
    tx.ended_each(|| Bytes::from_static(b"\x03START TRANSACTION"));
    assert_eq!(
        tx.opening(1, statement()).unwrap(),
        Opening::Begin(Bytes::from_static(b"\x03START TRANSACTION"))
    );
}

#[test]
fn savepoints_roll_back_wholly_where_the_transaction_came_later() {
    let mut tx = atomic();
    tx.begun_here(begin());
    run(&mut tx, 1, true);
    assert_eq!(
        tx.savepoint_steps(SavepointOp::Set, "a").unwrap(),
        [SavepointStep::Statement(1)]
    );
    tx.savepoint_done(SavepointOp::Set, "a".into());
    run(&mut tx, 2, true);
    let steps = tx.savepoint_steps(SavepointOp::RollbackTo, "a").unwrap();
    assert_eq!(
        steps,
        [
            SavepointStep::RollBackBranch(2),
            SavepointStep::Statement(1)
        ],
        "the branch that began after it goes wholly, the answer is the savepoint's"
    );
    tx.branch_ended(2);
    tx.savepoint_done(SavepointOp::RollbackTo, "a".into());
    assert_eq!(
        tx.savepoint_steps(SavepointOp::Release, "a").unwrap(),
        [SavepointStep::Statement(1)]
    );
    tx.savepoint_done(SavepointOp::Release, "a".into());
    assert_eq!(
        tx.savepoint_steps(SavepointOp::Release, "a"),
        Err(NoSuchSavepoint)
    );
    // Unknown names on the main backend alone: the server answers.
    let mut main_only = atomic();
    main_only.observe(MAIN, open(true));
    assert_eq!(
        main_only
            .savepoint_steps(SavepointOp::RollbackTo, "b")
            .unwrap(),
        [SavepointStep::Statement(MAIN)]
    );
    assert_eq!(main_only.check_unread_savepoint(), Ok(()));
    assert_eq!(tx.check_unread_savepoint(), Err(Refused::UnreadSavepoint));
    // A plain part rolls back with ROLLBACK; no part keeps the
    // savepoint: the main backend answers.
    let mut plain: Transaction<u64> = Transaction::new(Transactions::Multi, vec![1, 2], MAIN);
    plain.observe(MAIN, open(true));
    plain.savepoint_done(SavepointOp::Set, "c".into());
    plain.observe(MAIN, closed(true));
    plain.observe(1, open(true));
    assert!(
        plain.savepoint_steps(SavepointOp::RollbackTo, "c").is_err(),
        "gone with its transaction"
    );
}

#[test]
fn a_begin_that_reached_nothing_ends_with_the_commit_that_ends_it() {
    // Autocommit off, BEGIN, COMMIT AND CHAIN before any backend: the
    // chained transaction begins with the next statement by itself.
    let mut tx = atomic();
    tx.observe(MAIN, closed(false));
    tx.begun_here(begin());
    assert_eq!(tx.end_plan(false, true, false), EndPlan::Branches);
    let (branches, _) = tx.branches(|| 0);
    assert!(branches.is_empty());
    tx.branches_ended(false);
    tx.chain(begin);
    tx.observe(MAIN, closed(true));
    assert!(!tx.in_transaction(), "autocommit on again: no transaction");
    assert_eq!(tx.check_writers(&[1, 2]), Ok(()));
    // LOCK TABLES commits one hscale answered the BEGIN of, too.
    let mut locked: Transaction<u64> = Transaction::new(Transactions::Multi, vec![1, 2], MAIN);
    locked.begun_here(begin());
    assert_eq!(locked.commit_plan(None), CommitPlan::Each(vec![]));
    locked.committed_each();
    assert!(!locked.in_transaction());
}

#[test]
fn savepoints_end_with_a_transaction_the_server_commits_by_itself() {
    // BEGIN on the server (after COMMIT AND CHAIN): the chained
    // transaction's savepoint is gone, and rolling back to it must not
    // roll back a backend the new transaction reached.
    let mut tx: Transaction<u64> = Transaction::new(Transactions::Multi, vec![1, 2], MAIN);
    tx.observe(MAIN, open(true));
    tx.savepoint_done(SavepointOp::Set, "s".into());
    tx.begun_on_server(begin());
    tx.observe(MAIN, open(true));
    run(&mut tx, 1, true);
    assert_eq!(
        tx.savepoint_steps(SavepointOp::RollbackTo, "s"),
        Err(NoSuchSavepoint)
    );
    // DDL with autocommit off: the status stays "in a transaction".
    let mut off: Transaction<u64> = Transaction::new(Transactions::Multi, vec![1, 2], MAIN);
    off.observe(MAIN, open(false));
    off.savepoint_done(SavepointOp::Set, "s".into());
    assert_eq!(
        off.before(MAIN, TxEffect::CommitsFirst),
        Ok(Before::Nothing)
    );
    off.observe(MAIN, closed(false));
    run(&mut off, 1, true);
    assert_eq!(
        off.savepoint_steps(SavepointOp::RollbackTo, "s"),
        Err(NoSuchSavepoint)
    );
}

#[test]
fn an_error_that_may_have_ended_a_part_is_settled_on_every_backend() {
    let mut tx = atomic();
    tx.begun_here(begin());
    run(&mut tx, 1, true);
    run(&mut tx, 2, true);
    tx.failed(1);
    assert!(tx.unsettled());
    let (unsure, lost) = tx.to_settle();
    assert_eq!((unsure, lost), (vec![1], false));
    // A deadlock: the server says the part ended.
    tx.observe(1, closed(true));
    assert!(
        tx.ended_on(1) && tx.has_branches(),
        "the branch ends by XA statements"
    );
    tx.settled();
    assert!(!tx.unsettled());
    // A lost connection took its part along.
    tx.lost(2);
    assert!(tx.unsettled() && !tx.holds(2));
    assert_eq!(tx.to_settle(), (vec![], true));
    // With one backend its next status says it all.
    let mut one: Transaction<u64> = Transaction::new(Transactions::Atomic, vec![1], MAIN);
    one.observe(MAIN, open(true));
    one.failed(MAIN);
    assert!(!one.unsettled());
}

/// `atomic()` where the account may write the decision everywhere.
fn recording() -> Transaction<u64> {
    let mut tx = atomic();
    for slot in 0..3 {
        assert!(tx.asks_recordable(slot));
        tx.set_recordable(slot, true);
        assert!(!tx.asks_recordable(slot));
    }
    tx
}

#[test]
fn the_first_part_is_plain_where_it_can_carry_the_decision() {
    let mut tx = recording();
    tx.begun_here(begin());
    assert_eq!(
        run(&mut tx, 1, true),
        Opening::Begin(begin()),
        "no XA statement"
    );
    assert_eq!(tx.plain_part(), Some(2));
    assert_eq!(run(&mut tx, 2, true), Opening::XaStart);
    assert_eq!(
        tx.check_writers(&[0]),
        Ok(()),
        "one plain writer among XA ones"
    );
    let (branches, _) = tx.branches(|| 0);
    let plain: Vec<_> = branches.iter().filter(|(_, b)| !b.xa).collect();
    assert_eq!(plain.len(), 1);
    let xid = crate::Xid {
        instance: "i".into(),
        sequence: 1,
        decided_on: tx.plain_part(),
        backend: 0,
    };
    let branches: Vec<crate::Branch> = branches.into_iter().map(|(_, b)| b).collect();
    let steps = crate::commit_steps(&xid, &branches).unwrap();
    assert_eq!(steps[1], crate::Step::RecordIn(2));
    // A write over two backends the transaction has not reached: the
    // first opens the plain part, the second a branch.
    let mut fresh = recording();
    fresh.begun_here(begin());
    assert_eq!(fresh.check_writers(&[1, 2]), Ok(()));
    // Autocommit off: the server opens the first part by itself, also
    // after a BEGIN hscale answered, which then has a part to end.
    let mut off = recording();
    off.observe(MAIN, closed(false));
    off.observe(1, closed(false));
    off.begun_here(begin());
    assert_eq!(run(&mut off, 1, true), Opening::QueuedBegin);
    assert_eq!(
        off.end_plan(true, false, false),
        EndPlan::Each {
            quiet: vec![0],
            last: 1
        }
    );
    assert_eq!(run(&mut off, 2, true), Opening::XaStart);
    // One command reaching two backends checks both out before either
    // answers: the second is not taken for the first.
    let mut scan = recording();
    scan.observe(MAIN, closed(false));
    assert_eq!(scan.opening(1, statement()), Ok(Opening::QueuedBegin));
    scan.opened(1, false);
    assert_eq!(scan.opening(2, statement()), Ok(Opening::XaStart));
}

#[test]
fn where_the_account_cannot_record_every_part_is_an_xa_branch() {
    let mut tx = atomic();
    tx.set_recordable(1, false);
    tx.begun_here(begin());
    assert_eq!(run(&mut tx, 1, true), Opening::XaStart);
    assert_eq!(tx.plain_part(), None);
    // A second plain writer, or one under LOCK TABLES, cannot carry it.
    let mut locked = recording();
    locked.observe(MAIN, open(true));
    locked.set_tables_locked(MAIN, true);
    locked.wrote(MAIN);
    assert!(matches!(
        locked.check_writers(&[1]),
        Err(Refused::Unpreparable { plain: 1, .. })
    ));
    let mut two = recording();
    two.observe(MAIN, open(true));
    two.wrote(MAIN);
    two.observe(1, open(true));
    two.wrote(1);
    assert!(two.check_writers(&[]).is_err());
}

#[test]
fn reset_forgets_everything_but_the_backends() {
    let mut tx = atomic();
    tx.begun_here(begin());
    run(&mut tx, 1, true);
    tx.observe(0, closed(false));
    tx.reset();
    assert!(!tx.in_transaction() && tx.autocommit() && !tx.has_branches());
    assert_eq!(tx.opening(2, statement()), Ok(Opening::Nothing));
    assert!(tx.statement_is_atomic(&[1, 2]));
}
