//! An order-entry application of the shape that outgrows one server
//! (issue 55): warehouses, districts, customers, orders, new orders, order
//! lines, stock and a payment history, every table keyed by its warehouse,
//! items shared, foreign keys between them. Its five transactions are
//! written as an application writes them — plain SQL with literals,
//! transactions over two warehouses, aggregates over joins, correlated
//! subqueries — and know nothing of hscale. The tests run it through hscale
//! and against one plain server (the oracle); `bench/order_entry.sh` runs
//! it for throughput.

use std::fmt::Write as _;

use mysql::prelude::Queryable;
use mysql::{Conn, Value};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How big the application's data is.
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    pub warehouses: u32,
    pub districts: u32,
    pub customers: u32,
    pub items: u32,
    /// Orders each district starts with; the last third not yet delivered.
    pub orders: u32,
}

impl Scale {
    /// Small enough for a test to load in a second or two.
    pub const TEST: Scale = Scale {
        warehouses: 4,
        districts: 3,
        customers: 30,
        items: 200,
        orders: 30,
    };

    /// What `bench/order_entry.sh` runs by default: small enough that the
    /// whole of it fits one server's buffer pool, so that the run measures
    /// what hscale adds to each statement.
    pub const BENCH: Scale = Scale {
        warehouses: 8,
        districts: 10,
        customers: 100,
        items: 5_000,
        orders: 100,
    };

    /// The size of the application issue 55 was filed with: two warehouses
    /// of the order-entry benchmark's standard size (100,000 items, 3,000
    /// customers and orders a district; ~600,000 order lines): more than
    /// one server's buffer pool holds.
    pub const STANDARD: Scale = Scale {
        warehouses: 2,
        districts: 10,
        customers: 3_000,
        items: 100_000,
        orders: 3_000,
    };
}

