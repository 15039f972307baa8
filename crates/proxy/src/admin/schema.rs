//! The table lock of a schema statement on a partitioned table (ALTER,
//! TRUNCATE, CREATE/DROP INDEX, DROP TABLE, RENAME TABLE) or on a reference
//! table. Its steps, one per physical table or copy, are recorded in the dictionary's `schema_changes`: while
//! they are there the table is locked on every instance, each step is marked
//! done as it succeeds, and a start after hscale died in the middle runs the
//! steps not done yet and finishes the change.

use hscale_planner::{Dictionary, SchemaChange, SchemaEffect, Step, TableName, Target};

use super::{current, publish, AdminError, AdminLock};
use crate::backend::BackendConn;
use crate::dictionary::{own_connection, store};
use crate::error::ProxyError;
use crate::shared::Cluster;

use store::{exec, ident, text, text_literal};

/// Held while a schema change runs: the dictionary lock, and the change
/// recorded as in progress.
pub struct SchemaLock {
    admin: AdminLock,
    change: SchemaChange,
}

impl SchemaLock {
    /// Takes the dictionary lock, plans the statement again against the
    /// dictionary as it is now (another change may have come first) and
    /// records its steps; once every instance has loaded that, the table is
    /// locked everywhere.
    pub async fn take(
        shared: &Cluster,
        plan: impl FnOnce(&Dictionary) -> hscale_planner::Action,
    ) -> Result<SchemaLock, ProxyError> {
        let mut admin = AdminLock::take(shared).await?;
        let dictionary = current(shared, &mut admin).await?;
        let change = match plan(&dictionary) {
            hscale_planner::Action::Schema(change) => change,
            hscale_planner::Action::Refuse(refusal) => {
                return Err(ProxyError::Unroutable(refusal))
            }
            _ => {
                return Err(AdminError::Invalid(
                    "the partitioned table changed while the statement waited for the dictionary lock; run it again".into(),
                )
                .into())
            }
        };
        crate::online::refuse_while_moving(shared, &mut admin.conn, &change.table).await?;
        if let SchemaEffect::Renamed(new) = &change.effect {
            // The new name is free where the statement gives it: on the
            // main backend, and wherever a physical table has the table's
            // own name (a reference table's copies).
            let mut backends: Vec<u32> = std::iter::once(shared.main_backend())
                .chain(
                    change
                        .steps
                        .iter()
                        .filter(|step| *step.target.table == *change.table.name)
                        .map(|step| step.target.backend),
                )
                .collect();
            backends.sort_unstable();
            backends.dedup();
            for backend in backends {
                let mut conn = own_connection(shared, super::slot(shared, backend)?).await?;
                if store::table_exists(&mut conn, &new.db, &new.name).await? {
                    return Err(AdminError::TableExists {
                        db: new.db.clone(),
                        name: new.name.clone(),
                        backend,
                    }
                    .into());
                }
            }
        }
        record(shared, &mut admin.conn, &change).await?;
        let mut lock = SchemaLock {
            admin,
            change: *change,
        };
        publish(shared, &mut lock.admin).await?;
        Ok(lock)
    }

    pub fn change(&self) -> &SchemaChange {
        &self.change
    }

    /// Step `step` is about to be sent: its physical table's definition now
    /// lets a restart tell whether it took effect.
    pub async fn starting(&mut self, shared: &Cluster, step: usize) -> Result<(), ProxyError> {
        let target = &self.change.steps[step].target;
        let mut c = own_connection(shared, super::slot(shared, target.backend)?).await?;
        let before = store::definition(&mut c, &self.change.table.db, &target.table).await?;
        let sql = format!(
            "UPDATE {}.schema_changes SET before_definition = {} WHERE {} AND step = {step}",
            ident(&shared.dictionary.schema),
            before.as_deref().map_or("NULL".into(), text_literal),
            of_table(&self.change.table)
        );
        exec(&mut self.admin.conn, &sql).await.map(drop)
    }

    /// Step `step` succeeded: a restart does not run it again.
    pub async fn done(&mut self, shared: &Cluster, step: usize) -> Result<(), ProxyError> {
        let sql = format!(
            "UPDATE {}.schema_changes SET done = TRUE WHERE {} AND step = {step}",
            ident(&shared.dictionary.schema),
            of_table(&self.change.table)
        );
        exec(&mut self.admin.conn, &sql).await.map(drop)
    }

    /// Every step ran: the dictionary records the effect, and the table is
    /// unlocked.
    pub async fn finish(mut self, shared: &Cluster) -> Result<(), ProxyError> {
        finish(shared, &mut self.admin.conn, &self.change).await?;
        publish(shared, &mut self.admin).await
    }

