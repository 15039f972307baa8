//! A bare protocol client for tests that must send what drivers never send:
//! unknown commands, COM_FIELD_LIST, COM_STATISTICS, malformed packets.

use hscale_wire::auth::native_scramble;
use hscale_wire::packets::{BackendHello, ServerGreeting};
use hscale_wire::scan::{Expect, Progress, ResponseScanner};
use hscale_wire::stream::PacketStream;
use hscale_wire::CapabilityFlags;
use tokio::net::TcpStream;

pub struct RawClient {
    pub stream: PacketStream<TcpStream>,
    /// The id the server greeted this connection with.
    pub connection_id: u32,
}

impl RawClient {
    /// Logs in as `user` with mysql_native_password.
    pub async fn login(port: u16, user: &str, password: &str, db: Option<&str>) -> RawClient {
        Self::login_with(port, user, password, db, CapabilityFlags::empty()).await
    }

    /// Logs in asking for `extra` capabilities as well.
    pub async fn login_with(
        port: u16,
        user: &str,
        password: &str,
        db: Option<&str>,
        extra: CapabilityFlags,
    ) -> RawClient {
        let socket = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        let mut stream = PacketStream::new(socket, 1 << 30);
        let greeting = stream.read_packet().await.unwrap().expect("greeting");
        let server = ServerGreeting::parse(&greeting.payload).expect("greeting parses");
        let answer = native_scramble(&server.nonce, password);
        let mut capabilities = CapabilityFlags::CLIENT_PROTOCOL_41
            | CapabilityFlags::CLIENT_SECURE_CONNECTION
            | CapabilityFlags::CLIENT_PLUGIN_AUTH
            | CapabilityFlags::CLIENT_LONG_PASSWORD
            | extra;
        if db.is_some() {
            capabilities |= CapabilityFlags::CLIENT_CONNECT_WITH_DB;
        }
        let mut hello = Vec::new();
        BackendHello {
            capabilities,
            collation: 45,
            user,
            auth_response: &answer,
            database: db,
            auth_plugin: "mysql_native_password",
        }
        .write(&mut hello);
        stream.send_packet(1, &hello).await.unwrap();
        let ok = stream.read_packet().await.unwrap().expect("login answer");
        assert_eq!(
            ok.payload[0],
            0,
            "login failed: {:?}",
            String::from_utf8_lossy(&ok.payload)
        );
        RawClient {
            stream,
            connection_id: server.connection_id,
        }
    }

    /// Everything the server sends until it closes the connection, within 10 s.
    pub async fn read_to_close(&mut self) -> Vec<u8> {
        let mut rest = Vec::new();
        let until_closed = async {
            loop {
                rest.extend_from_slice(self.stream.buffered());
                let n = self.stream.buffered().len();
                self.stream.consume(n);
                match self.stream.fill().await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), until_closed)
            .await
            .expect("the server closes the connection");
        rest
    }

    /// Sends a query and returns the whole answer as raw bytes, frames included.
    pub async fn query_bytes(&mut self, sql: &str, deprecate_eof: bool) -> Vec<u8> {
        let mut payload = vec![0x03];
        payload.extend_from_slice(sql.as_bytes());
        self.command_bytes(&payload, Expect::ResultSets, deprecate_eof)
            .await
    }

    /// Sends a command and returns the whole answer as raw bytes, frames included.
    pub async fn command_bytes(
        &mut self,
        payload: &[u8],
        expect: Expect,
        deprecate_eof: bool,
    ) -> Vec<u8> {
        self.stream.send_packet(0, payload).await.unwrap();
        let mut scanner = ResponseScanner::new(expect, deprecate_eof);
        let mut answer = Vec::new();
        loop {
            let progress = scanner.scan(self.stream.buffered()).unwrap();
            let (n, done) = match progress {
                Progress::More(n) => (n, false),
                Progress::Done(n, _) => (n, true),
                Progress::LocalInfile(_) => panic!("unexpected LOCAL INFILE request"),
                Progress::Column { .. } => unreachable!("this scanner passes columns"),
            };
            answer.extend_from_slice(&self.stream.buffered()[..n]);
            self.stream.consume(n);
            if done {
                return answer;
            }
            assert!(
                self.stream.fill().await.unwrap() > 0,
                "server closed mid-answer"
            );
        }
    }

    /// Sends one command and returns the payloads of the answer up to `packets`.
    pub async fn command(&mut self, payload: &[u8], packets: usize) -> Vec<Vec<u8>> {
        self.stream.send_packet(0, payload).await.unwrap();
        let mut answer = Vec::new();
        for _ in 0..packets {
            let p = self.stream.read_packet().await.unwrap().expect("answer");
            answer.push(p.payload.to_vec());
        }
        answer
    }
}

/// The payloads of whole frames.
pub fn payloads(mut frames: &[u8]) -> Vec<Vec<u8>> {
    let mut payloads = Vec::new();
    while frames.len() >= 4 {
        let len =
            usize::from(frames[0]) | usize::from(frames[1]) << 8 | usize::from(frames[2]) << 16;
        payloads.push(frames[4..4 + len].to_vec());
        frames = &frames[4 + len..];
    }
    payloads
}

/// What a query answered, as a client reads it: comparable across servers
/// (column metadata left out, which names different tables).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Ok { affected_rows: u64 },
    Error { code: u16 },
    Rows(Vec<Vec<Option<String>>>),
}

/// Reads the frames of one text-protocol answer; `deprecate_eof` as the
/// connection's capabilities say.
pub fn answer(frames: &[u8], deprecate_eof: bool) -> Answer {
    let packets = payloads(frames);
    let first = &packets[0];
    match first[0] {
        0x00 => {
            let (affected_rows, _) = lenenc_int(&first[1..]);
            return Answer::Ok { affected_rows };
        }
        0xff => {
            return Answer::Error {
                code: u16::from_le_bytes([first[1], first[2]]),
            }
        }
        _ => {}
    }
    let (columns, _) = lenenc_int(first);
    // Column definitions, then (without DEPRECATE_EOF) an EOF packet.
    let skip = 1 + columns as usize + usize::from(!deprecate_eof);
    let mut rows = Vec::new();
    for packet in &packets[skip..] {
        if packet[0] == 0xfe && packet.len() < 0xff_ffff {
            break;
        }
        let mut row = Vec::new();
        let mut at = &packet[..];
        for _ in 0..columns {
            if at[0] == 0xfb {
                row.push(None);
                at = &at[1..];
                continue;
            }
            let (len, used) = lenenc_int(at);
            let end = used + len as usize;
            row.push(Some(String::from_utf8_lossy(&at[used..end]).into_owned()));
            at = &at[end..];
        }
        rows.push(row);
    }
    Answer::Rows(rows)
}

/// A length-encoded integer and the bytes it took.
fn lenenc_int(bytes: &[u8]) -> (u64, usize) {
    let wide = |n: usize| {
        let mut value = 0u64;
        for (i, b) in bytes[1..=n].iter().enumerate() {
            value |= u64::from(*b) << (8 * i);
        }
        (value, n + 1)
    };
    match bytes[0] {
        0xfc => wide(2),
        0xfd => wide(3),
        0xfe => wide(8),
        b => (u64::from(b), 1),
    }
}
