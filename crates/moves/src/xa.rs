//! XA transactions as a move meets them in the source's binary log. MariaDB
//! (10.5+) logs one in two event groups: at XA PREPARE its row changes,
//! between a GTID event flagged as prepared XA and an XA_prepare event
//! naming the xid; later, perhaps after other transactions and from another
//! connection, `XA COMMIT xid` or `XA ROLLBACK xid`. The applier holds each
//! prepared group's changes here, by xid, until the log decides it: applied
//! then, in commit order, or dropped. Groups are held in memory up to a
//! bound, in temporary files beyond it.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};

use crate::apply::{PendingChanges, RowFilter};
use crate::binlog::RowChange;
use crate::position::BinlogPosition;
use crate::table::MovedTable;
use crate::MoveError;

/// An XA transaction's id: formatID, gtrid and bqual.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Xid {
    pub format: u32,
    pub gtrid: Vec<u8>,
    pub bqual: Vec<u8>,
}

impl Xid {
    pub fn new(format: u32, gtrid: &[u8], bqual: &[u8]) -> Xid {
        Xid {
            format,
            gtrid: gtrid.to_vec(),
            bqual: bqual.to_vec(),
        }
    }

    /// The xid as the server logs it in `XA COMMIT` and `XA ROLLBACK`:
    /// `X'<hex>',X'<hex>',<formatID>`.
    pub fn parse_logged(text: &str) -> Option<Xid> {
        let mut parts = text.trim().splitn(3, ',');
        let hex = |part: &str| -> Option<Vec<u8>> {
            let inner = part.trim().strip_prefix("X'")?.strip_suffix('\'')?;
            (0..inner.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(inner.get(i..i + 2)?, 16).ok())
                .collect()
        };
        let gtrid = hex(parts.next()?)?;
        let bqual = hex(parts.next()?)?;
        let format = parts
            .next()?
            .trim()
            .trim_end_matches(|c: char| !c.is_ascii_digit())
            .parse()
            .ok()?;
        Some(Xid {
            format,
            gtrid,
            bqual,
        })
    }
}

impl fmt::Display for Xid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        write!(
            f,
            "X'{}',X'{}',{}",
            hex(&self.gtrid),
            hex(&self.bqual),
            self.format
        )
    }
}

/// Bytes of prepared groups held in memory, together, before a group
/// goes to a temporary file.
pub const HELD_IN_MEMORY: usize = 32 << 20;

/// One prepared transaction's changes, for each part the move writes.
pub struct Group {
    /// Where its first event starts: a resumed applier reads from here to
    /// hold it again.
    pub started: BinlogPosition,
    parts: Vec<PendingChanges>,
    /// Earlier changes, when memory ran short: `(part, key, row)` records.
    spilled: Option<BufWriter<File>>,
    /// It changed a row a part takes.
    touches: bool,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Group")
            .field("started", &self.started)
            .field("bytes", &self.bytes())
            .field("spilled", &self.spilled.is_some())
            .finish()
    }
}

impl Group {
    fn new(started: BinlogPosition, parts: usize) -> Group {
        Group {
            started,
            parts: (0..parts).map(|_| PendingChanges::default()).collect(),
            spilled: None,
            touches: false,
        }
    }

    fn bytes(&self) -> usize {
        self.parts.iter().map(PendingChanges::bytes).sum()
    }

    fn spill(&mut self) -> Result<(), MoveError> {
        let io = |e: std::io::Error| {
            MoveError::Binlog(format!(
                "a prepared XA transaction's changes could not be kept in a temporary file: {e}"
            ))
        };
        if self.spilled.is_none() {
            self.spilled = Some(BufWriter::new(tempfile::tempfile().map_err(io)?));
        }
        let file = self.spilled.as_mut().expect("made above");
        for (part, pending) in self.parts.iter_mut().enumerate() {
            for (key, row) in pending.drain() {
                write_record(file, part, &key, row.as_deref()).map_err(io)?;
            }
        }
        Ok(())
    }

    /// Its changes, `(part, key condition, row)` in the order they were
    /// made, the later of a row's last (see `PendingChanges::hold`).
    pub fn into_changes(mut self) -> Result<Changes, MoveError> {
        let memory: Vec<Record> = self
            .parts
            .iter_mut()
            .enumerate()
            .flat_map(|(part, pending)| pending.drain().map(move |(k, r)| (part, k, r)))
            .collect();
        let file = match self.spilled.take() {
            None => None,
            Some(file) => {
                let mut file = file.into_inner().map_err(|e| read_back(e.into_error()))?;
                file.seek(SeekFrom::Start(0)).map_err(read_back)?;
                Some(BufReader::new(file))
            }
        };
        Ok(Changes {
            file,
            memory: memory.into_iter(),
        })
    }
}

fn read_back(e: std::io::Error) -> MoveError {
    MoveError::Binlog(format!(
        "a prepared XA transaction's changes could not be read back from their temporary file: {e}"
    ))
}

/// A decided group's changes, its spilled ones first.
pub struct Changes {
    file: Option<BufReader<File>>,
    memory: std::vec::IntoIter<Record>,
}

