//! Schema statements on a partitioned table: ALTER TABLE, TRUNCATE, CREATE
//! and DROP INDEX, DROP TABLE and RENAME TABLE become one statement per
//! physical table, the default table first, which the proxy runs in turn
//! under the table lock; the plan also says what the dictionary records
//! after. On a reference table: one statement per copy.

use sqlparser::ast::{AlterTableOperation, ObjectName, ObjectType, Statement};

use crate::dictionary::{PartitionedTable, ReferenceTable, TableName, Target};
use crate::error::PlanError;
use crate::plan::{Action, Context, SchemaChange, SchemaEffect, Step};
use crate::rewrite::{quote_identifier, Splices};
use crate::route::{resolve, same_name, Analysis};
use crate::shape::{apply_edits, bytes};

/// Tables a schema statement names outside of relation positions.
pub(crate) fn schema_names(statement: &Statement) -> Vec<&ObjectName> {
    match statement {
        Statement::Drop {
            object_type: ObjectType::Table,
            names,
            ..
        } => names.iter().collect(),
        Statement::Drop {
            object_type: ObjectType::Index,
            table: Some(table),
            ..
        } => vec![table],
        Statement::AlterTable(alter) => vec![&alter.name],
        Statement::RenameTable(renames) => renames
            .iter()
            .flat_map(|r| [&r.old_name, &r.new_name])
            .collect(),
        Statement::CreateIndex(index) => vec![&index.table_name],
        Statement::CreateTable(create) => vec![&create.name],
        Statement::Truncate(truncate) => truncate.table_names.iter().map(|t| &t.name).collect(),
        Statement::ShowCreate { obj_name, .. } => vec![obj_name],
        _ => Vec::new(),
    }
}

impl Analysis<'_> {
    /// The plan of a schema statement whose table (`self.reference`) is
    /// partitioned, or why it cannot run.
    pub(crate) fn schema_change(&self) -> Result<Action, PlanError> {
        let table = self.table;
        let change = |statement: &str, steps, effect| {
            Ok(Action::Schema(Box::new(SchemaChange {
                table: table.table.clone(),
                statement: statement.to_string(),
                steps,
                effect,
            })))
        };
        match self.statement {
            Statement::AlterTable(alter) => {
                for operation in &alter.operations {
                    self.check_alter(operation)?;
                }
                change("ALTER TABLE", self.spliced()?, SchemaEffect::Unchanged)
            }
            Statement::Truncate(truncate) if truncate.table_names.len() == 1 => {
                change("TRUNCATE TABLE", self.spliced()?, SchemaEffect::Unchanged)
            }
            Statement::CreateIndex(_) => {
                change("CREATE INDEX", self.spliced()?, SchemaEffect::Unchanged)
            }
            Statement::Drop {
                object_type: ObjectType::Index,
                ..
            } => change("DROP INDEX", self.spliced()?, SchemaEffect::Unchanged),
            // A temporary table of that name is the session's own.
            Statement::Drop {
                temporary: true, ..
            } => Ok(Action::Main),
            Statement::Drop { names, .. } if names.len() == 1 => {
                let steps = physical_steps(table, |target| {
                    format!(
                        "DROP TABLE IF EXISTS {}.{}",
                        quote_identifier(&table.table.db),
                        quote_identifier(&target.table)
                    )
                });
                change("DROP TABLE", steps, SchemaEffect::Dropped)
            }
            Statement::Drop { .. } => Err(
                "DROP TABLE of a partitioned table with other tables (drop it in a statement of its own)"
                    .into(),
            ),
            Statement::RenameTable(renames) => match renames.as_slice() {
                [rename] if same_name(&rename.old_name, &self.reference) => {
                    self.rename(&rename.new_name)
                }
                [_] => Err("RENAME TABLE to the name of a partitioned table".into()),
                _ => Err(
                    "RENAME TABLE of several tables, one of them partitioned (rename it in a statement of its own)"
                        .into(),
                ),
            },
            Statement::CreateTable(create) => Ok(Action::Exists {
                table: table.table.clone(),
                quiet: create.if_not_exists,
            }),
            Statement::Truncate(_) => Err(
                "TRUNCATE of a partitioned table with other tables (truncate it in a statement of its own)"
                    .into(),
            ),
            _ => Err("SHOW CREATE TABLE".into()),
        }
    }

    /// The partition column stays as it is: its rows are placed by it.
    fn check_alter(&self, operation: &AlterTableOperation) -> Result<(), PlanError> {
        let column = &self.table.column;
        let is_column = |name: &sqlparser::ast::Ident| name.value.eq_ignore_ascii_case(column);
        let changes_column = match operation {
            AlterTableOperation::RenameTable { .. } => {
                return Err("ALTER TABLE ... RENAME (use RENAME TABLE)".into())
            }
            AlterTableOperation::DropColumn { column_names, .. } => {
                column_names.iter().any(is_column)
            }
            AlterTableOperation::ChangeColumn { old_name, .. } => is_column(old_name),
            AlterTableOperation::ModifyColumn { col_name, .. } => is_column(col_name),
            AlterTableOperation::RenameColumn {
                old_column_name, ..
            } => is_column(old_column_name),
            _ => false,
        };
        match changes_column {
            true => Err(PlanError::Refuse(format!(
                "ALTER TABLE that changes or drops the partition column `{column}`"
            ))),
            false => Ok(()),
        }
    }

    /// The statement as written, the table's name replaced by each physical
    /// table's.
    fn spliced(&self) -> Result<Vec<Step>, PlanError> {
        let edits = self.edits(None)?;
        self.table
            .physical_tables()
            .into_iter()
            .map(|target| {
                let sql = apply_edits(self.sql, &edits, &target, &mut Splices::default(), bytes)?;
                Ok(Step { target, sql })
            })
            .collect()
    }

    fn rename(&self, new_name: &ObjectName) -> Result<Action, PlanError> {
        let table = self.table;
        let new = resolve(new_name, self.ctx).ok_or("RENAME TABLE to an unqualified name")?;
        if new.db != table.table.db {
            return Err("RENAME TABLE to another database".into());
        }
        if self.ctx.dictionary.table(&new.db, &new.name).is_some() {
            return Err("RENAME TABLE to the name of a partitioned table".into());
        }
        let db = quote_identifier(&new.db);
        let steps = physical_steps(table, |target| {
            let renamed = match &target.partition {
                Some(partition) => format!("{}_{partition}", new.name),
                None => table.renamed_default(&new.name),
            };
            format!(
                "RENAME TABLE {db}.{} TO {db}.{}",
                quote_identifier(&target.table),
                quote_identifier(&renamed)
            )
        });
        Ok(Action::Schema(Box::new(SchemaChange {
            table: table.table.clone(),
            statement: "RENAME TABLE".into(),
            steps,
            effect: SchemaEffect::Renamed(TableName {
                db: new.db,
                name: new.name,
            }),
        })))
    }
}

