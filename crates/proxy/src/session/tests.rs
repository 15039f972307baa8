//! The session's rules, unit-tested against scripted backends: each backend
//! is a task on a unix socket that greets, takes any login, answers every
//! statement as its script says (an OK by default) with the transaction
//! status a server would give, and writes down what it was sent. The
//! handlers under test are the ones the command loop calls, over a real
//! `Client` socket, `Backends` and pools: the seam is the backend's socket,
//! so nothing in the request path runs differently for a test. What hscale
//! does against real servers is tested on MariaDB (crates/proxy/tests).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use hscale_planner::dictionary::{PartitionEntry, PartitionState, TableDefinition};
use hscale_planner::{
    ClientCharset, ColumnKind, Dictionary, HashFunction, PartitionedTable, TableName,
};
use hscale_wire::packets::{ErrorPacket, Greeting, OkInfo, ERR_HEADER, OK_HEADER};
use hscale_wire::stream::PacketStream;
use hscale_wire::{CapabilityFlags, StatusFlags};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use super::client::Client;
use super::{Backends, Memo};
use crate::backend::ConnKey;
use crate::config::Config;
use crate::shared::Shared;
use crate::tls::ClientStream;

/// What a scripted backend answers to a statement that starts with a
/// given text.
#[derive(Clone)]
enum Answer {
    Ok { affected_rows: u64 },
    Error { code: u16, message: &'static str },
}

/// What the scripted backends were sent, in the order they read it:
/// (backend id, statement).
type Timeline = Arc<Mutex<Vec<(u32, String)>>>;

/// One scripted backend: its socket, what it was sent (each statement of
/// a query on its own, in order) and its script.
struct ScriptedBackend {
    id: u32,
    path: PathBuf,
    timeline: Timeline,
    script: Arc<Mutex<Vec<(String, Answer)>>>,
}

static NEXT_SOCKET: AtomicU32 = AtomicU32::new(0);

impl ScriptedBackend {
    fn start(id: u32, timeline: &Timeline) -> ScriptedBackend {
        let path = std::env::temp_dir().join(format!(
            "hscale-scripted-{}-{}.sock",
            std::process::id(),
            NEXT_SOCKET.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).expect("a socket in the temporary directory");
        let backend = ScriptedBackend {
            id,
            path,
            timeline: timeline.clone(),
            script: Arc::default(),
        };
        let (timeline, script) = (backend.timeline.clone(), backend.script.clone());
        tokio::spawn(async move {
            let mut thread_id = 100;
            while let Ok((socket, _)) = listener.accept().await {
                thread_id += 1;
                let sent = Sent {
                    id,
                    timeline: timeline.clone(),
                };
                tokio::spawn(serve(socket, thread_id, sent, script.clone()));
            }
        });
        backend
    }

    /// Statements starting with `prefix` (any case) get `answer`.
    fn answer(&self, prefix: &str, answer: Answer) {
        self.script
            .lock()
            .unwrap()
            .push((prefix.to_ascii_uppercase(), answer));
    }

    /// What the backend was sent since the last call.
    fn take_sent(&self) -> Vec<String> {
        let mut timeline = self.timeline.lock().unwrap();
        let (mine, others) = std::mem::take(&mut *timeline)
            .into_iter()
            .partition(|(id, _)| *id == self.id);
        *timeline = others;
        mine.into_iter().map(|(_, statement)| statement).collect()
    }
}

impl Drop for ScriptedBackend {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Where one backend writes down what it read.
struct Sent {
    id: u32,
    timeline: Timeline,
}

async fn serve(
    socket: UnixStream,
    thread_id: u32,
    sent: Sent,
    script: Arc<Mutex<Vec<(String, Answer)>>>,
) {
    let mut connection = Scripted {
        stream: PacketStream::new(socket, 1 << 24),
        sent,
        script,
        in_transaction: false,
    };
    if connection.log_in(thread_id).await.is_none() {
        return;
    }
    while let Ok(Some(packet)) = connection.stream.read_packet().await {
        let (command, body) = packet.payload.split_first().unwrap_or((&0, &[]));
        let answered = match *command {
            hscale_wire::command::QUIT => return,
            hscale_wire::command::QUERY => connection.answer_query(body).await,
            _ => connection.send_ok(1, 0, false).await.map(drop),
        };
        if answered.is_none() {
            return;
        }
    }
}

/// One connection to a scripted backend.
struct Scripted {
    stream: PacketStream<UnixStream>,
    sent: Sent,
    script: Arc<Mutex<Vec<(String, Answer)>>>,
    in_transaction: bool,
}

impl Scripted {
    /// The greeting, any login, its OK; `None` once the peer is gone.
    async fn log_in(&mut self, thread_id: u32) -> Option<()> {
        let offered = CapabilityFlags::CLIENT_PROTOCOL_41
            | CapabilityFlags::CLIENT_LONG_PASSWORD
            | CapabilityFlags::CLIENT_LONG_FLAG
            | CapabilityFlags::CLIENT_TRANSACTIONS
            | CapabilityFlags::CLIENT_SECURE_CONNECTION
            | CapabilityFlags::CLIENT_PLUGIN_AUTH
            | CapabilityFlags::CLIENT_MULTI_STATEMENTS
            | CapabilityFlags::CLIENT_MULTI_RESULTS;
        let mut greeting = Vec::new();
        Greeting {
            server_version: "11.0.0-scripted",
            connection_id: thread_id,
            nonce: &[7; 20],
            capabilities: offered,
            collation: 45,
            status: StatusFlags::SERVER_STATUS_AUTOCOMMIT,
            auth_plugin: "mysql_native_password",
        }
        .write(&mut greeting);
        self.stream.send_packet(0, &greeting).await.ok()?;
        let hello = self.stream.read_packet().await.ok()??;
        self.send_ok(hello.seq + 1, 0, false).await.map(drop)
    }

