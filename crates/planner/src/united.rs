//! The partitions' statements of each backend as one, for an ordered merge
//! that must read every partition at once on the one connection a session
//! keeps there (a transaction's, or one it holds): `(p1) UNION ALL (p2) ...
//! ORDER BY` the merge's keys, so that the backend sorts its partitions'
//! rows together. The session chooses it; what it runs is written here.

use hscale_merge::Spec;

use crate::error::PlanError;
use crate::plan::{Merge, Route};
use crate::template::{Run, Template};

/// One backend's statement for its partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct United {
    pub backend: u32,
    pub sql: String,
    /// Where it joins several partitions: one partition's statement, whose
    /// answer's column definitions are the partitions' own (the union's
    /// name no table).
    pub probe: Option<String>,
    /// A prepared statement's parameters, of the client's, in the order
    /// its placeholders take them; `None` for a query.
    pub params: Option<Vec<usize>>,
}

/// The text of several partitions' statements as one, sorted by `spec`'s
/// keys; with the raised LIMIT unless groups are merged, whose partial rows
/// a LIMIT on the union would cut.
fn union_text(spec: &Spec, parts: &[&str]) -> String {
    let order: Vec<String> = spec
        .keys
        .iter()
        .map(|key| {
            let direction = if key.descending { " DESC" } else { "" };
            format!("{}{direction}", key.value.order_term())
        })
        .collect();
    let mut text = String::with_capacity(parts.iter().map(|p| p.len() + 16).sum::<usize>() + 64);
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            text.push_str(" UNION ALL ");
        }
        // On lines of their own: a statement may end in a `--` comment.
        text.push_str("(\n");
        text.push_str(part);
        text.push_str("\n)");
    }
    text.push_str(" ORDER BY ");
    text.push_str(&order.join(", "));
    if let (Some(limit), None, None, true) = (
        spec.limit,
        &spec.groups,
        &spec.having,
        spec.reorder.is_empty(),
    ) {
        text.push_str(&format!(" LIMIT {}", spec.offset.saturating_add(limit)));
    }
    text
}

/// The merge sorts and several steps share a backend.
fn unites(merge: &Merge, backends: impl Iterator<Item = u32>) -> Option<&Spec> {
    let Merge::Rows(spec) = merge else {
        return None;
    };
    let backends: Vec<u32> = backends.collect();
    let shared = (1..backends.len()).any(|i| backends[..i].contains(&backends[i]));
    (shared && !spec.keys.is_empty()).then_some(spec)
}

/// Indices of `items` by their backend, backends in the order they first come.
fn by_backend(backends: impl Iterator<Item = u32>) -> Vec<(u32, Vec<usize>)> {
    let mut grouped: Vec<(u32, Vec<usize>)> = Vec::new();
    for (i, backend) in backends.enumerate() {
        match grouped.iter_mut().find(|(b, _)| *b == backend) {
            Some((_, items)) => items.push(i),
            None => grouped.push((backend, vec![i])),
        }
    }
    grouped
}

/// Any partition's definitions serve; the least text (mostly: the least
/// table name) keeps a shape's probe one, wherever its range starts.
fn probe(parts: &[&str]) -> Option<String> {
    match parts {
        [_] => None,
        _ => parts.iter().min().map(|p| p.to_string()),
    }
}

impl Route {
    /// The route's steps as one statement per backend, where its merge
    /// sorts and several steps share a backend; `None` otherwise.
    pub fn united(&self) -> Option<Vec<United>> {
        let spec = unites(&self.merge, self.steps.iter().map(|s| s.target.backend))?;
        let grouped = by_backend(self.steps.iter().map(|s| s.target.backend));
        Some(
            grouped
                .into_iter()
                .map(|(backend, steps)| {
                    let parts: Vec<&str> =
                        steps.iter().map(|&i| self.steps[i].sql.as_str()).collect();
                    United {
                        backend,
                        // Sorted and limited already; in parentheses its
                        // columns would name a derived table.
                        sql: match parts[..] {
                            [one] => one.to_string(),
                            _ => union_text(spec, &parts),
                        },
                        probe: probe(&parts),
                        params: None,
                    }
                })
                .collect(),
        )
    }
}