    /// A step failed: the table is unlocked with its dictionary entry as it
    /// was; the error tells which physical tables changed.
    pub async fn abandon(mut self, shared: &Cluster) -> Result<(), ProxyError> {
        let schema = &shared.dictionary.schema;
        let forget = [forget(schema, &self.change.table)];
        store::change(&mut self.admin.conn, schema, &forget).await?;
        publish(shared, &mut self.admin).await
    }
}

fn of_table(table: &TableName) -> String {
    format!(
        "db = {} AND table_name = {}",
        text_literal(&table.db),
        text_literal(&table.name)
    )
}

fn forget(schema: &str, table: &TableName) -> String {
    format!(
        "DELETE FROM {}.schema_changes WHERE {}",
        ident(schema),
        of_table(table)
    )
}

async fn record(
    shared: &Cluster,
    conn: &mut BackendConn,
    change: &SchemaChange,
) -> Result<(), ProxyError> {
    let schema = &shared.dictionary.schema;
    let renamed_to = match &change.effect {
        SchemaEffect::Renamed(new) => text_literal(&new.name),
        _ => "NULL".into(),
    };
    let mut inserts = Vec::new();
    for (i, step) in change.steps.iter().enumerate() {
        inserts.push(format!(
            "INSERT INTO {}.schema_changes VALUES ({}, {}, {i}, {}, {}, {}, {}, FALSE, '{}', {renamed_to}, NULL)",
            ident(schema),
            text_literal(&change.table.db),
            text_literal(&change.table.name),
            step.target.backend,
            text_literal(&step.target.table),
            step.target
                .partition
                .as_deref()
                .map_or("NULL".into(), text_literal),
            text_literal(&step.sql),
            change.effect.name(),
        ));
    }
    store::change(conn, schema, &inserts).await
}

/// The dictionary after every step: the effect recorded and the lock gone,
/// in one transaction.
async fn finish(
    shared: &Cluster,
    conn: &mut BackendConn,
    change: &SchemaChange,
) -> Result<(), ProxyError> {
    let schema = &shared.dictionary.schema;
    let s = ident(schema);
    let table = &change.table;
    let key = format!(
        "db = {} AND {{name}} = {}",
        text_literal(&table.db),
        text_literal(&table.name)
    );
    let of = |column: &str| key.replace("{name}", column);
    let mut changes = Vec::new();
    let dictionary = store::load(conn, &shared.dictionary).await?;
    let reference = dictionary.reference(&table.db, &table.name).is_some();
    match &change.effect {
        SchemaEffect::Unchanged if reference => {}
        SchemaEffect::Dropped if reference => {
            changes.push(format!(
                "DELETE FROM {s}.reference_tables WHERE {}",
                of("name")
            ));
        }
        SchemaEffect::Renamed(new) if reference => {
            changes.push(format!(
                "UPDATE {s}.reference_tables SET name = {} WHERE {}",
                text_literal(&new.name),
                of("name")
            ));
        }
        SchemaEffect::Unchanged => {
            if let Some((position, auto_position)) = column_positions(shared, conn, table).await? {
                changes.push(format!(
                    "UPDATE {s}.tables SET column_position = {position}, auto_position = {auto_position} WHERE {}",
                    of("name")
                ));
            }
        }
        SchemaEffect::Dropped => {
            changes.push(format!("DELETE FROM {s}.tables WHERE {}", of("name")));
            changes.push(format!(
                "DELETE FROM {s}.sequences WHERE {}",
                of("table_name")
            ));
            changes.push(format!(
                "DELETE FROM {s}.partitions WHERE {}",
                of("table_name")
            ));
        }
        SchemaEffect::Renamed(new) => {
            let default = match dictionary.table(&table.db, &table.name) {
                Some(t) => t.renamed_default(&new.name),
                None => {
                    return Err(AdminError::NotPartitioned {
                        table: table.clone(),
                    }
                    .into())
                }
            };
            changes.push(format!(
                "UPDATE {s}.tables SET name = {}, default_table = {} WHERE {}",
                text_literal(&new.name),
                text_literal(&default),
                of("name")
            ));
            for table in ["partitions", "sequences"] {
                changes.push(format!(
                    "UPDATE {s}.{table} SET table_name = {} WHERE {}",
                    text_literal(&new.name),
                    of("table_name")
                ));
            }
        }
    }
    changes.push(forget(schema, table));
    store::change(conn, schema, &changes).await
}

