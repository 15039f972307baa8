//! The differential suite (`tests/sql/`): each case file's rows go into plain
//! tables on one server (the oracle) and, through hscale, into the same
//! tables partitioned over 2 and 3 backends; every query of the file must
//! then answer through hscale exactly as the oracle does, over the text and
//! the binary protocol, or fail with the error the file names.
//!
//! A case file:
//! ```text
//! # a comment
//! -- partition items id MOD(6) 1 2 3 5
//! CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(20));
//! INSERT INTO items SELECT seq, CONCAT('n', seq) FROM seq_1_to_100;
//! -- queries
//! SELECT COUNT(*) FROM items;
//! -- ordered
//! SELECT id FROM items ORDER BY id LIMIT 3;
//! -- error 1235
//! SELECT COUNT(DISTINCT name) FROM items;
//! ```
//! Statements end with `;` at the end of a line. Before `-- queries`: the
//! setup, run on the oracle only, and `-- partition TABLE COLUMN FUNCTION
//! VALUES...` lines; partition `i` (from 1) of `n` backends goes to backend
//! `1 + i % n`, the default partition to backend 1. After it: queries,
//! compared as multisets of rows unless `-- ordered` stands before them.

use std::path::Path;

use mysql::prelude::Queryable;
use mysql::{Conn, Value};

use crate::{cluster, Proxy};

#[derive(Debug, Clone)]
pub struct Case {
    pub name: String,
    partitions: Vec<Partitioning>,
    setup: Vec<String>,
    queries: Vec<Query>,
}

#[derive(Debug, Clone)]
struct Partitioning {
    table: String,
    column: String,
    function: String,
    values: Vec<String>,
}

#[derive(Debug, Clone)]
struct Query {
    sql: String,
    line: usize,
    ordered: bool,
    error: Option<u16>,
}

/// One statement's answer: column names and types, then rows.
#[derive(Debug, Clone, PartialEq)]
/// A statement's answer: its columns' names and types, and its rows.
pub struct Answer {
    pub columns: Vec<(String, String)>,
    pub rows: Vec<Vec<Value>>,
}

