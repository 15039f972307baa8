//! What routing costs per statement: the lexer alone (every statement), a
//! statement on a partitioned table planned from the cache (a hit), and the
//! same statement parsed and analysed (a miss). `cargo bench -p hscale-planner`.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use hscale_planner::{
    plan, summarize, ClientCharset, ColumnKind, Context, Dictionary, HashFunction, PartitionEntry,
    PartitionState, PartitionedTable, PlanCache, Quoting, TableDefinition, TableName,
};

/// The 2008 seed query: a table of three rows, lots of comments.
const SEED: &str = "SELECT id, category FROM small WHERE small.category='books' /* Added */ /* some */ \
                    /* comments */ /* to */ /* produce */ /* a */ /* higher */ /* tokenizer */ /* load */";

/// `small` partitioned by category, one partition per category.
fn dictionary() -> Dictionary {
    let entry = |value: &str, backend| PartitionEntry {
        name: value.into(),
        value: value.into(),
        backend,
        state: PartitionState::Active,
    };
    Dictionary::new(
        1,
        vec![PartitionedTable::new(
            TableDefinition {
                table: TableName {
                    db: "app".into(),
                    name: "small".into(),
                },
                column: "category".into(),
                column_position: 2,
                kind: ColumnKind::Enum,
                function: HashFunction::None,
                default_table: "small_default".into(),
                default_backend: 1,
                auto_column: None,
                folding: Default::default(),
            },
            vec![
                entry("books", 1),
                entry("hardware", 2),
                entry("software", 1),
            ],
        )],
    )
}

fn planning(c: &mut Criterion) {
    let partitioned = dictionary();
    let empty = Dictionary::default();
    let ctx = |dictionary| Context {
        db: Some("app"),
        quoting: Quoting::BACKSLASH_ESCAPES,
        no_auto_value_on_zero: false,
        tables_locked: false,
        charset: ClientCharset::Utf8,
        dictionary,
        main_backend: 1,
        passed_fences: &[],
    };
    c.bench_function("lexer: seed query, no partitioned table", |b| {
        b.iter(|| summarize(SEED.as_bytes(), Quoting::BACKSLASH_ESCAPES, empty.names()))
    });
    c.bench_function("plan: seed query, no partitioned table", |b| {
        let mut cache = PlanCache::default();
        let ctx = ctx(&empty);
        b.iter(|| plan(SEED.as_bytes(), &ctx, &mut cache))
    });
    // In a proxy the kernel's network stack runs between two statements and
    // leaves the planner's code and data out of the CPU's caches: each
    // iteration here first walks a buffer larger than the L2 cache.
    let mut evict = vec![0u8; 4 << 20];
    let passed = SEED.replace("small", "smalx");
    for (what, sql, db) in [
        ("smalx, not partitioned", passed.as_str(), "app"),
        ("a small partitioned elsewhere, cache hit", SEED, "other"),
        ("partitioned small, cache hit", SEED, "app"),
    ] {
        c.bench_function(&format!("plan, cold caches: seed query on {what}"), |b| {
            let mut cache = PlanCache::default();
            let ctx = Context {
                db: Some(db),
                ..ctx(&partitioned)
            };
            b.iter_batched(
                || {
                    for line in evict.chunks_mut(64) {
                        line[0] = line[0].wrapping_add(1);
                    }
                },
                |()| plan(sql.as_bytes(), &ctx, &mut cache),
                BatchSize::PerIteration,
            )
        });
    }
    c.bench_function("plan: seed query on partitioned small, cache hit", |b| {
        let mut cache = PlanCache::default();
        let ctx = ctx(&partitioned);
        b.iter(|| plan(SEED.as_bytes(), &ctx, &mut cache))
    });
    c.bench_function(
        "plan: seed query on a small that is partitioned elsewhere, cache hit",
        |b| {
            let mut cache = PlanCache::default();
            let ctx = Context {
                db: Some("other"),
                ..ctx(&partitioned)
            };
            b.iter(|| plan(SEED.as_bytes(), &ctx, &mut cache))
        },
    );
    let insert = "INSERT INTO small (id, category) VALUES (4, 'hardware')";
    let rows: Vec<String> = (0..10)
        .map(|i| {
            format!(
                "({}, '{}')",
                10 + i,
                ["books", "hardware", "software"][i % 3]
            )
        })
        .collect();
    let insert_rows = format!(
        "INSERT INTO small (id, category) VALUES {}",
        rows.join(", ")
    );
    for (what, sql) in [("one-row", insert), ("10-row", insert_rows.as_str())] {
        c.bench_function(
            &format!("plan: {what} INSERT into partitioned small, cache hit"),
            |b| {
                let mut cache = PlanCache::default();
                let ctx = ctx(&partitioned);
                b.iter(|| plan(sql.as_bytes(), &ctx, &mut cache))
            },
        );
        c.bench_function(
            &format!("plan: {what} INSERT into partitioned small, cache miss"),
            |b| {
                let ctx = ctx(&partitioned);
                b.iter(|| plan(sql.as_bytes(), &ctx, &mut PlanCache::default()))
            },
        );
    }
    c.bench_function("plan: seed query on partitioned small, cache miss", |b| {
        let ctx = ctx(&partitioned);
        b.iter(|| plan(SEED.as_bytes(), &ctx, &mut PlanCache::default()))
    });
}

criterion_group!(benches, planning);
criterion_main!(benches);
