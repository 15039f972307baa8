//! Deadlocks across backends. Each server sees only its own lock waits: a
//! client's transaction waiting on backend 1 for a row that a second
//! client holds there, while the second waits on backend 2 for a row of the
//! first, is a cycle neither InnoDB sees, and both wait until
//! `innodb_lock_wait_timeout`. hscale sees both halves: each backend's lock
//! waits, between server threads, and which client session holds each
//! thread. `victims` joins them into one wait-for graph between sessions and
//! names, for each cycle, the session to end — as InnoDB does on one
//! server, the transaction that did least (its lowest total weight, rows
//! locked and changed), the greatest session key on a tie (the youngest
//! session of one instance). A session key is whatever names a session
//! alike in every instance that reads the same waits, so that each picks
//! the same victim and only its owner ends it.

use std::collections::{BTreeMap, BTreeSet};

/// One server thread's transaction, as `information_schema.INNODB_TRX`
/// lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTrx {
    pub backend: u32,
    pub thread: u32,
    /// Rows locked and changed: what ending it would undo.
    pub weight: u64,
    /// The threads whose locks it waits for.
    pub waits_for: Vec<u32>,
}

/// A session to end: its statement waits on `thread` of `backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Victim<S> {
    pub session: S,
    pub backend: u32,
    pub thread: u32,
}

/// The victims of every cycle among sessions in `trxs`. `owner` names the
/// session holding a server thread, `None` for threads no session of this
/// session is known to hold (they break no cycle hscale can see). Ending
/// one victim breaks its cycles; a cycle that remains names another.
pub fn victims<S: Ord + Clone>(
    trxs: &[ServerTrx],
    owner: impl Fn(u32, u32) -> Option<S>,
) -> Vec<Victim<S>> {
    let mut weight: BTreeMap<S, u64> = BTreeMap::new();
    let mut edges: Edges<S> = BTreeMap::new();
    for trx in trxs {
        let Some(session) = owner(trx.backend, trx.thread) else {
            continue;
        };
        *weight.entry(session.clone()).or_default() += trx.weight;
        for &blocker in &trx.waits_for {
            match owner(trx.backend, blocker) {
                Some(holder) if holder != session => {
                    let entry = edges
                        .entry(session.clone())
                        .or_insert_with(|| (BTreeSet::new(), (trx.backend, trx.thread)));
                    entry.0.insert(holder);
                }
                _ => {}
            }
        }
    }
    let mut found = Vec::new();
    while let Some(cycle) = find_cycle(&edges) {
        let session = cycle
            .iter()
            .min_by_key(|&s| (weight.get(s).copied().unwrap_or(0), std::cmp::Reverse(s)))
            .expect("a cycle has members")
            .clone();
        let (_, (backend, thread)) = edges.remove(&session).expect("a member waits");
        found.push(Victim {
            session,
            backend,
            thread,
        });
    }
    found
}

/// Each waiting session: the sessions it waits for, and the (backend,
/// thread) it waits on.
type Edges<S> = BTreeMap<S, (BTreeSet<S>, (u32, u32))>;

/// Some cycle of the graph, as its members.
fn find_cycle<S: Ord + Clone>(edges: &Edges<S>) -> Option<Vec<S>> {
    // Depth first from each session in turn; `path` is the current chain.
    let mut done = BTreeSet::new();
    for start in edges.keys() {
        if done.contains(start) {
            continue;
        }
        let mut path = vec![start.clone()];
        let mut next: Vec<Vec<S>> = vec![successors(edges, start)];
        while let Some(options) = next.last_mut() {
            match options.pop() {
                Some(s) => {
                    if let Some(at) = path.iter().position(|p| *p == s) {
                        return Some(path[at..].to_vec());
                    }
                    if done.contains(&s) {
                        continue;
                    }
                    next.push(successors(edges, &s));
                    path.push(s);
                }
                None => {
                    done.insert(path.pop().expect("one per level"));
                    next.pop();
                }
            }
        }
    }
    None
}

fn successors<S: Ord + Clone>(edges: &Edges<S>, session: &S) -> Vec<S> {
    edges
        .get(session)
        .map(|(to, _)| to.iter().cloned().collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trx(backend: u32, thread: u32, weight: u64, waits_for: &[u32]) -> ServerTrx {
        ServerTrx {
            backend,
            thread,
            weight,
            waits_for: waits_for.to_vec(),
        }
    }

    /// Backend b's thread t is held by session t / 10 (threads 10, 11 by
    /// session 1; 20, 21 by session 2; ...).
    fn by_tens(_backend: u32, thread: u32) -> Option<u32> {
        (thread >= 10).then_some(thread / 10)
    }

    #[test]
    fn a_cycle_through_two_backends_ends_the_transaction_that_did_least() {
        // Session 1 waits on backend 1 for session 2's row; session 2 on
        // backend 2 for session 1's.
        let trxs = [
            trx(1, 10, 5, &[20]),
            trx(1, 20, 2, &[]),
            trx(2, 11, 3, &[]),
            trx(2, 21, 2, &[11]),
        ];
        let victims = victims(&trxs, by_tens);
        assert_eq!(
            victims,
            [Victim {
                session: 2,
                backend: 2,
                thread: 21
            }]
        );
    }

    #[test]
    fn on_equal_weights_the_youngest_session_ends() {
        let trxs = [
            trx(1, 10, 1, &[20]),
            trx(2, 21, 1, &[11]),
            trx(2, 11, 1, &[]),
        ];
        assert_eq!(victims(&trxs, by_tens)[0].session, 2);
    }

    #[test]
    fn waits_without_a_cycle_end_nothing() {
        // A chain 1 -> 2 -> 3, and a wait on a thread no session holds.
        let trxs = [
            trx(1, 10, 1, &[20]),
            trx(2, 21, 1, &[30]),
            trx(1, 31, 1, &[5]),
        ];
        assert!(victims(&trxs, by_tens).is_empty());
    }

    #[test]
    fn a_session_waiting_on_its_own_thread_is_no_cycle() {
        // A scan's two connections to one backend: the server's business.
        let trxs = [trx(1, 10, 1, &[11])];
        assert!(victims(&trxs, by_tens).is_empty());
    }

    #[test]
    fn each_cycle_gives_one_victim_and_a_shared_member_breaks_both() {
        // Cycles 1 <-> 2 and 3 <-> 4, and 5 <-> 6 <-> 7 <-> 5.
        let trxs = [
            trx(1, 10, 9, &[20]),
            trx(2, 21, 1, &[11]),
            trx(1, 30, 9, &[40]),
            trx(2, 41, 1, &[31]),
            trx(1, 50, 9, &[60]),
            trx(2, 61, 9, &[70]),
            trx(3, 71, 1, &[51]),
        ];
        let mut sessions: Vec<u32> = victims(&trxs, by_tens).iter().map(|v| v.session).collect();
        sessions.sort();
        assert_eq!(sessions, [2, 4, 7]);
        // Session 1 waits for 2 and 3, both waiting for 1: ending 1 breaks both.
        let shared = [
            trx(1, 10, 1, &[20, 30]),
            trx(2, 21, 5, &[11]),
            trx(3, 31, 5, &[12]),
        ];
        assert_eq!(
            victims(&shared, by_tens)
                .iter()
                .map(|v| v.session)
                .collect::<Vec<_>>(),
            [1]
        );
    }
}
