//! Routing compares strings as the partition column compares them: for each
//! collation hscale routes by, many strings (accents, case, ß and ss,
//! ligatures, trailing spaces, ignorable and supplementary characters, and
//! random strings of them, seeded and printed) are grouped by MariaDB's own
//! comparison (GROUP BY on a column of that collation), and hscale's
//! partition value for each (HSCALE LOOKUP, by NONE()) must be the same
//! within a group and differ between groups.

use std::collections::HashMap;

use hscale_testkit::{cluster, Proxy};
use mysql::prelude::Queryable;
use rand::{Rng, SeedableRng};

const TRICKY: &[&str] = &[
    "a",
    "A",
    "á",
    "Á",
    "à",
    "ä",
    "Ä",
    "å",
    "Å",
    "\u{212B}",
    "ae",
    "æ",
    "Æ",
    "ß",
    "ss",
    "SS",
    "ẞ",
    "s",
    "ü",
    "Ü",
    "u",
    "y",
    "Y",
    "ue",
    "o",
    "ö",
    "ø",
    "oe",
    "e",
    "é",
    "È",
    "ê",
    "i",
    "I",
    "ı",
    "İ",
    "n",
    "ñ",
    "c",
    "ç",
    "k",
    "K",
    "\u{212A}",
    "ﬀ",
    "ff",
    "\u{00A0}",
    "\u{0300}",
    "\u{FFFD}",
    "\u{1F600}",
    "\u{1F601}",
    "\u{1D400}",
    "z",
    "Ž",
    "đ",
    "Đ",
    "ð",
    "þ",
    "th",
    "ŀ",
    "œ",
    "Œ",
    "ǆ",
    "dž",
    "x",
    "-",
    "_",
    "1",
    "¹",
    "½",
];

/// (collation, character set, how many bytes a character may take)
const COLLATIONS: &[(&str, &str, u32)] = &[
    ("utf8mb4_general_ci", "utf8mb4", 4),
    ("utf8mb4_unicode_ci", "utf8mb4", 4),
    ("utf8mb4_unicode_520_ci", "utf8mb4", 4),
    ("utf8mb3_general_ci", "utf8mb3", 3),
    ("latin1_swedish_ci", "latin1", 1),
    ("utf8mb4_bin", "utf8mb4", 4),
    ("utf8mb4_nopad_bin", "utf8mb4", 4),
    // VARBINARY: bytes.
    ("binary", "binary", 4),
];

/// Whether the character set can store every character of `s`.
fn storable(s: &str, bytes: u32) -> bool {
    s.chars().all(|c| match bytes {
        1 => (c as u32) < 0x100,
        3 => (c as u32) < 0x10000,
        _ => true,
    })
}

fn strings(seed: u64, bytes: u32) -> Vec<String> {
    let pieces: Vec<&str> = TRICKY
        .iter()
        .copied()
        .filter(|s| storable(s, bytes))
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut all: Vec<String> = pieces.iter().map(|s| s.to_string()).collect();
    all.extend(pieces.iter().map(|s| format!("{s}  ")));
    for _ in 0..150 {
        let n = rng.random_range(1..=4);
        let mut s: String = (0..n)
            .map(|_| pieces[rng.random_range(0..pieces.len())])
            .collect();
        if rng.random_bool(0.2) {
            s.push(' ');
        }
        all.push(s);
    }
    all.sort();
    all.dedup();
    all
}

