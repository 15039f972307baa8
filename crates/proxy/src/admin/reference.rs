//! HSCALE SETUP_REFERENCE(table): a table of the main backend copied whole
//! to every other backend, so that partitions join it where they are.
//!
//! No write may reach one copy and miss another: the table enters the
//! dictionary first as being copied (writes to it wait), every instance
//! loads that, the copy runs under `LOCK TABLES ... READ` on the main
//! backend (which waits for writes already running there), and only then is
//! it ready: from that version on, writes go to every copy in one
//! transaction.

use hscale_moves::Column;
use hscale_planner::TableName;

use super::{check_manageable, current, publish, AdminAnswer, AdminError, AdminLock};
use crate::backend::BackendConn;
use crate::dictionary::store::{self, exec, ident, text_literal};
use crate::error::ProxyError;
use crate::online::copy::raw_connection;
use crate::shared::Cluster;

/// How many bytes of rows one INSERT into a copy carries.
const INSERT_BYTES: usize = 1 << 20;

pub async fn setup(shared: &Cluster, table: TableName) -> Result<AdminAnswer, ProxyError> {
    let mut lock = AdminLock::take(shared).await?;
    let dictionary = current(shared, &mut lock).await?;
    let main_backend = shared.main_backend();
    check_manageable(shared, &dictionary, &table.db, &table.name)?;
    // One whose copying stopped (its instance died) is copied anew: its
    // writes wait until it is ready.
    let resumed = match dictionary.reference(&table.db, &table.name) {
        Some(reference) if reference.ready => {
            return Err(AdminError::Invalid(format!("{table} is a reference table already")).into())
        }
        Some(_) => true,
        None => false,
    };
    let mut source = raw_connection(shared, shared.main).await?;
    let Some(definition) = store::definition(&mut source, &table.db, &table.name).await? else {
        return Err(AdminError::NoSuchTable {
            table,
            backend: main_backend,
        }
        .into());
    };
    let columns = crate::online::table::describe(&mut source, &table.db, &table.name, &table.name)
        .await?
        .columns;
    let mut copies = copy_backends(shared, &table, resumed).await?;
    let backends: Vec<String> = std::iter::once(main_backend)
        .chain(copies.iter().map(|(backend, _)| *backend))
        .map(|b| b.to_string())
        .collect();
    let schema = &shared.dictionary.schema;
    let s = ident(schema);
    let key = format!(
        "db = {} AND name = {}",
        text_literal(&table.db),
        text_literal(&table.name)
    );
    store::change(
        &mut lock.conn,
        schema,
        &[format!(
            "REPLACE INTO {s}.reference_tables (db, name, backends, state) VALUES ({}, {}, {}, 'copying')",
            text_literal(&table.db),
            text_literal(&table.name),
            text_literal(&backends.join(","))
        )],
    )
    .await?;
    let copied = async {
        // Every instance makes writes to it wait before the rows are read.
        publish(shared, &mut lock).await?;
        let qualified = format!("{}.{}", ident(&table.db), ident(&table.name));
        exec(&mut source, &format!("LOCK TABLES {qualified} READ")).await?;
        let rows = exec(&mut source, &format!("SELECT * FROM {qualified}")).await;
        let unlocked = exec(&mut source, "UNLOCK TABLES").await;
        let rows = rows?;
        unlocked?;
        for (_, conn) in &mut copies {
            exec(
                conn,
                &format!("CREATE DATABASE IF NOT EXISTS {}", ident(&table.db)),
            )
            .await?;
            exec(conn, &format!("USE {}", ident(&table.db))).await?;
            exec(conn, &definition).await?;
            for insert in inserts(&qualified, &columns, &rows) {
                exec(conn, &insert).await?;
            }
        }
        Ok::<_, ProxyError>(rows.len())
    };
    let rows = match copied.await {
        Ok(rows) => rows,
        Err(e) => {
            // Back to a plain table: no copy stays behind.
            for (_, conn) in &mut copies {
                let drop = format!(
                    "DROP TABLE IF EXISTS {}.{}",
                    ident(&table.db),
                    ident(&table.name)
                );
                let _ = exec(conn, &drop).await;
            }
            let forget = format!("DELETE FROM {s}.reference_tables WHERE {key}");
            store::change(&mut lock.conn, schema, &[forget]).await?;
            publish(shared, &mut lock).await?;
            return Err(e);
        }
    };
    let ready = format!("UPDATE {s}.reference_tables SET state = 'ready' WHERE {key}");
    store::change(&mut lock.conn, schema, &[ready]).await?;
    publish(shared, &mut lock).await?;
    Ok(AdminAnswer::done(rows as u64))
}

/// A connection to every backend but the main one, where the copies go;
/// refused where one has a table of that name (a copying that stopped
/// half-way, `resumed`, is dropped first).
async fn copy_backends(
    shared: &Cluster,
    table: &TableName,
    resumed: bool,
) -> Result<Vec<(u32, Box<BackendConn>)>, ProxyError> {
    let mut copies = Vec::new();
    for (slot, pool) in shared.pools.iter().enumerate() {
        if slot == shared.main {
            continue;
        }
        let mut conn = raw_connection(shared, slot).await?;
        if resumed {
            let partial = format!(
                "DROP TABLE IF EXISTS {}.{}",
                ident(&table.db),
                ident(&table.name)
            );
            exec(&mut conn, &partial).await?;
        }
        if store::table_exists(&mut conn, &table.db, &table.name).await? {
            return Err(AdminError::TableExists {
                db: table.db.clone(),
                name: table.name.clone(),
                backend: pool.id(),
            }
            .into());
        }
        copies.push((pool.id(), conn));
    }
    Ok(copies)
}

/// The rows as INSERTs of at most `INSERT_BYTES` each.
fn inserts(
    qualified: &str,
    columns: &[Column],
    rows: &[Vec<hscale_wire::resultset::TextValue>],
) -> Vec<String> {
    let names: Vec<String> = columns.iter().map(|c| ident(&c.name)).collect();
    let head = format!("INSERT INTO {qualified} ({}) VALUES ", names.join(", "));
    let mut statements = Vec::new();
    let mut statement = head.clone();
    for row in rows {
        if statement.len() > head.len() {
            statement.push(',');
        }
        statement.push('(');
        for (i, (column, value)) in columns.iter().zip(row).enumerate() {
            if i > 0 {
                statement.push(',');
            }
            column.text_literal(value.as_deref(), &mut statement);
        }
        statement.push(')');
        if statement.len() >= INSERT_BYTES {
            statements.push(std::mem::replace(&mut statement, head.clone()));
        }
    }
    if statement.len() > head.len() {
        statements.push(statement);
    }
    statements
}
