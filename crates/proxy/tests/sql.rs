//! The differential suite: every case of `tests/sql/` answers through hscale,
//! partitioned over two and over three backends, as one plain table does.

use std::path::Path;

use hscale_testkit::{cluster_of, differential, Proxy};

#[test]
fn every_case_answers_like_one_table_over_two_and_three_backends() {
    cluster_of(3);
    let proxy = Proxy::for_cluster();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/sql");
    let cases = differential::cases(&dir);
    assert!(!cases.is_empty(), "no cases in {}", dir.display());
    let mut failures = Vec::new();
    for case in &cases {
        let failed = case.run(&proxy, &[2, 3]);
        println!("{}: {} failures", case.name, failed.len());
        failures.extend(failed);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
