//! The hashing functions against DESIGN.md's table: values read as their
//! column type reads them, text folded as a collation folds it, columns a
//! function cannot partition refused.

use super::*;

fn num(s: &str) -> Value<'_> {
    Value::Number(s.into())
}
fn text(s: &str) -> Value<'_> {
    Value::String(s.into())
}
fn apply(function: &str, kind: ColumnKind, value: Value) -> Result<String, HashError> {
    HashFunction::parse(function)
        .unwrap()
        .apply(kind, &Folding::Legacy, &value)
        .map(Cow::into_owned)
}

#[test]
fn functions_map_values_as_design_md_says() {
    use ColumnKind::*;
    assert_eq!(apply("NONE()", Text, text("x")).unwrap(), "x");
    for v in ["1", "4", "7"] {
        assert_eq!(apply("MOD(3)", Integer, num(v)).unwrap(), "1");
    }
    assert_eq!(apply("DIV(1000)", Integer, num("1999")).unwrap(), "1");
    assert_eq!(apply("DIV(1000)", Integer, num("-1")).unwrap(), "-1");
    assert_eq!(apply("PREFIX(3)", Text, text("Martin")).unwrap(), "mar");
    assert_eq!(
        apply("DATE('%Y-%m')", Temporal, text("2008-05-06")).unwrap(),
        "2008-05"
    );
    assert_eq!(
        apply("DATE('%Y/%j')", Text, text("2008-12-31 10:00:00")).unwrap(),
        "2008/366"
    );
    let bucket: u64 = apply("HASH(8)", Integer, num("42"))
        .unwrap()
        .parse()
        .unwrap();
    assert!(bucket < 8);
}

#[test]
fn text_is_folded_like_a_ci_collation() {
    use ColumnKind::Text;
    for v in ["martin", "MARTIN", "Märtin", "martin   "] {
        assert_eq!(apply("NONE()", Text, text(v)).unwrap(), "martin", "{v}");
        assert_eq!(apply("PREFIX(3)", Text, text(v)).unwrap(), "mar", "{v}");
    }
}

#[test]
fn literals_are_read_as_the_column_type_reads_them() {
    use ColumnKind::*;
    assert_eq!(apply("NONE()", Integer, text("05")).unwrap(), "5");
    assert_eq!(apply("MOD(3)", Integer, num("4.0")).unwrap(), "1");
    assert_eq!(apply("NONE()", Decimal, num("5.50")).unwrap(), "5.5");
    assert_eq!(apply("NONE()", Decimal, text("-0.0")).unwrap(), "0");
    assert!(matches!(
        apply("MOD(3)", Integer, text("abc")),
        Err(HashError::WrongValue { .. })
    ));
    assert!(apply("MOD(3)", Integer, num("4.5")).is_err());
    assert!(apply("NONE()", Enum, num("1")).is_err());
    assert_eq!(apply("NONE()", Enum, text("Books")).unwrap(), "books");
    assert_eq!(
        apply("NONE()", Temporal, text("2008-05-06")).unwrap(),
        "2008-05-06 00:00:00"
    );
    assert!(apply("NONE()", Temporal, num("20080506")).is_err());
    assert_eq!(apply("HASH(4)", Integer, Value::Null), Err(HashError::Null));
}

#[test]
fn integers_taken_as_written_are_the_ones_already_canonical() {
    let written = [
        "0",
        "-0",
        "7",
        "-7",
        "007",
        "+7",
        " 7 ",
        "10",
        "-10",
        "1.0",
        "1e3",
        "-",
        "99999999999999999999999999999999999999999",
    ];
    for text in written {
        let parsed = parse_integer(text.trim()).map(|v| v.to_string());
        let value = num(text);
        let canonical = canonical(ColumnKind::Integer, &Folding::Legacy, &value).ok();
        assert_eq!(canonical.map(Cow::into_owned), parsed, "{text:?}");
    }
}

#[test]
fn functions_refuse_columns_they_cannot_partition() {
    let mod3 = HashFunction::parse("MOD(3)").unwrap();
    assert!(mod3.check_column(ColumnKind::Text).is_err());
    assert!(mod3.check_column(ColumnKind::Integer).is_ok());
    let date = HashFunction::parse("DATE('%Y')").unwrap();
    assert!(date.check_column(ColumnKind::Integer).is_err());
}

