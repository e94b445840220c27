//! The `llm-adapter` binary as a child process: started with arguments, its ready
//! line read, killed on drop.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use super::STEP;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_llm-adapter");

/// Kills the child on drop (a failing test must not leave it running).
pub struct Child(pub std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The first stdout line of the child (its ready line), read within [`STEP`]; empty if
/// it exited first.
pub async fn first_line(child: &mut Child) -> String {
    let stdout = child.0.stdout.take().expect("stdout");
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    });
    tokio::time::timeout(STEP, line)
        .await
        .expect("a line (or EOF) in time")
        .expect("join")
        .expect("read")
}

/// `llm-adapter serve` with the defaults, a free admin port, `nats_url` and `extra`
/// arguments; stdout piped (the ready line), stderr discarded.
pub fn serve(nats_url: &str, extra: &[&str]) -> Child {
    Child(
        Command::new(BIN)
            .args(["serve", "--admin", "127.0.0.1:0", "--nats-url", nats_url])
            .args(extra)
            .env("RUST_LOG", "error")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn"),
    )
}
