//! Foreign keys of a table made for a partition on another backend. The
//! table is made from `SHOW CREATE TABLE` of the one it takes rows from, and
//! a constraint there names its parent as that server has it: on another
//! backend the parent may be absent (MariaDB refuses the table, 1005 errno
//! 150), or be another table than the one holding those rows' parents. Each
//! constraint is kept where its parent's rows are on the backend — pointed
//! at the table that holds them — or left out. A kept one loses its name:
//! InnoDB's constraint names are unique per database, and the original
//! still carries it.

/// What the new table's constraint refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parent {
    /// This table of the backend, holding the parent rows of the moved
    /// rows: the same table, or the co-located partition of a partitioned
    /// parent. Named with its database: the new table may be made in
    /// another.
    Table { db: String, name: String },
    /// No table there holds them: the constraint is left out.
    None,
}

/// A foreign key's parent as the definition names it, with the columns
/// it pairs: `columns[i]` of the child takes `parent_columns[i]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub db: Option<String>,
    pub table: String,
    pub columns: Vec<String>,
    pub parent_columns: Vec<String>,
}

impl Reference {
    /// Whether the key pairs the child's `column` with the parent's
    /// `parent_column`: for tables partitioned alike by those columns, each
    /// child row's parent is in the partition of the same value.
    pub fn pairs(&self, column: &str, parent_column: &str) -> bool {
        self.columns
            .iter()
            .zip(&self.parent_columns)
            .any(|(c, p)| c.eq_ignore_ascii_case(column) && p.eq_ignore_ascii_case(parent_column))
    }
}

/// Constraint `name` of `definition`, if it is a foreign key.
pub fn named(definition: &str, name: &str) -> Option<Reference> {
    definition.lines().find_map(|line| {
        let (found, reference, _) = foreign_key(line)?;
        (found == name).then_some(reference)
    })
}

/// The foreign keys of `table`'s `definition` that carry a name of their
/// own rather than InnoDB's (`<table>_ibfk_<n>`): the names to drop, then
/// each as an unnamed ALTER TABLE ... ADD item. A constraint name is
/// unique in its database, and moves retire a partition's old table into
/// hscale's schema: two databases' tables with one constraint name could
/// not both be retired there.
pub fn own_names(definition: &str, table: &str) -> (Vec<String>, Vec<String>) {
    let generated = format!("{table}_ibfk_");
    let mut names = Vec::new();
    let mut items = Vec::new();
    for line in definition.lines() {
        let Some((name, reference, rest)) = foreign_key(line) else {
            continue;
        };
        if name
            .strip_prefix(&generated)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        let parent = match &reference.db {
            Some(db) => quoted(db, &reference.table),
            None => ident(&reference.table),
        };
        let rest = rest.trim_end().trim_end_matches(',');
        items.push(format!(
            "FOREIGN KEY {} REFERENCES {parent}{rest}",
            columns_of(line)
        ));
        names.push(name);
    }
    (names, items)
}

/// The parents the definition's foreign keys name, in order.
pub fn references(definition: &str) -> Vec<Reference> {
    definition
        .lines()
        .filter_map(|line| foreign_key(line).map(|(_, reference, _)| reference))
        .collect()
}

/// `definition` (a `SHOW CREATE TABLE`, or what follows its table name)
/// with each foreign key as `parent` says; and the names of those left out.
pub fn with_foreign_keys(
    definition: &str,
    parent: impl Fn(&Reference) -> Parent,
) -> (String, Vec<String>) {
    let mut left_out = Vec::new();
    let lines: Vec<&str> = definition.split('\n').collect();
    let mut out: Vec<String> = Vec::with_capacity(lines.len());
    for line in lines {
        let Some((name, reference, rest)) = foreign_key(line) else {
            out.push(line.to_string());
            continue;
        };
        let comma = line.trim_end().ends_with(',');
        let target = match parent(&reference) {
            Parent::Table { db, name } => quoted(&db, &name),
            Parent::None => {
                left_out.push(name);
                // The item before the last one left out ends the list.
                if !comma {
                    if let Some(previous) = out.iter_mut().rev().find(|l| l.ends_with(',')) {
                        previous.pop();
                    }
                }
                continue;
            }
        };
        let mut kept = format!(
            "  FOREIGN KEY {} REFERENCES {target}{rest}",
            columns_of(line)
        );
        if comma && !kept.ends_with(',') {
            kept.push(',');
        }
        out.push(kept);
    }
    (out.join("\n"), left_out)
}

