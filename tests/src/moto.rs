//! A moto server per test ([`hookline_local::moto::Moto`], killed by PID on
//! drop), installed into `.venv/moto` on first use.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::workspace_root;

pub use hookline_local::moto::Moto;

/// Installs moto into `.venv/moto` if it is not there yet.
pub fn ensure_installed() {
    let _ = moto_binary();
}

fn moto_binary() -> PathBuf {
    let root = workspace_root();
    if std::env::var_os("MOTO_SERVER").is_some() {
        return hookline_local::moto::server_binary(&root);
    }
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
    hookline_local::moto::server_binary(&root)
}

/// Starts moto (installing it first if needed); panics if it cannot.
pub fn start() -> Moto {
    let bin = moto_binary();
    let port_log = std::env::temp_dir().join(format!("hookline-moto-{}.log", std::process::id()));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(port_log)
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::null());
    Moto::start(&bin, log).unwrap_or_else(|e| panic!("{e}"))
}
