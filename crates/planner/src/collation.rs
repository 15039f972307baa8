//! Strings routed as the partition column compares them: values its
//! collation holds equal must land in one partition, or a unique key that
//! holds on one table would not hold across partitions. A collation hscale
//! routes by exactly is either binary (code points) or one whose weights per
//! character it learned from the main backend (`WEIGHT_STRING` of each
//! character); a string is folded to the characters that stand for its
//! weights, so that two strings fold alike exactly when the server compares
//! them equal.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

/// How a partition column's strings are folded before hashing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Folding {
    /// A table set up before hscale read the column's collation: folded as
    /// then (case, accents and trailing spaces dropped), which routes every
    /// row where it was placed.
    #[default]
    Legacy,
    /// A `*_bin` collation: code points; `pad`: trailing spaces do not count.
    Binary { pad: bool },
    /// A collation learned from the server.
    Weights(Arc<WeightTable>),
}

impl Folding {
    pub fn fold<'a>(&self, text: &'a str) -> Cow<'a, str> {
        match self {
            Folding::Legacy => crate::hashing::fold(text),
            Folding::Binary { pad: true } => Cow::Borrowed(text.trim_end_matches(' ')),
            Folding::Binary { pad: false } => Cow::Borrowed(text),
            Folding::Weights(table) => table.fold(text),
        }
    }
}

/// A collation's weights, as the characters that stand for them: each
/// character of the table's range maps to the characters whose single
/// weights make up its own (none for an ignorable character, two for an
/// expansion such as 'ß' in unicode_ci).
#[derive(Debug)]
pub struct WeightTable {
    pub name: String,
    /// `folded[starts[c]..starts[c + 1]]`: what character `c` folds to.
    starts: Vec<u32>,
    folded: Vec<char>,
    /// What characters past the table fold to: all to the same (general_ci
    /// and unicode_ci give them one weight), or `None`: to nothing. Past the
    /// planes a table covers, unicode_520_ci's characters are ignorable or
    /// weigh uniquely; dropping them folds more than the collation, which
    /// never parts equal strings.
    beyond: Option<Vec<char>>,
    /// What a space folds to, dropped at the end of a string (PAD SPACE).
    pad: Option<Vec<char>>,
    /// Printable ASCII folds to itself, capitals to small letters (most
    /// collations): such text folds without a table lookup.
    ascii_plain: bool,
}

impl PartialEq for WeightTable {
    fn eq(&self, other: &WeightTable) -> bool {
        self.name == other.name
    }
}

impl Eq for WeightTable {}

impl WeightTable {
    /// Builds the table from each character's weights (`weights[c]`, in the
    /// server's units: 2 bytes for Unicode collations, 1 for 8-bit ones),
    /// and the weights every character past them has (`None`: they are
    /// dropped).
    pub fn new(
        name: &str,
        weights: &[Vec<u16>],
        beyond: Option<&[u16]>,
        pad_space: bool,
    ) -> WeightTable {
        // Each single weight stands for the lowest character that has it
        // alone, in lower case where that has the same weight.
        let mut standing: HashMap<u16, char> = HashMap::new();
        for (code, units) in weights.iter().enumerate() {
            let Some(c) = char::from_u32(code as u32) else {
                continue;
            };
            if let [unit] = units.as_slice() {
                standing.entry(*unit).or_insert(c);
            }
        }
        for stand in standing.values_mut() {
            let mut lower = stand.to_lowercase();
            if let (Some(l), None) = (lower.next(), lower.next()) {
                if weights.get(l as usize) == weights.get(*stand as usize) {
                    *stand = l;
                }
            }
        }
        // A weight no character has alone: a private-use character of
        // plane 15 stands for it, which no table character folds to.
        let stand_for = |unit: &u16| {
            standing
                .get(unit)
                .copied()
                .unwrap_or_else(|| char::from_u32(0xF0000 + u32::from(*unit)).unwrap_or('\u{FFFD}'))
        };
        let mut starts = Vec::with_capacity(weights.len() + 1);
        let mut folded = Vec::with_capacity(weights.len());
        for units in weights {
            starts.push(folded.len() as u32);
            folded.extend(units.iter().map(stand_for));
        }
        starts.push(folded.len() as u32);
        let space: Option<Vec<char>> = weights
            .get(0x20)
            .map(|units| units.iter().map(stand_for).collect());
        let ascii_plain = (0x20u8..0x7f).all(|b| {
            let (start, end) = (starts[b as usize] as usize, starts[b as usize + 1] as usize);
            folded[start..end] == [b.to_ascii_lowercase() as char]
        });
        WeightTable {
            name: name.to_string(),
            starts,
            folded,
            beyond: beyond.map(|units| units.iter().map(stand_for).collect()),
            pad: if pad_space { space } else { None },
            ascii_plain,
        }
    }