/// Constraint `name` of `definition` as an ALTER TABLE ... ADD item, its
/// parent now `db`.`table`: another table's foreign key that followed a
/// rename of its parent, pointed back at the table that holds the rows.
pub fn pointed_at(definition: &str, name: &str, db: &str, table: &str) -> Option<String> {
    definition.lines().find_map(|line| {
        let (found, _, rest) = foreign_key(line)?;
        (found == name).then(|| {
            let rest = rest.trim_end().trim_end_matches(',');
            format!(
                "CONSTRAINT `{}` FOREIGN KEY {} REFERENCES {}{rest}",
                name.replace('`', "``"),
                columns_of(line),
                quoted(db, table)
            )
        })
    })
}

fn ident(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

fn quoted(db: &str, table: &str) -> String {
    format!("{}.{}", ident(db), ident(table))
}

/// A `  CONSTRAINT `name` FOREIGN KEY (...) REFERENCES parent (...) ...`
/// line of SHOW CREATE TABLE: its name, its parent, and what follows the
/// parent's name.
fn foreign_key(line: &str) -> Option<(String, Reference, String)> {
    let item = line.trim_start().strip_prefix("CONSTRAINT ")?;
    let (name, after) = identifier(item)?;
    after.trim_start().strip_prefix("FOREIGN KEY ")?;
    let at = after.find(" REFERENCES ")? + " REFERENCES ".len();
    let (first, rest) = identifier(&after[at..])?;
    let (db, table, rest) = match rest.strip_prefix('.') {
        Some(table) => {
            let (table, rest) = identifier(table)?;
            (Some(first), table, rest)
        }
        None => (None, first, rest),
    };
    let reference = Reference {
        db,
        table,
        columns: column_list(columns_of(line)),
        parent_columns: column_list(rest),
    };
    Some((name, reference, rest.to_string()))
}

/// The names of a `(`a`,`b`)` list at the start of `text`.
fn column_list(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let Some(mut rest) = text.trim_start().strip_prefix('(') else {
        return names;
    };
    while let Some((name, after)) = identifier(rest.trim_start()) {
        names.push(name);
        match after.trim_start().strip_prefix(',') {
            Some(more) => rest = more,
            None => break,
        }
    }
    names
}

/// The `(columns)` a constraint line names after FOREIGN KEY.
fn columns_of(line: &str) -> &str {
    let start = line
        .find(" FOREIGN KEY ")
        .map_or(0, |i| i + " FOREIGN KEY ".len());
    let end = line.find(" REFERENCES ").unwrap_or(line.len());
    &line[start..end]
}

/// A backquoted identifier at the start of `text`, and what follows it.
fn identifier(text: &str) -> Option<(String, &str)> {
    let body = text.strip_prefix('`')?;
    let mut name = String::new();
    let mut chars = body.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c == '`' {
            if chars.peek().map(|&(_, next)| next) == Some('`') {
                chars.next();
                name.push('`');
                continue;
            }
            return Some((name, &body[i + 1..]));
        }
        name.push(c);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const DISTRICT: &str = " (\n  `d_id` int(11) NOT NULL,\n  `d_w_id` int(11) NOT NULL,\n  `d_name` varchar(10) DEFAULT NULL,\n  PRIMARY KEY (`d_w_id`,`d_id`),\n  CONSTRAINT `fk_warehouse` FOREIGN KEY (`d_w_id`) REFERENCES `warehouse_default` (`w_id`) ON DELETE CASCADE,\n  CONSTRAINT `fk_region` FOREIGN KEY (`d_name`) REFERENCES `geo`.`re``gions` (`name`),\n  CONSTRAINT `positive` CHECK (`d_id` > 0)\n) ENGINE=InnoDB DEFAULT CHARSET=latin1";

    #[test]
    fn foreign_keys_are_read_with_their_parents() {
        assert_eq!(
            references(DISTRICT),
            [
                Reference {
                    db: None,
                    table: "warehouse_default".into(),
                    columns: vec!["d_w_id".into()],
                    parent_columns: vec!["w_id".into()],
                },
                Reference {
                    db: Some("geo".into()),
                    table: "re`gions".into(),
                    columns: vec!["d_name".into()],
                    parent_columns: vec!["name".into()],
                },
            ]
        );
        assert!(references(" (\n  `id` int(11) NOT NULL\n)").is_empty());
    }

    #[test]
    fn a_kept_foreign_key_points_at_the_rows_parents_and_loses_its_name() {
        let (definition, left_out) = with_foreign_keys(DISTRICT, |r| match r.db {
            None => Parent::Table {
                db: "app".into(),
                name: "warehouse_odd".into(),
            },
            Some(_) => Parent::Table {
                db: "geo".into(),
                name: "re`gions".into(),
            },
        });
        assert!(left_out.is_empty());
        assert_eq!(
            definition,
            " (\n  `d_id` int(11) NOT NULL,\n  `d_w_id` int(11) NOT NULL,\n  `d_name` varchar(10) DEFAULT NULL,\n  PRIMARY KEY (`d_w_id`,`d_id`),\n  FOREIGN KEY (`d_w_id`) REFERENCES `app`.`warehouse_odd` (`w_id`) ON DELETE CASCADE,\n  FOREIGN KEY (`d_name`) REFERENCES `geo`.`re``gions` (`name`),\n  CONSTRAINT `positive` CHECK (`d_id` > 0)\n) ENGINE=InnoDB DEFAULT CHARSET=latin1"
        );
    }

    #[test]
    fn a_key_pairs_the_columns_it_names_in_order() {
        let line = "  CONSTRAINT `fk` FOREIGN KEY (`ol_supply_w_id`, `ol_i_id`) REFERENCES `stock` (`s_w_id`,`s_i_id`)";
        let stock = named(line, "fk").expect("a foreign key");
        assert!(stock.pairs("ol_supply_w_id", "s_w_id"));
        assert!(stock.pairs("OL_I_ID", "s_i_id"));
        assert!(!stock.pairs("ol_w_id", "s_w_id"));
        assert!(!stock.pairs("ol_i_id", "s_w_id"));
        assert_eq!(named(DISTRICT, "positive"), None);
    }

    #[test]
    fn constraints_named_by_their_authors_become_unnamed_items() {
        let definition = format!(
            "{}\n  CONSTRAINT `district_default_ibfk_3` FOREIGN KEY (`d_id`) REFERENCES `d` (`id`)",
            DISTRICT.replace("\n) ENGINE", ",\n) ENGINE")
        );
        let (names, items) = own_names(&definition, "district_default");
        assert_eq!(names, ["fk_warehouse", "fk_region"]);
        assert_eq!(
            items,
            [
                "FOREIGN KEY (`d_w_id`) REFERENCES `warehouse_default` (`w_id`) ON DELETE CASCADE",
                "FOREIGN KEY (`d_name`) REFERENCES `geo`.`re``gions` (`name`)"
            ]
        );
    }

    #[test]
    fn a_constraint_is_pointed_at_another_parent_under_its_name() {
        assert_eq!(
            pointed_at(DISTRICT, "fk_warehouse", "app", "warehouse_default").as_deref(),
            Some("CONSTRAINT `fk_warehouse` FOREIGN KEY (`d_w_id`) REFERENCES `app`.`warehouse_default` (`w_id`) ON DELETE CASCADE")
        );
        assert_eq!(pointed_at(DISTRICT, "positive", "app", "x"), None);
    }

    #[test]
    fn a_foreign_key_whose_parent_is_not_there_is_left_out_and_named() {
        let (definition, left_out) = with_foreign_keys(DISTRICT, |_| Parent::None);
        assert_eq!(left_out, ["fk_warehouse", "fk_region"]);
        assert_eq!(
            definition,
            " (\n  `d_id` int(11) NOT NULL,\n  `d_w_id` int(11) NOT NULL,\n  `d_name` varchar(10) DEFAULT NULL,\n  PRIMARY KEY (`d_w_id`,`d_id`),\n  CONSTRAINT `positive` CHECK (`d_id` > 0)\n) ENGINE=InnoDB DEFAULT CHARSET=latin1"
        );
        // The last item left out: the one before it ends the list.
        let last = " (\n  `id` int(11) NOT NULL,\n  `p` int(11) NOT NULL,\n  PRIMARY KEY (`id`),\n  CONSTRAINT `fk` FOREIGN KEY (`p`) REFERENCES `parent` (`id`)\n) ENGINE=InnoDB";
        let (definition, left_out) = with_foreign_keys(last, |_| Parent::None);
        assert_eq!(left_out, ["fk"]);
        assert_eq!(
            definition,
            " (\n  `id` int(11) NOT NULL,\n  `p` int(11) NOT NULL,\n  PRIMARY KEY (`id`)\n) ENGINE=InnoDB"
        );
    }
}
