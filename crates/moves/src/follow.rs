//! Which of the source's logged changes the applier applies, and when: a
//! plain transaction's rows as they come, an XA transaction's at its `XA
//! COMMIT` (held from its PREPARE, dropped at its `XA ROLLBACK`), and none
//! up to where an earlier applier stood or the first chunk's snapshot
//! (`replay_until`), where the log is read again only to hold the XA
//! transactions prepared there and decided after it.

use crate::apply::RowFilter;
use crate::binlog::{Decoded, RowChange};
use crate::position::BinlogPosition;
use crate::table::MovedTable;
use crate::xa::{Group, Undecided, Xid};
use crate::MoveError;

/// One part the move writes: its table and which rows it takes.
pub type PartView<'a> = (&'a MovedTable, &'a dyn RowFilter);

/// What the applier does for one event.
#[derive(Debug)]
pub enum Step {
    /// These row changes, in the transaction being applied.
    Apply(Vec<RowChange>),
    /// A transaction committed here: a point the destination may commit
    /// at; with the changes of the XA transaction that committed.
    Commit(Option<Group>),
    /// A statement changed the watched table's definition.
    Ddl(String),
    /// Nothing to do.
    Skip,
}

pub struct Follower {
    undecided: Undecided,
    replay_until: Option<BinlogPosition>,
}

impl Follower {
    /// For `parts` parts; events that end at or before `replay_until` are
    /// on the destination already.
    pub fn new(undecided: Undecided, replay_until: Option<BinlogPosition>) -> Follower {
        Follower {
            undecided,
            replay_until,
        }
    }

    /// `event`, which ends at `at` in the log.
    pub fn step(
        &mut self,
        event: Decoded,
        at: &BinlogPosition,
        parts: &[PartView],
    ) -> Result<Step, MoveError> {
        let replayed = self.replayed(at);
        let committed = match event {
            Decoded::Rows(changes) if self.undecided.is_reading() => {
                for (i, (table, filter)) in parts.iter().enumerate() {
                    self.undecided.absorb(i, table, &changes, *filter)?;
                }
                return Ok(Step::Skip);
            }
            Decoded::Rows(_) if replayed => return Ok(Step::Skip),
            Decoded::Rows(changes) => return Ok(Step::Apply(changes)),
            Decoded::Commit => None,
            Decoded::XaStart { at } => {
                self.undecided.start(at);
                return Ok(Step::Skip);
            }
            Decoded::XaPrepared { xid, one_phase } => match self.undecided.prepared(xid, one_phase)
            {
                Some(group) => Some(group),
                None => return Ok(Step::Skip),
            },
            Decoded::XaEnded { xid, committed } => match self.undecided.decided(&xid) {
                Some(group) if committed => Some(group),
                _ => return Ok(Step::Skip),
            },
            Decoded::Ddl(sql) => return Ok(Step::Ddl(sql)),
            Decoded::Other => return Ok(Step::Skip),
        };
        Ok(match replayed {
            true => Step::Skip,
            false => Step::Commit(committed),
        })
    }

    fn replayed(&self, at: &BinlogPosition) -> bool {
        self.replay_until.as_ref().is_some_and(|until| at <= until)
    }

    /// What a checkpoint at `at` records as `undecided_from`; `None` while
    /// `at` is still in the replayed part (the checkpoint keeps its own).
    pub fn undecided_from(&self, at: &BinlogPosition) -> Option<Option<BinlogPosition>> {
        match self.replay_until.as_ref().is_some_and(|until| at < until) {
            true => None,
            false => Some(self.undecided.earliest().cloned()),
        }
    }

    /// An undecided XA transaction that changed rows the move takes.
    pub fn touching(&self) -> Option<&Xid> {
        self.undecided.touching()
    }
}

#[cfg(test)]
mod tests {
    //! On a binary log MariaDB wrote (tests/data/record-xa.sh): its
    //! transactions applied to an emulated destination, a map from each
    //! row's key to the row, compared with the table the server had.