#[test]
fn parses_and_prints_functions() {
    for (text, printed) in [
        ("none()", "NONE()"),
        ("NONE", "NONE()"),
        (" mod( 3 ) ", "MOD(3)"),
        ("DIV(1000)", "DIV(1000)"),
        ("prefix(3)", "PREFIX(3)"),
        ("DATE('%Y-%m')", "DATE('%Y-%m')"),
        ("DATE(\"%Y\")", "DATE('%Y')"),
        ("HASH(16)", "HASH(16)"),
    ] {
        let f = HashFunction::parse(text).unwrap();
        assert_eq!(f.to_string(), printed);
        assert_eq!(HashFunction::parse(printed).unwrap(), f);
    }
    for bad in [
        "MOD(0)",
        "MOD(x)",
        "MOD",
        "SHA(3)",
        "DATE('%Q')",
        "DATE(%Y)",
        "PREFIX(-1)",
    ] {
        assert!(HashFunction::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn admin_partition_values_take_the_form_apply_produces() {
    use ColumnKind::*;
    let value = |f: &str, kind, v: Value| {
        HashFunction::parse(f)
            .unwrap()
            .partition_value(kind, &Folding::Legacy, &v)
    };
    assert_eq!(value("MOD(3)", Integer, text("1")).unwrap(), "1");
    assert_eq!(value("MOD(3)", Integer, num("1")).unwrap(), "1");
    assert!(value("MOD(3)", Integer, num("3")).is_err());
    assert!(value("HASH(3)", Integer, num("-1")).is_err());
    assert_eq!(value("PREFIX(3)", Text, text("MAR")).unwrap(), "mar");
    assert!(value("PREFIX(3)", Text, text("mart")).is_err());
    assert_eq!(value("NONE()", Integer, text("007")).unwrap(), "7");
    assert!(value("NONE()", Integer, Value::Null).is_err());
}

/// Property: every value maps to exactly one partition value, the same on
/// every call, and values MariaDB compares equal map to the same one.
#[test]
fn every_value_maps_deterministically_and_equal_values_together() {
    use ColumnKind::*;
    let functions = ["NONE()", "MOD(7)", "DIV(10)", "PREFIX(2)", "HASH(5)"];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..2000 {
        let n = (next() % 100_000) as i64 - 50_000;
        for f in functions {
            let a = apply(f, Integer, num(&n.to_string())).unwrap();
            let b = apply(f, Integer, text(&format!(" {n}"))).unwrap();
            let c = apply(f, Integer, num(&format!("{n}.000"))).unwrap();
            assert_eq!((&a, &a), (&b, &c), "{f} {n}");
            if let Some(count) = f.strip_prefix("HASH(").or(f.strip_prefix("MOD(")) {
                let n: i128 = count.trim_end_matches(')').parse().unwrap();
                assert!(a.parse::<i128>().unwrap().abs() < n);
            }
        }
        let word: String = (0..1 + next() % 6)
            .map(|_| (b'a' + (next() % 26) as u8) as char)
            .collect();
        let shouted = format!("{}  ", word.to_uppercase());
        for f in ["NONE()", "PREFIX(2)", "HASH(5)"] {
            assert_eq!(
                apply(f, Text, text(&word)).unwrap(),
                apply(f, Text, text(&shouted)).unwrap(),
                "{f} {word}"
            );
        }
    }
}

/// The values `representatives` lists reach exactly the partition values
/// that the range's values reach, and MOD lists at most n per side of 0.
#[test]
fn representatives_stand_for_every_value_of_a_range() {
    use std::collections::BTreeSet;
    use ColumnKind::Integer;
    let reached = |f: &HashFunction, values: &mut dyn Iterator<Item = i128>| {
        let values: BTreeSet<String> = values
            .map(|v| {
                f.apply(Integer, &Folding::Legacy, &num(&v.to_string()))
                    .unwrap()
                    .into_owned()
            })
            .collect();
        values
    };
    for function in ["MOD(1)", "MOD(3)", "MOD(7)", "DIV(5)", "DIV(50)", "HASH(4)"] {
        let f = HashFunction::parse(function).unwrap();
        for low in -30..30 {
            for high in low..low + 40 {
                let Some(listed) =
                    f.representatives(Integer, &num(&low.to_string()), &num(&high.to_string()), 64)
                else {
                    panic!("{function} lists {low}..={high}");
                };
                let listed_values = listed.iter().map(|v| match v {
                    Value::Number(n) => n.parse::<i128>().unwrap(),
                    _ => unreachable!(),
                });
                assert_eq!(
                    reached(&f, &mut listed_values.clone()),
                    reached(&f, &mut (low..=high)),
                    "{function} {low}..={high}"
                );
                assert!(listed_values.clone().all(|v| (low..=high).contains(&v)));
                if let HashFunction::Mod(n) = f {
                    assert!(listed.len() <= 2 * n as usize, "{function} {low}..={high}");
                }
            }
        }
    }
    // A wide range is listed when its values reach few partition values.
    let wide = HashFunction::Mod(2).representatives(Integer, &num("1"), &num("1000000"), 64);
    assert_eq!(wide.map(|v| v.len()), Some(2));
    let wide = HashFunction::Hash(2).representatives(Integer, &num("1"), &num("100"), 64);
    assert_eq!(wide, None);
}
