//! A moto server per test, on a free loopback port, killed (by PID) on drop.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::workspace_root;

/// A running moto server.
#[derive(Debug)]
pub struct Moto {
    child: Child,
    pub url: String,
    pub port: u16,
}

/// Installs moto into `.venv/moto` if it is not there yet.
pub fn ensure_installed() {
    let _ = moto_binary();
}

fn moto_binary() -> PathBuf {
    if let Ok(path) = std::env::var("MOTO_SERVER") {
        return PathBuf::from(path);
    }
    let root = workspace_root();
    // Every test of the binary gets here at once on a fresh clone: one
    // installs (infra/bin/venv also holds a file lock across processes), the
    // others wait for it. The script returns at once when the venv's stamp
    // matches the pinned requirements, so it runs on every start: a venv
    // left half-made by a killed install is never taken for a good one.
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = INSTALL.lock().unwrap_or_else(|p| p.into_inner());
    let status = Command::new(root.join("infra/bin/venv"))
        .args(["moto", "tests/requirements-moto.txt"])
        .current_dir(&root)
        .stdout(Stdio::null())
        .status()
        .expect("run infra/bin/venv to install moto");
    assert!(status.success(), "installing moto into .venv/moto failed");
    root.join(".venv/moto/bin/moto_server")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl Moto {
    /// Starts moto and waits (up to 60 s) until it answers.
    pub fn start() -> Self {
        let bin = moto_binary();
        let port = free_port();
        let log =
            std::fs::File::create(std::env::temp_dir().join(format!("hookline-moto-{port}.log")))
                .expect("moto log file");
        let child = Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let moto = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect_timeout(
                &([127, 0, 0, 1], port).into(),
                Duration::from_millis(200),
            )
            .is_ok()
            {
                return moto;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("moto did not start on port {port} within 60 s");
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