    /// Each statement of the query, as the script says, in turn: an error
    /// ends the query, as a server's does.
    async fn answer_query(&mut self, body: &[u8]) -> Option<()> {
        let text = String::from_utf8_lossy(body).into_owned();
        let statements: Vec<&str> = text
            .split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        let mut seq = 1;
        for (i, statement) in statements.iter().enumerate() {
            let timeline = &self.sent.timeline;
            timeline
                .lock()
                .unwrap()
                .push((self.sent.id, statement.to_string()));
            let upper = statement.to_ascii_uppercase();
            let scripted = self
                .script
                .lock()
                .unwrap()
                .iter()
                .find(|(prefix, _)| upper.starts_with(prefix.as_str()))
                .map(|(_, answer)| answer.clone());
            match scripted.unwrap_or(Answer::Ok { affected_rows: 0 }) {
                Answer::Error { code, message } => {
                    let mut payload = Vec::new();
                    ErrorPacket::new(code, "HY000", message).write(&mut payload);
                    self.stream.send_packet(seq, &payload).await.ok()?;
                    return Some(());
                }
                Answer::Ok { affected_rows } => {
                    self.in_transaction = transaction_after(&upper, self.in_transaction);
                    let more = i + 1 < statements.len();
                    seq = self.send_ok(seq, affected_rows, more).await?;
                }
            }
        }
        Some(())
    }

