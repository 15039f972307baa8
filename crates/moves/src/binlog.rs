//! The source's binary log as a move reads it: events in, row changes of
//! the moved table and transaction ends out, with the position after each.
//! mysql_common parses the events; MariaDB's own event types (GTID,
//! annotations, checkpoints) carry nothing a move applies and are passed
//! over by their type number.

use mysql_common::binlog::consts::BinlogVersion;
use mysql_common::binlog::events::{Event, EventData, RotateEvent};
use mysql_common::binlog::value::BinlogValue;
use mysql_common::binlog::EventStreamReader;

use crate::position::BinlogPosition;
use crate::xa::Xid;
use crate::MoveError;

/// One row image: a value per column, in the table's order.
pub type Image = Vec<BinlogValue<'static>>;

/// A change to one row of the moved table, as the source committed it.
#[derive(Debug, Clone, PartialEq)]
pub enum RowChange {
    Insert(Image),
    Update { before: Image, after: Image },
    Delete(Image),
}

/// What one event means to a move.
#[derive(Debug, PartialEq)]
pub enum Decoded {
    /// Row changes of the watched table.
    Rows(Vec<RowChange>),
    /// A transaction ended (committed): a point the destination may
    /// commit at, and the applier's checkpoint with it.
    Commit,
    /// An XA transaction's prepared group begins (MariaDB's GTID event
    /// flagged as prepared XA) at `at`: its row changes follow, up to its
    /// `XaPrepared`, and count only once a later `XaEnded` commits them.
    XaStart { at: BinlogPosition },
    /// The prepared group ends: it is `xid`'s. `one_phase`: committed
    /// with it (`XA COMMIT ... ONE PHASE` where the server logs it so).
    XaPrepared { xid: Xid, one_phase: bool },
    /// `XA COMMIT xid` (`committed`) or `XA ROLLBACK xid` of a prepared
    /// transaction, possibly long after its group and from another
    /// connection.
    XaEnded { xid: Xid, committed: bool },
    /// A statement changed the watched table's definition (DDL).
    Ddl(String),
    /// Nothing a move applies.
    Other,
}

/// The watched table: its database and name on the source.
#[derive(Debug, Clone)]
pub struct Watched {
    pub db: String,
    pub table: String,
    pub columns: usize,
}

/// Reads a dump's events in order and keeps the position after the last.
pub struct Decoder {
    reader: EventStreamReader,
    position: BinlogPosition,
    watched: Watched,
    /// The dump's events end in a CRC32 (`binlog_checksum`).
    checksums: bool,
    /// A format description was read: the reader knows about checksums.
    described: bool,
    /// When the source wrote the last event read (seconds since the epoch).
    timestamp: u32,
}

/// MariaDB's event types that mysql_common does not know; none of them
/// changes rows.
const MARIADB_EVENTS: std::ops::RangeInclusive<u8> = 160..=175;
const QUERY_EVENT: u8 = 0x02;
const ROTATE_EVENT: u8 = 0x04;
const FORMAT_DESCRIPTION_EVENT: u8 = 0x0f;
const XID_EVENT: u8 = 0x10;
const XA_PREPARE_EVENT: u8 = 38;
/// MariaDB's GTID event: it starts every event group, and says whether
/// the group is an XA transaction's prepared half.
const MARIADB_GTID_EVENT: u8 = 162;
/// The GTID event's `flags2` bit of a group that XA PREPARE wrote.
const FL_PREPARED_XA: u8 = 64;

impl Decoder {
    /// Reading from `start`, for the rows of `watched`; `checksums`: the
    /// server's binlog_checksum is CRC32.
    pub fn new(start: BinlogPosition, watched: Watched, checksums: bool) -> Decoder {
        Decoder {
            reader: EventStreamReader::new(BinlogVersion::Version4),
            position: start,
            watched,
            checksums,
            described: false,
            timestamp: 0,
        }
    }

    /// When the source wrote the last event read, in seconds since the
    /// epoch; 0 before the first.
    pub fn timestamp(&self) -> u32 {
        self.timestamp
    }

    /// The position after the last event read: where a dump resumes.
    pub fn position(&self) -> &BinlogPosition {
        &self.position
    }

