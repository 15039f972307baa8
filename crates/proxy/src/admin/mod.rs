//! HSCALE admin commands (DESIGN.md §5): parsed by the planner's grammar,
//! executed here, a file per command that changes the dictionary. Changes
//! run under one lock on the main backend, so that instances never change
//! the dictionary at the same time, and each change is loaded by every live
//! instance before the command returns.

mod add_partition;
mod drop_partition;
pub(crate) mod error;
mod reference;
pub mod schema;
mod setup_table;
mod show;

use std::time::Duration;

use hscale_planner::admin::{parse_admin, AdminCommand};
use hscale_planner::{Dictionary, PartitionedTable, TableName};
use hscale_wire::resultset::ColumnType;

use crate::backend::BackendConn;
use crate::dictionary::{own_connection, store};
use crate::error::ProxyError;
use crate::shared::Cluster;
pub use error::AdminError;

/// What the session sends back for an admin command.
pub enum AdminAnswer {
    Ok {
        affected_rows: u64,
        /// Warnings the client's SHOW WARNINGS lists.
        warnings: Vec<String>,
    },
    Rows {
        columns: Vec<(&'static str, ColumnType)>,
        rows: Vec<Vec<Option<String>>>,
    },
}

impl AdminAnswer {
    /// An OK of `affected_rows`, without warnings.
    pub fn done(affected_rows: u64) -> AdminAnswer {
        AdminAnswer::Ok {
            affected_rows,
            warnings: Vec::new(),
        }
    }
}

/// What an admin command's caller is.
pub struct Caller<'a> {
    pub db: Option<&'a str>,
    pub quoting: hscale_planner::Quoting,
    pub no_auto_value_on_zero: bool,
}

/// The dictionary lock: taken on a connection of the main backend, released
/// when that connection closes, also when this instance dies.
pub struct AdminLock {
    pub conn: Box<BackendConn>,
}

const LOCK_SECONDS: u32 = 30;

impl AdminLock {
    pub async fn take(shared: &Cluster) -> Result<AdminLock, ProxyError> {
        let mut conn = own_connection(shared, shared.main).await?;
        let name = store::text_literal(&format!("{}.admin", shared.dictionary.schema));
        let rows = store::exec(
            &mut conn,
            &format!("SELECT GET_LOCK({name}, {LOCK_SECONDS})"),
        )
        .await?;
        match store::text(&rows, 0, 0).as_str() {
            "1" => Ok(AdminLock { conn }),
            _ => Err(AdminError::Busy.into()),
        }
    }
}

pub async fn execute(
    front: &crate::shared::Shared,
    caller: &Caller<'_>,
    sql: &str,
) -> Result<AdminAnswer, ProxyError> {
    let command = parse_admin(sql).map_err(AdminError::from)?;
    let shared = &front.cluster;
    match command {
        AdminCommand::SetupTable {
            table,
            column,
            default_table,
            backend,
            function,
        } => {
            let table = resolve(&table, caller)?;
            setup_table::run(shared, table, column, default_table, backend, function).await
        }
        AdminCommand::AddPartition {
            table,
            partition,
            value,
            backend,
        } => add_partition::run(shared, resolve(&table, caller)?, partition, value, backend).await,
        AdminCommand::DropPartition { table, partition } => {
            drop_partition::run(shared, resolve(&table, caller)?, partition).await
        }
        AdminCommand::MovePartition {
            table,
            partition,
            backend,
        } => crate::online::start(shared, resolve(&table, caller)?, partition, backend).await,
        AdminCommand::SplitPartition {
            table,
            partition,
            into,
            value,
            backend,
        } => {
            let table = resolve(&table, caller)?;
            add_partition::split(shared, table, partition, into, value, backend).await
        }
        AdminCommand::SetupReference { table } => {
            reference::setup(shared, resolve(&table, caller)?).await
        }
        AdminCommand::ShowMoves => crate::online::show(shared).await,
        AdminCommand::CancelMove { job } => crate::online::cancel(shared, job).await,
        AdminCommand::ShowPartitions { table } => {
            show::partitions(shared, &resolve(&table, caller)?)
        }
        AdminCommand::Lookup { table, value } => {
            show::lookup(shared, &resolve(&table, caller)?, &value)
        }
        AdminCommand::ShowTables => Ok(show::tables(shared)),
        AdminCommand::Status => Ok(show::status(front)),
        AdminCommand::ShowBackends => Ok(show::backends(shared)),
        AdminCommand::Switchover { backend, host } => switchover(shared, backend, &host).await,
        AdminCommand::Refresh => {
            crate::dictionary::reload(shared).await?;
            Ok(AdminAnswer::done(0))
        }
        AdminCommand::Explain(statement) => show::explain(shared, caller, &statement),
    }
}

/// HSCALE SWITCHOVER: the old and new writer and the pause, as a row.
async fn switchover(shared: &Cluster, backend: u32, host: &str) -> Result<AdminAnswer, ProxyError> {
    let Some(pool) = shared.pools.iter().find(|p| p.id() == backend) else {
        return Err(AdminError::Invalid(format!("there is no backend {backend}")).into());
    };
    let in_flight = || {
        shared
            .sessions
            .all()
            .iter()
            .any(|(_, session)| session.running().is_some_and(|(b, _)| b == backend))
    };
    hold_everywhere(shared, backend).await?;
    let switched = crate::backend::replicas::switchover(pool, host, in_flight).await;
    if let Err(e) = release_everywhere(shared, backend).await {
        tracing::warn!(
            backend,
            "a switchover's hold is lifted when it expires: {e}"
        );
    }
    let switched = switched.map_err(AdminError::Invalid)?;
    Ok(AdminAnswer::Rows {
        columns: vec![
            ("backend", ColumnType::Integer),
            ("old_writer", ColumnType::Text),
            ("new_writer", ColumnType::Text),
            ("pause_ms", ColumnType::Integer),
        ],
        rows: vec![vec![
            Some(backend.to_string()),
            Some(switched.from),
            Some(switched.to),
            Some(switched.pause.as_millis().to_string()),
        ]],
    })
}

