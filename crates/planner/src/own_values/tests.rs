//! Calls hscale answers itself (LAST_INSERT_ID(), CONNECTION_ID(), ...)
//! replaced in statements, the names of their columns kept.

use super::*;

const OWN: OwnValues = OwnValues {
    connection_id: 42,
    port: 4040,
    address: std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
    hostname: "db'1",
};

fn replaced(sql: &str) -> String {
    String::from_utf8(
        replace_own_values(sql.as_bytes(), &OWN, Quoting::BACKSLASH_ESCAPES).expect("a call"),
    )
    .unwrap()
}

const ID: &str = "CAST(0000000042 AS UNSIGNED)";

#[test]
fn a_lone_call_keeps_its_column_name() {
    assert_eq!(
        replaced("SELECT CONNECTION_ID()"),
        format!("SELECT {ID} AS `CONNECTION_ID()`")
    );
    assert_eq!(
        replaced("select connection_id( ) ;"),
        format!("select {ID} AS `connection_id( )` ;")
    );
    assert_eq!(
        replaced("SELECT DISTINCT CONNECTION_ID(), a FROM t"),
        format!("SELECT DISTINCT {ID} AS `CONNECTION_ID()`, a FROM t")
    );
    assert_eq!(
        replaced("SELECT CONNECTION_ID() + 1 INTO @x"),
        format!("SELECT {ID} + 1 AS `CONNECTION_ID() + 1` INTO @x")
    );
}

#[test]
fn aliased_items_keep_their_alias() {
    for (sql, want) in [
        ("SELECT CONNECTION_ID() AS id", format!("SELECT {ID} AS id")),
        ("SELECT CONNECTION_ID() id", format!("SELECT {ID} id")),
        (
            "SELECT CONNECTION_ID() `my id`",
            format!("SELECT {ID} `my id`"),
        ),
        (
            "SELECT IF(owner = CONNECTION_ID(), 1, 0) mine FROM t",
            format!("SELECT IF(owner = {ID}, 1, 0) mine FROM t"),
        ),
    ] {
        assert_eq!(replaced(sql), want);
    }
}

#[test]
fn expressions_ending_in_a_word_get_an_alias() {
    assert_eq!(
        replaced("SELECT CONNECTION_ID() IS NOT NULL"),
        format!("SELECT {ID} IS NOT NULL AS `CONNECTION_ID() IS NOT NULL`")
    );
    assert_eq!(
        replaced("SELECT owner = CONNECTION_ID() FROM t"),
        format!("SELECT owner = {ID} AS `owner = CONNECTION_ID()` FROM t")
    );
    assert_eq!(
        replaced("SELECT 1 = CONNECTION_ID() AND a FROM t"),
        format!("SELECT 1 = {ID} AND a AS `1 = CONNECTION_ID() AND a` FROM t")
    );
}

#[test]
fn calls_outside_select_lists_are_replaced_without_alias() {
    assert_eq!(
        replaced("UPDATE jobs SET owner = CONNECTION_ID() WHERE owner IS NULL LIMIT 1"),
        format!("UPDATE jobs SET owner = {ID} WHERE owner IS NULL LIMIT 1")
    );
    assert_eq!(
        replaced("SELECT * FROM jobs WHERE owner = connection_id() ORDER BY CONNECTION_ID()"),
        format!("SELECT * FROM jobs WHERE owner = {ID} ORDER BY {ID}")
    );
    assert_eq!(
        replaced("INSERT INTO t VALUES (1, CONNECTION_ID())"),
        format!("INSERT INTO t VALUES (1, {ID})")
    );
}

#[test]
fn subqueries_name_both_columns() {
    assert_eq!(
        replaced("SELECT (SELECT CONNECTION_ID()), 2"),
        format!("SELECT (SELECT {ID} AS `CONNECTION_ID()`) AS `(SELECT CONNECTION_ID())`, 2")
    );
    assert_eq!(
        replaced("SELECT a FROM t WHERE b IN (SELECT CONNECTION_ID()) AND c"),
        format!("SELECT a FROM t WHERE b IN (SELECT {ID} AS `CONNECTION_ID()`) AND c")
    );
}

