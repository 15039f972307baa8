//! Replica sets of MariaDB servers of a test's own, as docs/replicas.md sets
//! them up: GTID replication from the first server, semi-synchronous
//! (AFTER_SYNC), every replica read-only and logging what it applies.

use std::path::PathBuf;

use hscale::config::BackendConfig;
use hscale::mariadb::LocalServer;
use mysql::prelude::Queryable;
use mysql::Conn;

pub struct ReplicaSet {
    pub servers: Vec<LocalServer>,
    dir: PathBuf,
}

impl ReplicaSet {
    /// `count` servers in the scratch folder `name`, the first the primary,
    /// the others replicating from it.
    pub fn start(name: &str, count: usize) -> ReplicaSet {
        let dir = crate::scratch(name);
        let template = dir.join("template");
        if !template.exists() {
            hscale::mariadb::install_datadir(&template).expect("mariadb-install-db");
        }
        let servers = (0..count)
            .map(|i| {
                let server_dir = dir.join(format!("server{i}"));
                let _ = std::fs::remove_dir_all(&server_dir);
                std::fs::create_dir_all(&server_dir).expect("server dir");
                LocalServer::start(&server_dir, &template).expect("a server of the set")
            })
            .collect();
        let set = ReplicaSet { servers, dir };
        for host in 0..count {
            let mut conn = set.direct(host, None);
            conn.query_drop(
                "SET GLOBAL rpl_semi_sync_master_enabled = ON, \
                 rpl_semi_sync_slave_enabled = ON, \
                 rpl_semi_sync_master_wait_point = 'AFTER_SYNC', \
                 rpl_semi_sync_master_timeout = 2000",
            )
            .unwrap();
        }
        for replica in 1..count {
            set.set_read_only(replica, true);
            set.replicate(replica, 0);
        }
        set
    }

    pub fn address(&self, host: usize) -> String {
        format!("127.0.0.1:{}", self.servers[host].port)
    }

    /// A root client of one host, bypassing hscale.
    pub fn direct(&self, host: usize, db: Option<&str>) -> Conn {
        crate::connect(self.servers[host].port, "root", "", db)
    }

    pub fn set_read_only(&self, host: usize, read_only: bool) {
        let mut conn = self.direct(host, None);
        // It waits for the server's open statements and commits, not longer.
        conn.query_drop("SET SESSION lock_wait_timeout = 30")
            .unwrap();
        conn.query_drop(format!("SET GLOBAL read_only = {}", u8::from(read_only)))
            .unwrap();
    }

    /// `replica` replicates from `source`, from where its GTID position says.
    pub fn replicate(&self, replica: usize, source: usize) {
        let mut conn = self.direct(replica, None);
        conn.query_drop("STOP SLAVE").unwrap();
        conn.query_drop(format!(
            "CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {}, \
             MASTER_USER = 'root', MASTER_PASSWORD = '', \
             MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1",
            self.servers[source].port
        ))
        .unwrap();
        conn.query_drop("START SLAVE").unwrap();
    }

    /// Waits until `replica` applied everything `source` has logged.
    pub fn catch_up(&self, replica: usize, source: usize) {
        let position: String = self
            .direct(source, None)
            .query_first("SELECT @@global.gtid_binlog_pos")
            .unwrap()
            .unwrap();
        let waited: i64 = self
            .direct(replica, None)
            .query_first(format!("SELECT MASTER_GTID_WAIT('{position}', 30)"))
            .unwrap()
            .unwrap();
        assert_eq!(waited, 0, "host {replica} did not reach {position} in 30 s");
    }

    /// `host` stops replicating and takes writes, as a failover tool
    /// promotes a replica that caught up.
    pub fn promote(&self, host: usize) {
        let mut conn = self.direct(host, None);
        conn.query_drop("STOP SLAVE").unwrap();
        conn.query_drop("RESET SLAVE ALL").unwrap();
        conn.query_drop("SET GLOBAL read_only = 0").unwrap();
    }

    /// The `[[backends]]` entry of this set: the first server the
    /// configured primary, the others its replicas.
    pub fn backend(&self, id: u32) -> BackendConfig {
        let mut backend = BackendConfig::root_at(id, self.address(0));
        backend.replicas = (1..self.servers.len()).map(|h| self.address(h)).collect();
        backend
    }

    /// A MariaDB account with every grant on `db` and no other (no SUPER:
    /// read_only refuses its writes), created on the primary and replicated.
    pub fn account(&self, name: &str, password: &str, db: &str) {
        let mut root = self.direct(0, None);
        for host in ["localhost", "127.0.0.1"] {
            let account = format!("'{name}'@'{host}'");
            root.query_drop(format!("CREATE USER {account} IDENTIFIED BY '{password}'"))
                .unwrap();
            root.query_drop(format!("GRANT ALL ON `{db}`.* TO {account}"))
                .unwrap();
        }
        for replica in 1..self.servers.len() {
            self.catch_up(replica, 0);
        }
    }
}

impl Drop for ReplicaSet {
    fn drop(&mut self) {
        for server in &mut self.servers {
            server.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
