//! The column definitions a `UNION ALL` of partitions stands in for. Inside
//! a transaction, an ordered scan sends one statement per backend, and a
//! backend with several partitions gets their union, whose definitions name
//! no table and drop the key flags. Where no backend answers with one
//! partition's own definitions, hscale prepares one partition's statement
//! (a probe) for them; a session keeps what the probe found per statement
//! shape, so that a repeated shape does not prepare again.

use std::sync::Arc;

use bytes::Bytes;
use hscale_planner::{columns_fingerprint, Quoting};
use hscale_wire::resultset::{
    column_names, column_org_table, column_types, column_with_types, columns_alike,
};
use rustc_hash::FxHashMap;

/// Shapes kept per session; past this the cache starts over.
const CAPACITY: usize = 64;

#[derive(Debug, Default)]
pub struct ProbedColumns {
    shapes: FxHashMap<Vec<u8>, Arc<[Bytes]>>,
}

/// What a probe's definitions were read under: the session's settings (its
/// character sets among them), the dictionary snapshot, the database and
/// the shape of the partition's statement (with its select list's literals).
pub struct Under<'a> {
    pub settings: u64,
    pub generation: u64,
    pub db: &'a str,
    pub quoting: Quoting,
}

impl ProbedColumns {
    /// The cache's key for the probe `text`; `None`: its shape cannot be
    /// told apart from another's.
    pub fn key(under: &Under<'_>, text: &[u8]) -> Option<Vec<u8>> {
        let mut shape = Vec::with_capacity(text.len() + 32);
        if !columns_fingerprint(text, under.db, under.quoting, &mut shape) {
            return None;
        }
        let mut key = Vec::with_capacity(shape.len() + 16);
        key.extend_from_slice(&under.settings.to_le_bytes());
        key.extend_from_slice(&under.generation.to_le_bytes());
        key.extend_from_slice(&shape);
        Some(key)
    }

    pub fn get(&self, key: &[u8]) -> Option<Arc<[Bytes]>> {
        self.shapes.get(key).cloned()
    }

    pub fn keep(&mut self, key: Vec<u8>, definitions: Arc<[Bytes]>) {
        if self.shapes.len() >= CAPACITY {
            self.shapes.clear();
        }
        self.shapes.insert(key, definitions);
    }

    pub fn forget(&mut self, key: &[u8]) {
        self.shapes.remove(key);
    }
}

/// The definition the client gets for a union's column `union`, given the
/// probed statement's `probed` (its own partition's), where they are the
/// same column: a table's column whole, where the union kept what it keeps
/// of it (`columns_alike`; it drops the key flags and the table's names);
/// hscale's `hidden` ones whole, by name (a union may make a date's weight
/// a utf8 string); an expression's names with the union's types, where
/// they agree in type and character set (prepared, they may differ from
/// executed: the BINARY flag of a grouped COUNT(*)). `None`: the table
/// changed since the probe, and the union's own stands.
pub fn client_definition(probed: &Bytes, union: &Bytes, hidden: bool) -> Option<Bytes> {
    let same_name = column_names(probed).map(|n| n.0) == column_names(union).map(|n| n.0);
    match (hidden, column_org_table(probed)) {
        (true, _) => same_name.then(|| probed.clone()),
        (false, Some(table)) if !table.is_empty() => {
            columns_alike(probed, union).then(|| probed.clone())
        }
        (false, _) if same_name && column_types(probed) == column_types(union) => {
            column_with_types(probed, union).map(Bytes::from)
        }
        (false, _) => None,
    }
}