    pub fn fold<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if self.ascii_plain && text.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            let text = match self.pad {
                Some(_) => text.trim_end_matches(' '),
                None => text,
            };
            return match text.bytes().any(|b| b.is_ascii_uppercase()) {
                true => Cow::Owned(text.to_ascii_lowercase()),
                false => Cow::Borrowed(text),
            };
        }
        Cow::Owned(self.fold_each(text))
    }

    fn fold_each(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        for c in text.chars() {
            let code = c as usize;
            match self.starts.get(code + 1) {
                Some(&end) => {
                    let start = self.starts[code] as usize;
                    out.extend(&self.folded[start..end as usize]);
                }
                None => {
                    if let Some(all) = &self.beyond {
                        out.extend(all);
                    }
                }
            }
        }
        if let Some(space) = self.pad.as_ref().filter(|s| !s.is_empty()) {
            let space: String = space.iter().collect();
            while out.ends_with(&space) {
                out.truncate(out.len() - space.len());
            }
        }
        out
    }
}

/// What a collation's name says of how hscale can route by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollationKind {
    Binary {
        pad: bool,
    },
    /// Learned from the server, one of those hscale was checked against.
    Learned,
    Unsupported,
}

/// The collations hscale routes by exactly (each checked by a differential
/// test against the server's own comparisons), besides every `*_bin`.
pub const LEARNED: &[&str] = &[
    "utf8mb4_general_ci",
    "utf8mb3_general_ci",
    "utf8_general_ci",
    "utf8mb4_unicode_ci",
    "utf8mb3_unicode_ci",
    "utf8_unicode_ci",
    "utf8mb4_unicode_520_ci",
    "utf8mb3_unicode_520_ci",
    "utf8_unicode_520_ci",
    "utf8mb4_0900_ai_ci",
    "latin1_swedish_ci",
];

pub fn kind_of(collation: &str) -> CollationKind {
    let name = collation.to_ascii_lowercase();
    // BINARY, VARBINARY and BLOB columns: bytes, trailing spaces count.
    if name == "binary" {
        return CollationKind::Binary { pad: false };
    }
    if name.ends_with("_bin") {
        return CollationKind::Binary {
            pad: !name.contains("_nopad_"),
        };
    }
    match LEARNED.contains(&name.as_str()) {
        true => CollationKind::Learned,
        false => CollationKind::Unsupported,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small collation: 'a'..'z' and 'A'..'Z' share weights, 'é' weighs
    /// as 'e', 'ß' as "ss", NUL nothing; past the table all weigh as one.
    fn toy() -> WeightTable {
        let mut weights: Vec<Vec<u16>> = (0..256u16).map(|c| vec![c + 1000]).collect();
        for c in b'A'..=b'Z' {
            weights[c as usize] = vec![u16::from(c.to_ascii_lowercase()) + 1000];
        }
        weights[0xE9] = vec![u16::from(b'e') + 1000];
        weights[0xDF] = vec![u16::from(b's') + 1000; 2];
        weights[0] = vec![];
        WeightTable::new("toy", &weights, Some(&[0xFFFD]), true)
    }

    #[test]
    fn strings_the_collation_holds_equal_fold_alike() {
        let t = toy();
        assert_eq!(t.fold("Straße"), t.fold("STRASSE"));
        assert_eq!(t.fold("café"), "cafe");
        assert_eq!(t.fold("a\0b  "), "ab");
        assert_eq!(t.fold("\u{1F600}"), t.fold("\u{1D400}"));
        assert_ne!(t.fold("ab"), t.fold("a b"));
    }

    #[test]
    fn printable_ascii_folds_without_the_table_where_the_table_agrees() {
        let t = toy();
        assert!(t.ascii_plain);
        assert_eq!(t.fold("Mar  "), "mar");
        assert!(matches!(t.fold("mar"), Cow::Borrowed("mar")));
        assert_eq!(t.fold("Mar"), t.fold_each("Mar"));
    }

    #[test]
    fn collation_names_say_how_hscale_routes() {
        assert_eq!(kind_of("utf8mb4_bin"), CollationKind::Binary { pad: true });
        assert_eq!(
            kind_of("utf8mb4_nopad_bin"),
            CollationKind::Binary { pad: false }
        );
        assert_eq!(kind_of("latin1_swedish_ci"), CollationKind::Learned);
        assert_eq!(kind_of("binary"), CollationKind::Binary { pad: false });
        assert_eq!(kind_of("utf8mb4_german2_ci"), CollationKind::Unsupported);
    }
}