impl United {
    /// The statement as a command's payload: `code`, then the text.
    pub fn into_command(self, code: u8) -> Vec<u8> {
        let mut payload = self.sql.into_bytes();
        payload.insert(0, code);
        payload
    }
}

impl Template {
    /// An execution's runs as one prepared statement per backend, where its
    /// merge sorts and several runs share a backend (`Route::united`); a
    /// backend's statement takes each of its runs' parameters in turn, of
    /// the client's `count`.
    pub fn united(
        &self,
        runs: &[Run],
        merge: &Merge,
        count: usize,
    ) -> Option<Result<Vec<United>, PlanError>> {
        let spec = unites(merge, runs.iter().map(|r| r.target.backend))?;
        let united = by_backend(runs.iter().map(|r| r.target.backend))
            .into_iter()
            .map(|(backend, members)| {
                let texts = members
                    .iter()
                    .map(|&i| self.text(&runs[i]))
                    .collect::<Result<Vec<String>, PlanError>>()?;
                let parts: Vec<&str> = texts.iter().map(String::as_str).collect();
                let mut params = Vec::new();
                for &i in &members {
                    match self.params(&runs[i], count) {
                        Some(taken) => params.extend(taken),
                        None => params.extend(0..count),
                    }
                }
                Ok(United {
                    backend,
                    sql: match parts[..] {
                        [one] => one.to_string(),
                        _ => union_text(spec, &parts),
                    },
                    probe: probe(&parts),
                    params: Some(params),
                })
            })
            .collect();
        Some(united)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dictionary::{TableName, Target};
    use crate::plan::Step;
    use hscale_merge::{Place, SortKey};
    use smallvec::smallvec;

    fn step(backend: u32, sql: &str) -> Step {
        Step {
            target: Target::new("d", backend, "t", None),
            sql: sql.into(),
        }
    }

    fn table() -> std::sync::Arc<TableName> {
        std::sync::Arc::new(TableName {
            db: "d".into(),
            name: "t".into(),
        })
    }

    fn ordered(limit: Option<u64>) -> Merge {
        Merge::Rows(Box::new(Spec {
            keys: vec![SortKey {
                value: Place::Visible(0),
                weight: 0,
                collation: 0,
                descending: true,
            }],
            limit,
            offset: 2,
            ..Spec::default()
        }))
    }

    #[test]
    fn partitions_on_one_backend_are_sorted_there_as_one_statement() {
        let route = Route {
            table: table(),
            steps: smallvec![
                step(1, "SELECT a FROM t_1 ORDER BY a DESC LIMIT 5 -- c"),
                step(2, "SELECT a FROM t_2 ORDER BY a DESC LIMIT 5"),
                step(1, "SELECT a FROM t_3 ORDER BY a DESC LIMIT 5"),
            ],
            merge: ordered(Some(3)),
            writes: false,
            highest_id: None,
        };
        let united = route.united().unwrap();
        assert_eq!(united.len(), 2);
        assert_eq!(united[0].backend, 1);
        assert_eq!(
            united[0].sql,
            "(\nSELECT a FROM t_1 ORDER BY a DESC LIMIT 5 -- c\n) UNION ALL (\nSELECT a FROM t_3 ORDER BY a DESC LIMIT 5\n) ORDER BY 1 DESC LIMIT 5"
        );
        assert_eq!(
            united[0].probe.as_deref(),
            Some("SELECT a FROM t_1 ORDER BY a DESC LIMIT 5 -- c")
        );
        assert_eq!(united[1].sql, "SELECT a FROM t_2 ORDER BY a DESC LIMIT 5");
        assert_eq!(united[1].probe, None);
    }

    #[test]
    fn nothing_is_united_without_order_or_a_shared_backend() {
        let mut route = Route {
            table: table(),
            steps: smallvec![step(1, "SELECT 1"), step(2, "SELECT 1")],
            merge: ordered(None),
            writes: false,
            highest_id: None,
        };
        assert_eq!(route.united(), None, "one partition per backend");
        route.steps.push(step(1, "SELECT 2"));
        assert!(route.united().is_some());
        route.merge = Merge::Rows(Box::default());
        assert_eq!(route.united(), None, "unordered: the partitions take turns");
    }
}
