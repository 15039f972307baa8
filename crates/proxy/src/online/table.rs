//! What a move reads of a table on the source before it copies: its
//! columns and the key that orders the copy.

use hscale_moves::{Column, MoveError, MovedTable};

use crate::backend::BackendConn;
use crate::dictionary::store::{self, text_literal};
use crate::error::ProxyError;

/// The table `db`.`source` as a move reads it, to `db`.`destination`.
pub async fn describe(
    conn: &mut BackendConn,
    db: &str,
    source: &str,
    destination: &str,
) -> Result<MovedTable, ProxyError> {
    let where_table = format!(
        "TABLE_SCHEMA = {} AND TABLE_NAME = {}",
        text_literal(db),
        text_literal(source)
    );
    let rows = store::exec(
        conn,
        &format!("SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, CHARACTER_SET_NAME, EXTRA FROM information_schema.COLUMNS WHERE {where_table} ORDER BY ORDINAL_POSITION"),
    )
    .await?;
    let qualified = format!("{}.{}", store::ident(db), store::ident(source));
    let mut columns = Vec::with_capacity(rows.len());
    for r in 0..rows.len() {
        let name = store::text(&rows, r, 0);
        if store::text(&rows, r, 4)
            .to_ascii_uppercase()
            .contains("GENERATED")
        {
            return Err(MoveError::Unsupported(format!(
                "{qualified} has the generated column `{name}`"
            ))
            .into());
        }
        let charset = rows[r].get(3).and_then(|v| v.as_deref());
        let charset = charset.map(|c| String::from_utf8_lossy(c).into_owned());
        columns.push(Column::classify(
            &name,
            &store::text(&rows, r, 1),
            &store::text(&rows, r, 2),
            charset.as_deref(),
        )?);
    }
    if columns.is_empty() {
        return Err(MoveError::Unsupported(format!("{qualified} does not exist")).into());
    }
    // The primary key, else the first unique key of NOT NULL columns.
    let keys = store::exec(
        conn,
        &format!("SELECT INDEX_NAME, COLUMN_NAME, NULLABLE FROM information_schema.STATISTICS WHERE {where_table} AND NON_UNIQUE = 0 ORDER BY INDEX_NAME <> 'PRIMARY', INDEX_NAME, SEQ_IN_INDEX"),
    )
    .await?;
    let mut key = Vec::new();
    let mut index: Option<String> = None;
    let mut nullable = false;
    for r in 0..keys.len() {
        let name = store::text(&keys, r, 0);
        if index.as_ref().is_some_and(|i| *i != name) {
            if !nullable {
                break;
            }
            key.clear();
            nullable = false;
        }
        index = Some(name);
        nullable |= !store::text(&keys, r, 2).is_empty();
        let column = store::text(&keys, r, 1);
        if let Some(position) = columns.iter().position(|c| c.name == column) {
            key.push(position);
        }
    }
    if nullable {
        key.clear();
    }
    let destination = format!("{}.{}", store::ident(db), store::ident(destination));
    Ok(MovedTable::new(qualified, destination, columns, key)?)
}
