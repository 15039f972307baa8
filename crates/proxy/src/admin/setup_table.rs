//! HSCALE SETUP_TABLE(table, column, default table, backend, function): the
//! table becomes partitioned. Its rows stay where they are, in the table
//! renamed to the default table name, until partitions are added.

use hscale_planner::collation::{kind_of, CollationKind, LEARNED};
use hscale_planner::{ColumnKind, Dictionary, HashFunction, TableName};

use super::{check_manageable, current, publish, slot, AdminAnswer, AdminError, AdminLock};
use crate::backend::BackendConn;
use crate::dictionary::{own_connection, store};
use crate::error::ProxyError;
use crate::shared::Cluster;

pub async fn run(
    shared: &Cluster,
    table: TableName,
    column: String,
    default_table: String,
    backend: u32,
    function: HashFunction,
) -> Result<AdminAnswer, ProxyError> {
    let mut lock = AdminLock::take(shared).await?;
    let dictionary = current(shared, &mut lock).await?;
    if dictionary.table(&table.db, &table.name).is_some() {
        return Err(AdminError::AlreadyPartitioned { table }.into());
    }
    let default_table = check_names(shared, &dictionary, &table, &default_table)?;
    let mut conn = own_connection(shared, slot(shared, backend)?).await?;
    let PartitionColumn {
        name: column,
        position,
        kind,
        collation,
    } = partition_column(shared, &mut conn, &table, column, backend, &function).await?;
    if store::table_exists(&mut conn, &table.db, &default_table).await? {
        return Err(AdminError::TableExists {
            db: table.db,
            name: default_table,
            backend,
        }
        .into());
    }
    let s = store::ident(&shared.dictionary.schema);
    let auto = auto_column(&mut conn, &table).await?;
    let (auto_name, auto_position) = match &auto {
        Some((name, position, _)) => (store::text_literal(name), position.to_string()),
        None => ("NULL".into(), "NULL".into()),
    };
    let mut changes = vec![format!(
        "INSERT INTO {s}.tables (db, name, column_name, column_position, column_kind, hash_function, default_table, default_backend, auto_column, auto_position, column_collation) VALUES ({}, {}, {}, {position}, '{}', {}, {}, {backend}, {auto_name}, {auto_position}, {})",
        store::text_literal(&table.db),
        store::text_literal(&table.name),
        store::text_literal(&column),
        kind.name(),
        store::text_literal(&function.to_string()),
        store::text_literal(&default_table),
        collation.as_deref().map_or("NULL".into(), store::text_literal),
    )];
    if let Some((_, _, next_id)) = auto {
        changes.push(format!(
            "REPLACE INTO {s}.sequences VALUES ({}, {}, {next_id})",
            store::text_literal(&table.db),
            store::text_literal(&table.name),
        ));
    }
    // The dictionary first: if the rename then fails, the entry is taken back.
    store::change(&mut lock.conn, &shared.dictionary.schema, &changes).await?;
    let rename = format!(
        "RENAME TABLE {db}.{} TO {db}.{}",
        store::ident(&table.name),
        store::ident(&default_table),
        db = store::ident(&table.db)
    );
    if let Err(e) = store::exec(&mut conn, &rename).await {
        let undo = format!(
            "DELETE FROM {s}.tables WHERE db = {} AND name = {}",
            store::text_literal(&table.db),
            store::text_literal(&table.name)
        );
        store::change(&mut lock.conn, &shared.dictionary.schema, &[undo]).await?;
        publish(shared, &mut lock).await?;
        return Err(e);
    }
    unname_foreign_keys(&mut conn, &table.db, &default_table).await;
    publish(shared, &mut lock).await?;
    tracing::info!(table = %table, %function, "table is partitioned");
    Ok(AdminAnswer::done(0))
}

/// The partition column as the table defines it.
struct PartitionColumn {
    /// As the table spells it.
    name: String,
    position: String,
    kind: ColumnKind,
    /// Where its values are strings: the collation that compares them.
    collation: Option<String>,
}

/// `column` of `table` on `backend`, checked: a type hscale partitions by,
/// that `function` takes, a collation the servers can weigh.
async fn partition_column(
    shared: &Cluster,
    conn: &mut BackendConn,
    table: &TableName,
    column: String,
    backend: u32,
    function: &HashFunction,
) -> Result<PartitionColumn, ProxyError> {
    let sql = format!(
        "SELECT DATA_TYPE, ORDINAL_POSITION, COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = {} AND TABLE_NAME = {} AND COLUMN_NAME = {}",
        store::text_literal(&table.db),
        store::text_literal(&table.name),
        store::text_literal(&column)
    );
    let rows = store::exec(conn, &sql).await?;
    if rows.is_empty() {
        return Err(
            match store::table_exists(conn, &table.db, &table.name).await? {
                true => AdminError::NoSuchColumn {
                    table: table.clone(),
                    column,
                },
                false => AdminError::NoSuchTable {
                    table: table.clone(),
                    backend,
                },
            }
            .into(),
        );
    }
    let data_type = store::text(&rows, 0, 0);
    let position = store::text(&rows, 0, 1);
    let column = store::text(&rows, 0, 2);
    let kind = ColumnKind::from_data_type(&data_type).ok_or_else(|| {
        AdminError::Invalid(format!("a {data_type} column cannot be a partition column"))
    })?;
    function.check_column(kind).map_err(AdminError::from)?;
    let collation = match (kind, store::text(&rows, 0, 3)) {
        // A binary string type has no collation: its bytes compare.
        (ColumnKind::Text | ColumnKind::Enum, name) if name.is_empty() => Some("binary".into()),
        (ColumnKind::Text | ColumnKind::Enum, name) => Some(name),
        _ => None,
    };
    if let Some(name) = &collation {
        check_collation(&column, name)?;
        // Learned now: a collation the servers cannot weigh fails here.
        shared
            .dictionary
            .collations
            .folding(conn, Some(name))
            .await?;
    }
    Ok(PartitionColumn {
        name: column,
        position,
        kind,
        collation,
    })
}

