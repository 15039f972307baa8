//! The dictionary's tables in schema `hscale` on the main backend: created on
//! first start, read whole into a snapshot, changed by admin commands. Every
//! change bumps the version that instances poll.

use hscale_planner::{
    AutoColumn, ColumnKind, Dictionary, HashFunction, PartitionEntry, PartitionState,
    PartitionedTable, ReferenceTable, TableDefinition, TableName,
};

use crate::backend::{BackendConn, Rows};
use crate::error::ProxyError;

pub use hscale_planner::text_literal;

/// Bytes as a binary string literal: stored into any column as they are.
pub fn bytes_literal(value: &[u8]) -> String {
    format!("CAST(X'{}' AS BINARY)", hex(value))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn ident(name: &str) -> String {
    hscale_planner::quote_identifier(name)
}

/// Runs a statement hscale needs to succeed.
pub async fn exec(conn: &mut BackendConn, sql: &str) -> Result<Rows, ProxyError> {
    match conn.query(sql).await {
        Ok(Ok(rows)) => Ok(rows),
        Ok(Err(refused)) => Err(ProxyError::Refused(refused)),
        Err(e) => Err(ProxyError::Backend(e)),
    }
}

/// A value of a row hscale read, as text.
pub fn text(rows: &Rows, row: usize, column: usize) -> String {
    rows.get(row)
        .and_then(|r| r.get(column))
        .and_then(|v| v.as_ref())
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default()
}

const OPTIONS: &str = "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin";

/// Two-phase commit: the outcome of each transaction over several
/// backends, written after every branch prepared (commit) or by recovery
/// before it rolls a branch back (abort). Every backend has one: a
/// transaction's plain part writes its commit there as it commits.
pub fn decisions_ddl(schema: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {}.xa_decisions (gtrid VARCHAR(64) NOT NULL PRIMARY KEY, decision VARCHAR(8) NOT NULL, decided DATETIME(6) NOT NULL, proof CHAR(64) NULL, KEY decided (decided)) {OPTIONS}",
        ident(schema)
    )
}

/// Decisions made before they carried proof of who wrote them get the
/// column.
pub fn decisions_proof_ddl(schema: &str) -> String {
    format!(
        "ALTER TABLE {}.xa_decisions ADD COLUMN IF NOT EXISTS proof CHAR(64) NULL",
        ident(schema)
    )
}