    /// An OK with the connection's transaction status; the next sequence
    /// number.
    async fn send_ok(&mut self, seq: u8, affected_rows: u64, more: bool) -> Option<u8> {
        let mut status = StatusFlags::SERVER_STATUS_AUTOCOMMIT;
        if self.in_transaction {
            status |= StatusFlags::SERVER_STATUS_IN_TRANS;
        }
        if more {
            status |= StatusFlags::SERVER_MORE_RESULTS_EXISTS;
        }
        let mut payload = Vec::new();
        OkInfo {
            affected_rows,
            status: status.bits(),
            ..Default::default()
        }
        .write(OK_HEADER, &mut payload);
        self.stream.send_packet(seq, &payload).await.ok()
    }
}

/// Whether a connection is in a transaction after `statement` (upper
/// case), as a server's status says it.
fn transaction_after(statement: &str, before: bool) -> bool {
    let starts = |prefixes: &[&str]| prefixes.iter().any(|p| statement.starts_with(p));
    if starts(&["BEGIN", "START TRANSACTION", "XA START"]) {
        return true;
    }
    if starts(&[
        "COMMIT",
        "ROLLBACK",
        "XA PREPARE",
        "XA COMMIT",
        "XA ROLLBACK",
    ]) {
        return false;
    }
    before
}

/// A session's parts over scripted backends 1 (main) and 2, and the
/// client's end of its socket.
struct Harness {
    backends_seen: Vec<ScriptedBackend>,
    timeline: Timeline,
    shared: Arc<Shared>,
    client: Client,
    memo: Memo,
    backends: Backends,
    peer: PacketStream<TcpStream>,
}

impl Harness {
    async fn start() -> Harness {
        let timeline = Timeline::default();
        let scripted = vec![
            ScriptedBackend::start(1, &timeline),
            ScriptedBackend::start(2, &timeline),
        ];
        let config = Config::parse(&format!(
            r#"
[proxy]
listen = "127.0.0.1:0"

[[users]]
name = "app"
password = "secret"

[[backends]]
id = 1
address = "{}"
user = "root"
password = ""

[[backends]]
id = 2
address = "{}"
user = "root"
password = ""

[dictionary]
backend = 1
"#,
            scripted[0].path.display(),
            scripted[1].path.display()
        ))
        .expect("a valid configuration");
        let shared = Arc::new(Shared::new(&config));
        shared.dictionary.serve_for_test(orders_by_user());
        crate::xa::use_key_for_test(&shared, [9; 32]);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let reached = listener.local_addr().unwrap();
        let (peer, accepted) = tokio::join!(TcpStream::connect(reached), listener.accept());
        let (socket, _) = accepted.unwrap();
        // A driver's defaults: no multi-statements, EOF packets.
        let capabilities = CapabilityFlags::CLIENT_PROTOCOL_41
            | CapabilityFlags::CLIENT_TRANSACTIONS
            | CapabilityFlags::CLIENT_SECURE_CONNECTION
            | CapabilityFlags::CLIENT_PLUGIN_AUTH;
        let connection_id = shared.next_connection_id();
        let client = Client {
            stream: PacketStream::new(ClientStream::new(socket), 1 << 24),
            connection_id,
            reached,
            user: "app".into(),
            admin: false,
            capabilities,
            collation: 45,
            nonce: [0; 20],
            charset: ClientCharset::of_collation(45),
            reply_seq: 1,
            stays: false,
            column_names: Default::default(),
        };
        let key = ConnKey::for_client(capabilities, 45, false, shared.accounts.of_user("app"));
        let handle = shared.sessions.register(connection_id, "app");
        let backends = Backends::new(shared.clone(), handle, key);
        Harness {
            backends_seen: scripted,
            timeline,
            shared,
            client,
            memo: Memo::default(),
            backends,
            peer: PacketStream::new(peer.unwrap(), 1 << 24),
        }
    }

    /// Runs `sql` as the client's COM_QUERY and returns the first packet
    /// of its answer.
    async fn query(&mut self, sql: &str) -> Vec<u8> {
        self.client.reply_seq = 1;
        let payload = Bytes::from(hscale_wire::command::query(sql));
        if let Err(e) = super::run::query(
            &self.shared,
            &mut self.client,
            &mut self.memo,
            &mut self.backends,
            payload,
        )
        .await
        {
            self.client.reply_error(&e, 1).await.unwrap();
        }
        self.client.flush().await.unwrap();
        let packet = self.peer.read_packet().await.unwrap().expect("an answer");
        packet.payload.to_vec()
    }

    /// BEGIN, then a write on each backend (backend 1's first): what each
    /// backend was sent.
    async fn write_on_both_backends(&mut self) -> (Vec<String>, Vec<String>) {
        ok_of(&self.query("BEGIN").await);
        ok_of(
            &self
                .query("UPDATE app.orders SET n = 1 WHERE user_id = 2")
                .await,
        );
        ok_of(
            &self
                .query("UPDATE app.orders SET n = 1 WHERE user_id = 1")
                .await,
        );
        (self.sent(1), self.sent(2))
    }

