//! The statements prepared on one backend connection, by the session
//! settings they were prepared under and their database and text. Clients
//! never see these ids: hscale answers COM_STMT_PREPARE with its own, and
//! whichever client executes a text on this connection next uses the same
//! backend statement. Bounded: past the limit the least recently used is
//! closed, so many pooled connections cannot exhaust the server's
//! `max_prepared_stmt_count`.

use bytes::Bytes;
use rustc_hash::FxHashMap;

#[derive(Debug)]
pub struct Statements {
    by_text: FxHashMap<(u64, Bytes), Entry>,
    capacity: usize,
    /// Counts uses, to find the least recently used.
    clock: u64,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    id: u32,
    used: u64,
}

impl Statements {
    pub fn new(capacity: usize) -> Statements {
        Statements {
            by_text: FxHashMap::default(),
            capacity: capacity.max(1),
            clock: 0,
        }
    }

    /// The backend's id for `key` under `settings`, if it is prepared here.
    pub fn get(&mut self, settings: u64, key: &Bytes) -> Option<u32> {
        self.clock += 1;
        // A clone of `Bytes` counts a reference; nothing is copied.
        let entry = self.by_text.get_mut(&(settings, key.clone()))?;
        entry.used = self.clock;
        Some(entry.id)
    }

    /// Records a statement prepared here; returns the id of the one it
    /// pushed out, which the caller closes on the backend.
    pub fn insert(&mut self, settings: u64, key: Bytes, id: u32) -> Option<u32> {
        self.clock += 1;
        let evicted = match self.by_text.len() >= self.capacity {
            true => self.evict(),
            false => None,
        };
        self.by_text.insert(
            (settings, key),
            Entry {
                id,
                used: self.clock,
            },
        );
        evicted
    }

    /// The server dropped every statement (COM_RESET_CONNECTION).
    pub fn clear(&mut self) {
        self.by_text.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.by_text.is_empty()
    }

    fn evict(&mut self) -> Option<u32> {
        // A scan, but only when the cache is full and a new text arrives.
        let oldest = self
            .by_text
            .iter()
            .min_by_key(|(_, e)| e.used)
            .map(|(key, _)| key.clone())?;
        self.by_text.remove(&oldest).map(|e| e.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_statement_is_pushed_out() {
        let mut s = Statements::new(2);
        let key = |k: &'static str| Bytes::from_static(k.as_bytes());
        assert_eq!(s.insert(0, key("a"), 1), None);
        assert_eq!(s.insert(0, key("b"), 2), None);
        assert_eq!(s.get(0, &key("a")), Some(1));
        assert_eq!(s.insert(0, key("c"), 3), Some(2));
        assert_eq!(s.get(0, &key("b")), None);
        assert_eq!(
            (s.get(0, &key("a")), s.get(0, &key("c"))),
            (Some(1), Some(3))
        );
        // Prepared under other settings (another sql_mode): another statement.
        assert_eq!(s.get(7, &key("a")), None);
        s.clear();
        assert!(s.is_empty());
    }
}