/// Makes the dictionary's schema where it is missing; `fresh_key` (hex) is
/// the key of the decisions' proofs where none was made yet.
pub async fn ensure_schema(
    conn: &mut BackendConn,
    schema: &str,
    fresh_key: &str,
) -> Result<(), ProxyError> {
    let s = ident(schema);
    let options = OPTIONS;
    for sql in [
        format!("CREATE DATABASE IF NOT EXISTS {s}"),
        format!("CREATE TABLE IF NOT EXISTS {s}.version (id TINYINT UNSIGNED PRIMARY KEY, version BIGINT UNSIGNED NOT NULL) {options}"),
        format!("INSERT IGNORE INTO {s}.version VALUES (1, 1)"),
        format!("CREATE TABLE IF NOT EXISTS {s}.tables (db VARCHAR(64) NOT NULL, name VARCHAR(64) NOT NULL, column_name VARCHAR(64) NOT NULL, column_position INT UNSIGNED NOT NULL, column_kind VARCHAR(16) NOT NULL, hash_function VARCHAR(255) NOT NULL, default_table VARCHAR(64) NOT NULL, default_backend INT UNSIGNED NOT NULL, PRIMARY KEY (db, name)) {options}"),
        format!("CREATE TABLE IF NOT EXISTS {s}.partitions (db VARCHAR(64) NOT NULL, table_name VARCHAR(64) NOT NULL, partition_value VARCHAR(255) NOT NULL, partition_name VARCHAR(64) NOT NULL, backend INT UNSIGNED NOT NULL, state VARCHAR(16) NOT NULL, added BIGINT UNSIGNED NOT NULL AUTO_INCREMENT UNIQUE, PRIMARY KEY (db, table_name, partition_value)) {options}"),
        // A schema statement in progress on a partitioned table: its steps,
        // one per physical table. While a table has rows here it is locked.
        format!("CREATE TABLE IF NOT EXISTS {s}.schema_changes (db VARCHAR(64) NOT NULL, table_name VARCHAR(64) NOT NULL, step INT UNSIGNED NOT NULL, backend INT UNSIGNED NOT NULL, physical VARCHAR(64) NOT NULL, partition_name VARCHAR(64) NULL, statement LONGTEXT NOT NULL, done BOOLEAN NOT NULL, effect VARCHAR(16) NOT NULL, renamed_to VARCHAR(64) NULL, PRIMARY KEY (db, table_name, step)) {options}"),
        // Added after the first release: a dictionary made before gets them.
        format!("ALTER TABLE {s}.tables ADD COLUMN IF NOT EXISTS auto_column VARCHAR(64) NULL, ADD COLUMN IF NOT EXISTS auto_position INT UNSIGNED NULL"),
        // A step's physical table as it was just before the step was sent:
        // recovery tells by it whether the step took effect.
        format!("ALTER TABLE {s}.schema_changes ADD COLUMN IF NOT EXISTS before_definition LONGTEXT NULL"),
        // The partition column's collation, which its strings fold by; NULL
        // for tables set up before hscale read it (folded as then).
        format!("ALTER TABLE {s}.tables ADD COLUMN IF NOT EXISTS column_collation VARCHAR(64) NULL"),
        // 'fenced' while a move switches the default table (statements on
        // it wait), else 'active'.
        format!("ALTER TABLE {s}.tables ADD COLUMN IF NOT EXISTS default_state VARCHAR(16) NOT NULL DEFAULT 'active'"),
        // The next id of each partitioned table's AUTO_INCREMENT column;
        // instances take blocks of ids from it.
        format!("CREATE TABLE IF NOT EXISTS {s}.sequences (db VARCHAR(64) NOT NULL, table_name VARCHAR(64) NOT NULL, next_id BIGINT UNSIGNED NOT NULL, PRIMARY KEY (db, table_name)) {options}"),
        decisions_ddl(schema),
        // Old decisions are cleared by this, without scanning the table.
        format!("ALTER TABLE {s}.xa_decisions ADD INDEX IF NOT EXISTS decided (decided)"),
        decisions_proof_ddl(schema),
        // The key of the decisions' proofs (`xa::DecisionKey`): made once,
        // by the first instance; readable by hscale's own account only.
        format!("CREATE TABLE IF NOT EXISTS {s}.xa_key (id TINYINT UNSIGNED PRIMARY KEY, secret VARBINARY(64) NOT NULL) {options}"),
        format!("INSERT IGNORE INTO {s}.xa_key VALUES (1, X'{fresh_key}')"),
        // Reference tables (SETUP_REFERENCE): the backends with a copy, and
        // 'copying' until every copy is made, then 'ready'.
        format!("CREATE TABLE IF NOT EXISTS {s}.reference_tables (db VARCHAR(64) NOT NULL, name VARCHAR(64) NOT NULL, backends VARCHAR(255) NOT NULL, state VARCHAR(16) NOT NULL, PRIMARY KEY (db, name)) {options}"),
        format!("CREATE TABLE IF NOT EXISTS {s}.instances (id VARCHAR(64) NOT NULL PRIMARY KEY, version BIGINT UNSIGNED NOT NULL, seen DATETIME(6) NOT NULL) {options}"),
        // The backend connections each instance's sessions hold while
        // their statement waits: how one instance's deadlock detector sees
        // a cycle through another's clients.
        format!("CREATE TABLE IF NOT EXISTS {s}.waiting_sessions (instance VARCHAR(64) NOT NULL, session INT UNSIGNED NOT NULL, backend INT UNSIGNED NOT NULL, thread INT UNSIGNED NOT NULL, PRIMARY KEY (instance, backend, thread)) {options}"),
        // A switchover under way (HSCALE SWITCHOVER), by backend, and the
        // instance that runs it: 'announced', then 'pausing' while every
        // other instance holds the backend's statements.
        // Hosts of replica sets a failover fenced (never the writer again
        // until rejoined), for every instance, one started later too.
        format!("CREATE TABLE IF NOT EXISTS {s}.fenced_hosts (backend INT UNSIGNED NOT NULL, host VARCHAR(255) NOT NULL, since DATETIME(6) NOT NULL, PRIMARY KEY (backend, host)) {options}"),
        format!("CREATE TABLE IF NOT EXISTS {s}.switchovers (backend INT UNSIGNED NOT NULL PRIMARY KEY, instance VARCHAR(64) NOT NULL, phase VARCHAR(16) NOT NULL, started DATETIME(6) NOT NULL) {options}"),
        // Online moves (MOVE_PARTITION, splits): one row per job, owned by
        // the instance that runs it; its progress as of its last chunk. A
        // split names the value it takes and the partition it goes to. The
        // owner's epoch goes up with each takeover; an owner writes only
        // while its epoch is the row's.
        format!("CREATE TABLE IF NOT EXISTS {s}.moves (id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, db VARCHAR(64) NOT NULL, table_name VARCHAR(64) NOT NULL, partition_name VARCHAR(64) NOT NULL, source_backend INT UNSIGNED NOT NULL, destination_backend INT UNSIGNED NOT NULL, phase VARCHAR(16) NOT NULL, owner VARCHAR(64) NOT NULL, heartbeat DATETIME(6) NOT NULL, rows_copied BIGINT UNSIGNED NOT NULL DEFAULT 0, rows_estimated BIGINT UNSIGNED NOT NULL DEFAULT 0, chunks_verified BIGINT UNSIGNED NOT NULL DEFAULT 0, chunks_repaired BIGINT UNSIGNED NOT NULL DEFAULT 0, lag_bytes BIGINT UNSIGNED NOT NULL DEFAULT 0, fence_attempts INT UNSIGNED NOT NULL DEFAULT 0, last_fence_ms INT UNSIGNED NULL, retired_table VARCHAR(200) NULL, last_error TEXT NULL, started DATETIME(6) NOT NULL, finished DATETIME(6) NULL, split_value VARCHAR(255) NULL, into_partition VARCHAR(64) NULL, into_existing BOOLEAN NOT NULL DEFAULT FALSE, keyless BOOLEAN NOT NULL DEFAULT FALSE, epoch BIGINT UNSIGNED NOT NULL DEFAULT 1, cancel BOOLEAN NOT NULL DEFAULT FALSE, lag_seconds BIGINT UNSIGNED NOT NULL DEFAULT 0) {options}"),
    ] {
        exec(conn, &sql).await?;
    }
    Ok(())
}