impl Case {
    pub fn read(path: &Path) -> Result<Case, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .ok_or("a case file without a name")?
            .to_string();
        Case::parse(&name, &text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn parse(name: &str, text: &str) -> Result<Case, String> {
        let mut case = Case {
            name: name.to_string(),
            partitions: Vec::new(),
            setup: Vec::new(),
            queries: Vec::new(),
        };
        let mut in_queries = false;
        let (mut ordered, mut error) = (false, None);
        let mut statement = String::new();
        let mut first_line = 0;
        for (i, line) in text.lines().enumerate() {
            let trimmed = line.trim();
            if statement.is_empty() {
                if trimmed.is_empty() || trimmed.starts_with('#') {
                    continue;
                }
                if let Some(directive) = trimmed.strip_prefix("-- ") {
                    let words: Vec<&str> = directive.split_whitespace().collect();
                    match words.as_slice() {
                        ["queries"] => in_queries = true,
                        ["ordered"] if in_queries => ordered = true,
                        ["error", code] if in_queries => {
                            error = Some(code.parse().map_err(|_| {
                                format!("line {}: an error code is a number", i + 1)
                            })?)
                        }
                        ["partition", table, column, function, values @ ..] if !in_queries => {
                            case.partitions.push(Partitioning {
                                table: table.to_string(),
                                column: column.to_string(),
                                function: function.to_string(),
                                values: values.iter().map(|v| v.to_string()).collect(),
                            })
                        }
                        _ => return Err(format!("line {}: unknown directive `{trimmed}`", i + 1)),
                    }
                    continue;
                }
                first_line = i + 1;
            }
            statement.push_str(line);
            statement.push('\n');
            if trimmed.ends_with(';') {
                let sql = statement.trim().trim_end_matches(';').trim().to_string();
                statement.clear();
                match in_queries {
                    false => case.setup.push(sql),
                    true => case.queries.push(Query {
                        sql,
                        line: first_line,
                        ordered: std::mem::take(&mut ordered),
                        error: error.take(),
                    }),
                }
            }
        }
        if !statement.trim().is_empty() {
            return Err(format!("line {first_line}: a statement without its `;`"));
        }
        if case.queries.is_empty() {
            return Err("no queries".into());
        }
        Ok(case)
    }

    /// Runs the case with partitions over `1..=n` for each `n` of
    /// `layouts`; the failures, each with its file line and layout.
    pub fn run(&self, proxy: &Proxy, layouts: &[usize]) -> Vec<String> {
        let oracle_db = cluster().database(&format!("sql_{}_oracle", self.name));
        let mut oracle = cluster().direct(1, Some(&oracle_db));
        for sql in &self.setup {
            if let Err(e) = oracle.query_drop(sql) {
                return vec![format!("{}: setup `{sql}`: {e}", self.name)];
            }
        }
        let mut failures = Vec::new();
        for &backends in layouts {
            let db = cluster().database(&format!("sql_{}_{backends}", self.name));
            let mut client = proxy.connect(Some(&db));
            if let Err(e) = self.load(&mut oracle, &mut client, &db, backends) {
                failures.push(format!(
                    "{} over {backends} backends: loading: {e}",
                    self.name
                ));
                continue;
            }
            for query in &self.queries {
                let mut fail = |what: String| {
                    failures.push(format!(
                        "{}:{} over {backends} backends: {}\n  {what}",
                        self.name, query.line, query.sql
                    ))
                };
                for binary in [false, true] {
                    let protocol = if binary { "binary" } else { "text" };
                    let got = answer(&mut client, &query.sql, binary);
                    if let Some(code) = query.error {
                        match got {
                            Err(mysql::Error::MySqlError(e)) if e.code == code => {}
                            Err(e) => fail(format!("{protocol}: expected error {code}, got {e}")),
                            Ok(_) => fail(format!("{protocol}: expected error {code}, got rows")),
                        }
                        continue;
                    }
                    let want = match answer(&mut oracle, &query.sql, binary) {
                        Ok(want) => want,
                        Err(e) => {
                            fail(format!("{protocol}: the oracle fails: {e}"));
                            continue;
                        }
                    };
                    match got {
                        Err(e) => fail(format!("{protocol}: {e}")),
                        Ok(got) => {
                            if let Some(difference) = differ(&want, &got, query.ordered) {
                                fail(format!("{protocol}: {difference}"));
                            }
                        }
                    }
                }
            }
        }
        failures
    }

    /// The oracle's tables in `db`: created on the main backend, partitioned
    /// as the file says over `backends` backends, and filled with the
    /// oracle's rows through hscale.
    fn load(
        &self,
        oracle: &mut Conn,
        client: &mut Conn,
        db: &str,
        backends: usize,
    ) -> mysql::Result<()> {
        let tables: Vec<String> = oracle.query("SHOW TABLES")?;
        let mut main = cluster().direct(1, Some(db));
        for table in &tables {
            let (_, create): (String, String) = oracle
                .query_first(format!("SHOW CREATE TABLE `{table}`"))?
                .expect("a table's definition");
            main.query_drop(create)?;
        }
        for p in &self.partitions {
            client.query_drop(format!(
                "HSCALE SETUP_TABLE('{0}', '{1}', '{0}_default', 1, '{2}')",
                p.table, p.column, p.function
            ))?;
            for (i, value) in p.values.iter().enumerate() {
                let backend = 1 + (i + 1) % backends;
                client.query_drop(format!(
                    "HSCALE ADD_PARTITION('{}', 'p{}', '{value}', {backend})",
                    p.table,
                    i + 1
                ))?;
            }
        }
        for table in &tables {
            let rows: Vec<mysql::Row> = oracle.exec(format!("SELECT * FROM `{table}`"), ())?;
            let Some(first) = rows.first() else {
                continue;
            };
            let marks = vec!["?"; first.len()].join(", ");
            let insert = client.prep(format!("INSERT INTO `{table}` VALUES ({marks})"))?;
            for row in rows {
                client.exec_drop(&insert, row.unwrap())?;
            }
            client.close(insert)?;
        }
        Ok(())
    }
}

/// Every case file of a directory, in name order.
pub fn cases(dir: &Path) -> Vec<Case> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| Case::read(p).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

/// The answer to `sql`, as a query or (`binary`) a prepared statement.
pub fn answer(conn: &mut Conn, sql: &str, binary: bool) -> mysql::Result<Answer> {
    fn collect<P: mysql::prelude::Protocol>(
        mut result: mysql::QueryResult<'_, '_, '_, P>,
    ) -> mysql::Result<Answer> {
        let columns = result
            .columns()
            .as_ref()
            .iter()
            .map(|c| (c.name_str().into_owned(), format!("{:?}", c.column_type())))
            .collect();
        let mut rows = Vec::new();
        for row in result.by_ref() {
            rows.push(row?.unwrap());
        }
        Ok(Answer { columns, rows })
    }
    match binary {
        false => collect(conn.query_iter(sql)?),
        true => {
            let statement = conn.prep(sql)?;
            let answer = collect(conn.exec_iter(&statement, ())?);
            conn.close(statement)?;
            answer
        }
    }
}

/// How `got` differs from `want`, or `None`.
fn differ(want: &Answer, got: &Answer, ordered: bool) -> Option<String> {
    if want.columns != got.columns {
        return Some(format!(
            "columns {:?}, the oracle's {:?}",
            got.columns, want.columns
        ));
    }
    let (mut want_rows, mut got_rows) = (want.rows.clone(), got.rows.clone());
    if !ordered {
        // Whole values: Debug cuts strings short, which would leave rows
        // with a common start in the order they came.
        let key = |row: &Vec<Value>| row.iter().map(|v| v.as_sql(false)).collect::<Vec<_>>();
        want_rows.sort_by_cached_key(key);
        got_rows.sort_by_cached_key(key);
    }
    if want_rows == got_rows {
        return None;
    }
    let at = want_rows
        .iter()
        .zip(&got_rows)
        .position(|(w, g)| w != g)
        .unwrap_or(want_rows.len().min(got_rows.len()));
    Some(format!(
        "{} rows, the oracle's {}; row {at}: {:?}, the oracle's {:?}",
        got_rows.len(),
        want_rows.len(),
        got_rows.get(at),
        want_rows.get(at)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_setup_partitions_and_queries_with_their_expectations() {
        let case = Case::parse(
            "t",
            "# about\n-- partition items id MOD(6) 1 2\nCREATE TABLE items (id INT);\n\
             INSERT INTO items\n  VALUES (1);\n-- queries\nSELECT 1;\n-- ordered\n\
             SELECT id\nFROM items ORDER BY id;\n-- error 1235\nSELECT 2;\n",
        )
        .unwrap();
        assert_eq!(case.setup.len(), 2);
        assert_eq!(case.setup[1], "INSERT INTO items\n  VALUES (1)");
        assert_eq!(case.partitions[0].values, ["1", "2"]);
        let q: Vec<(usize, bool, Option<u16>)> = case
            .queries
            .iter()
            .map(|q| (q.line, q.ordered, q.error))
            .collect();
        assert_eq!(
            q,
            [(7, false, None), (9, true, None), (12, false, Some(1235))]
        );
        assert!(Case::parse("t", "-- queries\nSELECT 1").is_err());
        assert!(Case::parse("t", "-- bogus\n-- queries\nSELECT 1;").is_err());
    }

    #[test]
    fn unordered_answers_compare_as_multisets_and_ordered_ones_row_by_row() {
        let answer = |rows: &[i64]| Answer {
            columns: vec![("a".into(), "LONG".into())],
            rows: rows.iter().map(|&r| vec![Value::Int(r)]).collect(),
        };
        assert_eq!(
            differ(&answer(&[1, 2, 2]), &answer(&[2, 1, 2]), false),
            None
        );
        assert!(differ(&answer(&[1, 2]), &answer(&[2, 1]), true).is_some());
        assert!(differ(&answer(&[1, 2, 2]), &answer(&[1, 2]), false).is_some());
        assert!(differ(&answer(&[1, 1, 2]), &answer(&[1, 2, 2]), false).is_some());
    }
}
