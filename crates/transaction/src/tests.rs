//! Branch ids read back from XA RECOVER, recovery's resolutions, and the
//! steps of a commit in one or two phases.

use super::*;

fn xid() -> Xid {
    Xid {
        instance: "4242-0a1b2c3d".into(),
        sequence: 17,
        decided_on: None,
        backend: 2,
    }
}

/// Transaction `sequence` of instance `i`, decided in the dictionary.
fn tx(sequence: u64) -> Xid {
    Xid {
        instance: "i".into(),
        sequence,
        decided_on: None,
        backend: 0,
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
        Step::Record | Step::RecordIn(_) => panic!("step {at} is the record"),
    }
}

#[test]
fn a_transaction_on_one_backend_commits_in_one_phase() {
    let plain = commit_steps(&tx(1), &[branch(1, false, true)]).unwrap();
    assert_eq!(plain, [Step::Run(vec![(1, vec!["COMMIT".into()])])]);
    let xa = commit_steps(&tx(1), &[branch(2, true, true)]).unwrap();
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
        &tx(3),
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
    let none = commit_steps(&tx(3), &[branch(1, true, false), branch(2, true, false)]).unwrap();
    assert_eq!(none.len(), 1);
}

#[test]
fn two_writers_prepare_then_record_then_commit() {
    let steps = commit_steps(
        &tx(4),
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
fn a_plain_writer_beside_xa_writers_commits_last_with_the_decision() {
    let decided_on_1 = Xid {
        decided_on: Some(1),
        ..tx(5)
    };
    let steps = commit_steps(
        &decided_on_1,
        &[
            branch(1, false, true),
            branch(2, true, true),
            branch(3, true, false),
        ],
    )
    .unwrap();
    assert_eq!(steps.len(), 3);
    let prepare = run(&steps, 0);
    assert_eq!(
        prepare.iter().map(|(b, _)| *b).collect::<Vec<_>>(),
        [2, 3],
        "the plain writer waits for the others' PREPARE"
    );
    assert!(prepare[0].1[1].starts_with("XA PREPARE 'i:5','2:1'"));
    assert_eq!(steps[1], Step::RecordIn(1));
    assert_eq!(
        run(&steps, 2),
        [(2, vec![format!("XA COMMIT 'i:5','2:1',{FORMAT_ID}")])]
    );
    // Two plain writers: nothing makes them atomic.
    assert_eq!(
        commit_steps(
            &tx(5),
            &[
                branch(1, false, true),
                branch(2, false, true),
                branch(3, true, true)
            ]
        ),
        None
    );
    // A plain part that only read commits beside the prepares.
    let steps = commit_steps(
        &tx(5),
        &[
            branch(1, false, false),
            branch(2, true, true),
            branch(3, true, true),
        ],
    )
    .unwrap();
    assert_eq!(run(&steps, 0)[0], (1, vec!["COMMIT".to_string()]));
    assert_eq!(steps[1], Step::Record);
}

#[test]
fn a_decision_in_a_plain_part_reads_back_from_the_branch_ids() {
    let xid = Xid {
        decided_on: Some(3),
        ..xid()
    };
    assert_eq!(xid.sql(), format!("'4242-0a1b2c3d:17','2:3',{FORMAT_ID}"));
    let gtrid = xid.gtrid();
    let data = format!("{gtrid}2:3");
    assert_eq!(
        Xid::recovered(FORMAT_ID, gtrid.len(), 3, data.as_bytes()),
        Some(xid)
    );
    assert_eq!(Xid::recovered(FORMAT_ID, 4, 3, b"a:172:x"), None);
}

#[test]
fn a_rollback_ends_every_branch_as_it_began() {
    let steps = rollback_steps(&tx(6), &[branch(1, false, true), branch(2, true, false)]);
    let each = run(&steps, 0);
    assert_eq!(each[0].1, ["ROLLBACK"]);
    assert_eq!(each[1].1.len(), 2);
    assert!(each[1].1[1].starts_with("XA ROLLBACK"));
}

fn two_writers() -> Vec<Branch> {
    vec![
        branch(1, true, true),
        branch(2, true, true),
        branch(3, true, false),
    ]
}

#[test]
fn a_commit_runs_prepare_record_commit_and_finishes() {
    let mut commit = Commit::new(&tx(8), &two_writers()).unwrap();
    assert!(commit.two_phase() && !commit.decided());
    assert!(matches!(commit.next(Went::Started), Next::Run(each) if each.len() == 3));
    let ran = || Went::Ran { failed: vec![] };
    assert_eq!(commit.next(ran()), Next::Record);
    assert!(
        matches!(commit.next(Went::Recorded(Recorded::Durable)), Next::Run(each) if each.len() == 2)
    );
    assert!(commit.decided());
    assert_eq!(commit.next(ran()), Next::Finish { leave: vec![] });
    // One writer: one step, nothing to decide.
    let mut one = Commit::new(&tx(9), &[branch(1, true, true), branch(2, true, false)]).unwrap();
    assert!(!one.two_phase());
    assert!(matches!(one.next(Went::Started), Next::Run(_)));
    assert_eq!(one.next(ran()), Next::Finish { leave: vec![] });
    assert_eq!(
        Commit::new(&tx(10), &[branch(1, false, true), branch(2, false, true)]).err(),
        Some(NotAtomic)
    );
    // A plain writer beside an XA writer: its commit is the decision.
    let mut last = Commit::new(&tx(10), &[branch(1, false, true), branch(2, true, true)]).unwrap();
    assert!(last.two_phase());
    assert!(matches!(last.next(Went::Started), Next::Run(each) if each.len() == 1));
    assert_eq!(last.next(ran()), Next::RecordIn(1));
    assert!(matches!(
        last.next(Went::Recorded(Recorded::Durable)),
        Next::Run(_)
    ));
    assert_eq!(last.next(ran()), Next::Finish { leave: vec![] });
}

#[test]
fn an_error_at_prepare_rolls_everything_back() {
    let mut commit = Commit::new(&tx(11), &two_writers()).unwrap();
    commit.next(Went::Started);
    assert_eq!(commit.next(Went::Ran { failed: vec![2] }), Next::RollBack);
    // The same in one phase: the commit failed, nothing else committed.
    let mut one = Commit::new(&tx(12), &[branch(1, true, true)]).unwrap();
    one.next(Went::Started);
    assert_eq!(one.next(Went::Ran { failed: vec![1] }), Next::RollBack);
}

#[test]
fn a_decision_not_made_durable_rolls_back_or_is_left_to_recovery() {
    for (recorded, next) in [
        (Recorded::Refused, Next::RollBack),
        (Recorded::Preempted(Decision::Abort), Next::RollBack),
        (Recorded::Unknown, Next::Abandon),
    ] {
        let mut commit = Commit::new(&tx(13), &two_writers()).unwrap();
        commit.next(Went::Started);
        commit.next(Went::Ran { failed: vec![] });
        assert_eq!(commit.next(Went::Recorded(recorded)), next, "{recorded:?}");
        assert!(!commit.decided());
    }
    // A commit recorded before (recovery found it, a retry): commits.
    let mut commit = Commit::new(&tx(14), &two_writers()).unwrap();
    commit.next(Went::Started);
    commit.next(Went::Ran { failed: vec![] });
    let next = commit.next(Went::Recorded(Recorded::Preempted(Decision::Commit)));
    assert!(matches!(next, Next::Run(_)));
}

#[test]
fn an_error_at_commit_after_the_decision_is_left_to_recovery() {
    let mut commit = Commit::new(&tx(15), &two_writers()).unwrap();
    commit.next(Went::Started);
    commit.next(Went::Ran { failed: vec![] });
    commit.next(Went::Recorded(Recorded::Durable));
    assert_eq!(
        commit.next(Went::Ran { failed: vec![2] }),
        Next::Finish { leave: vec![2] },
        "the client gets OK; recovery commits backend 2's branch"
    );
}

#[test]
fn decisions_read_back_as_written() {
    for decision in [Decision::Commit, Decision::Abort] {
        assert_eq!(Decision::parse(decision.as_str()), Some(decision));
    }
    assert_eq!(Decision::parse("maybe"), None);
}