/// A statement hscale writes for each physical table.
fn physical_steps(table: &PartitionedTable, sql: impl Fn(&Target) -> String) -> Vec<Step> {
    table
        .physical_tables()
        .into_iter()
        .map(|target| Step {
            sql: sql(&target),
            target,
        })
        .collect()
}

/// A schema statement on a reference table: the same statement on every
/// copy in turn, the main backend's first, under the table lock (writes to
/// it wait meanwhile, reads go to the main backend's copy). `None`: the
/// statement leaves the table as it is (SHOW CREATE TABLE, a temporary
/// table of that name) and is planned as any other.
pub(crate) fn reference_change(
    statement: &Statement,
    sql: &str,
    reference: &ReferenceTable,
    ctx: &Context,
) -> Option<Result<Action, PlanError>> {
    let table = &reference.table;
    let change = |statement: &str, steps: Vec<Step>, effect| {
        Some(Ok(Action::Schema(Box::new(SchemaChange {
            table: table.clone(),
            statement: statement.to_string(),
            steps,
            effect,
        }))))
    };
    let on_every_copy = |sql: &dyn Fn() -> String| -> Vec<Step> {
        reference
            .backends
            .iter()
            .map(|&backend| Step {
                target: Target::new(&table.db, backend, &table.name, None),
                sql: sql(),
            })
            .collect()
    };
    let as_written = || on_every_copy(&|| sql.to_string());
    let qualified = format!(
        "{}.{}",
        quote_identifier(&table.db),
        quote_identifier(&table.name)
    );
    match statement {
        Statement::AlterTable(alter) => {
            let renames = alter
                .operations
                .iter()
                .any(|o| matches!(o, AlterTableOperation::RenameTable { .. }));
            match renames {
                true => Some(Err("ALTER TABLE ... RENAME (use RENAME TABLE)".into())),
                false => change("ALTER TABLE", as_written(), SchemaEffect::Unchanged),
            }
        }
        Statement::Truncate(truncate) if truncate.table_names.len() == 1 => {
            change("TRUNCATE TABLE", as_written(), SchemaEffect::Unchanged)
        }
        Statement::Truncate(_) => Some(Err(
            "TRUNCATE of a reference table with other tables (truncate it in a statement of its own)"
                .into(),
        )),
        Statement::CreateIndex(_) => change("CREATE INDEX", as_written(), SchemaEffect::Unchanged),
        Statement::Drop {
            object_type: ObjectType::Index,
            ..
        } => change("DROP INDEX", as_written(), SchemaEffect::Unchanged),
        Statement::Drop {
            temporary: true, ..
        } => None,
        Statement::Drop { names, .. } if names.len() == 1 => change(
            "DROP TABLE",
            on_every_copy(&|| format!("DROP TABLE IF EXISTS {qualified}")),
            SchemaEffect::Dropped,
        ),
        Statement::Drop { .. } => Some(Err(
            "DROP TABLE of a reference table with other tables (drop it in a statement of its own)"
                .into(),
        )),
        Statement::RenameTable(renames) => {
            let [rename] = renames.as_slice() else {
                return Some(Err(
                    "RENAME TABLE of several tables, one of them a reference table (rename it in a statement of its own)"
                        .into(),
                ));
            };
            if resolve(&rename.old_name, ctx).as_ref() != Some(table) {
                return Some(Err("RENAME TABLE to the name of a reference table".into()));
            }
            let Some(new) = resolve(&rename.new_name, ctx) else {
                return Some(Err("RENAME TABLE to an unqualified name".into()));
            };
            if new.db != table.db {
                return Some(Err("RENAME TABLE to another database".into()));
            }
            let dictionary = ctx.dictionary;
            if dictionary.table(&new.db, &new.name).is_some()
                || dictionary.reference(&new.db, &new.name).is_some()
            {
                return Some(Err(
                    "RENAME TABLE to the name of a partitioned or reference table".into(),
                ));
            }
            let to = format!(
                "{}.{}",
                quote_identifier(&new.db),
                quote_identifier(&new.name)
            );
            change(
                "RENAME TABLE",
                on_every_copy(&|| format!("RENAME TABLE {qualified} TO {to}")),
                SchemaEffect::Renamed(new.clone()),
            )
        }
        Statement::CreateTable(create) => Some(Ok(Action::Exists {
            table: table.clone(),
            quiet: create.if_not_exists,
        })),
        _ => None,
    }
}