    /// One event, as a dump packet carries it (after its 0x00 byte).
    pub fn decode(&mut self, bytes: &[u8]) -> Result<Decoded, MoveError> {
        let event = self
            .reader
            .read(bytes)
            .map_err(|e| MoveError::Binlog(format!("an event at {}: {e}", self.position)))?
            .ok_or_else(|| MoveError::Binlog("an empty event".into()))?;
        let header = event.header();
        let kind = header.event_type_raw();
        if kind == FORMAT_DESCRIPTION_EVENT {
            self.described = true;
        }
        if kind == ROTATE_EVENT {
            let rotate: RotateEvent = event
                .read_event()
                .map_err(|e| MoveError::Binlog(format!("a rotate event: {e}")))?;
            let mut name = rotate.name_raw().to_vec();
            // The dump's first event comes before the format description
            // that tells the reader to take the checksum off.
            if self.checksums && !self.described {
                name.truncate(name.len().saturating_sub(4));
            }
            let name = String::from_utf8(name)
                .map_err(|_| MoveError::Binlog("a binlog file name that is not text".into()))?;
            self.position = BinlogPosition::new(name, rotate.position());
            return Ok(Decoded::Other);
        }
        let starts_at = self.position.offset;
        // A dump's artificial events (the format description a dump starts
        // with, heartbeats) have no position of their own.
        if header.log_pos() != 0 {
            self.position.offset = u64::from(header.log_pos());
            self.timestamp = header.timestamp();
        }
        if kind == MARIADB_GTID_EVENT {
            // seq_no (8 bytes), domain_id (4), flags2 (1), ...
            let prepared = event
                .data()
                .get(12)
                .is_some_and(|f| f & FL_PREPARED_XA != 0);
            return Ok(match prepared && header.log_pos() != 0 {
                true => Decoded::XaStart {
                    at: BinlogPosition::new(self.position.file.clone(), starts_at),
                },
                false => Decoded::Other,
            });
        }
        if MARIADB_EVENTS.contains(&kind) {
            return Ok(Decoded::Other);
        }
        match kind {
            XID_EVENT => Ok(Decoded::Commit),
            QUERY_EVENT => self.query(&event),
            XA_PREPARE_EVENT => self.xa_prepare(event.data()),
            _ => self.rows(&event),
        }
    }

    /// one_phase (1 byte), formatID (4), gtrid_length (4), bqual_length
    /// (4), gtrid and bqual.
    fn xa_prepare(&self, data: &[u8]) -> Result<Decoded, MoveError> {
        let broken = || {
            MoveError::Binlog(format!(
                "an XA PREPARE event at {} cut short",
                self.position
            ))
        };
        let word = |at: usize| -> Option<u32> {
            Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
        };
        let (format, gtrid, bqual) = (
            word(1).ok_or_else(broken)?,
            word(5).ok_or_else(broken)? as usize,
            word(9).ok_or_else(broken)? as usize,
        );
        let ids = data.get(13..13 + gtrid + bqual).ok_or_else(broken)?;
        Ok(Decoded::XaPrepared {
            xid: Xid::new(format, &ids[..gtrid], &ids[gtrid..]),
            one_phase: data[0] != 0,
        })
    }

    fn query(&self, event: &Event) -> Result<Decoded, MoveError> {
        let Ok(Some(EventData::QueryEvent(query))) = event.read_data() else {
            return Ok(Decoded::Other);
        };
        let sql = query.query();
        let verb = sql
            .trim_start()
            .split_ascii_whitespace()
            .next()
            .unwrap_or("");
        if verb.eq_ignore_ascii_case("COMMIT") {
            return Ok(Decoded::Commit);
        }
        if verb.eq_ignore_ascii_case("XA") {
            return Ok(xa_decision(&sql).unwrap_or(Decoded::Other));
        }
        if verb.eq_ignore_ascii_case("BEGIN") {
            return Ok(Decoded::Other);
        }
        // A statement logged as text changes no rows under ROW format,
        // except DDL: a mention of the table is enough to stop a move.
        match mentions(&sql, &query.schema(), &self.watched) {
            true => Ok(Decoded::Ddl(sql.into_owned())),
            false => Ok(Decoded::Other),
        }
    }

    fn rows(&self, event: &Event) -> Result<Decoded, MoveError> {
        let broken = |e: std::io::Error| MoveError::Binlog(format!("at {}: {e}", self.position));
        let Some(EventData::RowsEvent(rows)) = event.read_data().map_err(broken)? else {
            return Ok(Decoded::Other);
        };
        let Some(map) = self.reader.get_tme(rows.table_id()) else {
            return Err(MoveError::Binlog(format!(
                "a row event at {} without its table map",
                self.position
            )));
        };
        if map.database_name() != self.watched.db.as_str()
            || map.table_name() != self.watched.table.as_str()
        {
            return Ok(Decoded::Other);
        }
        let mut changes = Vec::new();
        for row in rows.rows(map) {
            let (before, after) = row.map_err(broken)?;
            let image = |row: Option<mysql_common::binlog::row::BinlogRow>| {
                row.map(|r| r.unwrap())
                    .filter(|values| values.len() == self.watched.columns)
                    .ok_or_else(|| {
                        MoveError::Unsupported(format!(
                            "a row image of `{}`.`{}` without every column: moves need binlog_row_image=FULL",
                            self.watched.db, self.watched.table
                        ))
                    })
            };
            changes.push(match (before.is_some(), after.is_some()) {
                (false, true) => RowChange::Insert(image(after)?),
                (true, true) => RowChange::Update {
                    before: image(before)?,
                    after: image(after)?,
                },
                (true, false) => RowChange::Delete(image(before)?),
                (false, false) => continue,
            });
        }
        Ok(Decoded::Rows(changes))
    }
}