/// The hosts failovers fenced, by backend.
pub async fn fenced_hosts(
    conn: &mut BackendConn,
    schema: &str,
) -> Result<Vec<(u32, String)>, ProxyError> {
    let rows = exec(
        conn,
        &format!("SELECT backend, host FROM {}.fenced_hosts", ident(schema)),
    )
    .await?;
    Ok((0..rows.len())
        .filter_map(|r| Some((text(&rows, r, 0).parse().ok()?, text(&rows, r, 1))))
        .collect())
}

/// The switchovers other instances than `instance` run, by backend:
/// whether each pauses the backend's statements now. One that ran longer
/// than a switchover can (its instance died) counts no more.
pub async fn switchovers(
    conn: &mut BackendConn,
    schema: &str,
    instance: &str,
) -> Result<Vec<(u32, bool)>, ProxyError> {
    let rows = exec(
        conn,
        &format!(
            "SELECT backend, phase = 'pausing' FROM {}.switchovers WHERE instance <> {} AND started > NOW(6) - INTERVAL 60 SECOND",
            ident(schema),
            text_literal(instance)
        ),
    )
    .await?;
    Ok((0..rows.len())
        .filter_map(|r| Some((text(&rows, r, 0).parse().ok()?, text(&rows, r, 1) == "1")))
        .collect())
}