    /// What backend `id` was sent since the last call, but hscale's
    /// question whether the account may write two-phase commit decisions
    /// there (`xa::may_record`).
    fn sent(&self, id: usize) -> Vec<String> {
        let mut sent = self.backends_seen[id - 1].take_sent();
        sent.retain(|s| !is_decision_probe(s));
        sent
    }
}

/// `app.orders` by MOD(2) of user_id: user 2's rows on backend 1 (the
/// default table), user 1's on backend 2.
fn orders_by_user() -> Dictionary {
    let table = PartitionedTable::new(
        TableDefinition {
            table: TableName {
                db: "app".into(),
                name: "orders".into(),
            },
            column: "user_id".into(),
            column_position: 1,
            kind: ColumnKind::Integer,
            function: HashFunction::Mod(2),
            default_table: "orders_default".into(),
            default_backend: 1,
            auto_column: None,
            folding: Default::default(),
        },
        vec![PartitionEntry {
            name: "p1".into(),
            value: "1".into(),
            backend: 2,
            state: PartitionState::Active,
        }],
    );
    Dictionary::new(1, vec![table])
}

fn is_decision_probe(statement: &str) -> bool {
    statement.contains("xa_decisions") && statement.ends_with("WHERE FALSE")
}

fn ok_of(answer: &[u8]) -> OkInfo {
    assert_eq!(answer[0], OK_HEADER, "an OK, not {answer:?}");
    OkInfo::parse(answer).expect("a readable OK")
}

fn in_transaction(ok: &OkInfo) -> bool {
    StatusFlags::from_bits_truncate(ok.status).contains(StatusFlags::SERVER_STATUS_IN_TRANS)
}

#[tokio::test]
async fn a_statement_on_no_partitioned_table_runs_on_the_main_backend_as_sent() {
    let mut h = Harness::start().await;
    h.backends_seen[0].answer("UPDATE", Answer::Ok { affected_rows: 3 });
    let ok = ok_of(&h.query("UPDATE app.customers SET name = 'x'").await);
    assert_eq!(ok.affected_rows, 3, "the main backend's own OK");
    assert_eq!(h.sent(1), ["UPDATE app.customers SET name = 'x'"]);
    assert!(h.sent(2).is_empty());
    // Outside a transaction, nothing binds the connection to the session.
    assert!(h.backends.slots.iter().all(|slot| slot.held.is_none()));
}

#[tokio::test]
async fn a_backend_error_reaches_the_client_with_its_code() {
    let mut h = Harness::start().await;
    h.backends_seen[0].answer(
        "INSERT",
        Answer::Error {
            code: 1062,
            message: "Duplicate entry '1' for key 'PRIMARY'",
        },
    );
    let answer = h.query("INSERT INTO app.customers VALUES (1)").await;
    assert_eq!(answer[0], ERR_HEADER);
    let error = ErrorPacket::parse(&answer).unwrap();
    assert_eq!(error.code, 1062);
}

#[tokio::test]
async fn a_set_of_a_variable_hscale_follows_is_read_back_and_others_are_not() {
    let mut h = Harness::start().await;
    ok_of(&h.query("SET @a = 1").await);
    assert!(!h.backends.session_variables_changed);
    ok_of(&h.query("SET wait_timeout = 5").await);
    assert!(
        h.backends.session_variables_changed,
        "the server's value is read before the next command"
    );
    assert_eq!(h.sent(1), ["SET @a = 1", "SET wait_timeout = 5"]);
}

#[tokio::test]
async fn begin_is_answered_by_hscale_and_goes_with_the_first_statement() {
    let mut h = Harness::start().await;
    let begun = ok_of(&h.query("BEGIN").await);
    assert!(in_transaction(&begun));
    assert!(
        h.sent(1).is_empty() && h.sent(2).is_empty(),
        "no round trip"
    );
    ok_of(&h.query("UPDATE app.customers SET name = 'x'").await);
    assert_eq!(h.sent(1), ["BEGIN", "UPDATE app.customers SET name = 'x'"]);
    // The transaction keeps its connection.
    assert!(h.backends.slots[0].held.is_some());
    let committed = ok_of(&h.query("COMMIT").await);
    assert!(!in_transaction(&committed));
    assert_eq!(h.sent(1), ["COMMIT"]);
    assert!(h.sent(2).is_empty());
}

#[tokio::test]
async fn a_commit_of_a_transaction_that_reached_no_backend_sends_nothing() {
    let mut h = Harness::start().await;
    ok_of(&h.query("BEGIN").await);
    let ok = ok_of(&h.query("COMMIT").await);
    assert!(!in_transaction(&ok));
    assert!(h.sent(1).is_empty() && h.sent(2).is_empty());
}

#[tokio::test]
async fn a_statement_is_routed_to_the_backend_of_its_partition() {
    let mut h = Harness::start().await;
    ok_of(
        &h.query("UPDATE app.orders SET n = 1 WHERE user_id = 1")
            .await,
    );
    assert_eq!(
        h.sent(2),
        ["UPDATE app.`orders_p1` AS `orders` SET n = 1 WHERE user_id = 1"]
    );
    assert!(h.sent(1).is_empty());
}

#[tokio::test]
async fn a_transaction_over_two_backends_commits_in_two_phases() {
    let mut h = Harness::start().await;
    let (first, second) = h.write_on_both_backends().await;
    assert_eq!(first[0], "BEGIN", "the first backend reached: a plain part");
    assert!(
        second[0].starts_with("XA START"),
        "another: a branch, {second:?}"
    );
    ok_of(&h.query("COMMIT").await);
    let timeline = std::mem::take(&mut *h.timeline.lock().unwrap());
    let at = |backend: u32, starts: &str| {
        timeline
            .iter()
            .position(|(id, s)| *id == backend && s.starts_with(starts))
            .unwrap_or_else(|| panic!("no {starts} on backend {backend}: {timeline:?}"))
    };
    // The branch is prepared, then the decision written in the plain part
    // as it commits, then the branch committed.
    assert!(at(2, "XA END") < at(2, "XA PREPARE"));
    assert!(at(2, "XA PREPARE") < at(1, "INSERT INTO `hscale`.xa_decisions"));
    assert_eq!(
        at(1, "INSERT INTO `hscale`.xa_decisions") + 1,
        at(1, "COMMIT")
    );
    assert!(at(1, "COMMIT") < at(2, "XA COMMIT"));
    assert_eq!(timeline.len(), 5, "nothing else: {timeline:?}");
}

#[tokio::test]
async fn a_rollback_over_two_backends_rolls_back_each_part_and_writes_no_decision() {
    let mut h = Harness::start().await;
    h.write_on_both_backends().await;
    ok_of(&h.query("ROLLBACK").await);
    let (first, second) = (h.sent(1), h.sent(2));
    assert_eq!(first, ["ROLLBACK"]);
    assert!(
        second.last().unwrap().starts_with("XA ROLLBACK"),
        "{second:?}"
    );
    assert!(!first
        .iter()
        .chain(&second)
        .any(|s| s.contains("xa_decisions")));
}

#[tokio::test]
async fn whether_an_account_may_write_decisions_is_asked_once_per_backend() {
    let mut h = Harness::start().await;
    ok_of(&h.query("UPDATE app.customers SET name = 'x'").await);
    ok_of(&h.query("UPDATE app.customers SET name = 'y'").await);
    let sent = h.backends_seen[0].take_sent();
    assert_eq!(sent.iter().filter(|s| is_decision_probe(s)).count(), 1);
    assert!(
        is_decision_probe(&sent[0]),
        "before the first statement: {sent:?}"
    );
}

#[tokio::test]
async fn a_branch_that_cannot_prepare_rolls_the_whole_transaction_back() {
    let mut h = Harness::start().await;
    h.backends_seen[1].answer(
        "XA PREPARE",
        Answer::Error {
            code: 1614,
            message: "Transaction branch was rolled back: deadlock was detected",
        },
    );
    h.write_on_both_backends().await;
    let answer = h.query("COMMIT").await;
    assert_eq!(answer[0], ERR_HEADER, "the client learns its COMMIT failed");
    let first = h.sent(1);
    assert_eq!(
        first,
        ["ROLLBACK"],
        "no decision, the plain part rolled back"
    );
    assert!(!h.backends.tx.in_transaction());
}