/// Where the partition column and the AUTO_INCREMENT column (`NULL` if
/// none) are in the default table now: an ALTER that adds a column before
/// them moves them, and INSERTs without a column list are read by them.
async fn column_positions(
    shared: &Cluster,
    conn: &mut BackendConn,
    table: &TableName,
) -> Result<Option<(String, String)>, ProxyError> {
    let dictionary = store::load(conn, &shared.dictionary).await?;
    let Some(t) = dictionary.table(&table.db, &table.name) else {
        return Ok(None);
    };
    let slot = super::slot(shared, t.default_backend)?;
    let mut c = own_connection(shared, slot).await?;
    let position = |column: &str| {
        format!(
            "(SELECT ORDINAL_POSITION FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = {} AND TABLE_NAME = {} AND COLUMN_NAME = {})",
            text_literal(&table.db),
            text_literal(&t.default_table),
            text_literal(column)
        )
    };
    let auto = match &t.auto_column {
        Some(auto) => position(&auto.name),
        None => "NULL".into(),
    };
    let sql = format!("SELECT {}, {auto}", position(&t.column));
    let rows = exec(&mut c, &sql).await?;
    let found = rows
        .first()
        .and_then(|r| r.first())
        .is_some_and(|v| v.is_some());
    let auto = match rows.first().and_then(|r| r.get(1)).and_then(|v| v.as_ref()) {
        Some(v) => String::from_utf8_lossy(v).into_owned(),
        None => "NULL".into(),
    };
    Ok(found.then(|| (text(&rows, 0, 0), auto)))
}

/// Finishes every schema change the dictionary shows in progress: the steps
/// not done yet run, then the change is recorded. A step that fails now is
/// logged and left out, so that the table is not locked for good.
pub async fn recover(shared: &Cluster, conn: &mut BackendConn) -> Result<(), ProxyError> {
    let s = ident(&shared.dictionary.schema);
    let pending = format!("SELECT db, table_name, step, backend, physical, partition_name, statement, done, effect, renamed_to, before_definition FROM {s}.schema_changes ORDER BY db, table_name, step");
    if exec(conn, &pending).await?.is_empty() {
        return Ok(());
    }
    let _lock = AdminLock::take(shared).await?;
    let rows = exec(conn, &pending).await?;
    // Per step: done, and the definition its table had just before it was sent.
    type Progress = Vec<(bool, Option<String>)>;
    let mut changes: Vec<(SchemaChange, Progress)> = Vec::new();
    for r in 0..rows.len() {
        let t = |c| text(&rows, r, c);
        let table = TableName {
            db: t(0),
            name: t(1),
        };
        let step = Step {
            target: Target::new(
                &table.db,
                t(3).parse().unwrap_or(0),
                &t(4),
                rows[r][5]
                    .as_ref()
                    .map(|p| String::from_utf8_lossy(p))
                    .as_deref(),
            ),
            sql: t(6),
        };
        let progress = (
            t(7) == "1",
            rows[r][10]
                .as_ref()
                .map(|d| String::from_utf8_lossy(d).into_owned()),
        );
        match changes.last_mut() {
            Some((change, steps)) if change.table == table => {
                change.steps.push(step);
                steps.push(progress);
            }
            _ => {
                let effect = match t(8).as_str() {
                    "dropped" => SchemaEffect::Dropped,
                    "renamed" => SchemaEffect::Renamed(TableName {
                        db: table.db.clone(),
                        name: t(9),
                    }),
                    _ => SchemaEffect::Unchanged,
                };
                let change = SchemaChange {
                    table,
                    statement: "schema change".into(),
                    steps: vec![step],
                    effect,
                };
                changes.push((change, vec![progress]));
            }
        }
    }
    for (change, progress) in changes {
        for (step, (_, before)) in change
            .steps
            .iter()
            .zip(progress)
            .filter(|(_, (done, _))| !done)
        {
            let slot = super::slot(shared, step.target.backend)?;
            let mut c = own_connection(shared, slot).await?;
            wait_for_dead_statement(&mut c, &step.sql).await?;
            if let Some(before) = before {
                let now = store::definition(&mut c, &change.table.db, &step.target.table).await?;
                if now.as_ref() != Some(&before) {
                    tracing::warn!(table = %change.table, physical = %step.target.table, sql = %step.sql, "the step that was running when hscale stopped took effect; not run again");
                    continue;
                }
            }
            tracing::warn!(table = %change.table, physical = %step.target.table, sql = %step.sql, "finishing an interrupted schema change");
            let ran = async {
                exec(&mut c, &format!("USE {}", ident(&change.table.db))).await?;
                exec(&mut c, &step.sql).await
            };
            if let Err(e) = ran.await {
                tracing::error!(table = %change.table, physical = %step.target.table, error = %e, "a step of an interrupted schema change failed; check this physical table");
            }
        }
        finish(shared, conn, &change).await?;
    }
    Ok(())
}

/// A statement a dead instance sent still runs to its end on the server:
/// waits until no connection runs `sql`, so that recovery judges the table
/// after it rather than racing it.
async fn wait_for_dead_statement(conn: &mut BackendConn, sql: &str) -> Result<(), ProxyError> {
    let running = format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO = {} AND ID <> CONNECTION_ID()",
        text_literal(sql)
    );
    let mut waited = false;
    while text(&exec(conn, &running).await?, 0, 0) != "0" {
        if !waited {
            tracing::warn!(%sql, "waiting for a schema statement sent before hscale stopped to end");
            waited = true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Ok(())
}
