//! Rows and column definitions read and written as MariaDB sends them, in
//! text and binary.

use super::*;

#[test]
fn values_are_found_in_place() {
    let row = [1, b'7', NULL_VALUE, 0, 3, b'a', b'b', b'c'];
    let values = text_values(&row, 4).unwrap();
    assert_eq!(
        values.as_slice(),
        [Some(1..2), None, Some(4..4), Some(5..8)]
    );
    assert_eq!(visible_prefix(&row, 2), Some(3));
    assert_eq!(visible_prefix(&row, 4), Some(8));
    assert!(text_values(&row[..7], 4).is_none());
    assert!(visible_prefix(&row[..7], 4).is_none());
    assert!(visible_prefix(&row[..2], 2).is_none());
}

#[test]
fn text_values_become_binary_as_mariadb_sends_them() {
    let column = |code, unsigned| BinaryColumn { code, unsigned };
    let binary = |columns: &[BinaryColumn], values: &[Option<&str>]| {
        let mut row = Vec::new();
        write_binary_row(columns, values, &mut row).map(|()| row)
    };
    // Header, NULL bitmap (bit 2 + i), then each value.
    assert_eq!(
        binary(
            &[
                column(1, false),
                column(3, true),
                column(8, false),
                column(13, false)
            ],
            &[Some("-1"), Some("4294967295"), None, Some("2024")],
        ),
        Some(vec![0, 0b10000, 0xff, 0xff, 0xff, 0xff, 0xff, 0xe8, 0x07])
    );
    assert_eq!(binary(&[column(1, false)], &[Some("128")]), None);
    assert_eq!(binary(&[column(3, true)], &[Some("-1")]), None);
    assert_eq!(
        binary(
            &[column(246, false), column(253, false)],
            &[Some("1.50"), Some("")]
        ),
        Some(vec![0, 0, 4, b'1', b'.', b'5', b'0', 0])
    );
    // Dates and times as long as their non-zero parts need.
    let date = |text| binary(&[column(12, false)], &[Some(text)]).map(|r| r[2..].to_vec());
    assert_eq!(date("0000-00-00 00:00:00"), Some(vec![0]));
    assert_eq!(date("2024-02-29"), Some(vec![4, 0xe8, 0x07, 2, 29]));
    assert_eq!(
        date("2024-02-29 00:00:00"),
        Some(vec![4, 0xe8, 0x07, 2, 29])
    );
    assert_eq!(
        date("2024-02-29 13:05:09"),
        Some(vec![7, 0xe8, 0x07, 2, 29, 13, 5, 9])
    );
    assert_eq!(
        date("2024-02-29 13:05:09.5"),
        Some(vec![11, 0xe8, 0x07, 2, 29, 13, 5, 9, 0x20, 0xa1, 0x07, 0])
    );
    let time = |text| binary(&[column(11, false)], &[Some(text)]).map(|r| r[2..].to_vec());
    assert_eq!(time("00:00:00"), Some(vec![0]));
    assert_eq!(
        time("-838:59:59"),
        Some(vec![8, 1, 34, 0, 0, 0, 22, 59, 59])
    );
    assert_eq!(
        time("01:02:03.000004"),
        Some(vec![12, 0, 0, 0, 0, 0, 1, 2, 3, 4, 0, 0, 0])
    );
    // FLOAT and DOUBLE print rounded: no exact binary form.
    assert_eq!(binary(&[column(5, false)], &[Some("0.1")]), None);
    assert!(!column(4, false).converts());
    assert_eq!(binary(&[column(10, false)], &[Some("not a date")]), None);
}

#[test]
fn rows_written_read_back_with_nulls() {
    let mut packet = Vec::new();
    write_text_row(&[Some("a"), None, Some("")], &mut packet);
    assert_eq!(
        parse_text_row(&packet, 3).unwrap(),
        [Some(b"a".to_vec()), None, Some(Vec::new())]
    );
    assert!(parse_text_row(&packet, 4).is_none());
}

#[test]
fn column_names_are_read_from_a_definition() {
    let mut column = Vec::new();
    write_column("TABLE_NAME", ColumnType::Text, &mut column);
    assert_eq!(
        column_names(&column),
        Some((&b"TABLE_NAME"[..], &b"TABLE_NAME"[..]))
    );
    assert_eq!(column_names(&column[..10]), None);
}

#[test]
fn a_column_definition_names_another_table_when_asked() {
    let mut column = Vec::new();
    for part in ["def", "app", "u", "users_odd", "id", "id"] {
        write_lenenc_bytes(part.as_bytes(), &mut column);
    }
    column.extend_from_slice(&[0x0c, 63, 0, 10, 0, 0, 0, 3, 0x23, 0x42, 0, 0, 0]);
    let physical = |schema: &[u8], table: &[u8]| {
        (schema == b"app" && table == b"users_odd").then_some("users")
    };
    let renamed = rename_column_table(&column, physical).unwrap().to_vec();
    let mut expected = Vec::new();
    for part in ["def", "app", "u", "users", "id", "id"] {
        write_lenenc_bytes(part.as_bytes(), &mut expected);
    }
    expected.extend_from_slice(&column[column.len() - 13..]);
    assert_eq!(renamed, expected);
    assert!(rename_column_table(&renamed, physical).is_none());
    assert!(rename_column_table(&column[..12], physical).is_none());
}

#[test]
fn a_result_set_ends_by_the_clients_eof_convention() {
    let cols = [("n", ColumnType::Integer)];
    let rows = vec![vec![Some("1".to_string())]];
    let classic = text_result(&cols, &rows, false, 2);
    assert_eq!(classic.len(), 5);
    assert!(is_result_end(&classic[2], false) && is_result_end(&classic[4], false));
    let modern = text_result(&cols, &rows, true, 2);
    assert_eq!(modern.len(), 4);
    assert!(is_result_end(&modern[3], true));
    assert!(!is_result_end(&modern[2], true));
}