/// Every live instance holds the statements that need `backend`'s writer
/// before a switchover makes it read-only: a statement one of them sent to
/// the old writer afterwards would fail there with 1290, or, run as an
/// account that read_only does not stop, be written where no replica reads
/// it. Announced first, so that they poll often, then asked for; an
/// instance that does not follow within its budget ends the switchover
/// before anything changed.
async fn hold_everywhere(shared: &Cluster, backend: u32) -> Result<(), ProxyError> {
    let handle = &shared.dictionary;
    let mut conn = own_connection(shared, shared.main).await?;
    // Nothing waits while the switchover is announced: an instance whose
    // poll is slow (a loaded machine) is waited for up to the lease, past
    // which it no longer counts as live. The hold is what clients wait
    // through: it has its second.
    let phases = [
        ("announced", handle.lease),
        ("pausing", Duration::from_millis(1000)),
    ];
    for (phase, budget) in phases {
        let record = format!(
            "REPLACE INTO {}.switchovers VALUES ({backend}, {}, '{phase}', NOW(6))",
            store::ident(&handle.schema),
            store::text_literal(&handle.instance)
        );
        store::change(&mut conn, &handle.schema, &[record]).await?;
        crate::dictionary::reload(shared).await?;
        let version = store::read_version(&mut conn, &handle.schema).await?;
        if !crate::dictionary::all_instances_loaded(shared, &mut conn, version, budget).await? {
            release_everywhere(shared, backend).await?;
            return Err(AdminError::Invalid(format!(
                "an instance of hscale did not hold backend {backend}'s statements within {budget:?} (HSCALE STATUS lists them): nothing was switched"
            ))
            .into());
        }
    }
    Ok(())
}

/// The switchover of `backend` is over: every instance finds its writer.
async fn release_everywhere(shared: &Cluster, backend: u32) -> Result<(), ProxyError> {
    let handle = &shared.dictionary;
    let mut conn = own_connection(shared, shared.main).await?;
    let forget = format!(
        "DELETE FROM {}.switchovers WHERE backend = {backend}",
        store::ident(&handle.schema)
    );
    store::change(&mut conn, &handle.schema, &[forget]).await?;
    crate::dictionary::reload(shared).await
}

/// `db.table`, or `table` in the caller's database.
fn resolve(name: &str, caller: &Caller) -> Result<TableName, ProxyError> {
    match name.split_once('.') {
        Some((db, table)) => Ok(TableName {
            db: db.to_string(),
            name: table.to_string(),
        }),
        None => Ok(TableName {
            db: caller.db.ok_or(AdminError::NoDatabase)?.to_string(),
            name: name.to_string(),
        }),
    }
}

/// After a change: this instance loads it, then waits for the others.
/// The server's own schemas: their tables are the server's, never an
/// application's to partition or copy.
const SYSTEM_SCHEMAS: [&str; 4] = ["mysql", "information_schema", "performance_schema", "sys"];

/// Refuses a table that SETUP_TABLE or SETUP_REFERENCE must leave alone:
/// the server's system tables (renaming `mysql.global_priv` keeps the
/// server from starting), hscale's own schema and working tables
/// (`_hscale_...`), and the tables of a partitioned table (its name, its
/// default and partition tables).
fn check_manageable(
    shared: &Cluster,
    dictionary: &Dictionary,
    db: &str,
    name: &str,
) -> Result<(), AdminError> {
    let table = format!("`{db}`.`{name}`");
    if SYSTEM_SCHEMAS.iter().any(|s| s.eq_ignore_ascii_case(db)) {
        return Err(AdminError::Invalid(format!(
            "{table} is a table of the server's own schema `{db}`, which hscale never partitions or copies"
        )));
    }
    if db.eq_ignore_ascii_case(&shared.dictionary.schema) {
        return Err(AdminError::Invalid(format!(
            "{table} is in hscale's own schema, which is never partitioned or copied"
        )));
    }
    if name.len() >= 8 && name[..8].eq_ignore_ascii_case("_hscale_") {
        return Err(AdminError::Invalid(format!(
            "{table} is one of hscale's working tables (`_hscale_...`)"
        )));
    }
    if let Some(owner) = dictionary.claimant(db, name) {
        return Err(AdminError::Invalid(format!(
            "{table} is a table of partitioned table {owner}"
        )));
    }
    Ok(())
}

async fn publish(shared: &Cluster, lock: &mut AdminLock) -> Result<(), ProxyError> {
    crate::dictionary::reload(shared).await?;
    let version = store::read_version(&mut lock.conn, &shared.dictionary.schema).await?;
    crate::dictionary::wait_for_instances(shared, &mut lock.conn, version).await
}

/// The dictionary as the store has it now (under the lock, newer than any snapshot).
async fn current(shared: &Cluster, lock: &mut AdminLock) -> Result<Dictionary, ProxyError> {
    store::load(&mut lock.conn, &shared.dictionary).await
}

pub(crate) fn partitioned<'d>(
    dictionary: &'d Dictionary,
    table: &TableName,
) -> Result<&'d PartitionedTable, AdminError> {
    dictionary
        .table(&table.db, &table.name)
        .ok_or_else(|| AdminError::NotPartitioned {
            table: table.clone(),
        })
}

fn slot(shared: &Cluster, backend: u32) -> Result<usize, ProxyError> {
    shared
        .pool_index(backend)
        .ok_or(ProxyError::UnknownBackend { backend })
}
