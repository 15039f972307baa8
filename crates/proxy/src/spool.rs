//! The lines of a LOAD DATA that go to one partition table, held until the
//! client has sent the whole file (only then is it known that every line
//! can be placed, and nothing has been written): in memory while the
//! statement's lines fit a budget, then in a temporary file.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// What the spools of one statement may hold, together.
#[derive(Debug)]
pub struct SpoolBudget {
    /// Bytes still allowed in memory.
    pub memory_left: usize,
    /// Bytes still allowed on disk.
    pub disk_left: u64,
}

/// Why a line could not be kept.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("the file needs more than the {0} bytes of temporary files hscale may write for it")]
    Full(u64),
    #[error("a temporary file failed: {0}")]
    Io(#[from] io::Error),
}

#[derive(Debug, Default)]
pub struct Spool {
    memory: Vec<u8>,
    file: Option<File>,
    file_len: u64,
    /// Lines held.
    pub lines: u64,
}

impl Spool {
    /// Keeps `line`; `dir`: where a temporary file goes (`None`: the
    /// system's temporary directory).
    pub fn push(
        &mut self,
        line: &[u8],
        budget: &mut SpoolBudget,
        disk_limit: u64,
        dir: Option<&Path>,
    ) -> Result<(), SpoolError> {
        self.lines += 1;
        if self.file.is_none() && line.len() <= budget.memory_left {
            budget.memory_left -= line.len();
            self.memory.extend_from_slice(line);
            return Ok(());
        }
        if line.len() as u64 > budget.disk_left {
            return Err(SpoolError::Full(disk_limit));
        }
        budget.disk_left -= line.len() as u64;
        let file = match &mut self.file {
            Some(file) => file,
            None => self.file.insert(match dir {
                Some(dir) => tempfile::tempfile_in(dir)?,
                None => tempfile::tempfile()?,
            }),
        };
        file.write_all(line)?;
        self.file_len += line.len() as u64;
        Ok(())
    }

    pub fn len(&self) -> u64 {
        self.memory.len() as u64 + self.file_len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the bytes from `offset` into `buf`; how many.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let in_memory = self.memory.len() as u64;
        if offset < in_memory {
            let from = &self.memory[offset as usize..];
            let n = from.len().min(buf.len());
            buf[..n].copy_from_slice(&from[..n]);
            return Ok(n);
        }
        match &self.file {
            Some(file) if offset < self.len() => {
                let want = buf.len().min((self.len() - offset) as usize);
                file.read_exact_at(&mut buf[..want], offset - in_memory)?;
                Ok(want)
            }
            _ => Ok(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(spool: &Spool, chunk: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = vec![0; chunk];
        loop {
            let n = spool.read_at(out.len() as u64, &mut buf).unwrap();
            if n == 0 {
                return out;
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    #[test]
    fn lines_past_the_memory_budget_go_to_a_file_and_read_back_in_order() {
        let mut budget = SpoolBudget {
            memory_left: 10,
            disk_left: 100,
        };
        let (mut a, mut b) = (Spool::default(), Spool::default());
        a.push(b"1\tx\n", &mut budget, 100, None).unwrap();
        b.push(b"2\ty\n", &mut budget, 100, None).unwrap();
        // 8 of 10 bytes used: the next line of each spills.
        a.push(b"3\tzzz\n", &mut budget, 100, None).unwrap();
        a.push(b"5\n", &mut budget, 100, None).unwrap();
        assert!(a.file.is_some(), "once spilled, a spool stays in its file");
        assert_eq!(read_all(&a, 3), b"1\tx\n3\tzzz\n5\n");
        assert_eq!(read_all(&b, 64), b"2\ty\n");
        assert_eq!((a.lines, b.lines), (3, 1));
        let mut tight = SpoolBudget {
            memory_left: 0,
            disk_left: 4,
        };
        assert!(matches!(
            Spool::default().push(b"12345", &mut tight, 4, None),
            Err(SpoolError::Full(4))
        ));
    }
}