/// The tables, each with its foreign keys. `item` is shared by every
/// warehouse; `history` has no key, as the application keeps it.
pub const SCHEMA: &[&str] = &[
    "CREATE TABLE item (i_id INT PRIMARY KEY, i_name VARCHAR(24) NOT NULL, \
     i_price DECIMAL(5,2) NOT NULL)",
    "CREATE TABLE warehouse (w_id INT PRIMARY KEY, w_name VARCHAR(10) NOT NULL, \
     w_tax DECIMAL(4,4) NOT NULL, w_ytd DECIMAL(12,2) NOT NULL)",
    "CREATE TABLE district (d_w_id INT NOT NULL, d_id INT NOT NULL, d_name VARCHAR(10) NOT NULL, \
     d_tax DECIMAL(4,4) NOT NULL, d_ytd DECIMAL(12,2) NOT NULL, d_next_o_id INT NOT NULL, \
     PRIMARY KEY (d_w_id, d_id), \
     CONSTRAINT fk_district_warehouse FOREIGN KEY (d_w_id) REFERENCES warehouse (w_id))",
    "CREATE TABLE customer (c_w_id INT NOT NULL, c_d_id INT NOT NULL, c_id INT NOT NULL, \
     c_first VARCHAR(16) NOT NULL, c_last VARCHAR(16) NOT NULL, c_discount DECIMAL(4,4) NOT NULL, \
     c_balance DECIMAL(12,2) NOT NULL, c_ytd_payment DECIMAL(12,2) NOT NULL, \
     c_payment_cnt INT NOT NULL, c_delivery_cnt INT NOT NULL, \
     PRIMARY KEY (c_w_id, c_d_id, c_id), KEY customer_last (c_w_id, c_d_id, c_last, c_first), \
     CONSTRAINT fk_customer_district FOREIGN KEY (c_w_id, c_d_id) REFERENCES district (d_w_id, d_id))",
    "CREATE TABLE history (h_c_w_id INT NOT NULL, h_c_d_id INT NOT NULL, h_c_id INT NOT NULL, \
     h_w_id INT NOT NULL, h_d_id INT NOT NULL, h_date BIGINT NOT NULL, h_amount DECIMAL(6,2) NOT NULL, \
     KEY history_customer (h_c_w_id, h_c_d_id, h_c_id), \
     CONSTRAINT fk_history_customer FOREIGN KEY (h_c_w_id, h_c_d_id, h_c_id) \
     REFERENCES customer (c_w_id, c_d_id, c_id))",
    "CREATE TABLE orders (o_w_id INT NOT NULL, o_d_id INT NOT NULL, o_id INT NOT NULL, \
     o_c_id INT NOT NULL, o_entry_d BIGINT NOT NULL, o_carrier_id INT NULL, o_ol_cnt INT NOT NULL, \
     o_all_local TINYINT NOT NULL, PRIMARY KEY (o_w_id, o_d_id, o_id), \
     KEY orders_customer (o_w_id, o_d_id, o_c_id, o_id), \
     CONSTRAINT fk_orders_customer FOREIGN KEY (o_w_id, o_d_id, o_c_id) \
     REFERENCES customer (c_w_id, c_d_id, c_id))",
    "CREATE TABLE new_orders (no_w_id INT NOT NULL, no_d_id INT NOT NULL, no_o_id INT NOT NULL, \
     PRIMARY KEY (no_w_id, no_d_id, no_o_id), \
     CONSTRAINT fk_new_orders_orders FOREIGN KEY (no_w_id, no_d_id, no_o_id) \
     REFERENCES orders (o_w_id, o_d_id, o_id))",
    "CREATE TABLE stock (s_w_id INT NOT NULL, s_i_id INT NOT NULL, s_quantity INT NOT NULL, \
     s_ytd INT NOT NULL, s_order_cnt INT NOT NULL, s_remote_cnt INT NOT NULL, \
     PRIMARY KEY (s_w_id, s_i_id), \
     CONSTRAINT fk_stock_warehouse FOREIGN KEY (s_w_id) REFERENCES warehouse (w_id), \
     CONSTRAINT fk_stock_item FOREIGN KEY (s_i_id) REFERENCES item (i_id))",
    "CREATE TABLE order_line (ol_w_id INT NOT NULL, ol_d_id INT NOT NULL, ol_o_id INT NOT NULL, \
     ol_number INT NOT NULL, ol_i_id INT NOT NULL, ol_supply_w_id INT NOT NULL, \
     ol_delivery_d BIGINT NULL, ol_quantity INT NOT NULL, ol_amount DECIMAL(6,2) NOT NULL, \
     PRIMARY KEY (ol_w_id, ol_d_id, ol_o_id, ol_number), \
     CONSTRAINT fk_order_line_orders FOREIGN KEY (ol_w_id, ol_d_id, ol_o_id) \
     REFERENCES orders (o_w_id, o_d_id, o_id), \
     CONSTRAINT fk_order_line_stock FOREIGN KEY (ol_supply_w_id, ol_i_id) \
     REFERENCES stock (s_w_id, s_i_id))",
];

/// Each partitioned table and its warehouse column, parents first.
pub const BY_WAREHOUSE: &[(&str, &str)] = &[
    ("warehouse", "w_id"),
    ("district", "d_w_id"),
    ("customer", "c_w_id"),
    ("history", "h_c_w_id"),
    ("orders", "o_w_id"),
    ("new_orders", "no_w_id"),
    ("stock", "s_w_id"),
    ("order_line", "ol_w_id"),
];

/// The shared table, copied to every backend.
pub const SHARED: &str = "item";

/// Creates the tables (on a server directly: through hscale a table is
/// created where the session's database is).
pub fn create(conn: &mut Conn) -> mysql::Result<()> {
    SCHEMA.iter().try_for_each(|sql| conn.query_drop(*sql))
}

/// Through hscale: items copied to every backend, every other table
/// partitioned by warehouse, MOD(2), odd warehouses on backend 2. Every
/// table is set up before any is split, so that foreign keys between one
/// warehouse's partitions are kept (docs/partitioning.md).
pub fn shard(conn: &mut Conn) -> mysql::Result<()> {
    conn.query_drop(format!("HSCALE SETUP_REFERENCE('{SHARED}')"))?;
    for (table, column) in BY_WAREHOUSE {
        conn.query_drop(format!(
            "HSCALE SETUP_TABLE('{table}', '{column}', '{table}_default', 1, 'MOD(2)')"
        ))?;
    }
    for (table, _) in BY_WAREHOUSE {
        conn.query_drop(format!("HSCALE ADD_PARTITION('{table}', 'odd', 1, 2)"))?;
    }
    Ok(())
}

/// Rows of one table, as many per INSERT as a loader sends.
struct Loader<'c> {
    conn: &'c mut Conn,
    table: &'static str,
    rows: Vec<String>,
}