#[test]
fn equal_strings_share_a_partition_value_and_unequal_ones_do_not() {
    let seed: u64 = std::env::var("HSCALE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("HSCALE_SEED={seed}");
    let db = cluster().database("collations");
    let mut direct = cluster().direct(1, Some(&db));
    let proxy = Proxy::for_cluster();
    let mut c = proxy.connect(Some(&db));
    for (i, (collation, charset, bytes)) in COLLATIONS.iter().enumerate() {
        let table = format!("t{i}");
        direct
            .query_drop(format!(
                "CREATE TABLE {table} (id INT PRIMARY KEY, s VARCHAR(64) CHARACTER SET {charset} COLLATE {collation} NOT NULL)"
            ))
            .unwrap();
        let strings = strings(seed + i as u64, *bytes);
        // The server's classes: ids of the strings it holds equal.
        direct
            .query_drop(format!(
                "CREATE TABLE {table}_oracle (id INT PRIMARY KEY, s VARCHAR(64) CHARACTER SET {charset} COLLATE {collation} NOT NULL)"
            ))
            .unwrap();
        direct
            .exec_batch(
                format!("INSERT INTO {table}_oracle VALUES (?, ?)"),
                strings.iter().enumerate(),
            )
            .unwrap();
        let classes: Vec<String> = direct
            .query(format!(
                "SELECT GROUP_CONCAT(id ORDER BY id) FROM {table}_oracle GROUP BY s"
            ))
            .unwrap();
        c.query_drop(format!(
            "HSCALE SETUP_TABLE('{table}', 's', '{table}_default', 1, 'NONE()')"
        ))
        .unwrap();
        let value = |c: &mut mysql::Conn, s: &str| -> String {
            let row: mysql::Row = c
                .query_first(format!("HSCALE LOOKUP('{table}', '{s}')"))
                .unwrap()
                .unwrap();
            row.get(0).unwrap()
        };
        let mut class_of_value: HashMap<String, usize> = HashMap::new();
        for (class, ids) in classes.iter().enumerate() {
            let ids: Vec<usize> = ids.split(',').map(|id| id.parse().unwrap()).collect();
            let first = value(&mut c, &strings[ids[0]]);
            for &id in &ids[1..] {
                assert_eq!(
                    value(&mut c, &strings[id]),
                    first,
                    "{collation}: {:?} and {:?} are equal on the server (seed {seed})",
                    strings[ids[0]],
                    strings[id]
                );
            }
            if let Some(other) = class_of_value.insert(first.clone(), class) {
                let other: usize = classes[other].split(',').next().unwrap().parse().unwrap();
                panic!(
                    "{collation}: {:?} and {:?} differ on the server but share partition value {first:?} (seed {seed})",
                    strings[ids[0]], strings[other]
                );
            }
        }
    }
}

/// The case: on one latin1_swedish_ci table 'üxa' is a duplicate of
/// 'yxa'; partitioned with 'yxa' on backend 2, so it stays.
#[test]
fn a_unique_key_holds_across_partitions_as_on_one_table() {
    let db = cluster().database("collations_unique");
    cluster()
        .direct(1, Some(&db))
        .query_drop("CREATE TABLE words (id INT PRIMARY KEY, w VARCHAR(16) CHARACTER SET latin1 COLLATE latin1_swedish_ci NOT NULL, UNIQUE (w))")
        .unwrap();
    let proxy = Proxy::for_cluster();
    let mut c = proxy.connect(Some(&db));
    c.query_drop("HSCALE SETUP_TABLE('words', 'w', 'words_default', 1, 'NONE()')")
        .unwrap();
    c.query_drop("HSCALE ADD_PARTITION('words', 'y', 'yxa', 2)")
        .unwrap();
    c.query_drop("INSERT INTO words VALUES (1, 'yxa')").unwrap();
    let err = c
        .query_drop("INSERT INTO words VALUES (2, 'üxa')")
        .unwrap_err();
    assert!(
        matches!(&err, mysql::Error::MySqlError(e) if e.code == 1062),
        "{err:?}"
    );
    let found: Vec<i32> = c.query("SELECT id FROM words WHERE w = 'ÜXA'").unwrap();
    assert_eq!(found, [1]);
    // A collation hscale does not fold is refused, with the reason.
    cluster()
        .direct(1, Some(&db))
        .query_drop("CREATE TABLE names (id INT PRIMARY KEY, n VARCHAR(16) CHARACTER SET utf8mb4 COLLATE utf8mb4_german2_ci NOT NULL)")
        .unwrap();
    let err = c
        .query_drop("HSCALE SETUP_TABLE('names', 'n', 'names_default', 1, 'PREFIX(2)')")
        .unwrap_err();
    assert!(
        matches!(&err, mysql::Error::MySqlError(e) if e.code == 1210 && e.message.contains("utf8mb4_german2_ci")),
        "{err:?}"
    );
}