    use std::collections::BTreeMap;

    use super::*;
    use crate::apply::{EveryRow, PendingChanges};
    use crate::binlog::{Decoder, Watched};
    use crate::columns::Column;

    const LOG: &[u8] = include_bytes!("../tests/data/xa.binlog");
    const FILE: &str = "bin.000001";

    fn position(name: &str) -> u64 {
        include_str!("../tests/data/xa.positions")
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix('='))
            .and_then(|offset| offset.parse().ok())
            .unwrap_or_else(|| panic!("no position {name}"))
    }

    /// `id v` lines as the destination holds them.
    fn rows(text: &str) -> Vec<String> {
        text.lines()
            .map(|line| format!("({})", line.replace(' ', ", ")))
            .collect()
    }

    fn table() -> MovedTable {
        MovedTable {
            source: "`d`.`t`".into(),
            destination: "`d`.`t2`".into(),
            columns: vec![
                Column::classify("id", "int", "int(11)", None).unwrap(),
                Column::classify("v", "int", "int(11)", None).unwrap(),
            ],
            key: vec![0],
        }
    }

    /// Each event of the log as a dump sends it: the format description
    /// first (without a position, as a dump's is), then those from `from`.
    fn dump(from: u64) -> Vec<Vec<u8>> {
        let mut at = 4;
        let mut events = Vec::new();
        while at < LOG.len() {
            let size = u32::from_le_bytes(LOG[at + 9..at + 13].try_into().unwrap()) as usize;
            let mut event = LOG[at..at + size].to_vec();
            if at == 4 {
                event[13..17].copy_from_slice(&0u32.to_le_bytes());
                events.push(event);
            } else if at as u64 >= from {
                events.push(event);
            }
            at += size;
        }
        events
    }

    struct Destination {
        rows: BTreeMap<String, Option<String>>,
    }

    impl Destination {
        fn holding(lines: &str) -> Destination {
            let t = table();
            let mut rows = BTreeMap::new();
            for line in lines.lines() {
                let id = line.split(' ').next().unwrap();
                let key = format!("({} = {id})", crate::ident(&t.columns[0].name));
                rows.insert(key, Some(format!("({})", line.replace(' ', ", "))));
            }
            Destination { rows }
        }

        fn take(&mut self, pending: &mut PendingChanges) {
            self.rows.extend(pending.drain());
        }

        fn rows(&self) -> Vec<String> {
            let mut rows: Vec<(i64, String)> = self
                .rows
                .values()
                .flatten()
                .map(|row| {
                    let id = row[1..].split(',').next().unwrap().parse().unwrap();
                    (id, row.clone())
                })
                .collect();
            rows.sort();
            rows.into_iter().map(|(_, row)| row).collect()
        }
    }

    /// Reads the log from `from` up to `until` into `into`, a follower
    /// made with `replay_until`; the follower, and where a checkpoint at
    /// `until` says to read from again.
    fn follow(
        into: &mut Destination,
        from: u64,
        replay_until: Option<u64>,
        until: u64,
    ) -> (Follower, Option<BinlogPosition>) {
        let t = table();
        let watched = Watched {
            db: "d".into(),
            table: "t".into(),
            columns: 2,
        };
        let mut decoder = Decoder::new(BinlogPosition::new(FILE, from), watched, true);
        let replay_until = replay_until.map(|at| BinlogPosition::new(FILE, at));
        let mut follower = Follower::new(Undecided::with_memory(1, 64), replay_until);
        let parts: [PartView; 1] = [(&t, &EveryRow)];
        let mut pending = PendingChanges::default();
        for event in dump(from) {
            if decoder.position().offset >= until {
                break;
            }
            let decoded = decoder.decode(&event).unwrap();
            match follower.step(decoded, decoder.position(), &parts).unwrap() {
                Step::Apply(changes) => pending.absorb(&t, &changes, &EveryRow).unwrap(),
                Step::Commit(group) => {
                    for change in group.into_iter().flat_map(|g| g.into_changes().unwrap()) {
                        let (part, key, row) = change.unwrap();
                        assert_eq!(part, 0);
                        pending.hold(key, row);
                    }
                    into.take(&mut pending);
                }
                Step::Ddl(sql) => panic!("no DDL in this log: {sql}"),
                Step::Skip => {}
            }
        }
        let at = BinlogPosition::new(FILE, until);
        let from = follower
            .undecided_from(&at)
            .expect("past the replayed part");
        (follower, from)
    }

    #[test]
    fn a_log_of_xa_transactions_applies_to_what_the_server_committed() {
        let mut destination = Destination::holding("");
        let (follower, from) = follow(&mut destination, position("start"), None, position("end"));
        assert_eq!(
            destination.rows(),
            rows(include_str!("../tests/data/xa.rows"))
        );
        // 'f' is prepared at the end and not decided: held, not applied.
        assert!(follower.touching().is_some());
        assert!(from.is_some_and(|f| f.offset < position("end")));
    }

    #[test]
    fn a_commit_of_a_transaction_prepared_before_the_snapshot_is_applied() {
        // The copy read the table at `snapshot`, where 'a' and 'b' were
        // prepared: the applier reads from before them and applies nothing
        // up to the snapshot but holds them; 'a' commits after it.
        let snapshot = include_str!("../tests/data/xa.snapshot");
        let mut destination = Destination::holding(snapshot);
        follow(
            &mut destination,
            position("start"),
            Some(position("snapshot")),
            position("end"),
        );
        assert_eq!(
            destination.rows(),
            rows(include_str!("../tests/data/xa.rows"))
        );

        // Read from the snapshot alone, 'a''s commit finds nothing held:
        // the write the issue found lost.
        let mut from_snapshot = Destination::holding(snapshot);
        let snapshot_at = position("snapshot");
        follow(
            &mut from_snapshot,
            snapshot_at,
            Some(snapshot_at),
            position("end"),
        );
        assert_ne!(
            from_snapshot.rows(),
            rows(include_str!("../tests/data/xa.rows"))
        );
        assert!(from_snapshot.rows().contains(&"(1, 1)".to_string()));
    }

    #[test]
    fn a_checkpoint_with_undecided_transactions_resumes_without_losing_or_repeating_them() {
        let checkpoint = position("checkpoint");
        let mut destination = Destination::holding("");
        let (_, from) = follow(&mut destination, position("start"), None, checkpoint);
        let from = from.expect("'d' is prepared and undecided at the checkpoint");
        assert!(from.offset < checkpoint);
        let before: Vec<String> = destination.rows();
        assert!(before.contains(&"(3, 3)".to_string()), "{before:?}");
        // A new applier: from the earliest undecided transaction, applying
        // nothing up to the checkpoint.
        follow(
            &mut destination,
            from.offset,
            Some(checkpoint),
            position("end"),
        );
        assert_eq!(
            destination.rows(),
            rows(include_str!("../tests/data/xa.rows"))
        );
    }

    #[test]
    fn rolled_back_and_one_phase_transactions_end_as_the_server_ended_them() {
        let mut destination = Destination::holding("");
        follow(&mut destination, position("start"), None, position("end"));
        let rows = destination.rows();
        // 'b' (rolled back from another connection) left id 2 at 2; 'c'
        // (ONE PHASE) inserted id 6; 'f' (undecided) did not insert 7.
        assert!(rows.contains(&"(2, 2)".to_string()), "{rows:?}");
        assert!(rows.contains(&"(6, 6)".to_string()), "{rows:?}");
        assert!(!rows.iter().any(|r| r.starts_with("(7,")), "{rows:?}");
    }
}