pub async fn read_version(conn: &mut BackendConn, schema: &str) -> Result<u64, ProxyError> {
    let rows = exec(
        conn,
        &format!("SELECT version FROM {}.version WHERE id = 1", ident(schema)),
    )
    .await?;
    Ok(text(&rows, 0, 0).parse().unwrap_or(0))
}

/// The whole dictionary, read in one transaction so that tables and
/// partitions agree with the version.
pub async fn load(
    conn: &mut BackendConn,
    handle: &super::DictionaryHandle,
) -> Result<Dictionary, ProxyError> {
    exec(conn, "START TRANSACTION WITH CONSISTENT SNAPSHOT").await?;
    let read = read_rows(conn, handle).await;
    exec(conn, "COMMIT").await?;
    let rows = read?;
    let mut tables = Vec::with_capacity(rows.tables.len());
    for i in 0..rows.tables.len() {
        tables.push(table_of(conn, handle, &rows, i).await?);
    }
    let references = references_of(&rows);
    Ok(Dictionary::new(rows.version, tables).with_references(references))
}

/// The dictionary's rows, as one snapshot read them.
struct DictionaryRows {
    version: u64,
    tables: Rows,
    partitions: Rows,
    /// The tables a schema change holds.
    changing: Rows,
    references: Rows,
    /// The columns of default tables on this backend, by database.
    columns: Vec<(String, Rows)>,
}

async fn read_rows(
    conn: &mut BackendConn,
    handle: &super::DictionaryHandle,
) -> Result<DictionaryRows, ProxyError> {
    let schema = &handle.schema;
    let s = ident(schema);
    let version = read_version(conn, schema).await?;
    let tables = exec(conn, &format!("SELECT db, name, column_name, column_position, column_kind, hash_function, default_table, default_backend, auto_column, auto_position, column_collation, default_state FROM {s}.tables")).await?;
    let partitions = exec(conn, &format!("SELECT db, table_name, partition_name, partition_value, backend, state FROM {s}.partitions ORDER BY added")).await?;
    let changing = exec(
        conn,
        &format!("SELECT DISTINCT db, table_name FROM {s}.schema_changes"),
    )
    .await?;
    let references = exec(
        conn,
        &format!("SELECT db, name, backends, state FROM {s}.reference_tables"),
    )
    .await?;
    // The columns of default tables on this backend, for the planner to
    // tell which table an unqualified column names: one query per
    // database, which information_schema answers from that database's
    // tables alone (a join would open every table of the server).
    let mut databases: Vec<String> = (0..tables.len())
        .filter(|&i| text(&tables, i, 7) == handle.main_backend.to_string())
        .map(|i| text(&tables, i, 0))
        .collect();
    databases.sort_unstable();
    databases.dedup();
    let mut columns = Vec::new();
    for db in databases {
        let sql = format!(
            "SELECT TABLE_NAME, COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = {} ORDER BY TABLE_NAME, ORDINAL_POSITION",
            text_literal(&db)
        );
        columns.push((db, exec(conn, &sql).await?));
    }
    Ok(DictionaryRows {
        version,
        tables,
        partitions,
        changing,
        references,
        columns,
    })
}

/// Whether a schema change holds `db`.`name`.
fn changing(rows: &DictionaryRows, db: &str, name: &str) -> bool {
    let changing = &rows.changing;
    (0..changing.len()).any(|c| text(changing, c, 0) == db && text(changing, c, 1) == name)
}

fn references_of(rows: &DictionaryRows) -> Vec<ReferenceTable> {
    let references = &rows.references;
    (0..references.len())
        .map(|r| ReferenceTable {
            table: TableName {
                db: text(references, r, 0),
                name: text(references, r, 1),
            },
            backends: text(references, r, 2)
                .split(',')
                .filter_map(|b| b.parse().ok())
                .collect(),
            // A schema change on its copies holds its writes as a copy does.
            ready: text(references, r, 3) == "ready"
                && !changing(rows, &text(references, r, 0), &text(references, r, 1)),
        })
        .collect()
}

