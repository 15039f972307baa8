//! Table maintenance naming partitioned tables: ANALYZE, CHECK, OPTIMIZE,
//! REPAIR and CHECKSUM TABLE. The logical table exists on no backend, so
//! each backend runs the statement on the physical tables it holds, the
//! tables that are not partitioned on the main backend as written; the
//! answer is a `Listing` whose rows name the logical tables, as one table
//! would answer.

use crate::lexer::{Token, TokenKind, Tokens};
use crate::plan::{Action, Context};
use crate::rewrite::quote_identifier;
use crate::show::{
    table_name, word_at, Combine, Elsewhere, Listing, Maintained, NameColumn, Physical,
};

/// The plan of a maintenance statement that names a partitioned table;
/// `None` for any other statement.
pub(crate) fn maintenance(sql: &str, ctx: &Context) -> Option<Action> {
    let tokens: Vec<Token> = Tokens::new(sql.as_bytes(), ctx.quoting).collect();
    let word = |i: usize| word_at(sql, &tokens, i);
    let operation = word(0)?;
    if !matches!(
        operation.as_str(),
        "analyze" | "check" | "optimize" | "repair" | "checksum"
    ) {
        return None;
    }
    let mut at = 1;
    if matches!(word(at).as_deref(), Some("no_write_to_binlog" | "local")) {
        at += 1;
    }
    // `ANALYZE SELECT ...` runs a query.
    if !matches!(word(at).as_deref(), Some("table" | "tables")) {
        return None;
    }
    let prefix = &sql[..tokens[at].end];
    let mut per_backend: Vec<(u32, Vec<String>, Vec<Physical>)> =
        vec![(ctx.main_backend, Vec::new(), Vec::new())];
    let mut add = |backend: u32, item: String, physical: Option<Physical>| {
        let at = match per_backend.iter().position(|(b, ..)| *b == backend) {
            Some(at) => at,
            None => {
                per_backend.push((backend, Vec::new(), Vec::new()));
                per_backend.len() - 1
            }
        };
        per_backend[at].1.push(item);
        per_backend[at].2.extend(physical);
    };
    let mut tables = Vec::new();
    at += 1;
    // The list of tables ends where a name is not followed by a comma; the
    // options after it (QUICK, FOR UPGRADE, PERSISTENT FOR ...) are every
    // backend's.
    let tail = loop {
        let (table, taken) = table_name(sql, &tokens[at.min(tokens.len())..], ctx);
        let (Some(table), true) = (table, taken > 0) else {
            // The server says what is wrong with the statement.
            return None;
        };
        let written = &sql[tokens[at].start..tokens[at + taken - 1].end];
        at += taken;
        let partitioned = ctx.dictionary.table(&table.db, &table.name);
        // The answer names a partitioned table as the dictionary does.
        let named = partitioned.map_or(&table, |p| &p.table);
        tables.push(Maintained {
            qualified: format!("{}.{}", named.db, named.name),
            partitioned: partitioned.is_some(),
        });
        match partitioned {
            None => add(ctx.main_backend, written.to_string(), None),
            Some(partitioned) if partitioned.held() => {
                return Some(Action::Wait(partitioned.table.clone()))
            }
            Some(partitioned) => {
                let db = quote_identifier(&table.db);
                for target in partitioned.all_targets() {
                    let physical = Physical {
                        db: table.db.clone(),
                        table: target.table.to_string(),
                        logical: Some(partitioned.table.name.clone()),
                    };
                    let item = format!("{db}.{}", quote_identifier(&target.table));
                    add(target.backend, item, Some(physical));
                }
            }
        }
        match tokens.get(at) {
            Some(t) if t.kind == TokenKind::Symbol(b',') => at += 1,
            Some(t) => break sql[t.start..].trim().trim_end_matches(';').trim_end(),
            None => break "",
        }
    };
    if !tables.iter().any(|t| t.partitioned) {
        return None;
    }
    let mut statements = per_backend
        .into_iter()
        .filter(|(_, items, _)| !items.is_empty())
        .map(|(backend, items, physical)| {
            let sql = match tail {
                "" => format!("{prefix} {}", items.join(", ")),
                tail => format!("{prefix} {} {tail}", items.join(", ")),
            };
            (backend, sql, physical)
        });
    let (backend, first_sql, physical) = statements.next()?;
    let elsewhere = statements
        .map(|(backend, sql, physical)| Elsewhere {
            backend,
            sql,
            physical,
            probe: false,
        })
        .collect();
    Some(Action::Listing(Box::new(Listing {
        backend,
        sql: Some(first_sql),
        column: NameColumn::Qualified(0),
        schema_column: None,
        physical,
        add: Vec::new(),
        like: None,
        create_statement: false,
        elsewhere,
        combine: Combine::Maintenance {
            tables,
            checksum: operation == "checksum",
        },
    })))
}