impl Loader<'_> {
    fn row(&mut self, row: String) -> mysql::Result<()> {
        self.rows.push(row);
        if self.rows.len() == 500 {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> mysql::Result<()> {
        if !self.rows.is_empty() {
            let sql = format!("INSERT INTO {} VALUES {}", self.table, self.rows.join(","));
            self.conn.query_drop(sql)?;
            self.rows.clear();
        }
        Ok(())
    }
}

/// Loads the initial data, the same for every seed of the workload: each
/// warehouse's year-to-date equals its districts', each customer's balance
/// and payments agree with its history and delivered order lines.
pub fn load(conn: &mut Conn, scale: Scale) -> mysql::Result<()> {
    let mut rng = StdRng::seed_from_u64(55);
    table(conn, "item", |l| {
        for i in 1..=scale.items {
            l.row(format!("({i}, 'item{i}', {})", cents(100 + i * 37 % 9900)))?;
        }
        Ok(())
    })?;
    let district_ytd = 3_000_000; // cents
    table(conn, "warehouse", |l| {
        for w in 1..=scale.warehouses {
            let ytd = cents(district_ytd * scale.districts);
            l.row(format!("({w}, 'w{w}', 0.{:04}, {ytd})", w * 113 % 2000))?;
        }
        Ok(())
    })?;
    table(conn, "district", |l| {
        for w in 1..=scale.warehouses {
            for d in 1..=scale.districts {
                let (tax, ytd, next) = ((w + d) * 71 % 2000, cents(district_ytd), scale.orders + 1);
                l.row(format!("({w}, {d}, 'd{w}.{d}', 0.{tax:04}, {ytd}, {next})"))?;
            }
        }
        Ok(())
    })?;
    table(conn, "customer", |l| {
        for (w, d) in districts(scale) {
            for c in 1..=scale.customers {
                let discount = (w * 7 + d * 13 + c * 17) % 5000;
                l.row(format!(
                    "({w}, {d}, {c}, 'first{c}', '{}', 0.{discount:04}, -10.00, 10.00, 1, 0)",
                    last_name(c)
                ))?;
            }
        }
        Ok(())
    })?;
    table(conn, "history", |l| {
        for (w, d) in districts(scale) {
            for c in 1..=scale.customers {
                l.row(format!("({w}, {d}, {c}, {w}, {d}, 0, 10.00)"))?;
            }
        }
        Ok(())
    })?;
    table(conn, "stock", |l| {
        for w in 1..=scale.warehouses {
            for i in 1..=scale.items {
                l.row(format!(
                    "({w}, {i}, {}, 0, 0, 0)",
                    10 + (w * 31 + i * 7) % 91
                ))?;
            }
        }
        Ok(())
    })?;
    // Orders, each customer's once over, the first two thirds delivered
    // (amount 0, as the balances assume), the rest waiting in new_orders.
    let delivered = scale.orders * 2 / 3;
    let mut lines = Vec::new();
    table(conn, "orders", |l| {
        for (w, d) in districts(scale) {
            for o in 1..=scale.orders {
                let c = (o * 7 + d) % scale.customers + 1;
                let count = rng.random_range(5..=10);
                let carrier = match o <= delivered {
                    true => rng.random_range(1..=10).to_string(),
                    false => "NULL".into(),
                };
                l.row(format!("({w}, {d}, {o}, {c}, 0, {carrier}, {count}, 1)"))?;
                for n in 1..=count {
                    let item = rng.random_range(1..=scale.items);
                    let (when, amount) = match o <= delivered {
                        true => ("0".to_string(), 0),
                        false => ("NULL".to_string(), rng.random_range(1..=999_999)),
                    };
                    lines.push(format!(
                        "({w}, {d}, {o}, {n}, {item}, {w}, {when}, 5, {})",
                        cents(amount)
                    ));
                }
            }
        }
        Ok(())
    })?;
    table(conn, "new_orders", |l| {
        for (w, d) in districts(scale) {
            for o in delivered + 1..=scale.orders {
                l.row(format!("({w}, {d}, {o})"))?;
            }
        }
        Ok(())
    })?;
    table(conn, "order_line", |l| {
        for line in lines.drain(..) {
            l.row(line)?;
        }
        Ok(())
    })
}

/// Sends the rows `rows` gives to `table`, 500 an INSERT.
fn table(
    conn: &mut Conn,
    table: &'static str,
    rows: impl FnOnce(&mut Loader) -> mysql::Result<()>,
) -> mysql::Result<()> {
    let mut loader = Loader {
        conn,
        table,
        rows: Vec::new(),
    };
    rows(&mut loader)?;
    loader.flush()
}

fn districts(scale: Scale) -> impl Iterator<Item = (u32, u32)> {
    (1..=scale.warehouses).flat_map(move |w| (1..=scale.districts).map(move |d| (w, d)))
}

/// Every third customer shares a last name with two others (up to 3,000
/// customers a district).
fn last_name(customer: u32) -> String {
    const SYLLABLES: [&str; 10] = [
        "BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING",
    ];
    let n = customer / 3;
    let hundreds = match n / 100 % 10 {
        0 => "",
        h => SYLLABLES[h as usize],
    };
    format!(
        "{hundreds}{}{}",
        SYLLABLES[(n / 10 % 10) as usize],
        SYLLABLES[(n % 10) as usize]
    )
}

fn cents(amount: u32) -> String {
    format!("{}.{:02}", amount / 100, amount % 100)
}

/// Who a payment or an order-status asks for.
#[derive(Debug, Clone)]
pub enum Customer {
    Id(u32),
    /// The middle one of those with this last name, by first name.
    Last(String),
}

/// One transaction's inputs, drawn by a `Terminal`.
#[derive(Debug, Clone)]
pub enum Transaction {
    NewOrder {
        w: u32,
        d: u32,
        c: u32,
        /// (item, supplying warehouse, quantity); an item id past the last
        /// makes the application roll the order back.
        lines: Vec<(u32, u32, u32)>,
        entry: u64,
    },
    Payment {
        w: u32,
        d: u32,
        c_w: u32,
        c_d: u32,
        customer: Customer,
        cents: u32,
        date: u64,
    },
    OrderStatus {
        w: u32,
        d: u32,
        customer: Customer,
    },
    Delivery {
        w: u32,
        carrier: u32,
        date: u64,
    },
    StockLevel {
        w: u32,
        d: u32,
        threshold: u32,
    },
}

/// Draws transactions in the application's mix, from a seed: the same seed
/// gives the same transactions.
pub struct Terminal {
    rng: StdRng,
    scale: Scale,
    clock: u64,
}

impl Terminal {
    pub fn new(seed: u64, scale: Scale) -> Terminal {
        Terminal {
            rng: StdRng::seed_from_u64(seed),
            scale,
            // Each terminal's own range of times, within a BIGINT.
            clock: (seed % 1_000_000) * 1_000_000_000,
        }
    }

    pub fn next_transaction(&mut self) -> Transaction {
        let s = self.scale;
        let rng = &mut self.rng;
        self.clock += 1;
        let w = rng.random_range(1..=s.warehouses);
        let d = rng.random_range(1..=s.districts);
        let other = |rng: &mut StdRng| match s.warehouses {
            1 => w,
            n => (w + rng.random_range(1..n) - 1) % n + 1,
        };
        let customer = |rng: &mut StdRng| match rng.random_bool(0.6) {
            true => Customer::Last(last_name(rng.random_range(1..=s.customers))),
            false => Customer::Id(rng.random_range(1..=s.customers)),
        };
        match rng.random_range(0..100) {
            0..45 => {
                let count = rng.random_range(5..=10);
                let mut lines: Vec<(u32, u32, u32)> = Vec::new();
                while lines.len() < count {
                    let item = rng.random_range(1..=s.items);
                    let supply = match rng.random_bool(0.1) {
                        true => other(rng),
                        false => w,
                    };
                    // One line per item and warehouse, as the order screen keeps them.
                    if !lines.iter().any(|&(i, sw, _)| i == item && sw == supply) {
                        lines.push((item, supply, rng.random_range(1..=10)));
                    }
                }
                if rng.random_bool(0.01) {
                    lines.last_mut().expect("five lines or more").0 = s.items + 1;
                }
                Transaction::NewOrder {
                    w,
                    d,
                    c: rng.random_range(1..=s.customers),
                    lines,
                    entry: self.clock,
                }
            }
            45..88 => {
                let (c_w, c_d) = match rng.random_bool(0.15) {
                    true => (other(rng), rng.random_range(1..=s.districts)),
                    false => (w, d),
                };
                Transaction::Payment {
                    w,
                    d,
                    c_w,
                    c_d,
                    customer: customer(rng),
                    cents: rng.random_range(100..=500_000),
                    date: self.clock,
                }
            }
            88..92 => Transaction::OrderStatus {
                w,
                d,
                customer: customer(rng),
            },
            92..96 => Transaction::Delivery {
                w,
                carrier: rng.random_range(1..=10),
                date: self.clock,
            },
            _ => Transaction::StockLevel {
                w,
                d,
                threshold: rng.random_range(10..=20),
            },
        }
    }
}

/// What a transaction ended as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Committed,
    /// The application rolled it back (a new order naming an unknown item).
    RolledBack,
}