/// The `i`th table of the dictionary's rows, with its partitions.
async fn table_of(
    conn: &mut BackendConn,
    handle: &super::DictionaryHandle,
    rows: &DictionaryRows,
    i: usize,
) -> Result<PartitionedTable, ProxyError> {
    let (tables, partitions, columns) = (&rows.tables, &rows.partitions, &rows.columns);
    let t = |c| text(tables, i, c);
    let table = TableName {
        db: t(0),
        name: t(1),
    };
    let entries = (0..partitions.len())
        .filter(|&p| text(partitions, p, 0) == table.db && text(partitions, p, 1) == table.name)
        .map(|p| PartitionEntry {
            name: text(partitions, p, 2),
            value: text(partitions, p, 3),
            backend: text(partitions, p, 4).parse().unwrap_or(0),
            state: PartitionState::parse(&text(partitions, p, 5))
                .unwrap_or(PartitionState::Copying),
        })
        .collect();
    let corrupt = |what: &str| ProxyError::DictionaryCorrupt {
        table: table.clone(),
        what: what.to_string(),
    };
    let kind = ColumnKind::parse_name(&t(4)).ok_or_else(|| corrupt("column_kind"))?;
    let function = HashFunction::parse(&t(5)).map_err(|_| corrupt("hash_function"))?;
    let collation = tables[i].get(10).and_then(|v| v.as_ref());
    let collation = collation.map(|c| String::from_utf8_lossy(c).into_owned());
    let folding = handle
        .collations
        .folding(conn, collation.as_deref())
        .await?;
    let definition = TableDefinition {
        table: table.clone(),
        column: t(2),
        column_position: t(3).parse().unwrap_or(0),
        kind,
        function,
        default_table: t(6),
        default_backend: t(7).parse().unwrap_or(0),
        auto_column: tables[i]
            .get(8)
            .and_then(|v| v.as_ref())
            .map(|name| AutoColumn {
                name: String::from_utf8_lossy(name).into_owned(),
                position: t(9).parse().unwrap_or(0),
            }),
        folding,
    };
    let mut table = PartitionedTable::new(definition, entries);
    if t(11) == PartitionState::Fenced.name() {
        table.fence_default();
    }
    table.changing = changing(rows, &table.table.db, &table.table.name);
    let default_here = table.default_backend == handle.main_backend;
    let names: Vec<String> = columns
        .iter()
        .filter(|(db, _)| default_here && *db == table.table.db)
        .flat_map(|(_, rows)| {
            (0..rows.len())
                .filter(|&c| text(rows, c, 0) == table.default_table)
                .map(|c| text(rows, c, 1))
        })
        .collect();
    if !names.is_empty() {
        table.columns = Some(names.into());
    }
    Ok(table)
}

/// Changes the dictionary: the statements and the version bump in one
/// transaction.
pub async fn change(
    conn: &mut BackendConn,
    schema: &str,
    statements: &[String],
) -> Result<(), ProxyError> {
    exec(conn, "START TRANSACTION").await?;
    for sql in statements {
        exec(conn, sql).await?;
    }
    bump(conn, schema).await?;
    exec(conn, "COMMIT").await.map(drop)
}

/// Changes the dictionary as `change` does, only while `condition` (a
/// SELECT of one value, which locks what it reads) answers 1; false, and
/// nothing changed, otherwise.
pub async fn change_if(
    conn: &mut BackendConn,
    schema: &str,
    condition: &str,
    statements: &[String],
) -> Result<bool, ProxyError> {
    exec(conn, "START TRANSACTION").await?;
    if text(&exec(conn, condition).await?, 0, 0) != "1" {
        exec(conn, "ROLLBACK").await?;
        return Ok(false);
    }
    for sql in statements {
        exec(conn, sql).await?;
    }
    bump(conn, schema).await?;
    exec(conn, "COMMIT").await.map(|_| true)
}

