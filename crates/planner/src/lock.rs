//! LOCK TABLES naming partitioned tables: the logical table exists on no
//! backend, so each backend locks the physical tables it holds of it, in the
//! mode and under the alias the client asked for; the tables that are not
//! partitioned are locked on the main backend as written.

use crate::lexer::{Token, TokenKind, Tokens};
use crate::plan::{Action, Context, Refusal};
use crate::rewrite::quote_identifier;
use crate::show::table_name;

/// The LOCK TABLES each backend runs: backends in the order the statement
/// first reaches them, the main backend first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableLocks {
    pub per_backend: Vec<(u32, String)>,
}

pub(crate) fn lock_tables(sql: &str, ctx: &Context) -> Action {
    let refuse = |reason: &str| {
        Action::Refuse(Refusal {
            table: None,
            reason: reason.into(),
        })
    };
    let tokens: Vec<Token> = Tokens::new(sql.as_bytes(), ctx.quoting).collect();
    let word = |t: &Token| sql[t.start..t.end].to_ascii_lowercase();
    let items = match tokens.get(1).map(word).as_deref() {
        Some("table" | "tables") => &tokens[2..],
        _ => return refuse("LOCK other than LOCK TABLES on a partitioned table"),
    };
    let mut per_backend: Vec<(u32, Vec<String>)> = vec![(ctx.main_backend, Vec::new())];
    let mut add =
        |backend: u32, item: String| match per_backend.iter_mut().find(|(b, _)| *b == backend) {
            Some((_, items)) => items.push(item),
            None => per_backend.push((backend, vec![item])),
        };
    // Items end at their comma, not at their last token: a `/*!32311 LOCAL
    // */` ends after it.
    let mut start = match items.first() {
        Some(t) => t.start,
        None => return refuse("LOCK TABLES without tables"),
    };
    for item in items.split(|t| t.kind == TokenKind::Symbol(b',')) {
        let Some(first) = item.first() else {
            return refuse("LOCK TABLES with an empty item");
        };
        let end = tokens
            .iter()
            .find(|t| t.start > first.start && t.kind == TokenKind::Symbol(b','))
            .map_or(sql.trim_end().trim_end_matches(';').len(), |comma| {
                comma.start
            });
        let text = sql[start..end].trim();
        start = end + 1;
        let (table, taken) = table_name(sql, item, ctx);
        let rest = &item[taken..];
        let partitioned = table
            .as_ref()
            .and_then(|t| ctx.dictionary.table(&t.db, &t.name));
        let Some(partitioned) = partitioned else {
            add(ctx.main_backend, text.to_string());
            continue;
        };
        if partitioned.held() {
            return Action::Wait(partitioned.table.clone());
        }
        // The alias and the lock type, as written.
        let mode = match rest.first() {
            Some(t) => sql[t.start..end].trim(),
            None => "",
        };
        // Statements routed while the session holds the locks name each
        // partition table by its own name (`Context::tables_locked`), as it
        // is locked. One alias cannot lock two tables of one backend.
        let aliased = rest
            .first()
            .is_some_and(|t| !matches!(word(t).as_str(), "read" | "write" | "low_priority"));
        let db = quote_identifier(&partitioned.table.db);
        let targets = partitioned.all_targets();
        for target in &targets {
            let shares = targets
                .iter()
                .filter(|t| t.backend == target.backend)
                .count();
            if aliased && shares > 1 {
                return Action::Refuse(Refusal {
                    table: Some(partitioned.table.clone()),
                    reason: format!(
                        "LOCK TABLES under an alias of a table with several partitions on backend {} (one alias cannot lock them all)",
                        target.backend
                    ),
                });
            }
            add(
                target.backend,
                format!("{db}.{} {mode}", quote_identifier(&target.table)),
            );
        }
    }
    Action::LockTables(TableLocks {
        per_backend: per_backend
            .into_iter()
            .filter(|(_, items)| !items.is_empty())
            .map(|(backend, items)| (backend, format!("LOCK TABLES {}", items.join(", "))))
            .collect(),
    })
}