/// Runs one transaction as the application does, each answer it reads
/// written down in `transcript` (so that two runs of the same transactions
/// can be compared answer by answer). On an error the application rolls
/// back and returns it; the caller decides whether to retry (1213, 1205).
pub fn run(conn: &mut Conn, t: &Transaction, transcript: &mut String) -> mysql::Result<Outcome> {
    conn.query_drop("START TRANSACTION")?;
    let outcome = match run_inside(conn, t, transcript) {
        Ok(outcome) => outcome,
        Err(e) => {
            let _ = conn.query_drop("ROLLBACK");
            return Err(e);
        }
    };
    match outcome {
        Outcome::Committed => conn.query_drop("COMMIT")?,
        Outcome::RolledBack => conn.query_drop("ROLLBACK")?,
    }
    Ok(outcome)
}

/// The rows of a query as text, one line each.
fn rows(conn: &mut Conn, sql: &str, transcript: &mut String) -> mysql::Result<Vec<Vec<String>>> {
    let rows: Vec<mysql::Row> = conn.query(sql)?;
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|row| row.unwrap().into_iter().map(text).collect())
        .collect();
    for row in &rows {
        let _ = writeln!(transcript, "{}", row.join("\t"));
    }
    Ok(rows)
}

fn text(value: Value) -> String {
    match value {
        Value::NULL => "NULL".into(),
        Value::Bytes(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        other => other.as_sql(true),
    }
}

fn one(conn: &mut Conn, sql: &str, transcript: &mut String) -> mysql::Result<Option<Vec<String>>> {
    Ok(rows(conn, sql, transcript)?.into_iter().next())
}

/// Finds the customer an order-status or payment names: by id, or the
/// middle one of those with the last name.
fn find_customer(
    conn: &mut Conn,
    w: u32,
    d: u32,
    customer: &Customer,
    transcript: &mut String,
) -> mysql::Result<Option<Vec<String>>> {
    let columns = "c_id, c_first, c_last, c_balance, c_discount";
    match customer {
        Customer::Id(c) => one(
            conn,
            &format!(
                "SELECT {columns} FROM customer WHERE c_w_id = {w} AND c_d_id = {d} AND c_id = {c}"
            ),
            transcript,
        ),
        Customer::Last(last) => {
            let found = rows(
                conn,
                &format!(
                    "SELECT {columns} FROM customer WHERE c_w_id = {w} AND c_d_id = {d} \
                     AND c_last = '{last}' ORDER BY c_first"
                ),
                transcript,
            )?;
            let middle = found.len().div_ceil(2);
            Ok(found.into_iter().nth(middle.saturating_sub(1)))
        }
    }
}

fn run_inside(conn: &mut Conn, t: &Transaction, transcript: &mut String) -> mysql::Result<Outcome> {
    match t {
        Transaction::NewOrder {
            w,
            d,
            c,
            lines,
            entry,
        } => {
            one(
                conn,
                &format!("SELECT w_tax FROM warehouse WHERE w_id = {w}"),
                transcript,
            )?;
            let district = one(
                conn,
                &format!(
                    "SELECT d_tax, d_next_o_id FROM district WHERE d_w_id = {w} AND d_id = {d} FOR UPDATE"
                ),
                transcript,
            )?
            .expect("every district is loaded");
            let o_id: u32 = district[1].parse().expect("an order id");
            conn.query_drop(format!(
                "UPDATE district SET d_next_o_id = d_next_o_id + 1 WHERE d_w_id = {w} AND d_id = {d}"
            ))?;
            one(
                conn,
                &format!(
                    "SELECT c_discount, c_last FROM customer WHERE c_w_id = {w} AND c_d_id = {d} AND c_id = {c}"
                ),
                transcript,
            )?;
            let all_local = u8::from(lines.iter().all(|&(_, supply, _)| supply == *w));
            conn.query_drop(format!(
                "INSERT INTO orders (o_w_id, o_d_id, o_id, o_c_id, o_entry_d, o_carrier_id, o_ol_cnt, o_all_local) \
                 VALUES ({w}, {d}, {o_id}, {c}, {entry}, NULL, {}, {all_local})",
                lines.len()
            ))?;
            conn.query_drop(format!(
                "INSERT INTO new_orders (no_w_id, no_d_id, no_o_id) VALUES ({w}, {d}, {o_id})"
            ))?;
            for (number, &(item, supply, quantity)) in (1..).zip(lines) {
                let Some(found) = one(
                    conn,
                    &format!("SELECT i_price, i_name FROM item WHERE i_id = {item}"),
                    transcript,
                )?
                else {
                    return Ok(Outcome::RolledBack);
                };
                let price: f64 = found[0].parse().expect("a price");
                let stock = one(
                    conn,
                    &format!(
                        "SELECT s_quantity FROM stock WHERE s_i_id = {item} AND s_w_id = {supply} FOR UPDATE"
                    ),
                    transcript,
                )?
                .expect("every item is stocked");
                let have: u32 = stock[0].parse().expect("a quantity");
                let left = match have >= quantity + 10 {
                    true => have - quantity,
                    false => have + 91 - quantity,
                };
                let remote = u8::from(supply != *w);
                conn.query_drop(format!(
                    "UPDATE stock SET s_quantity = {left}, s_ytd = s_ytd + {quantity}, \
                     s_order_cnt = s_order_cnt + 1, s_remote_cnt = s_remote_cnt + {remote} \
                     WHERE s_i_id = {item} AND s_w_id = {supply}"
                ))?;
                let amount = (price * f64::from(quantity) * 100.0).round() as u32;
                conn.query_drop(format!(
                    "INSERT INTO order_line (ol_w_id, ol_d_id, ol_o_id, ol_number, ol_i_id, \
                     ol_supply_w_id, ol_delivery_d, ol_quantity, ol_amount) \
                     VALUES ({w}, {d}, {o_id}, {number}, {item}, {supply}, NULL, {quantity}, {})",
                    cents(amount)
                ))?;
            }
            Ok(Outcome::Committed)
        }
        Transaction::Payment {
            w,
            d,
            c_w,
            c_d,
            customer,
            cents: amount,
            date,
        } => {
            let amount = cents(*amount);
            conn.query_drop(format!(
                "UPDATE warehouse SET w_ytd = w_ytd + {amount} WHERE w_id = {w}"
            ))?;
            one(
                conn,
                &format!("SELECT w_name FROM warehouse WHERE w_id = {w}"),
                transcript,
            )?;
            conn.query_drop(format!(
                "UPDATE district SET d_ytd = d_ytd + {amount} WHERE d_w_id = {w} AND d_id = {d}"
            ))?;
            let Some(found) = find_customer(conn, *c_w, *c_d, customer, transcript)? else {
                return Ok(Outcome::RolledBack);
            };
            let c = &found[0];
            conn.query_drop(format!(
                "UPDATE customer SET c_balance = c_balance - {amount}, \
                 c_ytd_payment = c_ytd_payment + {amount}, c_payment_cnt = c_payment_cnt + 1 \
                 WHERE c_w_id = {c_w} AND c_d_id = {c_d} AND c_id = {c}"
            ))?;
            conn.query_drop(format!(
                "INSERT INTO history (h_c_w_id, h_c_d_id, h_c_id, h_w_id, h_d_id, h_date, h_amount) \
                 VALUES ({c_w}, {c_d}, {c}, {w}, {d}, {date}, {amount})"
            ))?;
            Ok(Outcome::Committed)
        }
        Transaction::OrderStatus { w, d, customer } => {
            let Some(found) = find_customer(conn, *w, *d, customer, transcript)? else {
                return Ok(Outcome::Committed);
            };
            let c = &found[0];
            let last = one(
                conn,
                &format!(
                    "SELECT o_id, o_carrier_id, o_entry_d FROM orders \
                     WHERE o_w_id = {w} AND o_d_id = {d} AND o_c_id = {c} ORDER BY o_id DESC LIMIT 1"
                ),
                transcript,
            )?;
            if let Some(order) = last {
                rows(
                    conn,
                    &format!(
                        "SELECT ol_i_id, ol_supply_w_id, ol_quantity, ol_amount, ol_delivery_d \
                         FROM order_line WHERE ol_w_id = {w} AND ol_d_id = {d} AND ol_o_id = {} \
                         ORDER BY ol_number",
                        order[0]
                    ),
                    transcript,
                )?;
            }
            Ok(Outcome::Committed)
        }
        Transaction::Delivery { w, carrier, date } => {
            let districts: Vec<String> = rows(
                conn,
                &format!("SELECT d_id FROM district WHERE d_w_id = {w} ORDER BY d_id"),
                transcript,
            )?
            .into_iter()
            .map(|row| row[0].clone())
            .collect();
            for d in districts {
                let oldest = one(
                    conn,
                    &format!(
                        "SELECT MIN(no_o_id) FROM new_orders WHERE no_w_id = {w} AND no_d_id = {d}"
                    ),
                    transcript,
                )?;
                let Some(o) = oldest.map(|row| row[0].clone()).filter(|o| o != "NULL") else {
                    continue;
                };
                conn.query_drop(format!(
                    "DELETE FROM new_orders WHERE no_w_id = {w} AND no_d_id = {d} AND no_o_id = {o}"
                ))?;
                // Another delivery took it first.
                if conn.affected_rows() == 0 {
                    continue;
                }
                let customer = one(
                    conn,
                    &format!("SELECT o_c_id FROM orders WHERE o_w_id = {w} AND o_d_id = {d} AND o_id = {o}"),
                    transcript,
                )?
                .expect("a new order has its order");
                conn.query_drop(format!(
                    "UPDATE orders SET o_carrier_id = {carrier} WHERE o_w_id = {w} AND o_d_id = {d} AND o_id = {o}"
                ))?;
                conn.query_drop(format!(
                    "UPDATE order_line SET ol_delivery_d = {date} \
                     WHERE ol_w_id = {w} AND ol_d_id = {d} AND ol_o_id = {o}"
                ))?;
                let total = one(
                    conn,
                    &format!(
                        "SELECT SUM(ol_amount) FROM order_line WHERE ol_w_id = {w} AND ol_d_id = {d} AND ol_o_id = {o}"
                    ),
                    transcript,
                )?
                .expect("a sum");
                conn.query_drop(format!(
                    "UPDATE customer SET c_balance = c_balance + {}, c_delivery_cnt = c_delivery_cnt + 1 \
                     WHERE c_w_id = {w} AND c_d_id = {d} AND c_id = {}",
                    total[0], customer[0]
                ))?;
            }
            Ok(Outcome::Committed)
        }
        Transaction::StockLevel { w, d, threshold } => {
            let next = one(
                conn,
                &format!("SELECT d_next_o_id FROM district WHERE d_w_id = {w} AND d_id = {d}"),
                transcript,
            )?
            .expect("every district is loaded");
            let next: u32 = next[0].parse().expect("an order id");
            one(
                conn,
                &format!(
                    "SELECT COUNT(DISTINCT s_i_id) FROM order_line, stock WHERE ol_w_id = {w} \
                     AND ol_d_id = {d} AND ol_o_id < {next} AND ol_o_id >= {} AND s_w_id = {w} \
                     AND s_i_id = ol_i_id AND s_quantity < {threshold}",
                    next.saturating_sub(20)
                ),
                transcript,
            )?;
            Ok(Outcome::Committed)
        }
    }
}

/// The application's consistency checks (the balances, year-to-date sums,
/// order ids and order-line counts its transactions keep in step): a
/// name, a query, and how many of its leading columns name the row; every
/// column after them must hold the same value.
pub const CHECKS: &[(&str, &str, usize)] = &[
    (
        "a warehouse's year-to-date is its districts'",
        "SELECT w_id, w_ytd, (SELECT SUM(d_ytd) FROM district WHERE d_w_id = w_id) \
         FROM warehouse ORDER BY w_id",
        1,
    ),
    (
        "a district's next order follows its last order and last new order",
        "SELECT d_w_id, d_id, d_next_o_id - 1, \
         (SELECT MAX(o_id) FROM orders WHERE o_w_id = d_w_id AND o_d_id = d_id), \
         (SELECT COALESCE(MAX(no_o_id), d_next_o_id - 1) FROM new_orders \
          WHERE no_w_id = d_w_id AND no_d_id = d_id) \
         FROM district ORDER BY d_w_id, d_id",
        2,
    ),
    (
        "new orders have no gaps",
        "SELECT no_w_id, no_d_id, COUNT(*), MAX(no_o_id) - MIN(no_o_id) + 1 \
         FROM new_orders GROUP BY no_w_id, no_d_id ORDER BY no_w_id, no_d_id",
        2,
    ),
    (
        "an order's line count is its lines",
        "SELECT o_w_id, o_d_id, SUM(o_ol_cnt), \
         (SELECT COUNT(*) FROM order_line WHERE ol_w_id = o_w_id AND ol_d_id = o_d_id) \
         FROM orders GROUP BY o_w_id, o_d_id ORDER BY o_w_id, o_d_id",
        2,
    ),
    (
        "a customer's payments are its history",
        "SELECT c_w_id, c_d_id, c_id, c_ytd_payment, \
         (SELECT SUM(h_amount) FROM history WHERE h_c_w_id = c_w_id AND h_c_d_id = c_d_id AND h_c_id = c_id) \
         FROM customer ORDER BY c_w_id, c_d_id, c_id",
        3,
    ),
    (
        "a customer's balance and payments are its delivered order lines",
        "SELECT c_w_id, c_d_id, c_id, c_balance + c_ytd_payment, \
         (SELECT COALESCE(SUM(ol_amount), 0) FROM orders, order_line \
          WHERE o_w_id = c_w_id AND o_d_id = c_d_id AND o_c_id = c_id \
          AND ol_w_id = o_w_id AND ol_d_id = o_d_id AND ol_o_id = o_id \
          AND ol_delivery_d IS NOT NULL) \
         FROM customer ORDER BY c_w_id, c_d_id, c_id",
        3,
    ),
];

/// Each check's rows, as text.
pub fn check(conn: &mut Conn) -> mysql::Result<Vec<Vec<Vec<String>>>> {
    (0..CHECKS.len()).map(|n| check_one(conn, n)).collect()
}

/// The rows of check `n`, as text.
pub fn check_one(conn: &mut Conn, n: usize) -> mysql::Result<Vec<Vec<String>>> {
    rows(conn, CHECKS[n].1, &mut String::new())
}

/// The rows of `check`'s answers that break their rule.
pub fn violations(checked: &[Vec<Vec<String>>]) -> Vec<String> {
    let mut broken = Vec::new();
    for ((name, _, keys), rows) in CHECKS.iter().zip(checked) {
        for row in rows {
            let values = &row[*keys..];
            if values.iter().any(|v| !same_number(v, &values[0])) {
                broken.push(format!("{name}: {}", row.join(" ")));
            }
        }
    }
    broken
}

/// Equal as decimals (10.00 and 10 are the same payment), else as text.
fn same_number(a: &str, b: &str) -> bool {
    match (a.parse::<f64>(), b.parse::<f64>()) {
        (Ok(a), Ok(b)) => (a - b).abs() < 0.005,
        _ => a == b,
    }
}

/// Whether an error is one the application retries the transaction for:
/// a deadlock or a lock wait that timed out.
pub fn retried(e: &mysql::Error) -> bool {
    matches!(e, mysql::Error::MySqlError(e) if e.code == 1213 || e.code == 1205)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::{last_name, Scale};

    #[test]
    fn a_last_name_names_at_most_three_customers_of_a_district_at_every_scale() {
        for scale in [Scale::TEST, Scale::BENCH, Scale::STANDARD] {
            let mut customers: HashMap<String, u32> = HashMap::new();
            for c in 1..=scale.customers {
                *customers.entry(last_name(c)).or_default() += 1;
            }
            let most = customers.values().max().copied();
            assert!(
                most <= Some(3),
                "{scale:?}: {most:?} customers share a name"
            );
            assert!(customers.len() as u32 >= scale.customers / 3, "{scale:?}");
        }
    }
}
