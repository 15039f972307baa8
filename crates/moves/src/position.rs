//! A place in a server's binary log: a file and an offset in it. A move
//! records where its copy's snapshot stood and how far its applier got, and
//! compares the two.

use std::cmp::Ordering;
use std::fmt;

/// Where an event ends in the binary log (the next event's start).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BinlogPosition {
    pub file: String,
    pub offset: u64,
}

impl BinlogPosition {
    pub fn new(file: impl Into<String>, offset: u64) -> BinlogPosition {
        BinlogPosition {
            file: file.into(),
            offset,
        }
    }

    /// The file's sequence number: the server names its log files
    /// `<base>.<number>`, and a later file has a greater number.
    fn sequence(&self) -> Option<u64> {
        self.file.rsplit_once('.')?.1.parse().ok()
    }

    /// `file:offset`, as SHOW_MOVES and the logs print it, and the
    /// dictionary stores it.
    pub fn parse(text: &str) -> Option<BinlogPosition> {
        let (file, offset) = text.rsplit_once(':')?;
        Some(BinlogPosition::new(file, offset.parse().ok()?))
    }
}

impl fmt::Display for BinlogPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.offset)
    }
}

impl PartialOrd for BinlogPosition {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for BinlogPosition {
    fn cmp(&self, other: &Self) -> Ordering {
        let by_file = match (self.sequence(), other.sequence()) {
            (Some(a), Some(b)) => a.cmp(&b),
            _ => self.file.cmp(&other.file),
        };
        by_file.then(self.offset.cmp(&other.offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_file_is_later_whatever_its_offsets_and_digits() {
        let early = BinlogPosition::new("binlog.000009", 90_000);
        let late = BinlogPosition::new("binlog.000010", 4);
        assert!(early < late);
        assert!(BinlogPosition::new("b.999999", 1) < BinlogPosition::new("b.1000000", 1));
        assert!(BinlogPosition::new("b.000002", 5) < BinlogPosition::new("b.000002", 6));
        assert_eq!(
            BinlogPosition::parse("my:log.000003:1234"),
            Some(BinlogPosition::new("my:log.000003", 1234))
        );
        assert_eq!(late.to_string(), "binlog.000010:4");
        assert_eq!(BinlogPosition::parse("nothing"), None);
    }
}
