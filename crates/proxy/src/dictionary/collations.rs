//! The collations partition columns compare by, learned from the main
//! backend: each character's `WEIGHT_STRING`, read in one query per
//! collation, from which `WeightTable` folds strings as the server compares
//! them. Learned once per instance and collation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use hscale_planner::collation::{kind_of, CollationKind};
use hscale_planner::{Folding, WeightTable};

use super::store::{exec, text, text_literal};
use crate::backend::BackendConn;
use crate::error::ProxyError;

/// Characters whose weights are read for a 4-byte character set: the
/// planes where characters weigh alike (planes 0 to 2); past them
/// `WeightTable`'s rule for the rest.
const UNICODE_TABLE_END: u32 = 0x2FFFF;
/// Two characters past the table: if they weigh alike, so does every one.
const PROBES: [u32; 2] = [0x30000, 0xE0001];

#[derive(Default)]
pub struct Collations {
    learned: Mutex<HashMap<String, Arc<WeightTable>>>,
}

impl Collations {
    /// How a column with this collation folds; `None` (no collation): the
    /// way hscale folded before it read collations.
    pub async fn folding(
        &self,
        conn: &mut BackendConn,
        collation: Option<&str>,
    ) -> Result<Folding, ProxyError> {
        let Some(name) = collation.filter(|c| !c.is_empty()) else {
            return Ok(Folding::Legacy);
        };
        match kind_of(name) {
            CollationKind::Binary { pad } => return Ok(Folding::Binary { pad }),
            CollationKind::Learned | CollationKind::Unsupported => {}
        }
        if let Some(table) = self.lock().get(name) {
            return Ok(Folding::Weights(table.clone()));
        }
        let table = Arc::new(learn(conn, name).await?);
        self.lock().insert(name.to_string(), table.clone());
        Ok(Folding::Weights(table))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<WeightTable>>> {
        self.learned.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Reads the weights of every character of the collation's range.
async fn learn(conn: &mut BackendConn, collation: &str) -> Result<WeightTable, ProxyError> {
    let about = exec(
        conn,
        &format!(
            "SELECT c.CHARACTER_SET_NAME, s.MAXLEN FROM information_schema.COLLATIONS c JOIN information_schema.CHARACTER_SETS s USING (CHARACTER_SET_NAME) WHERE c.COLLATION_NAME = {}",
            text_literal(collation)
        ),
    )
    .await?;
    let (charset, maxlen) = (text(&about, 0, 0), text(&about, 0, 1));
    let (end, unit) = match maxlen.as_str() {
        "4" => (UNICODE_TABLE_END, 2),
        "1" => (0xFFFF, 1),
        _ => (0xFFFF, 2),
    };
    let weight = |code: &str| {
        format!(
            "HEX(WEIGHT_STRING(CONVERT(CHAR({code} USING utf32) USING {charset}) COLLATE {collation}))"
        )
    };
    let sql = format!(
        "SELECT seq, {} FROM mysql.seq_0_to_{end} WHERE seq < 55296 OR seq > 57343",
        weight("seq")
    );
    let rows = exec(conn, &sql).await?;
    let mut weights = vec![Vec::new(); end as usize + 1];
    for i in 0..rows.len() {
        let code: usize = text(&rows, i, 0).parse().unwrap_or(0);
        weights[code] = units(&text(&rows, i, 1), unit);
    }
    let probes = format!(
        "SELECT {}, {}",
        weight(&PROBES[0].to_string()),
        weight(&PROBES[1].to_string())
    );
    let probed = exec(conn, &probes).await?;
    let (first, second) = (
        units(&text(&probed, 0, 0), unit),
        units(&text(&probed, 0, 1), unit),
    );
    let beyond = (first == second && !first.is_empty()).then_some(first);
    let pad_space = !collation.to_ascii_lowercase().contains("_nopad_");
    Ok(WeightTable::new(
        collation,
        &weights,
        beyond.as_deref(),
        pad_space,
    ))
}

/// Weights in hex, as units of `unit` bytes.
fn units(hex: &str, unit: usize) -> Vec<u16> {
    hex.as_bytes()
        .chunks(unit * 2)
        .filter_map(|chunk| u16::from_str_radix(std::str::from_utf8(chunk).ok()?, 16).ok())
        .collect()
}
