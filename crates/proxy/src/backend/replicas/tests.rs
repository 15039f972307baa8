//! The writer's election, GTID positions compared, the replica a failover
//! promotes, and fencing, on hosts as a check would see them.

use super::*;

fn host(reachable: bool, read_only: bool) -> Health {
    Health {
        reachable,
        read_only,
        checked: Some(Instant::now()),
        ..Health::default()
    }
}

#[test]
fn the_writer_is_the_one_reachable_host_with_read_only_off() {
    let seen = [host(true, true), host(true, false), host(true, true)];
    let Writer::At {
        host: writer,
        generation,
    } = elect(&seen, &Writer::Unknown)
    else {
        panic!("no writer elected");
    };
    assert_eq!(writer, 1);
    let before = Writer::At {
        host: writer,
        generation,
    };
    let again = elect(&seen, &before);
    assert_eq!(again, before, "same host, same generation");
    let flipped = [host(true, false), host(true, true), host(true, true)];
    let Writer::At {
        host: new,
        generation: newer,
    } = elect(&flipped, &again)
    else {
        panic!("no writer after the flip");
    };
    assert_eq!(new, 0);
    assert_ne!(
        newer, generation,
        "another host: connections to the old one are done"
    );
}

#[test]
fn two_writable_hosts_are_no_writer_and_unreachable_ones_do_not_count() {
    let split = [host(true, false), host(true, false), host(true, true)];
    assert_eq!(elect(&split, &Writer::Unknown), Writer::Several(vec![0, 1]));
    let gone = [host(false, false), host(true, true)];
    assert_eq!(elect(&gone, &Writer::Unknown), Writer::None);
    let read_only = [host(true, true), host(true, true)];
    assert_eq!(elect(&read_only, &Writer::Unknown), Writer::None);
}

#[test]
fn a_position_covers_another_domain_by_domain() {
    assert!(gtid_covers("0-1-100", "0-1-100"));
    assert!(
        gtid_covers("0-2-101", "0-1-100"),
        "a later server id counts too"
    );
    assert!(!gtid_covers("0-1-99", "0-1-100"));
    assert!(gtid_covers("0-1-5,1-3-7", "1-3-7"));
    assert!(
        !gtid_covers("0-1-5", "0-1-5,1-3-7"),
        "a domain it never saw"
    );
    assert!(gtid_covers("", ""), "nothing written, nothing to wait for");
    assert!(gtid_covers("0-1-5", ""));
}

#[test]
fn the_replica_that_received_most_is_promoted_and_never_the_lost_writer() {
    let replica = |received: &str| Health {
        reachable: true,
        read_only: true,
        replication: Some(Replication {
            received: received.into(),
            ..Replication::default()
        }),
        ..Health::default()
    };
    let lost = Health::default();
    let seen = [lost.clone(), replica("0-1-41"), replica("0-1-42")];
    assert_eq!(most_advanced(&seen, 0), Some(2));
    let mut behind_and_down = replica("0-1-43");
    behind_and_down.reachable = false;
    let seen = [lost.clone(), replica("0-1-41"), behind_and_down];
    assert_eq!(most_advanced(&seen, 0), Some(1));
    assert_eq!(most_advanced(&[replica("0-1-50"), lost], 0), None);
}

#[test]
fn a_writer_that_went_and_was_replaced_stays_fenced_until_it_replicates_from_the_new_one() {
    let set = ReplicaSet::new(vec!["a:1".into(), "b:1".into()], true);
    let at = |set: &ReplicaSet| match set.writer() {
        Writer::At { host, .. } => Some(host),
        _ => None,
    };
    set.record(vec![host(true, false), host(true, true)]);
    assert_eq!(at(&set), Some(0));
    set.record(vec![host(false, false), host(true, true)]);
    assert_eq!(set.writer(), Writer::None);
    // Another instance promoted b.
    set.record(vec![host(false, false), host(true, false)]);
    assert_eq!(at(&set), Some(1));
    // a restarts writable: not a split brain, not the writer.
    set.record(vec![host(true, false), host(true, false)]);
    assert_eq!(at(&set), Some(1));
    assert_eq!(set.view(2)[0].role, "fenced");
    // For the dictionary, once.
    assert_eq!(set.take_fence_changes(), [("a:1".to_string(), true)]);
    assert_eq!(set.take_fence_changes(), []);
    let replicating_from = |source: &str, sql_running: bool| Health {
        replication: Some(Replication {
            source: source.into(),
            io_running: true,
            sql_running,
            ..Replication::default()
        }),
        ..host(true, true)
    };
    for not_rejoined in [
        replicating_from("c:1", true),
        replicating_from("b:1", false),
    ] {
        set.record(vec![not_rejoined, host(true, false)]);
        assert_eq!(set.view(2)[0].role, "fenced");
    }
    set.record(vec![replicating_from("b:1", true), host(true, false)]);
    assert_eq!(set.view(2)[0].role, "replica");
    assert_eq!(at(&set), Some(1));
    assert_eq!(set.take_fence_changes(), [("a:1".to_string(), false)]);

    // An instance that did not see the failover reads the fence.
    let later = ReplicaSet::new(vec!["a:1".into(), "b:1".into()], true);
    later.fenced_elsewhere(&["a:1".to_string()]);
    later.record(vec![host(true, false), host(true, false)]);
    assert_eq!(at(&later), Some(1));
    assert_eq!(later.take_fence_changes(), []);

    // Without automatic failover, hscale only follows: the old writer
    // back writable is a split brain.
    let external = ReplicaSet::new(vec!["a:1".into(), "b:1".into()], false);
    external.record(vec![host(true, false), host(true, true)]);
    external.record(vec![host(false, false), host(true, true)]);
    external.record(vec![host(false, false), host(true, false)]);
    external.record(vec![host(true, false), host(true, false)]);
    assert_eq!(external.writer(), Writer::Several(vec![0, 1]));
}

#[test]
fn a_lone_host_is_the_writer_before_any_check() {
    let set = ReplicaSet::new(vec!["127.0.0.1:3306".into()], false);
    assert!(matches!(set.writer(), Writer::At { host: 0, .. }));
    assert_ne!(set.generation(), 0);
    let pair = ReplicaSet::new(vec!["a:1".into(), "b:1".into()], false);
    assert_eq!(pair.writer(), Writer::Unknown);
    assert_eq!(pair.generation(), 0);
}
