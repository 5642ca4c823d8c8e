//! A moto server (real DynamoDB / Streams / SQS / KMS wire protocols) on a
//! free loopback port, stopped by PID when dropped. The local stack, the
//! integration tests and the benchmarks all start it through [`Moto::start`].

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running moto server.
#[derive(Debug)]
pub struct Moto {
    child: Child,
    pub url: String,
    pub port: u16,
}

/// The moto server under `root` (`.venv/moto/bin/moto_server`, installed by
/// `infra/bin/venv moto ...`), or `$MOTO_SERVER`.
pub fn server_binary(root: &Path) -> PathBuf {
    std::env::var("MOTO_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join(".venv/moto/bin/moto_server"))
}

/// A free loopback port.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Moto {
    /// Starts `bin` on a free loopback port, its output to `log`, and waits
    /// (up to 60 s) until it accepts connections.
    pub fn start(bin: &Path, log: Stdio) -> Result<Self, String> {
        if !bin.exists() {
            return Err(format!(
                "{} not found: run infra/local/up (it installs moto into .venv/moto)",
                bin.display()
            ));
        }
        let port = free_port().map_err(|e| format!("no free loopback port: {e}"))?;
        let child = Command::new(bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        // Dropped on failure below: killed by PID.
        let moto = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let address = ([127, 0, 0, 1], port).into();
            if std::net::TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
                return Ok(moto);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("moto did not start on port {port} within 60 s"))
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