#[test]
fn every_statement_of_a_query_is_read() {
    assert_eq!(
        replaced("DO 1; SELECT CONNECTION_ID(); SELECT 2"),
        format!("DO 1; SELECT {ID} AS `CONNECTION_ID()`; SELECT 2")
    );
}

#[test]
fn leaves_strings_comments_columns_and_stored_sql_alone() {
    for sql in [
        "SELECT 'CONNECTION_ID()'",
        "SELECT 1 /* CONNECTION_ID() */",
        "SELECT connection_id FROM sessions",
        "SELECT `connection_id`() FROM t",
        "CREATE VIEW v AS SELECT CONNECTION_ID()",
        "CREATE TRIGGER t BEFORE INSERT ON x FOR EACH ROW SET NEW.c = CONNECTION_ID()",
        "ALTER EVENT e DO INSERT INTO t VALUES (CONNECTION_ID())",
    ] {
        assert_eq!(
            replace_own_values(sql.as_bytes(), &OWN, Quoting::BACKSLASH_ESCAPES),
            None,
            "{sql}"
        );
    }
    assert_eq!(
        replaced("CREATE VIEW v AS SELECT 1; SELECT CONNECTION_ID() x"),
        format!("CREATE VIEW v AS SELECT 1; SELECT {ID} x")
    );
}

#[test]
fn text_the_server_will_refuse_is_left_alone() {
    assert_eq!(
        replace_own_values(
            b"SELECT CONNECTION_ID() 'x",
            &OWN,
            Quoting::BACKSLASH_ESCAPES
        ),
        None
    );
    assert_eq!(
        replaced("SELECT CONNECTION_ID()---"),
        format!("SELECT {ID}---")
    );
}

#[test]
fn executable_comments_are_code() {
    assert_eq!(
        replaced("SELECT /*!50000 CONNECTION_ID() */"),
        format!("SELECT /*!50000 {ID} AS `CONNECTION_ID()` */")
    );
}

#[test]
fn backquotes_in_the_name_are_doubled() {
    assert_eq!(
        replaced("SELECT CONNECTION_ID() + `a`"),
        format!("SELECT {ID} + `a` AS `CONNECTION_ID() + ``a```")
    );
}

const PORT: &str = "CAST(0000000000000004040 AS SIGNED)";
const NO_SOCKET: &str = "CAST(X'' AS CHAR CHARACTER SET utf8mb3)";

#[test]
fn variables_naming_the_server_answer_hscales_listener() {
    assert_eq!(
        replaced("SELECT @@socket"),
        format!("SELECT {NO_SOCKET} AS `@@socket`")
    );
    assert_eq!(
        replaced("select @@PORT, @@global.socket s, @@version"),
        format!("select {PORT} AS `@@PORT`, {NO_SOCKET} s, @@version")
    );
    assert_eq!(
        replaced("SELECT @@socket AS s, @@port p FROM t"),
        format!("SELECT {NO_SOCKET} AS s, {PORT} p FROM t")
    );
    // The hostname travels as hex: no quote in it can end a string.
    assert_eq!(
        replaced("SELECT CONCAT(@@hostname, ':', @@port) FROM dual"),
        format!(
            "SELECT CONCAT(CAST(X'64622731' AS CHAR CHARACTER SET utf8mb3), ':', {PORT}) \
             AS `CONCAT(@@hostname, ':', @@port)` FROM dual"
        )
    );
    assert_eq!(
        replaced("SET @where = @@bind_address"),
        "SET @where = CAST(X'3132372e302e302e31' AS CHAR CHARACTER SET utf8mb3)"
    );
}

#[test]
fn variables_the_server_answers_are_left_alone() {
    for sql in [
        "SELECT @@version, @@session.autocommit",
        // A global variable read in session scope: the server's error.
        "SELECT @@session.port",
        "SELECT '@@socket'",
        "CREATE PROCEDURE p() SELECT @@port",
    ] {
        assert_eq!(
            replace_own_values(sql.as_bytes(), &OWN, Quoting::BACKSLASH_ESCAPES),
            None,
            "{sql}"
        );
    }
}