impl Iterator for Changes {
    type Item = Result<Record, MoveError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(file) = self.file.as_mut() {
            match read_record(file) {
                Ok(Some(record)) => return Some(Ok(record)),
                Ok(None) => self.file = None,
                Err(e) => {
                    self.file = None;
                    return Some(Err(read_back(e)));
                }
            }
        }
        self.memory.next().map(Ok)
    }
}

fn write_record(
    out: &mut impl Write,
    part: usize,
    key: &str,
    row: Option<&str>,
) -> std::io::Result<()> {
    out.write_all(&(part as u32).to_le_bytes())?;
    out.write_all(&(key.len() as u64).to_le_bytes())?;
    out.write_all(key.as_bytes())?;
    match row {
        None => out.write_all(&u64::MAX.to_le_bytes()),
        Some(row) => {
            out.write_all(&(row.len() as u64).to_le_bytes())?;
            out.write_all(row.as_bytes())
        }
    }
}

/// A change to one part: the part, the row's key condition, the row as it
/// ends (`None`: removed).
pub type Record = (usize, String, Option<String>);

fn read_record(input: &mut impl Read) -> std::io::Result<Option<Record>> {
    let mut part = [0u8; 4];
    match input.read_exact(&mut part) {
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        other => other?,
    }
    let key = read_text(input)?.ok_or(std::io::ErrorKind::InvalidData)?;
    let row = read_text(input)?;
    Ok(Some((u32::from_le_bytes(part) as usize, key, row)))
}

/// A length (u64::MAX: none) and that many bytes of text.
fn read_text(input: &mut impl Read) -> std::io::Result<Option<String>> {
    let mut len = [0u8; 8];
    input.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len);
    if len == u64::MAX {
        return Ok(None);
    }
    let mut bytes = vec![0u8; len as usize];
    input.read_exact(&mut bytes)?;
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// The prepared XA transactions the applier has read in the log and the log
/// has not decided yet.
pub struct Undecided {
    /// The group being read: row changes go to it until its XA_prepare.
    reading: Option<Group>,
    held: HashMap<Xid, Group>,
    /// Bytes the held groups keep in memory.
    held_bytes: usize,
    parts: usize,
    memory: usize,
}

impl Undecided {
    /// For a move that writes `parts` parts.
    pub fn new(parts: usize) -> Undecided {
        Undecided::with_memory(parts, HELD_IN_MEMORY)
    }

    /// Holding up to `memory` bytes in memory.
    pub fn with_memory(parts: usize, memory: usize) -> Undecided {
        Undecided {
            reading: None,
            held: HashMap::new(),
            held_bytes: 0,
            parts,
            memory,
        }
    }

    /// A prepared group begins at `at`.
    pub fn start(&mut self, at: BinlogPosition) {
        self.reading = Some(Group::new(at, self.parts));
    }

    /// Row changes now belong to a prepared group.
    pub fn is_reading(&self) -> bool {
        self.reading.is_some()
    }

    /// One rows event's changes, into the group being read: those the
    /// part's filter takes.
    pub fn absorb(
        &mut self,
        part: usize,
        table: &MovedTable,
        changes: &[RowChange],
        filter: &dyn RowFilter,
    ) -> Result<(), MoveError> {
        let Some(group) = self.reading.as_mut() else {
            return Err(MoveError::Binlog(
                "row changes of an XA transaction outside its group".into(),
            ));
        };
        let before = group.parts[part].bytes();
        group.parts[part].absorb(table, changes, filter)?;
        group.touches |= group.parts[part].bytes() != before;
        if self.held_bytes + group.bytes() > self.memory {
            group.spill()?;
        }
        Ok(())
    }

    /// The group being read is `xid`'s; with `one_phase` it is committed
    /// already and comes back to be applied now.
    pub fn prepared(&mut self, xid: Xid, one_phase: bool) -> Option<Group> {
        let group = self.reading.take()?;
        if one_phase {
            return Some(group);
        }
        // One that changed no row the move takes is nothing to hold (nor to
        // read again from a checkpoint).
        if !group.touches {
            return None;
        }
        self.held_bytes += group.bytes();
        if let Some(replaced) = self.held.insert(xid, group) {
            // An xid is prepared again only once its last use ended.
            self.held_bytes -= replaced.bytes();
        }
        None
    }

    /// `xid` was decided: its group, if it is held.
    pub fn decided(&mut self, xid: &Xid) -> Option<Group> {
        let group = self.held.remove(xid)?;
        self.held_bytes -= group.bytes();
        Some(group)
    }

    /// Where the earliest undecided group starts: a resumed applier reads
    /// from there to hold them all again.
    pub fn earliest(&self) -> Option<&BinlogPosition> {
        self.held
            .values()
            .chain(&self.reading)
            .map(|g| &g.started)
            .min()
    }

    /// An undecided transaction that changed rows the move takes (every
    /// one held did).
    pub fn touching(&self) -> Option<&Xid> {
        self.held.keys().next()
    }
}