/// Bumps the version; run inside the transaction that made the change.
async fn bump(conn: &mut BackendConn, schema: &str) -> Result<(), ProxyError> {
    exec(
        conn,
        &format!(
            "UPDATE {}.version SET version = version + 1 WHERE id = 1",
            ident(schema)
        ),
    )
    .await?;
    Ok(())
}

/// Records that this instance routes by `version` now.
pub async fn heartbeat(
    conn: &mut BackendConn,
    schema: &str,
    instance: &str,
    version: u64,
) -> Result<(), ProxyError> {
    let sql = format!(
        "INSERT INTO {}.instances (id, version, seen) VALUES ({}, {version}, NOW(6)) ON DUPLICATE KEY UPDATE version = VALUES(version), seen = VALUES(seen)",
        ident(schema),
        text_literal(instance)
    );
    exec(conn, &sql).await.map(drop)
}

/// Live instances (heartbeat within `lease_ms`) other than `me` that have not
/// loaded `version` yet.
pub async fn instances_behind(
    conn: &mut BackendConn,
    schema: &str,
    me: &str,
    version: u64,
    lease_ms: u64,
) -> Result<Vec<String>, ProxyError> {
    let sql = format!(
        "SELECT id FROM {}.instances WHERE version < {version} AND id <> {} AND seen > NOW(6) - INTERVAL {} MICROSECOND",
        ident(schema),
        text_literal(me),
        lease_ms * 1000
    );
    let rows = exec(conn, &sql).await?;
    Ok((0..rows.len()).map(|i| text(&rows, i, 0)).collect())
}

/// Whether a table exists on the connection's backend.
pub async fn table_exists(
    conn: &mut BackendConn,
    db: &str,
    table: &str,
) -> Result<bool, ProxyError> {
    let sql = format!(
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = {} AND TABLE_NAME = {}",
        text_literal(db),
        text_literal(table)
    );
    let rows = exec(conn, &sql).await?;
    Ok(text(&rows, 0, 0) != "0")
}

/// A table's definition (SHOW CREATE TABLE) without its AUTO_INCREMENT
/// counter, which moves without the definition changing; `None` when the
/// table does not exist.
pub async fn definition(
    conn: &mut BackendConn,
    db: &str,
    table: &str,
) -> Result<Option<String>, ProxyError> {
    if !table_exists(conn, db, table).await? {
        return Ok(None);
    }
    let rows = exec(
        conn,
        &format!("SHOW CREATE TABLE {}.{}", ident(db), ident(table)),
    )
    .await?;
    Ok(Some(without_auto_increment(&text(&rows, 0, 1))))
}

pub fn without_auto_increment(definition: &str) -> String {
    const COUNTER: &str = " AUTO_INCREMENT=";
    match definition.find(COUNTER) {
        Some(start) => {
            let digits = &definition[start + COUNTER.len()..];
            let end = digits
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(digits.len());
            format!("{}{}", &definition[..start], &digits[end..])
        }
        None => definition.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::without_auto_increment;

    #[test]
    fn a_definition_is_compared_without_its_auto_increment_counter() {
        let created = "CREATE TABLE `t` (\n  `id` int(11) NOT NULL AUTO_INCREMENT,\n  PRIMARY KEY (`id`)\n) ENGINE=InnoDB AUTO_INCREMENT=11 DEFAULT CHARSET=latin1";
        assert_eq!(
            without_auto_increment(created),
            "CREATE TABLE `t` (\n  `id` int(11) NOT NULL AUTO_INCREMENT,\n  PRIMARY KEY (`id`)\n) ENGINE=InnoDB DEFAULT CHARSET=latin1"
        );
        assert_eq!(without_auto_increment("x AUTO_INCREMENT=7"), "x");
        assert_eq!(without_auto_increment("no counter"), "no counter");
    }
}