/// `XA COMMIT xid` or `XA ROLLBACK xid` as the server logs them (the xid
/// as `X'gtrid',X'bqual',formatID`); other XA statements (`XA END`) are
/// none.
fn xa_decision(sql: &str) -> Option<Decoded> {
    let mut words = sql
        .trim_start()
        .splitn(3, |c: char| c.is_ascii_whitespace());
    let _xa = words.next()?;
    let verb = words.next()?;
    let committed = match verb.to_ascii_uppercase().as_str() {
        "COMMIT" => true,
        "ROLLBACK" => false,
        _ => return None,
    };
    let xid = Xid::parse_logged(words.next()?)?;
    Some(Decoded::XaEnded { xid, committed })
}

/// Why a backend's binary log cannot feed a move, from its `log_bin`,
/// `binlog_format` and `binlog_row_image`; `None` when it can.
pub fn binlog_refusal(backend: u32, log_bin: &str, format: &str, image: &str) -> Option<MoveError> {
    let what = if log_bin != "1" {
        "has no binary log (log_bin is off)".to_string()
    } else if !format.eq_ignore_ascii_case("ROW") {
        format!("logs in binlog_format={format}")
    } else if !image.eq_ignore_ascii_case("FULL") {
        format!("logs binlog_row_image={image}")
    } else {
        return None;
    };
    Some(MoveError::Unsupported(format!(
        "backend {backend} {what}: moves read the source's binary log and need log_bin, binlog_format=ROW and binlog_row_image=FULL"
    )))
}

/// Whether `sql`, run in database `schema`, names the watched table: its
/// name as a whole identifier, qualified by its database or unqualified in
/// it. Other databases' tables of that name, and names that merely contain
/// it (a move's own `_hscale_rest_…`), are not it.
fn mentions(sql: &str, schema: &str, watched: &Watched) -> bool {
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80;
    let lower = sql.to_lowercase();
    let (table, db) = (watched.table.to_lowercase(), watched.db.to_lowercase());
    let bytes = lower.as_bytes();
    let mut from = 0;
    while let Some(found) = lower[from..].find(&table) {
        let start = from + found;
        let end = start + table.len();
        from = start + 1;
        if start > 0 && word(bytes[start - 1]) || end < bytes.len() && word(bytes[end]) {
            continue;
        }
        let before = lower[..start].trim_end_matches('`');
        let qualifier = before.strip_suffix('.').map(|q| {
            let q = q.trim_end_matches('`');
            let begin = q.bytes().rposition(|c| !word(c)).map_or(0, |i| i + 1);
            &q[begin..]
        });
        let in_db = match qualifier {
            Some(q) => q == db,
            None => schema.eq_ignore_ascii_case(&watched.db),
        };
        if in_db {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binary_log_that_cannot_feed_a_move_is_refused_with_what_is_missing() {
        let refused = |log_bin, format, image| {
            binlog_refusal(2, log_bin, format, image).map(|e| e.to_string())
        };
        assert_eq!(refused("1", "ROW", "FULL"), None);
        assert_eq!(refused("1", "row", "full"), None);
        let off = refused("0", "ROW", "FULL").unwrap();
        assert!(
            off.starts_with("backend 2 has no binary log (log_bin is off)"),
            "{off}"
        );
        let mixed = refused("1", "MIXED", "FULL").unwrap();
        assert!(mixed.contains("binlog_format=MIXED"), "{mixed}");
        let minimal = refused("1", "ROW", "MINIMAL").unwrap();
        assert!(minimal.contains("binlog_row_image=MINIMAL"), "{minimal}");
        assert!(minimal.contains("need log_bin, binlog_format=ROW and binlog_row_image=FULL"));
    }

    #[test]
    fn ddl_stops_a_move_only_when_it_names_the_watched_table() {
        let watched = Watched {
            db: "shop".into(),
            table: "items_default".into(),
            columns: 2,
        };
        let named = |sql: &str, schema: &str| mentions(sql, schema, &watched);
        assert!(named("ALTER TABLE items_default ADD COLUMN x INT", "shop"));
        assert!(named(
            "ALTER TABLE `shop`.`items_default` ADD x INT",
            "other"
        ));
        assert!(named("RENAME TABLE shop.Items_Default TO shop.x", ""));
        assert!(named("DROP TABLE a, `items_default`", "shop"));
        // Another database's table of that name.
        assert!(!named("ALTER TABLE items_default ADD x INT", "other"));
        assert!(!named(
            "ALTER TABLE `other`.`items_default` ADD x INT",
            "shop"
        ));
        // Names that contain it.
        assert!(!named(
            "CREATE TABLE `_hscale_rest_2_items_default` (id INT)",
            "shop"
        ));
        assert!(!named("CREATE TABLE items_default2 (id INT)", "shop"));
    }
}
