//! A private `redis-server` for one test: loopback only, a free port, no persistence, its own
//! temporary directory; killed when dropped (and by a watchdog if the test process dies first).
//!
//! Include it with `#[path = "support/redis_server.rs"] mod redis_server;`.

#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A running server; dropping it kills the process and removes its directory.
pub struct RedisServer {
    child: Child,
    watchdog: Option<Child>,
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a server, or `None` (with a message) if `redis-server` is not installed. Under CI
    /// (`CI` set) a missing server is a failure, not a skip: `scripts/test.sh` installs it.
    pub fn start() -> Option<RedisServer> {
        if !installed() {
            assert!(
                std::env::var_os("CI").is_none(),
                "redis-server is not installed; scripts/install-deps.sh installs it"
            );
            eprintln!(
                "SKIPPED: redis-server not found on PATH (run `bash scripts/install-deps.sh`)"
            );
            return None;
        }
        // A port found free can be taken by someone else before the server binds it: retry.
        Some(RedisServer::start_with(&[], free_port))
    }

    /// [`RedisServer::start`] with extra arguments (e.g. `["--enable-protected-configs",
    /// "yes"]`).
    #[allow(dead_code)] // not every test binary that includes this file uses it
    pub fn start_with_args(extra: &[&str]) -> Option<RedisServer> {
        let _skip_or_fail = RedisServer::start()?;
        drop(_skip_or_fail);
        Some(RedisServer::start_with(extra, free_port))
    }

    /// Starts a server with extra arguments on a port from `pick_port`, retrying on a lost
    /// race for the port. Panics if it cannot.
    fn start_with(extra: &[&str], pick_port: fn() -> u16) -> RedisServer {
        let mut last_error = String::new();
        for _ in 0..5 {
            match RedisServer::try_start(extra, pick_port()) {
                Ok(server) => return server,
                Err(e) => last_error = e,
            }
        }
        panic!("could not start redis-server: {last_error}");
    }

    fn try_start(extra: &[&str], port: u16) -> Result<RedisServer, String> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!(
            "tollgate-redis-{}-{port}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let child = spawn_server(port, &dir, &extra)?;
        let mut server = RedisServer {
            child,
            watchdog: None,
            port,
            dir,
            extra,
        };
        server.watchdog = spawn_watchdog(server.child.id());
        server.wait_ready()?;
        Ok(server)
    }

    /// Kills the server if it still runs (SIGKILL) and starts a new one on the same port and
    /// directory, with empty data (nothing is persisted). Panics if it cannot.
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(watchdog) = &mut self.watchdog {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match spawn_server(self.port, &self.dir, &self.extra) {
                Ok(child) => {
                    self.child = child;
                    self.watchdog = spawn_watchdog(self.child.id());
                    match self.wait_ready() {
                        Ok(()) => return,
                        // The port may still be held for a moment: try again.
                        Err(e) if Instant::now() < deadline => {
                            eprintln!("restart: {e}; retrying");
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        Err(e) => panic!("could not restart redis-server: {e}"),
                    }
                }
                Err(e) => panic!("could not restart redis-server: {e}"),
            }
        }
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let port = self.port;
        let server = self;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                let log = std::fs::read_to_string(server.dir.join("redis.log")).unwrap_or_default();
                return Err(format!("redis-server exited ({status}): {log}"));
            }
            if ping(port) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err("redis-server did not answer PING within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id (for fault tests: `kill -STOP`, `kill -9`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (e.g. "STOP", "CONT", "KILL") to the server.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} failed");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(watchdog) = &mut self.watchdog {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn spawn_server(port: u16, dir: &PathBuf, extra: &[String]) -> Result<Child, String> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("redis.log"))
        .map_err(|e| e.to_string())?;
    Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .args(["--daemonize", "no", "--protected-mode", "yes"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .spawn()
        .map_err(|e| e.to_string())
}

/// A Redis Cluster of `masters` masters (no replicas) on loopback, each a [`RedisServer`];
/// created with `redis-cli --cluster create`. Dropping it kills every node.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts the cluster and waits until every node reports `cluster_state:ok`; `None` (with a
    /// message) if `redis-server` or `redis-cli` is missing, as for [`RedisServer::start`].
    pub fn start(masters: usize) -> Option<RedisCluster> {
        RedisCluster::start_with(masters, &[])
    }

    /// [`RedisCluster::start`] with extra arguments for every node (e.g.
    /// `["--cluster-require-full-coverage", "no"]`).
    pub fn start_with(masters: usize, extra: &[&str]) -> Option<RedisCluster> {
        RedisCluster::start_replicated(masters, 0, extra)
    }

    /// [`RedisCluster::start_with`] with `replicas` replicas of each master (the nodes are
    /// `masters × (1 + replicas)`; which are masters, `CLUSTER SLOTS` tells).
    pub fn start_replicated(
        masters: usize,
        replicas: usize,
        extra: &[&str],
    ) -> Option<RedisCluster> {
        if !installed() || !cli_installed() {
            assert!(
                std::env::var_os("CI").is_none(),
                "redis-server / redis-cli are not installed; scripts/install-deps.sh installs them"
            );
            eprintln!(
                "SKIPPED: redis-server or redis-cli not found (run `bash scripts/install-deps.sh`)"
            );
            return None;
        }
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| {
                let mut args = vec![
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ];
                args.extend_from_slice(extra);
                RedisServer::start_with(&args, free_cluster_port)
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli runs");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let cluster = RedisCluster { nodes };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cluster.nodes.iter().all(|n| cluster_ok(n.port)) {
            assert!(
                Instant::now() < deadline,
                "the cluster did not reach cluster_state:ok"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // A replica that has not synchronised yet cannot be promoted.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !cluster.nodes.iter().all(|n| replica_in_sync(n.port)) {
            assert!(
                Instant::now() < deadline,
                "the replicas did not synchronise with their masters"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(cluster)
    }

    /// `redis://127.0.0.1:PORT` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }
}

fn cli_installed() -> bool {
    Command::new("redis-cli")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A free port whose cluster bus port (port + 10000) is free too.
fn free_cluster_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().expect("local address").port();
        if port <= 55_535 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

fn cluster_ok(port: u16) -> bool {
    Command::new("redis-cli")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "cluster",
            "info",
        ])
        .stdin(Stdio::null())
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("cluster_state:ok"))
}

/// Whether the node on `port` is a master, or a replica whose link to its master is up.
fn replica_in_sync(port: u16) -> bool {
    Command::new("redis-cli")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "info",
            "replication",
        ])
        .stdin(Stdio::null())
        .output()
        .is_ok_and(|o| {
            let info = String::from_utf8_lossy(&o.stdout);
            info.contains("role:master") || info.contains("master_link_status:up")
        })
}

fn installed() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("local address").port()
}

/// Kills the server within a second of this test process dying without dropping it.
fn spawn_watchdog(server: u32) -> Option<Child> {
    let script = format!(
        "while kill -0 {test} 2>/dev/null && kill -0 {server} 2>/dev/null; do sleep 1; done; \
         kill -9 {server} 2>/dev/null",
        test = std::process::id()
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

/// Whether a server answers `PING` on `port`, by a raw RESP exchange.
fn ping(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(stream.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG"))
}