/// Gives the default table's foreign keys InnoDB's own names: a move
/// retires the table into hscale's schema, where a constraint name its
/// author chose may be taken by another database's table retired there.
/// Left as they are if the server refuses (the move then says why).
async fn unname_foreign_keys(conn: &mut BackendConn, db: &str, table: &str) {
    let place = format!("{}.{}", store::ident(db), store::ident(table));
    let renamed = async {
        let Some(definition) = store::definition(conn, db, table).await? else {
            return Ok(());
        };
        let (names, items) = hscale_moves::foreign_keys::own_names(&definition, table);
        if names.is_empty() {
            return Ok(());
        }
        let drops: Vec<String> = names
            .iter()
            .map(|name| format!("DROP FOREIGN KEY {}", store::ident(name)))
            .collect();
        let adds: Vec<String> = items.iter().map(|item| format!("ADD {item}")).collect();
        // Unchecked, the key is added in place: no rows are read.
        store::exec(conn, "SET SESSION foreign_key_checks = 0").await?;
        store::exec(conn, &format!("ALTER TABLE {place} {}", drops.join(", "))).await?;
        // Two statements: InnoDB refuses a key dropped and added in one.
        store::exec(conn, &format!("ALTER TABLE {place} {}", adds.join(", "))).await?;
        store::exec(conn, "SET SESSION foreign_key_checks = 1").await?;
        Ok::<(), ProxyError>(())
    };
    if let Err(e) = renamed.await {
        tracing::warn!(table = %place, "cannot give the foreign keys InnoDB's names; a move of this table may fail on a constraint name: {e}");
    }
}

/// A partition column whose collation hscale cannot fold as the server
/// compares would let two equal values land in two partitions.
fn check_collation(column: &str, collation: &str) -> Result<(), AdminError> {
    match kind_of(collation) {
        CollationKind::Unsupported => Err(AdminError::Invalid(format!(
            "column `{column}` compares by {collation}, which hscale does not route by: it routes strings by {} and every *_bin collation (ALTER the column to one of them, or partition by another column)",
            LEARNED.join(", ")
        ))),
        CollationKind::Binary { .. } | CollationKind::Learned => Ok(()),
    }
}

/// Refuses, before anything changes, names whose renaming would break what
/// stands (`check_manageable`), a reference table, a default table
/// elsewhere than its table. Returns the default table's name.
fn check_names(
    shared: &Cluster,
    dictionary: &Dictionary,
    table: &TableName,
    default_table: &str,
) -> Result<String, AdminError> {
    let default_table = match default_table.split_once('.') {
        Some((db, name)) if db == table.db => name,
        Some(_) => {
            return Err(AdminError::Invalid(format!(
                "the default table '{default_table}' must be in {table}'s database `{}`",
                table.db
            )))
        }
        None => default_table,
    };
    for name in [table.name.as_str(), default_table] {
        if name.is_empty() || name.chars().count() > 64 {
            return Err(AdminError::Invalid(format!(
                "'{name}' is no table name of 1 to 64 characters"
            )));
        }
        check_manageable(shared, dictionary, &table.db, name)?;
        if dictionary.reference(&table.db, name).is_some() {
            return Err(AdminError::Invalid(format!(
                "`{}`.`{name}` is a reference table",
                table.db
            )));
        }
    }
    if default_table.eq_ignore_ascii_case(&table.name) {
        return Err(AdminError::Invalid(format!(
            "the default table must have another name than {table}"
        )));
    }
    Ok(default_table.to_string())
}

/// The table's AUTO_INCREMENT column, its position, and the next id its
/// rows leave free: where the table's sequence starts.
async fn auto_column(
    conn: &mut crate::backend::BackendConn,
    table: &TableName,
) -> Result<Option<(String, String, u64)>, ProxyError> {
    let sql = format!(
        "SELECT COLUMN_NAME, ORDINAL_POSITION FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = {} AND TABLE_NAME = {} AND EXTRA LIKE '%auto_increment%'",
        store::text_literal(&table.db),
        store::text_literal(&table.name),
    );
    let rows = store::exec(conn, &sql).await?;
    if rows.is_empty() {
        return Ok(None);
    }
    let name = store::text(&rows, 0, 0);
    let highest = format!(
        "SELECT COALESCE(MAX({}), 0) FROM {}.{}",
        store::ident(&name),
        store::ident(&table.db),
        store::ident(&table.name)
    );
    let highest: u64 = store::text(&store::exec(conn, &highest).await?, 0, 0)
        .parse()
        .unwrap_or(0);
    Ok(Some((name, store::text(&rows, 0, 1), highest + 1)))
}
