//! The combined groups an ORDER BY over them keeps (`Spec::reorder`): the
//! first LIMIT + OFFSET in that order, or all of them without a LIMIT. At
//! most a memory budget of them is held; past it they are sorted and written
//! to a temporary file (a run), and the answer is merged from the runs and
//! what memory holds, one group of each at a time. Past the disk budget the
//! merge fails rather than fill the disk.

use std::cmp::Ordering;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, Write};
use std::path::PathBuf;

use bytes::Bytes;
use smallvec::SmallVec;

use crate::merger::{KeyValue, MergeError};

/// How much a merge may hold in memory and write to temporary files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pub memory_bytes: usize,
    pub spill_bytes: u64,
    /// Where temporary files go; `None`: the system's temporary directory.
    pub spill_dir: Option<PathBuf>,
}

impl Default for Budget {
    fn default() -> Budget {
        Budget {
            memory_bytes: 64 << 20,
            spill_bytes: 1 << 30,
            spill_dir: None,
        }
    }
}

/// A combined group: what each ORDER BY key compares (in `row`, or in
/// `first`, the group's first partition row, for a group key's weight), and
/// the client's row.
#[derive(Debug)]
pub(crate) struct Ranked {
    pub keys: SmallVec<[Option<KeyValue>; 2]>,
    pub row: Bytes,
    pub first: Bytes,
}

/// What a group costs in memory besides its bytes.
const OVERHEAD: usize = 96;

impl Ranked {
    fn size(&self) -> usize {
        self.row.len() + self.first.len() + OVERHEAD
    }
}

#[derive(Debug)]
pub(crate) struct Kept {
    /// How many groups the answer needs (OFFSET + LIMIT).
    keep: usize,
    budget: Budget,
    /// Groups in arrival order (sorted after each cut).
    memory: Vec<Ranked>,
    bytes: usize,
    runs: Vec<Run>,
    spilled: u64,
    /// Once the answer is being sent: the next group of each run (then of
    /// memory, last), and how many were sent.
    heads: Vec<Option<Ranked>>,
    sent: usize,
    draining: bool,
}

#[derive(Debug)]
struct Run {
    reader: BufReader<File>,
    left: usize,
}

impl Kept {
    pub fn new(keep: u64, budget: Budget) -> Kept {
        Kept {
            keep: usize::try_from(keep).unwrap_or(usize::MAX),
            budget,
            memory: Vec::new(),
            bytes: 0,
            runs: Vec::new(),
            spilled: 0,
            heads: Vec::new(),
            sent: 0,
            draining: false,
        }
    }

    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// Keeps a group, if it may be among the first `keep`.
    pub fn push(
        &mut self,
        ranked: Ranked,
        compare: &impl Fn(&Ranked, &Ranked) -> Ordering,
    ) -> Result<(), MergeError> {
        if self.keep == 0 {
            return Ok(());
        }
        self.bytes += ranked.size();
        self.memory.push(ranked);
        // With a LIMIT, what cannot be among the first is dropped now and
        // then; sorting every 2 × LIMIT groups keeps that O(n log LIMIT).
        if self.memory.len() >= self.keep.saturating_mul(2) {
            self.sort_and_cut(compare);
        }
        if self.bytes > self.budget.memory_bytes {
            self.sort_and_cut(compare);
            if self.bytes > self.budget.memory_bytes / 2 {
                self.spill()?;
            }
        }
        Ok(())
    }

    /// Stable: equal groups stay in arrival order, the first to come first.
    fn sort_and_cut(&mut self, compare: &impl Fn(&Ranked, &Ranked) -> Ordering) {
        self.memory.sort_by(compare);
        self.memory.truncate(self.keep);
        self.bytes = self.memory.iter().map(Ranked::size).sum();
    }

    /// Writes the (sorted) groups in memory to a new run.
    fn spill(&mut self) -> Result<(), MergeError> {
        let io = |e: std::io::Error| MergeError::Spill(e.to_string());
        let file = match &self.budget.spill_dir {
            Some(dir) => tempfile::tempfile_in(dir),
            None => tempfile::tempfile(),
        }
        .map_err(io)?;
        let mut writer = BufWriter::new(file);
        let left = self.memory.len();
        for ranked in self.memory.drain(..) {
            for part in [&ranked.row, &ranked.first] {
                writer
                    .write_all(&(part.len() as u32).to_le_bytes())
                    .map_err(io)?;
                writer.write_all(part).map_err(io)?;
                self.spilled += 4 + part.len() as u64;
            }
            if self.spilled > self.budget.spill_bytes {
                return Err(MergeError::Budget(self.budget.spill_bytes));
            }
        }
        self.bytes = 0;
        let mut file = writer.into_inner().map_err(|e| io(e.into_error()))?;
        file.rewind().map_err(io)?;
        self.runs.push(Run {
            reader: BufReader::new(file),
            left,
        });
        Ok(())
    }

    /// Every group has come: the answer is sent from here on.
    pub fn drain(
        &mut self,
        compare: &impl Fn(&Ranked, &Ranked) -> Ordering,
        rank: &impl Fn(Bytes, Bytes) -> Result<Ranked, MergeError>,
    ) -> Result<(), MergeError> {
        self.draining = true;
        self.sort_and_cut(compare);
        // Memory holds the last groups to come: after every run's.
        self.memory.reverse();
        let mut heads = Vec::with_capacity(self.runs.len() + 1);
        for i in 0..self.runs.len() {
            heads.push(self.read(i, rank)?);
        }
        heads.push(self.memory.pop());
        self.heads = heads;
        Ok(())
    }

    /// The next group of the answer.
    pub fn next(
        &mut self,
        compare: &impl Fn(&Ranked, &Ranked) -> Ordering,
        rank: &impl Fn(Bytes, Bytes) -> Result<Ranked, MergeError>,
    ) -> Result<Option<Bytes>, MergeError> {
        if self.sent >= self.keep {
            return Ok(None);
        }
        // Among equal groups the earliest run's: it came first.
        let mut best: Option<usize> = None;
        for (i, head) in self.heads.iter().enumerate() {
            let Some(head) = head else { continue };
            best = match best {
                Some(b) if compare(head, self.heads[b].as_ref().expect("a head")).is_ge() => best,
                _ => Some(i),
            };
        }
        let Some(i) = best else {
            return Ok(None);
        };
        let next = match i == self.runs.len() {
            true => self.memory.pop(),
            false => self.read(i, rank)?,
        };
        let ranked = std::mem::replace(&mut self.heads[i], next).expect("the best head");
        self.sent += 1;
        Ok(Some(ranked.row))
    }

    fn read(
        &mut self,
        run: usize,
        rank: &impl Fn(Bytes, Bytes) -> Result<Ranked, MergeError>,
    ) -> Result<Option<Ranked>, MergeError> {
        let run = &mut self.runs[run];
        if run.left == 0 {
            return Ok(None);
        }
        run.left -= 1;
        let mut part = || -> Result<Bytes, MergeError> {
            let io = |e: std::io::Error| MergeError::Spill(e.to_string());
            let mut len = [0u8; 4];
            run.reader.read_exact(&mut len).map_err(io)?;
            let mut bytes = vec![0u8; u32::from_le_bytes(len) as usize];
            run.reader.read_exact(&mut bytes).map_err(io)?;
            Ok(Bytes::from(bytes))
        };
        let row = part()?;
        let first = part()?;
        rank(row, first).map(Some)
    }
}
