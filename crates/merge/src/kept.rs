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
    /// How many groups one sort takes at most: a worker serves other
    /// clients between sorts, so no client of its waits for a whole
    /// budget's sort.
    pub sort_chunk: usize,
}

impl Default for Budget {
    fn default() -> Budget {
        Budget {
            memory_bytes: 64 << 20,
            spill_bytes: 1 << 30,
            spill_dir: None,
            sort_chunk: 4096,
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
    /// Sorted chunks of at most `sort_chunk` groups, in arrival order, each
    /// reversed (its first group last, to pop).
    chunks: Vec<Vec<Ranked>>,
    /// Of `memory` and `chunks`.
    bytes: usize,
    runs: Vec<Run>,
    spilled: u64,
    /// Once the answer is being sent: the next group of each run, then of
    /// each chunk, and how many were sent.
    heads: Vec<Option<Ranked>>,
    /// The sources whose head is a group, least head first (ties: the
    /// earlier source), so that each group sent costs log(sources)
    /// comparisons.
    order: Vec<usize>,
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
            chunks: Vec::new(),
            bytes: 0,
            runs: Vec::new(),
            spilled: 0,
            heads: Vec::new(),
            order: Vec::new(),
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
        let cut_at = self.keep.saturating_mul(2);
        if cut_at < self.budget.sort_chunk && self.memory.len() >= cut_at {
            self.sort_and_cut(compare);
        } else if self.memory.len() >= self.budget.sort_chunk.max(1) {
            self.seal(compare);
        }
        if self.bytes > self.budget.memory_bytes {
            self.seal(compare);
            if self.bytes > self.budget.memory_bytes / 2 {
                self.spill(compare)?;
            }
        }
        Ok(())
    }

    /// Stable: equal groups stay in arrival order, the first to come first.
    fn sort_and_cut(&mut self, compare: &impl Fn(&Ranked, &Ranked) -> Ordering) {
        let before: usize = self.memory.iter().map(Ranked::size).sum();
        self.memory.sort_by(compare);
        self.memory.truncate(self.keep);
        let after: usize = self.memory.iter().map(Ranked::size).sum();
        self.bytes = self.bytes + after - before;
    }

    /// The groups in memory, sorted and cut, become a chunk.
    fn seal(&mut self, compare: &impl Fn(&Ranked, &Ranked) -> Ordering) {
        if self.memory.is_empty() {
            return;
        }
        self.sort_and_cut(compare);
        let mut chunk = std::mem::take(&mut self.memory);
        chunk.reverse();
        self.chunks.push(chunk);
    }

    /// The next group of the chunks in order, ties to the earliest chunk;
    /// its chunk, if any.
    fn least_chunk(&self, compare: &impl Fn(&Ranked, &Ranked) -> Ordering) -> Option<usize> {
        let mut best: Option<usize> = None;
        for (i, chunk) in self.chunks.iter().enumerate() {
            let Some(head) = chunk.last() else { continue };
            best = match best {
                Some(b) if compare(head, self.chunks[b].last().expect("a head")).is_ge() => best,
                _ => Some(i),
            };
        }
        best
    }

    /// Writes the (sorted) chunks to a new run, merged: at most `keep`.
    fn spill(&mut self, compare: &impl Fn(&Ranked, &Ranked) -> Ordering) -> Result<(), MergeError> {
        let io = |e: std::io::Error| MergeError::Spill(e.to_string());
        let file = match &self.budget.spill_dir {
            Some(dir) => tempfile::tempfile_in(dir),
            None => tempfile::tempfile(),
        }
        .map_err(io)?;
        let mut writer = BufWriter::new(file);
        let mut left = 0;
        while left < self.keep {
            let Some(i) = self.least_chunk(compare) else {
                break;
            };
            let ranked = self.chunks[i].pop().expect("the least head");
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
            left += 1;
        }
        self.chunks.clear();
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
        // Memory holds the last groups to come: after every run's.
        self.seal(compare);
        let mut heads = Vec::with_capacity(self.runs.len() + self.chunks.len());
        for i in 0..self.runs.len() {
            heads.push(self.read(i, rank)?);
        }
        for chunk in &mut self.chunks {
            heads.push(chunk.pop());
        }
        self.heads = heads;
        for source in 0..self.heads.len() {
            self.place(source, compare);
        }
        Ok(())
    }

    /// Puts `source` in `order` by its head, if it has one.
    fn place(&mut self, source: usize, compare: &impl Fn(&Ranked, &Ranked) -> Ordering) {
        let Some(head) = &self.heads[source] else {
            return;
        };
        let heads = &self.heads;
        let at = self.order.partition_point(|&other| {
            let theirs = heads[other].as_ref().expect("ordered sources have heads");
            compare(theirs, head).then(other.cmp(&source)).is_lt()
        });
        self.order.insert(at, source);
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
        // Among equal groups the earliest source's: it came first.
        if self.order.is_empty() {
            return Ok(None);
        }
        let i = self.order.remove(0);
        let next = match i.checked_sub(self.runs.len()) {
            Some(chunk) => self.chunks[chunk].pop(),
            None => self.read(i, rank)?,
        };
        let ranked = std::mem::replace(&mut self.heads[i], next).expect("the best head");
        self.place(i, compare);
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
